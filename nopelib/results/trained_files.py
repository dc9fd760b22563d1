"""The committed trained-model study: its files, their tables, and the claims' verdicts on them.

A profile's study is one file per task (``book/results/trained_<profile>_<task>.json``, written
by ``nopelib.studies.trained_study``); a file trained under an earlier version of the profile
is stale and never read as today's study. From the files: one row per run, one per task, the
per-seed scores the claims are judged on, the verdicts under both rule sets, and whether a
verdict depends on the model's size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd

from nopelib.rules import claims
from nopelib.results import files as results
from nopelib.training.profiles import PROFILES
from nopelib.training.train_profile import TrainProfile


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
    (``trained_study.task_profile``): the rule's "changes" keeps float32."""
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


def task_profile(profile: TrainProfile, task: str) -> TrainProfile:
    """The profile ``task``'s runs train under: ``profile``, in float32 where it asks for
    bf16 autocast and no committed precision check cleared the task (``bf16_cleared``): the
    trained and the early study train a task alike. A run's key holds the profile it ran."""
    base = profile.name.removesuffix("+batched")
    if profile.precision == "bfloat16" and (base not in PROFILES
                                            or task not in bf16_cleared(base)):
        return replace(profile, precision="float32")
    return profile


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


# study_table's columns for the run fields written since the paper model's study, and the
# run record field each reads (older files lack them: the columns are left out)
LATER_COLUMNS = {"precision": "dtype_policy", "wall_s": "wall_seconds",
                 "resumed_at": "resumed_at"}


def study_table(docs: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per committed run: task, seed, exact match on the whole test split, its size,
    the steps trained, the step where the validation split reached the profile's level
    (``decay_from``), where the learning curve reached the learnedness line for good
    (``learned_from``), the share of the run after it (``tail``), whether that is the claim
    rule's margin (``with_margin``), and the training seconds. Where a run records them (the
    studies written since the paper model's), also its precision (``dtype_policy``), its wall
    seconds (training, curve points and the test) and the steps it resumed at from a
    checkpoint: columns ``precision``, ``wall_s`` and ``resumed_at``."""
    runs = [r for doc in docs.values() for r in doc["runs"]]
    rows = [dict(task=r["task"], seed=r["seed"], accuracy=r["accuracy"], n_test=r["n_test"],
                 steps=r["steps"], decay_from=r["decay_from"], learned_from=r["learned_from"],
                 tail=r["tail"], with_margin=r["tail"] >= claims.PLATEAU_TAIL,
                 train_s=r["train_seconds"],
                 **{column: r.get(field) for column, field in LATER_COLUMNS.items()})
            for r in runs]
    later = [c for c, field in LATER_COLUMNS.items() if any(field in r for r in runs)]
    return pd.DataFrame(rows, columns=["task", "seed", "accuracy", "n_test", "steps",
                                       "decay_from", "learned_from", "tail", "with_margin",
                                       "train_s", *later])


def study_accuracy(table: pd.DataFrame, n_test: int,
                   baselines: Mapping[str, float] | None = None,
                   n_seeds: int | None = None) -> pd.DataFrame:
    """Per task of ``study_table``: exact match per seed (columns ``seed s``), the lowest,
    the task's majority-answer share (``baselines``), whether the task is learned
    (``claims.is_learned``), whether every run is past its plateau with the claim rule's
    margin (``with margin``), and how many seeds its file holds (``seeds``): ``complete``
    once it holds ``claims.JUDGED_AT_SEEDS`` of its profile's ``n_seeds`` (all of them when
    the profile has fewer; a study in flight holds fewer): the tasks judged are learned, with
    margin and complete. ``learned`` and ``with margin`` speak of every seed in, so they are
    NA (undecided) for a task with too few seeds in."""
    acc = table.pivot(index="task", columns="seed", values="accuracy")
    acc.columns = [f"seed {s}" for s in acc.columns]
    acc["lowest"] = acc.min(axis=1)
    if baselines is not None:
        acc["majority"] = [baselines[t] for t in acc.index]
    acc["seeds"] = table.groupby("task")["seed"].nunique()
    acc["complete"] = acc["seeds"] >= judged_at(n_seeds or 0)
    learned = pd.Series([claims.is_learned(g.to_dict("records"), n_test)
                         for _, g in table.groupby("task")], index=acc.index)
    margin = table.groupby("task")["with_margin"].all()
    for column, values in (("learned", learned), ("with margin", margin)):
        acc.insert(acc.columns.get_loc("seeds"), column,
                   values.astype("boolean").where(acc["complete"]))
    return acc


def judged_at(n_seeds: int) -> int:
    """How many seeds of a profile's ``n_seeds`` a task needs in to be judged."""
    return min(n_seeds, claims.JUDGED_AT_SEEDS)


