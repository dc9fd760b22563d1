"""Tests of the trained-model study (nopelib.study): the initial pattern, the accuracy and
plateau tables, the committed recipe and budget studies, the scores before and after
training, and the chapter's parameter rules. Trained runs are stood in for by objects with
the metrics a run records (and a random model where one is read), so nothing trains."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nopelib import claims, results, study
from nopelib.analysis import LEARNED_AT, random_model
from nopelib.metrics import layer_scores
from nopelib.tasks import sample_inputs
from nopelib.model import GPTConfig
from nopelib.profiles import PROFILES
from nopelib.tasks import make_split, majority_baseline

BOOK = Path(__file__).resolve().parents[1] / "book"
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32)


def _run(accuracy: float, steps: int = 100, curve: list[float] | None = None,
         model: object = None) -> SimpleNamespace:
    """A stand-in for a trained run: the metrics ``nopelib.runs`` records, and a model."""
    curve = curve if curve is not None else [0.0, accuracy]
    metrics = dict(accuracy=accuracy, n_test=PROFILES["cpu"].n_test, steps=steps,
                   train_seconds=1.5, step_ms=2.0, device="cpu",
                   curve=dict(step=list(np.linspace(0, steps, len(curve)).astype(int)),
                              accuracy=curve))
    return SimpleNamespace(metrics=metrics, model=model)


def test_chapter_params_name_the_parameters_cell():
    """The rules and the trained chapter's parameters cell name the same parameters."""
    cells = json.loads((BOOK / "trained.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if "parameters" in c.get("metadata", {}).get("tags", []))
    names = [t.id for node in ast.parse(source).body for t in node.targets]
    assert names == list(study.CHAPTER_PARAMS)


def test_initial_pattern_rows():
    table = study.initial_pattern({"tiny": TINY, "tiny, sigma 0.002":
                                   GPTConfig(n_layer=2, n_head=2, n_embd=32, init_std=0.002)},
                                  ["reversal"], [0, 1])
    assert list(table.index) == ["tiny", "tiny, sigma 0.002"]
    assert list(table.columns) == ["layers", "width", "sigma_e", "rho", "predicted",
                                   "measured"]
    assert (table.rho > 0).all() and table.rho.iloc[1] < table.rho.iloc[0]
    assert ((table.predicted > 0.5) & (table.predicted <= 1)).all()
    texts = sample_inputs("reversal", study.INIT_INPUTS, seed=study.INIT_SEED)
    measured = np.mean([layer_scores(random_model(TINY, seed=s), texts)[:, 1].mean()
                        for s in (0, 1)])
    assert table.loc["tiny", "measured"] == pytest.approx(measured)


def test_run_and_accuracy_tables():
    prof = PROFILES["cpu"]
    runs = {("addition", 0): _run(0.95), ("addition", 1): _run(0.5),
            ("reversal", 0): _run(0.99), ("reversal", 1): _run(0.91)}
    per_run = study.run_table(runs, prof)
    assert len(per_run) == 4 and list(per_run.columns[:3]) == ["task", "seed", "accuracy"]
    test = make_split("addition", 1, n_train=prof.n_train, n_test=prof.n_test).test
    assert per_run.majority.iloc[1] == majority_baseline(test)[1]
    acc = study.accuracy_table(per_run, prof, ["reversal", "addition"], [0, 1])
    assert list(acc.index) == ["reversal", "addition"]
    assert list(acc.columns) == ["seed 0", "seed 1", "majority", "steps", "n_test",
                                 "learned", "claim set"]
    assert acc.learned.tolist() == [True, False]  # every seed must reach LEARNED_AT
    assert acc["claim set"].tolist() == [t in prof.claim_tasks for t in acc.index]


def test_plateau_table():
    late = [0.0, 0.95, 0.2, 0.8, 0.92]  # back below the line; for good only at the end
    early = [0.0, 0.95, 0.96, 0.97, 0.99]
    runs = {("reversal", 0): _run(0.99, 400, early), ("reversal", 1): _run(0.92, 400, late)}
    table = study.plateau_table(runs, ["reversal"], [0, 1])
    assert table.learned_from.tolist() == [100, 400]
    assert table.with_margin.tolist() == [True, False]
    assert table["tail"].iloc[0] == pytest.approx(0.75)
    assert study.plateau_table(runs, [], [0, 1]).empty


def test_leaves_plateau():
    run = dict(task="reversal", curve=dict(step=[0, 10, 20, 30],
                                           accuracy=[0.2, 0.25, 0.31, 0.5]))
    assert study.leaves_plateau(run, {"reversal": 0.2}) == 20  # first point above 0.3
    assert study.leaves_plateau(run, {"reversal": 0.45}) is None
    assert study.leaves_plateau(run, {}) == 0  # no baseline: 0, plus the margin
    assert study.leaves_plateau(run, {"reversal": 0.2}, margin=0.2) == 30


def test_committed_recipe_studies():
    studies = results.load_all("recipe")
    if not studies:
        pytest.skip("no committed recipe study")
    baselines = {"addition": 0.0, "reversal": 0.0, "indexing": 0.1, "ordering": 0.1}
    table = study.recipe_table(studies, baselines)
    assert len(table) == sum(len(r["runs"]) for r in studies.values())
    assert "curve" not in table and table.columns[-1] == "leaves_plateau_at"
    for name, recipe in studies.items():
        lines = study.recipe_budgets(recipe, PROFILES["cpu"])
        assert len(lines) == len({r["task"] for r in recipe["runs"]})
        assert all("today's cpu profile" in line and "x today's budget" in line
                   for line in lines)
    summary = study.recipe_summary(table, baselines).splitlines()
    assert len(summary) == len(table.groupby(["task", "seed"]))
    assert all(line.startswith("- **") and "NoPE" in line for line in summary)


def test_scores_before_after_and_table():
    """A 'trained' model that is its own initialisation scores the same before and after."""
    runs = {("reversal", s): SimpleNamespace(model=random_model(TINY, seed=s))
            for s in (0, 1)}
    before, after = study.scores_before_after(TINY, runs, ["reversal"], [0, 1], 6)
    assert before["reversal"].shape == (2, TINY.n_layer + 1)
    np.testing.assert_allclose(before["reversal"], after["reversal"])
    table = study.score_table(before, after, np.arange(TINY.n_layer + 1))
    assert table.index.name == "layer"
    assert list(table.columns) == [("reversal", "before"), ("reversal", "after")]
    np.testing.assert_allclose(table[("reversal", "after")], after["reversal"].mean(0))


def _scores(rng: np.random.Generator, n_seeds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    before = 0.9 + 0.01 * rng.normal(size=(n_seeds, 5))
    after = np.array([0.7, 0.95, 0.9, 0.85, 0.8]) + 0.01 * rng.normal(size=(n_seeds, 5))
    return before, after


def test_verdict_summary():
    before, after = _scores(np.random.default_rng(0))
    verdicts = claims.claim_table(claims.trained_claims(
        {"reversal": before}, {"reversal": after}, ["reversal"])).assign(paper="holds")
    lines = study.verdict_summary(verdicts).splitlines()
    assert len(lines) == len(verdicts) + 2  # one per reading, a blank line, the count
    n_against = (verdicts.verdict == "fails").sum()
    assert lines[-1].startswith(f"Against the paper: {n_against} of {len(verdicts)} readings")


def test_budget_verdicts_and_summary():
    rng = np.random.default_rng(1)
    n_test = PROFILES["cpu"].n_test
    runs = []
    for steps, accuracy in ((1000, 0.5), (2000, 0.97)):
        before, after = _scores(rng)
        runs += [dict(task="reversal", seed=s, steps=steps, accuracy=accuracy,
                      n_test=n_test, before=list(before[s]), after=list(after[s]))
                 for s in range(3)]
    rows, stats = study.budget_verdicts({"runs": runs}, n_test)
    assert [(r["steps"], r["learned"]) for r in rows] == [(1000, False), (2000, True)]
    readings = [reading for _, reading in claims.TRAINED_CLAIMS]
    assert not set(readings) & set(rows[0]) and set(readings) <= set(rows[1])
    assert list(stats) == ["reversal, 1,000 steps", "reversal, 2,000 steps"]
    by_budget = pd.DataFrame(rows).set_index(["task", "steps"])
    (line,) = study.budget_summary(by_budget).splitlines()
    assert line.startswith("- **reversal** (committed): 1,000 steps: not learned, no verdict")
    assert all(f"{reading}: " in line for reading in readings)


def test_grid_caption():
    provenance = dict(command="python -m nopelib.grid tiny", commit="0123456789abcdef",
                      machine="m", torch="2.13.0", backend="local", wall_seconds=90.0,
                      date="2026-01-01")
    caption = study.grid_caption("tiny", provenance, 8)
    assert caption.startswith("Grid `tiny` (committed): 8 runs")
    assert "`0123456789ab`" in caption and "1.5 min wall" in caption
    assert set(study.GRID_COMMANDS) == {"paper-base", "paper"}


def test_learned_at_is_the_plateau_line():
    """plateau_table judges with claims.past_plateau, whose line is the learnedness line."""
    run = _run(LEARNED_AT, 100, [0.0, LEARNED_AT])
    (row,) = study.plateau_table({("reversal", 0): run}, ["reversal"], [0]).to_dict("records")
    assert row["learned_from"] == 100
