"""Rules for text past its training length: NoPE against RoPE and ALiBi, and the pattern there.

Fixed before the text-length study (``nopelib.studies.text_length``) ran. Language models of
the text chapter's size and schedule (the ``text`` profile: 4 x 128, context 256, 4,000 steps)
are trained with four encodings and read on held-out text of the test books at 256, 512,
1,024 and 2,048 characters. A causal model's prediction at position i reads positions <= i
alone, so one pass over a window of the longest length gives every shorter length as the
window's prefix: the bits per character at length n are the mean over the first n positions.

The readings, each judged with the seed as the unit (one-sided t bounds, "holds" at ALPHA,
"fails" Bonferroni-corrected within the reading, as for the paper's claims):
- whether NoPE's loss rises past 256 (what later work reports), and whether it rises less
  than RoPE's and ALiBi's (what Kazemnejad et al. report on synthetic tasks), paired by seed
  (one seed is one data order and one draw of the held-out windows for every encoding);
- whether a temperature on the attention logits growing with log length (queries at
  position i scaled by max(1, log(i + 1) / log(256)): evaluation only, nothing retrained)
  lowers NoPE's loss past 256;
- where the loss moves, what the hidden states hold: layer 1's adjacency score, and whether
  rows i in [n/2, n) still rank their neighbour i - 1 above position i - n/2 (the long-
  sequences chapter's reading of resolution) in some layer. ``explains`` joins them: a rise
  where no layer resolves its neighbours, and every layer did within the context, is what the
  mechanism predicts; a rise where some layer still resolves them is not explained by it.

The readings of trained models are judged only when every trained seed of the encodings they
read beats the unigram baseline at 256 characters (else "not trained").
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from nopelib.rules.beyond_claims import ABOVE_CHANCE, ORDER_LEVEL, TEXT_CONTEXT
from nopelib.rules.claims import ALPHA, judge_families

LENGTH_CONTEXT = TEXT_CONTEXT  # characters the models trained on (the text profile's context)
LENGTH_LENGTHS = (256, 512, 1024, 2048)  # held-out lengths read: the context and beyond it
LENGTH_ENCODINGS = ("none", "rope", "alibi", "learned")
PAST_ENCODINGS = ("none", "rope", "alibi")  # a learned table has no row past the context
LENGTH_MIN_SEEDS = 3  # per encoding: the fewest seeds a verdict is given on
BPC_WINDOWS = 64  # held-out windows of max(LENGTH_LENGTHS) + 1 characters per model
STATE_WINDOWS = 32  # the first of them whose hidden states are read (scores, resolution)
WINDOW_SEED = 1  # the test books' windows (the text study's scores read seed 0)
CURVE_BIN = 32  # positions per point of a per-position bits curve

LENGTH_CLAIMS = (
    ("beyond: past the length, NoPE's loss rises",
     f"NoPE: bits per character at n minus at {LENGTH_CONTEXT} above 0"),
    ("beyond: past the length, NoPE degrades less than RoPE",
     f"RoPE's rise from {LENGTH_CONTEXT} to n minus NoPE's above 0, paired by seed"),
    ("beyond: past the length, NoPE degrades less than ALiBi",
     f"ALiBi's rise from {LENGTH_CONTEXT} to n minus NoPE's above 0, paired by seed"),
    ("beyond: past the length, a log-length temperature helps NoPE",
     "NoPE: bits per character at n minus with the temperature above 0"),
    ("beyond: past the length, the pattern reaches it",
     f"NoPE: layer 1's adjacency score at n above {ABOVE_CHANCE:g}"),
    ("beyond: past the length, neighbours resolved",
     f"NoPE: rows i in [n/2, n) rank i - 1 above i - n/2 at least {ORDER_LEVEL:g} of the "
     "time, layer by layer"),
)
LENGTH_RULE = (f"the seed as the unit (at least {LENGTH_MIN_SEEDS} per encoding, the same "
               "seeds for every encoding); one-sided t bounds, each reading one family over "
               "its lengths (and layers), holds / fails / cannot tell as for the paper's "
               "claims; readings of trained models only when every trained seed they read "
               "beats the unigram baseline at the context length (else 'not trained')")
EXPLAINS = ("consistent with the mechanism", "not explained by the mechanism",
            "no rise to explain", "cannot tell")


def lengths_read(encoding: str, context: int = LENGTH_CONTEXT) -> list[int]:
    """The lengths of LENGTH_LENGTHS a model with ``encoding`` reads: all of them, but a
    learned table's, which stop at its ``context``."""
    if encoding not in LENGTH_ENCODINGS:
        raise ValueError(f"encoding={encoding!r} is unknown; allowed: {LENGTH_ENCODINGS}")
    top = context if encoding == "learned" else max(LENGTH_LENGTHS)
    return [n for n in LENGTH_LENGTHS if n <= top]


