"""Where nopelib's caches live, how their keys see the source, and how entries are committed.

Two caches share this module: the run cache (``nopelib.train``: trained weights and metrics)
and the results cache (``nopelib.memo``: the chapters' studies). Both follow the same rules,
because a cache that can return a wrong answer is worse than none:

- an entry is written to a temporary name and renamed into place, so an interrupted writer
  leaves nothing that a reader takes for a result (``commit_file``, ``commit_dir``);
- an entry that cannot be read, whose recorded key or checksum disagrees, or that holds
  non-finite numbers is a miss: ``quarantine`` moves it aside with one warning naming it, and
  the caller recomputes and replaces it;
- entries are created with the permissions the umask allows (not 0700/0600, whatever the
  writer: safetensors, like mkstemp, writes 0600), so a group can share one cache folder;
- before work that will write an entry, the cache is checked: a folder, writable, with room
  for what that work will write (``check_writable``, sized by the caller).

Importing this module also points numba's on-disk cache at ``<cache>/numba`` (unless
``NUMBA_CACHE_DIR`` is already set), so compiled kernels are never written into the package.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import stat
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CACHE_ENV = "NOPELIB_CACHE_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent
STALE_SECONDS = 24 * 3600  # a .tmp-* staging entry older than this belongs to a dead writer
# free space left over on top of what the work will write: a disk filled to its last byte
# fails whatever else writes to it
FREE_MARGIN_BYTES = 64 * 2**20
# A source file modified this recently is read afresh on every call, not served from the
# per-process cache: file times tick in jiffies, so an edit within the tick that stamped the
# cached copy would otherwise go unseen (git's "racy" files)
RACY_SECONDS = 2.0


class CacheWarning(UserWarning):
    """A cache entry was unusable (moved aside, recomputed), could not be read, or could not be
    stored; the work goes on without it."""


def resolve_cache_dir(override: str | Path | None = None) -> Path:
    """Where caches live: ``override``, else $NOPELIB_CACHE_DIR, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache, then ``nopelib``)."""
    if override is not None:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nopelib"


@dataclass(frozen=True)
class _Source:
    stamp: tuple[int, ...]  # (inode, size, mtime_ns, ctime_ns): any edit changes one of them
    data: bytes
    imports: tuple[str, ...]  # the nopelib files it imports (``import_closure``)


_SOURCES: dict[Path, _Source] = {}  # per process: parsing a source's AST costs milliseconds


def _source(path: Path) -> _Source | None:
    """The bytes and nopelib imports of the source file ``path`` (None: not a file), read once
    per process and again whenever the file's stat changes."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    known = _SOURCES.get(path)
    if known is not None and known.stamp == stamp:
        return known
    data = path.read_bytes()
    imports: list[str] = []
    for node in ast.walk(ast.parse(data)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "nopelib":  # from nopelib import a, b
                imports += [f"{alias.name}.py" for alias in node.names]
            elif node.module.startswith("nopelib."):
                imports.append(node.module.split(".")[1] + ".py")
        elif isinstance(node, ast.Import):
            imports += [a.name.split(".")[1] + ".py" for a in node.names
                        if a.name.startswith("nopelib.")]
    source = _Source(stamp, data, tuple(imports))
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_SECONDS * 1e9:
        _SOURCES[path] = source
    return source


def source_hash(names: Iterable[str] | None = None, package_dir: Path | None = None) -> str:
    """SHA-256 of the bytes of the named source files of ``package_dir`` (nopelib's when None;
    every ``*.py`` when ``names`` is None), so that editing the code that produced an entry
    invalidates it. Each file is read once per process and again once it is edited."""
    folder = PACKAGE_DIR if package_dir is None else package_dir
    paths = sorted(folder.glob("*.py")) if names is None else [folder / n for n in names]
    h = hashlib.sha256()
    for path in paths:
        source = _source(path)
        if source is None:
            raise FileNotFoundError(f"source file {path} is missing")
        h.update(path.name.encode() + b"\0" + source.data + b"\0")
    return h.hexdigest()


def import_closure(entry_points: Iterable[str]) -> tuple[str, ...]:
    """The nopelib source files that ``entry_points`` (file names in the package) import,
    directly or through each other, themselves included: read from every ``import`` statement
    of the code (inside functions too), so no hand-kept list can fall behind the code."""
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        name = todo.pop()
        source = None if name in seen else _source(PACKAGE_DIR / name)
        if source is None:
            continue
        seen.add(name)
        todo += source.imports
    return tuple(sorted(seen))


def open_regular(path: Path, max_bytes: int) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (not a link, FIFO or device) of at
    most ``max_bytes``; raises OSError naming the problem otherwise. Checked on the open file
    (no link followed, no blocking open), since reading a FIFO or /dev/zero planted in a shared
    cache never ends and a file swapped in after a check would slip past it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(f"{path} is not a regular file (a link)") from None
        raise exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    if info.st_size > max_bytes:
        os.close(fd)
        raise OSError(f"{path} holds {info.st_size:,} bytes, more than the {max_bytes:,} allowed")
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (``open_regular``)."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew after the check
        raise OSError(f"{path} holds more than the {max_bytes:,} bytes allowed")
    return data


def check_writable(root: Path, need_bytes: int) -> None:
    """Refuse, before any work that will write under ``root``, a cache that cannot take it: a
    path that is not a directory, one this process cannot create or write to, or a disk with
    less than ``need_bytes`` (what the work will write, sized by the caller) plus
    FREE_MARGIN_BYTES free. The error names the path, the reason and the cache variable."""
    if type(need_bytes) is not int or need_bytes < 0:
        raise ValueError(f"need_bytes={need_bytes!r} must be a non-negative integer")
    hint = f"(set {CACHE_ENV} to a writable folder)"
    if os.path.lexists(root) and not root.is_dir():
        raise OSError(f"cache folder {root} exists and is not a directory {hint}")
    try:
        make_dirs(root)
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OSError(f"cache folder {root} is not writable: {exc} {hint}") from None
    free = shutil.disk_usage(root).free
    if free < need_bytes + FREE_MARGIN_BYTES:
        raise OSError(f"cache folder {root} has {free / 2**20:,.0f} MiB free, less than the "
                      f"{need_bytes / 2**20:,.0f} MiB this work will write plus a "
                      f"{FREE_MARGIN_BYTES / 2**20:.0f} MiB margin {hint}")


def sweep_stale(parent: Path, age_seconds: float = STALE_SECONDS) -> None:
    """Remove the ``.tmp-*`` staging entries under ``parent`` older than ``age_seconds``: what
    writers killed mid-commit left (a live writer's is younger)."""
    if not parent.is_dir():
        return
    cutoff = time.time() - age_seconds
    for path in parent.glob(".tmp-*"):
        try:
            if os.lstat(path).st_mtime >= cutoff:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()
        except OSError:
            continue  # gone already, or not ours to remove


def file_sha256(path: Path, max_bytes: int = 2**34) -> str:
    """SHA-256 of a regular file's bytes, read in chunks (weights files can be large)."""
    h = hashlib.sha256()
    with open_regular(path, max_bytes) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _share(path: Path, mask: int | None = None) -> None:
    """Give ``path`` the mode a plain mkdir/open would (mkdtemp/mkstemp create 0700/0600)."""
    mask = _umask() if mask is None else mask
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _share_tree(folder: Path) -> None:
    """``_share`` a staged folder and everything in it, whoever wrote the files (safetensors
    writes 0600, which another member of the group could not read)."""
    mask = _umask()
    _share(folder, mask)
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            if not os.path.islink(os.path.join(parent, name)):
                _share(Path(parent, name), mask)


def make_dirs(path: Path) -> Path:
    """``mkdir -p`` with the umask's permissions."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def commit_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, renamed."""
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _share(Path(tmp))
        os.replace(tmp, path)  # the commit point
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def staging_dir(parent: Path, name: str) -> Path:
    """A fresh temporary folder next to its final place ``parent / name``, for ``commit_dir``."""
    make_dirs(parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent))
    _share(tmp)
    return tmp


