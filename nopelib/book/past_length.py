"""The page past the training length: the text-length study read, judged and drawn.

``book/past_length.ipynb`` reads the committed ``length_text.json`` (written run by run by
``python -m nopelib.studies.text_length``): which runs are in and which still train, bits per
character per encoding and length with the spread over seeds, the per-position curves, NoPE's
pattern and resolution d*(i) at each length, and the verdicts of ``length_claims`` once every
compared encoding has its seeds (until then the count is shown, and no verdict).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book.score_rows import make_row, model_of
from nopelib.core import corpus
from nopelib.results import files
from nopelib.rules import claims, length_claims as rule, length_kernels as kernels_rule
from nopelib.studies.long_context import resolution
from nopelib.training.text_lm import TEXT_PROFILES

FILE = "length_text.json"
COLOURS = {"none": "#1f77b4", "rope": "#d62728", "alibi": "#2ca02c", "learned": "#7f7f7f"}
NAMES = {"none": "NoPE", "rope": "RoPE", "alibi": "ALiBi", "learned": "learned table"}
# the readings (length_claims.LENGTH_CLAIMS) as the scorecard states them
PAPER = (
    "(not in the paper) Past its training length a NoPE model's loss on text rises, as "
    "later work on natural text reports.",
    "(not in the paper) Past it NoPE's loss rises less than RoPE's, as Kazemnejad et al. "
    "found of length generalisation on synthetic tasks.",
    "(not in the paper) Past it NoPE's loss rises less than ALiBi's.",
    "(not in the paper) A temperature on the attention logits growing with log length lowers "
    "NoPE's loss past its training length, with nothing retrained.",
    "(not in the paper) The trained NoPE model's layer-1 adjacency pattern reaches past its "
    "training length.",
    "(not in the paper) Every layer of the trained NoPE model still ranks its neighbour first "
    "in the second half of inputs of every length.",
)


@dataclass
class PastLength:
    """The committed study as the page reads it (``read``)."""
    doc: dict | None  # the file, None before its first run
    runs: pd.DataFrame  # one row per (encoding, seed): steps, test bits, where it was made
    bpc: pd.DataFrame  # one row per (encoding, seed, length): bpc, sharpened
    states: pd.DataFrame  # per (encoding, seed, layer, length): score, ordered
    curve: pd.DataFrame  # per (encoding, seed, position): bits (a bin of positions)
    order: pd.DataFrame  # per (encoding, seed, layer, octave, d): measured share
    seeds: dict  # encoding -> the seeds committed
    todo: list  # (encoding, seed) of the queue not committed yet
    tests: pd.DataFrame | None  # length_claims's table, once it can judge
    explained: pd.DataFrame | None  # length_claims.explains's, with it
    kernel_seeds: dict  # encoding -> the seeds the second kernel set's rerun holds
    kernel_bpc: pd.DataFrame  # the rerun's bpc, as ``bpc``
    kernels: str  # the verdicts' footing: "one set" (native alone) or "two sets"

    @property
    def judged(self) -> bool:
        return self.tests is not None


def frames(doc: dict) -> dict[str, pd.DataFrame]:
    """The file's runs as tables (see ``PastLength``)."""
    runs, bpc, states, curve, order = [], [], [], [], []
    for r in doc["runs"]:
        enc, seed = r["encoding"], r["seed"]
        runs.append(dict(encoding=enc, seed=seed, steps=r["steps"], test_bpc=r["test_bpc"],
                         train_minutes=r["train_seconds"] / 60, commit=r["made"]["commit"][:7],
                         machine=r["made"]["machine"], date=r["made"]["date"][:10],
                         kernels=r.get("kernels", "not recorded")))
        for n, v in r["bpc"].items():
            bpc.append(dict(encoding=enc, seed=seed, length=int(n), bpc=v,
                            sharpened=r["sharpened"].get(n, np.nan)))
        for n, per in r["scores"].items():
            for layer, (s, o) in enumerate(zip(per, r["ordered"][n])):
                states.append(dict(encoding=enc, seed=seed, layer=layer, length=int(n),
                                   score=s, ordered=o))
        for i, bits in enumerate(r["position_bits"]):
            curve.append(dict(encoding=enc, seed=seed,
                              position=(i + 0.5) * rule.CURVE_BIN, bits=bits))
        order += [dict(encoding=enc, seed=seed, layer=layer, octave=a, d=d, measured=f)
                  for layer, a, d, f in r["order"]]
    return {"runs": pd.DataFrame(runs), "bpc": pd.DataFrame(bpc),
            "states": pd.DataFrame(states), "curve": pd.DataFrame(curve),
            "order": pd.DataFrame(order)}


