"""Plotly figures of trained models and of the position probes.

Plotly figures of trained models and of the position probes: learning curves, the adjacency
score per layer before and after training, its trajectory along training, the early-dynamics
study's curves (and its ablated runs trained to the end), and the probes' metrics and paired
differences. The renderer and the shared colours are ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book.viz import DEFAULT_COLOURS, PROBE_COLORS
from nopelib.core.tasks import TASKS
from nopelib.rules.claims import KEEPS_AT, LEARNED_AT


def probe_metrics(table: pd.DataFrame, title: str) -> go.Figure:
    """NRMSE (left) and Pearson R (right) of the position probes against layer, mean ± std
    over seeds, one line per feature set; ``table`` as ``probe.probe_layers`` returns it."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[
        "NRMSE (lower is better)", "Pearson R (higher is better)"])
    stats = table.groupby(["features", "layer"])[["nrmse", "r"]].agg(["mean", "std"]).fillna(0.0)
    for kind, color in PROBE_COLORS.items():
        s = stats.loc[kind]
        for col, metric in enumerate(["nrmse", "r"], start=1):
            fig.add_trace(go.Scatter(x=s.index, y=s[(metric, "mean")], name=kind,
                                     legendgroup=kind, showlegend=col == 1, mode="lines+markers",
                                     line=dict(color=color),
                                     error_y=dict(type="data", array=s[(metric, "std")])),
                          row=1, col=col)
    fig.update_xaxes(title_text="layer (0 = token embeddings)", dtick=1)
    fig.update_yaxes(range=[0, 1.1], row=1, col=1)
    fig.update_yaxes(range=[-0.1, 1.0], row=1, col=2)
    fig.update_layout(title=title, height=400)
    return fig


def learning_curves(
    curves: dict[str, tuple[Sequence[int], Sequence[float]]],
    baselines: dict[str, float],
    threshold: float | None = None,
    title: str = "",
) -> go.Figure:
    """Test exact match against training step, one panel per task.

    ``curves`` maps ``"task, label"`` to (steps, accuracies); curves of one task share a panel.
    ``baselines`` gives each task's majority-answer share (dotted); ``threshold`` a dashed line.
    """

    tasks = list(dict.fromkeys(name.split(", ")[0] for name in curves))
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    colours = {}
    for name, (steps, accuracy) in curves.items():
        task, label = name.split(", ", 1)
        colour = colours.setdefault(label, DEFAULT_COLOURS[len(colours) % len(DEFAULT_COLOURS)])
        fig.add_trace(go.Scatter(x=list(steps), y=list(accuracy), mode="lines", name=label,
                                 legendgroup=label, line=dict(color=colour),
                                 showlegend=task == tasks[0]),
                      row=1, col=tasks.index(task) + 1)
    for col, task in enumerate(tasks, start=1):
        if task in baselines:
            fig.add_hline(y=baselines[task], line_dash="dot", line_color="#555", row=1, col=col)
        if threshold is not None:
            fig.add_hline(y=threshold, line_dash="dash", line_color="#2ca02c", row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[-0.02, 1.02], title_text="test exact match", col=1)
    fig.update_layout(title=title, height=400)
    return fig


def before_after_lines(
    layers: Sequence[int],
    stats: dict[str, tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]],
    title: str = "",
) -> go.Figure:
    """Adjacency score per layer before and after training, one panel per task.

    ``stats[task]`` is ((mean, std) before, (mean, std) after), each [n_layer + 1].
    """

    tasks = list(stats)
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for col, task in enumerate(tasks, start=1):
        for (mean, std), name, colour in zip(stats[task], ("before training", "after training"),
                                             ("#888888", "#d62728")):
            fig.add_trace(go.Scatter(x=list(layers), y=np.asarray(mean), mode="lines+markers",
                                     error_y=dict(type="data", array=np.asarray(std)), name=name,
                                     line=dict(color=colour), legendgroup=name,
                                     showlegend=col == 1),
                          row=1, col=col)
    fig.add_hline(y=0.5, line_dash="dot")
    fig.update_xaxes(title_text="layer", dtick=1)
    fig.update_yaxes(range=[0.3, 1.02], title_text="adjacency score", col=1)
    fig.update_layout(height=420, title=title)
    return fig


