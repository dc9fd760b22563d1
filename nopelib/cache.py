"""Where nopelib's caches live, how their keys see the source, and how entries are committed.

Two caches share this module: the run cache (``nopelib.train``: trained weights and metrics)
and the results cache (``nopelib.memo``: the chapters' studies). Both follow the same rules,
because a cache that can return a wrong answer is worse than none:

- an entry is written to a temporary name and renamed into place, so an interrupted writer
  leaves nothing that a reader takes for a result (``commit_file``, ``commit_dir``);
- an entry that cannot be read, whose recorded key or checksum disagrees, or that holds
  non-finite numbers is a miss: ``quarantine`` moves it aside with one warning naming it, and
  the caller recomputes and replaces it;
- entries are created with the permissions the umask allows (not 0700), so a group can share
  one cache folder.

Importing this module also points numba's on-disk cache at ``<cache>/numba`` (unless
``NUMBA_CACHE_DIR`` is already set), so compiled kernels are never written into the package.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

CACHE_ENV = "NOPELIB_CACHE_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent


class CacheWarning(UserWarning):
    """A cache entry was unusable and has been moved aside; it will be recomputed."""


def resolve_cache_dir(override: str | Path | None = None) -> Path:
    """Where caches live: ``override``, else $NOPELIB_CACHE_DIR, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache, then ``nopelib``)."""
    if override is not None:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nopelib"


def source_hash(names: Iterable[str] | None = None) -> str:
    """SHA-256 of the bytes of the named nopelib source files (every ``*.py`` when None), so
    that editing the code that produced an entry invalidates it."""
    paths = sorted(PACKAGE_DIR.glob("*.py")) if names is None else [PACKAGE_DIR / n for n in names]
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks (weights files can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _share(path: Path) -> None:
    """Give ``path`` the mode a plain mkdir/open would (mkdtemp/mkstemp create 0700/0600)."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


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
    same entry: ours is dropped. One that fails it is quarantined and replaced.
    """
    try:
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
    except OSError:
        return  # a concurrent reader moved it first
    warnings.warn(f"cache entry {path} is unusable ({reason}); moved to {aside.name} and "
                  "recomputing", CacheWarning, stacklevel=3)


os.environ.setdefault("NUMBA_CACHE_DIR", str(resolve_cache_dir() / "numba"))
