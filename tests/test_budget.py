"""The budget study: budget profiles, bad input, and a tiny study end to end."""

import json
from dataclasses import replace

import pytest

import nopelib.budget as budget
from nopelib import launch, profiles
from nopelib import runs as rc
from nopelib.model import GPTConfig

TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=1, n_head=2, n_embd=16),
    steps=8, task_budgets=(("addition", 10, 4, 1e-3),), batch_size=8, warmup_steps=2,
    n_train=64, n_test=16, n_eval=16, n_curve=16, curve_every=0, eval_batch_size=16,
    log_every=4, seeds=(0, 1),
)


def test_a_budget_profile_changes_only_the_task_steps():
    longer = TINY.with_steps("addition", 30)
    assert longer.for_task("addition") == replace(TINY.for_task("addition"), steps=30,
                                                  name=longer.name)
    assert longer.for_task("reversal") == replace(TINY.for_task("reversal"), name=longer.name)
    assert longer.name != TINY.name
    # a task without its own budget keeps the profile's batch and learning rate
    other = TINY.with_steps("reversal", 12).for_task("reversal")
    assert (other.steps, other.batch_size, other.lr) == (12, TINY.batch_size, TINY.lr)
    # the profile's own budget is the profile itself: the same run key, the chapter's run
    assert TINY.with_steps("addition", 10) is TINY
    assert rc.run_key("addition", 0, TINY.with_steps("addition", 10)) == \
        rc.run_key("addition", 0, TINY)


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=[2]), "steps=2"),
    (dict(steps=[5, 5]), "repeat"),
    (dict(seeds=[-1]), "seed=-1"),
    (dict(n_analysis=0), "n_analysis"),
    (dict(task="sorting"), "sorting"),
])
def test_bad_input_is_refused_before_training(kwargs, match, monkeypatch):
    monkeypatch.setattr(budget, "train_missing", lambda *a, **k: pytest.fail("trained"))
    args = dict(profile=TINY, task="addition", steps=[10], seeds=[0], n_analysis=4)
    with pytest.raises(ValueError, match=match):
        budget.run_budget_study(**{**args, **kwargs})


def test_a_tiny_study_writes_scores_with_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(profiles.PROFILES, "tiny", TINY)
    out = tmp_path / "results" / "budget.json"
    budget.main(["--out", str(out), "--profile", "tiny", "--task", "addition",
                 "--steps", "6", "10", "--n-analysis", "4", "--device", "cpu"])
    result = json.loads(out.read_text())
    prov = result["provenance"]
    assert prov["command"].startswith("python -m nopelib.budget --out")
    assert prov["profile_steps"] == 10 and prov["wall_seconds"] > 0
    assert {(r["steps"], r["seed"]) for r in result["runs"]} == {
        (6, 0), (6, 1), (10, 0), (10, 1)}
    # the profile's own budget is the run train_many gives the chapter
    chapter = launch.train_many([("addition", 0)], "tiny", device="cpu")["addition", 0]
    assert chapter.from_cache
    row = next(r for r in result["runs"] if (r["steps"], r["seed"]) == (10, 0))
    assert row["accuracy"] == chapter.metrics["accuracy"]
    for row in result["runs"]:
        assert len(row["before"]) == len(row["after"]) == TINY.model.n_layer + 1
        assert all(0.0 <= s <= 1.0 for s in row["before"] + row["after"])
    # the untrained model is the same for every budget of a seed
    by_seed = {}
    for row in result["runs"]:
        assert by_seed.setdefault(row["seed"], row["before"]) == row["before"]
    assert not list(out.parent.glob(".tmp-*"))  # written atomically
