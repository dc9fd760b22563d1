"""The paper's claims as decision rules, fixed before the data they judge.

A claim is stated in one or more **readings** (e.g. claim 4, "later layers weaken it", is read
as "the last layer ends below layer 1" and as "the last layer ends below its own
initialisation"). Each reading is judged on its own and reported on its own: readings are
alternatives, never ANDed into one verdict.

**A family is one reading**: all its tests over every group (task, configuration, model) and
layer it is judged on. A test is one-sided: a statistic measured once per unit (the unit is
the model: one seed's trained or initialised model, anything measured several times on one
model averaged first) and a bound the reading says the statistic lies above (or below). A
two-sided reading ("within 0.1 of 0.5") is two one-sided tests.

- Statistic: the mean over units, with one-sided Student t bounds (n - 1 degrees of freedom).
  At the 3 to 5 seeds a CPU can train this is the honest choice: a percentile bootstrap over
  5 values has 126 distinct resamples and covers well below its nominal level.
- "holds" on a group: every test of the group holds, each at one-sided level ALPHA (its bound
  on the claim's side, at confidence 1 - ALPHA, lies beyond the claim's bound). This is an
  intersection-union test: the group's "holds" is wrong only when some test's statistic truly
  lies on the other side, and that one test errs with probability at most ALPHA, so no
  correction is needed (Berger 1982). Each group's "holds" is its own statement at level ALPHA;
  "replicates" over all groups is again an intersection, at the same level.
- "fails" on a group: any of its tests fails, with the bound on the other side taken at
  confidence 1 - ALPHA / m, m the family's tests (Bonferroni), so all the family's "fails"
  statements together err with probability at most ALPHA.
- otherwise "cannot tell" (and always with fewer than MIN_UNITS units).

Each test row reports ``lo`` and ``hi``: the two one-sided bounds, the claim's side at level
``holds_level`` and the other side at ``fails_level``. These rules (``REVISED``) replaced the
ones the 4 x 96 study was registered under (``REGISTERED``: a two-sided interval at 1 - ALPHA
/ m for every test, "holds" included, and a family per reading as here); ``judge`` and
``trained_claims`` take either, so a chapter can show a study under both.

The chapters report these verdicts as computed, beside the paper's statement; they do not pin
them, since a verdict is a finding. What a chapter asserts is that the rule ran on something:
judging a claim on no task raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from nopelib.core.stats import t_half_width

LEARNED_AT = 0.9  # exact match on the whole test split, every seed: the task is learned
ALPHA = 0.05  # error of each "holds" statement; family-wise error of a family's "fails"
CHANCE = 0.5  # adjacency score of random order
KEEPS_AT = 0.8  # the bottom of the paper's layer-1 range (0.8-1.0)
# a run is past its plateau with margin when its learning curve is at LEARNED_AT or above
# from some step on to the end, and that step leaves at least this share of the budget
PLATEAU_TAIL = 0.25
# A task's study is judged once this many of its profile's seeds are in (registered
# 2026-12-05, before any campaign run of the paper's model finished: its verdicts come as seeds
# arrive, each on every seed in; fewer stay "cannot tell", the count shown).
JUDGED_AT_SEEDS = 3

VERDICTS = ("holds", "fails", "cannot tell")
REVISED = "revised"  # one-sided tests, no correction for "holds", Bonferroni for "fails"
REGISTERED = "registered"  # the 4 x 96 study's rules: two-sided intervals, Bonferroni on both
RULES = {
    REVISED: "one-sided t bounds; holds: every test at level ALPHA (intersection-union, no "
             "correction); fails: any test at level ALPHA / m (Bonferroni over the reading)",
    REGISTERED: "two-sided t intervals at 1 - ALPHA / m for every test (Bonferroni over the "
                "reading), holds and fails alike",
}


def is_learned(metrics: Sequence[Mapping], n_test: int) -> bool:
    """The book's learnedness criterion for one task: every seed's run (its metrics, with
    ``accuracy`` and ``n_test``) reaches ``LEARNED_AT`` exact match on the whole test split
    of ``n_test`` examples. Claims about trained models are made on learned tasks only."""
    return bool(metrics) and all(m["accuracy"] >= LEARNED_AT and m["n_test"] == n_test
                                 for m in metrics)


def check_rules(rules: str) -> str:
    """``rules`` if it names a rule set of RULES; a ValueError naming the allowed ones."""
    if rules not in RULES:
        raise ValueError(f"rules={rules!r} is unknown; allowed: {sorted(RULES)}")
    return rules


def test_verdict(lo: float, hi: float, bound: float, above: bool) -> str:
    """A test's verdict from its bounds ``lo`` <= ``hi``: the claim says the statistic is
    above ``bound`` (``above``) or below it. The bound on the claim's side decides "holds",
    the other one "fails"."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "cannot tell"
    if (lo > bound) if above else (hi < bound):
        return "holds"
    if (hi < bound) if above else (lo > bound):
        return "fails"
    return "cannot tell"


