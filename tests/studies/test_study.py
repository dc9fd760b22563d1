"""Tests of the trained chapter's computations (``trained_tables``, ``trained_prose``,
``theory_studies.initial_pattern``, ``recipe``, ``grid``, ``kernels``): the initial pattern, the
committed trained-model study's tables and scores, the live reproduction check, the committed
recipe study, and the chapter's parameter rules. Runs are stood in for by records of the form
the study commits, so nothing trains."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nopelib.averaging import theory_studies
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPTConfig
from nopelib.core.tasks import sample_inputs
from nopelib.rules import claims
from nopelib.results import (files as results, trained_files, trained_prose,
                             trained_tables)
from nopelib.studies import grid, kernels, recipe
from nopelib.core.one_model import random_model
from nopelib.training.profiles import PROFILES

BOOK = Path(__file__).resolve().parents[2] / "book"
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32)


def _record(seed: int, accuracy: float, curve: list[float], layer1: list[float],
            task: str = "reversal") -> dict:
    """A stand-in for one run of the committed study (``trained_study.run_record``): a
    4-step trajectory with the given test exact match and layer-1 scores."""
    steps = [100, 200, 300, 400]
    scores = [[0.6 + 0.001 * seed, s1, 0.8 - 0.001 * seed] for s1 in layer1]
    plateau = claims.past_plateau(steps, curve, 400)
    return dict(task=task, seed=seed, accuracy=accuracy, n_test=PROFILES["study"].n_test,
                steps=400, decay_from=200, train_seconds=10.0, key="k",
                learned_from=plateau["learned_from"], tail=plateau["tail"],
                scores_init=[0.5, 0.9, 0.9], scores_after=scores[-1],
                trajectory=dict(step=steps, accuracy=curve, scores=scores))


def _docs() -> dict:
    good = [0.1, 0.95, 0.97, 0.99]
    return {"reversal": {"runs": [_record(0, 0.99, good, [0.8, 0.9, 0.92, 0.94]),
                                  _record(1, 0.98, good, [0.8, 0.88, 0.9, 0.92])]},
            "ordering": {"runs": [_record(0, 0.97, [0.0, 0.2, 0.5, 0.95], [0.8] * 4,
                                          "ordering"),
                                  _record(1, 0.6, [0.0, 0.1, 0.3, 0.6], [0.8] * 4,
                                          "ordering")]}}


def test_study_tables_judge_learned_with_margin():
    table = trained_tables.study_table(_docs())
    assert len(table) == 4 and list(table.columns[:3]) == ["task", "seed", "accuracy"]
    assert table.with_margin.tolist() == [True, True, False, False]
    acc = trained_tables.study_accuracy(table, PROFILES["study"].n_test,
                                        {"reversal": 0.0, "ordering": 0.1})
    assert acc.loc["reversal", "learned"] and acc.loc["reversal", "with margin"]
    assert not acc.loc["ordering", "learned"] and not acc.loc["ordering", "with margin"]
    assert acc.loc["ordering", "lowest"] == 0.6 and acc.loc["ordering", "majority"] == 0.1


def test_the_run_table_shows_precision_wall_time_and_resumes_where_runs_record_them():
    assert "precision" not in trained_tables.study_table(_docs()).columns  # older files
    docs = _docs()
    docs["reversal"]["runs"][0].update(dtype_policy="autocast-bfloat16", wall_seconds=12.5,
                                       resumed_at=[150, 300])
    table = trained_tables.study_table(docs).set_index(["task", "seed"])
    assert list(table.columns[-3:]) == ["precision", "wall_s", "resumed_at"]
    assert table.loc[("reversal", 0), "precision"] == "autocast-bfloat16"
    assert table.loc[("reversal", 0), "wall_s"] == 12.5
    assert table.loc[("reversal", 0), "resumed_at"] == [150, 300]
    assert pd.isna(table.loc[("ordering", 1), "precision"])  # a run without the field


def test_study_scores_read_the_learned_phase():
    before, after, phase = trained_tables.study_scores(_docs(), ["reversal"])
    assert before["reversal"].shape == after["reversal"].shape == (2, 3)
    # learned for good from step 200: the mean of the last three points
    np.testing.assert_allclose(phase["reversal"][:, 1], [np.mean([0.9, 0.92, 0.94]),
                                                         np.mean([0.88, 0.9, 0.92])])
    np.testing.assert_allclose(after["reversal"][:, 1], [0.94, 0.92])
    table = trained_tables.score_table(before, after, phase, [0, 1, 2])
    assert list(table.columns) == [("reversal", "before"), ("reversal", "after"),
                                   ("reversal", "learned phase")]
    with pytest.raises(ValueError, match="no learned phase"):
        trained_tables.study_scores(_docs(), ["ordering"])


def test_reproduction_is_a_prediction_interval_for_one_more_seed():
    runs = [_record(s, 0.99, [0.1, 0.95, 0.97, 0.99], [0.9] * 3 + [0.9 + 0.01 * s])
            for s in range(5)]
    mean = np.mean([0.9 + 0.01 * s for s in range(5)])
    inside = trained_tables.reproduction({"curve": {"scores": [[0.602, mean, 0.798]]}}, runs)
    assert inside.inside.all() and len(inside) == 3
    far = trained_tables.reproduction({"curve": {"scores": [[0.602, mean + 0.2, 0.798]]}}, runs)
    assert far.inside.tolist() == [True, False, True]
    # the interval is wider than the seeds' own range: a sixth seed is not a mean
    row = inside.iloc[1]
    assert row.lo < 0.9 and row.hi > 0.94
    # the sentence names the budgets and every layer outside, with its value and interval
    live = {"accuracy": 1.0, "steps": 1_350}
    text = trained_prose.reproduction_summary("reversal", 0, live, far, runs)
    assert "exact match 1.0000 after 1,350 steps" in text and "400 to 400" in text
    hi = far.iloc[1].hi
    assert f"**outside** the study's interval for one more seed at layer 1 score " \
           f"({mean + 0.2:.3f}, interval [{far.iloc[1].lo:.3f}, {hi:.3f}])." in text
    assert "layer 0" not in text and "layer 2" not in text
    assert trained_prose.reproduction_summary("reversal", 0, live, inside, runs).endswith(
        "every layer inside the study's interval for one more seed.")
    # a study still training may hold one run of the task: no interval, and it says why
    with pytest.raises(ValueError, match="holds 1 run"):
        trained_tables.reproduction({"curve": {"scores": [[0.602, mean, 0.798]]}}, runs[:1])


def test_the_committed_study_loads_and_names_what_is_missing():
    docs, missing = trained_files.load_study("study", ["addition", "reversal", "indexing", "ordering"])
    assert set(docs) | set(missing) == {"addition", "reversal", "indexing", "ordering"}
    for task, doc in docs.items():
        assert {r["task"] for r in doc["runs"]} == {task}
        # the command as the file recorded it (files trained before the wings name the module
        # without its wing); files of this age record no run's origin, and say so
        command = doc["provenance"]["command"]
        assert command.startswith("python -m nopelib.")
        where = trained_prose.study_provenance(doc)
        assert f"by `{command}`" in where
        assert "do not record each run's origin" in where


def test_each_runs_origin_is_named_by_the_invocation_that_trained_it():
    prov = dict(command="python -m nopelib.studies.trained_study --seeds 1 3", commit="c" * 40,
                machine="vm", torch="2", wall_seconds=60.0, date="2026-12-04T10:00:00+00:00",
                runs_from_cache=1, cpu_capability="AVX2")
    by_a = dict(how="trained", finished="2026-12-03T01:00:00+00:00", command="A",
                commit="a" * 40, machine="m1", cpu_capability="AVX512")
    runs = [{**_record(0, 0.99, [0.9] * 4, [0.9] * 4), "origin": by_a},
            {**_record(1, 0.99, [0.9] * 4, [0.9] * 4),
             "origin": dict(how="run cache", finished="2026-12-04T09:00:00+00:00")},
            {**_record(2, 0.99, [0.9] * 4, [0.9] * 4),
             "origin": {**by_a, "finished": "2026-12-03T05:00:00+00:00"}}]
    where = trained_prose.study_provenance({"provenance": prov, "runs": runs})
    assert where.startswith("the file written (not its runs trained, unless said below) by "
                            "`python -m nopelib.studies.trained_study --seeds 1 3`")
    assert ("seeds 0, 2 trained by `A` at commit `aaaaaaaaaaaa` on m1 (CPU kernels AVX512), "
            "finished 2026-12-03T01:00:00+00:00 to 2026-12-03T05:00:00+00:00") in where
    assert "seed 1 read from the run cache, trained at a commit it does not record" in where
    assert "finished 2026-12-04T09" in where


def test_a_study_file_of_an_earlier_profile_is_stale_not_read(monkeypatch):
    """A committed file trained under another version of the profile is never served as
    today's study: load_study leaves it out, stale_tasks names it."""
    today = json.loads(json.dumps(PROFILES["study"].record()))  # as a committed file has it
    doc = {"provenance": {"training": today}}
    old = {"provenance": {"training": {**today, "tail_share": 0.5}}}
    files = {"reversal": doc, "ordering": old}
    monkeypatch.setattr(trained_files, "_committed",
                        lambda profile, tasks: {t: files[t] for t in tasks if t in files})
    docs, missing = trained_files.load_study("study", ["reversal", "ordering", "indexing"])
    assert list(docs) == ["reversal"] and missing == ["ordering", "indexing"]
    assert trained_files.stale_tasks("study", ["reversal", "ordering", "indexing"]) == ["ordering"]
    assert trained_files.is_current(doc, "study") and not trained_files.is_current(old, "study")


