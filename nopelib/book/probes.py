"""The probes chapter's rules, spec and figures (``book/probes.ipynb`` and its controls page).

The chapter (``book/probes.ipynb``) and its second page, the planted controls and the
window-and-length grid (``book/probes_controls.ipynb``), each have a spec: the rules of their
parameters, their defaults (the parameters cell's) and the claims the chapter judges. The
studies they run are ``nopelib.studies.probe_study``'s; the figures only these pages draw are
here, the renderer and the shared colours ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book.viz import DEFAULT_COLOURS, figure_menu
from nopelib.core.chapter import ChapterSpec
from nopelib.core.cost import Cost
from nopelib.core.params import SEED, Choice, Int, ListOf
from nopelib.core.tasks import TASKS
from nopelib.rules import init_claims as ic
from nopelib.training.profiles import PROFILES

# The rules of the chapter's parameters. Upper bounds: rough costs on the 2-core development
# machine (one probe study at the defaults: ~25 s, 1.7 GB peak), far above the defaults; the
# reason is in each message. Parameters each within its own bound can still run for hours
# together: each joint cost (``Rule.costing``) is priced from the notes of its parameters and
# refused before any work (``NOPELIB_ALLOW_SLOW=1`` lifts it with a warning).
CHAPTER_PARAMS = {
    "profile": Choice(PROFILES),
    "tasks": ListOf(Choice(TASKS), unique=True),
    "model_seeds": ListOf(SEED, unique=True, min_len=5, max_len=100,
                          why="each seed is one probe study: ~25 s at the defaults, ~40 min "
                              "at 100"),
    "w": Int(min=1, max=1023, why="below T, which is at most 1024"),
    "T": Int(min=2, max=1024, why="a batch of up to 256 sequences holds 6 x T^2 float32 "
             "of attention per sequence: 6.4 GB at T = 1024").where(
        lambda t, p: t > p["w"], "greater than w"),
    "n_fit_tokens": Int(min=100, max=100_000, why="a study holds ~60 kB of states and "
                        "features per fitting token (1.7 GB peak at 21,600) and takes ~1.2 s "
                        "per 1,000: ~6 GB and ~2 min per study at 100,000").costing(
        Cost(("model_seeds", "n_fit_tokens"), 1.2e-3, "~1.2 ms: one fitting token of one "
             "probe study (n_fit_tokens' note: ~1.2 s per 1,000)")),
    "grid_windows": ListOf(Int(min=1, max=1023, why="below every grid length, at most 1024"),
                           unique=True, max_len=16,
                           why="each window adds one probe fit per layer to every grid study "
                               "(~0.5 s each)"),
    "grid_lengths": ListOf(Int(min=2, max=1024, why="as T: 6.4 GB of attention at 1024"),
                           unique=True, max_len=16,
                           why="each length adds one study per grid seed (~3 s at T = 128)"
                           ).where(lambda ts, p: min(ts) > max(p["grid_windows"]),
                                   "each greater than every grid window"),
    "grid_seeds": ListOf(SEED, unique=True, max_len=100,
                         why="each seed adds one study per grid length (3 at the defaults, "
                             "~3 s each): ~15 min at 100"),
    "grid_fit_tokens": Int(min=100, max=100_000, why="as n_fit_tokens: ~60 kB per fitting "
                           "token, ~6 GB at 100,000").costing(
        Cost(("grid_seeds", "grid_lengths", "grid_fit_tokens"), 5.6e-4, "~0.56 ms: one "
             "fitting token of one grid study (grid_lengths' note: ~3 s per study at 5,400)")),
    "mlp_fit_tokens": Int(min=100, max=100_000, why="the MLP probe trains by gradient "
                          "descent: ~7 s per model at 5,400, ~2 min per model at 100,000"
                          ).costing(
        Cost(("model_seeds", "mlp_fit_tokens"), 1.3e-3, "~1.3 ms: one fitting token of one "
             "model's MLP probe (its note: ~7 s at 5,400)")),
    "planted_fit_tokens": Int(min=100, max=100_000, why="the planted controls draw ~21 kB "
                              "of states per fitting token (~2 GB at 100,000) and fit 28 "
                              "probes per seed: ~30 s at 5,400 and 10 seeds, ~10 min at "
                              "100,000").costing(
        Cost(("model_seeds", "planted_fit_tokens"), 5.6e-4, "~0.56 ms: one fitting token of "
             "one seed's planted controls (their note: ~30 s at 5,400 tokens and 10 seeds)")),
}

CHAPTER = ChapterSpec("probes", CHAPTER_PARAMS, dict(
    profile="study",  # the committed trained study's profile (studies.trained_study)
    tasks=list(TASKS),  # read from that study
    model_seeds=list(range(10)),  # random-init models (data, probe seeds)
    w=8,  # window: features per position for the cosine and variance probes
    T=32,  # sequence length of the random-model study; positions w..T-1 are probed
    n_fit_tokens=21_600,  # probed tokens in each fitting split (10x the former probe)
    grid_windows=[4, 8, 16],  # windows of the w/T grid
    grid_lengths=[32, 64, 128],  # sequence lengths of the w/T grid
    grid_seeds=[0],  # random-init models of the w/T grid
    grid_fit_tokens=5_400,  # fitting tokens per probe in the grid (a quarter: cost)
    mlp_fit_tokens=5_400,  # fitting tokens of the paper's MLP probe, beside the ridge
    planted_fit_tokens=5_400,  # fitting tokens per probe of the planted controls (cost)
), claims={
    ic.PROBE_RANDOM: "cosine-against-variance-paired-with-the-model-as-the-unit",
    ic.PROBE_RANDOM_MLP: "the-paper-s-probe-a-4-layer-mlp-beside-the-ridge",
    ic.PROBE_TRAINED: "trained-models",
})

# the second page: the planted controls and the w/T grid, at the chapter's defaults of the
# parameters it reads (n_fit_tokens: the models', which its prose sets beside its own)
CONTROLS_NAMES = ("model_seeds", "w", "T", "n_fit_tokens", "grid_windows", "grid_lengths",
                  "grid_seeds", "grid_fit_tokens", "planted_fit_tokens")
CONTROLS = ChapterSpec("probes_controls", {n: CHAPTER_PARAMS[n] for n in CONTROLS_NAMES},
                       {n: CHAPTER.defaults[n] for n in CONTROLS_NAMES})

# ---------------------------------------------------------------------------------------------
# the figures only these pages draw

PROBE_COLORS = {"cosine": "#1f77b4", "variance": "#d62728", "hidden": "#7f7f7f"}


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


def probe_metrics_menu(tables: Mapping[str, pd.DataFrame], titles: Mapping[str, str]
                       ) -> go.Figure:
    """``probe_metrics`` of several tables in one figure, one at a time (``viz.figure_menu``):
    a menu picks the table (its key) and shows its traces under its title (``titles``)."""
    return figure_menu({name: probe_metrics(table, titles[name])
                        for name, table in tables.items()})


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