def side_levels(m: int, alpha: float = ALPHA, rules: str = REVISED) -> tuple[float, float]:
    """The one-sided confidence levels of a test's bound on the claim's side ("holds") and
    on the other side ("fails"), in a family of ``m`` tests under ``rules``."""
    check_rules(rules)
    if type(m) is not int or m < 1:
        raise ValueError(f"m={m!r} must be a positive integer (the family's tests)")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r} must be in (0, 0.5)")
    if rules == REGISTERED:  # a two-sided interval at 1 - alpha / m: alpha / 2m per side
        return 1 - alpha / (2 * m), 1 - alpha / (2 * m)
    return 1 - alpha, 1 - alpha / m


def judge(tests: pd.DataFrame, alpha: float = ALPHA, rules: str = REVISED) -> pd.DataFrame:
    """Bounds and verdicts for one family of tests. ``tests`` has one row per (test, unit):
    columns ``test`` (a label; the other non-value columns are kept), ``value``, ``bound``,
    ``above``. Returns one row per test: mean, lo, hi (the two one-sided bounds), n, m (the
    family's tests), holds_level, fails_level, verdict."""
    keys = [c for c in tests.columns if c not in ("value", "unit")]
    groups = tests.groupby(keys, sort=False)
    m = groups.ngroups
    if m == 0:
        raise ValueError("judge: the family holds no test")
    holds_level, fails_level = side_levels(m, alpha, rules)
    rows = []
    for key, group in groups:
        row = dict(zip(keys, key))
        values = group["value"].to_numpy()
        mean, h_holds = t_half_width(values, holds_level)
        _, h_fails = t_half_width(values, fails_level)
        # the claim's side is decided at holds_level, the other side at fails_level
        lo, hi = ((mean - h_holds, mean + h_fails) if row["above"]
                  else (mean - h_fails, mean + h_holds))
        row.update(mean=mean, lo=lo, hi=hi, n=len(group), m=m, holds_level=holds_level,
                   fails_level=fails_level,
                   verdict=test_verdict(lo, hi, row["bound"], bool(row["above"])))
        rows.append(row)
    return pd.DataFrame(rows)


def combine(verdicts: Sequence[str]) -> str:
    """A reading's verdict on one group from its tests' verdicts: "holds" when every test
    holds (intersection-union), "fails" when any fails, else "cannot tell"."""
    verdicts = list(verdicts)
    if not verdicts:
        raise ValueError("combine: no test verdicts")
    if all(v == "holds" for v in verdicts):
        return "holds"
    return "fails" if "fails" in verdicts else "cannot tell"


# ---------------------------------------------------------------------------------------------
# trained models


def past_plateau(steps: Sequence[int], accuracy: Sequence[float], budget: int) -> dict:
    """Where one run's learning curve reached LEARNED_AT for good, and the margin after it:
    ``learned_from`` (first curve step from which every later point is >= LEARNED_AT, or
    None), ``tail`` (share of ``budget`` after that step) and ``with_margin`` (the tail is at
    least PLATEAU_TAIL)."""
    acc = np.asarray(accuracy, dtype=np.float64)
    if len(steps) != len(acc) or not len(acc):
        raise ValueError("past_plateau: steps and accuracy must be non-empty and of one length")
    below = np.flatnonzero(acc < LEARNED_AT)
    start = 0 if not len(below) else below[-1] + 1
    if start == len(acc):
        return dict(learned_from=None, tail=0.0, with_margin=False)
    tail = 1 - steps[start] / budget
    return dict(learned_from=int(steps[start]), tail=float(tail),
                with_margin=bool(tail >= PLATEAU_TAIL))


