"""Plotly figures of the long-sequence chapter.

Plotly figures of the long-sequence chapter: the adjacency score against length, how often
row i orders its neighbour first against distance, and the resolution d*(i) against i. The
renderer and the shared colours are ``nopelib.book.viz``'s; the tables are
``nopelib.studies.long_context``'s.
"""

from __future__ import annotations

import numpy as np
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


def order_curves(order: pd.DataFrame, width: int, window: int, layer: int, level: float,
                 title: str) -> go.Figure:
    """How often row i ranks its neighbour above position i - d, against d / i (log axis),
    one line per octave of rows: the seed mean (solid, markers) and, on layer 1, block 1's
    prediction (dashed). ``order``: ``long_context.run_frames``'s "order" frame."""
    mine = order[(order.n_embd == width) & (order.window == window) & (order.layer == layer)]
    per_d = mine.groupby(["octave", "d"]).agg(measured=("measured", "mean"),
                                               predicted=("predicted", "mean")).reset_index()
    fig = go.Figure()
    for n, (octave, g) in enumerate(per_d.groupby("octave")):
        colour = DEFAULT_COLOURS[n % len(DEFAULT_COLOURS)]
        x = g.d / (0.75 * octave)  # the octave [a/2, a) by its middle row
        fig.add_trace(go.Scatter(x=x, y=g.measured, mode="lines+markers",
                                 line=dict(color=colour), name=f"i in [{octave // 2}, {octave})"))
        if layer == 1:
            fig.add_trace(go.Scatter(x=x, y=g.predicted, mode="lines", showlegend=False,
                                     line=dict(color=colour, dash="dash", width=1)))
    fig.add_hline(y=level, line_dash="dot", annotation_text=f"resolved ({level:g})")
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="chance")
    fig.update_xaxes(type="log", title="distance d as a share of the position i")
    fig.update_layout(title=title, yaxis_title="P(neighbour ranked above i - d)", height=440)
    return fig


def resolution_lines(res: pd.DataFrame, layer: int, title: str) -> go.Figure:
    """d*(i) / i against i (log axis) per model on ``layer``: the seed mean's d* with the
    interval read from the seed band (markers; a missing marker is "unresolved"), and block
    1's prediction (dashed). ``res``: ``long_context.resolution``."""
    fig = go.Figure()
    mine = res[res.layer == layer]
    models = mine[["n_embd", "window"]].drop_duplicates().itertuples(index=False)
    for n, (width, window) in enumerate(models):
        colour = DEFAULT_COLOURS[n % len(DEFAULT_COLOURS)]
        g = mine[(mine.n_embd == width) & (mine.window == window)].sort_values("octave")
        i = 0.75 * g.octave
        hi = g["d_hi / i"].fillna(0.5)  # unresolved at the upper end: to the largest distance
        fig.add_trace(go.Scatter(
            x=i, y=g["d_star / i"], mode="markers+lines", line=dict(color=colour),
            name=_label(width, window),
            error_y=dict(type="data", symmetric=False, array=np.maximum(hi - g["d_star / i"], 0),
                         arrayminus=np.maximum(g["d_star / i"] - g["d_lo / i"], 0))))
        if layer == 1:
            fig.add_trace(go.Scatter(x=i, y=g["predicted / i"], mode="lines",
                                     line=dict(color=colour, dash="dash"),
                                     name=f"{_label(width, window)} predicted"))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="largest distance tried (i/2)")
    fig.update_xaxes(type="log", title="position i")
    fig.update_layout(title=title, yaxis_title="d*(i) / i", yaxis_range=[0, 0.7], height=440)
    return fig