def temperature(T: int, context: int = LENGTH_CONTEXT) -> np.ndarray:
    """The log-length temperature of the sharpening check: the factor on the queries (so on
    the attention logits) at positions 0..T-1, max(1, log(i + 1) / log(context)): 1 within
    the context, growing with log length past it [T]."""
    if type(T) is not int or T < 1 or type(context) is not int or context < 2:
        raise ValueError(f"T={T!r} must be an integer >= 1 and context={context!r} >= 2")
    return np.maximum(1.0, np.log(np.arange(1, T + 1)) / math.log(context))


def _check(bpc: pd.DataFrame, states: pd.DataFrame) -> dict[str, list[int]]:
    need_b = {"encoding", "seed", "length", "bpc", "sharpened"}
    need_s = {"seed", "layer", "length", "score", "ordered"}
    if not need_b <= set(bpc) or not need_s <= set(states):
        raise ValueError(f"length_claims: bpc needs columns {sorted(need_b)}, states needs "
                         f"{sorted(need_s)}")
    seeds = {e: sorted(bpc.loc[bpc.encoding == e, "seed"].unique()) for e in PAST_ENCODINGS}
    if any(len(s) < LENGTH_MIN_SEEDS for s in seeds.values()) or len(
            {tuple(s) for s in seeds.values()}) != 1:
        raise ValueError(f"length_claims: seeds per encoding {seeds}; each of "
                         f"{PAST_ENCODINGS} needs at least {LENGTH_MIN_SEEDS}, the same seeds")
    for e in PAST_ENCODINGS:
        have = set(bpc.loc[bpc.encoding == e, "length"])
        if set(LENGTH_LENGTHS) - have:
            raise ValueError(f"length_claims: {e} lacks the lengths "
                             f"{sorted(set(LENGTH_LENGTHS) - have)} of LENGTH_LENGTHS")
    if set(LENGTH_LENGTHS) - set(states.length):
        raise ValueError("length_claims: the NoPE states lack lengths "
                         f"{sorted(set(LENGTH_LENGTHS) - set(states.length))}")
    return seeds


