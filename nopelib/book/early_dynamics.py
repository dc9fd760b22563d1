"""The early-dynamics chapter's spec, its tables cut to fit the column, and its figures.

The chapter (``book/early_dynamics.ipynb``) reads the committed early-dynamics studies
(``nopelib.book.early_tables`` builds their tables) and checks block 1 at initialisation live.
Its spec (``CHAPTER``) holds its defaults; the rules of its parameters stay in
``nopelib.studies.early_study`` (``CHAPTER_PARAMS``), because that module's syntax is part of
the checkpoint key of its full runs (``early_study.full_key``): moving them would orphan the
checkpoints of a run in flight. The figures only this chapter draws are at the end, the
renderer and the shared ones ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book.viz import DEFAULT_COLOURS
from nopelib.core.chapter import ChapterSpec
from nopelib.core.tasks import TASKS
from nopelib.rules.claims import KEEPS_AT, LEARNED_AT
from nopelib.studies import early_study

CHAPTER = ChapterSpec("early_dynamics", early_study.CHAPTER_PARAMS, dict(
    profile="study",  # the committed early-dynamics study read below
    paper_profile="paper_study",  # the paper's model's committed study, set beside it
    init_profiles=["study", "paper_study"],  # models checked live at initialisation
    init_seeds=[0, 1, 2],  # their seeds
))

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


# ---------------------------------------------------------------------------------------------
# the figures only this chapter draws


def early_layer1(runs: pd.DataFrame, title: str = "") -> go.Figure:
    """The early-dynamics study's layer 1 against step, one panel per task (``runs``:
    ``early_tables.frame``'s rows of one ablation): the measured score after block 1, the score
    of block 1's attention residual without its MLP, and the averaging theory's prediction
    from the measured quantities; mean over seeds with their min-max band."""
    tasks = sorted(runs.task.unique())
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True,
                        horizontal_spacing=0.03)
    series = (("layer1", "measured (layer 1)"), ("score_without_mlp", "measured, no MLP"),
              ("predicted", "theory, measured inputs"))
    for col, task in enumerate(tasks, start=1):
        by = runs[runs.task == task].groupby("step")
        for k, (column, name) in enumerate(series):
            stats = by[column].agg(["mean", "min", "max"])
            colour = DEFAULT_COLOURS[k]
            steps = stats.index.tolist()
            fig.add_trace(go.Scatter(x=steps + steps[::-1],
                                     y=stats["max"].tolist() + stats["min"].tolist()[::-1],
                                     fill="toself", fillcolor=colour, opacity=0.15,
                                     line=dict(width=0), hoverinfo="skip", showlegend=False,
                                     legendgroup=name), row=1, col=col)
            fig.add_trace(go.Scatter(x=steps, y=stats["mean"], mode="lines", name=name,
                                     legendgroup=name, showlegend=col == 1,
                                     line=dict(color=colour)), row=1, col=col)
        fig.add_hline(y=0.5, line_dash="dot", line_color="#555", row=1, col=col)
    fig.update_yaxes(range=[0.3, 1.02], title_text="adjacency score", row=1, col=1)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=420)
    return fig


def early_quantities(runs: pd.DataFrame, columns: Sequence[str], title: str = "") -> go.Figure:
    """Block 1's measured quantities against step (``early_tables.frame``'s rows of one
    ablation): one panel per quantity, one line per task (mean over seeds)."""
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=list(columns),
                        horizontal_spacing=0.05)
    for k, task in enumerate(sorted(runs.task.unique())):
        mean = runs[runs.task == task].groupby("step")[list(columns)].mean()
        for col, column in enumerate(columns, start=1):
            fig.add_trace(go.Scatter(x=mean.index, y=mean[column], mode="lines", name=task,
                                     legendgroup=task, showlegend=col == 1,
                                     line=dict(color=DEFAULT_COLOURS[k])), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=360)
    return fig


def predicted_against_measured(table: pd.DataFrame, measured: str, predicted: str,
                               by: str, title: str = "") -> go.Figure:
    """A scatter of ``predicted`` against ``measured`` (columns of ``table``), one colour per
    value of ``by``, with the line where they agree."""
    fig = go.Figure()
    for k, (name, g) in enumerate(table.groupby(by)):
        fig.add_trace(go.Scatter(x=g[measured], y=g[predicted], mode="markers", name=str(name),
                                 marker=dict(color=DEFAULT_COLOURS[k % len(DEFAULT_COLOURS)])))
    lo = float(min(table[measured].min(), table[predicted].min())) - 0.02
    hi = float(max(table[measured].max(), table[predicted].max())) + 0.02
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="agreement",
                             line=dict(color="#555", dash="dot")))
    fig.update_xaxes(title_text=measured, range=[lo, hi])
    fig.update_yaxes(title_text=predicted, range=[lo, hi])
    fig.update_layout(title=title, height=420)
    return fig


def full_curves(runs: pd.DataFrame, title: str = "") -> go.Figure:
    """The ablated runs trained to the end of their budget beside the unablated run of the
    same seed (``early_tables.full_frame``): one column per task, layer 1 against step above
    and exact match on the curve's test examples below, one line per ablation (and per CPU
    kernel set, named in the legend, where the frame holds runs of more than one)."""
    tasks = [t for t in TASKS if t in set(runs.task)]
    fig = make_subplots(rows=2, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True,
                        vertical_spacing=0.08, horizontal_spacing=0.03)
    several = runs.kernels.nunique() > 1
    lines = list(dict.fromkeys(zip(runs.ablation, runs.kernels)))
    shown: set[str] = set()  # each line in the legend once, where it is first drawn
    for col, task in enumerate(tasks, start=1):
        for k, (name, kernels) in enumerate(lines):
            g = runs[(runs.task == task) & (runs.ablation == name)
                     & (runs.kernels == kernels)].sort_values("step")
            if g.empty:
                continue
            label = f"{name} ({kernels})" if several else name
            line = dict(color=DEFAULT_COLOURS[k % len(DEFAULT_COLOURS)],
                        dash="solid" if name == "none" else "dash")
            for row, column in ((1, "layer1"), (2, "accuracy")):
                fig.add_trace(go.Scatter(x=g.step, y=g[column], mode="lines", name=label,
                                         legendgroup=label, line=line,
                                         showlegend=label not in shown), row=row, col=col)
                shown.add(label)
        # the reading's lines: the paper's layer-1 range, the learnedness line
        fig.add_hline(y=KEEPS_AT, line_dash="dot", line_color="#555", row=1, col=col)
        fig.add_hline(y=LEARNED_AT, line_dash="dot", line_color="#555", row=2, col=col)
    fig.update_yaxes(title_text="layer-1 score", row=1, col=1)
    fig.update_yaxes(title_text="exact match", range=[0, 1.02], row=2, col=1)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(title=title, height=560)
    return fig