def _parts(path: Path) -> tuple[dict | None, dict[str, pd.DataFrame], dict[str, list]]:
    """The file at ``path`` (None if absent), its tables and its seeds per encoding."""
    doc = files.load(path) if path.is_file() else None
    names = ("runs", "bpc", "states", "curve", "order")
    parts = frames(doc) if doc is not None else {k: pd.DataFrame() for k in names}
    have = parts["runs"]
    seeds = {e: sorted(have.loc[have.encoding == e, "seed"]) if len(have) else []
             for e in rule.LENGTH_ENCODINGS}
    return doc, parts, seeds


def _tests(doc: dict, parts: dict, seeds: dict) -> pd.DataFrame | None:
    """``length_claims``'s tests where the file can be judged: every encoding it compares
    holds the same ``LENGTH_MIN_SEEDS`` seeds or more; else None."""
    counts = {len(seeds[e]) for e in rule.PAST_ENCODINGS}
    if len({tuple(seeds[e]) for e in rule.PAST_ENCODINGS}) != 1 or (
            min(counts) < rule.LENGTH_MIN_SEEDS):
        return None
    nope = parts["states"][parts["states"].encoding == "none"]
    return rule.length_claims(parts["bpc"], nope, doc["provenance"]["unigram_bpc"])


def read(folder: Path | None = None) -> PastLength:
    """The committed study in ``folder`` (default: the book's results), judged where it can
    be (``_tests``); where the rerun under a second kernel set holds the same seeds, each
    verdict stands only where both sets agree (``length_kernels.across_kernels``)."""
    folder = files.RESULTS_DIR if folder is None else folder
    doc, parts, seeds = _parts(folder / FILE)
    other, other_parts, kernel_seeds = _parts(folder / kernels_rule.KERNEL_FILE)
    mine = set(parts["runs"].get("kernels", [])) - {"not recorded"}
    theirs = set(other_parts["runs"].get("kernels", []))
    if mine & theirs or "not recorded" in theirs:
        raise ValueError(f"{kernels_rule.KERNEL_FILE}: its runs' kernels {sorted(theirs)} "
                         f"must all be recorded and differ from {FILE}'s {sorted(mine)}")
    queue = [(e, s) for s in TEXT_PROFILES["text"].seeds for e in rule.LENGTH_ENCODINGS]
    todo = [(e, s) for e, s in queue if s not in seeds[e]]
    tests = None if doc is None else _tests(doc, parts, seeds)
    kernels = "one set"
    if tests is not None and all(kernel_seeds[e] == seeds[e] for e in rule.PAST_ENCODINGS):
        tests = kernels_rule.across_kernels(tests, _tests(other, other_parts, kernel_seeds))
        kernels = "two sets"
    explained = None if tests is None else rule.explains(tests)
    return PastLength(doc=doc, seeds=seeds, todo=todo, tests=tests, explained=explained,
                      kernel_seeds=kernel_seeds, kernel_bpc=other_parts["bpc"],
                      kernels=kernels, **parts)


def spread_cells(g: "pd.core.groupby.SeriesGroupBy") -> pd.Series:
    """Per group of seeds: 'mean ± sd (n)', the sd '–' for a single seed."""
    sd = g.std(ddof=1).map(lambda v: "–" if pd.isna(v) else f"{v:.3f}")
    return g.mean().map(lambda v: f"{v:.3f}") + " ± " + sd + " (" + g.size().astype(str) + ")"


def bpc_table(study: PastLength) -> pd.DataFrame:
    """Bits per character per encoding (rows) and length (columns): the mean over seeds,
    '± sd (n)' beside it; a length a model cannot read is blank."""
    if study.bpc.empty:
        return pd.DataFrame()
    cell = spread_cells(study.bpc.groupby(["encoding", "length"]).bpc)
    table = cell.unstack("length").reindex(
        [e for e in rule.LENGTH_ENCODINGS if e in set(study.bpc.encoding)])
    return table.rename(index=NAMES).fillna("")


