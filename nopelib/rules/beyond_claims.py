"""Rules for what goes beyond the paper: long sequences, the early dynamics, real text.

Fixed before the data, like the paper's claims (``claims``): the long-sequence chapter's
readings, the rule that says which cause explains the early collapse of the layer-1 pattern
and the reading of an ablated run trained to the end of its budget, and the text study's
readings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from nopelib.rules.claims import (ALPHA, CHANCE, KEEPS_AT, LEARNED_AT, PLATEAU_TAIL,
                                  judge_families, past_plateau)
from nopelib.rules.init_claims import NEAR_CHANCE


# the paper's own limit (claim 6): its inputs are about 30 tokens long
SHORT_INPUTS = "6: beyond ~30 tokens"
# "the pattern is there": above chance by more than layer 0's "about 0.5" allows
ABOVE_CHANCE = CHANCE + NEAR_CHANCE
ORDER_LEVEL = 0.75  # a distance is resolved when row i orders it behind i - 1 this often
LONG_CLAIMS = (
    ("beyond: layer 1 in the paper's range at length",
     f"layer 1 at least {KEEPS_AT:g} at T tokens"),
    ("beyond: the pattern above chance at length",
     f"every layer from 1 above {ABOVE_CHANCE:g} at T tokens"),
    ("beyond: neighbours unresolved at length (the criticism)",
     "global attention: rows i in [T/2, T) rank i - 1 above i - T/2 less often than "
     f"{ORDER_LEVEL:g}"),
    ("beyond: a sliding window resolves them (the contrast)",
     f"window W: rows i in [T/2, T) rank i - 1 above i - T/2 at least {ORDER_LEVEL:g} of the "
     "time"),
)


def long_claims(scores: pd.DataFrame, order: pd.DataFrame,
                alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the long-sequence readings, the model seed as the unit, at the longest
    length T scored. ``scores`` and ``order`` are ``long_context.run_frames``'s frames (one
    sequence per seed). Groups are the models ("<width> wide", with ", window W" for a
    sliding window); each reading one family; rows as ``init_claims``'s. The resolution
    tests read the farthest distance tried (d = T/2, where the averaging theory's gap is
    largest) on the last octave of rows. The criticism is judged on the global-attention
    models only ("holds": unresolved, below ORDER_LEVEL; "fails": resolved); the window
    models, which the criticism itself expects to resolve, are a contrast reading of their
    own ("holds": resolved, above ORDER_LEVEL)."""
    T = int(scores["length"].max())
    last = order[(order.octave == order.octave.max())]
    last = last[last.d == last.d.max()]
    tests = []
    for (width, window), g in scores[scores.length == T].groupby(["n_embd", "window"]):
        name = f"{width} wide" + (f", window {window}" if window else "")  # model_name's
        wide = g.pivot_table(index="seed", columns="layer", values="score")
        tests.append((*LONG_CLAIMS[0], name, 1, wide[1], KEEPS_AT, True))
        tests += [(*LONG_CLAIMS[1], name, i, wide[i], ABOVE_CHANCE, True)
                  for i in wide if i]
        mine = last[(last.n_embd == width) & (last.window == window)]
        far = mine.pivot_table(index="seed", columns="layer", values="measured")
        reading, above = (LONG_CLAIMS[3], True) if window else (LONG_CLAIMS[2], False)
        tests += [(*reading, name, i, far[i], ORDER_LEVEL, above) for i in far if i]
    if not tests:
        raise ValueError("long_claims: no scores to judge")
    return judge_families(tests, alpha)


def resolution_agreement(res: pd.DataFrame) -> pd.Series:
    """Whether the theory's d*(i) lies in the measured interval, per layer-1 row of
    ``long_context.resolution`` (NaN read as "beyond every distance tried"): "agrees",
    "disagrees", or "uninformative" where neither side says anything: the prediction is
    "unresolved" and the measured interval is not finite at both ends (such a cell agrees
    whatever the theory says). Indexed as ``res``'s layer-1 rows; score only the informative
    cells."""
    rows = res[res.layer == 1]
    lo, hi, pred = (rows[c].fillna(np.inf) for c in ("d_lo", "d_hi", "predicted"))
    informative = np.isfinite(pred) | (np.isfinite(lo) & np.isfinite(hi))
    agrees = np.where((lo <= pred) & (pred <= hi), "agrees", "disagrees")
    return pd.Series(np.where(informative, agrees, "uninformative"), index=rows.index)


