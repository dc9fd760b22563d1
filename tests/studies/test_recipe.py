"""The recipe study: scaled profiles, and a tiny study end to end through the run cache."""

import json
from dataclasses import replace

import pytest

import nopelib.studies.recipe as recipe
from nopelib.core.model import GPTConfig
from nopelib.store import cache
from nopelib.training import profiles, train_profile

TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=1, n_head=2, n_embd=16),
    steps=8, task_budgets=(("addition", 10),), batch_size=8, warmup_steps=2, n_train=64,
    n_test=16, n_eval=16, n_curve=16, curve_every=4, eval_batch_size=16, log_every=4,
    seeds=(0,),
)


def test_recipe_profile_scales_every_budget_and_keeps_the_rest():
    prof = TINY.scaled(4, "learned")
    assert prof.steps == 32 and dict(prof.task_budgets) == {"addition": 40}
    assert prof.model.pos_encoding == "learned" and prof.model.n_embd == TINY.model.n_embd
    assert (prof.lr, prof.batch_size, prof.warmup_steps) == (TINY.lr, TINY.batch_size, 2)
    assert TINY.scaled(1, "none").model == TINY.model
    with pytest.raises(ValueError, match="scale"):
        TINY.scaled(0, "none")


def test_a_tiny_study_writes_curves_with_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(profiles.PROFILES, "tiny", TINY)
    out = tmp_path / "results" / "curves.json"
    recipe.main(["--out", str(out), "--profile", "tiny", "--tasks", "addition", "--scale", "2",
                 "--device", "cpu"])
    result = json.loads(out.read_text())
    prov = result["provenance"]
    assert prov["command"].startswith("python -m nopelib.studies.recipe --out")
    assert prov["scale"] == 2 and prov["wall_seconds"] > 0 and prov["torch"]
    # the profile's numbers as they stood, since a profile changes between commits
    assert prov["training"]["batch_size"] == TINY.batch_size
    assert prov["training"]["lr"] == TINY.lr and prov["training"]["model"]["n_embd"] == 16
    assert train_profile.TrainProfile.from_record(prov["training"]) == replace(TINY, seeds=(0,))
    assert {(r["task"], r["pos_encoding"]) for r in result["runs"]} == {
        ("addition", "none"), ("addition", "learned")}
    for run in result["runs"]:
        assert run["steps"] == 20  # twice the task's budget
        assert run["curve"]["step"][-1] == 20 and len(run["curve"]["accuracy"]) == 5
    assert not list(out.parent.glob(".tmp-*"))  # written atomically
