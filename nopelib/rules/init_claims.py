"""The paper's claims on random initialisation and on the probes, as decision rules.

The paper's results 1 to 3 (the pattern at initialisation, its layers, the initialisation
study) and result 5 (the probes), with the controls that show a rule can say "fails": each
reading a family of one-sided tests judged by ``claims.judge_families``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from nopelib.rules.claims import ALPHA, CHANCE, KEEPS_AT, combine, judge, judge_families


NEAR_CHANCE = 0.1  # "layer 0 is about 0.5", read as: within this of chance
GONE = 0.1  # "gone": a layer within this of the same model's layer 0
LITTLE = 0.05  # "little effect" of the mean: the spec's bound on the shift of a score

# Each a family of tests on per-seed scores of random models (the unit is the model seed,
# its task inputs averaged first); groups: the base model (result 1), each task and each
# (depth, width) of the grid (result 2), each (mean, sigma) of the initialisation study in the
# token-embedding reading (result 3). A two-sided reading ("within") is two one-sided tests.
# the claims' labels, each typed here once (the scorecard and the chapters import them)
LAYER0 = f"1: layer 0 is about {CHANCE:g}"
LAYER1 = f"1: layer 1 jumps to {KEEPS_AT:g}-1.0"
EVERY_TASK = "2: the pattern holds at initialisation, every task"
THE_GRID = "2: the pattern holds at initialisation, 6-24 layers x 192-768 wide"
SMALL_SIGMA = "3: sigma <= 0.02 keeps the pattern"
LARGE_SIGMA = "3: sigma = 0.2 removes it"
MEANS = "3: the means 0, 4, 8 matter little"
INIT_CLAIMS = (
    (LAYER0, f"layer 0 within {NEAR_CHANCE:g} of {CHANCE:g}"),
    (LAYER1, f"layer 1 at least {KEEPS_AT:g}"),
    (EVERY_TASK, f"every layer at least {KEEPS_AT:g}"),
    (THE_GRID, f"every layer at least {KEEPS_AT:g}"),
    (SMALL_SIGMA, f"every layer at least {KEEPS_AT:g}, every mean"),
    (LARGE_SIGMA, f"every layer within {GONE:g} of layer 0, every mean"),
    (MEANS, f"every layer within {LITTLE:g} of mean 0's"),
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
    return judge_families(_init_tests(base, init, grid), alpha)


def chance_control(scores: pd.DataFrame, name: str = "bidirectional",
                   alpha: float = ALPHA) -> pd.DataFrame:
    """A control that must show no pattern: every layer's per-seed score (``analysis.
    config_scores`` of one configuration) within NEAR_CHANCE of 0.5, as two one-sided tests
    per layer in one family; rows as ``init_claims``'s."""
    wide = _per_seed(scores.assign(group=name), ["group"]).loc[name]  # [seed, layer]
    reading = f"every layer within {NEAR_CHANCE:g} of 0.5"
    return judge_families([(f"control: {name}", reading, name, i, wide[i], bound, above)
                            for i in wide
                            for bound, above in ((CHANCE - NEAR_CHANCE, True),
                                                 (CHANCE + NEAR_CHANCE, False))], alpha)


FINDS_AT = 0.9  # a positive control's probe "finds position" when its R reaches this
# a chance control's probe (layer 0, the bidirectional model) is "at chance" when |R| is
# below this; a shuffled-target or pure-noise probe has "no skill" when its NRMSE is at
# least this (at most 3 % better than predicting the mean position)
CHANCE_R = 0.1
NO_SKILL_NRMSE = 0.97
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
# probes (the paper's result 5)

PROBE_CLAIM = "5: cosine features predict position better than variance features"
# the scorecard's three readings of it, by the models probed
PROBE_RANDOM = "5: random init"
PROBE_RANDOM_MLP = "5: random init, the paper's MLP probe"
PROBE_TRAINED = "5: trained"


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
