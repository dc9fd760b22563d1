"""A results cache for the chapters' expensive, deterministic studies.

``memo(fn, *args, **kwargs)`` returns ``fn(*args, **kwargs)``, computed once and then read from
disk. A call is identified by its content, not by names: the function's module, qualified name
and source (so a notebook's function that is edited computes afresh), every argument (tensors,
arrays and models by the bytes of their values), the bytes of every nopelib source file, and the
torch, numpy and pandas versions. Editing any nopelib module or passing any other value
therefore computes afresh; nothing is ever looked up by a name that could point at a stale
result.

Rerunning a chapter (a papermill rerun with a changed plot, or nbval after a book build) then
costs the cells that draw, not the studies. Results live under ``<cache>/results`` (see
``nopelib.cache``), one ``<key>.npz`` per call: numpy's zip of plain numeric arrays plus a JSON
document (``__meta__``) that records the key, a SHA-256 of the arrays and a typed encoding of
the value. No pickle is involved: reading an entry cannot run code. The value types are those
the chapters' studies return: None, bool, int, float, str, list, tuple, dict, numpy arrays and
scalars of bool/int/float dtype, and pandas DataFrames with a default index whose columns are
numeric, bool or all-str; anything else is a TypeError when the result is stored.

An entry that cannot be read, records another key or checksum, or holds non-finite numbers is a
miss: it is moved aside with one warning (``nopelib.cache.quarantine``), recomputed and
replaced. A result holding non-finite numbers is returned but not stored, with a warning.
Set ``NOPELIB_MEMO=0`` to compute every call afresh without reading or writing the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import io
import json
import math
import os
import types
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch

from nopelib import cache

MEMO_ENV = "NOPELIB_MEMO"
FORMAT = 1
_PACKAGE_DIR = cache.PACKAGE_DIR
_NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integer, float: no objects, no pickle
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


def _code_fingerprint(code: types.CodeType) -> str:
    """The code object's instructions, names and constants, without file names or line numbers
    (which change every time a notebook cell runs)."""
    consts = [_code_fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{code.co_varnames}|{consts}"


def function_fingerprint(fn: Callable[..., Any]) -> str:
    """What ``fn`` does, as text: its source where Python can find it (modules, notebook cells),
    else its bytecode. Part of the key, so that editing a function defined in a notebook
    (``__main__``, outside the hashed package) computes afresh."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return _code_fingerprint(code) if code is not None else repr(fn)


