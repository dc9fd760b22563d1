"""Tests of nopelib.memo: a call is computed once, keyed by content, committed atomically, and
read back without pickle: a poisoned, damaged or mismatched entry is a miss, never a result."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import nopelib.memo as memo_mod
import nopelib.train as tr
from nopelib.cache import CacheWarning
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
    """The results folder's entries and temporaries; quarantined entries (.bad-*) left out."""
    folder = tmp_path / "cache" / "results"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".bad-"))


def test_a_call_is_computed_once_and_read_back_equal(tmp_path):
    first = memo(study, [1, 2, 3], scale=2.0)
    again = memo(study, [1, 2, 3], scale=2.0)
    assert len(CALLS) == 1
    pd.testing.assert_frame_equal(first, again)
    assert again["value"].tolist() == [2.0, 4.0, 6.0]
    assert [p.suffix for p in _results(tmp_path)] == [".npz"]


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
    real_savez = np.savez

    def savez_half(file, *args, **kwds):
        file.write(b"PK\x03\x04partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", savez_half)
    with pytest.raises(OSError, match="disk full"):
        memo(study, [1, 2])
    assert _results(tmp_path) == []  # no final file and no temporary left behind
    monkeypatch.setattr(np, "savez", real_savez)
    assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert len(CALLS) == 2  # the interrupted call was not trusted: computed again


def test_bad_calls_name_the_problem():
    with pytest.raises(ValueError, match="module-level"):
        memo(lambda: 1)
    with pytest.raises(TypeError, match=r"args\[0\] has type object"):
        memo(study, object())
    with pytest.raises(TypeError, match=r"kwargs\['scale'\] has type set"):
        memo(study, [1], scale={1})


class _Payload:
    """Unpickling this runs ``touch <path>``: the proof that a cache read executed code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _entry(tmp_path: Path) -> Path:
    (path,) = _results(tmp_path)
    return path


def _recomputes_once_with_a_warning(tmp_path: Path, replace_with: bytes | None) -> None:
    """memo(study, [1, 2]) after the stored entry's bytes are replaced: one warning naming the
    file, one recomputation, a correct result, and a good entry in its place."""
    memo(study, [1, 2])
    path = _entry(tmp_path)
    if replace_with is not None:
        path.write_bytes(replace_with)
    with pytest.warns(CacheWarning, match=path.name) as caught:
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 1
    assert len(CALLS) == 2
    assert list(path.parent.glob(f".bad-{path.name}-*"))  # moved aside, for a look
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]  # replaced: a clean hit
    assert len(CALLS) == 2


def test_a_poisoned_entry_does_not_run_its_payload(tmp_path):
    marker = tmp_path / "payload-ran"
    poison = pickle.dumps(_Payload(marker))
    # the bare pickle, and the pickle inside an otherwise well-formed npz (an object array)
    import io
    buf = io.BytesIO()
    np.save(buf, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    for payload in (poison, buf.getvalue()):
        CALLS.clear()
        for p in _results(tmp_path):
            p.unlink()
        _recomputes_once_with_a_warning(tmp_path, payload)
        assert not marker.exists()


def test_an_npz_with_an_object_array_does_not_run_its_payload(tmp_path):
    marker = tmp_path / "payload-ran"
    memo(study, [1, 2])
    path = _entry(tmp_path)
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["a0"] = np.array([_Payload(marker)], dtype=object)
    with path.open("wb") as f:
        np.savez(f, **arrays)
    with pytest.warns(CacheWarning, match=path.name):
        memo(study, [1, 2])
    assert not marker.exists()
    assert len(CALLS) == 2


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated", b"garbage" * 10])
def test_a_truncated_or_garbage_entry_is_recomputed_and_replaced(tmp_path, damage):
    _recomputes_once_with_a_warning(tmp_path, damage)


def test_an_entry_of_another_call_is_not_returned(tmp_path):
    memo(study, [7, 8])
    other = _entry(tmp_path).read_bytes()
    _entry(tmp_path).unlink()
    CALLS.clear()
    _recomputes_once_with_a_warning(tmp_path, other)  # the key recorded inside disagrees


def test_flipped_array_bytes_are_a_miss(tmp_path):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["a0"] = arrays["a0"] + 1.0  # the value changed, the recorded checksum did not
    with path.open("wb") as f:
        np.savez(f, **arrays)
    with pytest.warns(CacheWarning, match="SHA-256"):
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]


def nan_study(x):
    CALLS.append((x,))
    return {"score": float("nan"), "x": x}


def test_a_non_finite_result_is_returned_but_not_stored(tmp_path):
    with pytest.warns(CacheWarning, match="non-finite"):
        assert memo(nan_study, 1)["x"] == 1
    assert _results(tmp_path) == []


def mixed_study(n):
    """Every value type the chapters' studies return: DataFrames (numeric, bool and str
    columns), tuples with floats, arrays, numpy scalars, nested containers."""
    df = pd.DataFrame({"task": ["a", "b"] * n, "layer": np.arange(2 * n),
                       "score": np.linspace(0, 1, 2 * n), "causal": [True, False] * n})
    return df, 1.5, {"k": [np.float32(2.5), np.arange(3)], 3: (None, "s", 4)}


def test_every_returned_type_round_trips_exactly():
    first = memo(mixed_study, 2)
    again = memo(mixed_study, 2)
    pd.testing.assert_frame_equal(first[0], again[0])
    assert again[1] == 1.5 and isinstance(again[1], float)
    assert again[2]["k"][0] == np.float32(2.5) and again[2]["k"][0].dtype == np.float32
    np.testing.assert_array_equal(again[2]["k"][1], np.arange(3))
    assert again[2][3] == (None, "s", 4)


def set_study():
    return {1, 2}


def test_an_unstorable_result_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="result has type set"):
        memo(set_study)
    assert _results(tmp_path) == []


def test_the_function_source_is_part_of_the_key():
    """A notebook's function (module __main__) that is edited computes afresh."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile("def f(x):\n    return x + 1\n", "<cell-1>", "exec"), namespace)
    before = call_key(namespace["f"], (1,), {})
    exec(compile("def f(x):\n    return x + 2\n", "<cell-2>", "exec"), namespace)
    assert call_key(namespace["f"], (1,), {}) != before
    exec(compile("def f(x):\n    return x + 2\n", "<cell-3>", "exec"), namespace)  # rerun, unedited
    assert call_key(namespace["f"], (1,), {}) == call_key(namespace["f"], (1,), {})


def test_the_cache_module_is_not_training():
    """memo needs only where caches live, not the training code."""
    import subprocess
    import sys
    code = "import sys, nopelib.memo; print('nopelib.train' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
