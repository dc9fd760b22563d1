"""The committed result files under ``book/results``: their provenance, writer and loader.

A study that runs by hand (``nopelib.studies.trained_study``, ``nopelib.studies.recipe``,
``nopelib.studies.grid``) commits a small JSON file with its provenance; the chapters draw from it.
A file edited by hand, or broken by a merge, must not turn into a wrong verdict (a NaN accuracy that
flips "learned", a negative tail that drops a task, a run copied under another seed that counts as
one more model), nor fail after a chapter's 20 minutes of training with a bare ``KeyError``.
So every file is read through ``load``: its kind comes from its name (``trained_*``,
``recipe_*``, ``grid_*``, ``long_*``, ``kernels_*``, ``precision_*``, ``early_*``,
``text_*``), it is checked against that kind's schema, and any problem raises ResultsError
naming the file, the field, the value and what is allowed. A schema covers every field a chapter, the scorecard or a
command reads: types, ranges and finiteness, enumerations (tasks, profiles, position encodings,
precisions, probe feature sets, backends), lists of one length, layer lists complete over the
model's layers and alike in every run, each run's identity once (no seed twice, none but the
profile's seeds, no run copied under another seed number), and the numbers a writer
derives from others (a run's tail and the step it was learned from, the precision check's gaps)
equal to what they derive from. A file nested deeper than any schema reaches is refused before
it is read further. The folder is found from the package, not the working directory, so a
papermill run from anywhere finds the committed studies. ``check_all`` reads every file; the
trained chapter calls it when it starts, before any training. A study writes its file through
``write``, which validates it the same way and commits it atomically, with the ``provenance``
every study records (command, commit, machine, torch, wall time, date), under the file's lock
with the file re-read (two invocations writing one study merge their runs, and
``guard`` refuses a write that would replace a committed result not named), and records
the file's SHA-256 in the folder's manifest: a committed file edited by hand afterwards is
refused by ``load``, even where every value stays in its range (``manifest``;
``python -m nopelib.results.files --sign FILE ...`` signs a valid file an older checkout
wrote). The schemas are
``schema``'s, the checks every kind shares ``checks``', and each kind's own checks
``run_kinds``' (recipe, grid, trained) and ``kinds``' (the others).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nopelib.store import cache
from nopelib.results import manifest
from nopelib.results.checks import check_depth, check_fields
from nopelib.results.kinds import (check_campaign, check_early, check_kernels,
                                          check_long, check_precision)
from nopelib.results.run_kinds import check_grid, check_recipe, check_trained
from nopelib.results.length_kind import check_length
from nopelib.results.text_kind import check_text
from nopelib.results.schema import (EXTRA_PROVENANCE, KINDS, MAX_BYTES, MAX_DEPTH,
                                           OPTIONAL_PROVENANCE, PROVENANCE, ResultsError,
                                           kind_of)


RESULTS_DIR = cache.PACKAGE_DIR.parent / "book" / "results"


_KIND_CHECKS: dict[str, Callable[[str, dict], None]] = {
    "recipe": check_recipe, "grid": check_grid, "trained": check_trained,
    "long": check_long, "kernels": check_kernels, "precision": check_precision,
    "early": check_early, "text": check_text, "campaign": check_campaign,
    "length": check_length,
}


def validate(doc: Any, kind: str, name: str = "result") -> dict:
    """``doc`` if it is a valid result of ``kind``; raises ResultsError naming ``name`` and
    the field otherwise."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {KINDS}")
    check_depth(name, doc)
    if not isinstance(doc, dict):
        raise ResultsError(f"{name}: the document must be an object with provenance and runs")
    check_fields(f"{name}: provenance", doc.get("provenance"),
                 {**PROVENANCE, **EXTRA_PROVENANCE[kind]}, OPTIONAL_PROVENANCE.get(kind))
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ResultsError(f"{name}: runs must be a non-empty list")
    _KIND_CHECKS[kind](name, doc)
    return doc


