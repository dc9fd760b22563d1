"""Every chapter's spec (defaults, rules, claims) and the studies it shares with the scorecard.

One ``ChapterSpec`` per notebook (``nopelib.core.chapter``): the defaults of its parameters
cell, the rules in its study module (``CHAPTER_PARAMS``), and the paper's claims it judges with
the section that judges each (the labels defined in ``nopelib.rules``). A chapter with a module
of its own in this wing (``averaging_effect``, ``random_init``, ``long_sequences``) declares
its spec there, its rules and costs with it, and this registry names it
(``RANDOM_INIT = random_init.CHAPTER``). A chapter starts
with ``params = RANDOM_INIT.check(globals())``; the scorecard reads ``RANDOM_INIT.params()``.
The studies both read (the random-initialisation chapter's five, the text chapter's initial
scores) are the functions below: one call serves the two through the results cache
(``nopelib.store.memo``).

Parameters that each stay within their own bound can together run for hours: the joint costs
of three chapters (``with_costs``), priced from each chapter's own per-unit estimates, refuse
that before any work. The specs, rules and costs live in this wing (each chapter's module,
named here), above the study modules, so that a study's cache keys (the import closure of
its module) do not move when a chapter's defaults, rules, claims or costs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from nopelib.core.chapter import ChapterSpec, with_costs
from nopelib.core.model import GPTConfig
from nopelib.core.cost import Cost
from nopelib.core.params import Choice
from nopelib.core.tasks import TASKS
from nopelib.rules import claims as tc, init_claims as ic
from nopelib.store.memo import memo
from nopelib.core import analysis as an
from nopelib.studies import early_study, probe_study, text_study, trained_study
from nopelib.book import averaging_effect, long_sequences, random_init
from nopelib.averaging import theory_studies
from nopelib.training.profiles import PROFILES
from nopelib.training.text_lm import get_text_profile


# Each joint cost's seconds per unit is the chapter's own estimate, from the notes of its
# parameters' rules (measured on the 2-core development machine), quoted in ``each``.
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

# the chapters whose specs are their own modules' (nopelib.book.<chapter>)
AVERAGING_EFFECT = averaging_effect.CHAPTER

RANDOM_INIT = random_init.CHAPTER
RANDOM_INIT_MORE = random_init.MORE  # the chapter's depth and width, controls and length

LONG_SEQUENCES = long_sequences.CHAPTER

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
    AVERAGING_EFFECT, RANDOM_INIT, RANDOM_INIT_MORE, LONG_SEQUENCES, TRAINED, PROBES,
    EARLY_DYNAMICS, TEXT,
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
