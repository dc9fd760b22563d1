"""The committed trained-model study's files: found by profile and task, current or stale.

A profile's study is one file per task (``book/results/trained_<profile>_<task>.json``, written
by ``nopelib.studies.trained_study``); a file trained under an earlier version of the profile
is stale and never read as today's study. Here: where a file is, which are today's
(``load_study``, ``stale_tasks``), how far a study in flight is (``seeds_in``, ``progress``), how
long a live run of it takes (``live_seconds``), and the tasks the committed precision checks
cleared for bf16 (``bf16_cleared``, which ``training.task_precision.BF16_TASKS`` must match).
Its tables are
``trained_tables``', its words ``trained_prose``'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from nopelib.results import files as results
from nopelib.training.profiles import PROFILES


def study_path(profile: str, task: str) -> Path:
    """Where the committed study of ``profile`` keeps ``task``'s runs."""
    return results.RESULTS_DIR / f"trained_{profile}_{task}.json"


def _committed(profile: str, tasks: Sequence[str]) -> dict[str, dict]:
    return {t: results.load(study_path(profile, t)) for t in tasks
            if study_path(profile, t).is_file()}


def is_current(doc: Mapping, profile: str) -> bool:
    """Whether a committed study file was trained under ``profile`` as it stands today (the
    profile's numbers change between commits; a file of an earlier version is stale)."""
    today = json.loads(json.dumps(PROFILES[profile].record()))  # tuples as the file has them
    return doc["provenance"].get("training") == today


def load_study(profile: str, tasks: Sequence[str]) -> tuple[dict[str, dict], list[str]]:
    """The committed study of ``profile``: {task: validated document} for the tasks whose file
    was trained under today's profile, and the tasks without one (missing, or stale: see
    ``stale_tasks``). A stale file is never read as today's study."""
    docs = {t: d for t, d in _committed(profile, tasks).items() if is_current(d, profile)}
    return docs, [t for t in tasks if t not in docs]


def bf16_cleared(profile: str, folder: Path | None = None) -> frozenset[str]:
    """The tasks on which bf16 autocast may train ``profile``'s runs: those that a committed
    precision check of this profile (``nopelib.studies.precision``, its record equal to
    today's but for the precision itself) ran, with "no change" on every quantity in every
    check that ran them. A task no check ran, or one a check found changed, trains in float32
    (``task_precision.task_profile``): the rule's "changes" keeps float32."""
    today = {k: v for k, v in json.loads(json.dumps(PROFILES[profile].record())).items()
             if k != "precision"}
    ran, changed = set(), set()
    for doc in results.load_all("precision", folder).values():
        record = {k: v for k, v in doc["provenance"]["training"].items() if k != "precision"}
        if doc["provenance"]["profile"] != profile or record != today:
            continue
        for row in doc["gaps"]:  # validated: recomputed from the runs when loaded
            ran.add(row["task"])
            if row["verdict"] != "no change":
                changed.add(row["task"])
    return frozenset(ran - changed)


def stale_tasks(profile: str, tasks: Sequence[str]) -> list[str]:
    """The tasks whose committed file of ``profile`` was trained under an earlier version."""
    return [t for t, d in _committed(profile, tasks).items() if not is_current(d, profile)]


def seeds_in(docs: Mapping[str, Mapping], tasks: Sequence[str]) -> dict[str, int]:
    """Per task, how many seeds the committed files ``docs`` (``load_study``'s: today's
    profile only) hold, 0 without a file: a study in flight holds fewer than its profile."""
    return {t: len({r["seed"] for r in docs[t]["runs"]}) if t in docs else 0 for t in tasks}


def progress(profile: str, tasks: Sequence[str]) -> str:
    """How far ``profile``'s committed study is, in words: "reversal 5 of 5 seeds; addition,
    ordering 0 of 5", tasks with the same count named together (in ``tasks``' order), the
    furthest first."""
    held = seeds_in(load_study(profile, tasks)[0], tasks)
    n = len(PROFILES[profile].seeds)
    groups: dict[int, list[str]] = {}
    for task, k in held.items():
        groups.setdefault(k, []).append(task)
    return "; ".join(f"{', '.join(ts)} {k} of {n}" + (" seeds" if i == 0 else "")
                     for i, (k, ts) in enumerate(sorted(groups.items(), reverse=True)))


def live_seconds(profile: str, tasks: Sequence[str]) -> float | None:
    """The longest training time (seconds, one thread) of the committed study's runs of
    ``tasks``: what a live run of them is expected to take; None without a committed study
    (a budget that follows progress has no fixed cost to estimate)."""
    docs, _ = load_study(profile, tasks)
    times = [r["train_seconds"] for doc in docs.values() for r in doc["runs"]]
    return max(times) if times else None
