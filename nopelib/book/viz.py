"""Plotly figures for the book, and the renderer that makes them show in the built HTML.

Under a kernel, plotly >= 6 emits only ``application/vnd.plotly.v1+json``, which MyST-NB does
not render, so the page comes out blank. ``use_book_renderer()`` (each chapter calls it once)
makes plotly's default renderer ``"nopebook"``, which emits that bundle *and* a ``text/html``
div that draws with the ``Plotly`` global. The book serves plotly.js itself (see
``book/_ext/plotly_offline.py``), so nothing is fetched from a CDN. JupyterLab and VS Code pick
the plotly JSON; the book picks the HTML. Importing this module changes no global setting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer
from plotly.subplots import make_subplots

from nopelib.rules.claims import LEARNED_AT
from nopelib.studies.long_context import model_name


class BookRenderer(MimetypeRenderer):
    """Plotly JSON for live front ends plus an HTML div that needs a page-level plotly.js."""

    def to_mimebundle(self, fig_dict: dict) -> dict:
        fig = go.Figure(fig_dict)
        html = pio.to_html(fig, include_plotlyjs=False, full_html=False,
                           config={"responsive": True})
        return {"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": html}


def use_book_renderer() -> None:
    """Make every figure that is shown render in the static book as well as in live front
    ends, and every table show its cells in full: pandas cuts text at 50 characters, and the
    tables' words (a reading, the reason a task is not judged) are what the reader needs."""
    pio.renderers["nopebook"] = BookRenderer()
    pio.renderers.default = "nopebook"
    pd.set_option("display.max_colwidth", None)


HEATMAP_SCALE = "Viridis"


def heatmap_grid(
    matrices: Sequence[np.ndarray],
    titles: Sequence[str],
    labels: Sequence[str] | None = None,
    cols: int = 4,
    zmin: float = -1.0,
    zmax: float = 1.0,
    title: str = "",
    per_panel: bool = False,
) -> go.Figure:
    """A grid of similarity heatmaps sharing one colour scale; ``labels`` name the positions.
    ``per_panel``: each panel on its own scale, from its lowest to its highest off-diagonal
    entry (named in its title), so a band of cosines between 0.9 and 1 shows where one scale
    from -1 to 1 paints the whole panel one colour."""
    rows = -(-len(matrices) // cols)
    ranges = []
    for m in matrices:
        m = np.asarray(m, dtype=float)
        off = m[~np.eye(len(m), dtype=bool)] if per_panel and m.ndim == 2 and len(m) > 1 else []
        ranges.append((float(np.min(off)), float(np.max(off))) if len(off) else (zmin, zmax))
    if per_panel:
        titles = [f"{t} ({lo:.2f} to {hi:.2f})" for t, (lo, hi) in zip(titles, ranges)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(titles),
                        horizontal_spacing=0.04, vertical_spacing=0.14 if labels else 0.08)
    for n, m in enumerate(matrices):
        ticks = list(labels) if labels is not None else None
        lo, hi = ranges[n]
        fig.add_trace(
            go.Heatmap(z=np.asarray(m), x=ticks, y=ticks, zmin=lo, zmax=hi,
                       colorscale=HEATMAP_SCALE, showscale=n == 0 and not per_panel,
                       colorbar=dict(title="cos")),
            row=n // cols + 1, col=n % cols + 1,
        )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickfont=dict(size=8))
    fig.update_yaxes(tickfont=dict(size=8))
    fig.update_layout(title=title, height=280 * rows + 80, margin=dict(l=30, r=30, t=80, b=30))
    return fig


def figure_menu(figs: Mapping[str, go.Figure]) -> go.Figure:
    """Several figures of one kind in one, one at a time: a dropdown menu picks a figure by
    its key and shows its traces, its title, its panels' titles and its lines (the layout's
    annotations and shapes); the first is shown. The frame (axes, height, margins) is the
    figure's with the most axes, so every figure's panels exist. One figure's height for all
    of them, where one figure each would stack. The menu sits at the top right, above the
    panels' titles."""
    if not figs:
        raise ValueError("no figure to put in a menu")
    frame = max(figs.values(), key=lambda f: len(list(f.select_xaxes())))
    fig = go.Figure(layout=frame.layout)
    sizes = [len(f.data) for f in figs.values()]
    buttons, start = [], 0
    for k, (name, one) in enumerate(figs.items()):
        for trace in one.data:
            fig.add_trace(trace.update(visible=k == 0))
        shown = [start <= i < start + sizes[k] for i in range(sum(sizes))]
        buttons.append(dict(label=name, method="update", args=[
            {"visible": shown}, {"title.text": one.layout.title.text,
                                 "annotations": [a.to_plotly_json()
                                                 for a in one.layout.annotations],
                                 "shapes": [s.to_plotly_json() for s in one.layout.shapes]}]))
        start += sizes[k]
    first = next(iter(figs.values())).layout
    fig.update_layout(title_text=first.title.text, annotations=first.annotations,
                      shapes=first.shapes)
    # 30 px above the plotting area, at the level of the title: clear of the panels' titles
    margin = fig.layout.margin
    inner = (fig.layout.height or 450) - (margin.t if margin.t is not None else 100) - (
        margin.b if margin.b is not None else 80)
    fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1.0,
                                        xanchor="right", y=1 + 30 / inner, yanchor="bottom",
                                        showactive=True)])
    return fig


