"""Every chapter's spec (defaults, rules, claims) and the studies it shares with the scorecard.

One ``ChapterSpec`` per notebook (``nopelib.core.chapter``): the defaults of its parameters
cell, the rules in its study module (``CHAPTER_PARAMS``), and the paper's claims it judges with
the section that judges each (the labels defined in ``nopelib.rules``). A chapter starts
with ``params = RANDOM_INIT.check(globals())``; the scorecard reads ``RANDOM_INIT.params()``.
The studies both read (the random-initialisation chapter's five, the text chapter's initial
scores) are the functions below: one call serves the two through the results cache
(``nopelib.store.memo``).

The specs live here, above the study modules, so that a study's cache keys (the import closure
of its module) do not move when a chapter's defaults or claims do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from nopelib.core.chapter import ChapterSpec
from nopelib.core.model import GPTConfig
from nopelib.core.params import Choice
from nopelib.core.tasks import TASKS
from nopelib.rules import beyond_claims as bc, claims as tc, init_claims as ic
from nopelib.store.memo import memo
from nopelib.studies import (analysis as an, early_study, long_context, probe_study, study,
                             text_study, theory_studies)
from nopelib.training.profiles import PROFILES
from nopelib.training.text_lm import get_text_profile

AVERAGING_EFFECT = ChapterSpec("averaging_effect", theory_studies.CHAPTER_PARAMS, dict(
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

RANDOM_INIT = ChapterSpec("random_init", an.CHAPTER_PARAMS, dict(
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
    ic.THE_GRID: "depth-and-width-predicted-then-measured",
    ic.SMALL_SIGMA: "the-initialisation-study",
    ic.LARGE_SIGMA: "the-initialisation-study",
    ic.MEANS: "the-initialisation-study",
    bc.SHORT_INPUTS: "length-beyond-the-paper-s-inputs-with-and-without-repeats",
})

LONG_SEQUENCES = ChapterSpec("long_sequences", long_context.CHAPTER_PARAMS, dict(
    T=1024,  # live sequence length (the committed study runs to 8,192)
    widths=[192, 384, 768],  # widths of the live 6-layer models (divisible by the 6 heads)
    seeds=[0, 1, 2],  # model seeds: one model and one sequence each, the unit
    windows=[64],  # sliding windows, at the base width
    layer=1,  # layer of the order-curve figure (the theory's layer is 1)
    level=0.95,  # level of the pointwise seed intervals
))

TRAINED = ChapterSpec("trained", study.CHAPTER_PARAMS, dict(
    profile="study",  # the committed study's profile (nopelib.training.profiles)
    tasks=list(TASKS),  # tasks read from the study
    live_tasks=["reversal"],  # retrained live: does this machine reproduce the study?
    live_seeds=[0],  # seeds retrained live (each one run per live task)
    heatmap_task="reversal",  # live task whose model's matrices are shown per layer
    device="auto",  # "auto": CUDA, then MPS, then CPU
), claims={tc.AFTER_TRAINING: "the-paper-s-claims", tc.FIRST_KEEP: "the-paper-s-claims",
           tc.LATER_WEAKEN: "the-paper-s-claims"})

PROBES = ChapterSpec("probes", probe_study.CHAPTER_PARAMS, dict(
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
