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
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from nopelib.core.devices import dtype_policy, resolve_device
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.tasks import TASKS, get_task, make_split
from nopelib.store import cache, sources
from nopelib.store.cache import resolve_cache_dir
from nopelib.store.checkpoint import KEEP, RunCheckpoints
from nopelib.training.exact_match import evaluate
from nopelib.training.profiles import get_profile
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


class _BadEntry(Exception):
    """A run cache entry that must not be used; the message says why."""


class _Unreadable(Exception):
    """A run cache entry this process may not read (permission denied): not known to be bad,
    so it is neither used nor moved aside; the message says which file."""


MAX_METRICS_BYTES = 16 * 2**20  # a metrics.json is kilobytes; anything far larger is not one


def metrics_digest(metrics: dict) -> str:
    """SHA-256 of a run's metrics as canonical JSON, the digest field itself left out: stored
    in the entry, so that an edited accuracy or loss is a mismatch, not a result."""
    body = {k: v for k, v in metrics.items() if k != "metrics_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _finite_number(value: object, lo: float = -math.inf, hi: float = math.inf) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and lo <= value <= hi)


def metrics_problem(metrics: object) -> str | None:
    """What is wrong with a run's metrics (types, ranges, finiteness of the fields a chapter
    reads), or None. Checked before a run is committed and every time one is loaded."""
    if not isinstance(metrics, dict):
        return f"metrics are a {type(metrics).__name__}, not an object"
    checks = {
        "accuracy": lambda v: _finite_number(v, 0.0, 1.0),
        "n_test": lambda v: type(v) is int and v >= 1,
        "steps": lambda v: type(v) is int and v >= 1,
        "seed": lambda v: type(v) is int and v >= 0,
        "task": lambda v: v in TASKS,
        "final_loss": _finite_number,
        "train_seconds": lambda v: _finite_number(v, 0.0),
        "loss_curve": lambda v: isinstance(v, list) and bool(v) and all(map(_finite_number, v)),
    }
    for name, ok in checks.items():
        if name not in metrics:
            return f"{name} is missing"
        if not ok(metrics[name]):
            return f"{name}={metrics[name]!r} is not allowed"
    curve = metrics.get("curve")
    if curve is not None:
        if not (isinstance(curve, dict) and {"step", "accuracy"} <= set(curve)
                and isinstance(curve["step"], list) and isinstance(curve["accuracy"], list)
                and len(curve["step"]) == len(curve["accuracy"])
                and all(type(x) is int and x >= 1 for x in curve["step"])
                and all(_finite_number(a, 0.0, 1.0) for a in curve["accuracy"])):
            return "curve must hold equal lists of positive steps and accuracies in [0, 1]"
        if "val_accuracy" in curve and not (
                isinstance(curve["val_accuracy"], list)
                and len(curve["val_accuracy"]) == len(curve["step"])
                and all(_finite_number(a, 0.0, 1.0) for a in curve["val_accuracy"])):
            return "curve.val_accuracy must hold one accuracy in [0, 1] per curve step"
        if "scores" in curve and not (
                isinstance(curve["scores"], list) and len(curve["scores"]) == len(curve["step"])
                and all(_layer_scores(row) for row in curve["scores"])):
            return "curve.scores must hold one list of layer scores in [0, 1] per curve step"
    if "scores_init" in metrics and not _layer_scores(metrics["scores_init"]):
        return "scores_init must be a list of layer scores in [0, 1]"
    resumed = metrics.get("resumed_at", [])  # absent in runs from before checkpoints
    if not (isinstance(resumed, list)
            and all(type(x) is int and 1 <= x <= metrics["steps"] for x in resumed)):
        return f"resumed_at={resumed!r} must be a list of steps in [1, steps]"
    return None


def _layer_scores(row: object) -> bool:
    return (isinstance(row, list) and len(row) >= 2
            and all(_finite_number(x, 0.0, 1.0) for x in row))


def _check_entry(run_dir: Path, key: str, profile: TrainProfile) -> tuple[GPT, dict]:
    """The committed run under ``run_dir``, verified; raises _BadEntry naming the problem, or
    _Unreadable naming the file this process may not read."""
    try:  # is_dir() too raises PermissionError, in a folder this process may not search
        if os.path.islink(run_dir) or not run_dir.is_dir():
            raise _BadEntry("the entry is not a directory")
        metrics = json.loads(cache.read_bytes(run_dir / "metrics.json", MAX_METRICS_BYTES))
    except PermissionError as exc:
        raise _Unreadable(f"metrics.json: {exc}") from None
    # json.loads raises RecursionError on a document nested deeper than the stack
    except (OSError, ValueError, RecursionError) as exc:
        raise _BadEntry(f"metrics.json: {type(exc).__name__}: {exc}") from None
    if not isinstance(metrics, dict) or metrics.get("key") != key:
        got = metrics.get("key") if isinstance(metrics, dict) else None
        raise _BadEntry(f"metrics.json records key {got!r}, not {key!r}")
    try:
        metrics_sha = metrics_digest(metrics)
    except RecursionError as exc:  # a document json.loads could just parse, dumps cannot
        raise _BadEntry(f"metrics.json: RecursionError: {exc}") from None
    if metrics.get("metrics_sha256") != metrics_sha:
        raise _BadEntry("metrics.json does not match its recorded SHA-256 (edited?)")
    problem = metrics_problem(metrics)
    if problem:
        raise _BadEntry(f"metrics.json: {problem}")
    weights = run_dir / "model.safetensors"
    model = GPT(profile.model)
    # float32 weights plus a header: anything much larger is not this model's file
    max_bytes = 4 * model.num_params() + 2**20
    try:
        digest = cache.file_sha256(weights, max_bytes)
    except PermissionError as exc:
        raise _Unreadable(f"model.safetensors: {exc}") from None
    except OSError as exc:
        raise _BadEntry(f"model.safetensors: {exc}") from None
    if metrics.get("weights_sha256") != digest:
        raise _BadEntry("model.safetensors does not match the SHA-256 in metrics.json")
    try:
        load_model(model, str(weights), device="cpu")
    except Exception as exc:  # noqa: BLE001  (safetensors raises its own types)
        raise _BadEntry(f"model.safetensors: {type(exc).__name__}: {exc}") from None
    if not _finite_weights(model):
        raise _BadEntry("model.safetensors holds non-finite weights")
    return model.eval(), metrics


def load_run(run_dir: Path, key: str, profile: TrainProfile) -> tuple[GPT, dict] | None:
    """The committed run under ``run_dir``, or None: absent, unusable and moved aside, or not
    readable by this process (reported, left in place)."""
    if not os.path.lexists(run_dir):
        return None
    try:
        return _check_entry(run_dir, key, profile)
    except _Unreadable as exc:
        warnings.warn(f"run cache entry {run_dir} cannot be read ({exc}); it is left in place "
                      "and treated as absent (its owner can make it readable to the group, or "
                      f"set {cache.CACHE_ENV} to a cache of your own)", cache.CacheWarning,
                      stacklevel=2)
        return None
    except _BadEntry as exc:
        cache.quarantine(run_dir, str(exc))
        return None


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


def _finite_weights(model: GPT) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.state_dict().values())


def commit_run(runs: Path, key: str, model: GPT, metrics: dict, profile: TrainProfile) -> None:
    """Write weights and metrics to a temporary directory, then rename it to ``runs/key``.

    Refuses (RuntimeError) a run whose loss or weights are not finite: such a run is a failed
    run, and caching it would serve the failure as a result."""
    losses = [metrics["final_loss"], *metrics["loss_curve"]]
    if not all(math.isfinite(x) for x in losses) or not _finite_weights(model):
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
    cache.commit_dir(tmp, runs / key, lambda d: _keep(d, key, profile))


def _keep(run_dir: Path, key: str, profile: TrainProfile) -> bool:
    """Whether the entry a concurrent writer committed at ``run_dir`` stays in place of ours:
    a valid one, or one this process may not read (not known to be bad)."""
    try:
        _check_entry(run_dir, key, profile)
    except _BadEntry:
        return False
    except _Unreadable:
        pass  # not known to be bad: kept
    return True


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

