"""A results cache for the chapters' expensive, deterministic studies.

``memo(fn, *args, **kwargs)`` returns ``fn(*args, **kwargs)``, computed once and then read from
disk. A call is identified by its content, not by names: the function's module, qualified name
and source (so a notebook's function that is edited computes afresh), the instance a bound
method is bound to, every argument (tensors, arrays and models by the bytes of their values,
numpy scalars with their dtype), the nopelib code it depends on (``code_hash``: the modules the
function's module and the nopelib objects it was fed import, each by its syntax, through
``nopelib.store.sources``), and the torch, numpy and pandas versions (``memo_key`` computes it). A function defined in a
notebook (``__main__``, or any module that ``import`` cannot find) is keyed as well by what it reads
that its source does not show: the values of the globals its code loads, of its defaults and of its
free variables. A notebook function among those counts by the same rule, recursively; modules, and
the functions and classes of importable modules, count by name (their source, or the code hash,
covers them); builtins are skipped. A function of an importable module is keyed by its source, not
by its module's globals (nopelib's are in the code hash). Whatever memo cannot fingerprint (an
argument, a bound instance, a global) is a TypeError naming it: a call that memo cannot key is
refused rather than served a stale result.

Rerunning a chapter (a papermill rerun with a changed plot, or nbval after a book build) then
costs the cells that draw, not the studies. Results live under ``<cache>/results`` (see
``nopelib.store.cache``), one ``<key>.npz`` per call: numpy's zip of plain numeric arrays plus a
JSON document (``__meta__``) that records the key, a typed encoding of the value, and a SHA-256 of
the whole entry (every array's name, dtype, shape and bytes, and the document itself, all but that
checksum field), verified on every read. No pickle is involved: reading an entry cannot run code.
The value types are those the chapters' studies return: None, bool, int, float, str, list, tuple,
dict, numpy arrays and scalars of bool/int/float dtype, and pandas DataFrames with a default index
whose columns are numeric, bool or all-str; anything else is a TypeError when the result is stored.

Reading cannot hang or exhaust memory, and a planted zip bomb is refused within seconds and
with far under 2 GiB allocated: only a regular file is opened (a symlink, FIFO or device at an
entry's path is moved aside unread); its zip directory must be at its end and list at most
``MAX_MEMBERS`` entries (checked before zipfile reads it); the file and its arrays' total
uncompressed size (from the zip directory, before anything is inflated) are bounded by
``MAX_ENTRY_BYTES`` (128 MiB: zipfile inflates that in a second or two), ``__meta__`` by
``MAX_META_BYTES``; each array's header must not claim more data than its member holds;
arrays are inflated in chunks straight into their buffers; and ``__meta__`` is read first, so
an entry recording another key is refused before any other array is decompressed. An entry
that cannot be read, is refused, records another key or checksum, is nested too deeply to
parse, or holds non-finite numbers is a miss: it is moved aside with one warning
(``nopelib.store.cache.quarantine``), recomputed and replaced. One this process may not read
(permission denied: another member's entry in a shared cache, not damage) is reported, not
moved aside, recomputed and replaced.

A cache that cannot take a new entry (not a folder, not writable, less than
``EXPECTED_ENTRY_BYTES`` plus a margin free: ``nopelib.store.cache.check_writable``) is found before
the call is computed: the call is computed and returned, not stored, with one warning naming
the folder and the reason, as a read-only cache is used for what it holds. The same holds for
a result holding non-finite numbers, too large or too deeply nested to read back, one larger
than the room left (checked again with its real size before writing), and a write that fails.
Staging files that killed writers left (``.tmp-*``, over a day old) are swept before a write.
Set ``NOPELIB_MEMO=0`` to compute every call afresh without reading or writing the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import struct
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from nopelib.store import cache
from nopelib.store.memo_key import call_key

MEMO_ENV = "NOPELIB_MEMO"
FORMAT = 2  # 2: the checksum covers the document as well as the arrays
# The most an entry may hold, as a file and as its arrays uncompressed: far above any study's
# result (they are kilobytes to megabytes), and a bound on what a planted file can make a
# reader allocate and inflate (zipfile inflates about 100 MB/s on a loaded core).
MAX_ENTRY_BYTES = 128 << 20
MAX_META_BYTES = 16 << 20  # the JSON document: the value's structure, strings and numbers
# Arrays in an entry (each numpy array or scalar of the result is one): zipfile builds an
# object of about 0.5 kB for every directory entry, so a planted directory is bounded too;
# under 65,535, so an entry never needs a zip64 directory
MAX_MEMBERS = 50_000
_DIRECTORY_ENTRY_BYTES = 128  # a directory entry: 46 bytes and a name ("a49999.npy"); room to spare
# Room asked for before a study is computed: its result is kilobytes to megabytes; the real
# size is checked again before the write
EXPECTED_ENTRY_BYTES = 16 << 20
R = TypeVar("R")
_READ_CHUNK = 16 << 20  # arrays are inflated this much at a time, straight into their buffer
_NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integer, float: no objects, no pickle


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
        self.arrays[name] = np.ascontiguousarray(arr).reshape(arr.shape)  # it makes 0-d arrays 1-d
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


def _entry_hash(doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of an entry: its document (all but the checksum field, as canonical JSON) and
    every array's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    h.update(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\0")
    for name in sorted(arrays):
        arr = arrays[name]
        h.update(f"{len(name)}:{name}:{arr.dtype.str}:{arr.shape}:{arr.nbytes};".encode())
        # the C-order bytes, without tobytes()'s copy of every array
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _encode(key: str, result: Any) -> tuple[bytes, str | None]:
    """The file for ``result`` under ``key``, and why it must not be stored (None: it may): a
    read would refuse it, or it holds non-finite numbers. An unstorable type raises TypeError."""
    enc = _Encoder()
    try:
        meta = {"format": FORMAT, "key": key, "value": enc.encode(result, "result")}
        meta["sha256"] = _entry_hash(meta, enc.arrays)
        meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    except RecursionError:
        return b"", "returned a value nested too deeply to store"
    if not enc.finite:
        return b"", "returned non-finite numbers"
    if len(enc.arrays) + 1 > MAX_MEMBERS:
        return b"", f"returned {len(enc.arrays):,} arrays, over the {MAX_MEMBERS:,} a read accepts"
    if meta_bytes.nbytes > MAX_META_BYTES:
        return b"", (f"returned a document of {meta_bytes.nbytes:,} bytes, over the "
                     f"{MAX_META_BYTES:,} a read accepts")
    buf = io.BytesIO()
    np.savez(buf, __meta__=meta_bytes, **enc.arrays)
    data = buf.getvalue()
    if len(data) > MAX_ENTRY_BYTES:
        return b"", (f"returned {len(data):,} bytes, over the {MAX_ENTRY_BYTES:,} limit a read "
                     "accepts")
    return data, None


def _check_directory(f: io.BufferedIOBase, size: int) -> None:
    """Refuse, before zipfile reads it, a zip directory that is not where memo writes it (at
    the end, no comment, no zip64 record) or that lists more than MAX_MEMBERS entries."""
    f.seek(max(size - 42, 0))
    tail = f.read(42)  # a zip64 locator (20 bytes) would precede the end record (22)
    end = tail[-22:]
    if len(end) < 22 or end[:4] != b"PK\x05\x06" or end[20:22] != b"\0\0":
        raise ValueError("it does not end with a zip directory record")
    if tail[:4] == b"PK\x06\x07":
        raise ValueError("it has a zip64 directory; memo writes none")
    entries, directory_bytes = struct.unpack("<HI", end[10:16])
    if entries > MAX_MEMBERS or directory_bytes > MAX_MEMBERS * _DIRECTORY_ENTRY_BYTES:
        raise ValueError(f"its zip directory lists {entries:,} entries in {directory_bytes:,} "
                         f"bytes, over the {MAX_MEMBERS:,} arrays allowed")


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The zip's arrays by name, refused before any is inflated if their uncompressed sizes (as
    the zip directory records them; a member never inflates past its recorded size) add up to
    more than ``MAX_ENTRY_BYTES``."""
    infos = zf.infolist()
    names = [info.filename for info in infos]
    if len(set(names)) != len(names) or not all(n.endswith(".npy") for n in names):
        raise ValueError(f"its members {names} are not distinct .npy arrays")
    total = sum(info.file_size for info in infos)
    if total > MAX_ENTRY_BYTES:
        raise ValueError(f"its arrays take {total:,} bytes uncompressed, over the {MAX_ENTRY_BYTES:,} limit")
    members = {n.removesuffix(".npy"): info for n, info in zip(names, infos)}
    if "__meta__" not in members:
        raise ValueError("it has no __meta__ document")
    if members["__meta__"].file_size > MAX_META_BYTES:
        raise ValueError(f"its __meta__ document takes {members['__meta__'].file_size:,} bytes, "
                         f"over the {MAX_META_BYTES:,} limit")
    return members


