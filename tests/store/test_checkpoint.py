"""Tests of checkpointed runs (nopelib.store.checkpoint): a stopped run resumes bit for bit.

A run of a tiny profile whose budget follows progress (a validation level, a tail restarted
when the task is lost, dense then sparse curve points, a trajectory) is stopped at a step,
then asked for again through ``train_or_load``: its weights and metrics, timings aside, equal
those of the run trained without a stop. A damaged newest checkpoint falls back to the one
before it, one of another run is not used, and a committed run leaves no checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import nopelib.training.train as tr
from nopelib.core.model import GPTConfig
from nopelib.store import checkpoint as ck
from nopelib.store.cache import CacheWarning, file_sha256
from nopelib.training import launch, profiles, run_entry, runs as rc

# 25 steps an epoch; with seed 2 and the validation stand-in below the level is reached, lost
# in the tail and regained twice (tail restarts), and the cap ends the run (on the machines
# tried: level at 12, restarts at 24 and 48; the test below checks the phases, not the steps)
TINY = replace(
    profiles.PROFILES["cpu"], name="tiny-resume",
    model=GPTConfig(n_layer=2, n_head=2, n_embd=16), steps=60, batch_size=8, warmup_steps=3,
    n_train=200, n_test=40, n_eval=40, eval_batch_size=40, log_every=5, seeds=(0,),
    task_budgets=(), claim_tasks=(), curve_every=6, curve_dense_every=2, curve_dense_until=10,
    n_curve=40, n_val=16, stop_at=0.5, tail_share=0.5, relearn_below=0.3, n_trajectory=4,
)
TASK, SEED = "reversal", 2
TIMINGS = {"train_seconds", "step_ms", "tokens_per_s", "curve_seconds", "eval_seconds", "date",
           "resumed_at", "metrics_sha256"}
REAL_EVALUATE = tr.evaluate


def _validation_stand_in(model, pairs, batch_size=500):
    """Exact match, except on the validation split: a number in [0, 1) drawn from the weights'
    bits, so that the level is reached, lost and regained within a few dozen steps of a model
    too small to learn, and a resumed run sees exactly what an uninterrupted one does."""
    if len(pairs) != TINY.n_val:
        return REAL_EVALUATE(model, pairs, batch_size)
    with torch.no_grad():
        return sum(float(p.double().sum()) for p in model.parameters()) * 1e3 % 1.0


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    """One thread (the tiny model is overhead-bound, and train_and_score sets it anyway), the
    validation stand-in, and no checkpoint by time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(tr, "evaluate", _validation_stand_in)
    monkeypatch.setenv(ck.SECONDS_ENV, "3600")
    yield
    torch.set_num_threads(threads)


class Stop(Exception):
    """The stand-in for a kill, an interrupt or a shutdown."""


def _stop_at_step(monkeypatch, k: int) -> None:
    """Make the k-th optimizer step raise Stop, before it changes anything."""
    calls = {"n": 0}
    real = tr.train_step

    def step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == k:
            raise Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(tr, "train_step", step)


def _every(monkeypatch, steps: int) -> None:
    """train_or_load checkpoints every ``steps`` steps."""
    monkeypatch.setattr(rc, "RunCheckpoints", functools.partial(ck.RunCheckpoints,
                                                                every_steps=steps))


def _key(seed: int = SEED) -> str:
    return rc.run_key(TASK, seed, TINY, "cpu")


def _stopped_run(monkeypatch, cache: Path, k: int) -> None:
    """Train the run into ``cache`` with a checkpoint every 4 steps, stopped at its k-th step
    (counted from where it starts); the patches are undone afterwards."""
    with monkeypatch.context() as m:
        _every(m, 4)
        _stop_at_step(m, k)
        with pytest.raises(Stop):
            rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache, progress=False)


def _finished(run: rc.TrainedRun, cache: Path) -> tuple[str, dict]:
    key = run.metrics["key"]
    weights = file_sha256(cache / "runs" / key / "model.safetensors")
    return weights, {k: v for k, v in run.metrics.items() if k not in TIMINGS}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, tuple[str, dict]]:
    """The runs trained without a stop (or a checkpoint), by seed."""
    cache = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tr, "evaluate", _validation_stand_in)
        m.setenv(ck.SECONDS_ENV, "3600")
        out = {}
        for seed in (SEED, 3):
            run = rc.train_or_load(TASK, seed, TINY, device="cpu", cache_dir=cache,
                                   progress=False)
            assert run.metrics["resumed_at"] == []
            out[seed] = _finished(run, cache)
    return out


