"""Tests of the run cache against a hostile but fair user: every stored field verified, readers
that cannot hang, and a cache that cannot take a run refused before training starts."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nopelib.core.model import GPT, GPTConfig
from nopelib.store import checkpoint as ck, cache
from nopelib.store.cache import CacheWarning
from nopelib.store.memo import memo
from nopelib.training import launch, run_entry, runs as rc
from conftest import TINY_RUN




pytestmark = pytest.mark.usefixtures("one_thread_cache")


def _trained(tmp_path: Path) -> Path:
    run = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    return tmp_path / "cache" / "runs" / run.metrics["key"]


def _reload_warns() -> rc.TrainedRun:
    with pytest.warns(CacheWarning):
        run = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    assert not run.from_cache
    return run


@pytest.mark.parametrize("edit", [
    {"accuracy": 1.0}, {"accuracy": float("nan")}, {"accuracy": 7.5}, {"accuracy": "1.0"},
    {"final_loss": float("-inf")}, {"n_test": 0}])
def test_an_edited_metric_is_a_miss(tmp_path, edit):
    run_dir = _trained(tmp_path)
    path = run_dir / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics.update(edit)
    path.write_text(json.dumps(metrics))
    again = _reload_warns()
    assert again.metrics["accuracy"] != edit.get("accuracy") or edit["accuracy"] == 0.0


def test_metrics_are_range_checked_even_with_a_matching_digest(tmp_path):
    run_dir = _trained(tmp_path)
    path = run_dir / "metrics.json"
    metrics = json.loads(path.read_text())
    del metrics["final_loss"]
    metrics["metrics_sha256"] = run_entry.metrics_digest(metrics)  # a forger who knows the format
    path.write_text(json.dumps(metrics))
    _reload_warns()
    assert run_entry.metrics_problem({**metrics, "final_loss": 1.0}) is None
    assert "final_loss" in run_entry.metrics_problem(metrics)
    assert "accuracy" in run_entry.metrics_problem({**metrics, "final_loss": 1.0, "accuracy": True})


def _returns_within(fn, seconds: float = 20.0):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader hung"
    return out["value"]


def test_a_fifo_or_device_in_place_of_a_file_does_not_hang(tmp_path):
    run_dir = _trained(tmp_path)
    weights = run_dir / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _returns_within(lambda: rc.train_or_load("addition", 0, TINY_RUN, device="cpu",
                                                       progress=False))
    assert not run.from_cache and any("not a regular file" in str(w.message) for w in caught)
    run_dir = tmp_path / "cache" / "runs" / run.metrics["key"]
    (run_dir / "metrics.json").unlink()
    (run_dir / "metrics.json").symlink_to("/dev/zero")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _returns_within(lambda: rc.train_or_load("addition", 0, TINY_RUN, device="cpu",
                                                       progress=False))
    assert not run.from_cache and any("not a regular file" in str(w.message) for w in caught)


def test_sizes_are_bounded_before_reading(tmp_path):
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.truncate(2**31)  # sparse: 2 GB that costs no disk
    with pytest.raises(OSError, match="more than"):
        cache.read_bytes(path, 2**20)
    with pytest.raises(OSError, match="more than"):
        cache.file_sha256(path, 2**20)


def test_a_cache_that_cannot_take_a_run_fails_before_training(tmp_path, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("trained although the cache cannot take the run")

    monkeypatch.setattr(rc, "train_and_score", no_training)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError, match="(?i)not a directory"):
        rc.train_or_load("addition", 0, TINY_RUN, device="cpu", cache_dir=not_a_dir)
    # a cache folder under a file cannot be created
    with pytest.raises(OSError, match="not writable|not a directory"):
        rc.train_or_load("addition", 0, TINY_RUN, device="cpu", cache_dir=not_a_dir / "sub")
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(OSError, match="MiB free"):
        rc.train_or_load("addition", 0, TINY_RUN, device="cpu")
    with pytest.raises(OSError, match="MiB free"):
        launch.train_many([("addition", 0)], TINY_RUN, device="cpu", workers=1)


def test_an_unwritable_cache_is_refused(tmp_path, monkeypatch):
    # root ignores permission bits, so the refusal of mkstemp stands in for a read-only cache
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)
    with pytest.raises(OSError, match=f"cache folder {tmp_path / 'cache'} is not writable"):
        cache.check_writable(tmp_path / "cache", 0)


def test_a_bad_entry_that_cannot_be_moved_aside_is_reported(tmp_path, monkeypatch):
    entry = tmp_path / "entry"
    entry.mkdir()

    def read_only(src, dst):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(cache.os, "replace", read_only)
    with pytest.warns(CacheWarning, match="could not be moved aside"):
        cache.quarantine(entry, "its checksum differs")
    assert entry.exists()


def test_stale_staging_entries_are_swept(tmp_path):
    runs = tmp_path / "runs"
    old, young = runs / ".tmp-old-1", runs / ".tmp-young-2"
    for path in (old, young):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"0" * 100)
    day_ago = time.time() - cache.STALE_SECONDS - 60
    os.utime(old, (day_ago, day_ago))
    (runs / "kept").mkdir()
    cache.sweep_stale(runs)
    assert not old.exists() and young.exists() and (runs / "kept").exists()


def test_seeds_out_of_range_are_refused_before_training(monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("trained a run with a bad seed")

    monkeypatch.setattr(rc, "train_and_score", no_training)
    for seed in (2**64, -1, 1.0, True):
        with pytest.raises(ValueError, match="seed="):
            rc.train_or_load("addition", seed, TINY_RUN, device="cpu")
        with pytest.raises(ValueError, match="seed="):
            launch.train_many([("addition", seed)], TINY_RUN, device="cpu", workers=1)
    with pytest.raises(ValueError, match="seeds="):
        replace(TINY_RUN, seeds=(2**40,))


def _free(monkeypatch, free_bytes: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**12, 10**12 - free_bytes, free_bytes))


def test_the_room_asked_for_is_sized_from_the_model(tmp_path, monkeypatch):
    # 6.3 M parameters: 25 MB of weights, and three checkpoints of weights and AdamW's moments
    big = replace(TINY_RUN, name="big", model=GPTConfig(n_layer=2, n_head=4, n_embd=512))
    n = GPT(big.model).num_params()
    assert rc.run_write_bytes([big]) >= 4 * n + (ck.KEEP + 1) * 12 * n
    assert rc.run_write_bytes([TINY_RUN]) < rc.run_write_bytes([big])
    # one run at a time: a second run adds its weights, not its checkpoints
    assert rc.run_write_bytes([big, big]) - rc.run_write_bytes([big]) == rc.weights_bytes(big)
    # two runs in flight keep checkpoints of both; one at a time, of the largest only
    assert (rc.run_write_bytes([big, TINY_RUN], in_flight=2) - rc.run_write_bytes([big, TINY_RUN])
            == rc.checkpoints_bytes(TINY_RUN))
    with pytest.raises(ValueError, match="in_flight=0"):
        rc.run_write_bytes([TINY_RUN], in_flight=0)

    def no_training(*args, **kwargs):
        raise AssertionError("trained although the cache cannot take the run")

    real = rc.train_and_score
    monkeypatch.setattr(rc, "train_and_score", no_training)
    # more than the fixed 200 MiB the check once asked for, less than this run writes
    free = 250 * 2**20
    assert rc.run_write_bytes([big]) + cache.FREE_MARGIN_BYTES > free
    _free(monkeypatch, free)
    with pytest.raises(OSError, match=r"250 MiB free, less than the \d+ MiB this work will write"):
        rc.train_or_load("addition", 0, big, device="cpu", progress=False)
    monkeypatch.setattr(rc, "train_and_score", real)
    assert not rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False).from_cache
    with pytest.raises(ValueError, match="need_bytes=-1"):
        cache.check_writable(tmp_path, -1)


def test_every_cache_file_follows_the_umask(tmp_path):
    """safetensors and mkstemp write 0600: another member of the group could not read the
    weights, would take the run for a bad one and retrain it."""
    old = os.umask(0o002)
    try:
        run_dir = _trained(tmp_path)
        store = ck.RunCheckpoints(tmp_path / "ckpt", "k")
        store.save(1, {"w": torch.zeros(2)}, {})
        memo(_study, 3)
    finally:
        os.umask(old)
    results = tmp_path / "cache" / "results"
    files = [*run_dir.iterdir(), *store.saved()[0].iterdir(), *results.iterdir()]
    assert {p.name for p in files} >= {"model.safetensors", "metrics.json", ck.TENSORS, ck.STATE}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o664)}
    folders = [run_dir, store.folder, store.saved()[0], results]
    assert {oct(p.stat().st_mode & 0o777) for p in folders} == {oct(0o775)}


def _study(x):
    return {"x": x}


def _deny(monkeypatch, denied: Path) -> None:
    """Reading ``denied`` raises PermissionError, as another member's 0600 file does (root,
    which runs the tests, ignores permission bits)."""
    real = cache.read_bytes

    def read_bytes(path, max_bytes):
        if Path(path) == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, max_bytes)

    monkeypatch.setattr(cache, "read_bytes", read_bytes)


def test_a_run_this_process_may_not_read_is_left_in_place(tmp_path, monkeypatch):
    run_dir = _trained(tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    _deny(monkeypatch, run_dir / "metrics.json")
    with pytest.warns(CacheWarning, match="cannot be read .*Permission denied.*left in place"):
        run = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    assert not run.from_cache and run.metrics["key"] == run_dir.name  # trained, returned
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # not replaced
    assert not list(run_dir.parent.glob(".bad-*"))  # nor moved aside


def test_a_metrics_json_nested_too_deeply_is_moved_aside(tmp_path):
    run_dir = _trained(tmp_path)
    (run_dir / "metrics.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.warns(CacheWarning, match=r"metrics\.json: RecursionError") as caught:
        run = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    assert run_dir.name in str(caught[0].message)
    assert not run.from_cache and len(list(run_dir.parent.glob(f".bad-{run_dir.name}-*"))) == 1
    assert rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False).from_cache


def test_a_checkpoint_nested_too_deeply_is_moved_aside_and_the_previous_used(tmp_path):
    store = ck.RunCheckpoints(tmp_path, "k")
    store.save(1, {"w": torch.zeros(2)}, {"step": 1})
    store.save(2, {"w": torch.ones(2)}, {"step": 2})
    (store.saved()[-1] / ck.STATE).write_text("{\"a\": " * 200_000 + "1" + "}" * 200_000)
    with pytest.warns(CacheWarning, match="RecursionError"):
        assert store.resume({"w": (2,)}, lambda tensors, fields: fields) == {"step": 1}
    assert len(list(store.folder.glob(".bad-*"))) == 1


def test_a_checkpoint_this_process_may_not_read_is_skipped_and_left_in_place(tmp_path,
                                                                             monkeypatch):
    store = ck.RunCheckpoints(tmp_path, "k")
    store.save(1, {"w": torch.zeros(2)}, {"step": 1})
    store.save(2, {"w": torch.ones(2)}, {"step": 2})
    _deny(monkeypatch, store.saved()[-1] / ck.STATE)
    with pytest.warns(CacheWarning, match="cannot be read .*left in place"):
        assert store.resume({"w": (2,)}, lambda tensors, fields: fields) == {"step": 1}
    assert len(store.saved()) == 2 and not list(store.folder.glob(".bad-*"))
