"""Plotly figures for the book, and the renderer that makes them show in the built HTML.

Under a kernel, plotly >= 6 emits only ``application/vnd.plotly.v1+json``, which MyST-NB does
not render, so the page comes out blank. ``use_book_renderer()`` (each chapter calls it once)
makes plotly's default renderer ``"nopebook"``, which emits that bundle *and* a ``text/html``
div that draws with the ``Plotly`` global. The book serves plotly.js itself (see
``book/_ext/plotly_offline.py``), so nothing is fetched from a CDN. JupyterLab and VS Code pick
the plotly JSON; the book picks the HTML. Importing this module changes no global setting.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer


class BookRenderer(MimetypeRenderer):
    """Plotly JSON for live front ends plus an HTML div that needs a page-level plotly.js."""

    def to_mimebundle(self, fig_dict: dict) -> dict:
        fig = go.Figure(fig_dict)
        html = pio.to_html(fig, include_plotlyjs=False, full_html=False, config={"responsive": True})
        return {"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": html}


def use_book_renderer() -> None:
    """Make every figure that is shown render in the static book as well as in live front ends."""
    pio.renderers["nopebook"] = BookRenderer()
    pio.renderers.default = "nopebook"


HEATMAP_SCALE = "Viridis"


def heatmap_grid(
    matrices: Sequence[np.ndarray],
    titles: Sequence[str],
    labels: Sequence[str] | None = None,
    cols: int = 4,
    zmin: float = -1.0,
    zmax: float = 1.0,
    title: str = "",
) -> go.Figure:
    """A grid of similarity heatmaps sharing one colour scale; ``labels`` name the positions."""
    from plotly.subplots import make_subplots

    rows = -(-len(matrices) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(titles),
                        horizontal_spacing=0.04, vertical_spacing=0.08)
    for n, m in enumerate(matrices):
        ticks = list(labels) if labels is not None else None
        fig.add_trace(
            go.Heatmap(z=np.asarray(m), x=ticks, y=ticks, zmin=zmin, zmax=zmax,
                       colorscale=HEATMAP_SCALE, showscale=n == 0,
                       colorbar=dict(title="cos")),
            row=n // cols + 1, col=n % cols + 1,
        )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title, height=260 * rows + 80, margin=dict(l=30, r=30, t=80, b=30))
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
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix=f"{slider_label}: "), pad=dict(t=40))],
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
        fig.add_trace(go.Scatter(x=list(layers), y=np.asarray(mean), name=name, mode="lines+markers",
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
                    colorscale=HEATMAP_SCALE, visible=j == 0, colorbar=dict(title=dict(text=bar_title(a0, b))),
                    name=f"{names[1]} {b}")
         for j, b in enumerate(b_keys)]
    )
    a_steps = [dict(method="restyle", label=str(a),
                    args=[{"z": [np.asarray(frames[a, b]).round(4).tolist() for b in b_keys],
                           "colorbar.title.text": [bar_title(a, b) for b in b_keys]}])
               for a in a_keys]
    b_steps = [dict(method="restyle", label=str(b), args=[{"visible": [k == j for k in range(len(b_keys))]}])
               for j, b in enumerate(b_keys)]
    fig.update_layout(
        title=title,
        sliders=[dict(active=0, steps=a_steps, currentvalue=dict(prefix=f"{names[0]}: "), pad=dict(t=30), y=0),
                 dict(active=0, steps=b_steps, currentvalue=dict(prefix=f"{names[1]}: "), pad=dict(t=30), y=-0.22)],
        height=680, margin=dict(b=160), yaxis=dict(autorange="reversed", scaleanchor="x"),
    )
    return fig