def test_a_study_in_flight_counts_its_seeds_per_task_but_not_a_stale_files(monkeypatch):
    """seeds_in counts the distinct seeds of today's files (a stale file holds none of
    today's); progress names the tasks with the same count together, in the tasks' order."""
    today = json.loads(json.dumps(PROFILES["paper_study"].record()))
    runs = [{"seed": s} for s in (0, 1, 3)]
    files = {"reversal": {"provenance": {"training": today},
                          "runs": [{"seed": s} for s in range(5)]},
             "addition": {"provenance": {"training": today}, "runs": runs},
             "ordering": {"provenance": {"training": {**today, "tail_share": 0.5}},
                          "runs": runs}}
    monkeypatch.setattr(trained_files, "_committed",
                        lambda profile, tasks: {t: files[t] for t in tasks if t in files})
    tasks = ["reversal", "addition", "ordering", "indexing"]
    assert trained_files.seeds_in(trained_files.load_study("paper_study", tasks)[0], tasks) == {
        "reversal": 5, "addition": 3, "ordering": 0, "indexing": 0}
    assert trained_files.progress("paper_study", tasks) == (
        "reversal 5 of 5 seeds; addition 3 of 5; ordering, indexing 0 of 5")


def test_starting_points_name_the_tasks_that_start_below_the_keeps_bound():
    low, high = claims.KEEPS_AT - 0.05, claims.KEEPS_AT + 0.05
    before = {"addition": np.array([[0.5, low - 0.02], [0.5, low + 0.02]]),
              "reversal": np.array([[0.5, high], [0.5, high]])}
    text = trained_prose.starting_points(before)
    assert f"addition {low:.3f} (lowest seed {low - 0.02:.3f})" in text
    assert "On addition the initialisation itself is below" in text
    assert "reversal" not in text.split("On ")[1]
    assert "Every task starts" in trained_prose.starting_points({"reversal": before["reversal"]})


