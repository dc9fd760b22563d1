"""Outcomes against the spread over seeds: what a chapter may assert, and by how much.

A chapter asserts an outcome only where its margin exceeds MARGIN_SDS standard deviations
over seeds; these helpers give each seed's value and the margin of a bound or a difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


MARGIN_SDS = 1.0  # a chapter asserts an outcome only where its margin exceeds this many sds


SIDES = ("above", "below", "within")


def per_seed(scores: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Scores with columns ``by``, ``seed``, ``layer``, ``score`` (``task_scores``,
    ``config_scores``) as one row per (group of ``by``, seed) and one column per layer, each
    seed's rows (tasks, configurations) averaged first."""
    return scores.groupby([*by, "seed", "layer"]).score.mean().unstack("layer")


def seed_margins(values: pd.Series | pd.DataFrame, bound: float, side: str = "above",
                 units: Sequence[str] = ("seed",)) -> pd.DataFrame:
    """How far each statistic's mean over units lies on the claimed side of ``bound``, in
    units of its spread over them: what decides whether a chapter may assert an outcome.

    ``values`` holds one value per unit: index levels ``units`` (the model seed; a sequence
    is ``("seed", "seq")``), any other index levels and, for a DataFrame, the columns (e.g.
    layers) name the statistics; missing values are dropped. ``side``: the mean is "above"
    ``bound``, "below" it, or "within" it of zero (|mean| <= ``bound``; centre the values
    first). One row per statistic: ``mean``, ``sd`` (ddof=1) and ``n`` over units,
    ``margin`` (positive on the claimed side), ``in_sd`` (margin / sd) and ``verdict``:
    "holds" where the margin exceeds MARGIN_SDS sds, "fails" where it falls short of the
    bound by as much, else "cannot tell" (always with fewer than two units)."""
    if side not in SIDES:
        raise ValueError(f"side={side!r} must be one of {SIDES}")
    long = values.stack() if isinstance(values, pd.DataFrame) else values
    names = [n if n is not None else "statistic" for n in long.index.names]
    long = long.set_axis(long.index.set_names(names)).dropna()
    if missing := [u for u in units if u not in names]:
        raise ValueError(f"values have no index level {missing} (levels: {names})")
    if long.empty:
        raise ValueError("seed_margins: no values: an outcome on nothing is not tested")
    keys = [n for n in names if n not in units]
    grouped = long.groupby(keys, sort=False) if keys else long.groupby(lambda _: "all")
    out = grouped.agg(["mean", "std", "count"]).rename(columns={"std": "sd", "count": "n"})
    out["margin"] = {"above": out["mean"] - bound, "below": bound - out["mean"],
                     "within": bound - out["mean"].abs()}[side]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["in_sd"] = out["margin"] / out["sd"]
    spread = MARGIN_SDS * out["sd"]  # nan with one unit: neither side is decided
    out["verdict"] = np.select([out["margin"] > spread, out["margin"] < -spread],
                               ["holds", "fails"], "cannot tell")
    return out


def pairwise_differences(values: pd.Series | pd.DataFrame,
                         level: str) -> pd.Series | pd.DataFrame:
    """Every pair a < b of the values of index level ``level`` (e.g. the means of the
    initialisation study), per unit: ``values`` at a minus ``values`` at b, the other index
    levels (the seed among them) kept, indexed by ``level`` + "_a", ``level`` + "_b" first.
    A paired comparison where one seed draws the same deviations for every value of
    ``level``; the largest |mean| over the pairs is the spread (max - min) of the means."""
    keys = sorted(values.index.get_level_values(level).unique())
    if len(keys) < 2:
        raise ValueError(f"{level} takes {len(keys)} value(s); a pair needs two")
    pairs = {(a, b): values.xs(a, level=level) - values.xs(b, level=level)
             for i, a in enumerate(keys) for b in keys[i + 1:]}
    return pd.concat(pairs, names=[f"{level}_a", f"{level}_b"])