def kernel_table(study: PastLength) -> pd.DataFrame:
    """The rerun under the second kernel set beside the seeds' spread: per encoding and
    length (rows), the native runs' sd over seeds, then for each seed the rerun holds its
    bits per character under the second set minus the native run's of that seed; empty
    before the rerun holds a run."""
    if study.kernel_bpc.empty:
        return pd.DataFrame()
    keys = ["encoding", "seed", "length"]
    both = study.kernel_bpc.merge(study.bpc, on=keys, suffixes=("_rerun", ""),
                                  validate="one_to_one")
    both = both.assign(difference=both.bpc_rerun - both.bpc)
    diff = both.pivot_table(index=["encoding", "length"], columns="seed",
                            values="difference")
    diff.columns = [f"seed {s}: rerun − native" for s in diff.columns]
    sd = study.bpc.groupby(["encoding", "length"]).bpc.std(ddof=1).rename("sd over seeds")
    table = diff.join(sd).iloc[:, [-1, *range(len(diff.columns))]]
    order = [e for e in rule.LENGTH_ENCODINGS if e in set(both.encoding)]
    table = table.reindex(order, level="encoding").round(3) + 0.0  # no "-0.000"
    return table.rename(index=NAMES, level="encoding")


def stretches() -> list[tuple[int, int]]:
    """The stretches of positions [lo, hi) between the lengths the rule reads: the trained
    context [0, 256), then each octave past it."""
    edges = [0, *rule.LENGTH_LENGTHS]
    return list(zip(edges[:-1], edges[1:]))


def stretch_table(study: PastLength) -> pd.DataFrame:
    """Bits per character per encoding (rows) within each stretch of positions (columns,
    ``stretches``), from the per-position curves: the mean over seeds, '± sd (n)' beside it.
    A length's bpc averages every position before it; a stretch's is that stretch's own."""
    if study.curve.empty:
        return pd.DataFrame()
    curve = study.curve
    cells = {}
    for lo, hi in stretches():
        inside = curve[(curve.position >= lo) & (curve.position < hi)]
        per_seed = inside.groupby(["encoding", "seed"]).bits.mean()  # equal-sized bins
        cells[f"[{lo:,}, {hi:,})"] = spread_cells(per_seed.groupby("encoding"))
    table = pd.DataFrame(cells).reindex(
        [e for e in rule.LENGTH_ENCODINGS if e in set(curve.encoding)])
    return table.rename(index=NAMES).fillna("")


def sharpened_table(study: PastLength) -> pd.DataFrame:
    """NoPE's bits per character per length, plain and with the log-length temperature: the
    mean over seeds of each and of their difference (plain minus sharpened)."""
    nope = study.bpc[study.bpc.encoding == "none"] if len(study.bpc) else study.bpc
    if nope.empty:
        return pd.DataFrame()
    nope = nope.assign(gain=nope.bpc - nope.sharpened)
    return nope.groupby("length")[["bpc", "sharpened", "gain"]].mean().round(3)


def resolution_table(study: PastLength, encoding: str = "none") -> pd.DataFrame:
    """d*(i) per layer and octave of positions for ``encoding``'s trained models (the long-
    sequences chapter's ``resolution``, the seed as the unit): the distance from which row
    i ranks its neighbour first ``ORDER_LEVEL`` of the time, as a share of i; NaN: never."""
    order = study.order
    if order.empty or encoding not in set(order.encoding):
        return pd.DataFrame()
    order = order[order.encoding == encoding].assign(n_embd=0, window=0, predicted=np.nan)
    res = resolution(order)
    return res.pivot_table(index="layer", columns="octave", values="d_star / i",
                           dropna=False).round(3)


