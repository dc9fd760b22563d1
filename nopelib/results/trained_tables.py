"""The committed trained-model study as tables: one row per run, per task, the verdicts.

From a profile's committed files (``trained_files.load_study``): one row per run
(``study_table``), one per task with whether it is learned and judged (``study_accuracy``,
``learned_and_judged``, ``task_standing``), the per-seed scores the claims are judged on
(``study_scores``, ``score_table``), the verdicts under both rule sets (``trained_verdicts``,
``rules_comparison``), a task's majority-answer share (``majority_shares``), and a live run set
beside the study (``reproduction``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from nopelib.core.stats import seed_interval, summarize
from nopelib.core.tasks import make_split, majority_baseline
from nopelib.rules import claims
from nopelib.training.train_profile import TrainProfile


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


def score_table(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                phase: Mapping[str, np.ndarray], layers: Sequence[int]) -> pd.DataFrame:
    """Mean over seeds of the scores at initialisation, after training and over the learned
    phase: one row per layer, columns (task, "before" / "after" / "learned phase")."""
    return pd.DataFrame(
        {(task, when): summarize(s)[0] for task in before
         for when, s in (("before", before[task]), ("after", after[task]),
                         ("learned phase", phase[task]))},
        index=pd.Index(layers, name="layer"))


def majority_shares(prof: TrainProfile, tasks: Sequence[str],
                    seeds: Sequence[int]) -> dict[str, float]:
    """Each task's majority-answer share (what a model that ignores its input reaches), the
    mean over the test splits of ``seeds``: the baseline a learning curve is read against."""
    return {task: float(np.mean([majority_baseline(make_split(
        task, s, n_train=prof.n_train, n_test=prof.n_test).test)[1] for s in seeds]))
        for task in tasks}


def reproduction(live: Mapping[str, object], committed: Sequence[Mapping],
                 alpha: float = claims.ALPHA) -> pd.DataFrame:
    """A live run (``runs.TrainedRun``'s metrics) against the committed study's runs of its
    task: its exact match and every layer's score after training beside the study's mean and
    the t prediction interval of one more seed (n - 1 degrees of freedom, Bonferroni over the
    layers), and whether it lies inside."""
    if len(committed) < 2:
        raise ValueError(f"reproduction: the committed study holds {len(committed)} run(s) "
                         "of this task; an interval for one more seed needs 2 or more (a "
                         "study still training: wait for its seeds)")
    studied = np.array([r["scores_after"] for r in committed])  # [seeds, L+1]
    live_scores = live["curve"]["scores"][-1]
    level = 1 - alpha / studied.shape[1]
    rows = []
    for layer, value in enumerate(live_scores):
        mean, _, half = seed_interval(studied[:, layer], level)
        rows.append(dict(quantity=f"layer {layer} score", live=value, study_mean=mean,
                         lo=mean - half, hi=mean + half, inside=mean - half <= value <= mean + half))
    return pd.DataFrame(rows)