# ---------------------------------------------------------------------------------------------
# early dynamics: what takes the layer-1 pattern away in the first steps of training

EARLY_STEPS = 1_000  # the window read: the first steps, where the collapse happens
COLLAPSED_BELOW = 0.6  # a run's layer 1 has collapsed once a point in the window is below
FALLS_AT = 0.7  # reported: the first step where layer 1 is below this
CAUSE_VERDICTS = ("explains", "does not explain", "no collapse", "cannot tell")
CAUSE_RULE = (f"per task and ablation, the seed as the unit, on layer 1's score at every "
              f"curve point up to step {EARLY_STEPS:,}: 'explains' when on every seed the "
              f"unablated run falls below {COLLAPSED_BELOW} and the ablated run never falls "
              f"below {KEEPS_AT}; 'does not explain' when on every seed both fall below "
              f"{COLLAPSED_BELOW}; 'no collapse' when no seed's unablated run falls below "
              f"{COLLAPSED_BELOW}; otherwise, or with fewer than 3 seeds or unpaired seeds, "
              f"'cannot tell'")
MIN_CAUSE_SEEDS = 3  # an every-seed rule on fewer seeds says too little


def window_min(steps: Sequence[int], scores: Sequence[float],
               until: int = EARLY_STEPS) -> float:
    """The lowest score at the curve points up to step ``until`` (the initialisation, step 0,
    included when given); NaN when no point lies in the window."""
    steps, scores = np.asarray(steps), np.asarray(scores, dtype=float)
    if steps.shape != scores.shape:
        raise ValueError(f"steps {steps.shape} and scores {scores.shape} differ in shape")
    inside = scores[steps <= until]
    return float(inside.min()) if inside.size else float("nan")


def first_below(steps: Sequence[int], scores: Sequence[float],
                level: float = FALLS_AT) -> int | None:
    """The first curve step whose score is below ``level``, None if none is."""
    below = [int(s) for s, v in zip(steps, scores, strict=True) if v < level]
    return below[0] if below else None


def collapse_cause(base: Mapping[int, float], ablated: Mapping[int, float]) -> str:
    """The verdict of ``CAUSE_RULE`` for one task and ablation. ``base`` and ``ablated`` map
    each seed to its run's ``window_min`` of layer 1 (the unablated run, and the run of the
    same seed with the ablation). Every seed must be in both."""
    if set(base) != set(ablated) or len(base) < MIN_CAUSE_SEEDS:
        return "cannot tell"
    values = [*base.values(), *ablated.values()]
    if not all(np.isfinite(values)):
        return "cannot tell"
    collapsed = [base[s] < COLLAPSED_BELOW for s in base]
    if not any(collapsed):
        return "no collapse"
    if not all(collapsed):
        return "cannot tell"
    if all(ablated[s] >= KEEPS_AT for s in base):
        return "explains"
    if all(ablated[s] < COLLAPSED_BELOW for s in base):
        return "does not explain"
    return "cannot tell"


# The cause rule at matched training loss (registered 2026-12-05, before any run of the 'mlp'
# or 'input' ablations and before any comparison at matched loss was computed): an ablation
# whose model learns less has changed less, so "layer 1 falls less" may only say "the model
# has not learned". The ablated run is read where it has learned as far as the unablated run
# had when its layer 1 fell: at the first curve point whose training loss is at most the
# unablated run's loss at its fall.
MATCHED_VERDICTS = ("explains", "does not explain", "not matched", "no collapse", "cannot tell")
MATCHED_RULE = (f"per task and ablation, the seed as the unit: the unablated run's matched "
                f"loss is its training loss at the first curve point up to step "
                f"{EARLY_STEPS:,} where layer 1 is below {COLLAPSED_BELOW}; the ablated run of "
                f"the same seed is read at the first curve point whose training loss is at "
                f"most that (its matched step), on layer 1's lowest score up to there. "
                f"'explains' when on every seed the unablated run falls and the ablated run "
                f"reaches the matched loss with layer 1 never below {KEEPS_AT}; 'does not "
                f"explain' when on every seed it reaches it with layer 1 below "
                f"{COLLAPSED_BELOW}; 'not matched' when some ablated run never reaches the "
                f"matched loss in the window (it has not learned as far: no verdict); 'no "
                f"collapse' when no unablated run falls; otherwise, or with fewer than "
                f"{MIN_CAUSE_SEEDS} paired seeds, 'cannot tell'")