def _check_name(path: Path, doc: dict, kind: str) -> None:
    """A trained study's file is found by its profile and task
    (``trained_files.study_path``): its name must be theirs."""
    if kind == "trained":
        want = f"trained_{doc['provenance']['profile']}_{doc['runs'][0]['task']}.json"
        if path.name != want:
            raise ResultsError(f"{path}: it holds the {doc['provenance']['profile']} profile's "
                               f"{doc['runs'][0]['task']} runs: its name must be {want}")


def _object_of_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object, refusing a key given twice (json keeps the last one silently, and a
    merge can leave both)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        twice = next(k for k in keys if keys.count(k) > 1)
        raise ResultsError(f"the key {twice!r} appears twice in one object")
    return out


def parse_json(data: bytes | str, name: str) -> Any:
    """The JSON document ``data`` of the file ``name``; a one-line ResultsError naming the file
    when it is no JSON, gives a key twice, or is nested too deep for the parser."""
    try:
        return json.loads(data, object_pairs_hook=_object_of_pairs)
    except RecursionError:  # json's parser recurses once per level of nesting
        raise ResultsError(f"{name}: cannot be read as JSON: nested deeper than Python's "
                           f"recursion limit ({sys.getrecursionlimit()}); no result field is "
                           f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise ResultsError(f"{name}: cannot be read as JSON: {exc}") from None


def _read(path: Path) -> tuple[bytes, dict]:
    """A result file's bytes and its validated document (not yet checked against the
    manifest)."""
    kind = kind_of(path)
    try:
        data = cache.read_bytes(path, MAX_BYTES)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read as JSON: {exc}") from None
    doc = parse_json(data, str(path))
    validate(doc, kind, str(path))
    _check_name(path, doc, kind)
    return data, doc


def is_signed_folder(folder: Path) -> bool:
    """Whether the files of ``folder`` must match its manifest (``manifest``): the
    committed results, and any folder that holds a manifest."""
    return (folder.resolve() == Path(RESULTS_DIR).resolve()
            or manifest.manifest_path(folder).exists())


def load(path: str | Path) -> dict:
    """The validated document of one committed result file (a name is looked up in
    RESULTS_DIR); in a signed folder (``is_signed_folder``) its bytes must be those its
    manifest records."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = RESULTS_DIR / path.name
    data, doc = _read(path)
    if is_signed_folder(path.parent):
        manifest.check(path, data)
    return doc


def sign(path: Path) -> dict:
    """Record the digest of the result file ``path`` in its folder's manifest, once it is
    validated against its schema (a ResultsError, and nothing signed, otherwise): for a file
    a study command wrote without recording it, e.g. from a clone of an older commit."""
    with locked(path):
        data, doc = _read(path)
        manifest.record(path, data)
    return doc


def load_all(kind: str, folder: Path | None = None) -> dict[str, dict]:
    """Every committed result of ``kind`` (file name -> validated document), by name."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {KINDS}")
    folder = RESULTS_DIR if folder is None else folder
    return {p.name: load(p) for p in sorted(folder.glob(f"{kind}_*.json"))}


def check_all(folder: Path | None = None) -> list[str]:
    """Validate every committed JSON result (raises ResultsError on the first bad one); the
    names of the files read."""
    folder = RESULTS_DIR if folder is None else folder
    return [name for kind in KINDS for name in load_all(kind, folder)]