def probe_differences(comparisons: dict[str, pd.DataFrame], title: str) -> go.Figure:
    """Cosine minus variance per layer with their intervals: NRMSE (left, below 0 favours
    cosine) and R (right, above 0 favours cosine), one line per model; ``comparisons`` maps a
    model's name to ``init_claims.probe_claims``'s table (one task's rows)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[
        "NRMSE cosine − variance (< 0: cosine better)", "R cosine − variance (> 0: cosine better)"])
    for i, (name, comp) in enumerate(comparisons.items()):
        colour = DEFAULT_COLOURS[i % len(DEFAULT_COLOURS)]
        for col, metric in enumerate(["d_nrmse", "d_r"], start=1):
            mean = comp[metric].to_numpy()
            fig.add_trace(go.Scatter(
                x=comp.index, y=mean, mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, line=dict(color=colour),
                error_y=dict(type="data", symmetric=False,
                             array=comp[f"{metric} hi"].to_numpy() - mean,
                             arrayminus=mean - comp[f"{metric} lo"].to_numpy())),
                row=1, col=col)
    fig.add_hline(y=0.0, line_dash="dot")
    fig.update_xaxes(title_text="layer (0 = token embeddings)", dtick=1)
    fig.update_layout(title=title, height=420)
    return fig


def probe_grid(table: pd.DataFrame, title: str) -> go.Figure:
    """Pearson R of the cosine (solid) and variance (dashed) probes against the window w, one
    colour per sequence length T, one panel per layer; mean ± std over seeds. ``table`` has
    columns T, w, layer, features, seed, r."""
    layers = sorted(table.layer.unique())
    fig = make_subplots(rows=1, cols=len(layers), shared_yaxes=True,
                        subplot_titles=[f"layer {layer}" for layer in layers])
    stats = table.groupby(["layer", "T", "features", "w"]).r.agg(["mean", "std"]).fillna(0.0)
    lengths = sorted(table["T"].unique())
    for col, layer in enumerate(layers, start=1):
        for i, T in enumerate(lengths):
            for kind, dash in (("cosine", "solid"), ("variance", "dash")):
                s = stats.loc[(layer, T, kind)]
                name = f"{kind}, T = {T}"
                fig.add_trace(go.Scatter(
                    x=s.index, y=s["mean"], mode="lines+markers", name=name, legendgroup=name,
                    showlegend=col == 1, error_y=dict(type="data", array=s["std"]),
                    line=dict(color=DEFAULT_COLOURS[i % len(DEFAULT_COLOURS)], dash=dash)),
                    row=1, col=col)
    fig.update_xaxes(title_text="window w", type="log", tickvals=sorted(table.w.unique()))
    fig.update_yaxes(title_text="Pearson R", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def run_curves(runs: dict, baselines: dict[str, float], threshold: float | None = None,
               title: str = "") -> go.Figure:
    """``learning_curves`` of trained runs (``runs`` maps (task, seed) to a
    ``runs.TrainedRun``, whose metrics hold its curve), one line per seed."""
    curves = {f"{task}, seed {seed}": (run.metrics["curve"]["step"],
                                       run.metrics["curve"]["accuracy"])
              for (task, seed), run in runs.items()}
    return learning_curves(curves, baselines, threshold=threshold, title=title)


def recipe_curves(studies: dict[str, dict], baselines: dict[str, float],
                  threshold: float | None = None, title: str = "") -> go.Figure:
    """``learning_curves`` of every run of the committed recipe studies
    (``results.load_all("recipe")``), one line per position encoding and seed."""
    names = {"none": "NoPE", "learned": "learned position"}
    curves = {f"{r['task']}, {names[r['pos_encoding']]}, seed {r['seed']}":
              (r["curve"]["step"], r["curve"]["accuracy"])
              for recipe in studies.values() for r in recipe["runs"]}
    return learning_curves(curves, baselines, threshold=threshold, title=title)


def trajectory(runs: Sequence[Mapping], title: str = "") -> go.Figure:
    """One task's runs along training (``runs``: the committed study's records): test exact
    match against step (top, one line per seed, the 0.9 line dashed) and the adjacency score
    of every layer against step (below, one panel per layer, one line per seed; the run's
    initialisation is its point at step 0)."""
    n_layers = len(runs[0]["scores_init"])
    fig = make_subplots(rows=2, cols=n_layers, row_heights=[0.4, 0.6], vertical_spacing=0.14,
                        specs=[[{"colspan": n_layers}] + [None] * (n_layers - 1),
                               [{}] * n_layers], shared_yaxes="rows",
                        subplot_titles=["test exact match", *[f"layer {i}" for i in
                                                              range(n_layers)]])
    for run in runs:
        t = run["trajectory"]
        # a seed keeps its colour as a study in flight grows, and its legend entry when alone
        colour = DEFAULT_COLOURS[run["seed"] % len(DEFAULT_COLOURS)]
        name = f"seed {run['seed']}"
        fig.add_trace(go.Scatter(x=t["step"], y=t["accuracy"], mode="lines", name=name,
                                 legendgroup=name, showlegend=True, line=dict(color=colour)),
                      row=1, col=1)
        scores = np.asarray([run["scores_init"], *t["scores"]])  # [points + 1, L+1]
        steps = [0, *t["step"]]
        for layer in range(n_layers):
            fig.add_trace(go.Scatter(x=steps, y=scores[:, layer], mode="lines", name=name,
                                     legendgroup=name, showlegend=False,
                                     line=dict(color=colour, width=1)),
                          row=2, col=layer + 1)
    fig.add_hline(y=LEARNED_AT, line_dash="dash", line_color="#2ca02c", row=1, col=1)
    for layer in range(n_layers):
        fig.add_hline(y=0.5, line_dash="dot", line_color="#555", row=2, col=layer + 1)
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=1)
    fig.update_yaxes(range=[0.3, 1.02], row=2, col=1, title_text="adjacency score")
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(title=title, height=560)
    return fig


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