def test_the_stand_in_exercises_the_budget_that_follows_progress(uninterrupted):
    """The stop points below land in the phases they are there to test, whatever bits the
    stand-in draws on this CPU: step 8 before the level, 28 after the first tail restart, 48
    after the second; the cap ends the run."""
    _, m = uninterrupted[SEED]
    restarts = m["tail_restarts"]
    assert len(restarts) >= 2, restarts
    assert 8 < m["decay_from"] <= restarts[0] <= 28 < restarts[1] <= 48, (m["decay_from"],
                                                                         restarts)
    assert m["steps"] == TINY.steps
    # dense points every 2 steps up to 10, then every 6: the profile's, not the run's
    assert m["curve"]["step"] == [2, 4, 6, 8, 10, 12, 18, 24, 30, 36, 42, 48, 54, 60]
    assert len(m["scores_init"]) == TINY.model.n_layer + 1


# stopped: in the dense curve points before the level; in the tail, after the first
# restart and a new epoch; after the second restart and the second epoch
@pytest.mark.parametrize("k, resumed_from", [(11, 8), (31, 28), (51, 48)])
def test_a_stopped_run_resumes_bit_for_bit(tmp_path, monkeypatch, uninterrupted, k,
                                           resumed_from):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, k)
    folder = cache / "checkpoints" / _key()
    assert sorted(p.name for p in folder.iterdir()) == [f"{s:09d}" for s in
                                                        (resumed_from - 4, resumed_from)]
    state = json.loads((folder / f"{resumed_from:09d}" / ck.STATE).read_text())
    assert state["key"] == _key() and state["step"] == resumed_from
    assert not (cache / "runs" / _key()).exists()

    run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache, progress=False)
    assert not run.from_cache and run.metrics["resumed_at"] == [resumed_from]
    assert _finished(run, cache) == uninterrupted[SEED]
    # the training time counts both segments
    assert run.metrics["train_seconds"] > state["fields"]["loop"]["seconds"] > 0
    assert not folder.exists()  # committed: its checkpoints are gone


def test_a_run_stopped_twice_records_both_resumptions(tmp_path, monkeypatch, uninterrupted):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 11)
    _stopped_run(monkeypatch, cache, 31 - 8)  # the second segment counts from step 8
    run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache, progress=False)
    assert run.metrics["resumed_at"] == [8, 28]
    assert _finished(run, cache) == uninterrupted[SEED]


def test_train_many_goes_on_with_a_stopped_run(tmp_path, monkeypatch, uninterrupted):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 31)
    run = launch.train_many([(TASK, SEED)], TINY, device="cpu", cache_dir=cache,
                            workers=1)[TASK, SEED]
    assert run.metrics["resumed_at"] == [28]
    assert _finished(run, cache) == uninterrupted[SEED]


def test_a_rerun_goes_on_with_the_runs_in_flight_before_it_starts_others(
        tmp_path, monkeypatch, uninterrupted):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 31)  # seed SEED in flight; seed 3 not begun
    order = []

    def pool(jobs, device, cache_dir, n_workers):  # the pool, one job after another
        for job in jobs:
            order.append(job.seed)
            rc.train_or_load(job.task, job.seed, job.profile, device, cache_dir,
                             progress=False)

    monkeypatch.setattr(launch, "_train_in_pool", pool)
    # the same cost, seed 3 listed first: only being in flight puts seed SEED ahead
    done = launch.train_many([(TASK, 3), (TASK, SEED)], TINY, device="cpu",
                             cache_dir=cache, workers=2)
    assert order == [SEED, 3]
    assert done[TASK, SEED].metrics["resumed_at"] == [28]
    assert done[TASK, 3].metrics["resumed_at"] == []
    for seed in (SEED, 3):
        assert _finished(done[TASK, seed], cache) == uninterrupted[seed]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_state(path: Path) -> None:
    state = json.loads(path.read_text())
    state["fields"]["loop"]["cursor"] += 8
    path.write_text(json.dumps(state))


