"""Tests of the run cache's self-repair and of train_many's workers (issue 12).

A damaged, mismatched or non-finite entry is moved aside with one warning naming it, retrained
and replaced; the key separates devices, dtype policies and torch versions; a diverged run is
never committed; workers die with their parent and stop on interrupt.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model

import nopelib.training.train as tr
from nopelib.core.model import GPT
from nopelib.store import sources
from nopelib.store.cache import CacheWarning, file_sha256
from nopelib.training import launch, profiles, run_entry, runs as rc
from conftest import TINY_RUN




pytestmark = pytest.mark.usefixtures("one_thread_cache")


def _run_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "runs" / rc.run_key("addition", 0, TINY_RUN, "cpu")


def _nan_weights(run_dir: Path) -> None:
    """Well-formed safetensors whose checksum is recorded: only the finiteness check is left."""
    model = GPT(TINY_RUN.model)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    save_model(model, str(run_dir / "model.safetensors"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["weights_sha256"] = file_sha256(run_dir / "model.safetensors")
    metrics["metrics_sha256"] = run_entry.metrics_digest(metrics)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's values: still a valid file
    path.write_bytes(bytes(data))


def _edit_key(run_dir: Path) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["key"] = "0" * 32
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


DAMAGE = {
    "truncated weights": lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:100]),
    "zero-byte weights": lambda d: (d / "model.safetensors").write_bytes(b""),
    "garbage weights": lambda d: (d / "model.safetensors").write_bytes(b"\x07garbage" * 50),
    "flipped weight bytes": lambda d: _flip_a_byte(d / "model.safetensors"),
    "all-NaN weights": _nan_weights,
    "invalid metrics.json": lambda d: (d / "metrics.json").write_text("{not json"),
    "deleted metrics.json": lambda d: (d / "metrics.json").unlink(),
    "edited key": _edit_key,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_is_moved_aside_retrained_and_replaced(tmp_path, damage):
    first = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    run_dir = _run_dir(tmp_path)
    DAMAGE[damage](run_dir)
    with pytest.warns(CacheWarning, match=run_dir.name) as caught:
        again = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 1
    assert not again.from_cache
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(),
                                                  again.model.state_dict().values()))
    assert len(list(run_dir.parent.glob(f".bad-{run_dir.name}-*"))) == 1  # kept for a look
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # replaced: a clean hit now
        assert rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False).from_cache


def test_the_weights_checksum_is_recorded(tmp_path):
    run = rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    assert run.metrics["weights_sha256"] == file_sha256(_run_dir(tmp_path) / "model.safetensors")


def test_the_key_separates_device_type_dtype_policy_and_torch_version(monkeypatch):
    cpu = rc.run_key("addition", 0, TINY_RUN, "cpu")
    assert rc.run_key("addition", 0, TINY_RUN, torch.device("cpu")) == cpu
    assert rc.run_key("addition", 0, TINY_RUN, "cuda") != cpu  # another device: another run
    assert rc.run_key("addition", 0, TINY_RUN, "cuda:1") == rc.run_key("addition", 0, TINY_RUN, "cuda")
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert rc.run_key("addition", 0, TINY_RUN, "cpu") != cpu


def test_the_key_covers_the_task_budget_only():
    base = rc.run_key("addition", 0, TINY_RUN, "cpu")
    other_task = replace(TINY_RUN, task_budgets=(("reversal", TINY_RUN.steps + 5),))
    assert rc.run_key("addition", 0, other_task, "cpu") == base  # another task's budget
    own_task = replace(TINY_RUN, task_budgets=(("addition", TINY_RUN.steps + 5),))
    assert rc.run_key("addition", 0, own_task, "cpu") != base
    # the same budget written as an override or as the default is the same run
    same = replace(TINY_RUN, task_budgets=(("addition", TINY_RUN.steps),))
    assert rc.run_key("addition", 0, same, "cpu") == base
    assert rc.run_key("addition", 0, replace(TINY_RUN, seeds=(0, 1, 2)), "cpu") == base


def test_run_folders_follow_the_umask_so_a_group_can_share_the_cache(tmp_path):
    old = os.umask(0o002)
    try:
        rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    finally:
        os.umask(old)
    run_dir = _run_dir(tmp_path)
    assert run_dir.stat().st_mode & 0o777 == 0o775
    assert (run_dir / "metrics.json").stat().st_mode & 0o060 == 0o060


def test_a_diverged_run_is_never_committed(tmp_path, monkeypatch):
    real_train = tr.train

    def diverging(*args, **kwargs):
        model, metrics = real_train(*args, **kwargs)
        metrics["final_loss"] = math.nan
        return model, metrics

    monkeypatch.setattr(rc, "train", diverging)
    with pytest.raises(RuntimeError, match="diverged"):
        rc.train_or_load("addition", 0, TINY_RUN, device="cpu", progress=False)
    runs = tmp_path / "cache" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_train_many_warns_with_the_expected_time_of_slow_cpu_training(monkeypatch):
    assert launch.expected_cpu_seconds(profiles.PROFILES["paper"]) > 10 * 3600  # the paper profile
    assert launch.expected_cpu_seconds(profiles.PROFILES["cpu"]) < 600
    monkeypatch.setattr(launch, "expected_cpu_seconds", lambda profile: 7200.0)
    with pytest.warns(UserWarning, match=r"about 2 h"):
        launch.train_many([("addition", 0)], TINY_RUN, device="cpu", workers=1)


# --- workers ----------------------------------------------------------------------------------

_ENDLESS = """
    import sys
    from dataclasses import replace
    from nopelib.training import launch, profiles
    from nopelib.core.model import GPTConfig
    endless = replace(profiles.PROFILES["cpu"], name="endless",
                      model=GPTConfig(n_layer=1, n_head=2, n_embd=16), steps=10_000_000,
                      batch_size=8, warmup_steps=2, n_train=64, n_test=16, n_eval=16,
                      eval_batch_size=16, log_every=1000, seeds=(0,), task_budgets=(),
                      curve_every=0, n_curve=16)
    try:
        launch.train_many([("addition", 0), ("addition", 1), ("reversal", 0)], endless, device="cpu",
                      cache_dir=sys.argv[1], workers=2)
    except KeyboardInterrupt:
        sys.exit(42)