def fall_loss(steps: Sequence[int], loss: Sequence[float], layer1: Sequence[float]
              ) -> tuple[int, float] | None:
    """The first curve step up to EARLY_STEPS where ``layer1`` is below COLLAPSED_BELOW and
    the training loss there; None when it never is."""
    for step, value, score in zip(steps, loss, layer1, strict=True):
        if step <= EARLY_STEPS and score < COLLAPSED_BELOW:
            return int(step), float(value)
    return None


def matched_step(steps: Sequence[int], loss: Sequence[float], target: float) -> int | None:
    """The first curve step up to EARLY_STEPS whose training loss is at most ``target``."""
    return next((int(s) for s, v in zip(steps, loss, strict=True)
                 if s <= EARLY_STEPS and np.isfinite(v) and v <= target), None)


Curve = tuple[Sequence[int], Sequence[float], Sequence[float]]  # steps, loss, layer-1 score


def matched_cause(base: Mapping[int, Curve], ablated: Mapping[int, Curve]) -> str:
    """The verdict of ``MATCHED_RULE`` for one task and ablation: ``base`` and ``ablated``
    map each seed to its run's curve (steps, training loss, layer-1 score)."""
    if set(base) != set(ablated) or len(base) < MIN_CAUSE_SEEDS:
        return "cannot tell"
    falls = {seed: fall_loss(*curve) for seed, curve in base.items()}
    if not any(falls.values()):
        return "no collapse"
    if not all(falls.values()):
        return "cannot tell"
    lowest = {}
    for seed, (steps, loss, layer1) in ablated.items():
        step = matched_step(steps, loss, falls[seed][1])
        if step is None:
            return "not matched"
        lowest[seed] = window_min(steps, layer1, until=step)
    if all(v >= KEEPS_AT for v in lowest.values()):
        return "explains"
    if all(v < COLLAPSED_BELOW for v in lowest.values()):
        return "does not explain"
    return "cannot tell"


def across_kernels(verdicts: Sequence[str]) -> str:
    """One task and ablation's ``collapse_cause`` verdicts under several CPU kernel sets (the
    same study rerun under each): the verdict when they all agree, "cannot tell" when they
    differ, since the rule's margin is then inside the kernels' spread. Added after the AVX2
    rerun of the 4 x 96 study, where one pair differed (indexing, embedding held): it can only
    withdraw a verdict, never give one."""
    if not verdicts or any(v not in CAUSE_VERDICTS for v in verdicts):
        raise ValueError(f"across_kernels: verdicts={list(verdicts)!r}; allowed: a non-empty "
                         f"list of {CAUSE_VERDICTS}")
    return verdicts[0] if len(set(verdicts)) == 1 else "cannot tell"


def largest_gap(steps: Sequence[int], predicted: Sequence[float],
                measured: Sequence[float]) -> tuple[float, int]:
    """The theory's agreement along training: the largest |predicted - measured| over the
    curve points and the step where it is reached."""
    steps = np.asarray(steps)
    predicted, measured = (np.asarray(v, dtype=float) for v in (predicted, measured))
    if not (steps.shape == predicted.shape == measured.shape) or not steps.size:
        raise ValueError("largest_gap needs one predicted and one measured value per step")
    gaps = np.abs(predicted - measured)
    k = int(np.nanargmax(gaps))
    return float(gaps[k]), int(steps[k])


# the ablated runs to the end of their task's budget: is the task learned with the pattern kept?
FULL_READINGS = ("learned, pattern kept", "learned, pattern lost", "not learned, pattern kept",
                 "not learned, pattern lost")
FULL_RULE = (f"one run per task and ablation (a reading of that run, not a verdict over "
             f"seeds): 'learned' when its exact match on the whole test split is at least "
             f"{LEARNED_AT} and its learning curve stays at {LEARNED_AT} or above over the last "
             f"{PLATEAU_TAIL:.0%} of its steps or more (claims.past_plateau, the study's own "
             f"margin); the pattern 'kept' when layer 1's score is at least {KEEPS_AT} at "
             f"initialisation and at every curve point to the end of the run")


