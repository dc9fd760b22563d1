"""The random-initialisation chapter's own parts: its rules, costs, specs and figures.

The chapter (``book/random_init.ipynb`` and its second page ``book/random_init_more.ipynb``)
measures the adjacency pattern of random NoPE models. Its spec ``CHAPTER``
(``chapters.RANDOM_INIT``) holds the defaults of its parameters cell, the rules ``RULES`` with
the joint costs ``COSTS`` and the paper's claims it judges; ``MORE``
(``chapters.RANDOM_INIT_MORE``) is the second page's, the same rules and defaults for the
parameters it reads. The figures are the ones only this chapter draws: score per layer, the
two-slider heatmap, the closed form against the measured score, the score against length and
the explorer of one initialisation. The studies it shares with the scorecard are
``nopelib.book.chapters``'; drawing that several chapters share is ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from nopelib.book.viz import HEATMAP_SCALE, heatmap_grid
from nopelib.core.chapter import ChapterSpec, with_costs
from nopelib.core.cost import Cost
from nopelib.core.params import Choice, Float, Int, ListOf
from nopelib.core.tasks import TASKS
from nopelib.rules import beyond_claims as bc, init_claims as ic

# The rules of the chapter's parameters. Upper bounds are rough costs on the 2-core
# development machine, far above the defaults; the reason is in each message.
RULES = {
    # claim 3's spreads and tolerances need two or more
    "n_seeds": Int(min=2, max=200, why="each seed scores 26 base models (Figure 1 in two "
                   "readings, 18 initialisations, 6 controls), ~0.8 s each at 16 inputs per "
                   "task: ~20 s per seed, ~1.1 h at 200").costing(
        Cost(("n_seeds", "inputs_per_task"), 1.0,
             "~1 s: 26 base models x 4 inputs of ~10 ms each")),
    "inputs_per_task": Int(min=1, max=2048, why="each adds 4 inputs (~10 ms each) to 26 "
                           "models per seed: ~3 s at 3 seeds, ~1.7 h at 2048, and a batch of "
                           "states of ~2 GB"),
    "heatmap_task": Choice(TASKS),
    "init_means": ListOf(Float(min=-1e6, max=1e6), max_len=32,
                         why="each mean adds 2 x len(init_stds) x n_seeds models (18 at the "
                             "defaults, ~0.8 s each): ~15 s per mean, ~8 min at 32").costing(
        Cost(("init_means", "init_stds", "n_seeds"), 1.6,
             "~1.6 s: 2 models (two readings) of ~0.8 s each")),
    "init_stds": ListOf(Float(min=0.0, max=1e6, open=True), max_len=32,
                        why="each std adds 2 x len(init_means) x n_seeds models and a slider "
                            "frame: ~15 s per std, ~8 min at 32"),
    "gone_margin": Float(min=0.0, max=0.5),
    "grid_layers": ListOf(Int(min=1, max=96, why="96 layers x 768 wide is 0.68 G parameters, "
                              "~1 min per seed"),
                          max_len=8, why="each depth adds len(grid_widths) x grid_seeds "
                                         "models (9 at the defaults), up to ~15 s each"),
    "grid_widths": ListOf(Int(min=6, max=3072, why="6 layers x 3072 wide is 0.68 G "
                              "parameters, ~1 min per seed").where(
                              lambda w, _: w % 6 == 0, "a multiple of the 6 heads"),
                          max_len=8, why="each width adds len(grid_layers) x grid_seeds "
                                         "models (9 at the defaults), up to ~15 s each").where(
        lambda ws, p: 12 * max(p["grid_layers"]) * max(ws) ** 2 <= 1.2e9,
        "the deepest and widest grid model at most 1.2 G parameters (12 x n_layer x n_embd^2: "
        "4.8 GB of float32 weights; 24 x 768 is 0.17 G)"),
    # the tolerance is derived from the spread over seeds
    "grid_seeds": Int(min=2, max=100, why="each seed scores the 9 grid models, ~30 s in all "
                      "at the defaults: ~50 min at 100"),
    "grid_inputs_per_task": Int(min=1, max=512, why="~4 s per input per task for the 9 grid "
                                "models x 3 seeds: ~35 min at 512, where the 24 x 768 model's "
                                "states of 4 x 512 inputs take 3.5 GB"),
    "level": Float(min=0.5, max=1.0, open=True),
    "lengths": ListOf(Int(min=3, max=8192, why="the [7, T, T] float32 similarity matrices "
                          "take 1.9 GB at T = 8192"),
                      max_len=32, why="each length is scored on all 2 x length_seeds x "
                                      "length_seqs sequences, up to ~10 s each at T = 8192"),
    "length_seeds": Int(min=1, max=32, why="each seed adds 2 x length_seqs sequences, ~1 s "
                        "each at lengths <= 512 and ~1 min at 8192: ~4 min at 32 (defaults)"),
    "length_seqs": Int(min=1, max=32, why="each adds 2 x length_seeds sequences, ~1 s each at "
                       "lengths <= 512 and ~1 min at 8192: ~2 min at 32 (defaults)"),
    "control_vocab": Int(min=2, max=2**20, why="the control model's embedding is "
                         "control_vocab x 384 float32: 1.6 GB at 2^20").where(
        lambda v, p: v * max(p["lengths"]) <= 2**31,
        "control_vocab x max(lengths) <= 2^31 (the forward pass makes logits of that many "
        "float32: 8 GB)"),
}

# Each joint cost's seconds per unit is the chapter's own estimate, from the notes of its
# parameters' rules (measured on the 2-core development machine), quoted in ``each``.
_DEFAULT_GRID = 42 * (192**2 + 384**2 + 768**2)  # sum of n_layer x n_embd^2 over the 3 x 3 grid


def _grid_size(p: Mapping[str, Any]) -> float:
    """The depth-and-width grid's weights over the default grid's: a model's build and its
    forward pass on the short task inputs both cost in proportion to its weights."""
    return sum(p["grid_layers"]) * sum(w * w for w in p["grid_widths"]) / _DEFAULT_GRID


COSTS = {
    "grid_inputs_per_task": (Cost(
        ("grid_seeds", "grid_inputs_per_task"), 4 / 3, "~1.3 s: one seed's input per task "
        "through the default 3 x 3 grid (grid_inputs_per_task's note: ~4 s per input per task "
        "at 3 seeds)", scale=_grid_size, scale_text="the grid's weights over the default's "
        "(sum of n_layer x n_embd^2)"),),
    "length_seqs": (Cost(
        ("length_seeds", "length_seqs"), 60.0, "~1 min: one sequence at T = 8,192 (the notes "
        "of length_seeds and length_seqs; ~1 s at lengths <= 512)",
        scale=lambda p: 2 * max(1 / 60, (max(p["lengths"]) / 8192) ** 2),
        scale_text="2 kinds of sequence x max(1/60, (max(lengths) / 8192)^2)"),),
    "init_stds": (Cost(("init_means", "init_stds", "n_seeds", "inputs_per_task"), 0.08,
                       "~80 ms: one input per task (4 of ~10 ms, inputs_per_task's note) "
                       "through one initialisation in its 2 readings"),),
}

CHAPTER = ChapterSpec("random_init", with_costs(RULES, COSTS), dict(
    n_seeds=10,  # seeds per configuration (Fig. 1, init, controls)
    inputs_per_task=16,  # task inputs scored per seed and task
    heatmap_task="reversal",  # task whose longest input is drawn as heatmaps
    init_means=[0.0, 4.0, 8.0],  # means of the initialisation study
    init_stds=[0.002, 0.02, 0.2],  # stds of the initialisation study (slider's σ)
    gone_margin=ic.GONE,  # claim 3, "gone": layers ≥ 1 within this of layer 0
    grid_layers=[6, 12, 24],  # depths of the depth-and-width grid
    grid_widths=[192, 384, 768],  # widths of the grid (each divisible by the 6 heads)
    grid_seeds=5,  # seeds per grid configuration (24 x 768: ~170 M)
    grid_inputs_per_task=16,  # task inputs per task and seed in the grid
    level=0.95,  # confidence level of the seed-spread tolerances
    lengths=[32, 64, 128, 256, 512],  # sequence lengths, length study (up to 8192 allowed)
    length_seeds=2,  # model seeds, length study
    length_seqs=4,  # sequences per seed (length_seeds x length_seqs in all)
    control_vocab=16384,  # vocabulary of the i.i.d. control sequences
), claims={
    ic.LAYER0: "the-adjacency-score-per-layer",
    ic.LAYER1: "the-adjacency-score-per-layer",
    ic.EVERY_TASK: "the-adjacency-score-per-layer",
    ic.THE_GRID: "random_init_more/depth-and-width-predicted-then-measured",
    ic.SMALL_SIGMA: "the-initialisation-study",
    ic.LARGE_SIGMA: "the-initialisation-study",
    ic.MEANS: "the-initialisation-study",
    # on the chapter's second page
    bc.SHORT_INPUTS: "random_init_more/length-beyond-the-paper-s-inputs-with-and-without-repeats",
})

# The chapter's second page (``book/random_init_more.ipynb``: depth and width, the controls,
# length) runs on the same random models: the parameters it reads, with the chapter's rules
# and defaults, so that its studies are the chapter's (and the scorecard's) cached calls.
MORE_NAMES = ("n_seeds", "inputs_per_task", "heatmap_task", "grid_layers", "grid_widths",
              "grid_seeds", "grid_inputs_per_task", "level", "lengths", "length_seeds",
              "length_seqs", "control_vocab")
MORE = ChapterSpec("random_init_more", {n: CHAPTER.rules[n] for n in MORE_NAMES},
                   {n: CHAPTER.defaults[n] for n in MORE_NAMES})


# ---------------------------------------------------------------------------------------------
# the figures only this chapter draws


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