"""


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
                frontier.append(int(entry.name))
    return found


def _ignores_sigint(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    line = next(line for line in status.splitlines() if line.startswith("SigIgn"))
    ignored = int(line.split()[1], 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _is_pool_worker(pid: int) -> bool:
    """A spawned pool worker (not the resource tracker, which also ignores SIGINT) that has run
    the initializer (which makes it ignore SIGINT)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawn_main" in cmdline and _ignores_sigint(pid)


def _start_training(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A parent running train_many with two workers, returned once both run the initializer."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_ENDLESS), str(tmp_path / "c")])
    deadline = time.monotonic() + 300  # spawn imports torch twice: slow on a loaded machine
    while time.monotonic() < deadline:
        workers = [p for p in _children(proc.pid) if _is_pool_worker(p)]
        if len(workers) == 2:
            return proc, workers
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the two workers did not start within 300 s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_their_killed_parent(tmp_path):
    proc, workers = _start_training(tmp_path)
    proc.kill()  # SIGKILL: no cleanup code runs in the parent
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupt_returns_promptly_and_stops_the_workers(tmp_path):
    proc, workers = _start_training(tmp_path)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)  # to the parent only: it must stop the workers itself
    # the runs in flight never end: any bound shows that they were not waited for
    assert proc.wait(timeout=60) == 42  # KeyboardInterrupt reached the caller
    assert time.monotonic() - start < 60
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)
    runs = tmp_path / "c" / "runs"
    assert not runs.exists() or all(p.name.startswith(".tmp-") for p in runs.iterdir())


# --- run keys: the sources are parsed once per process, and again once edited ----------------

def test_run_keys_reuse_parsed_sources_and_still_see_an_edit(tmp_path, monkeypatch):
    pkg = tmp_path / "nopelib"
    pkg.mkdir()
    hour_ago = time.time() - 3600
    for name in rc.training_sources():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_bytes((sources.PACKAGE_DIR / name).read_bytes())
        os.utime(pkg / name, (hour_ago, hour_ago))
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(sources, "RACY_SECONDS", 0.0)  # the copies' ctime is now
    before = rc.run_key("addition", 0, TINY_RUN, "cpu")
    parsed = []
    real_parse = sources.ast.parse
    monkeypatch.setattr(sources.ast, "parse", lambda *a, **k: parsed.append(a) or real_parse(*a, **k))
    start = time.perf_counter()
    keys = {rc.run_key("addition", seed, TINY_RUN, "cpu") for seed in range(1000)}
    seconds = time.perf_counter() - start
    assert len(keys) == 1000 and not parsed  # nothing read or parsed again
    assert seconds < 15  # re-parsing every source took 37 ms a key on an idle machine
    assert rc.run_key("addition", 0, TINY_RUN, "cpu") == before
    # an edit of the same size, as an editor's one-character fix makes it
    text = (pkg / "core/model.py").read_bytes()
    edited = text.replace(b"n_layer: int = 6", b"n_layer: int = 7", 1)
    assert edited != text and len(edited) == len(text)
    (pkg / "core/model.py").write_bytes(edited)
    assert rc.run_key("addition", 0, TINY_RUN, "cpu") != before
    assert len(parsed) == 1  # the edited file only
    (pkg / "core/model.py").write_bytes(text)
    assert rc.run_key("addition", 0, TINY_RUN, "cpu") == before
