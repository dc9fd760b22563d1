"""A run cache entry checked before it is used: its key, checksums and finite numbers.

An entry is a folder ``<cache>/runs/<key>`` with the weights (safetensors) and the metrics
(JSON). ``load_run`` serves it only when its recorded key, the weights' and the metrics'
SHA-256, and every number it holds check out; a bad entry is moved aside with a warning and
the run is trained again, one this process may not read is left in place.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_model

from nopelib.core.model import GPT
from nopelib.core.tasks import TASKS
from nopelib.store import cache
from nopelib.training.train_profile import TrainProfile


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
    if not finite_weights(model):
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


def keeps_entry(run_dir: Path, key: str, profile: TrainProfile) -> bool:
    """Whether the entry a concurrent writer committed at ``run_dir`` stays in place of ours:
    a valid one, or one this process may not read (not known to be bad)."""
    try:
        _check_entry(run_dir, key, profile)
    except _BadEntry:
        return False
    except _Unreadable:
        pass  # not known to be bad: kept
    return True


def finite_weights(model: GPT) -> bool:
    """Whether every weight of ``model`` is a finite number."""
    return all(bool(torch.isfinite(p).all()) for p in model.state_dict().values())