def learned_phase(steps: Sequence[int], accuracy: Sequence[float],
                  scores: Sequence[Sequence[float]], budget: int) -> np.ndarray:
    """One run's adjacency scores [L+1] averaged over its learned phase: the curve points
    from the step where its learning curve reached LEARNED_AT for good (``past_plateau``) to
    the end. Raises for a run that never got there: it has no learned phase to judge."""
    start = past_plateau(steps, accuracy, budget)["learned_from"]
    if start is None:
        raise ValueError("learned_phase: the run's learning curve never stays at "
                         f"{LEARNED_AT} or above; it has no learned phase")
    rows = np.asarray(scores, dtype=np.float64)  # [points, L+1]
    if rows.ndim != 2 or len(rows) != len(steps):
        raise ValueError(f"learned_phase: scores {rows.shape} must be one row per curve step "
                         f"({len(steps)})")
    return rows[np.asarray(steps) >= start].mean(0)


# The trained-model claims (the paper's results 2 and 4) as readings, each a family of tests on
# per-seed adjacency scores [seeds, L+1] of the same fixed inputs: at initialisation
# (``before``), after training (``after``), and averaged over the learned phase of the run's
# trajectory (``phase``, by ``learned_phase``): "keeps" and "weakens" describe training, so
# they are read along the trajectory, not at its last step.
AFTER_TRAINING = "2: the pattern holds after training"
FIRST_KEEP = "4: the first layers keep it"
LATER_WEAKEN = "4: later layers weaken it"
TRAINED_CLAIMS = (
    (AFTER_TRAINING, f"every layer above chance ({CHANCE:g})"),
    (AFTER_TRAINING, "every layer above the format's layer 0"),
    (FIRST_KEEP, f"layer 1 at least {KEEPS_AT:g} through the learned phase"),
    (LATER_WEAKEN, "last layer below layer 1 through the learned phase"),
    (LATER_WEAKEN, "last layer below its initialisation through the learned phase"),
    (LATER_WEAKEN, "falls gradually: slope over layers 1..L and over 1..L-1 below 0"),
)
# "Gradually" (registered 2026-12-05, before any run of the paper-model campaign finished; the
# paper model's reversal seeds, its addition seed 1 and the whole 4 x 96 study came before it):
# per seed, the least-squares slope of the learned-phase score over layers 1..L is below 0
# (the score falls with depth), and so is the slope over layers 1..L-1 (it falls before the
# last layer: a flat stack with one drop at the top is not "gradual"). Both tests of a task
# must hold (intersection-union). A model of fewer than 3 layers has no such reading.
GRADUAL_MIN_LAYERS = 3


def layer_slope(scores: np.ndarray, top: int) -> np.ndarray:
    """Per seed, the least-squares slope of ``scores`` [seeds, L+1] over layers 1..``top``:
    score per layer of depth (negative where the score falls with depth)."""
    layers = np.arange(1, top + 1, dtype=np.float64)
    if len(layers) < 2:
        raise ValueError(f"top={top!r}: a slope needs layers 1..top with top >= 2")
    centred = layers - layers.mean()
    return (scores[:, 1: top + 1] * centred).sum(1) / (centred ** 2).sum()


def _trained_tests(task: str, before: np.ndarray, after: np.ndarray,
                   phase: np.ndarray) -> list[dict]:
    last = after.shape[1] - 1
    layers = range(1, last + 1)
    # (claim, reading, layer, statistic per seed [seeds], bound); every claim says "above"
    tests = [(*TRAINED_CLAIMS[0], i, after[:, i], CHANCE) for i in layers]
    tests += [(*TRAINED_CLAIMS[1], i, after[:, i] - after[:, 0], 0.0) for i in layers]
    tests += [(*TRAINED_CLAIMS[2], 1, phase[:, 1], KEEPS_AT),
              (*TRAINED_CLAIMS[3], last, phase[:, 1] - phase[:, last], 0.0),
              (*TRAINED_CLAIMS[4], last, before[:, last] - phase[:, last], 0.0)]
    if last >= GRADUAL_MIN_LAYERS:  # "above 0" on minus the slope: the score falls
        tests += [(*TRAINED_CLAIMS[5], top, -layer_slope(phase, top), 0.0)
                  for top in (last, last - 1)]
    return [dict(claim=claim, reading=reading, task=task, layer=layer, bound=bound,
                 above=True, unit=unit, value=value)
            for claim, reading, layer, values, bound in tests
            for unit, value in enumerate(values)]


