"""Plotly figures of the random-initialisation chapter: the theory beside the measurements.

The closed-form prediction against the measured score per configuration, the score against
length, the explorer of one initialisation, and each claim's margins over seeds. The renderer
and the shared colours are ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from nopelib.book.viz import heatmap_grid


def predicted_vs_measured(table: pd.DataFrame, title: str) -> go.Figure:
    """Measured layer-1 score (mean ± the tolerance's half-width) against the closed-form
    prediction, one point per configuration; ``table`` has columns ``config``, ``predicted``,
    ``measured``, ``tolerance``. The diagonal is perfect prediction; 0.8 is the paper's floor."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=table.predicted, y=table.measured, mode="markers+text",
                             text=table.config, textposition="top left", name="configuration",
                             error_y=dict(type="data", array=table.tolerance, visible=True)))
    fig.add_trace(go.Scatter(x=[0.45, 1.0], y=[0.45, 1.0], mode="lines",
                             name="measured = predicted", line=dict(dash="dash", color="grey")))
    fig.add_hline(y=0.8, line_dash="dot", annotation_text="paper's floor (0.8)")
    fig.update_layout(title=title, xaxis_title="predicted layer-1 score (closed form)",
                      yaxis_title="measured layer-1 score", height=480)
    return fig


def length_study(lengths: Sequence[int], measured: dict[str, tuple[np.ndarray, np.ndarray]],
                 predicted: dict[str, np.ndarray], title: str) -> go.Figure:
    """Adjacency score against sequence length (log axis): measured series (mean ± std over
    sequences) as solid lines, predicted ones as dashed lines."""
    fig = go.Figure()
    for name, (mean, std) in measured.items():
        fig.add_trace(go.Scatter(x=list(lengths), y=np.asarray(mean), name=name,
                                 mode="lines+markers",
                                 error_y=dict(type="data", array=np.asarray(std), visible=True)))
    for name, values in predicted.items():
        fig.add_trace(go.Scatter(x=list(lengths), y=np.asarray(values), name=name,
                                 mode="lines", line=dict(dash="dash")))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="random order (0.5)")
    fig.update_xaxes(type="log", title="sequence length (tokens)")
    fig.update_layout(title=title, yaxis_title="adjacency score", yaxis_range=[0.3, 1.02],
                      height=440)
    return fig


def init_explorer(compute: Callable[..., tuple[np.ndarray, float]], labels: Sequence[str],
                  n_layer: int) -> Callable[[str, float, float, int], None]:
    """A function for ``ipywidgets.interact_manual``: ``show(reading, mean, log10_std,
    layer)`` draws ``compute(layer=, init_target=, init_mean=, init_std=)``, a similarity
    matrix and its adjacency score (e.g. ``one_model.layer_matrix`` with its text bound)."""
    def show(reading: str = "embedding", mean: float = 0.0, log10_std: float = -1.7,
             layer: int = min(1, n_layer)) -> None:
        std = 10.0 ** log10_std
        matrix, score = compute(layer=layer, init_target=reading, init_mean=mean,
                                init_std=std)
        heatmap_grid([matrix], [f"layer {layer}: score {score:.3f}"], labels, cols=1,
                     title=f"reading {reading!r}, μ={mean:g}, σ={std:.4f}").show()
    return show


VERDICT_COLOURS = {"holds": "#2a9d8f", "fails": "#c1121f", "cannot tell": "#8d99ae"}


def claim_margins(groups: pd.DataFrame, title: str) -> go.Figure:
    """The tests behind the scorecard (``scorecard.GROUP_COLUMNS``): per claim and group, the
    test nearest to failing as its distance from the claim's bound with its simultaneous
    interval (positive: on the claim's side), coloured by verdict."""
    sign = np.where(groups["above"], 1.0, -1.0)
    mid = sign * (groups["mean"] - groups["bound"])
    ends = np.sort(np.stack([sign * (groups["lo"] - groups["bound"]),
                             sign * (groups["hi"] - groups["bound"])]), axis=0)
    group = groups["group"].astype(str)
    layer = np.where(group.str.contains("layer"), "",
                     " · layer " + groups["weakest_layer"].astype(str))
    labels = (groups["claim"].str.split(":").str[0] + " · " + group + layer).to_numpy()
    fig = go.Figure()
    for verdict, colour in VERDICT_COLOURS.items():
        on = (groups["verdict"] == verdict).to_numpy()
        if on.any():
            fig.add_trace(go.Scatter(
                x=mid[on], y=labels[on], mode="markers", name=verdict,
                marker=dict(color=colour, size=8),
                error_x=dict(type="data", symmetric=False, array=ends[1][on] - mid[on],
                             arrayminus=mid[on] - ends[0][on], color=colour)))
    fig.add_vline(x=0.0, line_dash="dot", annotation_text="the claim's bound")
    fig.update_layout(title=title, height=160 + 18 * len(groups), xaxis_range=[-0.6, 0.6],
                      xaxis_title="distance from the bound, on the claim's side (> 0)",
                      yaxis=dict(autorange="reversed", categoryorder="array",
                                 categoryarray=list(labels)))
    return fig
