"""The averaging chapter's own parts: its parameters' rules and costs, its spec, its figures.

The chapter (``book/averaging_effect.ipynb``) derives the averaging effect and checks it on
random base models. Its spec ``CHAPTER`` (``chapters.AVERAGING_EFFECT`` in the registry) holds
the defaults of its parameters cell, the rules ``RULES`` with the joint costs ``COSTS``; the
figures are the ones only this chapter draws (attention entropy, the inner-product and variance
laws, the cosine checks, the sigma sweep and its slider). The studies it runs live in
``nopelib.averaging``; drawing that several chapters share is ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book.viz import HEATMAP_SCALE, heatmap_grid
from nopelib.core.chapter import ChapterSpec, with_costs
from nopelib.core.cost import Cost
from nopelib.core.params import Choice, Float, Int, ListOf
from nopelib.core.tasks import TASKS

# The rules of the chapter's parameters. Upper bounds are rough costs on the 2-core
# development machine, far above the defaults; the reason is in each message.
RULES = {
    "task": Choice(TASKS),
    "n_texts": Int(min=1, max=2048, why="each input is scored by the 52 models of the sweep "
                   "and the large-sigma study: ~0.5 s per input, ~17 min at 2048"),
    "n_long": Int(min=1, max=1024, why="each input runs through block 1 of the 20 sweep "
                  "models and enters all n_null replicates: ~0.5 s per input, ~9 min at 1024"),
    "n_models": Int(min=1, max=1024, why="each model is built and enters all n_null "
                    "replicates (~1 ms each): ~0.6 s per model, ~10 min at 1024"),
    "sweep_seeds": Int(min=1, max=128, why="each seed builds one model per sigma of the sweep "
                       "(10 at the defaults, ~0.8 s each): ~8 s per seed, ~17 min at 128"),
    "n_grid": Int(min=2, max=500, why="each sigma builds sweep_seeds models (~0.8 s each) "
                  "and adds a frame to two sliders: ~1.6 s per sigma, ~13 min at 500"),
    "mc_draws": Int(min=2, max=100_000, why="the Monte Carlo holds 3 arrays of mc_draws x 22 x "
                    "mc_dim float64: 3.4 GB at 100,000 draws of width 64"),
    "mc_dim": Int(min=1, max=4096, why="4.3 GB at width 4096 and 2,000 draws").where(
        lambda dim, p: dim * p["mc_draws"] <= 2**23,
        "mc_draws x mc_dim <= 8,388,608 (the Monte Carlo's 3 arrays of mc_draws x 22 x mc_dim "
        "float64: 4.4 GB)"),
    "level": Float(min=0.5, max=1.0, open=True),
    "n_null": Int(min=20, max=100_000, why="~3 ms per replicate at the defaults: ~6 min at "
                  "100,000"),
    "archs": ListOf(ListOf(Int(min=1), min_len=2, max_len=2), max_len=16,
                    why="each architecture builds thr_seeds models and scores them at every "
                        "threshold sigma: ~5 s each at the defaults, ~1.5 min at 16").where(
        lambda v, p: all(len(a) == 2 and a[1] % 6 == 0 for a in v),
        "pairs [n_layer, n_embd] with n_embd divisible by the 6 heads").where(
        lambda v, p: all(a[0] <= 96 and 12 * a[0] * a[1] ** 2 <= 1.2e9 for a in v),
        "n_layer <= 96 and at most 1.2 G parameters per model (12 x n_layer x n_embd^2: 4.8 GB "
        "of float32 weights, built whole for every seed)"),
    "thr_seeds": Int(min=2, max=256, why="each seed builds every architecture (~1.5 s each at "
                     "the defaults): ~5 s per seed, ~20 min at 256"),
    "thr_texts": Int(min=1, max=512, why="each adds one input per task to 3 architectures x "
                     "thr_seeds x thr_grid scorings (~10 ms each): ~2 s, ~17 min at 512"),
    "thr_grid": Int(min=3, max=200, why="each sigma scores 4 x thr_texts inputs with every "
                    "architecture and seed: ~3 s per sigma, ~10 min at 200"),
    "excess_seeds": Int(min=2, max=1024, why="each seed builds one base model and scores "
                        "n_texts inputs at every excess sigma: ~0.6 s per seed, ~10 min at "
                        "1024"),
    "excess_sigmas": ListOf(Float(min=0.1), unique=True, max_len=64,
                            why="each sigma scores n_texts inputs with excess_seeds models: "
                                "~4 s per sigma, ~4 min at 64"),
}

# Each joint cost's seconds per unit is the chapter's own estimate, from the notes of its
# parameters' rules (measured on the 2-core development machine), quoted in ``each``.
COSTS = {
    "sweep_seeds": (Cost(("n_grid", "sweep_seeds"), 0.8, "~0.8 s: one sweep model built and "
                         "scored (the notes of n_grid and sweep_seeds)"),
                    Cost(("n_grid", "sweep_seeds", "n_texts"), 0.01, "~10 ms: one input "
                         "scored by one sweep model (n_texts' note: ~0.5 s per input for 52 "
                         "models)")),
    "n_null": (Cost(("n_long", "n_models", "n_null"), 2.5e-4, "~0.25 ms: one input of one "
                    "model in one null replicate (n_null's note: ~3 ms per replicate at the "
                    "defaults' 3 models x 4 inputs)"),),
    "thr_texts": (Cost(("archs", "thr_seeds", "thr_grid", "thr_texts"), 0.04, "~40 ms: one "
                       "input per task (4 scorings of ~10 ms, thr_texts' note) of one "
                       "threshold model at one sigma"),),
    "excess_sigmas": (Cost(("excess_seeds", "excess_sigmas", "n_texts"), 0.01, "~10 ms: one "
                           "input scored by one model (excess_sigmas' note: ~4 s per sigma at "
                           "16 seeds x 24 inputs)"),),
}

CHAPTER = ChapterSpec("averaging_effect", with_costs(RULES, COSTS), dict(
    task="reversal",  # task whose inputs feed the random models (longest: 22 tokens)
    n_texts=24,  # task inputs per model in the sigma sweep
    n_long=4,  # inputs of maximal length, for per-position checks
    n_models=3,  # random base models (seeds) averaged in the per-position checks
    sweep_seeds=2,  # random models per sigma in the sweep
    n_grid=7,  # log-spaced sigmas in [1e-3, 1], plus the paper's 0.002, 0.02, 0.2
    mc_draws=2000,  # Monte-Carlo draws of i.i.d. value vectors
    mc_dim=64,  # their width in the Monte Carlo
    level=0.75,  # score level whose sigma is predicted and measured
    n_null=400,  # replicates of the null Monte Carlo of the per-position checks
    archs=[[6, 192], [6, 384], [24, 384]],  # [n_layer, n_embd] in the threshold study
    thr_seeds=3,  # random models per architecture and sigma in the threshold study
    thr_texts=8,  # inputs per task in the threshold study
    thr_grid=6,  # log-spaced sigmas in [0.005, 0.15] in the threshold study
    excess_seeds=16,  # random models in the large-sigma study
    excess_sigmas=[0.1, 1.0],  # sigmas of the large-sigma study
))


# ---------------------------------------------------------------------------------------------
# the figures only this chapter draws


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


def sigma_slider(sigmas: Sequence[float], rows: np.ndarray, predicted_rows: np.ndarray,
                 cosines: Sequence[np.ndarray], labels: Sequence[str], title: str) -> go.Figure:
    """One slider over the embedding σ, two panels per step: left the measured layer-1 row
    scores ``rows[n]`` (markers; row k = 2..T-1, 0-based) against the predicted ones
    (line), right the measured layer-1 cosine matrix ``cosines[n]`` with positions labelled
    by ``labels``. Every step's data is embedded: it works in static HTML, with no kernel."""
    keys = [f"{s:.4g}" for s in sigmas]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.12,
                        subplot_titles=["layer-1 row scores", "measured layer-1 cosines"])
    k = np.arange(2, 2 + np.asarray(rows).shape[1])
    positions = list(range(len(labels)))
    for n in range(len(keys)):
        on = n == 0
        fig.add_trace(go.Scatter(x=k, y=rows[n], name="measured", mode="markers",
                                 visible=on, marker=dict(color="#1f77b4")), 1, 1)
        fig.add_trace(go.Scatter(x=k, y=predicted_rows[n], name="predicted", mode="lines",
                                 visible=on, line=dict(color="#d62728")), 1, 1)
        fig.add_trace(go.Heatmap(z=np.asarray(cosines[n]), x=positions, y=positions,
                                 zmin=-1.0, zmax=1.0, colorscale=HEATMAP_SCALE, visible=on,
                                 showlegend=False, colorbar=dict(title="cos")), 1, 2)
    steps = [dict(method="update", label=key,
                  args=[{"visible": [m // 3 == n for m in range(3 * len(keys))]},
                        {"title": f"{title}, σ = {key}"}])
             for n, key in enumerate(keys)]
    ticks = dict(tickmode="array", tickvals=positions, ticktext=list(labels),
                 tickfont=dict(size=8))
    fig.update_xaxes(title_text="row k (0-based) = sequence length - 1", row=1, col=1)
    fig.update_yaxes(title_text="adjacency row score", range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(**ticks, row=1, col=2)
    fig.update_yaxes(**ticks, autorange="reversed", row=1, col=2)
    fig.update_layout(title=f"{title}, σ = {keys[0]}", height=500,
                      legend=dict(x=0.01, y=0.02, xanchor="left", yanchor="bottom",
                                  bgcolor="rgba(255,255,255,0.7)"),
                      sliders=[dict(active=0, steps=steps, pad=dict(t=60),
                                    currentvalue=dict(prefix="σ: "))])
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
