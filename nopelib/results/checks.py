"""The checks every result kind shares: fields, curves, layers, and each run's identity.

Every problem raises ``ResultsError`` naming the file, the field, the value and what is
allowed (``bad_value``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from nopelib.results.schema import MAX_DEPTH, ResultsError, Rule, int_rule, scores_rule
from nopelib.training.profiles import PROFILES, get_profile
from nopelib.training.train_profile import BATCHED_SUFFIX, TrainProfile


def shown_value(value: Any) -> str:
    """A value as an error message shows it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + " ..."


def bad_value(where: str, value: Any, allowed: str) -> ResultsError:
    """The error of a field: where it is, its value and what is allowed."""
    return ResultsError(f"{where} = {shown_value(value)}: must be {allowed}")


def check_depth(name: str, doc: Any) -> None:
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


def check_fields(where: str, doc: Any, schema: dict[str, Rule],
                 optional: dict[str, Rule] | None = None) -> None:
    """Every field of ``schema`` present and allowed, and those of ``optional`` that are."""
    if not isinstance(doc, dict):
        raise ResultsError(f"{where} must be an object, not {type(doc).__name__}")
    for name, (ok, allowed) in schema.items():
        if name not in doc:
            raise ResultsError(f"{where}.{name} is missing")
        if not ok(doc[name]):
            raise bad_value(f"{where}.{name}", doc[name], allowed)
    for name, (ok, allowed) in (optional or {}).items():
        if name in doc and not ok(doc[name]):
            raise bad_value(f"{where}.{name}", doc[name], allowed)


def check_series(where: str, curve: Any, end: int, series: dict[str, Rule],
                 optional: dict[str, Rule] | None = None) -> None:
    """A learning curve: ``step`` (increasing steps >= 1, the last the run's ``end``) and one
    value per step of each of ``series`` (and of those of ``optional`` it holds)."""
    if not isinstance(curve, dict):
        raise ResultsError(f"{where} must be an object, not {type(curve).__name__}")
    steps = curve.get("step")
    if not (isinstance(steps, list) and steps and all(int_rule(1)(s) for s in steps)
            and all(a < b for a, b in zip(steps, steps[1:]))):
        raise bad_value(f"{where}.step", steps, "a non-empty list of increasing steps >= 1")
    if steps[-1] != end:
        raise bad_value(f"{where}.step[-1]", steps[-1], f"the run's last step ({end})")
    present = {**series, **{k: v for k, v in (optional or {}).items() if k in curve}}
    for name, (ok, allowed) in present.items():
        if name not in curve:
            raise ResultsError(f"{where}.{name} is missing")
        values = curve[name]
        if not isinstance(values, list) or len(values) != len(steps):
            shown = f"{len(values)} values" if isinstance(values, list) else shown_value(values)
            raise ResultsError(f"{where}.{name} holds {shown}: must be a list of one value "
                               f"per step ({len(steps)})")
        for j, value in enumerate(values):
            if not ok(value):
                raise bad_value(f"{where}.{name}[{j}]", value, allowed)


def layer_rows(layers: int) -> Rule:
    return ((lambda v: scores_rule(v) and len(v) == layers),
            f"{layers} scores in [0, 1] (layers 0..{layers - 1})")


def check_layers(where: str, scores: list, layers: int) -> None:
    if len(scores) != layers:
        raise bad_value(where, scores, f"{layers} scores, one per layer 0..{layers - 1} of the "
                                  f"{layers - 1}-layer model")


def profile_record(name: str, provenance: dict, kind: type = TrainProfile) -> Any:
    """The profile the file's provenance records (``training``), rebuilt as a ``kind``
    (TrainProfile or text_lm.TextProfile), under its name."""
    try:
        prof = kind.from_record(provenance["training"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ResultsError(f"{name}: provenance.training: {exc}") from None
    if provenance["profile"] != prof.name:
        raise bad_value(f"{name}: provenance.profile", provenance["profile"],
                        f"the name its training record holds ({prof.name!r})")
    return prof


def known_profile(name: str, provenance: dict) -> TrainProfile:
    profile = provenance["profile"]
    try:
        return get_profile(profile)
    except ValueError:
        raise bad_value(f"{name}: provenance.profile", profile,
                        f"one of the profiles {sorted(PROFILES)}, or its batched twin "
                        f"'<name>{BATCHED_SUFFIX}'") from None


def fingerprint(value: Any) -> bytes:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()


def check_distinct(name: str, runs: list[dict], identity: Sequence[str],
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
                               f"{', '.join(identity)} = {shown_value(shown)}: each once")
        seen[ident] = i
    if content is None:
        return
    words, part = content
    by_print: dict[bytes, int] = {}
    for i, run in enumerate(runs):
        j = by_print.setdefault(fingerprint(part(run)), i)
        if j != i and runs[j]["seed"] != run["seed"]:
            raise ResultsError(f"{name}: runs[{i}] (seed {run['seed']}) holds the same {words} "
                               f"as runs[{j}] (seed {runs[j]['seed']}): a run copied under "
                               "another seed number")


def check_same(name: str, runs: list[dict], words: str, value_of: Callable[[dict], Any]) -> None:
    """``value_of`` the same in every run, as in runs[0]."""
    first = value_of(runs[0])
    for i, run in enumerate(runs[1:], start=1):
        if value_of(run) != first:
            raise ResultsError(f"{name}: runs[{i}]: {words} = {shown_value(value_of(run))}: must be "
                               f"the same in every run (runs[0]: {shown_value(first)})")


def check_complete(name: str, runs: list[dict], unit: Sequence[str], field: str,
                   options: Sequence[str]) -> None:
    """Every ``unit`` (e.g. task and seed) run under each of ``options`` of ``field``."""
    have: dict[tuple, set] = {}
    for run in runs:
        have.setdefault(tuple(run[k] for k in unit), set()).add(run[field])
    for ident, present in have.items():
        if present != set(options):
            raise ResultsError(f"{name}: runs: {', '.join(unit)} = {shown_value(ident)} is run under "
                               f"{field} {sorted(present)}: must be run under each of "
                               f"{list(options)}")
