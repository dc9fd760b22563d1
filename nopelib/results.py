"""The committed result files under ``book/results``: their provenance, writer and loader.

A study that runs by hand (``nopelib.trained_study``, ``nopelib.recipe``, ``nopelib.grid``)
commits a small JSON file with its provenance; the chapters draw from it. A file edited by
hand, or broken by a merge, must not turn into a wrong verdict (a NaN accuracy that flips
"learned", a negative tail that drops a task, a run copied under another seed that counts as
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
every study records (command, commit, machine, torch, wall time, date).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nopelib import cache
from nopelib.ablation import PARTS
from nopelib.claims import LEARNED_AT
from nopelib.claims import TEXT_ENCODINGS, past_plateau
from nopelib.launch import BACKENDS
from nopelib.model import GPTConfig
from nopelib.probe import FEATURE_SETS
from nopelib.profiles import (BATCHED_SUFFIX, MAX_SEED, PRECISIONS, PROFILES,
                              TrainProfile, get_profile)
from nopelib.tasks import TASKS
from nopelib.text_lm import TextProfile, lengths_for

RESULTS_DIR = cache.PACKAGE_DIR.parent / "book" / "results"
KINDS = ("recipe", "grid", "trained", "long", "kernels", "precision", "early", "text")
MAX_BYTES = 64 * 2**20  # a committed result is kilobytes to a few megabytes
# the deepest field of any schema is 7 levels down (a trained run's similarity matrices:
# runs, run, matrices, layers, matrix, row); deeper nesting is no result file
MAX_DEPTH = 16
# the values of train.dtype_policy: how a run's training step computed
DTYPE_POLICIES = ("float32", "autocast-bfloat16")
# the dtype policy each precision of the precision check must have run under: it runs on a CPU
# with bf16 units, where a bfloat16 run that fell back to float32 would compare nothing
PRECISION_POLICY = {"float32": "float32", "bfloat16": "autocast-bfloat16"}
REL_TOL = 1e-9  # a number a writer derived, recomputed from the file: equal up to rounding


class ResultsError(ValueError):
    """A committed result file that does not match its schema; the message names the file and
    the field."""


Check = Callable[[Any], bool]
Rule = tuple[Check, str]  # a field's check, and what it allows in words


def _number(lo: float = -math.inf, hi: float = math.inf) -> Check:
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v) and lo <= v <= hi)


def _int(lo: int = 0, hi: float = math.inf) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _scores(v: Any) -> bool:  # adjacency scores of every layer, 0 = embeddings
    return isinstance(v, list) and len(v) >= 2 and all(_number(0.0, 1.0)(x) for x in v)


def _one_of(options: Sequence[str]) -> Rule:
    allowed = tuple(options)
    return (lambda v: isinstance(v, str) and v in allowed, f"one of {list(allowed)}")


def _or_null(rule: Rule) -> Rule:
    return (lambda v: v is None or rule[0](v), f"null or {rule[1]}")


def _list_of(item: Check, words: str, distinct: bool = False, empty: bool = True) -> Rule:
    def ok(v: Any) -> bool:
        return (isinstance(v, list) and (empty or bool(v)) and all(item(x) for x in v)
                and (not distinct or len(set(v)) == len(v)))  # distinct: of plain values

    return ok, words


def _iso_date(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


def _object(words: str) -> Rule:
    return (lambda v: isinstance(v, dict), words)


_SEED: Rule = (_int(0, MAX_SEED), f"an integer in [0, {MAX_SEED}]")
_STEPS: Rule = (_int(1), "an integer >= 1")
_SECONDS: Rule = (_number(0.0), "a finite number >= 0")
_SHARE: Rule = (_number(0.0, 1.0), "a number in [0, 1]")
_SCORES: Rule = (_scores, "a list of >= 2 scores in [0, 1], one per layer")
_TASK: Rule = _one_of(TASKS)
_SEEDS: Rule = _list_of(_SEED[0], f"a non-empty list of distinct seeds in [0, {MAX_SEED}]",
                        distinct=True, empty=False)
_COMMIT = re.compile(r"[0-9a-f]{40}(\+uncommitted nopelib changes)?|unknown")
_KEY = re.compile(r"[0-9a-f]{32}")  # runs.run_key: 32 hex digits of a SHA-256

PROVENANCE: dict[str, Rule] = {
    "command": (_text, "a non-empty string"),
    "commit": (lambda v: isinstance(v, str) and bool(_COMMIT.fullmatch(v)),
               "a 40-digit git commit"),
    "machine": (_text, "a non-empty string"),
    "torch": (_text, "a non-empty string"),
    "wall_seconds": _SECONDS,
    "date": (_iso_date, "an ISO 8601 date"),
}
EXTRA_PROVENANCE: dict[str, dict[str, Rule]] = {
    "recipe": {"profile": (_text, "a profile name"), "scale": _STEPS,
               "training": _object("the profile's fields")},
    "grid": {"grid": (_text, "a grid name"), "backend": _one_of(BACKENDS)},
    "trained": {"profile": (_text, "a profile name"),
                "training": _object("the profile's fields")},
    "long": {"T": (_int(16), "an integer >= 16"),
             "base": _object("the base model's GPTConfig fields")},
    "kernels": {"profile": (_text, "a profile name"),
                "sets": (lambda v: isinstance(v, dict) and bool(v) and all(
                    isinstance(e, dict) and all(isinstance(x, str) for x in e.values())
                    for e in v.values()), "kernel set name -> its environment variables")},
    "early": {"profile": (_text, "a profile name"), "window": _STEPS, "every": _STEPS,
              "training": _object("the study's profile's fields")},
    "text": {"profile": (_text, "a text profile name"),
             "training": _object("the text profile's fields"),
             "unigram_bpc": (_number(0.0), "a finite number >= 0"),
             "windows": _object("an object with n, seed and split")},
    "precision": {"profile": (_text, "a profile name"), "steps": _STEPS,
                  "rule": (_text, "the rule's text"),
                  "verdict": _one_of(("no change", "changes")),
                  "training": _object("the profile's fields")},
}
# the trained study's bookkeeping: checked once its runs are (a run names its own problem)
TRAINED_PROVENANCE: dict[str, Rule] = {"runs_from_cache": (_int(0), "an integer >= 0")}
TRAINED_PROVENANCE_OPTIONAL: dict[str, Rule] = {
    "cpu_capability": (_text, "torch's CPU capability"),
    "tasks": _list_of(_TASK[0], f"a non-empty list of distinct tasks of {list(TASKS)}",
                      distinct=True, empty=False),
    "seeds": _SEEDS,
    "trajectory": _object("an object with n_inputs and seed"),
    "trained_by": _object("the provenance of the invocation that trained the runs"),
}
RUN: dict[str, Rule] = {
    "task": _TASK,
    "seed": _SEED,
    "accuracy": _SHARE,
    "n_test": _STEPS,
    "train_seconds": _SECONDS,
}
EXTRA_RUN: dict[str, dict[str, Rule]] = {
    "recipe": {"steps": _STEPS, "pos_encoding": (_text, "a position encoding"),
               "curve": _object("an object with step and accuracy")},
    "grid": {"n_layer": _STEPS, "n_embd": _STEPS, "adjacency_before": _SCORES,
             "adjacency_after": _SCORES},
    "trained": {"profile": (_text, "the profile's name"),
                "key": (lambda v: isinstance(v, str) and bool(_KEY.fullmatch(v)),
                        "a run key (32 hex digits)"),
                "steps": _STEPS,
                "decay_from": _or_null(_STEPS),
                "learned_from": _or_null(_STEPS),
                "tail": (lambda v: _number(0.0, 1.0)(v) and v < 1,
                         "a share of the run's steps in [0, 1)"),
                "scores_init": _SCORES, "scores_after": _SCORES,
                "trajectory": _object("an object with step, accuracy and scores"),
                "probes": _object("an object with the probes' settings, rows and shuffled")},
    # one live run of the kernel check (nopelib.kernels) under one kernel set
    "kernels": {"set": (_text, "a kernel set name"),
                "capability": (_text, "torch's CPU capability"),
                "steps": _STEPS,
                "learned": (lambda v: isinstance(v, bool), "true or false"),
                "inside": (lambda v: isinstance(v, bool), "true or false"),
                "outside": _list_of(_text, "a list of the quantities outside the study's "
                                    "interval"),
                "scores_after": _SCORES},
    # one run of the precision check (nopelib.precision): its first steps in one precision
    "precision": {"precision": _one_of(PRECISIONS), "dtype_policy": _one_of(DTYPE_POLICIES),
                  "steps": _STEPS, "step_ms": _SECONDS,
                  "curve": _object("an object with step, accuracy, val_accuracy and scores")},
}
# fields the trained study's writer added after the first files were committed: a run holds
# all of them or none, and every run of a file alike
TRAINED_RUN_LATER: dict[str, Rule] = {
    "wall_seconds": _SECONDS,
    "resumed_at": _list_of(_int(1), "a list of steps >= 1"),
    "dtype_policy": _one_of(DTYPE_POLICIES),
    "matrices": _object("an object with text and layers"),
}
# a trained run's position probes (trained_study.probe_record) and one of their rows
PROBES: dict[str, Rule] = {
    "w": _STEPS, "fit_tokens": _STEPS, "n_sequences": _STEPS,
    "probe_seeds": _SEEDS,
    "rows": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of probe rows"),
    "shuffled": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of probe rows"),
}
PROBE_ROW: dict[str, Rule] = {
    "layer": (_int(0), "a layer >= 0"),
    "features": _one_of(FEATURE_SETS),
    "seed": _SEED,
    "nrmse": (_number(0.0), "a finite NRMSE >= 0"),
    "r": (_number(-1.0, 1.0), "a Pearson r in [-1, 1]"),
}
# the precision check's table (precision.gaps), recomputed from the runs
GAP: dict[str, Rule] = {
    "task": _TASK, "quantity": (_text, "a quantity the rule compares"),
    "precision_gap": _SECONDS, "seed_gap": _SECONDS, "n_seeds": (_int(2), "an integer >= 2"),
    "verdict": _one_of(("no change", "changes")),
}
# a curve's series: one value per curve step
_ACCURACIES: Rule = (_number(0.0, 1.0), "an accuracy in [0, 1]")
_LOSSES: Rule = (_number(0.0), "a finite loss >= 0")


def _rows(words: str) -> Rule:
    return (lambda v: isinstance(v, list) and bool(v), f"a non-empty list of rows {words}")


# a long-sequence run (nopelib.long_context.long_run) is no training run: its own fields,
# each row checked by _check_long_rows
LONG_RUN: dict[str, Rule] = {
    "n_embd": _STEPS,
    "seed": _SEED,
    "window": _or_null(_STEPS),
    "scores": _rows("[length, layer, score in [0, 1]]"),
    "predicted_scores": _rows("[length, predicted score in [0, 1]]"),
    "order": _rows("[layer, octave, d, fraction in [0, 1]]"),
    "predicted_order": _rows("[octave, d, probability in [0, 1]]"),
}

# a run of the early-dynamics study (nopelib.early_study): its first steps, no test split
EARLY_RUN: dict[str, Rule] = {
    "task": _TASK,
    "seed": _SEED,
    "frozen": (lambda v: isinstance(v, list) and all(x in PARTS for x in v)
               and len(set(v)) == len(v), f"a list of distinct parts of {list(PARTS)}"),
    "steps": _STEPS,
    "train_seconds": _SECONDS,
    "scores_init": _SCORES,
    "measure_init": (lambda v: isinstance(v, dict) and bool(v)
                     and all(_number()(x) for x in v.values()),
                     "an object of finite numbers"),
    "curve": _object("an object of lists, one value per curve point"),
}
# the curve fields every early run records, besides scores (one list per point)
EARLY_CURVE = ("step", "accuracy", "lr", "rho", "value_common", "embedding_common", "entropy",
               "value_axis", "embedding_axis", "score_without_mlp", "predicted")
EARLY_SHARES = ("accuracy", "value_common", "embedding_common", "value_axis", "embedding_axis",
                "score_without_mlp", "predicted")  # those of them in [0, 1]


def kind_of(path: Path) -> str:
    """The kind of a result file, from its name (``recipe_*.json`` and so on)."""
    kind = path.name.split("_", 1)[0]
    if kind not in KINDS or "_" not in path.name:
        raise ResultsError(f"{path}: the name must start with one of "
                           f"{[k + '_' for k in KINDS]}")
    return kind


# ---------------------------------------------------------------------------------------------
# the checks every kind shares


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + " ..."


def _bad(where: str, value: Any, allowed: str) -> ResultsError:
    return ResultsError(f"{where} = {_shown(value)}: must be {allowed}")


def _check_depth(name: str, doc: Any) -> None:
    """Refuse a document nested deeper than MAX_DEPTH, naming the field where it gets there;
    iterative, so a nesting bomb cannot exhaust the stack."""
    todo = [(doc, "", 1)]
    while todo:
        value, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ResultsError(f"{name}: {where.lstrip('.')} is nested more than {MAX_DEPTH} "
                               "levels deep: no result field is")
        pairs = (value.items() if isinstance(value, dict)
                 else enumerate(value) if isinstance(value, list) else ())
        for key, child in pairs:
            if isinstance(child, (dict, list)):
                todo.append((child, f"{where}.{key}" if isinstance(value, dict)
                             else f"{where}[{key}]", depth + 1))


def _check_fields(where: str, doc: Any, schema: dict[str, Rule],
                  optional: dict[str, Rule] | None = None) -> None:
    """Every field of ``schema`` present and allowed, and those of ``optional`` that are."""
    if not isinstance(doc, dict):
        raise ResultsError(f"{where} must be an object, not {type(doc).__name__}")
    for name, (ok, allowed) in schema.items():
        if name not in doc:
            raise ResultsError(f"{where}.{name} is missing")
        if not ok(doc[name]):
            raise _bad(f"{where}.{name}", doc[name], allowed)
    for name, (ok, allowed) in (optional or {}).items():
        if name in doc and not ok(doc[name]):
            raise _bad(f"{where}.{name}", doc[name], allowed)


def _check_series(where: str, curve: Any, end: int, series: dict[str, Rule],
                  optional: dict[str, Rule] | None = None) -> None:
    """A learning curve: ``step`` (increasing steps >= 1, the last the run's ``end``) and one
    value per step of each of ``series`` (and of those of ``optional`` it holds)."""
    if not isinstance(curve, dict):
        raise ResultsError(f"{where} must be an object, not {type(curve).__name__}")
    steps = curve.get("step")
    if not (isinstance(steps, list) and steps and all(_int(1)(s) for s in steps)
            and all(a < b for a, b in zip(steps, steps[1:]))):
        raise _bad(f"{where}.step", steps, "a non-empty list of increasing steps >= 1")
    if steps[-1] != end:
        raise _bad(f"{where}.step[-1]", steps[-1], f"the run's last step ({end})")
    present = {**series, **{k: v for k, v in (optional or {}).items() if k in curve}}
    for name, (ok, allowed) in present.items():
        if name not in curve:
            raise ResultsError(f"{where}.{name} is missing")
        values = curve[name]
        if not isinstance(values, list) or len(values) != len(steps):
            shown = f"{len(values)} values" if isinstance(values, list) else _shown(values)
            raise ResultsError(f"{where}.{name} holds {shown}: must be a list of one value "
                               f"per step ({len(steps)})")
        for j, value in enumerate(values):
            if not ok(value):
                raise _bad(f"{where}.{name}[{j}]", value, allowed)


def _layer_rows(layers: int) -> Rule:
    return ((lambda v: _scores(v) and len(v) == layers),
            f"{layers} scores in [0, 1] (layers 0..{layers - 1})")


def _check_layers(where: str, scores: list, layers: int) -> None:
    if len(scores) != layers:
        raise _bad(where, scores, f"{layers} scores, one per layer 0..{layers - 1} of the "
                                  f"{layers - 1}-layer model")


def _profile_record(name: str, provenance: dict, kind: type = TrainProfile) -> Any:
    """The profile the file's provenance records (``training``), rebuilt as a ``kind``
    (TrainProfile or text_lm.TextProfile), under its name."""
    try:
        prof = kind.from_record(provenance["training"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ResultsError(f"{name}: provenance.training: {exc}") from None
    if provenance["profile"] != prof.name:
        raise _bad(f"{name}: provenance.profile", provenance["profile"],
                   f"the name its training record holds ({prof.name!r})")
    return prof


def _known_profile(name: str, provenance: dict) -> TrainProfile:
    profile = provenance["profile"]
    try:
        return get_profile(profile)
    except ValueError:
        raise _bad(f"{name}: provenance.profile", profile,
                   f"one of the profiles {sorted(PROFILES)}, or its batched twin "
                   f"'<name>{BATCHED_SUFFIX}'") from None


def _fingerprint(value: Any) -> bytes:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()


def _distinct(name: str, runs: list[dict], identity: Sequence[str],
              content: tuple[str, Callable[[dict], Any]] | None = None) -> None:
    """Each run's ``identity`` (its seed and what else names it) once; and with ``content``
    (words, the part of a run that only its own seed produces), no two runs of different seeds
    holding the same: a run copied under another seed number is one model counted twice.
    Sound, not flaky: two seeds draw other weights and inputs or data orders, so their lists
    of float losses, accuracies and scores cannot agree bit for bit."""
    seen: dict[tuple, int] = {}
    for i, run in enumerate(runs):
        ident = tuple(tuple(v) if isinstance(v, list) else v for v in (run[k] for k in identity))
        if ident in seen:
            shown = ident[0] if len(ident) == 1 else ident
            raise ResultsError(f"{name}: runs[{i}] repeats runs[{seen[ident]}]'s "
                               f"{', '.join(identity)} = {_shown(shown)}: each once")
        seen[ident] = i
    if content is None:
        return
    words, part = content
    by_print: dict[bytes, int] = {}
    for i, run in enumerate(runs):
        j = by_print.setdefault(_fingerprint(part(run)), i)
        if j != i and runs[j]["seed"] != run["seed"]:
            raise ResultsError(f"{name}: runs[{i}] (seed {run['seed']}) holds the same {words} "
                               f"as runs[{j}] (seed {runs[j]['seed']}): a run copied under "
                               "another seed number")


def _same(name: str, runs: list[dict], words: str, value_of: Callable[[dict], Any]) -> None:
    """``value_of`` the same in every run, as in runs[0]."""
    first = value_of(runs[0])
    for i, run in enumerate(runs[1:], start=1):
        if value_of(run) != first:
            raise ResultsError(f"{name}: runs[{i}]: {words} = {_shown(value_of(run))}: must be "
                               f"the same in every run (runs[0]: {_shown(first)})")


def _complete(name: str, runs: list[dict], unit: Sequence[str], field: str,
              options: Sequence[str]) -> None:
    """Every ``unit`` (e.g. task and seed) run under each of ``options`` of ``field``."""
    have: dict[tuple, set] = {}
    for run in runs:
        have.setdefault(tuple(run[k] for k in unit), set()).add(run[field])
    for ident, present in have.items():
        if present != set(options):
            raise ResultsError(f"{name}: runs: {', '.join(unit)} = {_shown(ident)} is run under "
                               f"{field} {sorted(present)}: must be run under each of "
                               f"{list(options)}")


# ---------------------------------------------------------------------------------------------
# each kind's own checks


def _check_recipe(name: str, doc: dict) -> None:
    from nopelib.recipe import POS_ENCODINGS  # the recipe module writes these files

    prov, runs = doc["provenance"], doc["runs"]
    prof = _profile_record(name, prov)
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, {**RUN, **EXTRA_RUN["recipe"]})
        if run["pos_encoding"] not in POS_ENCODINGS:
            raise _bad(f"{where}.pos_encoding", run["pos_encoding"],
                       f"one of the recipe's encodings {list(POS_ENCODINGS)}")
        cap = prof.for_task(run["task"]).steps * prov["scale"]
        if run["steps"] > cap:
            raise _bad(f"{where}.steps", run["steps"], f"at most {cap:,} (the {prof.name} "
                       f"profile's {run['task']} steps x scale {prov['scale']})")
        _check_series(f"{where}.curve", run["curve"], run["steps"], {"accuracy": _ACCURACIES},
                      {"loss": _LOSSES})
    _known_profile(name, prov)
    _distinct(name, runs, ("task", "seed", "pos_encoding"), ("curve", lambda r: r["curve"]))
    _complete(name, runs, ("task", "seed"), "pos_encoding", POS_ENCODINGS)


def _check_grid(name: str, doc: dict) -> None:
    runs = doc["runs"]
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, {**RUN, **EXTRA_RUN["grid"]})
        for field in ("adjacency_before", "adjacency_after"):
            _check_layers(f"{where}.{field}", run[field], run["n_layer"] + 1)
    # the run key (not read, and a CSV summary may read a key of digits as a number) and the
    # seed name a run; the rest is what it measured
    _distinct(name, runs, ("n_layer", "n_embd", "task", "seed"),
              ("results", lambda r: {k: v for k, v in r.items() if k not in ("seed", "key")}))


def _check_trained(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = _profile_record(name, prov)
    for i, run in enumerate(runs):
        _check_trained_run(f"{name}: runs[{i}]", run, prof)
    _same(name, runs, "task", lambda r: r["task"])
    _same(name, runs, "the fields written after the first studies (wall_seconds, resumed_at, "
          "dtype_policy, matrices)", lambda r: sorted(set(TRAINED_RUN_LATER) & set(r)))
    _same(name, runs, "probes' settings (w, fit_tokens, probe_seeds)",
          lambda r: [r["probes"][k] for k in ("w", "fit_tokens", "probe_seeds")])
    seeds = _known_profile(name, prov).seeds  # a study counts its profile's seeds as complete
    for i, run in enumerate(runs):
        if run["seed"] not in seeds:
            raise _bad(f"{name}: runs[{i}].seed", run["seed"],
                       f"one of the {prov['profile']} profile's seeds {list(seeds)}")
    _distinct(name, runs, ("seed",), ("trajectory", lambda r: r["trajectory"]))
    _distinct(name, runs, ("key",))  # the run cache's key names one task, seed and profile
    _check_trained_provenance(name, prov, runs, prof)


def _check_trained_run(where: str, run: Any, prof: TrainProfile) -> None:
    _check_fields(where, run, {**RUN, **EXTRA_RUN["trained"]})
    later = [k for k in TRAINED_RUN_LATER if k in run]
    if later and len(later) < len(TRAINED_RUN_LATER):
        missing = next(k for k in TRAINED_RUN_LATER if k not in run)
        raise ResultsError(f"{where}.{missing} is missing (the run holds {later}, which the "
                           "study's writer writes with it)")
    _check_fields(where, run, {k: TRAINED_RUN_LATER[k] for k in later})
    layers, steps, task = prof.model.n_layer + 1, run["steps"], run["task"]
    if run["profile"] != prof.name:
        raise _bad(f"{where}.profile", run["profile"],
                   f"the profile of provenance.training ({prof.name!r})")
    if run["n_test"] > prof.n_test:
        raise _bad(f"{where}.n_test", run["n_test"], f"at most the profile's {prof.n_test:,}")
    cap = prof.for_task(task).steps
    if steps > cap:
        raise _bad(f"{where}.steps", steps, f"at most the {prof.name} profile's {cap:,} "
                                            f"steps for {task}")
    if run["decay_from"] is not None and run["decay_from"] > steps:
        raise _bad(f"{where}.decay_from", run["decay_from"], f"null or a step in [1, {steps}]")
    for field in ("scores_init", "scores_after"):
        _check_layers(f"{where}.{field}", run[field], layers)
    t = run["trajectory"]
    _check_series(f"{where}.trajectory", t, steps,
                  {"accuracy": _ACCURACIES, "scores": _layer_rows(layers)},
                  {"val_accuracy": _ACCURACIES, "loss": _LOSSES})
    if run["scores_after"] != t["scores"][-1]:
        raise ResultsError(f"{where}.scores_after must be the trajectory's last scores "
                           f"({_shown(t['scores'][-1])})")
    plateau = past_plateau(t["step"], t["accuracy"], steps)  # what the writer recorded
    if run["learned_from"] != plateau["learned_from"]:
        raise _bad(f"{where}.learned_from", run["learned_from"],
                   f"{plateau['learned_from']!r}: the curve step from which the trajectory "
                   f"stays at {LEARNED_AT} or above (claims.past_plateau)")
    if not math.isclose(run["tail"], plateau["tail"], rel_tol=REL_TOL, abs_tol=REL_TOL):
        raise _bad(f"{where}.tail", run["tail"],
                   f"{plateau['tail']!r}: the share of its {steps:,} steps after learned_from "
                   "(claims.past_plateau)")
    if later:
        if run["wall_seconds"] < run["train_seconds"]:
            raise _bad(f"{where}.wall_seconds", run["wall_seconds"],
                       f"at least train_seconds ({run['train_seconds']})")
        if any(s > steps for s in run["resumed_at"]):
            raise _bad(f"{where}.resumed_at", run["resumed_at"], f"steps in [1, {steps}]")
        _check_matrices(f"{where}.matrices", run["matrices"], layers)
    _check_probes(f"{where}.probes", run["probes"], layers)


def _check_matrices(where: str, matrices: dict, layers: int) -> None:
    """Every layer's self-similarity matrix on one input: one row and column per character."""
    text = matrices.get("text")
    if not _text(text):
        raise _bad(f"{where}.text", text, "the input's text")
    mats = matrices.get("layers")
    if not isinstance(mats, list) or len(mats) != layers:
        raise _bad(f"{where}.layers", mats, f"a list of {layers} matrices (layers 0.."
                                            f"{layers - 1})")
    cosine, n = _number(-1.0, 1.0), len(text)
    for layer, mat in enumerate(mats):
        if not (isinstance(mat, list) and len(mat) == n and all(
                isinstance(row, list) and len(row) == n and all(cosine(x) for x in row)
                for row in mat)):
            raise ResultsError(f"{where}.layers[{layer}] must be a {n} x {n} matrix (one row "
                               f"and column per character of {text!r}) of cosines in [-1, 1]")


def _check_probes(where: str, probes: dict, layers: int) -> None:
    """The probe grid (every layer, feature set and probe seed once) and the shuffled-target
    control (layer 1, every feature set, the first probe seed once)."""
    _check_fields(where, probes, PROBES)
    seeds = probes["probe_seeds"]
    grids = {"rows": ({(layer, f, s) for layer in range(layers) for f in FEATURE_SETS
                       for s in seeds},
                      f"layers 0..{layers - 1} x features {list(FEATURE_SETS)} x probe "
                      f"seeds {seeds}"),
             "shuffled": ({(1, f, seeds[0]) for f in FEATURE_SETS},
                          f"layer 1 x features {list(FEATURE_SETS)} x probe seed {seeds[0]}")}
    for part, (grid, words) in grids.items():
        seen: set[tuple] = set()
        for j, row in enumerate(probes[part]):
            at = f"{where}.{part}[{j}]"
            _check_fields(at, row, PROBE_ROW)
            cell = (row["layer"], row["features"], row["seed"])
            if cell not in grid:
                raise _bad(f"{at} (layer, features, seed)", cell, f"a cell of {words}")
            if cell in seen:
                raise ResultsError(f"{at} repeats (layer, features, seed) = {cell}: each once")
            seen.add(cell)
        if seen != grid:
            lacking = sorted(grid - seen)
            raise ResultsError(f"{where}.{part} lacks {len(lacking)} (layer, features, seed) "
                               f"cells, e.g. {lacking[0]}: must hold each cell of {words}")


def _check_trained_provenance(name: str, prov: dict, runs: list[dict],
                              prof: TrainProfile) -> None:
    where = f"{name}: provenance"
    _check_fields(where, prov, TRAINED_PROVENANCE, TRAINED_PROVENANCE_OPTIONAL)
    task = runs[0]["task"]
    if "tasks" in prov and task not in prov["tasks"]:
        raise _bad(f"{where}.tasks", prov["tasks"], f"the invocation's tasks, with {task!r}")
    if "seeds" in prov and prov["seeds"] != [r["seed"] for r in runs]:
        raise _bad(f"{where}.seeds", prov["seeds"],
                   f"the runs' seeds {[r['seed'] for r in runs]}")
    if "trajectory" in prov:
        _check_fields(f"{where}.trajectory", prov["trajectory"],
                      {"n_inputs": (_int(prof.n_trajectory, prof.n_trajectory),
                                    f"the profile's n_trajectory ({prof.n_trajectory})"),
                       "seed": _SEED})
    if "trained_by" in prov:
        _check_fields(f"{where}.trained_by", prov["trained_by"], PROVENANCE,
                      {"cpu_capability": TRAINED_PROVENANCE_OPTIONAL["cpu_capability"]})


def _check_long(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    T = prov["T"]
    try:
        base = GPTConfig(**prov["base"])
    except (TypeError, ValueError) as exc:
        raise ResultsError(f"{name}: provenance.base: {exc}") from None
    layers = base.n_layer + 1
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, LONG_RUN)
        try:  # the scorecard names each width's model from the base one
            replace(base, n_embd=run["n_embd"])
        except ValueError as exc:
            raise _bad(f"{where}.n_embd", run["n_embd"], f"a width of the base model: {exc}"
                       ) from None
        if run["window"] is not None and run["window"] > T:
            raise _bad(f"{where}.window", run["window"], f"null or an integer in [1, T={T}]")
        _check_long_rows(where, run, T, layers)
    _same(name, runs, "the lengths scored", lambda r: sorted({row[0] for row in r["scores"]}))
    _same(name, runs, "the (octave, d) pairs of predicted_order",
          lambda r: sorted((row[0], row[1]) for row in r["predicted_order"]))
    _distinct(name, runs, ("n_embd", "window", "seed"),
              ("scores and order", lambda r: {k: v for k, v in r.items() if k != "seed"}))


def _cells(where: str, rows: list, width: int, ok: Callable[[list], bool], words: str,
           ) -> set[tuple]:
    """The index columns of ``rows`` (``width`` integers before the value, a number in
    [0, 1]), each allowed by ``ok`` and once."""
    seen: set[tuple] = set()
    for j, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == width + 1
                and all(type(x) is int for x in row[:width]) and _SHARE[0](row[-1]) and ok(row)):
            raise _bad(f"{where}[{j}]", row, words)
        cell = tuple(row[:width])
        if cell in seen:
            raise ResultsError(f"{where}[{j}] repeats {list(cell)}: each once")
        seen.add(cell)
    return seen