@pytest.mark.parametrize("damage, file", [(_flip_a_byte, ck.TENSORS), (_edit_state, ck.STATE),
                                          (lambda p: p.write_bytes(b""), ck.TENSORS),
                                          (lambda p: p.unlink(), ck.STATE)])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_one_before_used(
        tmp_path, monkeypatch, uninterrupted, damage, file):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 31)
    folder = cache / "checkpoints" / _key()
    damage(folder / f"{28:09d}" / file)
    with pytest.warns(CacheWarning, match=f"{28:09d}") as caught:
        run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache,
                               progress=False)
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 1
    assert run.metrics["resumed_at"] == [24]
    assert _finished(run, cache) == uninterrupted[SEED]


def test_with_every_checkpoint_damaged_the_run_starts_from_zero(tmp_path, monkeypatch,
                                                                 uninterrupted):
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 31)
    folder = cache / "checkpoints" / _key()
    for path in folder.iterdir():
        _flip_a_byte(path / ck.TENSORS)
    with pytest.warns(CacheWarning) as caught:
        run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache,
                               progress=False)
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 2
    assert run.metrics["resumed_at"] == []
    assert _finished(run, cache) == uninterrupted[SEED]


def test_a_checkpoint_of_another_run_is_not_used(tmp_path, monkeypatch, uninterrupted):
    # seed 2's checkpoints put where seed 3's belong: same shapes, another key
    cache = tmp_path / "cache"
    _stopped_run(monkeypatch, cache, 31)
    (cache / "checkpoints" / _key()).rename(cache / "checkpoints" / _key(3))
    with pytest.warns(CacheWarning, match="records run key") as caught:
        run = rc.train_or_load(TASK, 3, TINY, device="cpu", cache_dir=cache, progress=False)
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 2  # both moved aside
    assert run.metrics["resumed_at"] == []
    assert _finished(run, cache) == uninterrupted[3]


def test_a_committed_run_leaves_no_checkpoint(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _every(monkeypatch, 1)
    run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache, progress=False)
    assert run.metrics["resumed_at"] == []
    assert list((cache / "checkpoints").iterdir()) == []


_KILLED = """
    import sys, time
    import nopelib.training.train as tr
    # this file by its path: a package of another distribution may be called tests
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint import TINY, TASK, SEED, _validation_stand_in
    from nopelib.training.runs import train_or_load

    slow = tr.train_step
    def step(*args, **kwargs):  # slow enough to be killed mid-run; the bits are the same
        time.sleep(0.05)
        return slow(*args, **kwargs)

    tr.train_step, tr.evaluate = step, _validation_stand_in
    train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=sys.argv[1], progress=False)
"""


def test_a_run_killed_with_sigkill_resumes_bit_for_bit(tmp_path, monkeypatch, uninterrupted):
    cache = tmp_path / "cache"
    folder = cache / "checkpoints" / _key()
    env = {**os.environ, ck.SECONDS_ENV: "0"}  # a checkpoint after every step
    here = Path(__file__).resolve().parent
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED), str(cache),
                             str(here)], cwd=here.parents[1], env=env)
    try:
        deadline = time.monotonic() + 300  # importing torch is slow on a loaded machine
        while time.monotonic() < deadline and proc.poll() is None:
            steps = [int(p.name) for p in folder.glob("[0-9]*")] if folder.is_dir() else []
            if steps and max(steps) >= 20:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it was killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    run = rc.train_or_load(TASK, SEED, TINY, device="cpu", cache_dir=cache, progress=False)
    assert len(run.metrics["resumed_at"]) == 1 and run.metrics["resumed_at"][0] >= 19
    assert _finished(run, cache) == uninterrupted[SEED]
    assert not folder.exists()


# --- the checkpoint folder on its own ---------------------------------------------------------

def test_only_the_newest_two_checkpoints_are_kept_and_one_is_due_by_steps_or_time(tmp_path):
    store = ck.RunCheckpoints(tmp_path, "k", every_seconds=3600, every_steps=3)
    assert [store.due(i) for i in range(1, 7)] == [False, False, True, False, False, True]
    for step in (3, 6, 9):
        store.save(step, {"w": torch.full((2,), float(step))}, {"step": step})
    assert [p.name for p in store.saved()] == ["000000006", "000000009"]
    got = store.resume({"w": (2,)}, lambda tensors, fields: (tensors["w"].tolist(), fields))
    assert got == ([9.0, 9.0], {"step": 9})
    assert ck.RunCheckpoints(tmp_path, "k", every_seconds=0).due(1)
    store.clear()
    assert not (tmp_path / "k").exists() and store.resume({}, lambda t, f: 1) is None


