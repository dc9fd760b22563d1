"""Every chapter's spec (defaults, rules, claims) and the studies it shares with the scorecard.

One ``ChapterSpec`` per notebook (``nopelib.core.chapter``): the defaults of its parameters
cell, the rules in its study module (``CHAPTER_PARAMS``), and the paper's claims it judges with
the section that judges each (the labels defined in ``nopelib.rules``). A chapter starts
with ``params = RANDOM_INIT.check(globals())``; the scorecard reads ``RANDOM_INIT.params()``.
The studies both read (the random-initialisation chapter's five, the text chapter's initial
scores) are the functions below: one call serves the two through the results cache
(``nopelib.store.memo``).

Parameters that each stay within their own bound can together run for hours: the joint costs
of three chapters (``with_costs``), priced from each chapter's own per-unit estimates, refuse
that before any work. The specs live here, above the study modules, so that a study's cache
keys (the import closure of its module) do not move when a chapter's defaults, claims or
costs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from nopelib.core.chapter import ChapterSpec
from nopelib.core.model import GPTConfig
from nopelib.core.cost import Cost
from nopelib.core.params import Choice, Rule
from nopelib.core.tasks import TASKS
from nopelib.rules import beyond_claims as bc, claims as tc, init_claims as ic
from nopelib.store.memo import memo
from nopelib.core import analysis as an
from nopelib.studies import (early_study, long_context, probe_study, text_study,
                             trained_study)
from nopelib.averaging import theory_studies
from nopelib.training.profiles import PROFILES
from nopelib.training.text_lm import get_text_profile

def with_costs(rules: Mapping[str, Rule],
               costs: Mapping[str, tuple[Cost, ...]]) -> dict[str, Rule]:
    """A chapter's rules with joint costs (``params.Rule.costing``) on the parameters named in
    ``costs``: parameters each within its own bound can still run for a day together, and a
    chapter refuses that before any work (``NOPELIB_ALLOW_SLOW=1`` lifts it with a warning).
    They are attached here, not in the study modules, so that no study's cache key moves."""
    out = dict(rules)
    for name, extra in costs.items():
        for cost in extra:
            out[name] = out[name].costing(cost)
    return out


# Each joint cost's seconds per unit is the chapter's own estimate, from the notes of its
# parameters' rules (measured on the 2-core development machine), quoted in ``each``.
_DEFAULT_GRID = 42 * (192**2 + 384**2 + 768**2)  # sum of n_layer x n_embd^2 over the 3 x 3 grid


def _grid_size(p: Mapping[str, Any]) -> float:
    """The depth-and-width grid's weights over the default grid's: a model's build and its
    forward pass on the short task inputs both cost in proportion to its weights."""
    return sum(p["grid_layers"]) * sum(w * w for w in p["grid_widths"]) / _DEFAULT_GRID


