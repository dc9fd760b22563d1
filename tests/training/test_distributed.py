"""Tests of train_many's Ray backend (issue 16), on a real local Ray instance with 2 CPUs.

A run trained by a Ray worker has the same cache key and bit-identical CPU weights as a local
run, and is committed to the driver's cache; a worker killed mid-run is retried, and a run whose
worker dies for good leaves nothing in the cache.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nopelib.core.model import GPTConfig
from nopelib.store import cache
from nopelib.training import distributed, launch, run_entry, runs as rc
from conftest import TINY_RUN


ray = pytest.importorskip("ray")

# long enough (about ten seconds, more on a loaded machine) that a worker is still training
# when the killer, which scans /proc, finds it
SLOW = replace(TINY_RUN, name="tiny-slow", steps=6000, log_every=100)


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    distributed.start_local(2, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


def _weights(run: rc.TrainedRun) -> dict[str, torch.Tensor]:
    return run.model.state_dict()


def _committed(cache: Path) -> list[str]:
    runs = cache / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


def test_ray_runs_equal_local_runs_bit_for_bit_and_share_the_cache(tmp_path):
    runs = [("addition", 0), ("reversal", 1)]
    on_ray = launch.train_many(runs, TINY_RUN, "cpu", cache_dir=tmp_path / "ray", backend="ray")
    local = launch.train_many(runs, TINY_RUN, "cpu", cache_dir=tmp_path / "local", workers=1)
    assert _committed(tmp_path / "ray") == _committed(tmp_path / "local")  # same keys
    for run in runs:
        assert not on_ray[run].from_cache and not local[run].from_cache
        a, b = _weights(on_ray[run]), _weights(local[run])
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert on_ray[run].metrics["accuracy"] == local[run].metrics["accuracy"]
        assert on_ray[run].metrics["worker"].split(" pid ")[1] != str(os.getpid())
    # the local backend finds what Ray trained, and Ray what is cached
    again = launch.train_many(runs, TINY_RUN, "cpu", cache_dir=tmp_path / "ray")
    assert all(again[run].from_cache for run in runs)
    again = launch.train_many(runs, TINY_RUN, "cpu", cache_dir=tmp_path / "local", backend="ray")
    assert all(again[run].from_cache for run in runs)


def _kill_worker_when_training(killed: list[int], timeout: float = 60.0) -> None:
    """SIGKILL the first Ray worker seen running ``_train_remote`` (its process title)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ray::_train_remote" in cmdline:
                time.sleep(0.5)  # into the training loop
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
                return
        time.sleep(0.05)


def _train_while_killing(cache: Path, max_retries: int):
    killed: list[int] = []
    killer = threading.Thread(target=_kill_worker_when_training, args=(killed,))
    killer.start()
    try:
        return distributed.train_missing_ray([("addition", 0, SLOW)], "cpu", cache / "runs",
                                             max_retries=max_retries), killed
    finally:
        killer.join()


def test_a_worker_killed_mid_run_is_retried(tmp_path):
    (job,), killed = _train_while_killing(tmp_path, max_retries=2)
    assert len(killed) == 1 and job.missing
    _, metrics = run_entry.load_run(tmp_path / "runs" / job.key, job.key, SLOW)
    assert metrics["worker"].split(" pid ")[1] != str(killed[0])  # another process
    assert _committed(tmp_path) == [rc.run_key("addition", 0, SLOW, "cpu")]  # no leftovers


def test_a_worker_killed_without_retries_commits_nothing(tmp_path):
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        _train_while_killing(tmp_path, max_retries=0)
    assert _committed(tmp_path) == []


def test_a_worker_with_other_sources_refuses_the_drivers_key():
    with pytest.raises(RuntimeError, match="cache key"):
        distributed._train_remote("addition", 0, TINY_RUN, "cpu", "0" * 32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(backend="slurm"), "backend='slurm' is unknown"),
    (dict(backend="ray", gpu_fraction=0), r"gpu_fraction=0 must be a number in \(0, 1\]"),
    (dict(backend="ray", gpu_fraction=1.5), "gpu_fraction=1.5"),
    (dict(backend="ray", device="mps"), "device='mps' is not one the ray backend"),
    (dict(backend="ray", device="cuda"), "has no GPU"),
])
def test_bad_backend_arguments_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch.train_many([("addition", 0)], TINY_RUN, cache_dir=tmp_path, **kwargs)
    assert _committed(tmp_path) == []


def test_default_gpu_fraction_follows_model_size():
    assert distributed.default_gpu_fraction(GPTConfig()) == 0.25  # 10.6 M
    assert distributed.default_gpu_fraction(GPTConfig(n_layer=6, n_embd=768)) == 0.5  # 42 M
    assert distributed.default_gpu_fraction(GPTConfig(n_layer=24, n_embd=768)) == 1.0


def test_a_grid_trains_on_ray_and_reports_it(tmp_path, monkeypatch):
    from nopelib.studies import grid

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    tiny = grid.Grid("t", ("addition",), (0,), (TINY_RUN,), n_inputs=8)
    rows = grid.run_grid(tiny, device="cpu", backend="ray")
    assert ray.is_initialized()  # the running instance was used, not shut down
    local = rc.train_or_load("addition", 0, TINY_RUN, "cpu")
    assert local.from_cache and rows[0]["key"] == local.metrics["key"]
    assert not rows[0]["from_cache"] and rows[0]["device"] == "cpu"
