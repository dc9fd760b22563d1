"""Position along long sequences at initialisation: the score against length, and resolution.

The paper scores sequences of about 30 tokens. Along thousands, the averaged term of block 1
changes less and less from one position to the next (a_i and a_{i-d} share all but d of their
i terms), while the token term and the finite width keep their noise, so the adjacency score,
an average over every pair of earlier positions, can stay above chance while nearby positions
can no longer be told apart. This module measures both on random models of several widths,
with global causal attention and with a sliding window, and predicts both from the averaging
theory (``nopelib.averaging.theory``; block 1 only) before the model is run:

- the adjacency score of every layer at every prefix length (one forward pass gives them all:
  a causal model's state at position i depends only on positions <= i), scored exactly
  (``metrics.adjacency_score``, O(T^2 log T) per matrix, no quadratic-memory fallback);
- the *resolution* d*(i): the smallest distance d at which row i of the similarity matrix ranks
  its neighbour i - 1 above position i - d with probability ORDER_LEVEL or more. Rows are
  pooled per octave [a/2, a) of positions; the theory's probability of each comparison is
  ``theory.comparison_probabilities`` on the very tokens the model read. "Unresolved" (NaN)
  means no distance up to a/2 reaches the level: row i cannot tell its neighbour from any
  position in the second half of its prefix.

The longest settings run by hand, one command, committed with provenance::

    python -m nopelib.studies.long_context --out book/results/long_context.json

and the chapter runs the same code live at shorter lengths.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nopelib.averaging.theory import comparison_probabilities, residual_gram
from nopelib.averaging.theory_config import comparison_model, predict_config_score
from nopelib.core.cost import Cost
from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.core.model import GPTConfig
from nopelib.core.params import SEED, Int, ListOf
from nopelib.core.stats import t_interval
from nopelib.rules.beyond_claims import ORDER_LEVEL
from nopelib.results import files as results, guard
from nopelib.core.one_model import length_tokens, random_model

ROWS_PER_OCTAVE = 256  # rows sampled (evenly) from each octave of positions
DISTANCES_PER_OCTAVE = 16  # distances, log-spaced from 2 to a/2, per octave [a/2, a)
MIN_OCTAVE = 16  # the first octave is [8, 16)
THEORY_TRIPLES = 20_000  # sampled comparisons per predicted score beyond this many


def octaves(T: int) -> list[int]:
    """The upper ends a of the octaves [a/2, a) of rows that fit in T positions."""
    if type(T) is not int or T < MIN_OCTAVE:
        raise ValueError(f"T={T!r} must be an integer >= {MIN_OCTAVE}")
    out, a = [], MIN_OCTAVE
    while a <= T:
        out.append(a)
        a *= 2
    return out


def resolution_triples(T: int) -> pd.DataFrame:
    """The comparisons that read resolution in a length-T sequence: for each octave a, up to
    ROWS_PER_OCTAVE rows k in [a/2, a) (0-based) and each distance d (log-spaced, 2..a/2),
    the comparison (k, k - d, k - 1): is C[k, k-1] > C[k, k-d]? Columns octave, k, d, i, j
    (i = k - d < j = k - 1, the order of ``theory.comparison_probabilities``)."""
    parts = []
    for a in octaves(T):
        rows = np.unique(np.linspace(a // 2, a - 1, min(ROWS_PER_OCTAVE, a // 2)).astype(int))
        ds = np.unique(np.geomspace(2, a // 2, DISTANCES_PER_OCTAVE).round().astype(int))
        k, d = np.meshgrid(rows, ds, indexing="ij")
        parts.append(pd.DataFrame({"octave": a, "k": k.ravel(), "d": d.ravel()}))
    out = pd.concat(parts, ignore_index=True)
    return out.assign(i=out.k - out.d, j=out.k - 1)


def order_outcomes(C: np.ndarray, triples: pd.DataFrame) -> np.ndarray:
    """Whether each comparison orders the neighbour first, C[k, j] > C[k, i], in every
    matrix of C [M, T, T]: bool [M, N]."""
    k, i, j = (triples[c].to_numpy() for c in ("k", "i", "j"))
    return C[:, k, j] > C[:, k, i]


def predicted_order(config: GPTConfig, tokens: Sequence[int], triples: pd.DataFrame,
                    window: int | None = None) -> np.ndarray:
    """The theory's probability of each comparison in block 1 of a random ``config`` model
    reading ``tokens`` (``theory.comparison_probabilities`` with the closed-form rho of
    ``theory_config.comparison_model``; no activation is measured): [N]."""
    rho, common = comparison_model(config)
    K = residual_gram(list(tokens), rho, window)
    idx = triples[["k", "i", "j"]].to_numpy()
    return comparison_probabilities(K, idx, config.n_embd, common)


@torch.no_grad()
def long_run(config: GPTConfig, seed: int, T: int, lengths: Sequence[int],
             window: int | None = None) -> dict:
    """One random model of ``config`` (seed ``seed``) on one length-T sequence of the tasks'
    alphabet (``one_model.length_tokens(T, seed)``), with ``window`` (None: global causal
    attention). Returns {"scores": [[length, layer, score]], "predicted_scores": [[length,
    predicted layer-1 score]], "order": [[layer, octave, d, fraction of rows ordered
    right]], "predicted_order": [[octave, d, mean predicted probability]]}."""
    if any(L < 3 or L > T for L in lengths):
        raise ValueError(f"lengths={list(lengths)!r} must lie in 3..T={T}")
    config = replace(config, block_size=max(config.block_size, T))
    model = random_model(config, seed=seed)
    tokens = length_tokens(T, seed)
    idx = torch.tensor([tokens])
    states = model.hidden_states(idx, "fused", window)[:, 0].float()  # [L+1, T, d]
    C = cosine_similarity_matrix(states).numpy()  # [L+1, T, T]
    del states
    scores = [[L, layer, float(s)] for L in sorted(lengths)
              for layer, s in enumerate(adjacency_score(C[:, :L, :L]))]
    predicted_scores = [[L, predict_config_score(config, [tokens[:L]], THEORY_TRIPLES,
                                                 seed=seed, window=window)]
                        for L in sorted(lengths)]
    triples = resolution_triples(T)
    hits = order_outcomes(C, triples)  # [L+1, N]
    del C
    keys = triples[["octave", "d"]]
    order = [[layer, int(a), int(d), float(f)] for layer in range(hits.shape[0])
             for (a, d), f in keys.assign(f=hits[layer]).groupby(["octave", "d"]).f.mean()
             .items()]
    p = predicted_order(config, tokens, triples, window)
    predicted = [[int(a), int(d), float(f)]
                 for (a, d), f in keys.assign(f=p).groupby(["octave", "d"]).f.mean().items()]
    return {"scores": scores, "predicted_scores": predicted_scores, "order": order,
            "predicted_order": predicted}


def run_frames(runs: Sequence[dict]) -> dict[str, pd.DataFrame]:
    """The runs' records (each ``long_run``'s output with its n_embd, seed and window) as
    frames: "scores" (n_embd, window, seed, length, layer, score, and the layer-1 prediction
    as predicted), "order" (n_embd, window, seed, layer, octave, d, measured, and the
    prediction on layer 1's rows)."""
    def frame(run: dict, field: str, columns: list[str]) -> pd.DataFrame:
        return pd.DataFrame(run[field], columns=columns).assign(
            n_embd=run["n_embd"], window=run["window"] or 0, seed=run["seed"])

    scores = pd.concat([frame(r, "scores", ["length", "layer", "score"]).merge(
        frame(r, "predicted_scores", ["length", "predicted"]))
        for r in runs], ignore_index=True)
    order = pd.concat([frame(r, "order", ["layer", "octave", "d", "measured"]).merge(
        frame(r, "predicted_order", ["octave", "d", "predicted"]))
        for r in runs], ignore_index=True)
    return {"scores": scores, "order": order}


def threshold_distance(d: np.ndarray, p: np.ndarray, level: float = ORDER_LEVEL) -> float:
    """The smallest distance at which the curve p(d) (d increasing) reaches ``level``,
    interpolated in log d between grid points; d[0] if it starts there, NaN if it never
    does (unresolved within the distances)."""
    d, p = np.asarray(d, float), np.asarray(p, float)
    above = np.flatnonzero(p >= level)
    if above.size == 0:
        return float("nan")
    n = int(above[0])
    if n == 0:
        return float(d[0])
    f = (level - p[n - 1]) / (p[n] - p[n - 1])
    return float(np.exp(np.log(d[n - 1]) + f * (np.log(d[n]) - np.log(d[n - 1]))))


def resolution(order: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """d*(i) per (n_embd, window, layer, octave), the seed as the unit. The fraction ordered
    right is averaged per seed, then over seeds with its Student t interval at ``level``
    (pointwise); d* is read from the seed mean, and its interval by inverting the band: from
    where the upper end reaches ORDER_LEVEL to where the lower end does (NaN: never
    within the distances). "predicted" is the theory's d* (block 1, so the layer-1 rows
    only). Columns: n_seeds, d_star, d_lo, d_hi, predicted, and each as a share of the
    octave's middle position. A windowed model's octaves that its window covers whole (a <=
    window) are left out: they repeat the global model's."""
    rows = []
    # a window of w tokens covers every row of an octave a <= w: the same outcomes as global
    # attention, which a table must not count twice
    order = order[(order.window == 0) | (order.octave > order.window)]
    for key, g in order.groupby(["n_embd", "window", "layer", "octave"]):
        per_d = g.groupby("d")
        ds = np.array(sorted(g.d.unique()))
        stats = [t_interval(per_d.get_group(x).measured.to_numpy(), level) for x in ds]
        mean, lo, hi = (np.array(s) for s in zip(*stats))
        pred = per_d.predicted.mean().reindex(ds).to_numpy()
        middle = 0.75 * key[3]  # the octave [a/2, a) by its middle row
        row = dict(zip(["n_embd", "window", "layer", "octave"], key),
                   n_seeds=g.seed.nunique(), d_star=threshold_distance(ds, mean),
                   d_lo=threshold_distance(ds, hi), d_hi=threshold_distance(ds, lo),
                   predicted=threshold_distance(ds, pred) if key[2] == 1 else float("nan"))
        row.update({f"{c} / i": row[c] / middle for c in ("d_star", "d_lo", "d_hi",
                                                          "predicted")})
        rows.append(row)
    return pd.DataFrame(rows)


def agreement_bounds(res: pd.DataFrame, agree: pd.Series) -> tuple[int, int]:
    """Of the cells where the theory's d* agrees (``beyond_claims.resolution_agreement``),
    how many have a measured interval bounded on both sides, and how many one open at the
    top (any d* beyond its lower end agrees there)."""
    hit = res.loc[agree[agree == "agrees"].index]
    bounded = int(np.isfinite(hit.d_hi.fillna(np.inf)).sum())
    return bounded, len(hit) - bounded


def score_table(scores: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """The adjacency score per (n_embd, window, layer, length): the mean over seeds with its
    Student t interval at ``level``, and the mean layer-1 prediction. Columns score, lo, hi,
    n_seeds, predicted (layer 1 only)."""
    rows = []
    for key, g in scores.groupby(["n_embd", "window", "layer", "length"]):
        mean, lo, hi = t_interval(g.score.to_numpy(), level)
        rows.append(dict(zip(["n_embd", "window", "layer", "length"], key), score=mean,
                         lo=lo, hi=hi, n_seeds=len(g),
                         predicted=g.predicted.mean() if key[2] == 1 else float("nan")))
    return pd.DataFrame(rows)


def model_name(width: int, window: int) -> str:
    """How the chapter and ``beyond_claims.long_claims`` name a model: "384 wide[, window 64]"."""
    return f"{width} wide" + (f", window {window}" if window else "")


def resolved_up_to(res: pd.DataFrame) -> pd.DataFrame:
    """Per model and layer, the last octave [a/2, a) whose rows resolve some distance (d*
    finite on the seed mean; 0 where none does), measured and, on layer 1, predicted.
    ``res``: ``resolution``'s table. Columns model, layer, measured, predicted."""
    def last(frame: pd.DataFrame, column: str) -> int:
        finite = frame.octave[frame[column].notna()]
        return int(finite.max()) if len(finite) else 0

    rows = [dict(model=model_name(w, win), layer=layer, measured=last(g, "d_star"),
                 predicted=last(g, "predicted") if layer == 1 else None)
            for (w, win, layer), g in res.groupby(["n_embd", "window", "layer"])]
    return pd.DataFrame(rows)


def verdict_lines(table: pd.DataFrame) -> str:
    """Markdown: one bullet per reading of ``claims.claim_table(long_claims(...), by="group")``
    with each model's verdict and its weakest test (layer, mean and interval)."""
    lines = []
    for (claim, reading), g in table.groupby(["claim", "reading"], sort=False):
        parts = [f"{r.group}: **{r.verdict}** (layer {r.weakest_layer}: {r.mean:.3f} "
                 f"[{r.lo:.3f}, {r.hi:.3f}])" for r in g.itertuples()]
        lines.append(f"- *{claim}* ({reading}): " + "; ".join(parts) + ".")
    return "\n".join(lines)


def summary(table: pd.DataFrame, up_to: pd.DataFrame, T: int) -> str:
    """Markdown: what each model keeps at ``T`` tokens, in words, from the verdicts of
    ``claims.claim_table(long_claims(...), by="group")`` and ``resolved_up_to``: whether its
    score stays above chance, whether its neighbours are resolved at length, and the last
    octave layer 1 and the last layer resolve."""
    from nopelib.rules.claims import combine
    from nopelib.rules.beyond_claims import LONG_CLAIMS

    above, unresolved, resolved = (LONG_CLAIMS[i][0] for i in (1, 2, 3))
    words = {"holds": "stays above chance", "fails": "is near chance",
             "cannot tell": "cannot be told from chance"}
    unsure = "the data cannot tell whether neighbours are resolved"
    local = {unresolved: {"holds": "neighbours are unresolved", "fails":
                          "neighbours stay resolved", "cannot tell": unsure},
             resolved: {"holds": "neighbours stay resolved", "fails":
                        "neighbours are unresolved", "cannot tell": unsure}}
    last = int(up_to.layer.max())
    lines = []
    for model, g in table.groupby("group", sort=False):
        # a global-attention model is read by the criticism, a window model by the contrast
        reading = resolved if (g.claim == resolved).any() else unresolved
        verdict = {c: combine(g[g.claim == c].verdict) for c in (above, reading)}
        mine = up_to[up_to.model == model].set_index("layer").measured
        reach = ", ".join(f"layer {layer} to position {int(mine[layer]):,}" if mine[layer]
                          else f"layer {layer} nowhere" for layer in (1, last))
        lines.append(f"- **{model}**: at {T:,} tokens the score {words[verdict[above]]} and "
                     f"{local[reading][verdict[reading]]}; rows resolve some distance on "
                     f"{reach}.")
    return "\n".join(lines)


def study(widths: Sequence[int], seeds: Sequence[int], T: int, windows: Sequence[int | None],
          base: GPTConfig | None = None, window_width: int | None = None) -> list[dict]:
    """``long_run`` for every width (global attention) and, at ``window_width`` (the base
    width by default), every sliding window in ``windows``; each seed one model and one
    sequence. Each record carries its n_embd, window and seed."""
    base = base or GPTConfig()
    lengths = [L for L in (2 ** np.arange(5, 15)).tolist() if L <= T]
    if T not in lengths:
        lengths.append(T)
    jobs = [(w, None) for w in widths]
    jobs += [(window_width or base.n_embd, win) for win in windows if win is not None]
    out = []
    for width, window in jobs:
        for seed in seeds:
            run = long_run(replace(base, n_embd=width), seed, T, lengths, window)
            out.append({"n_embd": width, "window": window, "seed": seed, **run})
    return out


MODEL_SECONDS = 120  # one model of width <= 768 at 8,192 tokens, on the 2-core dev machine


def model_units(T: int, widths: Sequence[int], windows: Sequence[int],
                base: GPTConfig | None = None) -> float:
    """What one seed's models cost (``study``: every width, and every window at the base
    width), in models of width <= 768 at 8,192 tokens: each (T / 8192)^2 (the similarity
    tensors) times (width / 768)^2 above 768 (the forward pass)."""
    base = base or GPTConfig()
    return sum((T / 8192) ** 2 * max(1.0, w / 768) ** 2
               for w in [*widths, *[base.n_embd] * len(windows)])


def joint_cost(flag: str = "") -> Cost:
    """The bound on seeds x models x length together, which within their own bounds could run
    for days; the parameters named with ``flag`` in front (a command's: "--")."""
    return Cost((f"{flag}seeds",), MODEL_SECONDS,
                "~2 min, a model of width <= 768 at 8,192 tokens on the 2-core development "
                "machine", scale=lambda p: model_units(p[f"{flag}T"], p[f"{flag}widths"],
                                                       p[f"{flag}windows"]),
                scale_text=f"models (each (T / 8192)^2 x max(1, width / 768)^2; {flag}windows "
                           f"at width {GPTConfig().n_embd})")


def windows_rule(flag: str = "", min_len: int = 1) -> ListOf:
    """Sliding windows, each at most T (the parameter ``flag`` + "T")."""
    return ListOf(Int(min=1), unique=True, min_len=min_len, max_len=4,
                  why="each window adds one base-width model per seed").where(
        lambda windows, p: all(w <= p[f"{flag}T"] for w in windows),
        f"each window at most {flag}T")


WIDTHS = ListOf(Int(min=6, max=1536, why="a 1536-wide model at 8,192 tokens is ~10 min"
                    ).where(lambda w, p: w % 6 == 0, "divisible by the 6 heads"),
                unique=True, min_len=1, max_len=8, why="one model per width and seed")
SEEDS = ListOf(SEED, unique=True, min_len=3, max_len=20,
               why="the seed is the unit (3 for an interval); each adds one model per width "
                   "and window")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.long_context",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the long_*.json to write")
    parser.add_argument("--T", type=int, default=8192, help="sequence length")
    parser.add_argument("--widths", type=int, nargs="+", default=[192, 384, 768])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--windows", type=int, nargs="*", default=[64],
                        help="sliding windows, at the base width")
    parser.add_argument("--replace", action="store_true",
                        help="replace the file at --out (default: an existing file is refused)")
    args = parser.parse_args(argv)
    from nopelib.core.params import OutPath, check_args

    check_args(parser, {  # exit 2 now, not after an hour
        "--out": (args.out, OutPath().where(
            lambda out, _: Path(out).name.startswith("long_") and Path(out).suffix == ".json",
            "a long_*.json file (the chapter finds it by its name)")),
        "--T": (args.T, Int(min=MIN_OCTAVE, max=16_384, why="a [7, T, T] float32 similarity "
                            "tensor: 1.9 GB at 8,192, 7.5 GB at 16,384")),
        "--widths": (args.widths, WIDTHS),
        "--seeds": (args.seeds, SEEDS.costing(joint_cost("--"))),
        "--windows": (args.windows, windows_rule("--", min_len=0)),
    })
    would = guard.summary("long", {"T": args.T, "n_embd": args.widths,
                                          "window": args.windows, "seed": args.seeds})
    if problem := guard.single_problem(args.out, "long", would, args.replace):
        parser.error(problem)
    start = time.perf_counter()
    runs = study(args.widths, args.seeds, args.T, args.windows)
    doc = {"provenance": results.provenance("python -m nopelib.studies.long_context", argv, start,
                                            T=args.T, base=GPTConfig().to_dict()),
           "runs": runs}
    results.write(args.out, doc, "long",
                  merge=None if args.replace else guard.unwritten(args.out, would))
    print(f"wrote {args.out}: {len(runs)} runs in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
