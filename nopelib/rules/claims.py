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
from nopelib.core.stats import MIN_UNITS, t_half_width

LEARNED_AT = 0.9  # exact match on the whole test split, every seed: the task is learned
ALPHA = 0.05  # error of each "holds" statement; family-wise error of a family's "fails"
CHANCE = 0.5  # adjacency score of random order
KEEPS_AT = 0.8  # the bottom of the paper's layer-1 range (0.8-1.0)
# a run is past its plateau with margin when its learning curve is at LEARNED_AT or above
# from some step on to the end, and that step leaves at least this share of the budget
PLATEAU_TAIL = 0.25

VERDICTS = ("holds", "fails", "cannot tell")
REVISED = "revised"  # one-sided tests, no correction for "holds", Bonferroni for "fails"
REGISTERED = "registered"  # the 4 x 96 study's rules: two-sided intervals, Bonferroni on both
RULES = {
    REVISED: "one-sided t bounds; holds: every test at level ALPHA (intersection-union, no "
             "correction); fails: any test at level ALPHA / m (Bonferroni over the reading)",
    REGISTERED: "two-sided t intervals at 1 - ALPHA / m for every test (Bonferroni over the "
                "reading), holds and fails alike",
}


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


# The trained-model claims (PAPER.md, results 2 and 4) as readings, each a family of tests on
# per-seed adjacency scores [seeds, L+1] of the same fixed inputs: at initialisation
# (``before``), after training (``after``), and averaged over the learned phase of the run's
# trajectory (``phase``, by ``learned_phase``): "keeps" and "weakens" describe training, so
# they are read along the trajectory, not at its last step.
TRAINED_CLAIMS = (
    ("2: the pattern holds after training", "every layer above chance (0.5)"),
    ("2: the pattern holds after training", "every layer above the format's layer 0"),
    ("4: the first layers keep it", "layer 1 at least 0.8 through the learned phase"),
    ("4: later layers weaken it", "last layer below layer 1 through the learned phase"),
    ("4: later layers weaken it", "last layer below its initialisation through the learned phase"),
)


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


# ---------------------------------------------------------------------------------------------
# random initialisation (PAPER.md, results 1 to 3)

NEAR_CHANCE = 0.1  # "layer 0 is about 0.5", read as: within this of chance
GONE = 0.1  # "gone": a layer within this of the same model's layer 0
LITTLE = 0.05  # "little effect" of the mean: the spec's bound on the shift of a score

# Each a family of tests on per-seed scores of random models (the unit is the model seed,
# its task inputs averaged first); groups: the base model (result 1), each task and each
# (depth, width) of the grid (result 2), each (mean, sigma) of the initialisation study in the
# token-embedding reading (result 3). A two-sided reading ("within") is two one-sided tests.
INIT_CLAIMS = (
    ("1: layer 0 is about 0.5", "layer 0 within 0.1 of 0.5"),
    ("1: layer 1 jumps to 0.8-1.0", "layer 1 at least 0.8"),
    ("2: the pattern holds at initialisation, every task", "every layer at least 0.8"),
    ("2: the pattern holds at initialisation, 6-24 layers x 192-768 wide",
     "every layer at least 0.8"),
    ("3: sigma <= 0.02 keeps the pattern", "every layer at least 0.8, every mean"),
    ("3: sigma = 0.2 removes it", "every layer within 0.1 of layer 0, every mean"),
    ("3: the means 0, 4, 8 matter little", "every layer within 0.05 of mean 0's"),
)


