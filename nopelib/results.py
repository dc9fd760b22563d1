"""The committed result files under ``book/results``: their provenance, writer and loader.

A study that runs by hand (``nopelib.trained_study``, ``nopelib.recipe``, ``nopelib.grid``)
commits a small JSON file with its provenance; the chapters draw from it. A file edited by
hand, or broken by a merge, must not turn into a wrong verdict (a NaN accuracy that flips
"learned", a string printed as a number), nor fail after a chapter's 20 minutes of training
with a bare ``KeyError``. So every file is read through ``load``: its kind comes from its name
(``trained_*``, ``recipe_*``, ``grid_*``, ``long_*``, ``kernels_*``, ``precision_*``,
``early_*``), it is checked against that kind's schema (required fields, types, ranges,
finiteness, lists of one length) and any problem raises ResultsError naming the file and the
field. The folder is
found from the package, not the working directory, so a papermill run from anywhere finds the
committed studies. ``check_all`` reads every file; the trained chapter calls it when it
starts, before any training. A study writes its file through ``write``, which validates it the
same way and commits it atomically, with the ``provenance`` every study records (command,
commit, machine, torch, wall time, date).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nopelib import cache
from nopelib.profiles import TrainProfile
from nopelib.tasks import TASKS

RESULTS_DIR = cache.PACKAGE_DIR.parent / "book" / "results"
KINDS = ("recipe", "grid", "trained", "long", "kernels", "precision", "early")
MAX_BYTES = 64 * 2**20  # a committed result is kilobytes to a few megabytes


class ResultsError(ValueError):
    """A committed result file that does not match its schema; the message names the file and
    the field."""


Check = Callable[[Any], bool]


def _number(lo: float = -math.inf, hi: float = math.inf) -> Check:
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v) and lo <= v <= hi)


def _int(lo: int = 0) -> Check:
    return lambda v: type(v) is int and v >= lo


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _scores(v: Any) -> bool:  # adjacency scores of every layer, 0 = embeddings
    return isinstance(v, list) and len(v) >= 2 and all(_number(0.0, 1.0)(x) for x in v)


_COMMIT = re.compile(r"[0-9a-f]{40}(\+uncommitted nopelib changes)?|unknown")
PROVENANCE: dict[str, tuple[Check, str]] = {
    "command": (_text, "a non-empty string"),
    "commit": (lambda v: isinstance(v, str) and bool(_COMMIT.fullmatch(v)),
               "a 40-digit git commit"),
    "machine": (_text, "a non-empty string"),
    "torch": (_text, "a non-empty string"),
    "wall_seconds": (_number(0.0), "a finite number >= 0"),
    "date": (_text, "a non-empty string"),
}
EXTRA_PROVENANCE: dict[str, dict[str, tuple[Check, str]]] = {
    "recipe": {"profile": (_text, "a profile name"), "scale": (_int(1), "an integer >= 1"),
               "training": (lambda v: isinstance(v, dict), "the profile's fields")},
    "grid": {"grid": (_text, "a grid name"), "backend": (_text, "a backend name")},
    "trained": {"profile": (_text, "a profile name"),
                "training": (lambda v: isinstance(v, dict), "the profile's fields")},
    "long": {"T": (_int(16), "an integer >= 16"),
             "base": (lambda v: isinstance(v, dict), "the base model's GPTConfig fields")},
    "kernels": {"profile": (_text, "a profile name"),
                "sets": (lambda v: isinstance(v, dict) and bool(v) and all(
                    isinstance(e, dict) for e in v.values()),
                         "kernel set name -> its environment variables")},
    "early": {"profile": (_text, "a profile name"), "window": (_int(1), "an integer >= 1"),
              "every": (_int(1), "an integer >= 1"),
              "training": (lambda v: isinstance(v, dict), "the profile's fields")},
    "precision": {"profile": (_text, "a profile name"), "steps": (_int(1), "an integer >= 1"),
                  "rule": (_text, "the rule's text"),
                  "verdict": (lambda v: v in ("no change", "changes"),
                              "'no change' or 'changes'"),
                  "training": (lambda v: isinstance(v, dict), "the profile's fields")},
}
RUN: dict[str, tuple[Check, str]] = {
    "task": (lambda v: v in TASKS, f"one of {list(TASKS)}"),
    "seed": (_int(0), "an integer >= 0"),
    "accuracy": (_number(0.0, 1.0), "a number in [0, 1]"),
    "n_test": (_int(1), "an integer >= 1"),
    "train_seconds": (_number(0.0), "a finite number >= 0"),
}
EXTRA_RUN: dict[str, dict[str, tuple[Check, str]]] = {
    "recipe": {"steps": (_int(1), "an integer >= 1"),
               "pos_encoding": (_text, "a position encoding"),
               "curve": (lambda v: isinstance(v, dict), "an object with step and accuracy")},
    "grid": {"n_layer": (_int(1), "an integer >= 1"), "n_embd": (_int(1), "an integer >= 1"),
             "adjacency_before": (_scores, "a list of >= 2 scores in [0, 1]"),
             "adjacency_after": (_scores, "a list of >= 2 scores in [0, 1]")},
    "trained": {"steps": (_int(1), "an integer >= 1"),
                "scores_init": (_scores, "a list of >= 2 scores in [0, 1]"),
                "scores_after": (_scores, "a list of >= 2 scores in [0, 1]"),
                "trajectory": (lambda v: isinstance(v, dict),
                               "an object with step, accuracy and scores")},
    # one live run of the kernel check (nopelib.kernels) under one kernel set
    "kernels": {"set": (_text, "a kernel set name"),
                "capability": (_text, "torch's CPU capability"),
                "steps": (_int(1), "an integer >= 1"),
                "learned": (lambda v: isinstance(v, bool), "true or false"),
                "inside": (lambda v: isinstance(v, bool), "true or false"),
                "outside": (lambda v: isinstance(v, list) and all(_text(x) for x in v),
                            "a list of the quantities outside the study's interval"),
                "scores_after": (_scores, "a list of >= 2 scores in [0, 1]")},
    # one run of the precision check (nopelib.precision): its first steps in one precision
    "precision": {"precision": (lambda v: v in ("float32", "bfloat16"),
                                "'float32' or 'bfloat16'"),
                  "steps": (_int(1), "an integer >= 1"),
                  "step_ms": (_number(0.0), "a finite number >= 0"),
                  "curve": (lambda v: isinstance(v, dict) and {"step", "val_accuracy",
                                                               "scores"} <= set(v),
                            "an object with step, val_accuracy and scores")},
}


def _rows(width: int, lo: float = -math.inf, hi: float = math.inf) -> Check:
    """A non-empty list of rows of ``width`` finite numbers, the last in [lo, hi]."""
    return lambda v: (isinstance(v, list) and bool(v) and all(
        isinstance(r, list) and len(r) == width and all(_number()(x) for x in r)
        and lo <= r[-1] <= hi for r in v))


# a long-sequence run (nopelib.long_context.long_run) is no training run: its own fields
LONG_RUN: dict[str, tuple[Check, str]] = {
    "n_embd": (_int(1), "an integer >= 1"),
    "seed": (_int(0), "an integer >= 0"),
    "window": (lambda v: v is None or _int(1)(v), "null or an integer >= 1"),
    "scores": (_rows(3, 0.0, 1.0), "rows [length, layer, score in [0, 1]]"),
    "predicted_scores": (_rows(2, 0.0, 1.0), "rows [length, predicted score in [0, 1]]"),
    "order": (_rows(4, 0.0, 1.0), "rows [layer, octave, d, fraction in [0, 1]]"),
    "predicted_order": (_rows(3, 0.0, 1.0), "rows [octave, d, probability in [0, 1]]"),
}


# a run of the early-dynamics study (nopelib.early_study): its first steps, no test split
EARLY_RUN: dict[str, tuple[Check, str]] = {
    "task": (lambda v: v in TASKS, f"one of {list(TASKS)}"),
    "seed": (_int(0), "an integer >= 0"),
    "frozen": (lambda v: isinstance(v, list) and all(x in ("embedding", "qk") for x in v)
               and len(set(v)) == len(v), "a list of distinct parts: 'embedding', 'qk'"),
    "steps": (_int(1), "an integer >= 1"),
    "train_seconds": (_number(0.0), "a finite number >= 0"),
    "scores_init": (_scores, "a list of >= 2 scores in [0, 1]"),
    "measure_init": (lambda v: isinstance(v, dict) and bool(v)
                     and all(_number()(x) for x in v.values()),
                     "an object of finite numbers"),
    "curve": (lambda v: isinstance(v, dict), "an object of lists, one value per curve point"),
}
# the curve fields every early run records, besides scores (one list per point)
EARLY_CURVE = ("step", "accuracy", "lr", "rho", "value_common", "embedding_common", "entropy",
               "value_axis", "embedding_axis", "score_without_mlp", "predicted")


def _check_early(where: str, run: dict) -> None:
    curve, layers = run["curve"], len(run["scores_init"])
    missing = [k for k in (*EARLY_CURVE, "scores") if k not in curve]
    if missing:
        raise ResultsError(f"{where}.curve: {missing} missing")
    steps = curve["step"]
    if not (isinstance(steps, list) and steps and all(_int(1)(x) for x in steps)
            and steps == sorted(set(steps)) and steps[-1] == run["steps"]):
        raise ResultsError(f"{where}.curve.step: increasing positive steps ending at the "
                           "run's steps")
    for name in EARLY_CURVE:
        values = curve[name]
        if not (isinstance(values, list) and len(values) == len(steps)
                and all(_number()(x) for x in values)):
            raise ResultsError(f"{where}.curve.{name}: one finite number per curve step")
    bounded = ("accuracy", "value_common", "embedding_common", "value_axis",
               "embedding_axis", "score_without_mlp", "predicted")
    for name in bounded:
        if not all(0.0 <= x <= 1.0 for x in curve[name]):
            raise ResultsError(f"{where}.curve.{name}: values in [0, 1]")
    rows = curve["scores"]
    if not (isinstance(rows, list) and len(rows) == len(steps)
            and all(_scores(r) and len(r) == layers for r in rows)):
        raise ResultsError(f"{where}.curve.scores: one list of {layers} scores in [0, 1] per "
                           "curve step")


def kind_of(path: Path) -> str:
    """The kind of a result file, from its name (``recipe_*.json`` and so on)."""
    kind = path.name.split("_", 1)[0]
    if kind not in KINDS or "_" not in path.name:
        raise ResultsError(f"{path}: the name must start with one of "
                           f"{[k + '_' for k in KINDS]}")
    return kind


def _check_fields(where: str, doc: Any, schema: dict[str, tuple[Check, str]]) -> None:
    if not isinstance(doc, dict):
        raise ResultsError(f"{where} must be an object, not {type(doc).__name__}")
    for name, (ok, allowed) in schema.items():
        if name not in doc:
            raise ResultsError(f"{where}.{name} is missing")
        if not ok(doc[name]):
            raise ResultsError(f"{where}.{name} = {doc[name]!r}: must be {allowed}")


def validate(doc: Any, kind: str, name: str = "result") -> dict:
    """``doc`` if it is a valid result of ``kind``; raises ResultsError naming ``name`` and
    the field otherwise."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {KINDS}")
    if not isinstance(doc, dict):
        raise ResultsError(f"{name}: the document must be an object with provenance and runs")
    _check_fields(f"{name}: provenance", doc.get("provenance"),
                  {**PROVENANCE, **EXTRA_PROVENANCE[kind]})
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ResultsError(f"{name}: runs must be a non-empty list")
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        schema = (LONG_RUN if kind == "long" else EARLY_RUN if kind == "early"
                  else {**RUN, **EXTRA_RUN[kind]})
        _check_fields(where, run, schema)
        if kind == "early":
            _check_early(where, run)
        if kind == "recipe":
            curve = run["curve"]
            steps, acc = curve.get("step"), curve.get("accuracy")
            if not (isinstance(steps, list) and isinstance(acc, list) and steps
                    and len(steps) == len(acc) and all(_int(1)(s) for s in steps)
                    and all(_number(0.0, 1.0)(a) for a in acc)):
                raise ResultsError(f"{where}.curve: step and accuracy must be lists of one "
                                   "length, of positive steps and accuracies in [0, 1]")
        if kind == "grid" and len(run["adjacency_before"]) != run["n_layer"] + 1:
            raise ResultsError(f"{where}.adjacency_before must hold n_layer + 1 scores")
        if kind == "trained":
            _check_trajectory(where, run)
        if kind == "kernels" and run["set"] not in doc["provenance"]["sets"]:
            raise ResultsError(f"{where}.set = {run['set']!r}: must be one of "
                               f"{sorted(doc['provenance']['sets'])}")
    if kind in ("recipe", "trained", "early"):  # the recorded profile must rebuild
        try:
            TrainProfile.from_record(doc["provenance"]["training"])
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"{name}: provenance.training: {exc}") from None
    return doc


