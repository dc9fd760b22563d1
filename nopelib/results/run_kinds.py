"""The own checks of the result kinds that hold trained task runs: recipe, grid, trained.

A trained study's file is checked run by run (fields, curves, matrices, probes) and as a study
(its seeds once each, its bookkeeping recomputed from its runs: the tail and the step each
run was learned from).
"""

from __future__ import annotations

import math
from typing import Any

from nopelib.core.features import FEATURE_SETS
from nopelib.rules.claims import LEARNED_AT, past_plateau
from nopelib.results.checks import (bad_value, check_complete, check_distinct, check_fields,
                                           check_layers, check_same, check_series, known_profile,
                                           layer_rows, profile_record, shown_value)
from nopelib.results.schema import (ACCURACIES, EXTRA_RUN, LOSSES, PROBES, PROBE_ROW,
                                           PROVENANCE, REL_TOL, RUN, RUN_ORIGIN,
                                           RUN_ORIGIN_COMMAND, RUN_ORIGIN_TRAINED,
                                           ResultsError, SEED_FIELD,
                                           TRAINED_PROVENANCE, TRAINED_PROVENANCE_OPTIONAL,
                                           TRAINED_RUN_LATER, int_rule, number_rule, text_rule)
from nopelib.training.train_profile import RECIPE_ENCODINGS, TrainProfile


def check_recipe(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = profile_record(name, prov)
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, {**RUN, **EXTRA_RUN["recipe"]})
        if run["pos_encoding"] not in RECIPE_ENCODINGS:
            raise bad_value(f"{where}.pos_encoding", run["pos_encoding"],
                            f"one of the recipe's encodings {list(RECIPE_ENCODINGS)}")
        cap = prof.for_task(run["task"]).steps * prov["scale"]
        if run["steps"] > cap:
            raise bad_value(f"{where}.steps", run["steps"], f"at most {cap:,} (the {prof.name} "
                            f"profile's {run['task']} steps x scale {prov['scale']})")
        check_series(f"{where}.curve", run["curve"], run["steps"], {"accuracy": ACCURACIES},
                     {"loss": LOSSES})
    known_profile(name, prov)
    check_distinct(name, runs, ("task", "seed", "pos_encoding"), ("curve", lambda r: r["curve"]))
    check_complete(name, runs, ("task", "seed"), "pos_encoding", RECIPE_ENCODINGS)


def check_grid(name: str, doc: dict) -> None:
    runs = doc["runs"]
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, {**RUN, **EXTRA_RUN["grid"]})
        for field in ("adjacency_before", "adjacency_after"):
            check_layers(f"{where}.{field}", run[field], run["n_layer"] + 1)
    # the run key (not read, and a CSV summary may read a key of digits as a number) and the
    # seed name a run; the rest is what it measured
    check_distinct(name, runs, ("n_layer", "n_embd", "task", "seed"),
                   ("results", lambda r: {k: v for k, v in r.items() if k not in ("seed", "key")}))


