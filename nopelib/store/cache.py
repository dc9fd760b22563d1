"""Where nopelib's caches live, and how their entries are committed and checked.

Two caches share this module: the run cache (``nopelib.training.train``: trained weights and
metrics) and the results cache (``nopelib.store.memo``: the chapters' studies). Both follow the same
rules, because a cache that can return a wrong answer is worse than none:

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

import hashlib
import os
import shutil
import stat
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

CACHE_ENV = "NOPELIB_CACHE_DIR"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # nopelib/, above this wing
STALE_SECONDS = 24 * 3600  # a .tmp-* staging entry older than this belongs to a dead writer
# free space left over on top of what the work will write: a disk filled to its last byte
# fails whatever else writes to it
FREE_MARGIN_BYTES = 64 * 2**20


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


READ_CHUNK = 64 * 2**20  # read_bytes reads this much at a time


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (``open_regular``), read in
    chunks: ``f.read(max_bytes + 1)`` allocates its whole buffer first, 64 GiB for a
    checkpoint read without its shapes, and two writers of one checkpoint step then died of a
    MemoryError."""
    chunks, total = [], 0
    with open_regular(path, max_bytes) as f:
        while chunk := f.read(min(READ_CHUNK, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # grew after the check
                raise OSError(f"{path} holds more than the {max_bytes:,} bytes allowed")
    return b"".join(chunks)


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