def _check_long_rows(where: str, run: dict, T: int, layers: int) -> None:
    """A long run's rows: every layer 0..L at every length (the longest T), the predicted
    score at the same lengths; every layer at the same (octave, d) pairs as the prediction,
    octaves powers of two up to T and d in [2, octave / 2]."""
    last = layers - 1
    scored = _cells(f"{where}.scores", run["scores"], 2,
                    lambda r: 3 <= r[0] <= T and 0 <= r[1] <= last,
                    f"[length in 3..T={T}, layer in 0..{last}, score in [0, 1]]")
    lengths = sorted({length for length, _ in scored})
    missing = sorted({(n, layer) for n in lengths for layer in range(layers)} - scored)
    if missing:
        raise ResultsError(f"{where}.scores lacks [length, layer] {list(missing[0])}: every "
                           f"layer 0..{last} at every length")
    if lengths[-1] != T:
        raise ResultsError(f"{where}.scores reach length {lengths[-1]}: the longest must be "
                           f"T = {T} (provenance.T)")
    predicted = _cells(f"{where}.predicted_scores", run["predicted_scores"], 1,
                       lambda r: r[0] in lengths,
                       f"[a length of scores {lengths}, predicted score in [0, 1]]")
    if predicted != {(n,) for n in lengths}:
        raise ResultsError(f"{where}.predicted_scores must hold each length of scores "
                           f"{lengths} once")

    def octave_d(octave: int, d: int) -> bool:
        return 2 <= octave <= T and octave & (octave - 1) == 0 and 2 <= d <= octave // 2

    pairs = _cells(f"{where}.predicted_order", run["predicted_order"], 2,
                   lambda r: octave_d(r[0], r[1]),
                   f"[octave (a power of two <= T={T}), d in [2, octave / 2], probability in "
                   "[0, 1]]")
    order = _cells(f"{where}.order", run["order"], 3,
                   lambda r: 0 <= r[0] <= last and octave_d(r[1], r[2]),
                   f"[layer in 0..{last}, octave (a power of two <= T={T}), d in [2, "
                   "octave / 2], fraction in [0, 1]]")
    extra = sorted({cell[1:] for cell in order} - pairs)
    if extra:
        raise ResultsError(f"{where}.order has [octave, d] {list(extra[0])}, which "
                           "predicted_order lacks: the two must read the same (octave, d)")
    missing = sorted({(layer, *p) for layer in range(layers) for p in pairs} - order)
    if missing:
        raise ResultsError(f"{where}.order lacks [layer, octave, d] {list(missing[0])}: every "
                           f"layer 0..{last} at each (octave, d) of predicted_order")


