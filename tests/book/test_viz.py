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


# --- one figure per block whatever the number of tasks: a menu picks the task ---

def _fake_run(rng, seed, n_layers, text, steps):
    """A run record shaped like a committed study's: curve, scores along training, matrices."""
    T = len(text)
    layers = rng.uniform(-1, 1, size=(n_layers, T, T))
    layers = (layers + layers.transpose(0, 2, 1)) / 2
    for m in layers:
        np.fill_diagonal(m, 1.0)
    return {"seed": seed, "scores_init": list(rng.uniform(0.4, 0.6, n_layers)),
            "trajectory": {"step": list(steps), "accuracy": list(rng.uniform(0, 1, len(steps))),
                           "scores": rng.uniform(0.3, 1, (len(steps), n_layers)).tolist()},
            "matrices": {"text": text, "layers": layers.tolist()}}


def _fake_docs(seeds):
    rng = np.random.default_rng(7)
    texts = {"reversal": "rev(ab)=ba", "addition": "12+345=357", "ordering": "ord(cab)=abc"}
    return {task: {"runs": [_fake_run(rng, s, 4, texts[task], range(100, 1100, 100))
                            for s in seeds[task]]} for task in seeds}


def _shown(fig, button):
    return [t for t, v in zip(fig.data, button.args[0]["visible"]) if v]


def test_figure_1_of_every_task_is_one_figure_with_a_menu_of_the_tasks():
    from nopelib.book import trained as tb, viz

    docs = _fake_docs({"reversal": [0, 1], "addition": [3], "ordering": [2]})
    fig = tb.figure1_menu(docs, "model")
    assert len(fig.layout.updatemenus) == 1
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["reversal", "addition", "ordering"]
    assert len(fig.data) == 3 * 4  # one heatmap per layer and task, in one figure
    assert [t.visible for t in fig.data] == [True] * 4 + [False] * 8  # the first task shown
    for button, (task, doc) in zip(buttons, docs.items()):
        run = doc["runs"][0]  # the first committed seed
        mats = np.asarray(run["matrices"]["layers"])
        shown = _shown(fig, button)
        assert len(shown) == len(mats)
        ranges = []
        for trace, m in zip(shown, mats):
            np.testing.assert_array_equal(trace.z, m)  # that task's matrices, no other's
            off = m[~np.eye(len(m), dtype=bool)]
            assert (trace.zmin, trace.zmax) == (off.min(), off.max())  # its own scale
            assert not trace.showscale
            assert list(trace.x) == [f"{i}:{c}" for i, c in enumerate(run["matrices"]["text"])]
            ranges.append((off.min(), off.max()))
        assert button.args[1]["title.text"] == (f"model, {task}, seed {run['seed']}: "
                                                f"{run['matrices']['text']}")
        titles = [a["text"] for a in button.args[1]["annotations"]]
        assert titles == [f"layer {n} ({lo:.2f} to {hi:.2f})" for n, (lo, hi) in
                          enumerate(ranges)]
    # each panel's scale is its own: no two panels of a task share one
    assert len({(t.zmin, t.zmax) for t in fig.data}) == len(fig.data)
    # what shows before any click is the first task's, titles included
    assert fig.layout.title.text == buttons[0].args[1]["title.text"]
    assert [a.text for a in fig.layout.annotations] == [
        a["text"] for a in buttons[0].args[1]["annotations"]]
    with pytest.raises(ValueError):
        viz.heatmap_grid_menu({})


def test_the_trajectories_of_every_task_are_one_figure_with_a_task_menu_and_a_range_one():
    from nopelib.book import viz

    docs = _fake_docs({"reversal": [0, 1, 2], "addition": [0, 4]})
    runs = {task: doc["runs"] for task, doc in docs.items()}
    fig = viz.trajectory_menu(runs, {t: f"title {t}" for t in runs}, first=300)
    task_menu, range_menu = fig.layout.updatemenus
    assert [b.label for b in task_menu.buttons] == ["reversal", "addition"]
    n_layers = 4
    assert len(fig.data) == (3 + 2) * (1 + n_layers)  # a curve and a line per layer per seed
    for button, (task, task_runs) in zip(task_menu.buttons, runs.items()):
        shown = _shown(fig, button)
        assert len(shown) == len(task_runs) * (1 + n_layers)
        assert button.args[1]["title.text"] == f"title {task}"
        curves = [t for t in shown if t.showlegend]  # one learning curve per seed
        assert [t.name for t in curves] == [f"seed {r['seed']}" for r in task_runs]
        for trace, run in zip(curves, task_runs):
            assert list(trace.y) == run["trajectory"]["accuracy"]
        lines = [t for t in shown if not t.showlegend]  # every layer's score, every seed
        want = [[r["scores_init"][layer]] + [p[layer] for p in r["trajectory"]["scores"]]
                for r in task_runs for layer in range(n_layers)]
        assert [list(t.y) for t in lines] == want
    assert [t.visible for t in fig.data] == [True] * 15 + [False] * 10
    whole, early = range_menu.buttons
    assert (whole.method, early.method) == ("relayout", "relayout")
    axes = [ax.plotly_name for ax in fig.select_xaxes()]
    assert len(axes) == 1 + n_layers
    assert early.label == "first 300 steps"
    assert all(early.args[0][f"{a}.range"] == [0, 300] for a in axes)
    assert all(whole.args[0][f"{a}.autorange"] is True for a in axes)