def _check_trajectory(where: str, run: dict) -> None:
    layers = len(run["scores_init"])
    if len(run["scores_after"]) != layers:
        raise ResultsError(f"{where}: scores_init and scores_after must score the same layers")
    t = run["trajectory"]
    steps, acc, scores = t.get("step"), t.get("accuracy"), t.get("scores")
    if not (isinstance(steps, list) and steps and all(_int(1)(s) for s in steps)
            and steps == sorted(set(steps)) and steps[-1] == run["steps"]
            and isinstance(acc, list) and len(acc) == len(steps)
            and all(_number(0.0, 1.0)(a) for a in acc)
            and isinstance(scores, list) and len(scores) == len(steps)
            and all(_scores(row) and len(row) == layers for row in scores)):
        raise ResultsError(f"{where}.trajectory: step (increasing, ending at the run's steps), "
                           "accuracy (in [0, 1]) and scores (one list of every layer's score "
                           "per step) must be lists of one length")


def load(path: str | Path) -> dict:
    """The validated document of one committed result file (a name is looked up in
    RESULTS_DIR)."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = RESULTS_DIR / path.name
    kind = kind_of(path)
    try:
        doc = json.loads(cache.read_bytes(path, MAX_BYTES))
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: cannot be read as JSON: {exc}") from None
    return validate(doc, kind, str(path))


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


def provenance(prog: str, argv: list[str] | None, start: float, **extra: Any) -> dict:
    """Where a hand-run study's numbers come from: the command, the git commit, the machine,
    the torch version, the wall time since ``start`` (a perf_counter reading), the date, and
    the study's own fields (``extra``)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none here"
    return {
        "command": f"{prog} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
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


def write(path: Path, doc: dict, kind: str) -> None:
    """Validate a study's document as a result of ``kind``, then write it atomically (the
    chapters find a committed file by its name: ``<kind>_*.json``)."""
    validate(doc, kind, str(path))
    cache.commit_file(path, (dumps(doc) + "\n").encode())
