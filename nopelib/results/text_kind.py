"""The own checks of the text study's result: its language models' curves, scores and probes.

A text run (``nopelib.studies.text_study``) is no task run: its bits per character, learning
curve, scores per held-out length and stage, position probes and samples are checked here
against the text profile its file records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nopelib.core.features import FEATURE_SETS
from nopelib.rules.beyond_claims import TEXT_ENCODINGS
from nopelib.results.checks import (bad_value, check_distinct, check_fields, check_series,
                                           layer_rows, profile_record)
from nopelib.results.kinds import learning_rates
from nopelib.results.schema import (LOSSES, NRMSE, SECONDS, SEED_FIELD, SEEDS_FIELD, STEPS,
                                           Rule, int_rule, list_of, number_rule, object_rule,
                                           one_of, rows_rule, text_rule)
from nopelib.training.text_lm import TextProfile, lengths_for

# the corpus's symbols (nopelib.core.corpus: every character of the text and the newline): a
# model that predicts uniformly costs log2(65) = 6.0 bits per character, the unigram 4.4, the
# committed models 1.6 at the end and 3.4 at most at their first curve point; more than a bit
# per character above uniform is no model the study trained
TEXT_VOCAB = 65
BPC: Rule = (number_rule(0.0, math.log2(TEXT_VOCAB) + 1),
             f"a finite number of bits per character in [0, log2({TEXT_VOCAB}) + 1]")
TEXT_SPLITS = ("train", "validation", "test")  # corpus.SPLITS
TEXT_PROVENANCE_OPTIONAL: dict[str, Rule] = {
    "encodings": list_of(lambda v: v in TEXT_ENCODINGS, f"a list of distinct encodings of "
                         f"{list(TEXT_ENCODINGS)}", distinct=True, empty=False),
    "seeds": SEEDS_FIELD,
}
TEXT_WINDOWS: dict[str, Rule] = {"n": STEPS, "seed": SEED_FIELD, "split": one_of(TEXT_SPLITS)}
# what every trained text model's run holds (text_lm.train_text's metrics and times)
TRAINED_TEXT: dict[str, Rule] = {
    "seed": SEED_FIELD,
    "steps": STEPS,
    "train_seconds": SECONDS,
    "curve_seconds": SECONDS,
    "measure_seconds": SECONDS,
    "resumed_at": list_of(int_rule(1), "a list of steps >= 1"),
    "loss_curve": list_of(LOSSES[0], "a list of finite losses >= 0"),
    "test_bpc": BPC,
    "curve": object_rule("an object of lists, one value per curve point"),
}
# a run of the text study (nopelib.studies.text_study): a language model, no task
TEXT_RUN: dict[str, Rule] = {
    "encoding": one_of(TEXT_ENCODINGS),
    **TRAINED_TEXT,
    "val_bpc": BPC,
    "scores": object_rule("an object with init and trained: per length, mean and sd per layer"),
    "probes": rows_rule("{stage, length, layer, features, seed, nrmse, r}"),
    "samples": rows_rule("{prompt, text}"),
}
TEXT_STAGES = ("init", "trained")


def check_text(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = profile_record(name, prov, TextProfile)
    layers = prof.n_layer + 1
    check_fields(f"{name}: provenance", prov, {"unigram_bpc": BPC}, TEXT_PROVENANCE_OPTIONAL)
    check_fields(f"{name}: provenance.windows", prov["windows"], TEXT_WINDOWS)
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, TEXT_RUN)
        if run["steps"] > prof.steps:
            raise bad_value(f"{where}.steps", run["steps"],
                            f"at most the profile's {prof.steps:,}")
        if any(s > run["steps"] for s in run["resumed_at"]):
            raise bad_value(f"{where}.resumed_at", run["resumed_at"],
                            f"steps in [1, {run['steps']}]")
        check_series(f"{where}.curve", run["curve"], run["steps"],
                     {"loss": LOSSES, "lr": learning_rates(prof.lr), "val_bpc": BPC,
                      "scores": layer_rows(layers)})
        allowed = lengths_for(run["encoding"], prof)
        for stage in TEXT_STAGES:
            per = run["scores"].get(stage)
            if (not isinstance(per, dict) or not all(k.isdigit() for k in per)
                    or sorted(map(int, per)) != allowed):
                raise bad_value(f"{where}.scores.{stage}", per,
                                f"an object with the lengths {allowed} (the {run['encoding']} "
                                "model's)")
            for n, row in per.items():
                if not isinstance(row, dict):
                    raise bad_value(f"{where}.scores.{stage}.{n}", row, "an object: mean, sd")
                check_fields(f"{where}.scores.{stage}.{n}", row,
                             {"mean": layer_rows(layers),
                               "sd": ((lambda v: list_of(number_rule(0.0, 0.5), "")[0](v)
                                       and len(v) == layers),
                                      f"{layers} standard deviations of scores in [0, 1], "
                                      "each in [0, 0.5], one per layer")})
        for j, row in enumerate(run["probes"]):
            check_fields(f"{where}.probes[{j}]", row, {
                "stage": one_of(TEXT_STAGES), "length": one_of_ints(allowed),
                "layer": (int_rule(0, layers - 1), f"a layer in [0, {layers - 1}]"),
                "features": one_of(FEATURE_SETS), "seed": SEED_FIELD,
                "nrmse": NRMSE, "r": (number_rule(-1.0, 1.0), "a correlation in [-1, 1]")})
        for j, row in enumerate(run["samples"]):
            check_fields(f"{where}.samples[{j}]", row, {"prompt": (text_rule, "a prompt"),
                                                         "text": (text_rule, "generated text")})
    check_distinct(name, runs, ("encoding", "seed"), ("curve", lambda r: r["curve"]))


def one_of_ints(options: Sequence[int]) -> Rule:
    allowed = tuple(options)
    return (lambda v: type(v) is int and v in allowed, f"one of {list(allowed)}")