def learned_and_judged(acc: pd.DataFrame) -> tuple[list[str], list[str]]:
    """From ``study_accuracy``'s table: the tasks learned by every seed of the profile (a
    task still training is neither), and those of them learned with the margin rule's
    margin (the tasks the claims are judged on)."""
    complete = acc["complete"] if "complete" in acc else pd.Series(True, index=acc.index)
    learned = [t for t in acc.index if complete[t] and acc.loc[t, "learned"]]
    return learned, [t for t in learned if acc.loc[t, "with margin"]]


def task_standing(acc: pd.DataFrame | None, tasks: Sequence[str], n_seeds: int,
                  stale: Sequence[str] = ()) -> dict[str, str]:
    """Per task, why the trained claims are or are not judged on it, from ``study_accuracy``'s
    table (None: no committed file): "judged" (on the seeds in, at least
    ``judged_at(n_seeds)``), "still training: k of n seeds in", "stale:
    trained under an earlier profile" for a task of ``stale``, "not learned" or "not learned
    with margin". Only a task still training can gain a verdict without a new profile."""
    held = {} if acc is None else acc["seeds"].to_dict()
    judged = [] if acc is None else learned_and_judged(acc)[1]
    out = {}
    for task in tasks:
        k = int(held.get(task, 0))
        if task in judged:
            out[task] = "judged"
        elif task in stale and k == 0:
            out[task] = "stale: trained under an earlier profile"
        elif k < judged_at(n_seeds):
            out[task] = f"still training: {k} of {n_seeds} seeds in"
        elif not acc.loc[task, "learned"]:
            out[task] = "not learned"
        else:
            out[task] = "not learned with margin"
    return out


