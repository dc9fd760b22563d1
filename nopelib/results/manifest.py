"""The digests of committed result files: a file edited after its command wrote it is refused.

The schemas refuse a value out of its range, but not a plausible edit (an accuracy of 0.99
turned into 0.5 by hand, a run key altered): those would reach the tables and the verdicts. So
each folder of results holds ``MANIFEST.json``, the SHA-256 of every result file's bytes as the
command that wrote it left them. ``results.write`` records a file's digest under the folder's
lock as it writes the file; ``results.load`` refuses a file of the committed folder (or of any
folder that holds a manifest) whose bytes do not match its entry, or that has none, naming the
file and how to go on: re-run the command that writes it, or, for a file a study command wrote
without recording it (the campaign's runs train from clones of older commits, which write into
this checkout's ``book/results`` with their own ``results.write``), check and sign it with
``python -m nopelib.results.files --sign FILE ...``, which validates the file against its
schema first and refuses to sign an invalid one. The manifest's name starts with no result
kind, so ``results.load_all`` never reads it as a result.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nopelib.store import cache
from nopelib.results.schema import ResultsError

MANIFEST_NAME = "MANIFEST.json"
SIGN_COMMAND = "python -m nopelib.results.files --sign"
ABOUT = ("SHA-256 of each result file's bytes, as the command that wrote it left them: written "
         f"by results.write and by '{SIGN_COMMAND} FILE ...' (which validates the file first); "
         "results.load refuses a file whose bytes do not match")
MAX_MANIFEST_BYTES = 2**20  # a line per result file


def digest(data: bytes) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def manifest_path(folder: Path) -> Path:
    """The manifest of the results in ``folder``."""
    return folder / MANIFEST_NAME


def read_manifest(folder: Path) -> dict[str, str]:
    """File name -> SHA-256 of the results in ``folder`` ({} without a manifest); a
    ResultsError naming the manifest when it cannot be read as one."""
    path = manifest_path(folder)
    if not path.exists():
        return {}
    try:
        doc = json.loads(cache.read_bytes(path, MAX_MANIFEST_BYTES))
        files = doc["sha256"]
        if not (isinstance(files, dict) and all(
                isinstance(k, str) and isinstance(v, str) and len(v) == 64
                for k, v in files.items())):
            raise ValueError("sha256 must map file names to 64 hex digits")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path}: cannot be read as the results' manifest ({exc}); restore "
                           "it from git, or sign every file again with "
                           f"'{SIGN_COMMAND} {path.parent}/*_*.json'") from None
    return files


def record(path: Path, data: bytes) -> None:
    """Record ``data`` (the bytes just written to ``path``) as the file's digest in its
    folder's manifest. The caller holds the folder's lock (``results.locked``): writers of
    one folder take turns, so no entry another wrote is lost."""
    files = read_manifest(path.parent)
    files[path.name] = digest(data)
    doc = {"about": ABOUT, "sha256": dict(sorted(files.items()))}
    cache.commit_file(manifest_path(path.parent), (json.dumps(doc, indent=1) + "\n").encode())


def check(path: Path, data: bytes) -> None:
    """Refuse ``data``, the bytes read from ``path``, unless its folder's manifest records
    them: one line naming the file, what differs, and how to go on."""
    want = read_manifest(path.parent).get(path.name)
    how = (f"re-run the command that writes it, or, for a file a study command wrote (e.g. a "
           f"clone of an older commit), check and sign it: {SIGN_COMMAND} {path}")
    if want is None:
        raise ResultsError(f"{path}: {manifest_path(path.parent)} has no digest of it, so "
                           f"nothing says a command wrote it as it stands; {how}")
    if digest(data) != want:
        raise ResultsError(f"{path}: its bytes have SHA-256 {digest(data)[:16]}..., not the "
                           f"{want[:16]}... that {MANIFEST_NAME} records: it changed after the "
                           f"command that wrote it; {how}")