def full_reading(accuracy: float, steps: Sequence[int], curve_accuracy: Sequence[float],
                 layer1: Sequence[float], budget: int) -> str:
    """``FULL_RULE``'s reading of one run: its exact match on the whole test split, its
    learning curve (``steps``, ``curve_accuracy``), layer 1's score at initialisation and at
    every curve point (``layer1``, one more value than ``steps``) and the steps it trained
    (``budget``)."""
    if len(layer1) != len(steps) + 1:
        raise ValueError(f"full_reading: layer1 holds {len(layer1)} scores; it needs the "
                         f"initial one and one per curve step ({len(steps) + 1})")
    values = [accuracy, *curve_accuracy, *layer1]
    if not np.all(np.isfinite(np.asarray(values, dtype=float))):
        raise ValueError("full_reading: every accuracy and score must be finite")
    learned = (accuracy >= LEARNED_AT
               and past_plateau(steps, curve_accuracy, budget)["with_margin"])
    kept = min(layer1) >= KEEPS_AT
    return FULL_READINGS[2 * (not learned) + (not kept)]

# ---------------------------------------------------------------------------------------------
# beyond the paper: a NoPE language model on real text (nopelib.core.corpus)

TEXT_CONTEXT = 256  # the text models' trained context (characters)
TEXT_LENGTHS = (32, 64, 128, 256, 512, 1024)  # held-out lengths scored: within and beyond it
TEXT_ENCODINGS = ("none", "learned")  # NoPE, and a learned position embedding of its size
TEXT_MIN_SEEDS = 3  # per encoding: the fewest seeds a text verdict is given on
# a score: one layer's adjacency score averaged over TEXT_WINDOWS windows of the test books
# (nopelib.core.corpus.Corpus.windows, seed TEXT_WINDOW_SEED), the same windows for every model
TEXT_WINDOWS = 32
TEXT_WINDOW_SEED = 0
TEXT_CLAIMS = (
    ("beyond: text, layer 1 shows the pattern at initialisation",
     f"NoPE, initialised: layer 1 above {ABOVE_CHANCE:g} at every length"),
    ("beyond: text, layer 1 shows the pattern after training",
     f"NoPE, trained: layer 1 above {ABOVE_CHANCE:g} at every length up to the context"),
    ("beyond: text, layer 1 in the paper's range after training",
     f"NoPE, trained: layer 1 at least {KEEPS_AT:g} at every length up to the context"),
    ("beyond: text, every layer shows the pattern after training",
     f"NoPE, trained: every layer from 1 above {ABOVE_CHANCE:g} at the context length"),
    ("beyond: text, the pattern reaches past the trained length",
     f"NoPE, trained: layer 1 above {ABOVE_CHANCE:g} at every length beyond the context"),
    ("beyond: text, later layers weaken it (claim 4)",
     "NoPE, trained: the last layer minus layer 1 below 0 at the context length"),
    ("beyond: text, what NoPE pays",
     "test bits per character, NoPE minus learned position, paired by seed, above 0"),
)
TEXT_RULE = (f"the seed as the unit (at least {TEXT_MIN_SEEDS} per encoding); a score is the "
             "mean adjacency score of one layer over the held-out windows of one length; "
             "one-sided t bounds, each reading one family, holds / fails / cannot tell as for "
             "the paper's claims; the trained readings only when every trained NoPE seed's "
             "test bits per character lies below the unigram baseline (else 'not trained')")