def check_trained(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = profile_record(name, prov)
    for i, run in enumerate(runs):
        _check_trained_run(f"{name}: runs[{i}]", run, prof)
    check_same(name, runs, "task", lambda r: r["task"])
    check_same(name, runs, "the fields written after the first studies (wall_seconds, resumed_at, "
               "dtype_policy, matrices)", lambda r: sorted(set(TRAINED_RUN_LATER) & set(r)))
    _check_policy(name, runs, prof)
    check_same(name, runs, "probes' settings (w, fit_tokens, probe_seeds)",
               lambda r: [r["probes"][k] for k in ("w", "fit_tokens", "probe_seeds")])
    seeds = known_profile(name, prov).seeds  # a study counts its profile's seeds as complete
    for i, run in enumerate(runs):
        if run["seed"] not in seeds:
            raise bad_value(f"{name}: runs[{i}].seed", run["seed"],
                            f"one of the {prov['profile']} profile's seeds {list(seeds)}")
    check_distinct(name, runs, ("seed",), ("trajectory", lambda r: r["trajectory"]))
    check_distinct(name, runs, ("key",))  # the run cache's key names one task, seed and profile
    _check_trained_provenance(name, prov, runs, prof)


def _check_policy(name: str, runs: list[dict], prof: TrainProfile) -> None:
    """How the runs' steps computed (``devices.dtype_policy``): float32 under a float32
    profile; under a bf16 one, bf16 autocast or float32 (a task no precision check cleared, or a
    CPU without bf16 units), the same for every run of the file (one task's study)."""
    if "dtype_policy" not in runs[0]:
        return  # a file from before runs recorded it (check_same: none of its runs does)
    if prof.precision == "float32" and runs[0]["dtype_policy"] != "float32":
        raise bad_value(f"{name}: runs[0].dtype_policy", runs[0]["dtype_policy"],
                        "'float32': the profile (provenance.training) trains in float32")
    check_same(name, runs, "dtype_policy", lambda r: r["dtype_policy"])


def _check_trained_run(where: str, run: Any, prof: TrainProfile) -> None:
    check_fields(where, run, {**RUN, **EXTRA_RUN["trained"]})
    later = [k for k in TRAINED_RUN_LATER if k in run]
    if later and len(later) < len(TRAINED_RUN_LATER):
        missing = next(k for k in TRAINED_RUN_LATER if k not in run)
        raise ResultsError(f"{where}.{missing} is missing (the run holds {later}, which the "
                           "study's writer writes with it)")
    check_fields(where, run, {k: TRAINED_RUN_LATER[k] for k in later})
    if "origin" in run:  # written since the paper model's study grew over several sittings
        check_fields(f"{where}.origin", run["origin"], RUN_ORIGIN)
        if run["origin"]["how"] == "trained":
            check_fields(f"{where}.origin", run["origin"], RUN_ORIGIN_TRAINED,
                         RUN_ORIGIN_COMMAND)
    layers, steps, task = prof.model.n_layer + 1, run["steps"], run["task"]
    if run["profile"] != prof.name:
        raise bad_value(f"{where}.profile", run["profile"],
                        f"the profile of provenance.training ({prof.name!r})")
    if run["n_test"] > prof.n_test:
        raise bad_value(f"{where}.n_test", run["n_test"], f"at most the profile's {prof.n_test:,}")
    cap = prof.for_task(task).steps
    if steps > cap:
        raise bad_value(f"{where}.steps", steps, f"at most the {prof.name} profile's {cap:,} "
                                            f"steps for {task}")
    _check_budget(where, run, prof.for_task(task))
    for field in ("scores_init", "scores_after"):
        check_layers(f"{where}.{field}", run[field], layers)
    t = run["trajectory"]
    check_series(f"{where}.trajectory", t, steps,
                 {"accuracy": ACCURACIES, "scores": layer_rows(layers)},
                 {"val_accuracy": ACCURACIES, "loss": LOSSES})
    if run["scores_after"] != t["scores"][-1]:
        raise ResultsError(f"{where}.scores_after must be the trajectory's last scores "
                           f"({shown_value(t['scores'][-1])})")
    plateau = past_plateau(t["step"], t["accuracy"], steps)  # what the writer recorded
    if run["learned_from"] != plateau["learned_from"]:
        raise bad_value(f"{where}.learned_from", run["learned_from"],
                        f"{plateau['learned_from']!r}: the curve step from which the trajectory "
                        f"stays at {LEARNED_AT} or above (claims.past_plateau)")
    if not math.isclose(run["tail"], plateau["tail"], rel_tol=REL_TOL, abs_tol=REL_TOL):
        raise bad_value(f"{where}.tail", run["tail"],
                        f"{plateau['tail']!r}: the share of its {steps:,} steps after learned_from "
                        "(claims.past_plateau)")
    if later:
        if run["wall_seconds"] < run["train_seconds"]:
            raise bad_value(f"{where}.wall_seconds", run["wall_seconds"],
                            f"at least train_seconds ({run['train_seconds']})")
        if any(s > steps for s in run["resumed_at"]):
            raise bad_value(f"{where}.resumed_at", run["resumed_at"], f"steps in [1, {steps}]")
        _check_matrices(f"{where}.matrices", run["matrices"], layers)
    _check_probes(f"{where}.probes", run["probes"], layers)


def _check_budget(where: str, run: dict, prof: TrainProfile) -> None:
    """Where the run's budget ended (``loop``: a budget that follows progress): ``decay_from``
    null where the step cap ended it (no ``stop_at``, or the validation split never reached
    it), else the step the split reached ``stop_at``, from which the run trained on at least
    ``tail_steps`` more, up to the cap (relearning only lengthens the tail)."""
    decay_from, steps, cap = run["decay_from"], run["steps"], prof.steps
    if decay_from is None:
        if steps != cap:
            raise bad_value(f"{where}.decay_from", decay_from,
                            f"the step its validation split reached stop_at: a run of {steps:,} "
                            f"steps ended before the cap ({cap:,}), so its tail began")
        return
    if not prof.stop_at:
        raise bad_value(f"{where}.decay_from", decay_from,
                        "null: the profile's budget does not follow progress (stop_at 0)")
    end = min(cap, decay_from + prof.tail_steps(decay_from))
    if not end <= steps:
        raise bad_value(f"{where}.decay_from", decay_from,
                        f"null or a step after which the run's {steps:,} steps hold its tail "
                        f"(decay_from + tail_steps(decay_from), at most {cap:,})")


def _check_matrices(where: str, matrices: dict, layers: int) -> None:
    """Every layer's self-similarity matrix on one input: one row and column per character,
    cosines in [-1, 1], and 1 on the diagonal (a vector's cosine with itself, up to float32
    rounding)."""
    text = matrices.get("text")
    if not text_rule(text):
        raise bad_value(f"{where}.text", text, "the input's text")
    mats = matrices.get("layers")
    if not isinstance(mats, list) or len(mats) != layers:
        raise bad_value(f"{where}.layers", mats, f"a list of {layers} matrices (layers 0.."
                                            f"{layers - 1})")
    cosine, n = number_rule(-1.0, 1.0), len(text)
    for layer, mat in enumerate(mats):
        if not (isinstance(mat, list) and len(mat) == n and all(
                isinstance(row, list) and len(row) == n and all(cosine(x) for x in row)
                for row in mat)):
            raise ResultsError(f"{where}.layers[{layer}] must be a {n} x {n} matrix (one row "
                               f"and column per character of {text!r}) of cosines in [-1, 1]")
        off = next((i for i in range(n) if not math.isclose(mat[i][i], 1.0, abs_tol=1e-4)), None)
        if off is not None:
            raise bad_value(f"{where}.layers[{layer}][{off}][{off}]", mat[off][off],
                            "1 within 1e-4: the cosine of a position's vector with itself")


def _check_probes(where: str, probes: dict, layers: int) -> None:
    """The probe grid (every layer, feature set and probe seed once) and the shuffled-target
    control (layer 1, every feature set, the first probe seed once)."""
    check_fields(where, probes, PROBES)
    seeds = probes["probe_seeds"]
    grids = {"rows": ({(layer, f, s) for layer in range(layers) for f in FEATURE_SETS
                       for s in seeds},
                      f"layers 0..{layers - 1} x features {list(FEATURE_SETS)} x probe "
                      f"seeds {seeds}"),
             "shuffled": ({(1, f, seeds[0]) for f in FEATURE_SETS},
                          f"layer 1 x features {list(FEATURE_SETS)} x probe seed {seeds[0]}")}
    for part, (grid, words) in grids.items():
        seen: set[tuple] = set()
        for j, row in enumerate(probes[part]):
            at = f"{where}.{part}[{j}]"
            check_fields(at, row, PROBE_ROW)
            cell = (row["layer"], row["features"], row["seed"])
            if cell not in grid:
                raise bad_value(f"{at} (layer, features, seed)", cell, f"a cell of {words}")
            if cell in seen:
                raise ResultsError(f"{at} repeats (layer, features, seed) = {cell}: each once")
            seen.add(cell)
        if seen != grid:
            lacking = sorted(grid - seen)
            raise ResultsError(f"{where}.{part} lacks {len(lacking)} (layer, features, seed) "
                               f"cells, e.g. {lacking[0]}: must hold each cell of {words}")


def _check_trained_provenance(name: str, prov: dict, runs: list[dict],
                              prof: TrainProfile) -> None:
    where = f"{name}: provenance"
    check_fields(where, prov, TRAINED_PROVENANCE, TRAINED_PROVENANCE_OPTIONAL)
    task = runs[0]["task"]
    if "tasks" in prov and task not in prov["tasks"]:
        raise bad_value(f"{where}.tasks", prov["tasks"], f"the invocation's tasks, with {task!r}")
    if "seeds" in prov and prov["seeds"] != [r["seed"] for r in runs]:
        raise bad_value(f"{where}.seeds", prov["seeds"],
                        f"the runs' seeds {[r['seed'] for r in runs]}")
    if "trajectory" in prov:
        check_fields(f"{where}.trajectory", prov["trajectory"],
                     {"n_inputs": (int_rule(prof.n_trajectory, prof.n_trajectory),
                                    f"the profile's n_trajectory ({prof.n_trajectory})"),
                       "seed": SEED_FIELD})
    if "runs_kept" in prov and prov["runs_kept"] + prov["runs_from_cache"] > len(runs):
        raise bad_value(f"{where}.runs_kept", prov["runs_kept"],
                        f"at most the {len(runs)} runs less the {prov['runs_from_cache']} "
                        "read from the run cache")
    if "trained_by" in prov:
        check_fields(f"{where}.trained_by", prov["trained_by"], PROVENANCE,
                     {"cpu_capability": TRAINED_PROVENANCE_OPTIONAL["cpu_capability"]})
