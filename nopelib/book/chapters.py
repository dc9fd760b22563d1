"""Every chapter's spec (defaults, rules, claims) and the studies it shares with the scorecard.

One ``ChapterSpec`` per notebook (``nopelib.core.chapter``): the defaults of its parameters
cell, the rules of its parameters (``CHAPTER_PARAMS``), and the paper's claims it judges with
the section that judges each (the labels defined in ``nopelib.rules``). A chapter with a module
of its own in this wing (``averaging_effect``, ``random_init``, ``long_sequences``, ``probes``,
``text``, ``trained``, ``early_dynamics``) declares its spec there, a second page's too, and
this registry names it (``PROBES = probes.CHAPTER``). A chapter starts with
``params = RANDOM_INIT.check(globals())``; the scorecard reads ``RANDOM_INIT.params()``.
The studies both read (the random-initialisation chapter's five, the text chapter's initial
scores) are the functions below: one call serves the two through the results cache
(``nopelib.store.memo``).

Parameters that each stay within their own bound can together run for hours: the joint costs
of several chapters (``params.Rule.costing``), priced from each chapter's own per-unit
estimates, refuse that before any work. The specs, rules and costs live in this wing (each chapter's module,
named here), above the study modules, so that a study's cache keys (the import closure of
its module) do not move when a chapter's defaults, rules, claims or costs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from nopelib.core.chapter import ChapterSpec
from nopelib.core.model import GPTConfig
from nopelib.core.params import Choice
from nopelib.store.memo import memo
from nopelib.core import analysis as an
from nopelib.studies import text_study
from nopelib.book import (averaging_effect, early_dynamics, long_sequences, probes,
                          random_init, text, trained)
from nopelib.averaging import theory_studies
from nopelib.training.profiles import PROFILES
from nopelib.training.text_lm import get_text_profile


# the chapters whose specs are their own modules' (nopelib.book.<chapter>)
AVERAGING_EFFECT = averaging_effect.CHAPTER

RANDOM_INIT = random_init.CHAPTER
RANDOM_INIT_MORE = random_init.MORE  # the chapter's depth and width, controls and length

LONG_SEQUENCES = long_sequences.CHAPTER

TRAINED = trained.CHAPTER
TRAINED_SMALL = trained.SMALL  # the chapter's page on the smaller model

PROBES = probes.CHAPTER
PROBES_CONTROLS = probes.CONTROLS  # the chapter's planted controls and w/T grid

EARLY_DYNAMICS = early_dynamics.CHAPTER

TEXT = text.CHAPTER

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
    AVERAGING_EFFECT, RANDOM_INIT, RANDOM_INIT_MORE, LONG_SEQUENCES, TRAINED, TRAINED_SMALL,
    PROBES, PROBES_CONTROLS, EARLY_DYNAMICS, TEXT, SCORECARD, INTRO)}


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
