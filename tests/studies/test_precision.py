"""Tests of the precision check (nopelib.studies.precision): its rule on constructed curves, its
profiles, and a bf16 run that is keyed by the precision that actually ran."""

from dataclasses import replace

import numpy as np
import pytest

from nopelib.core import devices
from nopelib.core.devices import bf16_available, dtype_policy
from nopelib.core.model import GPTConfig
from nopelib.rules import bf16
from nopelib.results import files as results
from nopelib.studies import precision
from nopelib.training import profiles, runs as rc, train_profile


def _run(task: str, seed: int, prec: str, layer1: list[float], val: list[float]) -> dict:
    scores = [[0.5, s, 0.7] for s in layer1]
    return {"task": task, "seed": seed, "precision": prec,
            "curve": {"step": list(range(1, len(layer1) + 1)), "scores": scores,
                      "val_accuracy": val}}


def _runs(shift: float) -> list[dict]:
    """Three seeds whose layer-1 curves lie 0.1 apart; the bf16 run of each seed is its
    float32 curve moved by ``shift``."""
    out = []
    for seed in range(3):
        base = [0.8 - 0.1 * seed, 0.7 - 0.1 * seed]
        out.append(_run("reversal", seed, "float32", base, [0.0, 0.1]))
        out.append(_run("reversal", seed, "bfloat16", [x + shift for x in base], [0.0, 0.1]))
    return out


def test_a_precision_that_moves_runs_less_than_the_seed_changes_nothing():
    table = bf16.gaps(_runs(0.02))
    layer1 = table.set_index("quantity").loc["layer 1"]
    assert layer1["precision_gap"] == pytest.approx(0.02)
    assert layer1["seed_gap"] == pytest.approx(0.1)  # pairs 0.1, 0.2, 0.1: the median
    assert bf16.verdict(table) == "no change"
    assert set(table.quantity) == {"layer 0", "layer 1", "layer 2", "val exact match"}


def test_a_precision_that_moves_runs_as_far_as_the_seed_changes_them():
    table = bf16.gaps(_runs(0.15))
    assert table.set_index("quantity").loc["layer 1", "verdict"] == "changes"
    assert bf16.verdict(table) == "changes"  # one quantity is enough


def test_the_rule_needs_two_seeds_in_both_precisions_and_curves_of_one_length():
    runs = _runs(0.0)
    with pytest.raises(ValueError, match=">= 2 seeds"):
        bf16.gaps([r for r in runs if r["seed"] == 0])
    runs[1]["curve"]["scores"] = runs[1]["curve"]["scores"][:1]
    with pytest.raises(ValueError, match="different lengths"):
        bf16.gaps(runs)
    with pytest.raises(ValueError, match="no gaps"):
        bf16.verdict(bf16.gaps(_runs(0.0)).iloc[:0])


def test_each_committed_check_is_named_by_its_profile_and_tasks():
    # a check of other tasks is a file beside the committed ones, not over one of them
    checks = results.load_all("precision")
    assert checks
    for name, doc in checks.items():
        tasks = {r["task"] for r in doc["runs"]}
        assert name == precision.out_name(doc["provenance"]["profile"], tasks)
    assert (precision.out_name("paper_study", ["reversal", "addition"])
            == precision.out_name("paper_study", ["addition", "reversal"])
            == "precision_paper_study_addition_reversal.json")


def test_check_profiles_cap_the_steps_and_differ_only_in_precision():
    profs = precision.check_profiles(profiles.PROFILES["paper_study"], 300)
    fp, bf = profs["float32"], profs["bfloat16"]
    assert fp.steps == bf.steps == 300 and (fp.precision, bf.precision) == train_profile.PRECISIONS
    assert replace(bf, name=fp.name, precision="float32") == fp
    assert fp.curve_dense_every == 25 and fp.stop_at == profiles.PROFILES["paper_study"].stop_at
    with pytest.raises(ValueError, match="steps=0"):
        precision.check_profiles(profiles.PROFILES["paper_study"], 0)


def test_a_bad_precision_is_refused_and_recorded_only_when_set():
    with pytest.raises(ValueError, match="precision='fp16' is unknown"):
        replace(profiles.PROFILES["study"], precision="fp16")
    assert "precision" not in profiles.PROFILES["study"].record()
    bf = replace(profiles.PROFILES["study"], precision="bfloat16")
    assert bf.record()["precision"] == "bfloat16"
    assert train_profile.TrainProfile.from_record(bf.record()) == replace(bf, seeds=(0,))


def test_a_bf16_run_is_keyed_by_the_precision_that_ran(tmp_path, recwarn):
    tiny = replace(profiles.PROFILES["cpu"], name="tiny-bf16", steps=4, batch_size=4,
                   model=GPTConfig(n_layer=1, n_head=1, n_embd=8), warmup_steps=1,
                   n_train=40, n_test=8, n_eval=8, eval_batch_size=8, log_every=2,
                   task_budgets=(), claim_tasks=(), curve_every=2, n_curve=8)
    bf = replace(tiny, precision="bfloat16")
    keys, policies = {}, {}
    with pytest.MonkeyPatch.context() as m:  # a CPU with bf16 units, then one without
        for units in (True, False):
            m.setattr(devices, "bf16_available", lambda units=units: units)
            policies[units] = dtype_policy("cpu", "bfloat16")
            keys[units] = rc.run_key("addition", 0, bf, "cpu")
            assert dtype_policy("cpu", "float32") == "float32"  # asked for float32: float32
    assert policies == {True: "autocast-bfloat16", False: "float32"}
    assert keys[True] != keys[False]  # the precision that runs is part of the key
    # a GPU follows the profile: a task no check cleared is float32 there too
    assert dtype_policy("cuda", "float32") == "float32"
    assert dtype_policy("cuda", "bfloat16") == "autocast-bfloat16"
    # this CPU's own run: keyed and recorded by what it has
    expected = policies[bf16_available()]
    run = rc.train_or_load("addition", 0, bf, device="cpu", cache_dir=tmp_path, progress=False)
    assert run.metrics["dtype_policy"] == expected
    assert run.metrics["key"] == keys[bf16_available()]
    assert np.isfinite(run.metrics["final_loss"])
    if not bf16_available():  # the fall-back says so
        assert any("no bf16 units" in str(w.message) for w in recwarn)