@pytest.mark.parametrize("tensors, shapes, why", [
    ({"w": torch.zeros(3)}, {"w": (2,)}, r"another shape than this run's: \['w'\]"),
    ({"w": torch.zeros(2), "x": torch.zeros(1)}, {"w": (2,)}, r"\['x'\]"),
    ({"w": torch.tensor([0.0, float("nan")])}, {"w": (2,)}, "tensor w holds non-finite"),
])
def test_a_checkpoint_that_does_not_fit_the_run_is_moved_aside(tmp_path, tensors, shapes, why):
    store = ck.RunCheckpoints(tmp_path, "k")
    store.save(1, tensors, {})
    with pytest.warns(CacheWarning, match=why):
        assert store.resume(shapes, lambda t, f: 1) is None
    assert store.saved() == [] and len(list((tmp_path / "k").glob(".bad-*"))) == 1


def test_a_checkpoint_that_the_loop_refuses_is_moved_aside_and_the_previous_used(tmp_path):
    store = ck.RunCheckpoints(tmp_path, "k")
    store.save(1, {"w": torch.zeros(2)}, {"ok": True})
    store.save(2, {"w": torch.zeros(2)}, {"ok": False})

    def restore(tensors, fields):
        if not fields["ok"]:
            raise ValueError("not this one")
        return 1

    with pytest.warns(CacheWarning, match="not this one"):
        assert store.resume({"w": (2,)}, restore) == 1


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_checkpoint_interval_is_refused(monkeypatch, value):
    monkeypatch.setenv(ck.SECONDS_ENV, value)
    with pytest.raises(ValueError, match=f"{ck.SECONDS_ENV}='{value}' is not allowed"):
        ck.seconds_between()


def test_the_metrics_check_accepts_runs_with_and_without_resumptions(uninterrupted):
    _, m = uninterrupted[SEED]
    full = {**m, "train_seconds": 1.0}
    assert run_entry.metrics_problem(full) is None
    assert run_entry.metrics_problem({k: v for k, v in full.items() if k != "resumed_at"}) is None
    assert run_entry.metrics_problem({**full, "resumed_at": [8, 28]}) is None
    for bad in ([0], [61], ["8"], 8):
        assert "resumed_at" in run_entry.metrics_problem({**full, "resumed_at": bad})


def test_two_writers_of_one_checkpoint_step_both_survive_and_reads_stay_small(tmp_path,
                                                                            monkeypatch):
    from nopelib.store import cache

    # a read sized by max_bytes allocated 64 GiB for a checkpoint read without its shapes
    asked = []
    real = cache.open_regular

    def spy(path, max_bytes):
        f = real(path, max_bytes)
        read = f.read
        f_read = lambda n=-1: (asked.append(n), read(n))[1]  # noqa: E731
        return type("F", (), {"read": staticmethod(f_read), "__enter__": lambda s: s,
                              "__exit__": lambda s, *a: f.close()})()
    monkeypatch.setattr(cache, "open_regular", spy)
    first, second = (ck.RunCheckpoints(tmp_path, "k", every_seconds=0) for _ in range(2))
    first.save(5, {"w": torch.ones(2)}, {"by": "first"})
    second.save(5, {"w": torch.ones(2)}, {"by": "second"})  # the step is taken: it is read
    assert asked and max(asked) <= cache.READ_CHUNK
    got = first.resume({"w": (2,)}, lambda tensors, fields: fields["by"])
    assert got == "first"  # the committed one stays; neither writer raised
    big = tmp_path / "big"
    big.write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="more than the 5"):
        cache.read_bytes(big, 5)
    monkeypatch.setattr(cache, "open_regular", real)
    assert cache.read_bytes(big, 2**36) == b"x" * 10


def test_a_bad_checkpoint_interval_is_refused_before_any_run_trains(tmp_path, monkeypatch):
    monkeypatch.setenv(ck.SECONDS_ENV, "-5")
    monkeypatch.setattr(launch, "find_missing", lambda *a, **k: pytest.fail("work began"))
    with pytest.raises(ValueError, match=r"NOPELIB_CHECKPOINT_SECONDS='-5' is not allowed"):
        launch.train_missing([("reversal", 0, TINY)], cache_dir=tmp_path)
