"""Launching runs: train the missing ones of many (task, seed, profile) jobs, then load them.

``train_missing`` is the one "train these missing runs" call; a backend decides where they
train, and every backend commits through ``runs.commit_run`` under the same keys:

- ``local`` (the default): on the CPU, one spawned process per core (``workers``), each run on
  one thread, the runs in flight first (a stopped call left checkpoints of them), then the
  costliest first, so results equal training one by one; on an accelerator, one run after
  another in this process.
- ``ray``: one Ray task per run, on a Ray instance started for the call or on a cluster
  (``nopelib.training.distributed``).
- ``batched``: the missing seeds of a task as one batched model on one device
  (``nopelib.training.batched``), keyed under the profile's ``batched()`` twin, since a batched run
  equals the separate run within float tolerance, not bit for bit.

``train_many`` trains what is missing and returns every run loaded from the cache. Workers die
with this process, and an interrupt (Ctrl-C) cancels queued runs and terminates running ones;
the local backend's runs train through ``runs.train_or_load``, so the next call goes on with
each of those from its last checkpoint (``nopelib.store.checkpoint``).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from nopelib.core.cost import model_params
from nopelib.core.devices import resolve_device
from nopelib.core.tasks import MAX_SEQ_LEN, TASKS, get_task
from nopelib.store.cache import resolve_cache_dir
from nopelib.store.checkpoint import RunCheckpoints, seconds_between
from nopelib.training.run_entry import load_run
from nopelib.training.runs import (Job, TrainedRun, find_missing, prepare_runs_dir, run_key,
                                   run_write_bytes, train_or_load)
from nopelib.training.train_profile import TrainProfile, check_seed

BACKENDS = ("local", "ray", "batched")  # where train_missing trains the missing runs
# Sustained training FLOP/s of one run on one CPU thread (about 6 * params * tokens / seconds,
# measured on a small model); only for the expected time that train_missing warns with.
CPU_FLOPS_PER_RUN = 3e10


def expected_cpu_seconds(profile: TrainProfile) -> float:
    """Rough seconds one run of ``profile`` trains on one CPU thread: 6 FLOPs per parameter
    and token (forward and backward), every row at the longest task's length, the steps
    averaged over the tasks (``task_budgets``)."""
    n_params = model_params(profile.model)
    rows = sum(profile.for_task(t).steps * profile.for_task(t).batch_size for t in TASKS)
    tokens = rows / len(TASKS) * MAX_SEQ_LEN
    return 6 * n_params * tokens / CPU_FLOPS_PER_RUN


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this process when the parent dies or is interrupted.

    Linux delivers SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG; strictly, when the
    thread that started the worker ends: train_many's caller); a daemon thread also polls the
    parent's id, the only mechanism elsewhere. SIGINT is ignored: Ctrl-C reaches the whole
    process group, and the parent decides (it cancels queued runs and terminates the running
    ones).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _train_in_worker(task: str, seed: int, profile: TrainProfile, device: str,
                     cache_dir: str | Path | None) -> None:
    train_or_load(task, seed, profile, device=device, cache_dir=cache_dir, progress=False)


def _train_in_pool(jobs: list[Job], device: str, cache_dir: str | Path | None,
                   n_workers: int) -> None:
    """Train ``jobs`` in ``n_workers`` spawned processes that cannot outlive this one.

    On any exception, KeyboardInterrupt included, queued runs are cancelled and running workers
    terminated before it propagates: control returns at once, not after the runs in flight.
    """
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads
    pool = ProcessPoolExecutor(n_workers, mp_context=context, initializer=_die_with_parent,
                               initargs=(os.getpid(),))
    futures = []
    try:
        futures += [pool.submit(_train_in_worker, job.task, job.seed, job.profile, device,
                                cache_dir) for job in jobs]
        for future in tqdm(futures, desc=f"training {len(jobs)} runs on {n_workers} processes"):
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        for process in list((pool._processes or {}).values()):  # no public API to stop workers
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _warn_if_slow(missing: list[Job], n_workers: int) -> None:
    # a budget that follows progress has no cost known in advance: its cap is only a bound
    fixed = [job for job in missing if not job.profile.stop_at]
    seconds = sum(expected_cpu_seconds(job.profile) for job in fixed)
    hours = seconds / max(1, n_workers) / 3600
    if hours > 1:
        names = sorted({job.profile.name for job in fixed})
        warnings.warn(f"training {len(fixed)} runs of profile(s) {names} on the CPU is "
                      f"expected to take about {hours:.0f} h on {n_workers} processes; "
                      "a GPU (device='cuda') or profile 'cpu' is faster", stacklevel=4)


def in_flight_first(missing: list[Job], checkpoints: Path) -> list[Job]:
    """``missing`` with the runs that have checkpoints under ``checkpoints`` (in flight when
    a call was stopped) moved to the front, each group in its order: a study stopped and
    rerun finishes the runs it began before it starts others, whatever their cost."""
    flying = {job.key for job in missing if RunCheckpoints(checkpoints, job.key).saved()}
    return sorted(missing, key=lambda job: job.key not in flying)  # stable


def train_missing(
    jobs: list[tuple[str, int, TrainProfile]],
    device: str = "auto",
    cache_dir: str | Path | None = None,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    gpu_fraction: float | None = None,
) -> list[Job]:
    """Train the (task, seed, profile) jobs that the cache lacks on ``backend`` (see the
    module's docstring); returns every job with the key it is filed under. The jobs may mix
    profiles, as the recipe study's NoPE and learned-position runs do; each is a resolved
    ``TrainProfile`` (a name is resolved once, where a command or chapter starts). Everything is checked
    before anything trains: tasks, seeds, backend, device, and whether the cache can take the
    runs. Training expected to take over an hour on the CPU warns first, with the time."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; allowed: {BACKENDS}")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ValueError(f"workers={workers!r} must be a positive integer")
    for task, seed, prof in jobs:
        get_task(task)
        check_seed(seed)
        if not isinstance(prof, TrainProfile):
            raise TypeError(f"jobs: the profile of ({task!r}, {seed}) is {prof!r}; allowed: a "
                            "TrainProfile (resolve a name once with profiles.get_profile)")
    seconds_between()  # a bad $NOPELIB_CHECKPOINT_SECONDS fails now, not at the first run
    if backend == "batched":
        jobs = [(t, s, p.batched()) for t, s, p in jobs]
    root = resolve_cache_dir(cache_dir) / "runs"
    if backend == "ray":
        from nopelib.training import distributed  # ray is imported only when asked for

        return distributed.train_missing_ray(jobs, device, root, address=address,
                                             gpu_fraction=gpu_fraction, workers=workers)
    dev = resolve_device(device)
    keyed, missing = find_missing([Job(t, s, p, run_key(t, s, p, dev)) for t, s, p in jobs],
                                  root)
    if not missing:
        return keyed
    missing = in_flight_first(missing, root.parent / "checkpoints")
    n_workers = min(workers or os.cpu_count() or 1, len(missing))
    # a cache that cannot take the runs (and the checkpoints of those in flight at once)
    # fails before any training
    prepare_runs_dir(root, run_write_bytes([job.profile for job in missing], n_workers))
    if dev.type == "cpu":
        _warn_if_slow(missing, n_workers)
    if backend == "batched":
        from nopelib.training import batched

        batched.train_jobs(missing, dev, root)
    elif dev.type == "cpu" and n_workers > 1:
        _train_in_pool(missing, device, cache_dir, n_workers)
    else:
        for job in missing:
            train_or_load(job.task, job.seed, job.profile, device=device, cache_dir=cache_dir)
    return keyed