def _check_kernels(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    sets = prov["sets"]
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, {**RUN, **EXTRA_RUN["kernels"]})
        if run["set"] not in sets:
            raise _bad(f"{where}.set", run["set"], f"one of {sorted(sets)}")
        if run["inside"] != (not run["outside"]):
            raise _bad(f"{where}.inside", run["inside"],
                       f"{not run['outside']}: inside exactly when outside is empty")
        if run["learned"] != (run["accuracy"] >= LEARNED_AT):
            raise _bad(f"{where}.learned", run["learned"],
                       f"{run['accuracy'] >= LEARNED_AT}: exact match >= {LEARNED_AT}")
    _same(name, runs, "the layers of scores_after", lambda r: len(r["scores_after"]))
    _known_profile(name, prov)
    _distinct(name, runs, ("set", "task", "seed"))  # two kernel sets may agree bit for bit
    _complete(name, runs, ("task", "seed"), "set", list(sets))
    if "chapters" in prov:
        chapters = prov["chapters"]
        if not (isinstance(chapters, dict) and set(chapters) <= set(sets)):
            raise _bad(f"{name}: provenance.chapters", chapters,
                       f"kernel set (of {sorted(sets)}) -> chapter -> passed and seconds")
        for kernel_set, outcome in chapters.items():
            if not isinstance(outcome, dict):
                raise _bad(f"{name}: provenance.chapters.{kernel_set}", outcome,
                           "chapter -> passed and seconds")
            for chapter, c in outcome.items():
                _check_fields(f"{name}: provenance.chapters.{kernel_set}.{chapter}", c,
                              {"passed": EXTRA_RUN["kernels"]["learned"], "seconds": _SECONDS})


