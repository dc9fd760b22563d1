"""The run cache: a run's key, and its entry (verified on load, committed atomically).

A run is one (task, seed, profile). Its key hashes the full model config, the profile's
training fields, the task, the seed, the bytes of nopelib's training sources
(``training_sources``: the import closure of the training code), the device type, its dtype
policy, and the torch and numpy versions. Its entry is a folder ``<cache>/runs/<key>`` with the
weights (safetensors) and the metrics (JSON), written into a temporary folder and renamed into
place: the rename is the commit point, so an interrupted run leaves nothing that a later call
loads. The metrics record the SHA-256 of the weights file and of themselves, both checked on
every load, and their fields are type- and range-checked; an entry that is not a regular file
of a sane size, is unreadable, records another key or checksum, is nested too deeply to
parse, or holds non-finite weights is moved aside with a warning and retrained
(``nopelib.store.cache``); one this process may not read (permission denied: another member of a
shared cache, not damage) is reported, left in place and treated as absent. A run whose loss
or weights are not finite is never committed, and a cache that cannot take a run (not a
folder, not writable, less room than the run will write: ``run_write_bytes``) is refused
before training starts.

A run in training keeps checkpoints under ``<cache>/checkpoints/<key>``
(``nopelib.store.checkpoint``) until it is committed: a run that was stopped goes on from its newest
one the next time it is asked for, and its metrics say where (``resumed_at``).

``train_or_load`` is the one call for one run; ``nopelib.training.launch`` trains many.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_model

from nopelib.core.devices import dtype_policy, resolve_device
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.tasks import get_task, make_split
from nopelib.store import cache, sources
from nopelib.store.cache import resolve_cache_dir
from nopelib.store.checkpoint import KEEP, RunCheckpoints
from nopelib.training.exact_match import evaluate
from nopelib.training.profiles import get_profile
from nopelib.training.run_entry import (finite_weights, keeps_entry, load_run, metrics_digest,
                                        metrics_problem)
from nopelib.training.train import train
from nopelib.training.train_profile import TrainProfile, check_seed


@dataclass
class TrainedRun:
    """A trained model (eval mode, on the CPU) with its metrics and where it came from."""

    model: GPT
    metrics: dict
    profile: TrainProfile
    from_cache: bool


# The modules that train runs (one run here through the loop in ``train``, batched seeds in
# ``batched``); every nopelib module they import, directly or through each other, decides what
# a run trains into, so the run key hashes that import closure (``sources.import_closure``),
# read from the code itself, each module by its syntax (comments and docstrings do not count).
TRAINING_ENTRY_POINTS = ("nopelib.training.runs", "nopelib.training.batched")


def training_sources() -> tuple[str, ...]:
    """The nopelib source files (relative to the package) whose syntax is part of every run
    key: the import closure of TRAINING_ENTRY_POINTS. Analysis, plotting, probe and benchmark
    code is outside it, so editing them keeps the cache."""
    return sources.import_closure(sources.module_file(m) for m in TRAINING_ENTRY_POINTS)


def source_hash() -> str:
    """SHA-256 of nopelib's training sources (``training_sources``), each by its syntax: a
    change to what any of them computes invalidates every cached run."""
    return sources.source_hash(training_sources())


def run_key(task: str, seed: int, profile: TrainProfile, device: str | torch.device = "cpu") -> str:
    """The cache key of a run: the full config, the profile's training fields, task, seed, source,
    and what else changes the trained weights: the device type, its dtype policy, torch's and
    numpy's versions (a CUDA bfloat16 run is another run than a CPU float32 one)."""
    # the task's own budget, not the whole profile: changing another task's steps leaves this
    # run's key alone; which seeds a chapter trains does not change how one seed trains
    fields = asdict(profile.for_task(task))
    fields.pop("seeds")
    fields.pop("claim_tasks")  # which tasks a chapter judges does not change a run
    kind = torch.device(device).type
    # numpy's version: its default_rng stream draws every run's data order; the dtype policy
    # is the one that runs (a bf16 profile on a CPU without bf16 units trains in float32)
    payload = {"task": task, "seed": seed, "profile": fields, "source": source_hash(),
               "device_type": kind, "dtype_policy": dtype_policy(kind, profile.precision),
               "torch": torch.__version__, "numpy": np.__version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Job:
    """One run to have: its task, seed, the profile it is keyed under, its key, and whether
    the cache lacked it when it was looked up."""

    task: str
    seed: int
    profile: TrainProfile
    key: str
    missing: bool = False

    def cost(self) -> int:  # a run's time grows with its steps, batch and task length
        own = self.profile.for_task(self.task)
        return own.steps * own.batch_size * get_task(self.task).max_input_len


def find_missing(jobs: list[Job], root: Path) -> tuple[list[Job], list[Job]]:
    """The jobs, each once (in order), marked with whether the cache under ``root`` lacks
    their run (or holds it unusable: moved aside); and the missing ones, costliest first."""
    unique = {job.key: job for job in jobs}
    lacking = {key for key, job in unique.items()
               if load_run(root / key, key, job.profile) is None}
    marked = [replace(job, missing=job.key in lacking) for job in unique.values()]
    missing = sorted((job for key, job in unique.items() if key in lacking), key=Job.cost,
                     reverse=True)  # stable: equal costs keep the jobs' order
    return marked, [replace(job, missing=True) for job in missing]


_HEADER_BYTES = 2**20  # a weights or checkpoint file's JSON header, at most
_DOCUMENT_BYTES = 4 * 2**20  # a metrics.json or state.json: kilobytes, megabytes with curves


@functools.lru_cache(maxsize=64)
def _num_params(config: GPTConfig) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initial weights drawn
        return GPT(config).num_params()


def weights_bytes(profile: TrainProfile) -> int:
    """About what a committed run of ``profile`` takes: its float32 weights (safetensors, with
    their header) and its metrics."""
    return 4 * _num_params(profile.model) + _HEADER_BYTES + _DOCUMENT_BYTES


def checkpoints_bytes(profile: TrainProfile) -> int:
    """About the most a run of ``profile`` in flight keeps under ``<cache>/checkpoints``: KEEP
    checkpoints and the one being written, each the float32 weights, AdamW's two moments, the
    data order (int64 per training row), a header and the state document."""
    one = 3 * 4 * _num_params(profile.model) + 8 * profile.n_train + _HEADER_BYTES
    return (KEEP + 1) * (one + _DOCUMENT_BYTES)


def run_write_bytes(profiles: Sequence[TrainProfile], in_flight: int = 1) -> int:
    """About what training one run of each of ``profiles`` writes to the cache: every run's
    weights and metrics, and the checkpoints of the ``in_flight`` largest runs, trained at the
    same time (a run's checkpoints are removed once it is committed)."""
    if type(in_flight) is not int or in_flight < 1:
        raise ValueError(f"in_flight={in_flight!r} must be a positive integer")
    flying = sorted((checkpoints_bytes(p) for p in profiles), reverse=True)[:in_flight]
    return sum(map(weights_bytes, profiles)) + sum(flying)


def prepare_runs_dir(runs: Path, need_bytes: int = 0) -> None:
    """Before training into the run folder ``runs``: refuse a cache that cannot take the runs
    (``cache.check_writable``: ``need_bytes``, from ``run_write_bytes``, and a margin free),
    and sweep what killed writers left there. ``need_bytes`` 0 checks the folder and the
    margin only, for a caller whose runs each check their own size (``train_or_load``)."""
    cache.check_writable(runs, need_bytes)
    cache.sweep_stale(runs)


def commit_run(runs: Path, key: str, model: GPT, metrics: dict, profile: TrainProfile) -> None:
    """Write weights and metrics to a temporary directory, then rename it to ``runs/key``.

    Refuses (RuntimeError) a run whose loss or weights are not finite: such a run is a failed
    run, and caching it would serve the failure as a result."""
    losses = [metrics["final_loss"], *metrics["loss_curve"]]
    if not all(math.isfinite(x) for x in losses) or not finite_weights(model):
        raise RuntimeError(f"run {metrics.get('task')!r} seed {metrics.get('seed')!r} of profile "
                           f"{profile.name!r} diverged (non-finite loss or weights); not cached")
    problem = metrics_problem(metrics)
    if problem:
        raise RuntimeError(f"run {metrics.get('task')!r} seed {metrics.get('seed')!r}: "
                           f"{problem}; not cached")
    tmp = cache.staging_dir(runs, key)
    save_model(model, str(tmp / "model.safetensors"))
    metrics["weights_sha256"] = cache.file_sha256(tmp / "model.safetensors")
    metrics["metrics_sha256"] = metrics_digest(metrics)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
    cache.commit_dir(tmp, runs / key, lambda d: keeps_entry(d, key, profile))


def train_and_score(task: str, seed: int, prof: TrainProfile, dev: torch.device, key: str,
                    progress: bool = True, checkpoints: RunCheckpoints | None = None
                    ) -> tuple[GPT, dict]:
    """Train one run (from its newest checkpoint, given its ``checkpoints``), evaluate it and
    fill in its metrics; nothing but checkpoints is written. The model comes back on the CPU
    in eval mode. Every backend trains a run through this function, so a seed gives the same
    weights whichever process or machine runs it."""
    if dev.type == "cpu":
        # one thread: CPU results are then identical whatever the core count (a reduction
        # split over threads rounds differently); train_many runs in parallel instead
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            model, metrics = train(task, seed, prof, dev, progress, checkpoints)
        finally:
            torch.set_num_threads(threads)
    else:
        model, metrics = train(task, seed, prof, dev, progress, checkpoints)
    return score(model, metrics, task, seed, prof, dev, key)


def score(model: GPT, metrics: dict, task: str, seed: int, prof: TrainProfile,
          dev: torch.device, key: str) -> tuple[GPT, dict]:
    """Exact match of a trained run on its test prefix, and the metrics that describe the run
    (``metrics`` is completed in place); the model comes back on the CPU in eval mode."""
    test = make_split(task, seed, n_train=prof.n_train, n_test=prof.n_test).test[: prof.n_eval]
    start = time.perf_counter()
    metrics["accuracy"] = evaluate(model, test, batch_size=prof.eval_batch_size)
    metrics["eval_seconds"] = time.perf_counter() - start
    metrics.update(
        n_test=len(test), task=task, seed=seed, key=key, profile=prof.name,
        num_params=model.num_params(), config=prof.model.to_dict(), torch=torch.__version__,
        dtype_policy=dtype_policy(dev.type, prof.precision),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    return model.cpu().eval(), metrics


def train_or_load(
    task: str,
    seed: int = 0,
    profile: str | TrainProfile = "cpu",
    device: str = "auto",
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainedRun:
    """The trained run of (task, seed, profile): from the cache when its key matches, otherwise
    trained on ``device`` (going on from the run's newest checkpoint, if a stopped call left
    one), evaluated, and committed to the cache. The model comes back on the CPU in eval
    mode."""
    get_task(task)
    prof = get_profile(profile)
    check_seed(seed)
    dev = resolve_device(device)
    key = run_key(task, seed, prof, dev)
    root = resolve_cache_dir(cache_dir)
    runs = root / "runs"
    loaded = load_run(runs / key, key, prof)
    if loaded is not None:
        model, metrics = loaded
        return TrainedRun(model, metrics, prof, from_cache=True)

    # a cache that cannot take the run fails now, not after training
    prepare_runs_dir(runs, run_write_bytes([prof]))
    checkpoints = RunCheckpoints(root / "checkpoints", key)
    model, metrics = train_and_score(task, seed, prof, dev, key, progress, checkpoints)
    commit_run(runs, key, model, metrics, prof)
    checkpoints.clear()
    return TrainedRun(model, metrics, prof, from_cache=False)