def git_commit() -> str:
    """The commit this package runs at, marked when nopelib has uncommitted changes."""
    root = cache.PACKAGE_DIR.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "nopelib"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + ("+uncommitted nopelib changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model as the OS names it ('AMD EPYC (x86_64)'): the first 'model name'
    of ``cpuinfo`` on Linux, else what ``platform`` knows. Two machines that print the same
    node name and core count can have other CPUs, and so other float kernels."""
    arch = platform.machine() or "unknown architecture"
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    names = [ln.split(":", 1)[1].strip() for ln in lines
             if ln.split(":", 1)[0].strip() == "model name" and ":" in ln]
    name = names[0] if names and names[0] else platform.processor()
    return f"{name} ({arch})" if name and name != arch else arch


def provenance(prog: str, argv: list[str] | None, start: float, **extra: Any) -> dict:
    """Where a hand-run study's numbers come from: the command, the git commit, the machine,
    the torch version, the wall time since ``start`` (a perf_counter reading), the date, and
    the study's own fields (``extra``)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none here"
    return {
        "command": f"{prog} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "machine": f"{platform.node()}: {cpu_name()}, "
                   f"{os.cpu_count()} cores, GPU: {gpu}",
        "torch": torch.__version__,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def page_provenance(**page: object) -> dict[str, object]:
    """What a built page's live numbers depend on: the commit, the build date, the torch and
    numpy versions, the CPU's kernel capability (float kernels differ between CPUs), the GPU,
    the threads, and the page's own settings (``page``: its profile, seeds, device)."""
    return {
        "commit": git_commit(),
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "CPU kernels": torch.backends.cpu.get_cpu_capability(),
        "GPU": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch threads": torch.get_num_threads(),
        **page,
    }


def dumps(doc: object, indent: str = "") -> str:
    """JSON with one key per line and every list of plain values (a score row, a trajectory
    column, a ``[length, layer, score]`` triple) on a line of its own: readable in a diff, and
    under half the size of ``json.dumps(indent=1)`` for the long study's score triples."""
    inner = indent + " "
    if isinstance(doc, dict) and doc:
        items = (f"{inner}{json.dumps(str(k))}: {dumps(v, inner)}" for k, v in doc.items())
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(doc, list) and any(isinstance(v, (dict, list)) for v in doc):
        return "[\n" + ",\n".join(inner + dumps(v, inner) for v in doc) + f"\n{indent}]"
    return json.dumps(doc)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the advisory lock of the result file ``path``: an exclusive ``flock`` on its folder
    (no lock file is left beside the results), so the writers of one file take turns and none
    writes over a run another wrote after it read the file. Writes are seconds: the writers
    of one folder's other files wait that long at most."""
    cache.make_dirs(path.parent)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the lock


def write(path: Path, doc: dict, kind: str,
          merge: Callable[[dict | None, dict], dict] | None = None) -> dict:
    """Validate a study's document as a result of ``kind``, then write it atomically (the
    chapters find a committed file by its name: ``<kind>_*.json``). Under the file's lock,
    ``merge`` is given the file's document as it stands at that moment (re-read and validated,
    None without a file: another invocation may have written it since this one read it) and
    ``doc``, and returns the document to write, or raises to refuse the write. Returns the
    document written."""
    with locked(path):
        if merge is not None:
            doc = merge(load(path) if path.exists() else None, doc)
        validate(doc, kind, str(path))
        _check_name(path, doc, kind)
        data = (dumps(doc) + "\n").encode()
        cache.commit_file(path, data)
        manifest.record(path, data)
    return doc


def main(argv: list[str] | None = None) -> None:
    """Check every committed result, or sign files (``--sign``): each validated first, and
    none signed when one is invalid (exit 2 naming it)."""
    parser = argparse.ArgumentParser(prog="python -m nopelib.results.files",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sign", nargs="+", type=Path, metavar="FILE", default=[],
                        help="validate each file and record its SHA-256 in its folder's "
                             f"{manifest.MANIFEST_NAME} (for a file a study command "
                             "wrote without recording it, e.g. from an older clone)")
    args = parser.parse_args(argv)
    for path in args.sign:
        try:
            _read(path)
        except ResultsError as exc:
            parser.error(f"{exc}: not signed (nothing was)")
    for path in args.sign:
        sign(path)
        print(f"signed {path}")
    if not args.sign:
        try:
            print(f"{len(check_all())} committed results are valid and signed")
        except ResultsError as exc:
            parser.exit(1, f"{exc}\n")


if __name__ == "__main__":
    main()
