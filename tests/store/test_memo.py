"""Tests of nopelib.store.memo: a call is computed once, keyed by content (bound instances, numpy
scalars' dtypes and a notebook function's globals included), committed atomically, and read back
without pickle: a poisoned, damaged, tampered or mismatched entry is a miss, never a result, and
a planted FIFO, symlink or zip bomb is refused promptly and without inflating it."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import random
import re
import shutil
import stat
import threading
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import nopelib.store.memo as memo_mod
from nopelib.core import metrics
from nopelib.core.model import GPT, GPTConfig
from nopelib.store import cache, sources
from nopelib.store.cache import CacheWarning
from nopelib.store.memo import call_key, memo

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
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
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


def test_editing_nopelib_sources_changes_the_keys_that_depend_on_them(tmp_path, monkeypatch):
    copy = tmp_path / "nopelib"
    shutil.copytree(sources.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sources, "PACKAGE_DIR", copy)
    # a test module's function may call nopelib through imports no key sees: every module
    before = call_key(study, ([1],), {})
    # a study of nopelib's: the modules its own module imports, and nothing else
    scores = call_key(metrics.layer_scores, ([1],), {})
    (copy / "book/viz.py").write_text((copy / "book/viz.py").read_text() + "\nEDITED = 1\n")
    assert call_key(metrics.layer_scores, ([1],), {}) == scores
    assert call_key(study, ([1],), {}) != before
    before = call_key(study, ([1],), {})
    (copy / "core/model.py").write_text((copy / "core/model.py").read_text() + "\n# a comment\n")
    assert call_key(study, ([1],), {}) == before  # comments compute nothing
    assert call_key(metrics.layer_scores, ([1],), {}) == scores
    (copy / "core/model.py").write_text((copy / "core/model.py").read_text() + "\nEDITED = 1\n")
    assert call_key(metrics.layer_scores, ([1],), {}) != scores  # metrics imports model
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
    assert again[2]["k"][0] == np.float32(2.5) and isinstance(again[2]["k"][0], np.float32)
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
    code = "import sys, nopelib.store.memo; print('nopelib.training.train' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the checksum covers the whole document -------------------------------------------------

def verdict_study(x):
    CALLS.append((x,))
    return {"score": 0.5, "verdict": "weakens", "x": x}


def _rewrite_meta(path: Path, edit) -> None:
    """Rewrite the entry at ``path`` with ``edit`` applied to its ``__meta__`` text, the arrays
    and the recorded checksum kept: a tampered document, not a damaged file."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    text = arrays["__meta__"].tobytes().decode()
    edited = edit(text)
    assert edited != text
    arrays["__meta__"] = np.frombuffer(edited.encode(), dtype=np.uint8)
    with path.open("wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize("old, new", [('["score", 0.5]', '["score", 0.9]'),
                                      ('"weakens"', '"strengthens"')])
