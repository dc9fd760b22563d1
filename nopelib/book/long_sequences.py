"""The long-sequence chapter's own parts: its parameters' rules, its spec, its figures.

The chapter (``book/long_sequences.ipynb``) follows the adjacency pattern of random NoPE models
to thousands of positions. Its spec ``CHAPTER`` (``chapters.LONG_SEQUENCES`` in the registry)
holds the defaults of its parameters cell and the rules ``RULES``, built from the study
command's own (``nopelib.studies.long_context``: widths, seeds and their joint cost, windows);
the figures are the ones only this chapter draws: how often row i orders its neighbour first
against distance, and the resolution d*(i) against i. The score against length, which the text
chapter draws too, is ``nopelib.book.viz.score_lengths``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from nopelib.book.viz import DEFAULT_COLOURS
from nopelib.core.chapter import ChapterSpec
from nopelib.core.params import Float, Int
from nopelib.studies import long_context as lc
from nopelib.studies.long_context import model_name as _label

# The rules of the chapter's parameters. Upper bounds: rough costs on the 2-core development
# machine; the reason is in each message.
RULES = {
    "T": Int(min=lc.MIN_OCTAVE, max=8192, why="a [7, T, T] float32 similarity tensor per model: "
             "1.9 GB and ~2 min per model at 8,192"),
    "widths": lc.WIDTHS,
    "seeds": lc.SEEDS.costing(lc.joint_cost()),
    "windows": lc.windows_rule(),
    "layer": Int(min=0, max=6, why="the base model has 6 blocks"),
    "level": Float(min=0.5, max=1.0, open=True),
}

CHAPTER = ChapterSpec("long_sequences", RULES, dict(
    T=1024,  # live sequence length (the committed study runs to 8,192)
    widths=[192, 384, 768],  # widths of the live 6-layer models (divisible by the 6 heads)
    seeds=[0, 1, 2],  # model seeds: one model and one sequence each, the unit
    windows=[64],  # sliding windows, at the base width
    layer=1,  # layer of the order-curve figure (the theory's layer is 1)
    level=0.95,  # level of the pointwise seed intervals
))


# ---------------------------------------------------------------------------------------------
# the figures only this chapter draws


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
