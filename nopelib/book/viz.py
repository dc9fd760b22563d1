"""Plotly figures for the book, and the renderer that makes them show in the built HTML.

Under a kernel, plotly >= 6 emits only ``application/vnd.plotly.v1+json``, which MyST-NB does
not render, so the page comes out blank. ``use_book_renderer()`` (each chapter calls it once)
makes plotly's default renderer ``"nopebook"``, which emits that bundle *and* a ``text/html``
div that draws with the ``Plotly`` global. The book serves plotly.js itself (see
``book/_ext/plotly_offline.py``), so nothing is fetched from a CDN. JupyterLab and VS Code pick
the plotly JSON; the book picks the HTML. Importing this module changes no global setting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer
from plotly.subplots import make_subplots


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


def score_lines(
    layers: Sequence[int],
    series: dict[str, tuple[np.ndarray, np.ndarray]],
    title: str = "",
    yrange: tuple[float, float] = (0.3, 1.02),
) -> go.Figure:
    """Adjacency score against layer, one line per series with mean and ± std error bars."""
    fig = go.Figure()
    for name, (mean, std) in series.items():
        fig.add_trace(go.Scatter(x=list(layers), y=np.asarray(mean), name=name,
                                 mode="lines+markers",
                                 error_y=dict(type="data", array=np.asarray(std), visible=True)))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="random order (0.5)")
    fig.update_layout(title=title, xaxis_title="layer (0 = token embeddings)",
                      yaxis_title="adjacency score", yaxis_range=list(yrange), height=420)
    return fig


def heatmap_two_sliders(
    frames: dict[tuple[object, object], np.ndarray],
    names: tuple[str, str],
    notes: dict[tuple[object, object], str] | None = None,
    labels: Sequence[str] | None = None,
    zmin: float = -1.0,
    zmax: float = 1.0,
    title: str = "",
) -> go.Figure:
    """One heatmap with two independent sliders over precomputed matrices ``frames[a, b]``.

    A plotly slider step cannot read the other slider's position, so the figure holds one trace
    per value of ``b`` and the sliders touch different properties: the ``b`` slider sets which
    trace is visible, the ``a`` slider rewrites every trace's matrix (and colour-bar title, which
    carries ``notes[a, b]``) to that value of ``a``. Either order of moves shows ``frames[a, b]``.
    ``names`` label the two sliders; every (a, b) pair must be present. The step matrices are
    plain nested lists: plotly.js does not decode plotly.py's base64 arrays inside slider args.
    """
    a_keys = list(dict.fromkeys(a for a, _ in frames))
    b_keys = list(dict.fromkeys(b for _, b in frames))
    missing = [(a, b) for a in a_keys for b in b_keys if (a, b) not in frames]
    if missing:
        raise ValueError(f"frames lacks the pairs {missing}; every (a, b) combination is needed")
    notes = notes or {}
    ticks = list(labels) if labels is not None else None

    def bar_title(a: object, b: object) -> str:
        return f"cos<br>{notes[a, b]}" if (a, b) in notes else "cos"

    a0 = a_keys[0]
    fig = go.Figure(
        [go.Heatmap(z=np.asarray(frames[a0, b]), x=ticks, y=ticks, zmin=zmin, zmax=zmax,
                    colorscale=HEATMAP_SCALE, visible=j == 0,
                    colorbar=dict(title=dict(text=bar_title(a0, b))),
                    name=f"{names[1]} {b}")
         for j, b in enumerate(b_keys)]
    )
    a_steps = [dict(method="restyle", label=str(a),
                    args=[{"z": [np.asarray(frames[a, b]).round(4).tolist() for b in b_keys],
                           "colorbar.title.text": [bar_title(a, b) for b in b_keys]}])
               for a in a_keys]
    b_steps = [dict(method="restyle", label=str(b),
                    args=[{"visible": [k == j for k in range(len(b_keys))]}])
               for j, b in enumerate(b_keys)]
    fig.update_layout(
        title=title,
        sliders=[dict(active=0, steps=a_steps, currentvalue=dict(prefix=f"{names[0]}: "),
                      pad=dict(t=30), y=0),
                 dict(active=0, steps=b_steps, currentvalue=dict(prefix=f"{names[1]}: "),
                      pad=dict(t=30), y=-0.22)],
        height=680, margin=dict(b=160), yaxis=dict(autorange="reversed", scaleanchor="x"),
    )
    return fig


def _lines(traces: Sequence[go.Scatter], title: str, xaxis: str, yaxis: str,
           height: int = 380, **layout: object) -> go.Figure:
    fig = go.Figure(list(traces))
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, height=height, **layout)
    return fig


def attention_entropy(k: np.ndarray, entropy: np.ndarray, title: str) -> go.Figure:
    """Measured attention entropy per position k against uniform attention's maximum, log k."""
    return _lines([go.Scatter(x=k, y=np.log(k), name="uniform maximum log k", mode="lines"),
                   go.Scatter(x=k, y=entropy, name="measured (mean over models, inputs, heads)",
                              mode="markers")],
                  title, "position k (1-based)", "entropy (nats)")


