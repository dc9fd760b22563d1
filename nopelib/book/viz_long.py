"""The adjacency score against length, the figure the long-sequence and text chapters share.

The long-sequence chapter's own figures (the order curves, the resolution d*(i)) are
``nopelib.book.long_sequences``'; the table this one draws is ``long_context.score_table``'s.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from nopelib.book.viz import DEFAULT_COLOURS
from nopelib.studies.long_context import model_name as _label


LAYER_DASHES = ("solid", "dot", "dashdot", "longdash", "longdashdot")  # one per layer shown


def score_lengths(table: pd.DataFrame, layers: list[int], title: str) -> go.Figure:
    """The adjacency score against length (log axis) per model and layer in ``layers``: the
    seed mean with its t interval (a line style per layer), and block 1's prediction (thin
    dashes) where the table has one. ``table``: ``long_context.score_table``."""
    fig = go.Figure()
    models = table[["n_embd", "window"]].drop_duplicates().itertuples(index=False)
    for n, (width, window) in enumerate(models):
        colour = DEFAULT_COLOURS[n % len(DEFAULT_COLOURS)]
        mine = table[(table.n_embd == width) & (table.window == window)]
        for i, layer in enumerate(layers):
            dash = LAYER_DASHES[i % len(LAYER_DASHES)]
            g = mine[mine.layer == layer].sort_values("length")
            fig.add_trace(go.Scatter(
                x=g.length, y=g.score, mode="lines+markers", line=dict(color=colour, dash=dash),
                name=f"{_label(width, window)}, layer {layer}",
                error_y=dict(type="data", symmetric=False, array=g.hi - g.score,
                             arrayminus=g.score - g.lo)))
        g = mine[mine.layer == 1].sort_values("length")
        if g.predicted.isna().all():
            continue
        fig.add_trace(go.Scatter(x=g.length, y=g.predicted, mode="lines",
                                 line=dict(color=colour, dash="dash", width=1),
                                 name=f"{_label(width, window)}, layer 1 predicted"))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="random order (0.5)")
    fig.update_xaxes(type="log", title="sequence length (tokens)")
    fig.update_layout(title=title, yaxis_title="adjacency score", height=460)
    return fig