def length_claims(bpc: pd.DataFrame, states: pd.DataFrame, baseline_bpc: float,
                  alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the readings (``LENGTH_CLAIMS``). ``bpc``: one row per (encoding, seed,
    length) with ``bpc`` (bits per character over the first ``length`` positions of the
    held-out windows) and ``sharpened`` (the same with the log-length temperature; NaN where
    not measured); ``states``: the trained NoPE models, one row per (seed, layer, length)
    with ``score`` (the adjacency score over the first ``length`` positions) and ``ordered``
    (the share of rows i in [length/2, length) with C[i, i-1] > C[i, i-length/2]), each the
    mean over the windows; ``baseline_bpc``: the unigram baseline. Rows as
    ``claims.judge_families``'s, plus ``note``."""
    _check(bpc, states)
    wide = {e: bpc[bpc.encoding == e].pivot_table(index="seed", columns="length",
                                                  values="bpc") for e in PAST_ENCODINGS}
    rise = {e: w.sub(w[LENGTH_CONTEXT], axis=0) for e, w in wide.items()}  # [seed, length]
    sharp = bpc[bpc.encoding == "none"].pivot_table(index="seed", columns="length",
                                                    values="sharpened")
    past = [n for n in LENGTH_LENGTHS if n > LENGTH_CONTEXT]
    tests = [(*LENGTH_CLAIMS[0], f"{n} chars", -1, rise["none"][n], 0.0, True) for n in past]
    for i, e in ((1, "rope"), (2, "alibi")):
        tests += [(*LENGTH_CLAIMS[i], f"{n} chars", -1, (rise[e][n] - rise["none"][n]),
                   0.0, True) for n in past]
    tests += [(*LENGTH_CLAIMS[3], f"{n} chars", -1, wide["none"][n] - sharp[n], 0.0, True)
              for n in past]
    score = states.pivot_table(index="seed", columns=["length", "layer"], values="score")
    tests += [(*LENGTH_CLAIMS[4], f"{n} chars", 1, score[(n, 1)], ABOVE_CHANCE, True)
              for n in LENGTH_LENGTHS]
    ordered = states.pivot_table(index="seed", columns=["length", "layer"], values="ordered")
    tests += [(*LENGTH_CLAIMS[5], f"{n} chars", layer, ordered[(n, layer)], ORDER_LEVEL, True)
              for n, layer in ordered.columns if layer >= 1]
    at_context = bpc[bpc.length == LENGTH_CONTEXT]
    beaten = at_context.assign(ok=at_context.bpc < baseline_bpc).groupby("encoding").ok.all()
    reads = {0: ("none",), 1: ("none", "rope"), 2: ("none", "alibi"), 3: ("none",),
             4: ("none",), 5: ("none",)}
    claim_of = {c[0]: i for i, c in enumerate(LENGTH_CLAIMS)}
    ok = [all(beaten.get(e, False) for e in reads[claim_of[t[0]]]) for t in tests]
    judged = [t for t, k in zip(tests, ok) if k]
    skipped = [t for t, k in zip(tests, ok) if not k]
    parts = [judge_families(judged, alpha).assign(note="")] if judged else []
    if skipped:
        parts.append(pd.DataFrame([
            dict(claim=c, reading=r, group=g, layer=layer, bound=b, above=a, n=len(v),
                 verdict="cannot tell", note="not trained")
            for c, r, g, layer, v, b, a in skipped]))
    return pd.concat(parts, ignore_index=True)


def explains(table: pd.DataFrame) -> pd.DataFrame:
    """Per length past the context, whether the mechanism accounts for NoPE's rise there,
    from ``length_claims``'s verdicts: no rise ("fails" on the first reading): "no rise to
    explain"; a rise ("holds") where every layer from 1 fails to resolve its neighbours
    while every layer resolved them at the context length: "consistent with the mechanism";
    a rise where some layer still resolves them, or where none did even at the context:
    "not explained by the mechanism"; anything else "cannot tell". Columns group, rises,
    resolved (the layers that hold), verdict."""
    def verdicts(i: int, group: str) -> pd.Series:
        at = table[(table.claim == LENGTH_CLAIMS[i][0]) & (table.group == group)]
        return at.set_index("layer").verdict

    within = verdicts(5, f"{LENGTH_CONTEXT} chars")
    rows = []
    for n in (n for n in LENGTH_LENGTHS if n > LENGTH_CONTEXT):
        group = f"{n} chars"
        rises = verdicts(0, group)
        rises = rises.iloc[0] if len(rises) else "cannot tell"
        resolved = verdicts(5, group)
        if rises == "fails":
            verdict = EXPLAINS[2]
        elif rises != "holds" or resolved.empty or within.empty:
            verdict = EXPLAINS[3]
        elif (resolved == "holds").any() or (within == "fails").all():
            verdict = EXPLAINS[1]
        elif (resolved == "fails").all() and (within == "holds").all():
            verdict = EXPLAINS[0]
        else:
            verdict = EXPLAINS[3]
        rows.append({"group": group, "rises": rises,
                     "resolved": [int(x) for x in resolved.index[resolved == "holds"]],
                     "verdict": verdict})
    return pd.DataFrame(rows)