def commit_dir(tmp: Path, final: Path, is_valid: Callable[[Path], bool]) -> None:
    """Rename the filled folder ``tmp`` to ``final`` (the commit point).

    A ``final`` that exists and passes ``is_valid`` was committed by a concurrent writer of the
    same entry: ours is dropped. One that fails it is quarantined and replaced. Every file in
    ``tmp`` is given the umask's permissions first.
    """
    try:
        _share_tree(tmp)
        for _ in range(3):
            try:
                os.replace(tmp, final)
                return
            except OSError:
                if not final.exists():
                    raise
                if is_valid(final):
                    return
                quarantine(final, "it is incomplete or invalid")
        raise OSError(f"could not commit {final}: it keeps reappearing invalid")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def quarantine(path: Path, reason: str) -> None:
    """Move an unusable entry aside (to ``<cache>/.../.bad-<name>-<id>``) with one warning.

    Moved, not deleted, so that whoever wonders why a result was recomputed can look at it; the
    ``.bad-`` prefix keeps it out of every lookup.
    """
    if not os.path.lexists(path):
        return
    aside = path.with_name(f".bad-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        if os.path.lexists(path):  # not moved by a concurrent reader: a read-only cache
            warnings.warn(f"cache entry {path} is unusable ({reason}) and could not be moved "
                          f"aside ({exc}); it is ignored, as if absent", CacheWarning,
                          stacklevel=3)
        return
    warnings.warn(f"cache entry {path} is unusable ({reason}); moved to {aside.name} and "
                  "recomputing", CacheWarning, stacklevel=3)


os.environ.setdefault("NUMBA_CACHE_DIR", str(resolve_cache_dir() / "numba"))