def text_claims(scores: pd.DataFrame, bpc: pd.DataFrame, baseline_bpc: float,
                context: int = TEXT_CONTEXT, alpha: float = ALPHA) -> pd.DataFrame:
    """Every test of the text readings (``TEXT_CLAIMS``), fixed before the text study ran.

    ``scores``: one row per (encoding, stage, seed, layer, length) with the mean adjacency
    score over that length's held-out windows (stage "init" or "trained"); ``bpc``: one row
    per (encoding, seed) with ``test_bpc``, the trained model's bits per character on the
    test books; ``baseline_bpc``: the unigram baseline (the test books' bits per character
    under the training books' character frequencies); ``context``: the models' trained
    context, which splits the lengths into within and beyond it. The trained NoPE readings
    are judged only when every trained NoPE seed beats the baseline, and "what NoPE pays"
    only when every seed of both encodings does: otherwise they are reported as "not
    trained" (a model that learned nothing says nothing about trained models). The position
    probes on text are judged by ``probe_claims``, the probes chapter's rule, unchanged.
    Rows as ``init_claims``'s, plus ``note``."""
    need = {"encoding", "stage", "seed", "layer", "length", "score"}
    if not need <= set(scores.columns) or not {"encoding", "seed", "test_bpc"} <= set(bpc):
        raise ValueError(f"text_claims: scores need columns {sorted(need)}, bpc needs "
                         "encoding, seed, test_bpc")
    seeds = {enc: sorted(bpc.loc[bpc.encoding == enc, "seed"]) for enc in TEXT_ENCODINGS}
    if any(len(s) < TEXT_MIN_SEEDS for s in seeds.values()) or seeds["none"] != seeds[
            "learned"]:
        raise ValueError(f"text_claims: seeds per encoding {seeds}; each needs at least "
                         f"{TEXT_MIN_SEEDS}, the same for both (the bits are paired by seed)")
    within = [n for n in TEXT_LENGTHS if n <= context]
    beyond = [n for n in TEXT_LENGTHS if n > context]
    nope = scores[scores.encoding == "none"]
    for stage in ("init", "trained"):
        have = set(nope.loc[nope.stage == stage, "length"])
        if set(TEXT_LENGTHS) - have:
            raise ValueError(f"text_claims: the NoPE {stage} scores lack the lengths "
                             f"{sorted(set(TEXT_LENGTHS) - have)} of TEXT_LENGTHS")

    def wide(stage: str, length: int) -> pd.DataFrame:  # [seed, layer]
        at = nope[(nope.stage == stage) & (nope.length == length)]
        return at.pivot_table(index="seed", columns="layer", values="score")

    floor = ABOVE_CHANCE
    init = _text_init_tests(nope)
    trained = [(*TEXT_CLAIMS[1], f"{n} chars", 1, wide("trained", n)[1], floor, True)
               for n in within]
    trained += [(*TEXT_CLAIMS[2], f"{n} chars", 1, wide("trained", n)[1], KEEPS_AT, True)
                for n in within]
    at_context = wide("trained", context)
    trained += [(*TEXT_CLAIMS[3], f"{context} chars", i, at_context[i], floor, True)
                for i in at_context if i]
    trained += [(*TEXT_CLAIMS[4], f"{n} chars", 1, wide("trained", n)[1], floor, True)
                for n in beyond]
    last = int(at_context.columns.max())
    trained.append((*TEXT_CLAIMS[5], f"{context} chars", last,
                    at_context[last] - at_context[1], 0.0, False))
    paired = bpc.pivot_table(index="seed", columns="encoding", values="test_bpc")
    pays = [(*TEXT_CLAIMS[6], "test books", -1, paired["none"] - paired["learned"], 0.0,
             True)]
    below = bpc.assign(ok=bpc.test_bpc < baseline_bpc).groupby("encoding")["ok"].all()
    judged, skipped = init, []
    for tests, learned in ((trained, bool(below["none"])), (pays, bool(below.all()))):
        if learned:
            judged = judged + tests
        else:
            skipped += tests
    table = judge_families(judged, alpha).assign(note="")
    if skipped:
        table = pd.concat([table, pd.DataFrame([
            dict(claim=c, reading=r, group=g, layer=layer, bound=b, above=a, n=len(v),
                 verdict="cannot tell", note="not trained")
            for c, r, g, layer, v, b, a in skipped])], ignore_index=True)
    return table


def _text_init_tests(nope: pd.DataFrame) -> list[tuple]:
    """The initialisation reading's tests: layer 1 of the NoPE models at every length of
    TEXT_LENGTHS that ``nope`` scores (rows of stage "init")."""
    at = nope[nope.stage == "init"]
    tests = []
    for n in TEXT_LENGTHS:
        wide = at[at.length == n].pivot_table(index="seed", columns="layer", values="score")
        if 1 in wide:
            tests.append((*TEXT_CLAIMS[0], f"{n} chars", 1, wide[1], ABOVE_CHANCE,
                          True))
    return tests


def text_init_claims(scores: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The first text reading alone (``TEXT_CLAIMS[0]``, judged as in ``text_claims``): NoPE
    models at initialisation need no training, so a chapter judges it live. ``scores`` as
    ``text_claims``'s, its NoPE init rows read, at least ``TEXT_MIN_SEEDS`` seeds."""
    nope = scores[(scores.encoding == "none") & (scores.stage == "init")]
    if nope.seed.nunique() < TEXT_MIN_SEEDS:
        raise ValueError(f"text_init_claims: {nope.seed.nunique()} seeds; at least "
                         f"{TEXT_MIN_SEEDS}")
    tests = _text_init_tests(nope)
    if not tests:
        raise ValueError(f"text_init_claims: no NoPE init scores at lengths {TEXT_LENGTHS}")
    return judge_families(tests, alpha)
