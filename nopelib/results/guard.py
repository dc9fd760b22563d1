"""Refuse a write that would replace a committed result the command was not told to replace.

A study's file under ``book/results`` is hours of training, and the chapters read it by its
name. Every command that writes one asks here, before any training, whether its write may
take the place of what is there, and again when it writes (``results.write`` re-reads the file
under its lock, so a file written meanwhile by another invocation is seen): a name of another
kind's result is refused (the chapters would read it as that kind); a command that writes one
result (recipe, grid, long, precision, kernels) replaces an existing file only with
``--replace``; a study of runs (trained, early, text) drops a committed run only where
``--replace SEED ...`` names its seed: not the runs of a file trained under an older record of
its profile (one file holds one record; the chapters read such a file as stale), nor runs the
invocation does not compute again. Each refusal is one line: the file, what it holds, what the
command would write, and how to go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nopelib.core.params import shown
from nopelib.results.schema import KINDS, MAX_BYTES

# what a description names of a file: its provenance's settings, then its runs' identities
SETTINGS = ("profile", "grid", "T", "scale", "steps", "backend")
IDENTITIES = ("task", "encoding", "pos_encoding", "n_layer", "n_embd", "window", "precision",
              "set", "seed")
Merge = Callable[[dict | None, dict], dict]  # (the file as re-read, this write) -> to write


class Refused(ValueError):
    """A write that would replace a committed result not named: the message names the file,
    what it holds, what the command would write, and how to go on."""


def refuse(problem: str | None) -> None:
    """Raise Refused with ``problem``, where there is one (a ``*_problem`` function's)."""
    if problem:
        raise Refused(problem)


def name_kind(path: Path) -> str | None:
    """The result kind a file name belongs to (``<kind>_*``), None for a name of no kind."""
    kind = path.name.split("_", 1)[0]
    return kind if kind in KINDS and "_" in path.name else None


def summary(kind: str, fields: Mapping[str, Any], runs: int | None = None) -> str:
    """A result in words: its kind, its settings and identities (``fields``) and how many
    runs it holds, e.g. "a long result (T 256; n_embd 192; seed 0, 1, 2; 3 runs)"."""
    parts = [f"{k} " + (", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))
             for k, v in fields.items()] + ([] if runs is None else [f"{runs} runs"])
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} result" + (f" ({'; '.join(parts)})" if parts else "")


def holds(path: Path, doc: Any) -> str:
    """What the document ``doc`` of the file ``path`` holds, in words (``summary``): its
    settings, the distinct values of its runs' identities, and how many runs."""
    kind = name_kind(path) or "unnamed"
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        return f"a JSON document that is no result ({shown(doc, 80)})"
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    fields = {k: prov[k] for k in SETTINGS if k in prov}
    runs = [r for r in doc["runs"] if isinstance(r, dict)]
    for key in IDENTITIES:
        values = {json.dumps(r[key]) for r in runs if key in r}
        if values:
            fields[key] = sorted((json.loads(v) for v in values), key=_order)
    return summary(kind, fields, len(runs))


def _order(value: Any) -> tuple[str, Any]:
    """A sort key for identity values of any JSON type (an edited file may mix them): by
    type, numbers by value, the others by their JSON text."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return type(value).__name__, value if number else json.dumps(value)


def describe(path: Path) -> str:
    """What the file at ``path`` holds (``holds``), read as plain JSON: a file of another kind,
    or one that no longer validates, is described too."""
    try:
        with open(path, "rb") as f:
            return holds(path, json.loads(f.read(MAX_BYTES + 1)))
    except (OSError, ValueError, RecursionError) as exc:
        return f"a file that cannot be read as JSON ({type(exc).__name__})"


def single_problem(path: Path, kind: str, would: str, replace: bool,
                   flag: str = "--out") -> str | None:
    """Why a command that writes one result of ``kind`` (``would``: what, in words) may not
    write ``path``: a name of another kind's result (always refused: the chapters find a file
    by its name and would read it as that kind), or a file already there unless ``replace``."""
    other = name_kind(path)
    if other not in (None, kind):
        return (f"{flag} {path}: the name is {summary(other, {})}'s ({other}_*.json) and this "
                f"command writes {would}: pass a {kind}_*.json name or another {flag}")
    if path.exists() and not replace:
        return (f"{flag} {path}: it holds {describe(path)}; this command would write "
                f"{would}: pass --replace to replace it, or another {flag}")
    return None


def appeared_problem(path: Path, would: str, flag: str = "--out") -> str | None:
    """Why a single result written without ``--replace`` may not be written after all: a file
    appeared at ``path`` while the command ran (another invocation's); asked under the file's
    lock (``results.locked``) when it writes."""
    if not path.exists():
        return None
    return (f"{flag} {path}: it holds {describe(path)}, written while this command ran; "
            f"this command's {would} is not written: run it again with --replace, or "
            f"another {flag}")


def unwritten(path: Path, would: str, flag: str = "--out") -> Merge:
    """``results.write``'s check of a single result written without ``--replace``
    (``appeared_problem``)."""

    def check(old: dict | None, doc: dict) -> dict:
        refuse(appeared_problem(path, would, flag))
        return doc
    return check


def record_changes(old: Any, new: Mapping) -> list[str]:
    """The fields in which a committed profile record ``old`` differs from ``new`` (dotted
    for the model's), each with both values: "log_every 50 -> 100"."""
    old = old if isinstance(old, dict) else {}
    out = []
    for key in sorted(set(old) | set(new), key=lambda k: (k != "name", k)):  # name first
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{c}" for c in record_changes(a, b)]
        elif a != b:
            out.append(f"{key} {shown(a, 40)} -> {shown(b, 40)}")
    return out


def dropped_problem(path: Path, old: dict, would: str, dropped: Iterable[int],
                    replace: Sequence[int], why: str, other: str = "another --out") -> str | None:
    """Why writing ``would`` over the committed document ``old`` at ``path`` is refused: it
    drops the committed runs of the seeds ``dropped`` (``why``: the reason they go), and
    ``replace`` does not name them all; None when it does, or nothing is dropped."""
    seeds = sorted(set(dropped))
    if not set(seeds) - set(replace):
        return None
    return (f"{path} holds {holds(path, old)}; this command would write {would}, dropping "
            f"the committed runs of seed(s) {seeds} ({why}): pass --replace "
            f"{' '.join(map(str, seeds))} to replace them, or {other}")


def stale_problem(path: Path, old: dict, would: str, training: Mapping,
                  replace: Sequence[int], other: str = "another --out") -> str | None:
    """Why ``old`` (at ``path``) cannot take runs of today's profile record ``training``: it
    was trained under another record (the profile changed since, or it is another profile's),
    one file holds one record, so its runs would go, and ``replace`` does not name them all."""
    changes = record_changes(old["provenance"].get("training"), training)
    if not changes:
        return None
    why = (f"trained under another record of the profile: {'; '.join(changes[:4])}"
           + (f"; {len(changes) - 4} more" if len(changes) > 4 else "")
           + "; one file holds one record")
    return dropped_problem(path, old, would, (r["seed"] for r in old["runs"]), replace, why,
                           other)