def inner_product_law(t: np.ndarray, k0: int, mean: np.ndarray, se: np.ndarray,
                      wins: np.ndarray, title: str) -> go.Figure:
    """Left: Monte-Carlo E<a_k0, a_k0+t> (± 2 SE) against 1/max(i, j); right: the fraction of
    draws in which the adjacent inner product beats the one at distance t >= 2."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[
        f"E<a_{k0}, a_{k0}+t>", "P(<a_k,a_k+1> > <a_k,a_k+t>)"])
    fig.add_trace(go.Scatter(x=t, y=1 / (k0 + t), name="1/max(i,j)", mode="lines"), 1, 1)
    fig.add_trace(go.Scatter(x=t, y=mean, error_y=dict(array=2 * se), name="Monte Carlo ±2 SE",
                             mode="markers"), 1, 1)
    fig.add_trace(go.Scatter(x=t[1:], y=wins, name="fraction of draws", mode="lines+markers"),
                  1, 2)
    fig.update_xaxes(title_text="distance t")
    fig.update_layout(height=380, title=title)
    return fig


def variance_law(k: np.ndarray, variance: np.ndarray, scale: float, law_repeat: np.ndarray,
                 title: str) -> go.Figure:
    """Variance across features per position, on log-log axes, against 1/k and n_kk/k^2."""
    return _lines([go.Scatter(x=k, y=variance, name="measured", mode="markers"),
                   go.Scatter(x=k, y=scale / k, name="1/k (distinct tokens)", mode="lines"),
                   go.Scatter(x=k, y=law_repeat, name="n_kk/k^2 (repeats counted)",
                              mode="lines")],
                  title, "position k", "variance", xaxis_type="log", yaxis_type="log")


def attention_cosine_checks(measured: np.ndarray, ideal: np.ndarray, repeat: np.ndarray,
                            title: str) -> go.Figure:
    """The measured cosine matrix of block 1's attention output beside sqrt(min/max), the
    repeat-aware closed form and measured minus sqrt(min/max); positions labelled 1..T."""
    return heatmap_grid([measured, ideal, repeat, measured - ideal],
                        ["measured", "sqrt(min/max)", "repeat-aware",
                         "measured - sqrt(min/max)"],
                        labels=[str(i) for i in range(1, len(measured) + 1)], cols=4,
                        zmin=-1, zmax=1, title=title)


def sigma_sweep_figure(grid: np.ndarray, predicted: np.ndarray, sigmas: np.ndarray,
                       measured: dict[str, tuple[np.ndarray, np.ndarray]],
                       marks: Sequence[float], level: float, title: str) -> go.Figure:
    """Layer-1 score against the embedding σ: the prediction as a line, each ``measured``
    series (mean, std over models) as markers, the paper's σ values ``marks`` and the score
    ``level`` as guides."""
    fig = go.Figure(go.Scatter(x=grid, y=predicted, name="prediction (Gaussian, e + a)",
                               mode="lines"))
    for (name, (mean, std)), symbol in zip(measured.items(), ("circle", "x", "diamond")):
        fig.add_trace(go.Scatter(x=sigmas, y=mean, error_y=dict(array=std), name=name,
                                 mode="markers", marker_symbol=symbol))
    for s in marks:
        fig.add_vline(x=s, line_dash="dot", annotation_text=f"paper σ={s}")
    fig.add_hline(y=level, line_dash="dash", annotation_text=f"score {level}")
    fig.update_layout(title=title, xaxis_type="log", xaxis_title="token-embedding σ",
                      yaxis_title="layer-1 adjacency score", yaxis_range=[0.3, 1.02], height=460)
    return fig


def line_slider(x: np.ndarray, frames: dict[str, dict[str, np.ndarray]], slider_label: str,
                title: str, xaxis: str, yaxis: str,
                yrange: tuple[float, float] = (0, 1.05)) -> go.Figure:
    """Lines with a slider over precomputed steps: ``frames[step][name]`` is the y of line
    ``name`` at that step (markers for "measured", lines otherwise). Works in static HTML."""
    keys = list(frames)
    names = list(frames[keys[0]])
    fig = go.Figure([go.Scatter(x=x, y=frames[k][name], name=name, visible=i == 0,
                                mode="markers" if name == "measured" else "lines")
                     for i, k in enumerate(keys) for name in names])
    steps = [dict(method="update", label=k,
                  args=[{"visible": [m // len(names) == i for m in range(len(fig.data))]},
                        {"title": f"{title}, {slider_label} = {k}"}])
             for i, k in enumerate(keys)]
    fig.update_layout(title=f"{title}, {slider_label} = {keys[0]}", xaxis_title=xaxis,
                      yaxis_title=yaxis, yaxis_range=list(yrange), height=460,
                      sliders=[dict(active=0, steps=steps, pad=dict(t=40),
                                    currentvalue=dict(prefix=f"{slider_label}: "))])
    return fig


def sigma_explorer(compute: Callable[[float, int], tuple[np.ndarray, np.ndarray]],
                   labels: Sequence[str]) -> Callable[[float, int], None]:
    """A function for ``ipywidgets.interact_manual``: ``show(log10_sigma, length)`` draws
    ``compute(sigma, length)``, the measured h1 cosine matrix and the expected one (e.g.
    ``theory_studies.h1_against_theory`` with its input bound), side by side."""
    def show(log10_sigma: float = -1.7, length: int = len(labels)) -> None:
        sigma = 10 ** log10_sigma
        measured, expected = compute(sigma, length)
        heatmap_grid([measured, expected],
                     [f"measured h1 (σ={sigma:.4f})", "expected cosine (theory)"],
                     labels=list(labels[:length]), cols=2).show()
    return show


PROBE_COLORS = {"cosine": "#1f77b4", "variance": "#d62728", "hidden": "#7f7f7f"}


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


def grid_adjacency(runs: pd.DataFrame, title: str = "") -> go.Figure:
    """A trained grid's adjacency score per layer (mean over seeds), one panel per task, one
    colour per configuration: after training solid, before training dotted.

    ``runs`` is a grid summary's runs (``nopelib.studies.grid.load_summary``): columns task,
    n_layer, n_embd, adjacency_before and adjacency_after (lists, one score per layer).
    """

    tasks = list(dict.fromkeys(runs["task"]))
    configs = sorted({(int(n), int(d)) for n, d in zip(runs["n_layer"], runs["n_embd"])})
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for col, task in enumerate(tasks, start=1):
        for i, (n_layer, n_embd) in enumerate(configs):
            sel = runs[(runs["task"] == task) & (runs["n_layer"] == n_layer)
                       & (runs["n_embd"] == n_embd)]
            name, colour = f"{n_layer} x {n_embd}", DEFAULT_COLOURS[i % len(DEFAULT_COLOURS)]
            for column, dash, shown in (("adjacency_after", "solid", True),
                                        ("adjacency_before", "dot", False)):
                if sel.empty:
                    continue
                mean = np.mean(np.stack(sel[column].tolist()), axis=0)  # [n_layer + 1]
                fig.add_trace(go.Scatter(x=list(range(n_layer + 1)), y=mean, mode="lines",
                                         name=name, legendgroup=name,
                                         line=dict(color=colour, dash=dash),
                                         showlegend=shown and col == 1),
                              row=1, col=col)
    fig.add_hline(y=0.5, line_dash="dot")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(range=[0.3, 1.02], title_text="adjacency score", col=1)
    fig.update_layout(height=420, title=title or "adjacency score per layer: after training "
                      "(solid), before (dotted)")
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