def _check_precision(name: str, doc: dict) -> None:
    from nopelib import precision  # the precision module writes these files

    prov, runs = doc["provenance"], doc["runs"]
    prof = _profile_record(name, prov)
    if prov["steps"] > prof.steps:
        raise _bad(f"{name}: provenance.steps", prov["steps"],
                   f"at most the profile's {prof.steps:,} steps")
    layers = prof.model.n_layer + 1
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, {**RUN, **EXTRA_RUN["precision"]})
        policy = PRECISION_POLICY[run["precision"]]
        if run["dtype_policy"] != policy:
            raise _bad(f"{where}.dtype_policy", run["dtype_policy"],
                       f"{policy!r} for a {run['precision']} run (the check compares the two)")
        if run["steps"] > prov["steps"]:
            raise _bad(f"{where}.steps", run["steps"], f"at most provenance.steps "
                                                       f"({prov['steps']})")
        _check_series(f"{where}.curve", run["curve"], run["steps"],
                      {"accuracy": _ACCURACIES, "val_accuracy": _ACCURACIES,
                       "scores": _layer_rows(layers)})
    _known_profile(name, prov)
    _distinct(name, runs, ("task", "seed", "precision"), ("curve", lambda r: r["curve"]))
    _complete(name, runs, ("task", "seed"), "precision", PRECISIONS)
    gaps = doc.get("gaps")
    if not isinstance(gaps, list) or not gaps:
        raise _bad(f"{name}: gaps", gaps, "a non-empty list: the rule's table (precision.gaps)")
    for j, row in enumerate(gaps):
        _check_fields(f"{name}: gaps[{j}]", row, GAP)
    try:
        table = precision.gaps(runs)
    except ValueError as exc:
        raise ResultsError(f"{name}: runs: {exc}") from None
    expected = table.to_dict("records")
    if len(gaps) != len(expected):
        raise ResultsError(f"{name}: gaps holds {len(gaps)} rows: the runs give "
                           f"{len(expected)} (precision.gaps)")
    for j, (row, want) in enumerate(zip(gaps, expected)):
        for field, value in want.items():
            same = (math.isclose(row[field], value, rel_tol=REL_TOL, abs_tol=REL_TOL)
                    if isinstance(value, float) else row[field] == value)
            if not same:
                raise _bad(f"{name}: gaps[{j}].{field}", row[field],
                           f"{value!r}, what the runs give (precision.gaps)")
    if prov["verdict"] != precision.verdict(table):
        raise _bad(f"{name}: provenance.verdict", prov["verdict"],
                   f"{precision.verdict(table)!r}, the verdict of gaps")