def _load_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One numeric array from its .npy member. Its header is checked first: a dtype other than
    bool/int/float (objects would unpickle) is refused, and so is a shape that claims more data
    than the member holds (np.load would allocate the claim before finding out)."""
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"{info.filename} has .npy format version {version}")
        if dtype.kind not in _NUMERIC_KINDS:
            raise ValueError(f"{info.filename} has dtype {dtype}; only bool, integer and float are read")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            raise ValueError(f"{info.filename} declares {nbytes:,} bytes but holds {info.file_size:,}")
        data = np.empty(nbytes, dtype=np.uint8)
        view, filled = memoryview(data), 0
        while filled < nbytes:  # in chunks: one readinto() would inflate a copy of it all first
            got = f.readinto(view[filled:filled + _READ_CHUNK])
            if not got:
                raise ValueError(f"{info.filename} is truncated")
            filled += got
    return data.view(dtype).reshape(shape, order="F" if fortran else "C")


def _read(path: Path, key: str) -> Any:
    """The value stored in ``path``; raises ValueError (or a read error) if it is unusable."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end: not opened
        raise ValueError(f"it is not a regular file ({stat.filemode(st.st_mode)})")
    # O_NOFOLLOW and O_NONBLOCK: a symlink or FIFO swapped in since lstat is refused, not waited on
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"it is not a regular file ({stat.filemode(st.st_mode)})")
        if st.st_size > MAX_ENTRY_BYTES:
            raise ValueError(f"it is {st.st_size:,} bytes, over the {MAX_ENTRY_BYTES:,} limit")
        _check_directory(f, st.st_size)
        with zipfile.ZipFile(f) as zf:
            members = _members(zf)
            # json.loads raises RecursionError on a document nested deeper than the stack
            meta = json.loads(_load_array(zf, members.pop("__meta__")).tobytes().decode())
            recorded = (meta.get("format"), meta.get("key")) if isinstance(meta, dict) else None
            if recorded != (FORMAT, key):
                raise ValueError(f"it records format and key {recorded}")
            arrays = {name: _load_array(zf, info) for name, info in members.items()}  # after the key
    if meta.get("sha256") != _entry_hash({k: v for k, v in meta.items() if k != "sha256"}, arrays):
        raise ValueError("its document or arrays do not match their recorded SHA-256")
    if any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays.values()):
        raise ValueError("it holds non-finite numbers")
    return _decode(meta["value"], arrays)