def train_many(
    runs: list[tuple[str, int]],
    prof: TrainProfile,
    device: str = "auto",
    cache_dir: str | Path | None = None,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    gpu_fraction: float | None = None,
) -> dict[tuple[str, int], TrainedRun]:
    """Every (task, seed) of the profile ``prof`` as a TrainedRun: the missing ones trained by
    ``train_missing`` on ``backend``, then each loaded from the cache (``from_cache`` says
    whether it was there before the call). A (task, seed) listed twice is trained once. On the
    CPU the local backend trains one run per worker process, each on one thread, so the
    results are identical to training them one by one."""
    runs = list(dict.fromkeys((t, s) for t, s in runs))  # duplicates train once; order kept
    root = resolve_cache_dir(cache_dir) / "runs"
    jobs = train_missing([(t, s, prof) for t, s in runs], device, cache_dir, workers, backend,
                         address, gpu_fraction)
    done = {}
    for job in jobs:
        loaded = load_run(root / job.key, job.key, job.profile)
        if loaded is None:  # an entry that proved unusable after its commit: train it here
            done[job.task, job.seed] = train_or_load(job.task, job.seed, job.profile,
                                                     device=device, cache_dir=cache_dir)
        else:
            done[job.task, job.seed] = TrainedRun(*loaded, job.profile,
                                                  from_cache=not job.missing)
    return {(t, s): done[t, s] for t, s in runs}