def verdict_grid(study: PastLength) -> pd.DataFrame:
    """The verdicts at a glance: one row per reading, one column per length, each cell the
    reading's verdict at that length over its layers (``claims.claim_table``); blank where
    the reading is not read at that length; empty before the study is judged."""
    if study.tests is None:
        return pd.DataFrame()
    table = claims.claim_table(study.tests, by="group")
    grid = table.pivot(index="claim", columns="group", values="verdict")
    columns = [f"{n} chars" for n in rule.LENGTH_LENGTHS if f"{n} chars" in grid.columns]
    order = [c for c, _ in rule.LENGTH_CLAIMS if c in grid.index]
    grid = grid.reindex(index=order, columns=columns).fillna("")
    grid.index = [c.removeprefix("beyond: past the length, ") for c in grid.index]
    return grid.rename_axis(index="reading", columns="length")


def curves_figure(study: PastLength) -> go.Figure:
    """Bits per character by position (bins of ``CURVE_BIN``), the mean over seeds per
    encoding, the training context marked."""
    fig = go.Figure()
    for enc, g in (study.curve.groupby("encoding", sort=False) if len(study.curve) else ()):
        mean = g.groupby("position").bits.mean()
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, name=NAMES[enc],
                                 line=dict(color=COLOURS[enc])))
    fig.add_vline(x=rule.LENGTH_CONTEXT, line_dash="dot",
                  annotation_text="trained context")
    fig.update_layout(xaxis_title="position (characters)", xaxis_type="log",
                      yaxis_title="bits per character", height=380,
                      margin=dict(l=60, r=20, t=30, b=50), legend=dict(orientation="h"))
    return fig


def pattern_figure(study: PastLength, encoding: str = "none") -> go.Figure:
    """Beside the loss, what the states hold, per length: each layer's adjacency score and
    the share of rows in [n/2, n) ranking their neighbour above position i - n/2."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "adjacency score", "rows ranking i - 1 above i - n/2"), horizontal_spacing=0.12)
    st = study.states[study.states.encoding == encoding] if len(study.states) else None
    if st is None or st.empty:
        return fig
    for layer, g in st.groupby("layer"):
        m = g.groupby("length")[["score", "ordered"]].mean()
        for col, field in ((1, "score"), (2, "ordered")):
            fig.add_trace(go.Scatter(x=m.index, y=m[field], name=f"layer {layer}",
                                     legendgroup=str(layer), showlegend=col == 1,
                                     mode="lines+markers"), row=1, col=col)
    fig.add_hline(y=rule.ORDER_LEVEL, line_dash="dot", row=1, col=2)
    fig.update_xaxes(type="log", title_text="length (characters)")
    fig.update_layout(height=360, margin=dict(l=50, r=20, t=40, b=50))
    return fig


def temperature_figure(T: int = max(rule.LENGTH_LENGTHS)) -> go.Figure:
    """The sharpening check's factor on the queries at each position (``temperature``): 1
    within the trained context, log(i + 1) / log(256) past it."""
    t = rule.temperature(T)
    fig = go.Figure(go.Scatter(x=np.arange(1, T + 1), y=t, name="temperature"))
    fig.add_vline(x=rule.LENGTH_CONTEXT, line_dash="dot", annotation_text="trained context")
    fig.update_layout(xaxis_title="position i + 1", xaxis_type="log",
                      yaxis_title="factor on the logits", height=300,
                      margin=dict(l=60, r=20, t=30, b=50))
    return fig


def length_rows(folder: Path | None = None) -> list[dict]:
    """The scorecard's rows of the readings (one per ``LENGTH_CLAIMS`` entry) on the
    committed study (``read``): judged once it can be, else untested with the seeds in."""
    study = read(folder)
    model = model_of(TEXT_PROFILES["text"].config("none", len(corpus.load().vocab)))
    table = None if study.tests is None else claims.claim_table(study.tests, by="group")
    have = ", ".join(f"{NAMES[e]} {len(study.seeds[e])}" for e in rule.PAST_ENCODINGS)
    note = (f"not judged: {FILE} holds {have} of the {rule.LENGTH_MIN_SEEDS} seeds each "
            "the rule needs")
    evidence = (f"committed: {FILE}, the text-length study, "
                + (f"and its rerun under a second CPU kernel set ({kernels_rule.KERNEL_FILE})"
                   if study.kernels == "two sets" else "on one CPU kernel set so far"))
    return [make_row((claim, paper, "past_length", "verdicts"), reading, model,
                     None if table is None else table[table.reading == reading], "group",
                     evidence, note)
            for (claim, reading), paper in zip(rule.LENGTH_CLAIMS, PAPER)]