def test_a_tampered_document_is_recomputed_and_replaced(tmp_path, old, new):
    assert memo(verdict_study, 1)["score"] == 0.5
    path = _entry(tmp_path)
    _rewrite_meta(path, lambda text: text.replace(old, new))
    with pytest.warns(CacheWarning, match=path.name) as caught:
        assert memo(verdict_study, 1) == {"score": 0.5, "verdict": "weakens", "x": 1}
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 1
    assert "SHA-256" in str(caught[0].message)
    assert len(CALLS) == 2
    assert list(path.parent.glob(f".bad-{path.name}-*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memo(verdict_study, 1)["verdict"] == "weakens"  # replaced: a clean hit
    assert len(CALLS) == 2


# --- keys tell apart what gives different results --------------------------------------------

class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, x):
        CALLS.append((x,))
        return x * self.factor


@dataclasses.dataclass(frozen=True)
class Offset:
    by: float

    def add(self, x):
        return x + self.by


class Sealed:
    """State in a slot, which vars() cannot see: memo must refuse it, not key it by name."""
    __slots__ = ("factor",)

    def __init__(self, factor):
        self.factor = factor

    def apply(self, x):
        return x * self.factor


def test_bound_methods_are_keyed_by_their_instance():
    assert memo(Scaler(2).apply, 3) == 6
    assert memo(Scaler(10).apply, 3) == 30
    assert memo(Scaler(10).apply, 3) == 30  # an equal instance: cached
    assert len(CALLS) == 2
    assert call_key(Offset(1.0).add, (3,), {}) != call_key(Offset(2.0).add, (3,), {})  # dataclass
    assert call_key(Offset(1.0).add, (3,), {}) == call_key(Offset(1.0).add, (3,), {})


def test_an_instance_that_cannot_be_fingerprinted_is_refused():
    with pytest.raises(TypeError, match=r"Sealed\.apply\.__self__ has type Sealed"):
        call_key(Sealed(2).apply, (1,), {})
    with pytest.raises(TypeError, match=r"__self__ has type Random"):  # its state is in C
        call_key(random.Random(0).random, (), {})
    with pytest.raises(TypeError, match=r"__self__\.__dict__\['factor'\] has type set"):
        call_key(Scaler({1}).apply, (1,), {})


def test_numpy_scalars_are_keyed_with_their_dtype():
    def key(x):
        return call_key(study, (x,), {})

    keys = [key(0.5), key(np.float32(0.5)), key(np.float64(0.5)), key(3), key(np.int64(3)),
            key(np.int32(3)), key(True), key(np.bool_(True))]
    assert len(set(keys)) == len(keys)
    assert key(np.float32(0.5)) == key(np.float32(0.5))


def _cell(namespace: dict, source: str) -> None:
    exec(compile(source, "<cell>", "exec"), namespace)


def test_globals_a_notebook_function_reads_are_part_of_the_key():
    ns: dict = {"__name__": "__main__", "np": np, "study": study, "x": 1}
    _cell(ns, "def f():\n    return x * 2\n")
    assert memo(ns["f"]) == 2
    ns["x"] = 2
    assert memo(ns["f"]) == 4  # not the stale 2
    ns["x"] = 1
    assert memo(ns["f"]) == 2  # and the first entry is still found
    # through a notebook helper, a comprehension and a default; modules, importable functions
    # and builtins count by name
    g_source = ("def g(n, k=K):\n"
                "    return [helper(i) * k for i in range(n)] + [len(np.ones(1)), study]\n")
    ns.update(y=1, K=1)
    _cell(ns, "def helper(v):\n    return v + y\n" + g_source)
    before = call_key(ns["g"], (2,), {})
    ns["y"] = 5
    assert call_key(ns["g"], (2,), {}) != before
    ns["y"] = 1
    assert call_key(ns["g"], (2,), {}) == before
    ns["K"] = 3
    _cell(ns, g_source)
    assert call_key(ns["g"], (2,), {}) != before  # the default's value, not its name


def test_a_global_that_cannot_be_fingerprinted_is_refused():
    ns: dict = {"__name__": "__main__", "x": {1, 2}}
    _cell(ns, "def f():\n    return len(x)\n")
    with pytest.raises(TypeError, match=r"global 'x' read by f has type set"):
        memo(ns["f"])
    _cell(ns, "def uses_helper():\n    return helper()\ndef helper():\n    return x\n")
    with pytest.raises(TypeError, match=r"global 'x' read by helper has type set"):
        call_key(ns["uses_helper"], (), {})


def test_a_recursive_notebook_function_has_a_key():
    ns: dict = {"__name__": "__main__"}
    _cell(ns, "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n")
    assert memo(ns["fact"], 5) == 120
    assert memo(ns["fact"], 5) == 120


# --- readers cannot hang or blow up memory ---------------------------------------------------

def _memo_in_a_thread(timeout: float = 10.0) -> tuple[object, list]:
    """memo(study, [1, 2]) in a thread joined with a timeout: a reader that blocks fails the
    test instead of hanging it. Returns the result and the warnings it raised."""
    out: dict = {}

    def call():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["result"] = memo(study, [1, 2])
        out["warnings"] = caught

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the cache read blocked"
    return out["result"], out["warnings"]


@pytest.mark.parametrize("plant", ["fifo", "symlink to /dev/zero", "symlink to a good entry"])
def test_a_special_file_or_symlink_is_moved_aside_unread(tmp_path, plant):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    good = tmp_path / "good.npz"
    path.rename(good)
    if plant == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero" if "zero" in plant else good)
    result, caught = _memo_in_a_thread()
    assert result["value"].tolist() == [1.0, 2.0]
    assert len(CALLS) == 2
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and path.name in messages[0] and "not a regular file" in messages[0]
    assert stat.S_ISREG(os.lstat(path).st_mode)  # replaced by a good entry
    (aside,) = path.parent.glob(f".bad-{path.name}-*")  # the planted file itself, moved
    assert stat.S_ISFIFO(os.lstat(aside).st_mode) if plant == "fifo" else aside.is_symlink()


def _plant_npz(path: Path, meta: bytes, header: dict, n_zero_bytes: int) -> None:
    """A compressed npz at ``path``: ``meta`` as ``__meta__`` and a member ``a0`` with .npy
    ``header`` followed by ``n_zero_bytes`` zeros, streamed so the test never holds them."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(meta, dtype=np.uint8))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("__meta__.npy", buf.getvalue())
        with zf.open("a0.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, header)
            chunk = bytes(1 << 20)
            for start in range(0, n_zero_bytes, len(chunk)):
                f.write(chunk[:n_zero_bytes - start])


def _meta_of(path: Path) -> bytes:
    with np.load(path) as npz:
        return npz["__meta__"].tobytes()


def _peak_bytes_of_a_recomputing_call(path: Path, match: str) -> int:
    """memo(study, [1, 2]) over the planted ``path``: it warns (``match``), recomputes the right
    value, and returns the peak memory Python and numpy allocated meanwhile."""
    tracemalloc.start()
    try:
        with pytest.warns(CacheWarning, match=match):
            assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert list(path.parent.glob(f".bad-{path.name}-*"))
    return peak


def _f8(shape: tuple) -> dict:
    return {"descr": "<f8", "fortran_order": False, "shape": shape}


def test_a_zip_bomb_of_another_key_is_refused_before_inflating(tmp_path):
    memo(study, [7, 8])
    other_meta = _meta_of(_entry(tmp_path))
    _entry(tmp_path).unlink()
    CALLS.clear()
    memo(study, [1, 2])
    path = _entry(tmp_path)
    n = 64 << 20  # 64 MiB of zeros: a file of ~64 KiB
    _plant_npz(path, other_meta, _f8((n // 8,)), n)
    assert path.stat().st_size < n // 100
    assert _peak_bytes_of_a_recomputing_call(path, "key") < n // 8
    assert len(CALLS) == 2


def test_arrays_over_the_size_limit_are_refused_before_inflating(tmp_path, monkeypatch):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    n = 8 << 20
    _plant_npz(path, _meta_of(path), _f8((n // 8,)), n)  # the right key, a huge member
    monkeypatch.setattr(memo_mod, "MAX_ENTRY_BYTES", 1 << 20)
    assert _peak_bytes_of_a_recomputing_call(path, "uncompressed, over the") < n // 4
    assert len(CALLS) == 2


def test_an_array_header_claiming_more_than_its_member_holds_is_refused(tmp_path):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    _plant_npz(path, _meta_of(path), _f8((10 ** 12,)), 16)  # 8 TB claimed, 16 bytes held
    assert _peak_bytes_of_a_recomputing_call(path, "declares") < 1 << 20


def test_a_file_over_the_size_limit_is_refused_and_a_result_over_it_not_stored(tmp_path, monkeypatch):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    monkeypatch.setattr(memo_mod, "MAX_ENTRY_BYTES", 100)
    with pytest.warns(CacheWarning) as caught:
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert path.name in messages[0] and "bytes, over the 100 limit" in messages[0]
    assert "not cached" in messages[1]
    assert _results(tmp_path) == []  # nothing a read would refuse is written


# --- a cache that cannot take an entry, found before the work -------------------------------

_WATCH: dict = {}  # the warnings a test records, for watched_study to count


def watched_study(x):
    """Records, at each real call, how many warnings had been issued before it."""
    CALLS.append(len(_WATCH["caught"]))
    return {"x": x}


def _free(monkeypatch, free_bytes: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**12, 10**12 - free_bytes, free_bytes))


def _refuse_writes(monkeypatch) -> None:
    """A read-only cache: root, which runs the tests, ignores permission bits."""
    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(cache.os, "replace", refuse)


@pytest.mark.parametrize("cannot, reason", [("read-only", "not writable: .*Read-only"),
                                            ("not a folder", "not writable: .*Not a directory"),
                                            ("full", "MiB free")])
def test_a_cache_that_cannot_take_the_result_is_found_before_computing(tmp_path, monkeypatch,
                                                                         cannot, reason):
    root = tmp_path / "cache"
    if cannot == "read-only":
        _refuse_writes(monkeypatch)
    elif cannot == "not a folder":
        root = tmp_path / "a-file"
        root.write_text("x")
    else:
        _free(monkeypatch, 10**6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _WATCH["caught"] = caught
        assert memo(watched_study, 5, cache_dir=root) == {"x": 5}
    assert CALLS == [1]  # warned before the study was computed, which then went on
    (message,) = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert re.search(f"cache folder {re.escape(str(root / 'results'))} .*{reason}", message)
    assert "computed but not cached" in message and memo_mod.MEMO_ENV in message
    assert _results(tmp_path) == []


def test_a_bad_entry_in_a_read_only_cache_is_recomputed_and_returned(tmp_path, monkeypatch):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    path.write_bytes(b"garbage")
    _refuse_writes(monkeypatch)
    with pytest.warns(CacheWarning) as caught:
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and len(CALLS) == 2
    assert path.name in messages[0] and "could not be moved aside" in messages[0]
    assert "not writable" in messages[1] and "not cached" in messages[1]
    assert path.read_bytes() == b"garbage"  # left as it was


def test_a_write_that_fails_returns_the_result_with_a_warning(tmp_path, monkeypatch):
    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "commit_file", disk_full)
    with pytest.warns(CacheWarning, match=r"could not be written to .*\.npz .*No space left"):
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert _results(tmp_path) == []


def sized_study(n):
    return np.zeros(n)


def test_a_result_larger_than_the_room_left_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(memo_mod, "EXPECTED_ENTRY_BYTES", 1000)
    _free(monkeypatch, cache.FREE_MARGIN_BYTES + 10_000)  # room for the expected size only
    assert memo(sized_study, 10).shape == (10,)  # 80 bytes: stored
    assert len(_results(tmp_path)) == 1
    with pytest.warns(CacheWarning, match=r"MiB free.* not cached"):
        assert memo(sized_study, 100_000).shape == (100_000,)  # 800 kB: checked, not written
    assert len(_results(tmp_path)) == 1


def test_an_entry_this_process_may_not_read_is_recomputed_not_moved_aside(tmp_path, monkeypatch):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    real_open = os.open

    def denied(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(memo_mod.os, "open", denied)
    with pytest.warns(CacheWarning, match="cannot be read .*Permission denied") as caught:
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert len(caught) == 1 and len(CALLS) == 2
    assert not list(path.parent.glob(".bad-*"))  # not damage: not moved aside
    monkeypatch.setattr(memo_mod.os, "open", real_open)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]  # a good entry in place
    assert len(CALLS) == 2


def test_stale_staging_files_are_swept(tmp_path):
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    old, young = results / ".tmp-a.npz-dead", results / ".tmp-b.npz-live"
    for path in (old, young):
        path.write_bytes(b"PK partial")
    day_ago = time.time() - cache.STALE_SECONDS - 60
    os.utime(old, (day_ago, day_ago))
    memo(study, [1])
    assert not old.exists() and young.exists()


def deep_study(depth):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_too_deep_for_json_is_a_miss_or_not_stored(tmp_path):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    _plant_npz(path, b"[" * 200_000 + b"]" * 200_000, _f8((2,)), 16)
    with pytest.warns(CacheWarning, match="RecursionError"):
        assert memo(study, [1, 2])["value"].tolist() == [1.0, 2.0]
    assert list(path.parent.glob(f".bad-{path.name}-*"))
    with pytest.warns(CacheWarning, match="nested too deeply to store; the result is not cached"):
        assert len(memo(deep_study, 5000)) == 1
    assert len(_results(tmp_path)) == 1


# --- zip bombs: refused within seconds, in bounded memory ------------------------------------

def _timed_peak(path: Path, match: str) -> tuple[float, int]:
    start = time.perf_counter()
    peak = _peak_bytes_of_a_recomputing_call(path, match)
    return time.perf_counter() - start, peak


def test_a_gigabyte_zip_bomb_is_refused_in_seconds_without_inflating(tmp_path):
    memo(study, [1, 2])
    path = _entry(tmp_path)
    n = 1 << 30  # 1 GiB of zeros in a file of a few megabytes, with the entry's own key
    _plant_npz(path, _meta_of(path), _f8((n // 8,)), n)
    assert path.stat().st_size < n // 100
    seconds, peak = _timed_peak(path, "uncompressed, over the")
    assert seconds < 5 and peak < 16 << 20


def test_a_zip_bomb_at_the_size_limit_is_refused_in_seconds_and_bounded_memory(tmp_path):
    """The largest bomb a read inflates (with the entry's own key, so it is read to the
    checksum): inflated in chunks into one buffer, hashed without a copy."""
    memo(study, [1, 2])
    path = _entry(tmp_path)
    n = memo_mod.MAX_ENTRY_BYTES - (1 << 20)
    _plant_npz(path, _meta_of(path), _f8((n // 8,)), n)
    seconds, peak = _timed_peak(path, "SHA-256")
    assert seconds < 5 and peak < 2 * memo_mod.MAX_ENTRY_BYTES


def many_scalars(n):
    return [np.float32(i) for i in range(n)]  # np.float64 is a float: stored as JSON


def test_a_zip_directory_or_document_over_its_limit_is_refused_and_not_written(tmp_path,
                                                                              monkeypatch):
    memo(many_scalars, 20)
    path = _entry(tmp_path)
    monkeypatch.setattr(memo_mod, "MAX_MEMBERS", 10)
    with pytest.warns(CacheWarning) as caught:
        assert memo(many_scalars, 20) == list(range(20))
    assert [bool(re.search(pattern, str(w.message))) for w, pattern in zip(caught, [
        r"zip directory lists 21 entries .* over the 10 arrays", r"returned 20 arrays"])] == [
        True, True]
    assert _results(tmp_path) == []
    monkeypatch.setattr(memo_mod, "MAX_MEMBERS", 50_000)
    memo(many_scalars, 20)
    monkeypatch.setattr(memo_mod, "MAX_META_BYTES", 100)
    with pytest.warns(CacheWarning) as caught:
        memo(many_scalars, 20)
    assert "__meta__ document takes" in str(caught[0].message)
    assert "returned a document of" in str(caught[1].message)
    assert path.name in str(caught[0].message)