def call_key(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """The content hash that identifies ``fn(*args, **kwargs)`` (see the module docstring)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    if "<lambda>" in name or "<locals>" in name:
        raise ValueError(f"fn={name!r} must be a module-level function: a lambda or local function "
                         "has no stable identity to cache under")
    h = hashlib.sha256()
    h.update(f"{name};{package_hash()};torch {torch.__version__};numpy {np.__version__};"
             f"pandas {pd.__version__};".encode())
    h.update(function_fingerprint(fn).encode() + b"\0")
    _feed(h, list(args), "args")
    _feed(h, kwargs, "kwargs")
    return h.hexdigest()[:40]


class _Encoder:
    """Turns a value into JSON plus named numeric arrays; raises TypeError on anything else."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.finite = True  # False once a non-finite float is seen: such results are not stored

    def array(self, arr: np.ndarray, where: str) -> str:
        if arr.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"{where}: arrays of dtype {arr.dtype} cannot be stored; allowed: "
                            "bool, integer and float dtypes")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            self.finite = False
        name = f"a{len(self.arrays)}"
        self.arrays[name] = np.ascontiguousarray(arr)
        return name

    def encode(self, obj: Any, where: str) -> Any:
        if isinstance(obj, float) and not math.isfinite(obj):
            self.finite = False
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj  # JSON keeps int and float apart (1 and 1.0)
        if isinstance(obj, (list, tuple)):
            items = [self.encode(x, f"{where}[{i}]") for i, x in enumerate(obj)]
            return {"list" if isinstance(obj, list) else "tuple": items}
        if isinstance(obj, dict):
            return {"dict": [[self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                             for k, v in obj.items()]}
        if isinstance(obj, np.ndarray):
            return {"ndarray": self.array(obj, where)}
        if isinstance(obj, np.generic):
            return {"scalar": self.array(np.asarray(obj), where)}
        if isinstance(obj, pd.DataFrame):
            return {"dataframe": self.frame(obj, where)}
        raise TypeError(f"{where} has type {type(obj).__name__}, which the results cache cannot "
                        "store; allowed: None, bool, int, float, str, list, tuple, dict, numpy "
                        "arrays and scalars, pandas DataFrames")

    def frame(self, df: pd.DataFrame, where: str) -> dict:
        if not (isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1):
            raise TypeError(f"{where}: only DataFrames with the default index 0..n-1 can be stored")
        columns = []
        for i, name in enumerate(df.columns):
            if not isinstance(name, (str, int)):
                raise TypeError(f"{where}: column name {name!r} must be a str or an int")
            col = df.iloc[:, i]
            if (col.dtype == object or pd.api.types.is_string_dtype(col.dtype)) and all(
                    isinstance(v, str) for v in col):
                columns.append([name, {"str": col.tolist()}])
            else:
                ref = self.array(col.to_numpy(), f"{where}[{name!r}]")
                columns.append([name, {"ndarray": ref}])
        return {"n": len(df), "columns": columns}


def _decode(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of ``_Encoder.encode``; a malformed document raises (and is a miss)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError("it holds non-finite numbers")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    (tag, body), = obj.items()
    if tag in ("list", "tuple"):
        items = [_decode(x, arrays) for x in body]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        return {_decode(k, arrays): _decode(v, arrays) for k, v in body}
    if tag == "ndarray":
        return arrays[body]
    if tag == "scalar":
        return arrays[body][()]
    if tag == "dataframe":
        data = {name: (col["str"] if "str" in col else arrays[col["ndarray"]])
                for name, col in body["columns"]}
        df = pd.DataFrame(data, index=pd.RangeIndex(body["n"]))
        if list(df.columns) != [name for name, _ in body["columns"]]:
            raise ValueError("duplicate column names")
        return df
    raise ValueError(f"unknown tag {tag!r}")


def _arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = arrays[name]
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode() + arr.tobytes())
    return h.hexdigest()


def _encode(key: str, result: Any) -> tuple[bytes, bool]:
    """The file for ``result`` under ``key`` and whether all of its numbers are finite."""
    enc = _Encoder()
    value = enc.encode(result, "result")
    meta = {"format": FORMAT, "key": key, "sha256": _arrays_hash(enc.arrays), "value": value}
    buf = io.BytesIO()
    meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buf, __meta__=meta_bytes, **enc.arrays)
    return buf.getvalue(), enc.finite


def _read(path: Path, key: str) -> Any:
    """The value stored in ``path``; raises ValueError (or a read error) if it is unusable."""
    with np.load(path, allow_pickle=False) as npz:  # allow_pickle=False: object arrays refuse
        arrays = {name: npz[name] for name in npz.files}
    meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    if meta.get("format") != FORMAT or meta.get("key") != key:
        raise ValueError(f"it records format {meta.get('format')!r}, key {meta.get('key')!r}")
    if meta.get("sha256") != _arrays_hash(arrays):
        raise ValueError("its arrays do not match their recorded SHA-256")
    if any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays.values()):
        raise ValueError("it holds non-finite numbers")
    return _decode(meta["value"], arrays)


def memo(fn: Callable[..., R], *args: Any, cache_dir: str | Path | None = None, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, from the results cache when this exact call has been computed."""
    if os.environ.get(MEMO_ENV, "1") == "0":
        return fn(*args, **kwargs)
    key = call_key(fn, args, kwargs)
    path = cache.resolve_cache_dir(cache_dir) / "results" / f"{key}.npz"
    if os.path.lexists(path):
        try:
            return _read(path, key)
        except Exception as exc:  # noqa: BLE001  (whatever makes an entry unreadable, it is a miss)
            cache.quarantine(path, f"{type(exc).__name__}: {exc}")
    result = fn(*args, **kwargs)
    data, finite = _encode(key, result)  # before writing: an unstorable type raises here
    if not finite:
        warnings.warn(f"{getattr(fn, '__qualname__', fn)} returned non-finite numbers; the result "
                      "is not cached", cache.CacheWarning, stacklevel=2)
        return result
    cache.commit_file(path, data)
    return result