def trained_claims(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                   phase: Mapping[str, np.ndarray], tasks: Sequence[str],
                   alpha: float = ALPHA, rules: str = REVISED) -> pd.DataFrame:
    """Every test of the trained-model claims on ``tasks`` (the learned tasks of the claim
    set): per-seed adjacency scores [seeds, L+1] at initialisation, after training and over
    the learned phase, one family per reading over tasks and layers, judged under ``rules``.
    One row per test: claim, reading, task, layer, the statistic's mean, its bounds (lo, hi),
    n seeds, m, the two sides' levels and the verdict. Raises when ``tasks`` is empty: a
    claim judged on nothing has not been tested."""
    check_rules(rules)
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no learned task in the claim set: the trained-model claims have "
                         "nothing to be judged on (see which runs did not learn)")
    rows = []
    for task in tasks:
        b, a, p = (np.asarray(x[task], float) for x in (before, after, phase))
        if a.ndim != 2 or not a.shape == b.shape == p.shape or a.shape[1] < 2:
            raise ValueError(f"{task}: scores before {b.shape}, after {a.shape} and over the "
                             f"learned phase {p.shape} must be [seeds, layers + 1] of one "
                             "shape")
        rows += _trained_tests(task, b, a, p)
    tests = pd.DataFrame(rows)
    return pd.concat([judge(group, alpha, rules)
                      for _, group in tests.groupby("reading", sort=False)], ignore_index=True)


def claim_table(tests: pd.DataFrame, by: str = "task") -> pd.DataFrame:
    """One verdict per (claim, reading, ``by``) from the tests of ``trained_claims`` (by
    task) or ``init_claims`` (by group), with the weakest test's bounds (the one nearest to
    failing) as the evidence shown."""
    rows = []
    for (claim, reading, task), group in tests.groupby(["claim", "reading", by], sort=False):
        margin = np.where(group["above"], group["lo"] - group["bound"],
                          group["bound"] - group["hi"])
        worst = group.iloc[int(np.nanargmin(margin)) if np.isfinite(margin).any() else 0]
        rows.append(dict(claim=claim, reading=reading, **{by: task},
                         verdict=combine(group["verdict"]), tests=len(group),
                         n=int(group["n"].min()), weakest_layer=int(worst["layer"]),
                         mean=worst["mean"], lo=worst["lo"], hi=worst["hi"],
                         bound=worst["bound"], above=bool(worst["above"]),
                         m=int(worst["m"]), holds_level=worst["holds_level"],
                         fails_level=worst["fails_level"]))
    return pd.DataFrame(rows)


def overall(verdicts: Sequence[str]) -> str:
    """A reading's verdict over everything it is judged on (tasks, configurations): the
    scorecard's "replicates" (holds on all), "fails" (fails where it is not undecided),
    "partly" (holds on some, fails on others) or "cannot tell"; "untested" on nothing."""
    verdicts = list(verdicts)
    if not verdicts:
        return "untested"
    if all(v == "holds" for v in verdicts):
        return "replicates"
    if "fails" in verdicts:
        return "partly" if "holds" in verdicts else "fails"
    return "cannot tell"



def judge_families(tests: list[tuple], alpha: float, rules: str = REVISED) -> pd.DataFrame:
    """``judge`` each (claim, reading) family of (claim, reading, group, layer, values per
    seed, bound, above) tests."""
    rows = [dict(claim=claim, reading=reading, group=group, layer=layer, bound=bound,
                 above=above, unit=unit, value=float(value))
            for claim, reading, group, layer, values, bound, above in tests
            for unit, value in enumerate(np.asarray(values, float))]
    frame = pd.DataFrame(rows)
    return pd.concat([judge(g, alpha, rules)
                      for _, g in frame.groupby(["claim", "reading"], sort=False)],
                     ignore_index=True)