AVERAGING_COSTS = {
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
RANDOM_INIT_COSTS = {
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
PROBES_COSTS = {
    "n_fit_tokens": (Cost(("model_seeds", "n_fit_tokens"), 1.2e-3, "~1.2 ms: one fitting "
                          "token of one probe study (n_fit_tokens' note: ~1.2 s per 1,000)"),),
    "mlp_fit_tokens": (Cost(("model_seeds", "mlp_fit_tokens"), 1.3e-3, "~1.3 ms: one fitting "
                            "token of one model's MLP probe (its note: ~7 s at 5,400)"),),
    "planted_fit_tokens": (Cost(("model_seeds", "planted_fit_tokens"), 5.6e-4, "~0.56 ms: one "
                                "fitting token of one seed's planted controls (their note: "
                                "~30 s at 5,400 tokens and 10 seeds)"),),
    "grid_fit_tokens": (Cost(("grid_seeds", "grid_lengths", "grid_fit_tokens"), 5.6e-4,
                             "~0.56 ms: one fitting token of one grid study (grid_lengths' "
                             "note: ~3 s per study at 5,400)"),),
}

AVERAGING_EFFECT = ChapterSpec("averaging_effect", with_costs(theory_studies.CHAPTER_PARAMS,
                                                              AVERAGING_COSTS), dict(
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

RANDOM_INIT = ChapterSpec("random_init", with_costs(an.CHAPTER_PARAMS, RANDOM_INIT_COSTS),
                          dict(
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

LONG_SEQUENCES = ChapterSpec("long_sequences", long_context.CHAPTER_PARAMS, dict(
    T=1024,  # live sequence length (the committed study runs to 8,192)
    widths=[192, 384, 768],  # widths of the live 6-layer models (divisible by the 6 heads)
    seeds=[0, 1, 2],  # model seeds: one model and one sequence each, the unit
    windows=[64],  # sliding windows, at the base width
    layer=1,  # layer of the order-curve figure (the theory's layer is 1)
    level=0.95,  # level of the pointwise seed intervals
))

TRAINED = ChapterSpec("trained", trained_study.CHAPTER_PARAMS, dict(
    profile="study",  # the committed study's profile (nopelib.training.profiles)
    tasks=list(TASKS),  # tasks read from the study
    live_tasks=["reversal"],  # retrained live: does this machine reproduce the study?
    live_seeds=[0],  # seeds retrained live (each one run per live task)
    heatmap_task="reversal",  # live task whose model's matrices are shown per layer
    device="auto",  # "auto": CUDA, then MPS, then CPU
), claims={tc.AFTER_TRAINING: "the-paper-s-claims", tc.FIRST_KEEP: "the-paper-s-claims",
           tc.LATER_WEAKEN: "the-paper-s-claims"})

PROBES = ChapterSpec("probes", with_costs(probe_study.CHAPTER_PARAMS, PROBES_COSTS), dict(
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

EARLY_DYNAMICS = ChapterSpec("early_dynamics", early_study.CHAPTER_PARAMS, dict(
    profile="study",  # the committed early-dynamics study read below
    paper_profile="paper_study",  # the paper's model's committed study, set beside it
    init_profiles=["study", "paper_study"],  # models checked live at initialisation
    init_seeds=[0, 1, 2],  # their seeds
))

TEXT = ChapterSpec("text", text_study.CHAPTER_PARAMS, dict(
    profile="text",  # the text study's model and schedule (nopelib.training.text_lm)
    seeds=[0, 1, 2],  # model seeds at initialisation: the unit
    lengths=[32, 64, 128, 256, 512, 1024],  # held-out lengths (the rule's)
))

# the scorecard's page and the introduction's figure: the trained study of the paper's model
# (shown first) and the committed study shown beside it
SCORECARD_PARAMS = {"headline_profile": Choice(PROFILES), "profile": Choice(PROFILES)}
SCORECARD_DEFAULTS = dict(
    headline_profile="paper_study",  # the trained study of the paper's model, shown first
    profile="study",  # the committed trained-model study shown beside it (results 2, 4, 5)
)
SCORECARD = ChapterSpec("scorecard", SCORECARD_PARAMS, SCORECARD_DEFAULTS)
INTRO = ChapterSpec("intro", SCORECARD_PARAMS, SCORECARD_DEFAULTS)

CHAPTERS = {spec.name: spec for spec in (
    AVERAGING_EFFECT, RANDOM_INIT, LONG_SEQUENCES, TRAINED, PROBES, EARLY_DYNAMICS, TEXT,
    SCORECARD, INTRO)}


def section_of(claim: str) -> tuple[str, str]:
    """The chapter and the section's anchor that judge the paper's ``claim`` (a label of
    ``nopelib.rules``), from the specs' claims."""
    found = [(spec.name, spec.claims[claim]) for spec in CHAPTERS.values()
             if claim in spec.claims]
    if len(found) != 1:
        raise ValueError(f"claim={claim!r} is judged by {len(found)} chapters' specs, not one")
    return found[0]


# ---------------------------------------------------------------------------------------------
# the studies a chapter shares with the scorecard, at its parameters ``p``


def init_base(p: Mapping[str, Any]) -> pd.DataFrame:
    """The random-initialisation chapter's base model (Figure 1): one row per seed, task,
    input and layer."""
    return memo(an.task_scores, GPTConfig(), list(range(p["n_seeds"])), p["inputs_per_task"])


def init_sigmas(p: Mapping[str, Any]) -> pd.DataFrame:
    """Its initialisation study: every (mean, sigma) of the parameters, both readings."""
    return memo(an.config_scores, an.init_overrides(p["init_means"], p["init_stds"]),
                list(range(p["n_seeds"])), p["inputs_per_task"])


def init_grid(p: Mapping[str, Any]) -> pd.DataFrame:
    """Its depth-and-width grid."""
    return memo(an.config_scores, an.grid_overrides(p["grid_layers"], p["grid_widths"]),
                list(range(p["grid_seeds"])), p["grid_inputs_per_task"])


def init_grid_predicted(p: Mapping[str, Any]) -> pd.DataFrame:
    """The closed form's layer-1 prediction for the grid, on the very tokens scored."""
    return theory_studies.predicted_config_scores(
        an.grid_overrides(p["grid_layers"], p["grid_widths"]), list(range(p["grid_seeds"])),
        p["grid_inputs_per_task"])


def init_controls(p: Mapping[str, Any]) -> pd.DataFrame:
    """Its controls: the bidirectional model and every position encoding beside NoPE."""
    return memo(an.config_scores, an.control_overrides(), list(range(p["n_seeds"])),
                p["inputs_per_task"])


def text_init(p: Mapping[str, Any]) -> pd.DataFrame:
    """The text chapter's NoPE models at initialisation on held-out windows of every length."""
    prof = get_text_profile(p["profile"])  # resolved here, where the computation starts
    return memo(text_study.init_scores, prof, p["seeds"], p["lengths"])