def test_chapter_params_name_the_parameters_cell():
    """The rules and the trained chapter's parameters cell name the same parameters."""
    from nopelib.book import trained

    cells = json.loads((BOOK / "trained.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if "parameters" in c.get("metadata", {}).get("tags", []))
    names = [t.id for node in ast.parse(source).body for t in node.targets]
    assert names == list(trained.CHAPTER_PARAMS)


def test_initial_pattern_rows():
    small = GPTConfig(n_layer=2, n_head=2, n_embd=32, init_std=0.002)
    table = theory_studies.initial_pattern({"tiny": TINY, "tiny, sigma 0.002": small},
                                           ["reversal"], [0, 1])
    assert list(table.index) == ["tiny", "tiny, sigma 0.002"]
    assert list(table.columns) == ["layers", "width", "sigma_e", "rho", "predicted",
                                   "measured"]
    assert (table.rho > 0).all() and table.rho.iloc[1] < table.rho.iloc[0]
    assert ((table.predicted > 0.5) & (table.predicted <= 1)).all()
    texts = sample_inputs("reversal", theory_studies.INIT_INPUTS, seed=theory_studies.INIT_SEED)
    measured = np.mean([layer_scores(random_model(TINY, seed=s), texts)[:, 1].mean()
                        for s in (0, 1)])
    assert table.loc["tiny", "measured"] == pytest.approx(measured)


def test_leaves_plateau():
    run = dict(task="reversal", curve=dict(step=[0, 10, 20, 30],
                                           accuracy=[0.2, 0.25, 0.31, 0.5]))
    assert recipe.leaves_plateau(run, {"reversal": 0.2}) == 20  # first point above 0.3
    assert recipe.leaves_plateau(run, {"reversal": 0.45}) is None
    assert recipe.leaves_plateau(run, {}) == 0  # no baseline: 0, plus the margin
    assert recipe.leaves_plateau(run, {"reversal": 0.2}, margin=0.2) == 30


def test_committed_recipe_studies():
    studies = results.load_all("recipe")
    if not studies:
        pytest.skip("no committed recipe study")
    baselines = {"addition": 0.0, "reversal": 0.0, "indexing": 0.1, "ordering": 0.1}
    table = recipe.recipe_table(studies, baselines)
    assert len(table) == sum(len(r["runs"]) for r in studies.values())
    assert "curve" not in table and table.columns[-1] == "leaves_plateau_at"
    for name, doc in studies.items():
        lines = recipe.recipe_budgets(doc, PROFILES["cpu"])
        assert len(lines) == len({r["task"] for r in doc["runs"]})
        assert all("today's cpu profile" in line and "x today's budget" in line
                   for line in lines)
    summary = recipe.recipe_summary(table, baselines).splitlines()
    assert len(summary) == len(table.groupby(["task", "seed"]))
    assert all(line.startswith("- **") and "NoPE" in line for line in summary)


def _scores(rng: np.random.Generator, n_seeds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    before = 0.9 + 0.01 * rng.normal(size=(n_seeds, 5))
    after = np.array([0.7, 0.95, 0.9, 0.85, 0.8]) + 0.01 * rng.normal(size=(n_seeds, 5))
    return before, after


def test_verdict_summary():
    before, after = _scores(np.random.default_rng(0))
    verdicts = claims.claim_table(claims.trained_claims(
        {"reversal": before}, {"reversal": after}, {"reversal": after},
        ["reversal"])).assign(paper="holds")
    lines = trained_prose.verdict_summary(verdicts).splitlines()
    assert len(lines) == len(verdicts) + 2  # one per reading, a blank line, the count
    n_against = (verdicts.verdict == "fails").sum()
    assert lines[-1].startswith(f"Against the paper: {n_against} of {len(verdicts)} readings "
                                "(on reversal)")
    exploratory = trained_prose.verdict_summary(
        verdicts.assign(standing="exploratory: none judged"))
    assert "(exploratory)" in exploratory.splitlines()[0]
    assert exploratory.splitlines()[-1].startswith("Exploratory, not a verdict")


def test_grid_caption():
    provenance = dict(command="python -m nopelib.studies.grid tiny", commit="0123456789abcdef",
                      machine="m", torch="2.13.0", backend="local", wall_seconds=90.0,
                      date="2026-01-01")
    caption = grid.grid_caption("tiny", provenance, 8)
    assert caption.startswith("Grid `tiny` (committed): 8 runs")
    assert "`0123456789ab`" in caption and "1.5 min wall" in caption
    assert set(grid.GRID_COMMANDS) == {"paper-base", "paper"}




def test_kernel_check_caption_and_table():
    runs = [dict(set=name, capability=cap, task="reversal", seed=0, accuracy=1.0,
                 steps=steps, train_seconds=steps / 7, learned=True, inside=inside,
                 outside=out, scores_after=[0.5, 0.75, 0.9])
            for name, cap, steps, inside, out in [
                ("native", "AVX512", 3000, True, []),
                ("avx2", "AVX2", 13500, False, ["layer 4 score"])]]
    doc = {"provenance": {"command": "python -m nopelib.studies.kernels --out /tmp/k",
                          "commit": "a" * 40, "machine": "vm", "date": "today",
                          "sets": {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"}}},
           "runs": runs}
    caption, table = kernels.kernel_check(doc)
    assert "native: native; avx2: ATEN_CPU_CAPABILITY=avx2" in caption
    assert "Whether each live run learned: the same under every set" in caption
    assert "inside the study's interval: **differs between the sets**." in caption
    assert table.outside.tolist() == ["none", "layer 4 score"]
    assert table.steps.tolist() == [3000, 13500]
    assert table.scores_after.tolist() == ["0.500 0.750 0.900"] * 2
    runs[1]["inside"] = True
    assert "interval: the same under every set." in kernels.kernel_check(doc)[0]


def test_rules_comparison_shows_both_rule_sets_and_why_a_verdict_moved():
    # 5 seeds whose last layer sits 0.05 +- 0.04 below its initialisation: one-sided at
    # 0.95 this holds, two-sided Bonferroni (0.05 / 2m per side) it cannot tell
    runs = []
    for seed, drop in enumerate([0.0, 0.02, 0.05, 0.08, 0.10]):
        run = _record(seed, 0.99, [0.1, 0.95, 0.97, 0.99], [0.95] * 4)
        run["trajectory"]["scores"] = [[0.6, 0.95, 0.9 - drop]] * 4
        run["scores_after"] = run["trajectory"]["scores"][-1]
        runs.append(run)
    docs = {"reversal": {"runs": runs}}
    acc = trained_tables.study_accuracy(trained_tables.study_table(docs), PROFILES["study"].n_test)
    both = trained_tables.rules_comparison(docs, acc)
    # a 2-layer model: every reading but "falls gradually", which needs 3 layers
    assert len(both) == len(claims.TRAINED_CLAIMS) - 1
    row = both.set_index("reading").loc[claims.TRAINED_CLAIMS[4][1]]
    assert row["verdict registered"] == "cannot tell" and row["verdict revised"] == "holds"
    assert "one-sided" in row["why it moved"]
    same = both[both["verdict registered"] == both["verdict revised"]]
    assert (same["why it moved"] == "").all() and len(same) < len(both)


def test_a_trajectory_names_and_colours_each_seed_even_when_it_is_alone():
    from nopelib.book import viz

    one = viz.trajectory([_record(1, 0.99, [0.9] * 4, [0.9] * 4)])
    top = [t for t in one.data if t.showlegend is not False]
    assert [t.name for t in top] == ["seed 1"] and top[0].showlegend  # shown, though alone
    three = viz.trajectory([_record(s, 0.99, [0.9] * 4, [0.9] * 4)
                            for s in (0, 1, 2)])
    colour = {t.name: t.line.color for t in three.data}
    assert colour["seed 1"] == top[0].line.color  # a seed's colour stays as others join
    assert len(set(colour.values())) == 3


def test_a_study_in_flight_is_not_judged_until_every_seed_is_in():
    docs = _docs()
    table = trained_tables.study_table(docs)
    acc = trained_tables.study_accuracy(table, PROFILES["study"].n_test, n_seeds=5)
    assert acc.loc["reversal", "seeds"] == 2 and not acc.loc["reversal", "complete"]
    # "learned" speaks of every seed: undecided while some are out
    assert acc.loc[["reversal"], ["learned", "with margin"]].isna().all(axis=None)
    learned, judged = trained_tables.learned_and_judged(acc)
    assert learned == judged == []  # learned by 2 of 5 seeds: neither learned nor judged
    acc2 = trained_tables.study_accuracy(table, PROFILES["study"].n_test, n_seeds=2)
    assert trained_tables.learned_and_judged(acc2)[1] == ["reversal"]
    assert acc2.loc["reversal", "learned"] and acc2.loc["reversal", "with margin"]


def test_a_task_is_judged_once_three_of_its_seeds_are_in_and_on_every_seed_in():
    good = [0.1, 0.95, 0.97, 0.99]
    runs = [_record(s, 0.99, good, [0.8, 0.9, 0.92, 0.94]) for s in range(3)]
    acc = trained_tables.study_accuracy(trained_tables.study_table({"reversal": {"runs": runs}}),
                                        PROFILES["study"].n_test, n_seeds=5)
    assert claims.JUDGED_AT_SEEDS == 3 and trained_tables.judged_at(5) == 3
    assert trained_tables.learned_and_judged(acc)[1] == ["reversal"]
    assert trained_tables.task_standing(acc, ["reversal"], 5) == {"reversal": "judged"}
    # a third seed that did not learn: every seed in counts, so the task is not learned
    runs[2] = _record(2, 0.5, [0.0, 0.1, 0.3, 0.5], [0.8] * 4)
    acc = trained_tables.study_accuracy(trained_tables.study_table({"reversal": {"runs": runs}}),
                                        PROFILES["study"].n_test, n_seeds=5)
    assert trained_tables.learned_and_judged(acc) == ([], [])
    assert trained_tables.task_standing(acc, ["reversal"], 5) == {"reversal": "not learned"}
    assert trained_tables.judged_at(2) == 2  # a profile of fewer seeds: all of them


def test_task_standing_says_why_a_task_is_or_is_not_judged():
    acc = pd.DataFrame({"seeds": [5, 5, 5, 2], "learned": [True, True, False, True],
                        "with margin": [True, False, False, True],
                        "complete": [True, True, True, False]},
                       index=["reversal", "ordering", "indexing", "addition"])
    tasks = ["reversal", "ordering", "indexing", "addition", "copy"]
    assert trained_tables.task_standing(acc, tasks, 5, stale=["copy"]) == {
        "reversal": "judged", "ordering": "not learned with margin",
        "indexing": "not learned", "addition": "still training: 2 of 5 seeds in",
        "copy": "stale: trained under an earlier profile"}
    assert trained_tables.task_standing(None, ["reversal"], 5) == {
        "reversal": "still training: 0 of 5 seeds in"}


def test_model_dependence_says_whether_a_verdict_differs_between_the_models():
    keys = [(c, r) for c, r in claims.TRAINED_CLAIMS]
    small = pd.DataFrame([dict(claim=c, reading=r, task="reversal", verdict="fails")
                          for c, r in keys])
    big = small.assign(verdict=["fails", "holds", "cannot tell", "fails", "fails", "holds"])
    small.loc[3, "verdict"] = big.loc[3, "verdict"] = "cannot tell"
    out = trained_prose.model_dependence({"4 x 96": small, "6 x 384": big},
                                         ["reversal", "addition"])
    assert len(out) == 2 * len(keys)
    rev = out[out.task == "reversal"].set_index("reading")[trained_prose.DIFFERS]
    assert rev.iloc[0] == "no: fails on both models"
    assert rev.iloc[1] == "yes: fails at 4 x 96, holds at 6 x 384"
    # a "cannot tell" is missing evidence: it neither differs from nor agrees with a verdict
    assert rev.iloc[2] == "not shown: fails at 4 x 96, cannot tell at 6 x 384"
    assert rev.iloc[3] == "not shown: cannot tell at 4 x 96, cannot tell at 6 x 384"
    three = trained_prose.model_dependence({"a": small, "b": small, "c": small}, ["reversal"])
    assert three[trained_prose.DIFFERS].iloc[0] == "no: fails on all 3 models"
    add = out[out.task == "addition"][trained_prose.DIFFERS]
    assert (add == "cannot say: 4 x 96, 6 x 384 have no verdict on addition").all()
    untrained = trained_prose.model_dependence({"4 x 96": small, "6 x 384": None}, ["reversal"])
    assert (untrained["6 x 384"] == "not judged").all()
    # the reason a model has no verdict stands in its column: "yet" only while it trains
    standing = {"6 x 384": {"reversal": "still training: 1 of 5 seeds in"},
                "4 x 96": {"reversal": "judged"}}
    waiting = trained_prose.model_dependence({"4 x 96": small, "6 x 384": None}, ["reversal"],
                                             standing)
    assert (waiting["6 x 384"] == "still training: 1 of 5 seeds in").all()
    assert (waiting[trained_prose.DIFFERS] == "cannot say yet: 6 x 384 has no verdict on "
            "reversal").all()
    standing["6 x 384"]["reversal"] = "not learned with margin"
    late = trained_prose.model_dependence({"4 x 96": small, "6 x 384": None}, ["reversal"],
                                          standing)
    assert (late[trained_prose.DIFFERS] == "cannot say: 6 x 384 has no verdict on reversal").all()
    # an exploratory table (no task learned with margin) is no verdict to compare
    guess = small.assign(standing="exploratory: no task meets the margin rule")
    mixed = trained_prose.model_dependence({"4 x 96": guess, "6 x 384": big}, ["reversal"])
    assert (mixed["4 x 96"] == "not judged").all()
    with pytest.raises(ValueError, match="two models"):
        trained_prose.model_dependence({"4 x 96": small}, ["reversal"])


def test_two_profiles_differences_are_named_beyond_size():
    study, paper = PROFILES["study"], PROFILES["paper_study"]
    words = trained_prose.profile_differences(study, paper, ["reversal"])
    assert "width 96 vs 384" in words and "layers 4 vs 6" in words
    assert "token-embedding σ 0.002 vs 0.02" in words
    assert "trajectory inputs 128 vs 64" in words
    assert trained_prose.profile_differences(study, study, ["reversal"]) == []