def memo(fn: Callable[..., R], *args: Any, cache_dir: str | Path | None = None, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, from the results cache when this exact call has been computed;
    computed and stored otherwise (returned unstored, with a warning, where the cache cannot
    take it: see the module docstring)."""
    if os.environ.get(MEMO_ENV, "1") == "0":
        return fn(*args, **kwargs)
    key = call_key(fn, args, kwargs)
    results = cache.resolve_cache_dir(cache_dir) / "results"
    path = results / f"{key}.npz"
    name = getattr(fn, "__qualname__", fn)
    if os.path.lexists(path):
        try:
            return _read(path, key)
        except PermissionError as exc:  # another member's entry: not damage, not moved aside
            warnings.warn(f"cache entry {path} cannot be read ({exc}); recomputing it",
                          cache.CacheWarning, stacklevel=2)
        except Exception as exc:  # noqa: BLE001  (whatever makes an entry unreadable, it is a miss)
            cache.quarantine(path, f"{type(exc).__name__}: {exc}")
    unstorable = _cannot_store(results, EXPECTED_ENTRY_BYTES)  # before the work, not after it
    if unstorable:
        warnings.warn(f"{name}: {unstorable}; the result is computed but not cached",
                      cache.CacheWarning, stacklevel=2)
        return fn(*args, **kwargs)
    cache.sweep_stale(results)
    result = fn(*args, **kwargs)
    data, unstorable = _encode(key, result)  # before writing: an unstorable type raises here
    unstorable = unstorable or _cannot_store(results, len(data))
    if not unstorable:
        try:
            cache.commit_file(path, data)
        except OSError as exc:  # the disk filled meanwhile, say: the result is not lost
            unstorable = f"could not be written to {path} ({exc})"
    if unstorable:
        warnings.warn(f"{name}: {unstorable}; the result is not cached", cache.CacheWarning,
                      stacklevel=2)
    return result


def is_cached(fn: Callable[..., Any], *args: Any, cache_dir: str | Path | None = None,
              **kwargs: Any) -> bool:
    """Whether the results cache holds an entry for this exact call (not read or verified: a
    damaged one is still recomputed by ``memo``); for estimating what a call will cost."""
    if os.environ.get(MEMO_ENV, "1") == "0":
        return False
    key = call_key(fn, args, kwargs)
    return os.path.lexists(cache.resolve_cache_dir(cache_dir) / "results" / f"{key}.npz")


def _cannot_store(results: Path, need_bytes: int) -> str | None:
    """Why the results folder cannot take an entry of ``need_bytes``, or None."""
    try:
        cache.check_writable(results, need_bytes)
    except OSError as exc:
        return f"{exc}, or set {MEMO_ENV}=0 to turn the results cache off"
    return None
