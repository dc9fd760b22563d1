"""A run's checkpoints: the state of a run in flight, so that a stopped run resumes.

A run killed, interrupted or cut off by a shutdown goes on from its last checkpoint the next
time it is asked for (``runs.train_or_load``, and so ``launch.train_many``), and ends exactly as
it would have without the stop. The checkpoints of the run with key K are folders
``<cache>/checkpoints/K/<step>/``, each with two files: the tensors (``tensors.safetensors``)
and the rest (``state.json``), which records the run key, the step, the SHA-256 of the tensors
file and of itself. What they hold is the writer's business (``loop.fit``); this module writes,
reads, verifies and clears them, by the run cache's rules (``nopelib.store.cache``):

- a checkpoint is written into a temporary folder, flushed to disk, and renamed into place, so
  a writer stopped mid-write leaves nothing that is read back;
- the newest two are kept: one that fails a check on resume (checksums, the run key, every
  tensor's name and shape, finite values, a document nested too deeply to parse) is moved
  aside with a warning and the one before it is tried; one this process may not read
  (permission denied: not damage) is skipped with a warning and left in place; with none
  usable the run starts from step 0;
- its files get the umask's permissions (``cache.commit_dir``), like every cache entry;
- the run's folder is removed once the run is committed to the run cache.

A checkpoint is written at a step boundary once ``every_seconds`` (300, or
$NOPELIB_CHECKPOINT_SECONDS) have passed since the last one, so it costs a fraction of a
percent of a run's time and a stop loses at most those minutes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from nopelib.store import cache

SECONDS_ENV = "NOPELIB_CHECKPOINT_SECONDS"
EVERY_SECONDS = 300.0  # between checkpoints: what a stop may cost, against the writing time
KEEP = 2  # the newest checkpoints kept: a damaged newest one falls back to the one before
TENSORS, STATE = "tensors.safetensors", "state.json"
MAX_STATE_BYTES = 16 * 2**20  # a state.json is kilobytes to a megabyte (the curves)

T = TypeVar("T")


class BadCheckpoint(ValueError):
    """A checkpoint that must not be resumed from; the message says why."""


def seconds_between() -> float:
    """Seconds between a run's checkpoints: $NOPELIB_CHECKPOINT_SECONDS, else EVERY_SECONDS
    (0: after every step)."""
    raw = os.environ.get(SECONDS_ENV, "")
    if not raw:
        return EVERY_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{SECONDS_ENV}={raw!r} is not allowed: a number of seconds >= 0")
    return value


def _digest(state: dict) -> str:
    """SHA-256 of a state.json's content as canonical JSON, its own digest left out."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Write a file and flush it to disk: after a shutdown, a renamed folder must not hold an
    empty file."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class RunCheckpoints:
    """The checkpoints of the run with key ``key``, in ``root / key``. One is due after a step
    once ``every_seconds`` (None: ``seconds_between()``) have passed since the last one, or at
    every multiple of ``every_steps`` (0: never by steps; tests use it)."""

    def __init__(self, root: Path, key: str, every_seconds: float | None = None,
                 every_steps: int = 0):
        if type(every_steps) is not int or every_steps < 0:
            raise ValueError(f"every_steps={every_steps!r} must be a non-negative integer")
        self.key = key
        self.folder = Path(root) / key
        self.every_seconds = seconds_between() if every_seconds is None else every_seconds
        self.every_steps = every_steps
        self._last = time.perf_counter()

    def saved(self) -> list[Path]:
        """The checkpoint folders there are, oldest first."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir()
                 if p.name.isdigit() and p.is_dir() and not p.is_symlink()]
        return sorted(found, key=lambda p: int(p.name))

    def due(self, step: int) -> bool:
        """Whether to checkpoint after ``step``."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        return by_steps or time.perf_counter() - self._last >= self.every_seconds

    def save(self, step: int, tensors: dict[str, torch.Tensor], fields: dict) -> None:
        """Write the checkpoint after ``step``: ``tensors`` (safetensors) and ``fields`` (JSON),
        then drop all but the newest KEEP. A cache that cannot take it is warned about and the
        run goes on without it: a checkpoint only saves time."""
        try:
            tmp = cache.staging_dir(self.folder, f"{step:09d}")
            try:
                data = save_tensors({k: v.detach().cpu().contiguous()
                                     for k, v in tensors.items()})
                _write(tmp / TENSORS, data)
                state = {"key": self.key, "step": step,
                         "tensors_sha256": hashlib.sha256(data).hexdigest(), "fields": fields}
                state["state_sha256"] = _digest(state)
                _write(tmp / STATE, json.dumps(state).encode())
                cache.commit_dir(tmp, self.folder / f"{step:09d}", self._readable)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            for old in self.saved()[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            warnings.warn(f"could not write the checkpoint of run {self.key} at step {step} "
                          f"under {self.folder} ({exc}); training goes on without it",
                          cache.CacheWarning, stacklevel=2)
        self._last = time.perf_counter()

    def resume(self, shapes: dict[str, tuple[int, ...]],
               restore: Callable[[dict[str, torch.Tensor], dict], T]) -> T | None:
        """``restore(tensors, fields)`` of the newest usable checkpoint, or None: there is
        none, or none is usable. A checkpoint whose tensors are not exactly ``shapes`` (names
        and shapes), that fails another check, or that ``restore`` refuses (KeyError,
        TypeError, ValueError, raised before it changes anything) is moved aside with a
        warning, and the one before it is tried."""
        cache.sweep_stale(self.folder)  # what writers killed mid-write left
        for path in reversed(self.saved()):
            try:
                return restore(*self._read(path, shapes))
            except PermissionError as exc:
                warnings.warn(f"checkpoint {path} cannot be read ({exc}); it is left in place "
                              "and skipped", cache.CacheWarning, stacklevel=2)
            # BadCheckpoint is a ValueError; RecursionError: a document nested too deeply
            except (KeyError, TypeError, ValueError, RecursionError) as exc:
                cache.quarantine(path, f"{type(exc).__name__}: {exc}")
        return None

    def clear(self) -> None:
        """Remove the run's checkpoints (once the run is committed)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _read(self, path: Path, shapes: dict[str, tuple[int, ...]] | None
              ) -> tuple[dict[str, torch.Tensor], dict]:
        """The tensors and fields of the checkpoint in ``path``, verified; raises BadCheckpoint
        naming the problem, or PermissionError for a file this process may not read.
        ``shapes`` None: the tensors' names and shapes are not checked."""
        try:
            state = json.loads(cache.read_bytes(path / STATE, MAX_STATE_BYTES))
        except PermissionError:
            raise
        # json.loads raises RecursionError on a document nested deeper than the stack
        except (OSError, ValueError, RecursionError) as exc:
            raise BadCheckpoint(f"{STATE}: {type(exc).__name__}: {exc}") from None
        if not isinstance(state, dict) or state.get("key") != self.key:
            got = state.get("key") if isinstance(state, dict) else None
            raise BadCheckpoint(f"{STATE} records run key {got!r}, not {self.key!r}")
        if state.get("state_sha256") != _digest(state):
            raise BadCheckpoint(f"{STATE} does not match its recorded SHA-256")
        if state.get("step") != int(path.name):
            raise BadCheckpoint(f"{STATE} records step {state.get('step')!r}, its folder "
                                f"{path.name}")
        # 8 bytes an element is the widest dtype a checkpoint holds, plus the header
        max_bytes = 2**36 if shapes is None else 8 * sum(map(math.prod, shapes.values())) + 2**20
        try:
            data = cache.read_bytes(path / TENSORS, max_bytes)
        except PermissionError:
            raise
        except OSError as exc:
            raise BadCheckpoint(f"{TENSORS}: {exc}") from None
        if hashlib.sha256(data).hexdigest() != state.get("tensors_sha256"):
            raise BadCheckpoint(f"{TENSORS} does not match the SHA-256 in {STATE}")
        try:
            tensors = load_tensors(data)
        except Exception as exc:  # noqa: BLE001  (safetensors raises its own types)
            raise BadCheckpoint(f"{TENSORS}: {type(exc).__name__}: {exc}") from None
        if shapes is not None:
            got = {name: tuple(t.shape) for name, t in tensors.items()}
            wrong = sorted(n for n in got.keys() | shapes.keys() if got.get(n) != shapes.get(n))
            if wrong:
                raise BadCheckpoint(f"tensors missing, unexpected or of another shape than this "
                                    f"run's: {wrong[:5]}{' ...' if len(wrong) > 5 else ''}")
        for name, t in tensors.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise BadCheckpoint(f"tensor {name} holds non-finite values")
        return tensors, state["fields"]

    def _readable(self, path: Path) -> bool:
        """Whether a checkpoint committed meanwhile at ``path`` stays in place of ours: a
        readable one, or one this process may not read (not known to be bad)."""
        try:
            self._read(path, None)
        except (BadCheckpoint, RecursionError):
            return False
        except PermissionError:
            pass  # not known to be bad: kept
        return True