def _check_early(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    try:  # the study's own profile, named apart from the profile it starts from
        prof = TrainProfile.from_record(prov["training"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ResultsError(f"{name}: provenance.training: {exc}") from None
    layers = prof.model.n_layer + 1
    finite: Rule = (_number(), "a finite number")
    series = {k: _ACCURACIES if k in EARLY_SHARES else finite for k in EARLY_CURVE[1:]}
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, EARLY_RUN)
        _check_layers(f"{where}.scores_init", run["scores_init"], layers)
        if run["steps"] > prov["window"]:
            raise _bad(f"{where}.steps", run["steps"],
                       f"at most the study's window (provenance.window = {prov['window']})")
        _check_series(f"{where}.curve", run["curve"], run["steps"],
                      {**series, "scores": _layer_rows(layers)})
    _known_profile(name, prov)
    _distinct(name, runs, ("task", "frozen", "seed"), ("curve", lambda r: r["curve"]))


# a run of the text study (nopelib.text_study): a language model, no task
TEXT_RUN: dict[str, Rule] = {
    "encoding": _one_of(TEXT_ENCODINGS),
    "seed": _SEED,
    "steps": _STEPS,
    "train_seconds": _SECONDS,
    "val_bpc": (_number(0.0), "a finite number >= 0"),
    "test_bpc": (_number(0.0), "a finite number >= 0"),
    "curve": _object("an object of lists, one value per curve point"),
    "scores": _object("an object with init and trained: per length, mean and sd per layer"),
    "probes": _rows("{stage, length, layer, features, seed, nrmse, r}"),
    "samples": _rows("{prompt, text}"),
}
TEXT_STAGES = ("init", "trained")


def _check_text(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = _profile_record(name, prov, TextProfile)
    layers = prof.n_layer + 1
    finite: Rule = (_number(), "a finite number")
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        _check_fields(where, run, TEXT_RUN)
        _check_series(f"{where}.curve", run["curve"], run["steps"],
                      {"loss": _LOSSES, "lr": finite, "val_bpc": _LOSSES,
                       "scores": _layer_rows(layers)})
        allowed = lengths_for(run["encoding"], prof)
        for stage in TEXT_STAGES:
            per = run["scores"].get(stage)
            if (not isinstance(per, dict) or not all(k.isdigit() for k in per)
                    or sorted(map(int, per)) != allowed):
                raise _bad(f"{where}.scores.{stage}", per,
                           f"an object with the lengths {allowed} (the {run['encoding']} "
                           "model's)")
            for n, row in per.items():
                if not isinstance(row, dict):
                    raise _bad(f"{where}.scores.{stage}.{n}", row, "an object: mean, sd")
                _check_fields(f"{where}.scores.{stage}.{n}", row,
                              {"mean": _layer_rows(layers),
                               "sd": ((lambda v: _list_of(_number(0.0), "")[0](v)
                                       and len(v) == layers),
                                      f"{layers} standard deviations >= 0, one per layer")})
        for j, row in enumerate(run["probes"]):
            _check_fields(f"{where}.probes[{j}]", row, {
                "stage": _one_of(TEXT_STAGES), "length": _one_of_ints(allowed),
                "layer": (_int(0, layers - 1), f"a layer in [0, {layers - 1}]"),
                "features": _one_of(FEATURE_SETS), "seed": _SEED,
                "nrmse": (_number(0.0), "a finite number >= 0"),
                "r": (_number(-1.0, 1.0), "a correlation in [-1, 1]")})
        for j, row in enumerate(run["samples"]):
            _check_fields(f"{where}.samples[{j}]", row, {"prompt": (_text, "a prompt"),
                                                         "text": (_text, "generated text")})
    _distinct(name, runs, ("encoding", "seed"), ("curve", lambda r: r["curve"]))


def _one_of_ints(options: Sequence[int]) -> Rule:
    allowed = tuple(options)
    return (lambda v: type(v) is int and v in allowed, f"one of {list(allowed)}")


_KIND_CHECKS: dict[str, Callable[[str, dict], None]] = {
    "recipe": _check_recipe, "grid": _check_grid, "trained": _check_trained,
    "long": _check_long, "kernels": _check_kernels, "precision": _check_precision,
    "early": _check_early, "text": _check_text,
}


def validate(doc: Any, kind: str, name: str = "result") -> dict:
    """``doc`` if it is a valid result of ``kind``; raises ResultsError naming ``name`` and
    the field otherwise."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {KINDS}")
    _check_depth(name, doc)
    if not isinstance(doc, dict):
        raise ResultsError(f"{name}: the document must be an object with provenance and runs")
    _check_fields(f"{name}: provenance", doc.get("provenance"),
                  {**PROVENANCE, **EXTRA_PROVENANCE[kind]})
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ResultsError(f"{name}: runs must be a non-empty list")
    _KIND_CHECKS[kind](name, doc)
    return doc


def _check_name(path: Path, doc: dict, kind: str) -> None:
    """A trained study's file is found by its profile and task (``study.study_path``): its name
    must be theirs."""
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


def load(path: str | Path) -> dict:
    """The validated document of one committed result file (a name is looked up in
    RESULTS_DIR)."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = RESULTS_DIR / path.name
    kind = kind_of(path)
    try:
        doc = json.loads(cache.read_bytes(path, MAX_BYTES), object_pairs_hook=_object_of_pairs)
    except RecursionError:  # json's parser recurses once per level of nesting
        raise ResultsError(f"{path}: cannot be read as JSON: nested deeper than Python's "
                           f"recursion limit ({sys.getrecursionlimit()}); no result field is "
                           f"nested more than {MAX_DEPTH} levels deep") from None
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: cannot be read as JSON: {exc}") from None
    validate(doc, kind, str(path))
    _check_name(path, doc, kind)
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
    _check_name(path, doc, kind)
    cache.commit_file(path, (dumps(doc) + "\n").encode())
