"""The early-dynamics chapter's tables, cut to fit the page's column."""

from __future__ import annotations

import pandas as pd

# block 1's quantities that ``early_tables.falls`` gives at initialisation and at the fall
BLOCK1 = ("layer1", "rho", "value_common", "value_axis", "embedding_axis", "entropy")


def fall_parts(falls: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``early_tables.falls`` as three tables of one row per (task, seed) that each fit the
    column: the fall (its step, the lowest and last layer-1 score, the last leading-axis
    share), then block 1 at initialisation, then block 1 at the fall (NaN where layer 1 never
    fell), each named in its header's corner."""
    shown = falls.set_index(["task", "seed"])
    fall = shown[["falls_at", "lowest_layer1", "last_layer1", "last_value_axis"]]
    init = shown[[f"{n}_init" for n in BLOCK1]].set_axis(list(BLOCK1), axis=1)
    return (fall.rename_axis(columns="the fall"),
            init.rename_axis(columns="block 1 at initialisation"),
            shown[list(BLOCK1)].rename_axis(columns="block 1 at the fall"))
