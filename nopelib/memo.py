"""A results cache for the chapters' expensive, deterministic studies.

``memo(fn, *args, **kwargs)`` returns ``fn(*args, **kwargs)``, computed once and then read from
disk. A call is identified by its content, not by names: the function's module and qualified
name, every argument (tensors, arrays and models by the bytes of their values), the bytes of
every nopelib source file, and the torch, numpy and pandas versions. Editing any nopelib module
or passing any other value therefore computes afresh; nothing is ever looked up by a name that
could point at a stale result.

Rerunning a chapter (a papermill rerun with a changed plot, or nbval after a book build) then
costs the cells that draw, not the studies. Results live under the run cache's folder
(``nopelib.train.resolve_cache_dir()``, then ``results``) and are written to a temporary file
that is renamed into place, so an interrupted computation leaves nothing a later call reads.
Set ``NOPELIB_MEMO=0`` to compute every call afresh without reading or writing the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch

from nopelib.train import resolve_cache_dir

MEMO_ENV = "NOPELIB_MEMO"
_PACKAGE_DIR = Path(__file__).resolve().parent
R = TypeVar("R")


def package_hash() -> str:
    """SHA-256 of the bytes of every nopelib source file."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE_DIR.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _feed(h: "hashlib._Hash", obj: Any, where: str) -> None:
    """Add an unambiguous encoding of ``obj`` to ``h``; ``where`` names it in errors."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        for i, item in enumerate(obj):
            _feed(h, item, f"{where}[{i}]")
        h.update(b")")
    elif isinstance(obj, Mapping):
        h.update(f"map[{len(obj)}](".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key, f"{where} key")
            _feed(h, obj[key], f"{where}[{key!r}]")
        h.update(b")")
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"array:{obj.dtype.str}:{obj.shape};".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item(), where)
    elif isinstance(obj, torch.nn.Module):
        h.update(f"module:{type(obj).__module__}.{type(obj).__qualname__}:training={obj.training};".encode())
        if dataclasses.is_dataclass(getattr(obj, "config", None)):
            _feed(h, obj.config, f"{where}.config")
        _feed(h, dict(obj.state_dict()), f"{where}.state_dict()")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"dataclass:{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _feed(h, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)
    else:
        raise TypeError(f"{where} has type {type(obj).__name__}, which memo cannot fingerprint; allowed: "
                        "None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays, torch tensors, "
                        "torch modules, dataclasses")


def call_key(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """The content hash that identifies ``fn(*args, **kwargs)`` (see the module docstring)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    if "<lambda>" in name or "<locals>" in name:
        raise ValueError(f"fn={name!r} must be a module-level function: a lambda or local function "
                         "has no stable identity to cache under")
    h = hashlib.sha256()
    h.update(f"{name};{package_hash()};torch {torch.__version__};numpy {np.__version__};"
             f"pandas {pd.__version__};".encode())
    _feed(h, list(args), "args")
    _feed(h, kwargs, "kwargs")
    return h.hexdigest()[:40]


def memo(fn: Callable[..., R], *args: Any, cache_dir: str | Path | None = None, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, from the results cache when this exact call has been computed."""
    if os.environ.get(MEMO_ENV, "1") == "0":
        return fn(*args, **kwargs)
    key = call_key(fn, args, kwargs)
    folder = resolve_cache_dir(cache_dir) / "results"
    path = folder / f"{key}.pkl"
    if path.is_file():
        with path.open("rb") as f:
            return pickle.load(f)
    result = fn(*args, **kwargs)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{key}-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # the commit point
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return result
