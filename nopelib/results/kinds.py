"""The own checks of the other result kinds: long, kernels, precision and early.

Each checks what its chapter reads (rows of scores per length and layer, the kernel sets'
outcomes, the precision check's gaps recomputed from its runs, the early curves and block 1's
quantities); the text study's are ``text_kind``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from nopelib.core.tasks import TASKS
from nopelib.core.model import GPTConfig
from nopelib.rules import bf16
from nopelib.rules.claims import LEARNED_AT
from nopelib.results.checks import (bad_value, check_complete, check_distinct, check_fields,
                                           check_layers, check_same, check_series, known_profile,
                                           layer_rows, profile_record)
from nopelib.results.schema import (ACCURACIES, CAMPAIGN_RUN, CAMPAIGN_RUN_LATER,
                                    CAMPAIGN_STREAMS, DTYPE_POLICIES, EARLY_CURVE,
                                    EARLY_FULL_PREFIX, EARLY_FULL_RUN, EARLY_MEASURED, EARLY_RUN,
                                    EXTRA_RUN, GAP, LONG_RUN, PRECISION_POLICY, PROVENANCE,
                                    REL_TOL, RUN, ResultsError, Rule, SECONDS, SEEDS_FIELD, SHARE,
                                    list_of, number_rule, one_of, text_rule)
from nopelib.training.train_profile import PRECISIONS, TrainProfile


def check_long(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    T = prov["T"]
    try:
        base = GPTConfig(**prov["base"])
    except (TypeError, ValueError) as exc:
        raise ResultsError(f"{name}: provenance.base: {exc}") from None
    layers = base.n_layer + 1
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, LONG_RUN)
        try:  # the scorecard names each width's model from the base one
            replace(base, n_embd=run["n_embd"])
        except ValueError as exc:
            raise bad_value(f"{where}.n_embd", run["n_embd"], f"a width of the base model: {exc}"
                            ) from None
        if run["window"] is not None and run["window"] > T:
            raise bad_value(f"{where}.window", run["window"], f"null or an integer in [1, T={T}]")
        _check_long_rows(where, run, T, layers)
    check_same(name, runs, "the lengths scored", lambda r: sorted({row[0] for row in r["scores"]}))
    check_same(name, runs, "the (octave, d) pairs of predicted_order",
               lambda r: sorted((row[0], row[1]) for row in r["predicted_order"]))
    check_distinct(name, runs, ("n_embd", "window", "seed"),
                   ("scores and order", lambda r: {k: v for k, v in r.items() if k != "seed"}))


def _cells(where: str, rows: list, width: int, ok: Callable[[list], bool], words: str,
           ) -> set[tuple]:
    """The index columns of ``rows`` (``width`` integers before the value, a number in
    [0, 1]), each allowed by ``ok`` and once."""
    seen: set[tuple] = set()
    for j, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == width + 1
                and all(type(x) is int for x in row[:width]) and SHARE[0](row[-1]) and ok(row)):
            raise bad_value(f"{where}[{j}]", row, words)
        cell = tuple(row[:width])
        if cell in seen:
            raise ResultsError(f"{where}[{j}] repeats {list(cell)}: each once")
        seen.add(cell)
    return seen


def _check_long_rows(where: str, run: dict, T: int, layers: int) -> None:
    """A long run's rows: every layer 0..L at every length (the longest T), the predicted
    score at the same lengths; every layer at the same (octave, d) pairs as the prediction,
    octaves powers of two up to T and d in [2, octave / 2]."""
    last = layers - 1
    scored = _cells(f"{where}.scores", run["scores"], 2,
                    lambda r: 3 <= r[0] <= T and 0 <= r[1] <= last,
                    f"[length in 3..T={T}, layer in 0..{last}, score in [0, 1]]")
    lengths = sorted({length for length, _ in scored})
    missing = sorted({(n, layer) for n in lengths for layer in range(layers)} - scored)
    if missing:
        raise ResultsError(f"{where}.scores lacks [length, layer] {list(missing[0])}: every "
                           f"layer 0..{last} at every length")
    if lengths[-1] != T:
        raise ResultsError(f"{where}.scores reach length {lengths[-1]}: the longest must be "
                           f"T = {T} (provenance.T)")
    predicted = _cells(f"{where}.predicted_scores", run["predicted_scores"], 1,
                       lambda r: r[0] in lengths,
                       f"[a length of scores {lengths}, predicted score in [0, 1]]")
    if predicted != {(n,) for n in lengths}:
        raise ResultsError(f"{where}.predicted_scores must hold each length of scores "
                           f"{lengths} once")

    def octave_d(octave: int, d: int) -> bool:
        return 2 <= octave <= T and octave & (octave - 1) == 0 and 2 <= d <= octave // 2

    pairs = _cells(f"{where}.predicted_order", run["predicted_order"], 2,
                   lambda r: octave_d(r[0], r[1]),
                   f"[octave (a power of two <= T={T}), d in [2, octave / 2], probability in "
                   "[0, 1]]")
    order = _cells(f"{where}.order", run["order"], 3,
                   lambda r: 0 <= r[0] <= last and octave_d(r[1], r[2]),
                   f"[layer in 0..{last}, octave (a power of two <= T={T}), d in [2, "
                   "octave / 2], fraction in [0, 1]]")
    extra = sorted({cell[1:] for cell in order} - pairs)
    if extra:
        raise ResultsError(f"{where}.order has [octave, d] {list(extra[0])}, which "
                           "predicted_order lacks: the two must read the same (octave, d)")
    missing = sorted({(layer, *p) for layer in range(layers) for p in pairs} - order)
    if missing:
        raise ResultsError(f"{where}.order lacks [layer, octave, d] {list(missing[0])}: every "
                           f"layer 0..{last} at each (octave, d) of predicted_order")


def check_campaign(name: str, doc: dict) -> None:
    """The campaign's ledger: each record a run's part in one sitting, the steps it reached
    no fewer than it began from, a run at most once a sitting."""
    for i, run in enumerate(doc["runs"]):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, CAMPAIGN_RUN, CAMPAIGN_RUN_LATER)
        device = run.get("device", "cpu")
        if run["streams"] > CAMPAIGN_STREAMS[device]:
            raise bad_value(f"{where}.streams", run["streams"],
                            f"at most {CAMPAIGN_STREAMS[device]} with device {device!r}")
        if run["to_step"] < run["from_step"]:
            raise bad_value(f"{where}.to_step", run["to_step"],
                            f"at least from_step ({run['from_step']})")
        if run["until"] < run["started"]:
            raise bad_value(f"{where}.until", run["until"],
                            f"not before the sitting started ({run['started']})")
    check_distinct(name, doc["runs"], ("key", "started"))


def check_kernels(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    sets = prov["sets"]
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, {**RUN, **EXTRA_RUN["kernels"]})
        if run["set"] not in sets:
            raise bad_value(f"{where}.set", run["set"], f"one of {sorted(sets)}")
        if run["inside"] != (not run["outside"]):
            raise bad_value(f"{where}.inside", run["inside"],
                            f"{not run['outside']}: inside exactly when outside is empty")
        if run["learned"] != (run["accuracy"] >= LEARNED_AT):
            raise bad_value(f"{where}.learned", run["learned"],
                            f"{run['accuracy'] >= LEARNED_AT}: exact match >= {LEARNED_AT}")
    check_same(name, runs, "the layers of scores_after", lambda r: len(r["scores_after"]))
    known_profile(name, prov)
    check_distinct(name, runs, ("set", "task", "seed"))  # two kernel sets may agree bit for bit
    check_complete(name, runs, ("task", "seed"), "set", list(sets))
    if "chapters" in prov:
        chapters = prov["chapters"]
        if not (isinstance(chapters, dict) and set(chapters) <= set(sets)):
            raise bad_value(f"{name}: provenance.chapters", chapters,
                            f"kernel set (of {sorted(sets)}) -> chapter -> passed and seconds")
        for kernel_set, outcome in chapters.items():
            if not isinstance(outcome, dict):
                raise bad_value(f"{name}: provenance.chapters.{kernel_set}", outcome,
                                "chapter -> passed and seconds")
            for chapter, c in outcome.items():
                check_fields(f"{name}: provenance.chapters.{kernel_set}.{chapter}", c,
                             {"passed": EXTRA_RUN["kernels"]["learned"], "seconds": SECONDS})


def check_precision(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    prof = profile_record(name, prov)
    if prov["steps"] > prof.steps:
        raise bad_value(f"{name}: provenance.steps", prov["steps"],
                        f"at most the profile's {prof.steps:,} steps")
    layers = prof.model.n_layer + 1
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, {**RUN, **EXTRA_RUN["precision"]})
        policy = PRECISION_POLICY[run["precision"]]
        if run["dtype_policy"] != policy:
            raise bad_value(f"{where}.dtype_policy", run["dtype_policy"],
                            f"{policy!r} for a {run['precision']} run (the check compares the two)")
        if run["steps"] > prov["steps"]:
            raise bad_value(f"{where}.steps", run["steps"], f"at most provenance.steps "
                                                       f"({prov['steps']})")
        check_series(f"{where}.curve", run["curve"], run["steps"],
                     {"accuracy": ACCURACIES, "val_accuracy": ACCURACIES,
                       "scores": layer_rows(layers)})
    known_profile(name, prov)
    check_distinct(name, runs, ("task", "seed", "precision"), ("curve", lambda r: r["curve"]))
    check_complete(name, runs, ("task", "seed"), "precision", PRECISIONS)
    gaps = doc.get("gaps")
    if not isinstance(gaps, list) or not gaps:
        raise bad_value(f"{name}: gaps", gaps, "a non-empty list: the rule's table (bf16.gaps)")
    for j, row in enumerate(gaps):
        check_fields(f"{name}: gaps[{j}]", row, GAP)
    try:
        table = bf16.gaps(runs)
    except ValueError as exc:
        raise ResultsError(f"{name}: runs: {exc}") from None
    expected = table.to_dict("records")
    if len(gaps) != len(expected):
        raise ResultsError(f"{name}: gaps holds {len(gaps)} rows: the runs give "
                           f"{len(expected)} (bf16.gaps)")
    for j, (row, want) in enumerate(zip(gaps, expected)):
        for field, value in want.items():
            same = (math.isclose(row[field], value, rel_tol=REL_TOL, abs_tol=REL_TOL)
                    if isinstance(value, float) else row[field] == value)
            if not same:
                raise bad_value(f"{name}: gaps[{j}].{field}", row[field],
                                f"{value!r}, what the runs give (bf16.gaps)")
    if prov["verdict"] != bf16.verdict(table):
        raise bad_value(f"{name}: provenance.verdict", prov["verdict"],
                        f"{bf16.verdict(table)!r}, the verdict of gaps")


# the CPU kernels an early study trained under, and what its runs hold (early_study.contents;
# files from before they were recorded lack them)
EARLY_PROVENANCE_OPTIONAL: dict[str, Rule] = {
    "cpu_capability": (lambda v: isinstance(v, str) and bool(v), "torch's CPU capability"),
    "tasks": list_of(lambda v: v in TASKS, f"a list of distinct tasks of {list(TASKS)}",
                     distinct=True, empty=False),
    "seeds": SEEDS_FIELD,
    "ablations": list_of(text_rule, "a list of distinct ablation names", distinct=True,
                         empty=False)}


def learning_rates(peak: float) -> Rule:
    """A curve's learning rate under a profile whose rate peaks at ``peak``
    (``TrainProfile.lr_at``: warm-up to it, then constant or decaying, never below 0)."""
    return number_rule(0.0, peak), f"a learning rate in [0, {peak:g}] (the profile's lr)"


def check_measured(where: str, point: dict, quantities: Sequence[str]) -> None:
    """rho, as block 1 was measured: the ratio of the embedding's RMS norm to the value
    vectors' (``dynamics.measure_block1``), at each of a curve's points or once."""
    for i, (rho, e, u) in enumerate(zip(*(point[k] for k in quantities))):
        if u > 0 and not math.isclose(rho, e / u, rel_tol=1e-6, abs_tol=1e-12):
            shown = f"[{i}]" if len(point["rho"]) > 1 else ""
            raise bad_value(f"{where}.rho{shown}", rho,
                            f"{e / u!r}, embedding_rms / value_rms (dynamics.measure_block1)")


def run_policy(run: dict, training: dict) -> str | None:
    """How an early run's training steps computed: its ``dtype_policy``; for a run
    from before runs recorded it, float32 where its file's profile record (``training``) asks
    float32 (an early run trains on the CPU, which autocasts only when asked), else None:
    bfloat16 where that CPU had bf16 units, which the file does not say."""
    if "dtype_policy" in run:
        return run["dtype_policy"]
    return "float32" if training.get("precision", "float32") == "float32" else None


# a run's precision, recorded since the early study of the paper's model trained each task in
# the trained study's precision (files from before lack it)
EARLY_RUN_OPTIONAL: dict[str, Rule] = {"dtype_policy": one_of(DTYPE_POLICIES)}


def check_early(name: str, doc: dict) -> None:
    prov, runs = doc["provenance"], doc["runs"]
    try:  # the study's own profile, named apart from the profile it starts from
        prof = TrainProfile.from_record(prov["training"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ResultsError(f"{name}: provenance.training: {exc}") from None
    layers = prof.model.n_layer + 1
    check_fields(f"{name}: provenance", prov, {}, EARLY_PROVENANCE_OPTIONAL)
    kept_from = prov.get("kept_from", [])  # a merged file: the invocations of its kept runs
    if not isinstance(kept_from, list) or "kept_from" in prov and not kept_from:
        raise bad_value(f"{name}: provenance.kept_from", kept_from, "a non-empty list")
    for i, earlier in enumerate(kept_from):
        check_fields(f"{name}: provenance.kept_from[{i}]", earlier,
                     {k: PROVENANCE[k] for k in ("command", "commit", "date")})
    series = {**EARLY_CURVE, "lr": learning_rates(prof.lr)}
    # a run to the end of its budget (early_study --full) is scored on the whole test split
    full = Path(name).name.startswith(EARLY_FULL_PREFIX)
    n_test = min(prof.n_test, prof.n_eval)
    for i, run in enumerate(runs):
        where = f"{name}: runs[{i}]"
        check_fields(where, run, {**EARLY_RUN, **(EARLY_FULL_RUN if full else {})},
                     EARLY_RUN_OPTIONAL)
        if run.get("dtype_policy") == "autocast-bfloat16" and prof.precision != "bfloat16":
            raise bad_value(f"{where}.dtype_policy", run["dtype_policy"],
                            "float32: the study's profile (provenance.training) asks float32")
        extra = sorted(set(EARLY_FULL_RUN) & set(run))
        if not full and extra:
            raise ResultsError(f"{where} holds {extra}: the fields of a run to the end of its "
                               f"budget, which only an {EARLY_FULL_PREFIX}* file holds")
        if full and run["n_test"] != n_test:
            raise bad_value(f"{where}.n_test", run["n_test"],
                            f"{n_test}, the whole test split (provenance.training)")
        check_layers(f"{where}.scores_init", run["scores_init"], layers)
        check_fields(f"{where}.measure_init", run["measure_init"], EARLY_MEASURED)
        rms = ("rho", "embedding_rms", "value_rms")
        check_measured(f"{where}.measure_init", {k: [run["measure_init"][k]] for k in rms}, rms)
        if run["steps"] > prov["window"]:
            raise bad_value(f"{where}.steps", run["steps"],
                            f"at most the study's window (provenance.window = {prov['window']})")
        if full and any(s > run["steps"] for s in run["resumed_at"]):
            raise bad_value(f"{where}.resumed_at", run["resumed_at"],
                            f"steps in [1, {run['steps']}]")
        check_series(f"{where}.curve", run["curve"], run["steps"],
                     {**series, "scores": layer_rows(layers)},
                     {"val_accuracy": ACCURACIES})
        check_measured(f"{where}.curve", run["curve"], rms)
    policies: dict[str, set] = {}
    for run in runs:
        policies.setdefault(run["task"], set()).add(run_policy(run, prov["training"]))
    mixed = sorted(t for t, p in policies.items() if len(p) > 1)
    if mixed:
        raise ResultsError(f"{name}: the runs of {mixed} trained in more than one precision "
                           "(dtype_policy, or none recorded): a task's runs share one")
    known_profile(name, prov)
    check_distinct(name, runs, ("task", "frozen", "seed"), ("curve", lambda r: r["curve"]))
    for field, of_runs in (("tasks", [t for t in TASKS if any(r["task"] == t for r in runs)]),
                           ("seeds", sorted({r["seed"] for r in runs}))):
        if field in prov and prov[field] != of_runs:
            raise bad_value(f"{name}: provenance.{field}", prov[field],
                            f"{of_runs}, the runs' (early_study.contents)")
