"""The committed result files' schemas: each kind's fields and the rules that check them.

A rule is a field's check and what it allows in words (``Rule``); a schema maps each field a
chapter, the scorecard or a command reads to its rule. ``nopelib.results.files`` validates a
file against its kind's schema with the checks of ``checks``, ``run_kinds`` and
``kinds``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from nopelib.core.ablation import PARTS
from nopelib.core.features import FEATURE_SETS
from nopelib.core.tasks import TASKS
from nopelib.training.launch import BACKENDS
from nopelib.training.train_profile import MAX_SEED, PRECISIONS


KINDS = ("recipe", "grid", "trained", "long", "kernels", "precision", "early", "text",
         "campaign", "length")
MAX_BYTES = 64 * 2**20  # a committed result is kilobytes to a few megabytes
# the deepest field of any schema is 7 levels down (a trained run's similarity matrices:
# runs, run, matrices, layers, matrix, row); deeper nesting is no result file
MAX_DEPTH = 16
# the values of train.dtype_policy: how a run's training step computed
DTYPE_POLICIES = ("float32", "autocast-bfloat16")
# the dtype policy each precision of the precision check must have run under: it runs on a CPU
# with bf16 units, where a bfloat16 run that fell back to float32 would compare nothing
PRECISION_POLICY = {"float32": "float32", "bfloat16": "autocast-bfloat16"}
REL_TOL = 1e-9  # a number a writer derived, recomputed from the file: equal up to rounding


class ResultsError(ValueError):
    """A committed result file that does not match its schema; the message names the file and
    the field."""


Check = Callable[[Any], bool]
Rule = tuple[Check, str]  # a field's check, and what it allows in words


def number_rule(lo: float = -math.inf, hi: float = math.inf) -> Check:
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v) and lo <= v <= hi)


def int_rule(lo: int = 0, hi: float = math.inf) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


def text_rule(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def scores_rule(v: Any) -> bool:  # adjacency scores of every layer, 0 = embeddings
    return isinstance(v, list) and len(v) >= 2 and all(number_rule(0.0, 1.0)(x) for x in v)


def one_of(options: Sequence[str]) -> Rule:
    allowed = tuple(options)
    return (lambda v: isinstance(v, str) and v in allowed, f"one of {list(allowed)}")


def or_null(rule: Rule) -> Rule:
    return (lambda v: v is None or rule[0](v), f"null or {rule[1]}")


def list_of(item: Check, words: str, distinct: bool = False, empty: bool = True) -> Rule:
    def ok(v: Any) -> bool:
        return (isinstance(v, list) and (empty or bool(v)) and all(item(x) for x in v)
                and (not distinct or len(set(v)) == len(v)))  # distinct: of plain values

    return ok, words


def iso_date(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


def object_rule(words: str) -> Rule:
    return (lambda v: isinstance(v, dict), words)


SEED_FIELD: Rule = (int_rule(0, MAX_SEED), f"an integer in [0, {MAX_SEED}]")
STEPS: Rule = (int_rule(1), "an integer >= 1")
MAX_SECONDS = 366 * 86_400  # no run, study or sitting here takes a year
SECONDS: Rule = (number_rule(0.0, MAX_SECONDS), f"a finite number of seconds in [0, "
                 f"{MAX_SECONDS:,}] (a year)")
SHARE: Rule = (number_rule(0.0, 1.0), "a number in [0, 1]")
_SCORES: Rule = (scores_rule, "a list of >= 2 scores in [0, 1], one per layer")
_TASK: Rule = one_of(TASKS)
SEEDS_FIELD: Rule = list_of(SEED_FIELD[0], f"a non-empty list of distinct seeds in [0, {MAX_SEED}]",
                        distinct=True, empty=False)
COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}(\+uncommitted nopelib changes)?|unknown")
KEY_PATTERN = re.compile(r"[0-9a-f]{32}")  # runs.run_key: 32 hex digits of a SHA-256

PROVENANCE: dict[str, Rule] = {
    "command": (text_rule, "a non-empty string"),
    "commit": (lambda v: isinstance(v, str) and bool(COMMIT_PATTERN.fullmatch(v)),
               "a 40-digit git commit"),
    "machine": (text_rule, "a non-empty string"),
    "torch": (text_rule, "a non-empty string"),
    "wall_seconds": SECONDS,
    "date": (iso_date, "an ISO 8601 date"),
}
EXTRA_PROVENANCE: dict[str, dict[str, Rule]] = {
    "recipe": {"profile": (text_rule, "a profile name"), "scale": STEPS,
               "training": object_rule("the profile's fields")},
    "grid": {"grid": (text_rule, "a grid name"), "backend": one_of(BACKENDS)},
    "trained": {"profile": (text_rule, "a profile name"),
                "training": object_rule("the profile's fields")},
    "long": {"T": (int_rule(16), "an integer >= 16"),
             "base": object_rule("the base model's GPTConfig fields")},
    "kernels": {"profile": (text_rule, "a profile name"),
                "sets": (lambda v: isinstance(v, dict) and bool(v) and all(
                    isinstance(e, dict) and all(isinstance(x, str) for x in e.values())
                    for e in v.values()), "kernel set name -> its environment variables")},
    "early": {"profile": (text_rule, "a profile name"), "window": STEPS, "every": STEPS,
              "training": object_rule("the study's profile's fields")},
    "text": {"profile": (text_rule, "a text profile name"),
             "training": object_rule("the text profile's fields"),
             "unigram_bpc": (number_rule(0.0), "a finite number >= 0 (result_text's BPC)"),
             "windows": object_rule("an object with n, seed and split")},
    "length": {"profile": (text_rule, "a text profile name"),
               "training": object_rule("the text profile's fields"),
               "unigram_bpc": (number_rule(0.0), "a finite number >= 0"),
               "windows": object_rule("an object with n, states, seed, split and length")},
    "campaign": {"profile": (text_rule, "a profile name"),
                 "queue": (lambda v: isinstance(v, list) and bool(v) and all(
                     isinstance(e, list) and len(e) == 2 and e[0] in TASKS
                     and SEED_FIELD[0](e[1]) for e in v), "a list of [task, seed] pairs")},
    "precision": {"profile": (text_rule, "a profile name"), "steps": STEPS,
                  "rule": (text_rule, "the rule's text"),
                  "verdict": one_of(("no change", "changes")),
                  "training": object_rule("the profile's fields")},
}
# provenance fields some files hold besides: notes on how they were made, the CPU's kernels
_NOTE: Rule = (text_rule, "a note (a non-empty string)")
OPTIONAL_PROVENANCE: dict[str, dict[str, Rule]] = {
    "recipe": {"load_note": _NOTE, "training_note": _NOTE},
    "precision": {"cpu_capability": (text_rule, "torch's CPU capability")},
}
# the trained study's bookkeeping: checked once its runs are (a run names its own problem)
TRAINED_PROVENANCE: dict[str, Rule] = {"runs_from_cache": (int_rule(0), "an integer >= 0")}
TRAINED_PROVENANCE_OPTIONAL: dict[str, Rule] = {
    "cpu_capability": (text_rule, "torch's CPU capability"),
    "tasks": list_of(_TASK[0], f"a non-empty list of distinct tasks of {list(TASKS)}",
                     distinct=True, empty=False),
    "seeds": SEEDS_FIELD,
    "trajectory": object_rule("an object with n_inputs and seed"),
    "trained_by": object_rule("the provenance of the invocation that trained the runs"),
    "runs_kept": (int_rule(0), "an integer >= 0"),
}
# where a trained run came from (trained_study.run_record's origin, named by stamp): trained
# by the invocation that first wrote it, or read from the run cache, which keeps no command
RUN_ORIGINS = ("trained", "run cache")
RUN_ORIGIN: dict[str, Rule] = {"how": one_of(RUN_ORIGINS),
                               "finished": (iso_date, "an ISO 8601 date")}
RUN_ORIGIN_TRAINED: dict[str, Rule] = {
    "commit": PROVENANCE["commit"], "machine": PROVENANCE["machine"],
    "cpu_capability": (text_rule, "torch's CPU capability"),
}
RUN_ORIGIN_COMMAND: dict[str, Rule] = {"command": PROVENANCE["command"]}  # the study command's
RUN: dict[str, Rule] = {
    "task": _TASK,
    "seed": SEED_FIELD,
    "accuracy": SHARE,
    "n_test": STEPS,
    "train_seconds": SECONDS,
}
EXTRA_RUN: dict[str, dict[str, Rule]] = {
    "recipe": {"steps": STEPS, "pos_encoding": (text_rule, "a position encoding"),
               "curve": object_rule("an object with step and accuracy")},
    "grid": {"n_layer": STEPS, "n_embd": STEPS, "adjacency_before": _SCORES,
             "adjacency_after": _SCORES},
    "trained": {"profile": (text_rule, "the profile's name"),
                "key": (lambda v: isinstance(v, str) and bool(KEY_PATTERN.fullmatch(v)),
                        "a run key (32 hex digits)"),
                "steps": STEPS,
                "decay_from": or_null(STEPS),
                "learned_from": or_null(STEPS),
                "tail": (lambda v: number_rule(0.0, 1.0)(v) and v < 1,
                         "a share of the run's steps in [0, 1)"),
                "scores_init": _SCORES, "scores_after": _SCORES,
                "trajectory": object_rule("an object with step, accuracy and scores"),
                "probes": object_rule("an object with the probes' settings, rows and shuffled")},
    # one live run of the kernel check (nopelib.studies.kernels) under one kernel set
    "kernels": {"set": (text_rule, "a kernel set name"),
                "capability": (text_rule, "torch's CPU capability"),
                "steps": STEPS,
                "learned": (lambda v: isinstance(v, bool), "true or false"),
                "inside": (lambda v: isinstance(v, bool), "true or false"),
                "outside": list_of(text_rule, "a list of the quantities outside the study's "
                                   "interval"),
                "scores_after": _SCORES},
    # one run of the precision check (nopelib.studies.precision): its first steps in one precision
    "precision": {"precision": one_of(PRECISIONS), "dtype_policy": one_of(DTYPE_POLICIES),
                  "steps": STEPS, "step_ms": SECONDS,
                  "curve": object_rule("an object with step, accuracy, val_accuracy and scores")},
}
# the most runs a campaign sitting trains at once, by device: a one-thread run per core of
# a 2-core machine; on one GPU, several small runs side by side
CAMPAIGN_STREAMS = {"cpu": 2, "cuda": 8}
# one run's part in one sitting of the paper-model campaign (nopelib.studies.campaign)
CAMPAIGN_RUN: dict[str, Rule] = {
    "task": _TASK, "seed": SEED_FIELD,
    "key": EXTRA_RUN["trained"]["key"],
    "from_step": (int_rule(0), "an integer >= 0"),
    "to_step": (int_rule(0), "an integer >= 0"),
    "steps_lost": (int_rule(0), "an integer >= 0"),
    "wall_seconds": SECONDS,
    "finished": (lambda v: isinstance(v, bool), "true or false"),
    "commit": PROVENANCE["commit"], "machine": PROVENANCE["machine"],
    "cpu_capability": (text_rule, "torch's CPU capability"),
    "started": (iso_date, "an ISO 8601 date"), "until": (iso_date, "an ISO 8601 date"),
    "streams": (int_rule(1, max(CAMPAIGN_STREAMS.values())),
                f"1 to {CAMPAIGN_STREAMS['cuda']} (at most {CAMPAIGN_STREAMS['cpu']} on the CPU)"),
}
# fields of the ledger's later sittings (absent: a CPU sitting): the device its runs trained
# on, and on CUDA the GPU's name
CAMPAIGN_RUN_LATER: dict[str, Rule] = {"device": one_of(tuple(CAMPAIGN_STREAMS)),
                                       "gpu": (text_rule, "the GPU's name")}
# fields the trained study's writer added after the first files were committed: a run holds
# all of them or none, and every run of a file alike
TRAINED_RUN_LATER: dict[str, Rule] = {
    "wall_seconds": SECONDS,
    "resumed_at": list_of(int_rule(1), "a list of steps >= 1"),
    "dtype_policy": one_of(DTYPE_POLICIES),
    "matrices": object_rule("an object with text and layers"),
}
# a probe's NRMSE (metrics.nrmse: RMSE over the target's spread): 1 is predicting the mean, the
# committed probes reach 1.45 at most; ten times the mean's error is no fit that was made
NRMSE: Rule = (number_rule(0.0, 10.0), "a finite NRMSE in [0, 10] (1: the target's mean)")
# a trained run's position probes (probe_study.probe_record) and one of their rows
PROBES: dict[str, Rule] = {
    "w": STEPS, "fit_tokens": STEPS, "n_sequences": STEPS,
    "probe_seeds": SEEDS_FIELD,
    "rows": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of probe rows"),
    "shuffled": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of probe rows"),
}
PROBE_ROW: dict[str, Rule] = {
    "layer": (int_rule(0), "a layer >= 0"),
    "features": one_of(FEATURE_SETS),
    "seed": SEED_FIELD,
    "nrmse": NRMSE,
    "r": (number_rule(-1.0, 1.0), "a Pearson r in [-1, 1]"),
}
# the precision check's table (bf16.gaps), recomputed from the runs
GAP: dict[str, Rule] = {
    "task": _TASK, "quantity": (text_rule, "a quantity the rule compares"),
    "precision_gap": (number_rule(0.0), "a finite number >= 0"),
    "seed_gap": (number_rule(0.0), "a finite number >= 0"),
    "n_seeds": (int_rule(2), "an integer >= 2"),
    "verdict": one_of(("no change", "changes")),
}
# a curve's series: one value per curve step
ACCURACIES: Rule = (number_rule(0.0, 1.0), "an accuracy in [0, 1]")
LOSSES: Rule = (number_rule(0.0), "a finite loss >= 0")


def rows_rule(words: str) -> Rule:
    return (lambda v: isinstance(v, list) and bool(v), f"a non-empty list of rows {words}")


# a long-sequence run (nopelib.studies.long_context.long_run) is no training run: its own fields,
# each row checked by _check_long_rows
LONG_RUN: dict[str, Rule] = {
    "n_embd": STEPS,
    "seed": SEED_FIELD,
    "window": or_null(STEPS),
    "scores": rows_rule("[length, layer, score in [0, 1]]"),
    "predicted_scores": rows_rule("[length, predicted score in [0, 1]]"),
    "order": rows_rule("[layer, octave, d, fraction in [0, 1]]"),
    "predicted_order": rows_rule("[octave, d, probability in [0, 1]]"),
}

# a run of the early-dynamics study (nopelib.studies.early_study): its first steps, no test split
EARLY_RUN: dict[str, Rule] = {
    "task": _TASK,
    "seed": SEED_FIELD,
    "frozen": (lambda v: isinstance(v, list) and all(x in PARTS for x in v)
               and len(set(v)) == len(v), f"a list of distinct parts of {list(PARTS)}"),
    "steps": STEPS,
    "train_seconds": SECONDS,
    "curve_seconds": SECONDS,
    "scores_init": _SCORES,
    "measure_init": object_rule("block 1's quantities at initialisation (EARLY_MEASURED)"),
    "curve": object_rule("an object of lists, one value per curve point"),
}
# what a run to the end of its budget records besides (early_study --full), in a file of its
# own whose name starts with this
EARLY_FULL_PREFIX = "early_full_"
EARLY_FULL_RUN: dict[str, Rule] = {
    "accuracy": ACCURACIES,  # exact match on the whole test split
    "n_test": STEPS,
    "resumed_at": list_of(int_rule(1), "a list of steps >= 1"),
}
# block 1's quantities (averaging.dynamics.Block1, and the layer-1 score the theory predicts
# from them), at initialisation (a run's measure_init) and at every curve point. rho is the
# ratio embedding_rms / value_rms of two RMS norms (checked against them): the studies' models
# start below 1 and reach ~3; 10^4 is beyond any float32 run of theirs. entropy is over log k
# (1: uniform attention), so at most 1 up to float32 rounding
RMS: Rule = (number_rule(0.0, 1e6), "a finite RMS norm in [0, 1e6]")
EARLY_MEASURED: dict[str, Rule] = {
    "rho": (number_rule(0.0, 1e4), "a finite ratio of RMS norms in [0, 1e4]"),
    "value_common": SHARE, "embedding_common": SHARE,
    "entropy": (number_rule(0.0, 1.0 + 1e-6), "an attention entropy over log k in [0, 1]"),
    "value_axis": SHARE, "embedding_axis": SHARE, "score_without_mlp": SHARE,
    "embedding_rms": RMS, "value_rms": RMS, "predicted": SHARE,
}
# the curve fields every early run records besides step, scores and lr (checked against the
# profile's learning rate): one value per point
EARLY_CURVE: dict[str, Rule] = {"accuracy": ACCURACIES, "loss": LOSSES, **EARLY_MEASURED}


def kind_of(path: Path) -> str:
    """The kind of a result file, from its name (``recipe_*.json`` and so on)."""
    kind = path.name.split("_", 1)[0]
    if kind not in KINDS or "_" not in path.name:
        raise ResultsError(f"{path}: the name must start with one of "
                           f"{[k + '_' for k in KINDS]}")
    return kind
