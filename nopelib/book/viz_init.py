"""The scorecard's figure of the tests behind it: each claim's margin over seeds, by verdict.

The random-initialisation chapter's own figures moved to ``nopelib.book.random_init``; this one,
drawn on the scorecard page, waits for that chapter's module (``nopelib.book.scorecard``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


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