def trained_verdicts(docs: Mapping[str, Mapping], acc: pd.DataFrame,
                     rules: str = claims.REVISED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trained-model claims (``claims.trained_claims`` under ``rules``) on the judged
    tasks, or, where no task is judged, on the learned ones, marked exploratory: (the tests,
    one verdict per claim, reading and task with a ``standing`` column)."""
    learned, judged = learned_and_judged(acc)
    shown = judged or learned
    if not shown:
        raise ValueError("no task of the study is learned: the trained-model claims have "
                         "nothing to be judged on")
    tests = claims.trained_claims(*study_scores(docs, shown), shown, rules=rules)
    standing = "verdict" if judged else "exploratory: no task meets the margin rule"
    return tests, claims.claim_table(tests).assign(standing=standing)


# why a verdict moves from the registered rules to the revised ones, by (old, new)
RULE_CHANGE_REASONS = {
    ("cannot tell", "holds"): "the claim's side is now one one-sided test at level 0.05 "
                              "(intersection-union), not a Bonferroni two-sided interval",
    ("cannot tell", "fails"): "the other side is now one-sided at 0.05 / m, not two-sided "
                              "at 0.05 / m (0.05 / 2m per side)",
}  # both bounds are tighter under the revised rules: a verdict can only leave "cannot tell"


def rules_comparison(docs: Mapping[str, Mapping], acc: pd.DataFrame) -> pd.DataFrame:
    """The trained claim table under the rules the study was registered under and under the
    revised ones, side by side: one row per (claim, reading, task) with both verdicts,
    the revised weakest test's mean and bounds, and, where the verdict moved, why."""
    keys = ["claim", "reading", "task"]
    old = trained_verdicts(docs, acc, claims.REGISTERED)[1]
    new = trained_verdicts(docs, acc, claims.REVISED)[1]
    both = old[keys + ["verdict"]].merge(
        new[keys + ["verdict", "weakest_layer", "mean", "lo", "hi"]], on=keys,
        suffixes=(" registered", " revised"))
    moves = zip(both["verdict registered"], both["verdict revised"])
    both["why it moved"] = [RULE_CHANGE_REASONS.get(m, "") if m[0] != m[1] else ""
                            for m in moves]
    return both


def study_scores(docs: Mapping[str, Mapping], tasks: Sequence[str]) -> tuple[dict, dict, dict]:
    """Per task, the per-seed adjacency scores [seeds, L+1] of the study's fixed inputs: at
    initialisation, after training, and averaged over the run's learned phase
    (``claims.learned_phase``); the tasks must be learned."""
    before, after, phase = {}, {}, {}
    for task in tasks:
        runs = docs[task]["runs"]
        before[task] = np.array([r["scores_init"] for r in runs])
        after[task] = np.array([r["scores_after"] for r in runs])
        phase[task] = np.array([claims.learned_phase(
            r["trajectory"]["step"], r["trajectory"]["accuracy"], r["trajectory"]["scores"],
            r["steps"]) for r in runs])
    return before, after, phase


def study_provenance(doc: Mapping) -> str:
    """Markdown: where a committed study file's numbers come from: the invocation that wrote
    it, then where its runs came from, from each run's ``origin``; a file written before
    runs recorded one says what its writer did and where the other runs came from."""
    p, runs = doc["provenance"], doc["runs"]
    wrote = (f"the file written (not its runs trained, unless said below) by "
             f"`{p['command']}` at commit `{p['commit'][:12]}` on {p['machine']} "
             f"(CPU kernels {p.get('cpu_capability', '?')}, torch {p['torch']}, "
             f"{p['wall_seconds'] / 60:.0f} min wall, {p['date']})")
    if all("origin" in r for r in runs):
        return f"{wrote}; " + "; ".join(run_origins(runs))
    return (f"{wrote}; of the seeds it ran (those its command names, else the profile's) it "
            f"read {p['runs_from_cache']} from the run cache and trained the others; any "
            "other run was kept from the committed file it grew (files of this age do not "
            "record each run's origin)")


def run_origins(runs: Sequence[Mapping]) -> list[str]:
    """Where ``runs`` came from (their ``origin``), one phrase per invocation that trained
    some and one for those read from the run cache, seeds named, each with the dates the
    runs finished."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in runs:
        o = r["origin"]
        by = (o.get("command"), o["commit"], o["machine"], o["cpu_capability"]) if (
            o["how"] == "trained") else ()
        groups.setdefault(by, []).append(r)
    phrases = []
    for by, group in groups.items():
        seeds = ", ".join(str(r["seed"]) for r in group)
        dates = sorted(r["origin"]["finished"] for r in group)
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        label = f"seed{'s' if len(group) > 1 else ''} {seeds}"
        if by:
            command = f" by `{by[0]}`" if by[0] else ""  # a study command names itself
            phrases.append(f"{label} trained{command} at commit `{by[1][:12]}` on {by[2]} "
                           f"(CPU kernels {by[3]}), finished {when}")
        else:
            phrases.append(f"{label} read from the run cache, trained at a commit it does not "
                           "record (nor the command; the run key pins the training sources, "
                           f"torch and precision), finished {when}")
    return phrases


DIFFERS = "differs between the models"  # model_dependence's column
# how a profile field is named where two models are compared
FIELD_WORDS = {"n_layer": "layers", "n_head": "heads", "n_embd": "width",
               "init_std": "token-embedding σ", "n_trajectory": "trajectory inputs",
               "curve_dense_every": "dense curve points every (steps)",
               "curve_dense_until": "dense curve points until (step)"}


def profile_differences(a: TrainProfile, b: TrainProfile,
                        tasks: Sequence[str] = ()) -> list[str]:
    """Every way the models of profiles ``a`` and ``b`` differ, in words ("width 96 vs
    384"): the model's configuration, the profile's fields, and the precision each of
    ``tasks`` trains in (``task_profile``), so that a comparison never names size alone."""
    out = []
    ma, mb = asdict(a.model), asdict(b.model)
    out += [f"{FIELD_WORDS.get(k, k)} {ma[k]:g} vs {mb[k]:g}" for k in ma if ma[k] != mb[k]]
    pa, pb = asdict(a), asdict(b)
    skip = {"name", "model", "seeds", "precision", "claim_tasks"}
    out += [f"{FIELD_WORDS.get(k, k)} {pa[k]} vs {pb[k]}" for k in pa
            if k not in skip and pa[k] != pb[k]]
    for task in tasks:
        pre = (task_profile(a, task).precision, task_profile(b, task).precision)
        if pre[0] != pre[1]:
            out.append(f"precision on {task} {pre[0]} vs {pre[1]}")
    return out


def model_dependence(tables: Mapping[str, pd.DataFrame | None], tasks: Sequence[str],
                    standing: Mapping[str, Mapping[str, str]] | None = None) -> pd.DataFrame:
    """Whether a trained claim's verdict differs between two models (which differ in more than
    size: ``profile_differences`` names how): ``tables`` maps a model's
    name to its claim table (``trained_verdicts``' second item, None when the model has no
    judged task), the first name being the reference; ``standing`` maps a name to
    ``task_standing``'s reasons, which stand in a model's column where it has no verdict
    ("not judged" without them). A table's exploratory rows are no verdict. One row per
    (claim, reading, task) with each model's verdict and one plain sentence where every model
    has a verdict: "yes" where one model holds and another fails, "no" where all hold or all
    fail, "not shown" where a model cannot tell (missing evidence, not another finding); and
    where one has none, "cannot say yet" while it still trains on the task, "cannot say"
    where it never will under its profile."""
    names = list(tables)
    if len(names) < 2:
        raise ValueError(f"model_dependence: two models or more, not {names}")
    keys = ["claim", "reading", "task"]
    every = "both models" if len(names) == 2 else f"all {len(names)} models"
    rows = []
    for (claim, reading), task in ((cr, t) for cr in claims.TRAINED_CLAIMS for t in tasks):
        row = dict(claim=claim, reading=reading, task=task)
        for name in names:
            table = tables[name]
            if table is not None and "standing" in table:
                table = table[table["standing"] == "verdict"]
            hit = (None if table is None else
                   table[(table[keys] == [claim, reading, task]).all(axis=1)])
            why = (standing or {}).get(name, {}).get(task, "not judged")
            row[name] = why if hit is None or hit.empty else hit.verdict.iloc[0]
        verdicts = [row[n] for n in names]
        missing = [n for n in names if row[n] not in claims.VERDICTS]
        if missing:
            lead = ("cannot say yet" if any(row[n].startswith("still training")
                                            for n in missing) else "cannot say")
            has = "has" if len(missing) == 1 else "have"
            row[DIFFERS] = f"{lead}: {', '.join(missing)} {has} no verdict on {task}"
        elif {"holds", "fails"} <= set(verdicts):
            row[DIFFERS] = "yes: " + ", ".join(f"{row[n]} at {n}" for n in names)
        elif set(verdicts) == {"holds"} or set(verdicts) == {"fails"}:
            row[DIFFERS] = f"no: {verdicts[0]} on {every}"
        else:  # a "cannot tell" is missing evidence, not another finding
            row[DIFFERS] = "not shown: " + ", ".join(
                f"{row[n]} at {n}" for n in names)
        rows.append(row)
    return pd.DataFrame(rows)
