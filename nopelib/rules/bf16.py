"""The precision check's rule: whether bf16 autocast changes what the verdicts read.

Fixed before the check ran (``nopelib.studies.precision`` runs it; the committed file is
recomputed from its runs by ``nopelib.results.files``): the same seeds are trained under
float32 and bf16 autocast for the first steps, and the gap between the precisions is set
beside the gap between two float32 seeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

RULE = ("the same seeds under float32 and bf16 autocast for the first steps; per task, "
        "quantity (each layer's adjacency score, validation exact match) and seed, the "
        "precision gap is the mean over curve points of |bf16 - fp32|, the seed gap the same "
        "mean between two float32 seeds; 'no change' when the largest precision gap is at "
        "most the median seed gap for every task and quantity, else 'changes' (keep float32)")


def _quantities(run: dict) -> dict[str, np.ndarray]:
    """Every quantity the rule compares, along the run's curve points: each layer's score
    and the validation exact match."""
    scores = np.asarray(run["curve"]["scores"], float)  # [points, L+1]
    out = {f"layer {layer}": scores[:, layer] for layer in range(scores.shape[1])}
    out["val exact match"] = np.asarray(run["curve"]["val_accuracy"], float)
    return out


def gaps(runs: Sequence[dict]) -> pd.DataFrame:
    """The rule's table: per task and quantity, the largest precision gap over seeds, the
    median seed gap over float32 pairs, and the verdict ("no change" or "changes")."""
    by = {(r["task"], r["seed"], r["precision"]): _quantities(r) for r in runs}
    rows = []
    for task in dict.fromkeys(r["task"] for r in runs):
        seeds = sorted({s for t, s, p in by if t == task and p == "float32"
                        and (t, s, "bfloat16") in by})
        if len(seeds) < 2:
            raise ValueError(f"{task}: the rule needs >= 2 seeds run in both precisions, "
                             f"has {seeds}")
        for name in by[task, seeds[0], "float32"]:
            fp = {s: by[task, s, "float32"][name] for s in seeds}
            bf = {s: by[task, s, "bfloat16"][name] for s in seeds}
            if len({len(v) for v in (*fp.values(), *bf.values())}) != 1:
                raise ValueError(f"{task}: the runs' curves have different lengths")
            precision = max(float(np.abs(bf[s] - fp[s]).mean()) for s in seeds)
            seed = float(np.median([np.abs(fp[a] - fp[b]).mean()
                                    for a, b in itertools.combinations(seeds, 2)]))
            rows.append(dict(task=task, quantity=name, precision_gap=precision,
                             seed_gap=seed, n_seeds=len(seeds),
                             verdict="no change" if precision <= seed else "changes"))
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> str:
    """The check's verdict over every task and quantity of ``gaps``."""
    if table.empty:
        raise ValueError("verdict: no gaps to judge")
    return "no change" if (table.verdict == "no change").all() else "changes"