def _per_seed(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Scores [group..., seed, layer] -> one column per layer, each seed's rows averaged."""
    return frame.groupby([*by, "seed", "layer"]).score.mean().unstack("layer")


def _init_tests(base: pd.DataFrame, init: pd.DataFrame, grid: pd.DataFrame) -> list[tuple]:
    """(claim, reading, group, layer, values per seed, bound, above) for every test."""
    tests = []
    mean_model = _per_seed(base.assign(group="base model"), ["group"]).loc["base model"]
    for bound, above in ((CHANCE - NEAR_CHANCE, True), (CHANCE + NEAR_CHANCE, False)):
        tests.append((*INIT_CLAIMS[0], "base model", 0, mean_model[0], bound, above))
    tests.append((*INIT_CLAIMS[1], "base model", 1, mean_model[1], KEEPS_AT, True))
    for task, wide in _per_seed(base, ["task"]).groupby(level="task", sort=False):
        tests += [(*INIT_CLAIMS[2], task, i, wide[i], KEEPS_AT, True) for i in wide if i]
    for (depth, width), wide in _per_seed(grid, ["n_layer", "n_embd"]).groupby(
            level=["n_layer", "n_embd"], sort=False):
        name = f"{depth} x {width}"
        tests += [(*INIT_CLAIMS[3], name, i, wide[i].dropna(), KEEPS_AT, True)
                  for i in range(1, depth + 1)]
    emb = _per_seed(init[init.init_target == "embedding"], ["init_mean", "init_std"])
    stds = emb.index.get_level_values("init_std")
    if not (stds <= 0.02).any() or not (stds >= 0.2).any():
        raise ValueError("init_claims: the initialisation study needs sigma <= 0.02 and "
                         f"sigma >= 0.2, not {sorted(set(stds))}")
    for (mu, sigma), wide in emb.groupby(level=["init_mean", "init_std"], sort=False):
        name, layers = f"mean {mu:g}, sigma {sigma:g}", [i for i in wide if i]
        if sigma <= 0.02:
            tests += [(*INIT_CLAIMS[4], name, i, wide[i], KEEPS_AT, True) for i in layers]
        if sigma >= 0.2:
            tests += [(*INIT_CLAIMS[5], name, i, wide[i] - wide[0], GONE, False)
                      for i in layers]
        if sigma <= 0.02 and mu != 0:
            zero = emb.loc[(0.0, sigma)]
            for bound, above in ((-LITTLE, True), (LITTLE, False)):
                tests += [(*INIT_CLAIMS[6], name, i, wide[i].droplevel([0, 1]) - zero[i],
                           bound, above) for i in layers]
    return tests


def init_claims(base: pd.DataFrame, init: pd.DataFrame, grid: pd.DataFrame,
                alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the random-initialisation claims: ``base`` is the base model's scores
    per task (``analysis.task_scores``: seed, task, layer, score), ``init`` the
    initialisation study's and ``grid`` the depth-and-width grid's (``analysis.
    config_scores``). One family per reading; one row per test: claim, reading, group,
    layer, bound, above, mean, bounds (lo, hi), n seeds, m, the sides' levels, verdict."""
    return _judge_families(_init_tests(base, init, grid), alpha)


def _judge_families(tests: list[tuple], alpha: float, rules: str = REVISED) -> pd.DataFrame:
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


def chance_control(scores: pd.DataFrame, name: str = "bidirectional",
                   alpha: float = ALPHA) -> pd.DataFrame:
    """A control that must show no pattern: every layer's per-seed score (``analysis.
    config_scores`` of one configuration) within NEAR_CHANCE of 0.5, as two one-sided tests
    per layer in one family; rows as ``init_claims``'s."""
    wide = _per_seed(scores.assign(group=name), ["group"]).loc[name]  # [seed, layer]
    reading = f"every layer within {NEAR_CHANCE:g} of 0.5"
    return _judge_families([(f"control: {name}", reading, name, i, wide[i], bound, above)
                            for i in wide
                            for bound, above in ((CHANCE - NEAR_CHANCE, True),
                                                 (CHANCE + NEAR_CHANCE, False))], alpha)


FINDS_AT = 0.9  # a positive control's probe "finds position" when its R reaches this
POSITIVE_CONTROL = dict(pos_encoding="learned")  # GPTConfig override: see positive_control


def positive_control(table: pd.DataFrame) -> pd.DataFrame:
    """The probes' positive control: one model with a position encoding of the token
    embedding's amplitude (``POSITIVE_CONTROL``: a learned position embedding at nanoGPT's
    initialisation, N(0, 0.02^2) like the base model's tokens), probed as the NoPE models
    are. Per (layer, feature set) its R against FINDS_AT: "finds" at or above, "misses"
    below. One model and one probe seed, so a point against a bound (a check that can fail,
    not a test with an interval). ``table``: ``probe_study.random_study`` rows."""
    if table.empty:
        raise ValueError("positive_control: no probe rows")
    out = table.groupby(["layer", "features"])[["r", "nrmse"]].mean()
    return out.assign(bound=FINDS_AT,
                      verdict=np.where(out["r"] >= FINDS_AT, "finds", "misses"))


def prediction_sides(predicted: Sequence[float], measured: Sequence[float],
                     bound: float = KEEPS_AT) -> pd.Series:
    """Per configuration, whether a prediction made before the measurement puts the score on
    the measured mean's side of ``bound`` ("holds") or not ("fails")."""
    pred, meas = np.asarray(predicted, float), np.asarray(measured, float)
    return pd.Series(np.where((pred >= bound) == (meas >= bound), "holds", "fails"))


# ---------------------------------------------------------------------------------------------
# probes (PAPER.md, result 5)

PROBE_CLAIM = "5: cosine features predict position better than variance features"


def probe_claims(diffs: pd.DataFrame, model: str, layers: Sequence[int] | None = None,
                 group: str | None = None, alpha: float = ALPHA) -> pd.DataFrame:
    """The probe claim per layer (and per ``group``, e.g. the task), the model as the unit.

    ``diffs`` holds paired differences cosine minus variance (columns layer, ``model``,
    d_nrmse, d_r; several rows per model, e.g. probe seeds, are averaged first). The claim
    says d_nrmse < 0 and d_r > 0; both metrics at every layer in ``layers`` (default: all
    but 0) and group are one family. One row per (group, layer): each metric's mean,
    interval and verdict, and the layer's verdict ("cosine" where the claim holds on both
    metrics, "variance" where either metric fails it, else "cannot tell")."""
    keys = ([group] if group else []) + ["layer", model]
    per_model = diffs.groupby(keys, as_index=False)[["d_nrmse", "d_r"]].mean()
    if layers is None:
        layers = sorted(layer for layer in per_model["layer"].unique() if layer != 0)
    per_model = per_model[per_model["layer"].isin(list(layers))]
    if per_model.empty:
        raise ValueError(f"probe_claims: no paired differences at layers {list(layers)}")
    tests = pd.concat([
        pd.DataFrame({"group": per_model[group] if group else "", "layer": per_model["layer"],
                      "metric": metric, "bound": 0.0, "above": above,
                      "unit": per_model[model], "value": per_model[f"d_{metric}"]})
        for metric, above in (("nrmse", False), ("r", True))], ignore_index=True)
    judged = judge(tests, alpha)
    rows = []
    for (grp, layer), both in judged.groupby(["group", "layer"], sort=False):
        row = {group: grp} if group else {}
        row["layer"] = layer
        for _, t in both.iterrows():
            m = t["metric"]
            row.update({f"d_{m}": t["mean"], f"d_{m} lo": t["lo"], f"d_{m} hi": t["hi"],
                        f"{m} verdict": t["verdict"]})
        row.update(n=int(both["n"].min()), m=int(both["m"].iloc[0]),
                   holds_level=both["holds_level"].iloc[0],
                   fails_level=both["fails_level"].iloc[0])
        verdict = combine(both["verdict"])
        row["verdict"] = {"holds": "cosine", "fails": "variance"}.get(verdict, verdict)
        rows.append(row)
    return pd.DataFrame(rows).set_index(([group] if group else []) + ["layer"])


# ---------------------------------------------------------------------------------------------
# beyond the paper: long sequences (nopelib.studies.long_context; the criticism of Dawes et al.)

ORDER_LEVEL = 0.75  # a distance is resolved when row i orders it behind i - 1 this often
LONG_CLAIMS = (
    ("beyond: layer 1 in the paper's range at length", "layer 1 at least 0.8 at T tokens"),
    ("beyond: the pattern above chance at length",
     "every layer from 1 above 0.6 at T tokens"),
    ("beyond: neighbours unresolved at length (the criticism)",
     "global attention: rows i in [T/2, T) rank i - 1 above i - T/2 less often than 0.75"),
    ("beyond: a sliding window resolves them (the contrast)",
     "window W: rows i in [T/2, T) rank i - 1 above i - T/2 at least 0.75 of the time"),
)


def long_claims(scores: pd.DataFrame, order: pd.DataFrame,
                alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the long-sequence readings, the model seed as the unit, at the longest
    length T scored. ``scores`` and ``order`` are ``long_context.run_frames``'s frames (one
    sequence per seed). Groups are the models ("<width> wide", with ", window W" for a
    sliding window); each reading one family; rows as ``init_claims``'s. The resolution
    tests read the farthest distance tried (d = T/2, where the averaging theory's gap is
    largest) on the last octave of rows. The criticism is judged on the global-attention
    models only ("holds": unresolved, below ORDER_LEVEL; "fails": resolved); the window
    models, which the criticism itself expects to resolve, are a contrast reading of their
    own ("holds": resolved, above ORDER_LEVEL)."""
    T = int(scores["length"].max())
    last = order[(order.octave == order.octave.max())]
    last = last[last.d == last.d.max()]
    tests = []
    for (width, window), g in scores[scores.length == T].groupby(["n_embd", "window"]):
        name = f"{width} wide" + (f", window {window}" if window else "")  # model_name's
        wide = g.pivot_table(index="seed", columns="layer", values="score")
        tests.append((*LONG_CLAIMS[0], name, 1, wide[1], KEEPS_AT, True))
        tests += [(*LONG_CLAIMS[1], name, i, wide[i], CHANCE + NEAR_CHANCE, True)
                  for i in wide if i]
        mine = last[(last.n_embd == width) & (last.window == window)]
        far = mine.pivot_table(index="seed", columns="layer", values="measured")
        reading, above = (LONG_CLAIMS[3], True) if window else (LONG_CLAIMS[2], False)
        tests += [(*reading, name, i, far[i], ORDER_LEVEL, above) for i in far if i]
    if not tests:
        raise ValueError("long_claims: no scores to judge")
    return _judge_families(tests, alpha)


def resolution_agreement(res: pd.DataFrame) -> pd.Series:
    """Whether the theory's d*(i) lies in the measured interval, per layer-1 row of
    ``long_context.resolution`` (NaN read as "beyond every distance tried"): "agrees",
    "disagrees", or "uninformative" where neither side says anything: the prediction is
    "unresolved" and the measured interval is not finite at both ends (such a cell agrees
    whatever the theory says). Indexed as ``res``'s layer-1 rows; score only the informative
    cells."""
    rows = res[res.layer == 1]
    lo, hi, pred = (rows[c].fillna(np.inf) for c in ("d_lo", "d_hi", "predicted"))
    informative = np.isfinite(pred) | (np.isfinite(lo) & np.isfinite(hi))
    agrees = np.where((lo <= pred) & (pred <= hi), "agrees", "disagrees")
    return pd.Series(np.where(informative, agrees, "uninformative"), index=rows.index)


# ---------------------------------------------------------------------------------------------
# early dynamics: what takes the layer-1 pattern away in the first steps of training

EARLY_STEPS = 1_000  # the window read: the first steps, where the collapse happens
COLLAPSED_BELOW = 0.6  # a run's layer 1 has collapsed once a point in the window is below
FALLS_AT = 0.7  # reported: the first step where layer 1 is below this
CAUSE_VERDICTS = ("explains", "does not explain", "no collapse", "cannot tell")
CAUSE_RULE = (f"per task and ablation, the seed as the unit, on layer 1's score at every "
              f"curve point up to step {EARLY_STEPS:,}: 'explains' when on every seed the "
              f"unablated run falls below {COLLAPSED_BELOW} and the ablated run never falls "
              f"below {KEEPS_AT}; 'does not explain' when on every seed both fall below "
              f"{COLLAPSED_BELOW}; 'no collapse' when no seed's unablated run falls below "
              f"{COLLAPSED_BELOW}; otherwise, or with fewer than 3 seeds or unpaired seeds, "
              f"'cannot tell'")
MIN_CAUSE_SEEDS = 3  # an every-seed rule on fewer seeds says too little


def window_min(steps: Sequence[int], scores: Sequence[float],
               until: int = EARLY_STEPS) -> float:
    """The lowest score at the curve points up to step ``until`` (the initialisation, step 0,
    included when given); NaN when no point lies in the window."""
    steps, scores = np.asarray(steps), np.asarray(scores, dtype=float)
    if steps.shape != scores.shape:
        raise ValueError(f"steps {steps.shape} and scores {scores.shape} differ in shape")
    inside = scores[steps <= until]
    return float(inside.min()) if inside.size else float("nan")


def first_below(steps: Sequence[int], scores: Sequence[float],
                level: float = FALLS_AT) -> int | None:
    """The first curve step whose score is below ``level``, None if none is."""
    below = [int(s) for s, v in zip(steps, scores, strict=True) if v < level]
    return below[0] if below else None


def collapse_cause(base: Mapping[int, float], ablated: Mapping[int, float]) -> str:
    """The verdict of ``CAUSE_RULE`` for one task and ablation. ``base`` and ``ablated`` map
    each seed to its run's ``window_min`` of layer 1 (the unablated run, and the run of the
    same seed with the ablation). Every seed must be in both."""
    if set(base) != set(ablated) or len(base) < MIN_CAUSE_SEEDS:
        return "cannot tell"
    values = [*base.values(), *ablated.values()]
    if not all(np.isfinite(values)):
        return "cannot tell"
    collapsed = [base[s] < COLLAPSED_BELOW for s in base]
    if not any(collapsed):
        return "no collapse"
    if not all(collapsed):
        return "cannot tell"
    if all(ablated[s] >= KEEPS_AT for s in base):
        return "explains"
    if all(ablated[s] < COLLAPSED_BELOW for s in base):
        return "does not explain"
    return "cannot tell"


def largest_gap(steps: Sequence[int], predicted: Sequence[float],
                measured: Sequence[float]) -> tuple[float, int]:
    """The theory's agreement along training: the largest |predicted - measured| over the
    curve points and the step where it is reached."""
    steps = np.asarray(steps)
    predicted, measured = (np.asarray(v, dtype=float) for v in (predicted, measured))
    if not (steps.shape == predicted.shape == measured.shape) or not steps.size:
        raise ValueError("largest_gap needs one predicted and one measured value per step")
    gaps = np.abs(predicted - measured)
    k = int(np.nanargmax(gaps))
    return float(gaps[k]), int(steps[k])


# ---------------------------------------------------------------------------------------------
# beyond the paper: a NoPE language model on real text (nopelib.core.corpus)

TEXT_CONTEXT = 256  # the text models' trained context (characters)
TEXT_LENGTHS = (32, 64, 128, 256, 512, 1024)  # held-out lengths scored: within and beyond it
TEXT_ENCODINGS = ("none", "learned")  # NoPE, and a learned position embedding of its size
TEXT_MIN_SEEDS = 3  # per encoding: the fewest seeds a text verdict is given on
# a score: one layer's adjacency score averaged over TEXT_WINDOWS windows of the test books
# (nopelib.core.corpus.Corpus.windows, seed TEXT_WINDOW_SEED), the same windows for every model
TEXT_WINDOWS = 32
TEXT_WINDOW_SEED = 0
TEXT_CLAIMS = (
    ("beyond: text, layer 1 shows the pattern at initialisation",
     "NoPE, initialised: layer 1 above 0.6 at every length"),
    ("beyond: text, layer 1 shows the pattern after training",
     "NoPE, trained: layer 1 above 0.6 at every length up to the context"),
    ("beyond: text, layer 1 in the paper's range after training",
     "NoPE, trained: layer 1 at least 0.8 at every length up to the context"),
    ("beyond: text, every layer shows the pattern after training",
     "NoPE, trained: every layer from 1 above 0.6 at the context length"),
    ("beyond: text, the pattern reaches past the trained length",
     "NoPE, trained: layer 1 above 0.6 at every length beyond the context"),
    ("beyond: text, later layers weaken it (claim 4)",
     "NoPE, trained: the last layer minus layer 1 below 0 at the context length"),
    ("beyond: text, what NoPE pays",
     "test bits per character, NoPE minus learned position, paired by seed, above 0"),
)
TEXT_RULE = (f"the seed as the unit (at least {TEXT_MIN_SEEDS} per encoding); a score is the "
             "mean adjacency score of one layer over the held-out windows of one length; "
             "one-sided t bounds, each reading one family, holds / fails / cannot tell as for "
             "the paper's claims; the trained readings only when every trained NoPE seed's "
             "test bits per character lies below the unigram baseline (else 'not trained')")


def text_claims(scores: pd.DataFrame, bpc: pd.DataFrame, baseline_bpc: float,
                context: int = TEXT_CONTEXT, alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the text readings (``TEXT_CLAIMS``), fixed before the text study ran.

    ``scores``: one row per (encoding, stage, seed, layer, length) with the mean adjacency
    score over that length's held-out windows (stage "init" or "trained"); ``bpc``: one row
    per (encoding, seed) with ``test_bpc``, the trained model's bits per character on the
    test books; ``baseline_bpc``: the unigram baseline (the test books' bits per character
    under the training books' character frequencies); ``context``: the models' trained
    context, which splits the lengths into within and beyond it. The trained NoPE readings
    are judged only when every trained NoPE seed beats the baseline, and "what NoPE pays"
    only when every seed of both encodings does: otherwise they are reported as "not
    trained" (a model that learned nothing says nothing about trained models). The position
    probes on text are judged by ``probe_claims``, the probes chapter's rule, unchanged.
    Rows as ``init_claims``'s, plus ``note``."""
    need = {"encoding", "stage", "seed", "layer", "length", "score"}
    if not need <= set(scores.columns) or not {"encoding", "seed", "test_bpc"} <= set(bpc):
        raise ValueError(f"text_claims: scores need columns {sorted(need)}, bpc needs "
                         "encoding, seed, test_bpc")
    seeds = {enc: sorted(bpc.loc[bpc.encoding == enc, "seed"]) for enc in TEXT_ENCODINGS}
    if any(len(s) < TEXT_MIN_SEEDS for s in seeds.values()) or seeds["none"] != seeds[
            "learned"]:
        raise ValueError(f"text_claims: seeds per encoding {seeds}; each needs at least "
                         f"{TEXT_MIN_SEEDS}, the same for both (the bits are paired by seed)")
    within = [n for n in TEXT_LENGTHS if n <= context]
    beyond = [n for n in TEXT_LENGTHS if n > context]
    nope = scores[scores.encoding == "none"]
    for stage in ("init", "trained"):
        have = set(nope.loc[nope.stage == stage, "length"])
        if set(TEXT_LENGTHS) - have:
            raise ValueError(f"text_claims: the NoPE {stage} scores lack the lengths "
                             f"{sorted(set(TEXT_LENGTHS) - have)} of TEXT_LENGTHS")

    def wide(stage: str, length: int) -> pd.DataFrame:  # [seed, layer]
        at = nope[(nope.stage == stage) & (nope.length == length)]
        return at.pivot_table(index="seed", columns="layer", values="score")

    floor = CHANCE + NEAR_CHANCE
    init = _text_init_tests(nope)
    trained = [(*TEXT_CLAIMS[1], f"{n} chars", 1, wide("trained", n)[1], floor, True)
               for n in within]
    trained += [(*TEXT_CLAIMS[2], f"{n} chars", 1, wide("trained", n)[1], KEEPS_AT, True)
                for n in within]
    at_context = wide("trained", context)
    trained += [(*TEXT_CLAIMS[3], f"{context} chars", i, at_context[i], floor, True)
                for i in at_context if i]
    trained += [(*TEXT_CLAIMS[4], f"{n} chars", 1, wide("trained", n)[1], floor, True)
                for n in beyond]
    last = int(at_context.columns.max())
    trained.append((*TEXT_CLAIMS[5], f"{context} chars", last,
                    at_context[last] - at_context[1], 0.0, False))
    paired = bpc.pivot_table(index="seed", columns="encoding", values="test_bpc")
    pays = [(*TEXT_CLAIMS[6], "test books", -1, paired["none"] - paired["learned"], 0.0,
             True)]
    below = bpc.assign(ok=bpc.test_bpc < baseline_bpc).groupby("encoding")["ok"].all()
    judged, skipped = init, []
    for tests, learned in ((trained, bool(below["none"])), (pays, bool(below.all()))):
        if learned:
            judged = judged + tests
        else:
            skipped += tests
    table = _judge_families(judged, alpha).assign(note="")
    if skipped:
        table = pd.concat([table, pd.DataFrame([
            dict(claim=c, reading=r, group=g, layer=layer, bound=b, above=a, n=len(v),
                 verdict="cannot tell", note="not trained")
            for c, r, g, layer, v, b, a in skipped])], ignore_index=True)
    return table


def _text_init_tests(nope: pd.DataFrame) -> list[tuple]:
    """The initialisation reading's tests: layer 1 of the NoPE models at every length of
    TEXT_LENGTHS that ``nope`` scores (rows of stage "init")."""
    at = nope[nope.stage == "init"]
    tests = []
    for n in TEXT_LENGTHS:
        wide = at[at.length == n].pivot_table(index="seed", columns="layer", values="score")
        if 1 in wide:
            tests.append((*TEXT_CLAIMS[0], f"{n} chars", 1, wide[1], CHANCE + NEAR_CHANCE,
                          True))
    return tests


def text_init_claims(scores: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The first text reading alone (``TEXT_CLAIMS[0]``, judged as in ``text_claims``): NoPE
    models at initialisation need no training, so a chapter judges it live. ``scores`` as
    ``text_claims``'s, its NoPE init rows read, at least ``TEXT_MIN_SEEDS`` seeds."""
    nope = scores[(scores.encoding == "none") & (scores.stage == "init")]
    if nope.seed.nunique() < TEXT_MIN_SEEDS:
        raise ValueError(f"text_init_claims: {nope.seed.nunique()} seeds; at least "
                         f"{TEXT_MIN_SEEDS}")
    tests = _text_init_tests(nope)
    if not tests:
        raise ValueError(f"text_init_claims: no NoPE init scores at lengths {TEXT_LENGTHS}")
    return _judge_families(tests, alpha)
