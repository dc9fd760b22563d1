"""The own checks of the text-length study's result: its models read up to 2,048 characters.

A run of ``nopelib.studies.text_length`` is a language model trained as the text study's, with
its bits per character at each length it reads, a per-position curve, NoPE's sharpened bits,
and what its hidden states hold at each length; checked here against the text profile its
file records and the lengths ``length_claims.lengths_read`` gives its encoding.
"""

from __future__ import annotations

from nopelib.results.checks import (bad_value, check_distinct, check_fields, check_series,
                                    layer_rows, profile_record)
from nopelib.results.kinds import learning_rates
from nopelib.results.schema import (LOSSES, SECONDS, SEED_FIELD, SHARE, STEPS, Rule, int_rule,
                                    iso_date, list_of, object_rule, one_of, text_rule)
from nopelib.results.text_kind import BPC, TEXT_SPLITS, TRAINED_TEXT
from nopelib.rules.length_claims import CURVE_BIN, LENGTH_ENCODINGS, lengths_read
from nopelib.training.text_lm import TextProfile

LENGTH_WINDOWS: dict[str, Rule] = {"n": STEPS, "states": STEPS, "seed": SEED_FIELD,
                                   "split": one_of(TEXT_SPLITS), "length": STEPS}
MADE: dict[str, Rule] = {"commit": (text_rule, "a git commit"), "machine": (text_rule,
                                                                             "a machine"),
                         "date": (iso_date, "an ISO 8601 date"), "wall_seconds": SECONDS}
LENGTH_RUN: dict[str, Rule] = {
    "encoding": one_of(LENGTH_ENCODINGS),
    **TRAINED_TEXT,
    "bpc": object_rule("bits per character per length"),
    "sharpened": object_rule("NoPE's bits per character per length with the temperature"),
    "position_bits": list_of(BPC[0], "a list of bits per character"),
    "scores": object_rule("per length, one adjacency score per layer"),
    "ordered": object_rule("per length, one share of rows ordered right per layer"),
    "order": list_of(lambda v: isinstance(v, list) and len(v) == 4,
                     "a list of [layer, octave, distance, share] rows"),
    "made": object_rule("an object with commit, machine, date and wall_seconds"),
}


def _per_length(where: str, value: dict, lengths: list[int], rule: Rule) -> None:
    if sorted(map(int, value)) != lengths or not all(k.isdigit() for k in value):
        raise bad_value(where, value, f"an object with the lengths {lengths}")
    check_fields(where, value, {str(n): rule for n in lengths})


def check_length(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = profile_record(name, prov, TextProfile)
    layers = prof.n_layer + 1
    check_fields(f"{name}: provenance.windows", prov["windows"], LENGTH_WINDOWS)
    shares: Rule = (lambda v: isinstance(v, list) and len(v) == layers
                    and all(SHARE[0](x) for x in v), f"{layers} shares in [0, 1], one a layer")
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, LENGTH_RUN)
        check_fields(f"{where}.made", run["made"], MADE)
        if run["steps"] > prof.steps:
            raise bad_value(f"{where}.steps", run["steps"], f"at most the profile's {prof.steps:,}")
        check_series(f"{where}.curve", run["curve"], run["steps"],
                     {"loss": LOSSES, "lr": learning_rates(prof.lr), "val_bpc": BPC,
                      "scores": layer_rows(layers)})
        lengths = lengths_read(run["encoding"], prof.context)
        _per_length(f"{where}.bpc", run["bpc"], lengths, BPC)
        if run["encoding"] == "none":
            _per_length(f"{where}.sharpened", run["sharpened"], lengths, BPC)
        elif run["sharpened"]:
            raise bad_value(f"{where}.sharpened", run["sharpened"], "{} (NoPE's alone)")
        if len(run["position_bits"]) != max(lengths) // CURVE_BIN:
            raise bad_value(f"{where}.position_bits", len(run["position_bits"]),
                            f"{max(lengths) // CURVE_BIN} points of {CURVE_BIN} positions")
        _per_length(f"{where}.scores", run["scores"], lengths, layer_rows(layers))
        _per_length(f"{where}.ordered", run["ordered"], lengths, shares)
        for j, (layer, octave, d, share) in enumerate(run["order"]):
            if not (int_rule(0, layers - 1)(layer) and int_rule(2)(octave) and int_rule(1)(d)
                    and SHARE[0](share) and d < octave):
                raise bad_value(f"{where}.order[{j}]", run["order"][j],
                                f"[layer in 0..{layers - 1}, octave, distance < octave, "
                                "share in [0, 1]]")
    check_distinct(name, runs, ("encoding", "seed"), ("curve", lambda r: r["curve"]))
