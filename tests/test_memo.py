"""Tests of nopelib.memo: a call is computed once, keyed by content, and committed atomically."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import nopelib.memo as memo_mod
import nopelib.train as tr
from nopelib.memo import call_key, memo
from nopelib.model import GPT, GPTConfig

CALLS: list[tuple] = []


def study(x, scale=1.0):
    """A stand-in for an expensive study: records each real call."""
    CALLS.append((x, scale))
    values = np.asarray(x.tolist() if isinstance(x, torch.Tensor) else x, dtype=float)
    return pd.DataFrame({"value": values * scale})


def failing_study(x):
    CALLS.append((x,))
    raise RuntimeError("interrupted")


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv(tr.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(memo_mod.MEMO_ENV, raising=False)
    CALLS.clear()


def _results(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "cache" / "results"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_call_is_computed_once_and_read_back_equal(tmp_path):
    first = memo(study, [1, 2, 3], scale=2.0)
    again = memo(study, [1, 2, 3], scale=2.0)
    assert len(CALLS) == 1
    pd.testing.assert_frame_equal(first, again)
    assert again["value"].tolist() == [2.0, 4.0, 6.0]
    assert [p.suffix for p in _results(tmp_path)] == [".pkl"]


def test_other_arguments_compute_afresh():
    memo(study, [1, 2, 3])
    memo(study, [1, 2, 3], scale=2.0)
    memo(study, [1, 2, 4])
    memo(study, (1, 2, 3))  # a tuple is not the list
    memo(study, [1.0, 2, 3])  # a float is not the int
    assert len(CALLS) == 5


def test_tensors_are_keyed_by_their_values():
    a = torch.arange(6.0)
    memo(study, a)
    memo(study, a.clone())  # same values: cached
    assert len(CALLS) == 1
    b = a.clone()
    b[3] += 1e-6
    memo(study, b)
    memo(study, a.double())  # same values, another dtype
    assert len(CALLS) == 3


def test_models_are_keyed_by_config_and_weights():
    config = GPTConfig(n_layer=1, n_head=1, n_embd=8)
    torch.manual_seed(0)
    m0 = GPT(config)
    torch.manual_seed(0)
    same = GPT(config)
    torch.manual_seed(1)
    other = GPT(config)
    k = call_key(study, (m0,), {})
    assert call_key(study, (same,), {}) == k
    assert call_key(study, (other,), {}) != k
    with torch.no_grad():
        same.transformer.wte.weight[0, 0] += 1.0
    assert call_key(study, (same,), {}) != k


def test_editing_nopelib_sources_changes_every_key(tmp_path, monkeypatch):
    copy = tmp_path / "pkg"
    shutil.copytree(memo_mod._PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(memo_mod, "_PACKAGE_DIR", copy)
    before = call_key(study, ([1],), {})
    (copy / "metrics.py").write_text((copy / "metrics.py").read_text() + "\n# an edit\n")
    assert call_key(study, ([1],), {}) != before


def test_disabled_by_the_environment_computes_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(memo_mod.MEMO_ENV, "0")
    memo(study, [1])
    memo(study, [1])
    assert len(CALLS) == 2
    assert _results(tmp_path) == []


def test_a_failing_computation_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="interrupted"):
        memo(failing_study, [1])
    assert _results(tmp_path) == []


def test_a_write_interrupted_midway_leaves_nothing_readable(tmp_path, monkeypatch):
    def dump_half(obj, f, protocol=None):
        f.write(b"\x80\x05partial")
        raise OSError("disk full")

    real_dump = pickle.dump
    monkeypatch.setattr(pickle, "dump", dump_half)
    with pytest.raises(OSError, match="disk full"):
        memo(study, [1, 2])
    assert _results(tmp_path) == []  # no final file and no temporary left behind
    monkeypatch.setattr(pickle, "dump", real_dump)
    assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert len(CALLS) == 2  # the interrupted call was not trusted: computed again


def test_bad_calls_name_the_problem():
    with pytest.raises(ValueError, match="module-level"):
        memo(lambda: 1)
    with pytest.raises(TypeError, match=r"args\[0\] has type object"):
        memo(study, object())
    with pytest.raises(TypeError, match=r"kwargs\['scale'\] has type set"):
        memo(study, [1], scale={1})
