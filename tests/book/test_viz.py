"""Figures of nopelib.book.viz and of the chapters' modules (averaging_effect, random_init):
importing changes no global plotly setting; the book's renderer is set by an explicit call;
the σ slider shows one step's rows and matrix at a time."""

import subprocess
import sys

import numpy as np
import pytest

from nopelib.book import averaging_effect as ae, random_init as ri
from nopelib.book.viz import BookRenderer


def test_import_leaves_plotly_alone_and_the_call_sets_the_book_renderer():
    code = ("import plotly.io as pio\n"
            "default = pio.renderers.default\n"
            "from nopelib.book import viz\n"
            "assert pio.renderers.default == default, pio.renderers.default\n"
            "viz.use_book_renderer()\n"
            "assert pio.renderers.default == 'nopebook'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_book_renderer_emits_plotly_json_and_an_html_twin():
    bundle = BookRenderer().to_mimebundle({"data": [{"type": "scatter", "y": [1, 2]}]})
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html"}
    assert "Plotly.newPlot" in bundle["text/html"]


def test_the_sigma_slider_shows_one_steps_rows_and_matrix_at_a_time():
    rows = np.array([[0.9, 0.8], [0.6, 0.5]])  # 2 sigmas x rows k = 2, 3
    pred = rows + 0.01
    cos = [np.eye(4), np.eye(4) * 0.5]
    fig = ae.sigma_slider([0.02, 0.2], rows, pred, cos, list("ab1c"), "t")
    assert [t.type for t in fig.data] == ["scatter", "scatter", "heatmap"] * 2
    assert [t.visible for t in fig.data] == [True] * 3 + [False] * 3
    step = fig.layout.sliders[0].steps[1]
    assert step.label == "0.2" and step.args[0]["visible"] == [False] * 3 + [True] * 3
    assert step.args[1]["title"] == "t, σ = 0.2"
    np.testing.assert_array_equal(fig.data[3].x, [2, 3])
    np.testing.assert_array_equal(fig.data[4].y, pred[1])
    np.testing.assert_array_equal(fig.data[5].z, cos[1])
    # a repeated character keeps its own position: positions on the axis, characters as ticks
    assert list(fig.layout.xaxis2.ticktext) == list("ab1c")
    assert list(fig.layout.xaxis2.tickvals) == [0, 1, 2, 3]


# --- issue 14: numbers for the chapters' Markdown ---

def test_glue_numbers_stores_plain_python_numbers(monkeypatch):
    import ast

    import myst_nb

    from nopelib.book import viz

    stored = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: stored.update({name: value}))
    viz.glue_numbers({"x": np.float64(0.25), "n": np.int64(3), "y": 1.5})
    assert stored == {"x": 0.25, "n": 3, "y": 1.5}
    # MyST-NB reads the text/plain form back with literal_eval: plain floats survive it
    assert all(ast.literal_eval(repr(v)) == v for v in stored.values())
    assert type(stored["x"]) is float and type(stored["n"]) is int
    with pytest.raises(TypeError, match="s='a'"):
        viz.glue_numbers({"s": "a"})


def test_random_init_figures_hold_their_series():
    import pandas as pd

    from nopelib.book.random_init import length_study, predicted_vs_measured
    table = pd.DataFrame({"config": ["6 × 192", "6 × 768"], "predicted": [0.6, 0.97],
                          "measured": [0.57, 0.93], "tolerance": [0.02, 0.01]})
    fig = predicted_vs_measured(table, "t")
    assert list(fig.data[0].y) == [0.57, 0.93] and list(fig.data[0].error_y.array) == [0.02, 0.01]
    fig = length_study([32, 64], {"a": (np.array([0.7, 0.6]), np.array([0.1, 0.1]))},
                       {"a predicted": np.array([0.72, 0.65])}, "t")
    assert [t.name for t in fig.data] == ["a", "a predicted"]
    assert fig.data[1].line.dash == "dash" and fig.layout.xaxis.type == "log"


def test_sigma_sweep_figure_and_attention_cosine_checks():
    assert not hasattr(ae, "sigma_sweep")  # the figure's name is not the study's
    grid = np.geomspace(1e-3, 1, 5)
    fig = ae.sigma_sweep_figure(grid, np.linspace(1, 0.5, 5), grid[:2],
                                {"h1": (np.array([0.9, 0.8]), np.array([0.01, 0.02]))},
                                [0.02], 0.75, "t")
    assert [t.name for t in fig.data] == ["prediction (Gaussian, e + a)", "h1"]
    C = np.eye(3)
    fig = ae.attention_cosine_checks(C, C * 0.5, C * 0.25, "t")
    assert len(fig.data) == 4 and list(fig.data[0].x) == ["1", "2", "3"]
    np.testing.assert_array_equal(fig.data[3].z, C * 0.5)


def test_explorers_draw_what_their_compute_returns(monkeypatch):
    import inspect

    import plotly.graph_objects as go

    shown = []
    monkeypatch.setattr(go.Figure, "show", lambda self, *a, **k: shown.append(self))
    calls = []

    def pair(sigma, length):
        calls.append((sigma, length))
        return np.eye(length), np.eye(length) * 0.5

    show = ae.sigma_explorer(pair, list("rev(12)="))
    assert list(inspect.signature(show).parameters) == ["log10_sigma", "length"]
    show(-1.0, 4)
    assert calls == [(0.1, 4)] and list(shown[-1].data[0].x) == list("rev(")
    assert shown[-1].layout.annotations[0].text == "measured h1 (σ=0.1000)"

    def one(**kwargs):
        calls.append(kwargs)
        return np.eye(3), 0.75

    show = ri.init_explorer(one, list("abc"), n_layer=6)
    assert list(inspect.signature(show).parameters) == ["reading", "mean", "log10_std",
                                                        "layer"]
    show("all", 4.0, -2.0, 3)
    assert calls[-1] == dict(layer=3, init_target="all", init_mean=4.0, init_std=0.01)
    assert shown[-1].layout.annotations[0].text == "layer 3: score 0.750"
    assert shown[-1].layout.title.text == "reading 'all', μ=4, σ=0.0100"


def test_a_heatmap_grid_can_scale_each_panel_to_its_own_off_diagonal_range():
    from nopelib.book import viz

    flat = np.full((3, 3), 0.9)
    flat[0, 1] = flat[1, 0] = 0.95
    np.fill_diagonal(flat, 1.0)
    wide = np.eye(3) + np.array([[0, -0.5, 0.2], [-0.5, 0, 0.1], [0.2, 0.1, 0]])
    shared = viz.heatmap_grid([flat, wide], ["a", "b"])
    assert {(t.zmin, t.zmax) for t in shared.data} == {(-1.0, 1.0)}
    own = viz.heatmap_grid([flat, wide], ["a", "b"], per_panel=True)
    assert [(t.zmin, t.zmax) for t in own.data] == [(0.9, 0.95), (-0.5, 0.2)]
    titles = [a.text for a in own.layout.annotations]
    assert titles == ["a (0.90 to 0.95)", "b (-0.50 to 0.20)"]
    assert not any(t.showscale for t in own.data)  # no one colour bar for different scales