def heatmap_grid_menu(grids: Mapping[str, Mapping]) -> go.Figure:
    """``heatmap_grid`` of several sets of matrices in one figure, a menu picking the set:
    ``grids`` maps each menu label to ``heatmap_grid``'s arguments (each panel keeps its own
    colour scale, range and tick labels where ``per_panel`` is set)."""
    return figure_menu({name: heatmap_grid(**kwargs) for name, kwargs in grids.items()})


def heatmap_slider(
    frames: dict[str, np.ndarray],
    slider_label: str,
    labels: Sequence[str] | None = None,
    zmin: float = -1.0,
    zmax: float = 1.0,
    title: str = "",
) -> go.Figure:
    """One heatmap with a slider over precomputed matrices: works in static HTML, no kernel.

    ``frames`` maps each slider step's label to its matrix; every step's data is embedded.
    """
    keys = list(frames)
    ticks = list(labels) if labels is not None else None
    fig = go.Figure(
        [go.Heatmap(z=np.asarray(frames[k]), x=ticks, y=ticks, zmin=zmin, zmax=zmax,
                    colorscale=HEATMAP_SCALE, visible=i == 0, colorbar=dict(title="cos"))
         for i, k in enumerate(keys)]
    )
    steps = [dict(method="update", label=k,
                  args=[{"visible": [j == i for j in range(len(keys))]},
                        {"title": f"{title} ({slider_label} {k})"}])
             for i, k in enumerate(keys)]
    fig.update_layout(
        title=f"{title} ({slider_label} {keys[0]})",
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix=f"{slider_label}: "),
                      pad=dict(t=40))],
        height=560, yaxis=dict(autorange="reversed", scaleanchor="x"),
    )
    return fig


DEFAULT_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def glue_numbers(values: dict[str, object]) -> None:
    """``myst_nb.glue`` each value, numpy scalars as plain Python numbers, not displayed.

    MyST-NB reads a glued value back from its text/plain form with ``ast.literal_eval`` before
    applying a format spec such as ``{glue:text}`name:.3f```; numpy 2 writes a float64 as
    ``np.float64(0.09)``, which that cannot read, so the number would not render.
    """
    from myst_nb import glue

    for name, value in values.items():
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{name}={value!r} must be a number (int or float)")
        glue(name, value, display=False)


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


def trajectory_menu(runs: Mapping[str, Sequence[Mapping]], titles: Mapping[str, str],
                    first: int) -> go.Figure:
    """``trajectory`` of several tasks in one figure (``runs`` maps a task to its runs): a
    dropdown menu picks the task, and two buttons show the whole run or its first ``first``
    steps (the x-axes' range, below the legend)."""
    fig = figure_menu({task: trajectory(r, titles[task]) for task, r in runs.items()})
    axes = [ax.plotly_name for ax in fig.select_xaxes()]
    whole = {f"{a}.autorange": True for a in axes}
    early = {**{f"{a}.range": [0, first] for a in axes},
             **{f"{a}.autorange": False for a in axes}}
    # in the right margin, below the legend
    fig.update_layout(updatemenus=[*fig.layout.updatemenus, dict(
        type="buttons", direction="down", showactive=True, active=0, x=1.02, xanchor="left",
        y=0.0, yanchor="bottom", buttons=[
            dict(label="whole run", method="relayout", args=[whole]),
            dict(label=f"first {first:,} steps", method="relayout", args=[early])])])
    return fig


def provenance_box(fields: dict[str, object]) -> str:
    """HTML of a collapsed box listing what a page's live numbers depend on
    (``results.page_provenance``)."""
    items = "".join(f"<li><b>{escape(str(k))}</b>: {escape(str(v))}</li>"
                    for k, v in fields.items())
    return (f'<details class="provenance"><summary>Provenance of this page</summary>'
            f"<ul>{items}</ul></details>")


def provenance_line(prov: dict[str, object]) -> str:
    """One sentence of where a committed result file came from, from its ``provenance``:
    the command, commit, machine, torch, wall time and date (never the whole dict)."""
    wall = prov.get("wall_seconds")
    return (f"written by {prov['command']} at commit {str(prov['commit'])[:12]} on "
            f"{prov['machine']} (torch {prov['torch']}"
            + (f", {float(wall) / 60:.0f} min wall" if wall is not None else "")
            + f", {str(prov['date'])[:10]})")


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
                name=f"{model_name(width, window)}, layer {layer}",
                error_y=dict(type="data", symmetric=False, array=g.hi - g.score,
                             arrayminus=g.score - g.lo)))
        g = mine[mine.layer == 1].sort_values("length")
        if g.predicted.isna().all():
            continue
        fig.add_trace(go.Scatter(x=g.length, y=g.predicted, mode="lines",
                                 line=dict(color=colour, dash="dash", width=1),
                                 name=f"{model_name(width, window)}, layer 1 predicted"))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="random order (0.5)")
    fig.update_xaxes(type="log", title="sequence length (tokens)")
    fig.update_layout(title=title, yaxis_title="adjacency score", height=460)
    return fig


