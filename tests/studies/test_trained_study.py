"""The trained-model study: its records, its command's checks, and a tiny study end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import nopelib.studies.trained_study as ts
from nopelib.studies.probe_study import PROBE_SEEDS
from nopelib.core.devices import dtype_policy
from nopelib.rules import claims
from nopelib.results import (files as results, trained_files, trained_prose,
                             trained_tables)
from nopelib.results.manifest import MANIFEST_NAME
from nopelib.core.tasks import TASKS
from nopelib.training import profiles, task_precision, train_profile
from nopelib.training.runs import run_key
from conftest import TINY_STUDY




@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))


def test_a_tiny_study_writes_a_valid_file_whose_trajectory_the_claims_read(tmp_path,
                                                                          monkeypatch):
    # a file's profile is a known one
    monkeypatch.setitem(profiles.PROFILES, TINY_STUDY.name, TINY_STUDY)
    by_task, from_cache = ts.run_study(TINY_STUDY, ["ordering"], [0, 1], device="cpu",
                                       workers=1, probe_fit_tokens=100)
    assert from_cache == {"ordering": 0} and [r["seed"] for r in by_task["ordering"]] == [0, 1]
    for run in by_task["ordering"]:
        t = run["trajectory"]
        assert t["step"][-1] == run["steps"] and len(t["scores"]) == len(t["step"])
        assert run["scores_after"] == t["scores"][-1]
        assert len(run["scores_init"]) == TINY_STUDY.model.n_layer + 1
        probes = run["probes"]
        assert {r["layer"] for r in probes["rows"]} == set(range(TINY_STUDY.model.n_layer + 1))
        assert {r["seed"] for r in probes["rows"]} == set(PROBE_SEEDS)
        assert {r["layer"] for r in probes["shuffled"]} == {1}
    doc = {"provenance": results.provenance("test", [], 0.0, profile=TINY_STUDY.name,
                                            training=TINY_STUDY.record(),
                                            runs_from_cache=from_cache["ordering"]),
           "runs": by_task["ordering"]}
    path = tmp_path / "trained_tiny-study_ordering.json"
    results.write(path, doc, "trained")
    assert results.load(path)["runs"] == json.loads(json.dumps(by_task["ordering"]))
    # a second study loads every run from the cache
    again, from_cache = ts.run_study(TINY_STUDY, ["ordering"], [0, 1], device="cpu", workers=1,
                                     probe_fit_tokens=100)
    assert from_cache == {"ordering": 2}
    for first, cached in zip(by_task["ordering"], again["ordering"]):
        assert {**cached, "origin": None} == {**first, "origin": None}
        assert first["origin"]["how"] == "trained" and cached["origin"] == {
            "how": "run cache", "finished": first["origin"]["finished"]}


def test_the_declared_bf16_tasks_are_those_the_committed_checks_cleared():
    # each task's precision is declared in the code (task_precision.BF16_TASKS), not read from
    # the committed files when a run trains: this is where the two are held together
    asks_bf16 = [name for name, p in profiles.PROFILES.items() if p.precision == "bfloat16"]
    assert asks_bf16 and set(task_precision.BF16_TASKS) == set(asks_bf16)
    for name in asks_bf16:
        assert task_precision.BF16_TASKS[name] == trained_files.bf16_cleared(name), name


def test_bf16_trains_only_the_tasks_every_committed_check_found_unchanged():
    # the rule's "changes" keeps float32: a task trains in bf16 only where a check ran it and
    # found every quantity unchanged (on the paper's model, addition's layer scores moved)
    cleared = trained_files.bf16_cleared("paper_study")
    rows = [row for doc in results.load_all("precision").values() for row in doc["gaps"]]
    ran = {row["task"] for row in rows}
    changed = {row["task"] for row in rows if row["verdict"] != "no change"}
    assert cleared == ran - changed and ran
    prof = profiles.PROFILES["paper_study"]
    for task in TASKS:
        for p in (prof, prof.batched()):
            assert task_precision.task_profile(p, task).precision == (
                "bfloat16" if task in cleared else "float32")
            assert replace(task_precision.task_profile(p, task), precision=p.precision) == p
    # a float32 profile as it is
    assert task_precision.task_profile(TINY_STUDY, "addition") is TINY_STUDY


def test_a_study_trains_a_task_no_check_cleared_in_float32(tmp_path, monkeypatch):
    asks_bf16 = replace(TINY_STUDY, name="tiny-bf16", precision="bfloat16")
    monkeypatch.setitem(profiles.PROFILES, asks_bf16.name, asks_bf16)
    assert trained_files.bf16_cleared(asks_bf16.name) == frozenset()
    assert asks_bf16.name not in task_precision.BF16_TASKS
    by_task, _ = ts.run_study(asks_bf16, ["ordering"], [0], device="cpu", workers=1,
                              probe_fit_tokens=100)
    run = by_task["ordering"][0]
    assert run["dtype_policy"] == "float32"
    assert run["key"] == run_key("ordering", 0, replace(asks_bf16, precision="float32"))
    assert run["key"] != run_key("ordering", 0, asks_bf16)
    cached = ts.cached_runs(asks_bf16, ["ordering"], [0], device="cpu")
    assert cached["ordering", 0].metrics["key"] == run["key"]
    # on a GPU too: the task's profile trains it in float32 there (CUDA follows the profile)
    assert dtype_policy("cuda", task_precision.task_profile(asks_bf16, "ordering").precision) == (
        "float32")


def test_an_edited_trajectory_is_refused(tmp_path):
    by_task, _ = ts.run_study(TINY_STUDY, ["reversal"], [0], device="cpu", workers=1,
                              probe_fit_tokens=100)
    run = by_task["reversal"][0]
    bad = {**run, "trajectory": {**run["trajectory"],
                                 "scores": run["trajectory"]["scores"][:-1]}}
    doc = {"provenance": results.provenance("test", [], 0.0, profile=TINY_STUDY.name,
                                            training=TINY_STUDY.record()), "runs": [bad]}
    with pytest.raises(results.ResultsError, match="trajectory"):
        results.validate(doc, "trained", "edited")


def test_a_profile_without_a_trajectory_is_refused_before_training():
    with pytest.raises(ValueError, match="n_trajectory=0"):
        ts.run_study(replace(TINY_STUDY, n_trajectory=0), ["reversal"], [0], device="cpu")
    with pytest.raises(ValueError, match="seed=-1"):
        ts.run_study(TINY_STUDY, ["reversal"], [-1], device="cpu")


@pytest.mark.parametrize("argv, match", [
    (["--tasks", "division"], "division"),
    (["--tasks", "reversal", "--seeds", "1", "1"], "--seeds"),
    (["--tasks", "reversal", "--workers", "0"], "--workers"),
    (["--tasks", "reversal", "--out-dir", "/no/such/folder"], "--out-dir"),
])
def test_bad_arguments_exit_before_any_training(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_:
        ts.main(argv)
    assert exit_.value.code == 2 and match in capsys.readouterr().err


def test_the_committed_studies_are_valid_and_judged_by_the_fixed_rules():
    """Every committed study file: each run's recorded plateau is the one the fixed rule
    recomputes from its own curve, its learned phase has a score per layer, and a profile's
    judged tasks get one verdict per reading of the trained claims."""
    docs = results.load_all("trained")
    assert docs, "no committed trained study"
    by_profile: dict[str, tuple] = {}
    for name, doc in docs.items():
        prof = train_profile.TrainProfile.from_record(doc["provenance"]["training"])
        by_profile.setdefault(prof.name, (prof, {}))[1][doc["runs"][0]["task"]] = doc
        for run in doc["runs"]:
            t = run["trajectory"]
            plateau = claims.past_plateau(t["step"], t["accuracy"], run["steps"])
            assert plateau["learned_from"] == run["learned_from"], (name, run["seed"])
            assert plateau["tail"] == pytest.approx(run["tail"], abs=1e-12), (name, run["seed"])
            if run["learned_from"] is not None:
                phase = claims.learned_phase(t["step"], t["accuracy"], t["scores"],
                                             run["steps"])
                assert phase.shape == (prof.model.n_layer + 1,), name
    for profile, (prof, study_docs) in by_profile.items():
        acc = trained_tables.study_accuracy(trained_tables.study_table(study_docs), prof.n_test,
                                            n_seeds=len(prof.seeds))
        judged = trained_tables.learned_and_judged(acc)[1]
        if judged:
            table = trained_tables.trained_verdicts(study_docs, acc)[1]
            assert len(table) == len(claims.TRAINED_CLAIMS) * len(judged), profile
            assert set(table.task) == set(judged)
            assert set(table.verdict) <= set(claims.VERDICTS)


def test_a_study_in_flight_writes_the_seeds_it_has_and_grows_by_seed(tmp_path, monkeypatch):
    monkeypatch.setitem(profiles.PROFILES, TINY_STUDY.name, TINY_STUDY)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--profile", TINY_STUDY.name, "--tasks", "ordering", "--device", "cpu",
            "--out-dir", str(out), "--probe-fit-tokens", "100"]
    # nothing trained yet: --cached-only writes no file
    ts.main([*argv, "--cached-only"])
    assert not list(out.iterdir())
    ts.main([*argv, "--seeds", "1", "--workers", "1"])  # one seed trained
    path = out / f"trained_{TINY_STUDY.name}_ordering.json"
    first = results.load(path)
    assert [r["seed"] for r in first["runs"]] == [1]
    run = first["runs"][0]
    # the run names the invocation that trained it
    assert run["origin"]["how"] == "trained" and "--seeds 1" in run["origin"]["command"]
    assert run["origin"]["commit"] == first["provenance"]["commit"]
    assert first["provenance"]["runs_kept"] == first["provenance"]["runs_from_cache"] == 0
    assert run["resumed_at"] == [] and run["wall_seconds"] >= run["train_seconds"]
    mats = run["matrices"]["layers"]  # [L+1, T, T] of the longest input
    assert len(mats) == TINY_STUDY.model.n_layer + 1
    assert len(mats[0]) == len(run["matrices"]["text"])
    assert mats[1][0][0] == 1.0  # a state's cosine with itself
    # seed 0 trained next: the file grows, seed 1 is kept
    ts.main([*argv, "--seeds", "0", "--workers", "1"])
    grown = results.load(path)
    assert [r["seed"] for r in grown["runs"]] == [0, 1]
    assert grown["runs"][1] == first["runs"][0] and grown["provenance"]["seeds"] == [0, 1]
    assert "--seeds 0" in grown["runs"][0]["origin"]["command"]
    assert grown["provenance"]["runs_kept"] == 1
    where = trained_prose.study_provenance(grown)
    assert where.count("trained by `") == 2 and "seed 1 trained by" in where
    # a cached-only rewrite keeps both committed runs, each with the invocation that trained it
    ts.main([*argv, "--cached-only"])
    again = results.load(path)
    assert again["runs"] == grown["runs"] and again["provenance"]["runs_kept"] == 2
    assert again["provenance"]["runs_from_cache"] == 0
    # a file written from the cache alone says so: it trained none of its runs
    path.unlink()
    ts.main([*argv, "--cached-only"])
    cached = results.load(path)
    assert [r["origin"]["how"] for r in cached["runs"]] == ["run cache"] * 2
    assert cached["provenance"]["runs_from_cache"] == 2
    assert [r["origin"]["finished"] for r in cached["runs"]] == [
        r["origin"]["finished"] for r in grown["runs"]]  # when each run finished training
    where = trained_prose.study_provenance(cached)
    assert "trained by" not in where and "seeds 0, 1 read from the run cache" in where


def test_a_runs_origin_and_the_files_counts_are_checked(tmp_path, monkeypatch):
    monkeypatch.setitem(profiles.PROFILES, TINY_STUDY.name, TINY_STUDY)
    by_task, _ = ts.run_study(TINY_STUDY, ["reversal"], [0], device="cpu", workers=1,
                              probe_fit_tokens=100)
    prov = results.provenance("test", [], 0.0, profile=TINY_STUDY.name,
                              training=TINY_STUDY.record(), runs_from_cache=0, runs_kept=0,
                              cpu_capability="AVX2")
    good = ts.stamp(by_task["reversal"], prov, ts.TRAINED_BY)
    assert good[0]["origin"]["command"] == "test "  # as the study command's main() names it
    assert good[0]["origin"]["cpu_capability"]  # where it trained, named by run_study
    results.validate({"provenance": prov, "runs": good}, "trained", "stamped")
    unnamed = [{**good[0], "origin": {**good[0]["origin"]}}]
    del unnamed[0]["origin"]["commit"]  # trained, but at which commit?
    with pytest.raises(results.ResultsError, match="origin.commit"):
        results.validate({"provenance": prov, "runs": unnamed}, "trained", "unnamed")
    odd = [{**good[0], "origin": {**good[0]["origin"], "how": "guessed"}}]
    with pytest.raises(results.ResultsError, match="origin.how"):
        results.validate({"provenance": prov, "runs": odd}, "trained", "odd")
    with pytest.raises(results.ResultsError, match="runs_kept"):
        results.validate({"provenance": {**prov, "runs_kept": 1, "runs_from_cache": 1},
                          "runs": good}, "trained", "overcounted")


def test_the_batched_study_command_writes_the_profiles_batched_twin(tmp_path, monkeypatch):
    # the GPU command's tiny version on the CPU: every seed of a task as one batched model,
    # each on its own budget, written as the profile's '+batched' twin beside the plain study
    monkeypatch.setitem(profiles.PROFILES, TINY_STUDY.name, TINY_STUDY)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--profile", TINY_STUDY.name, "--tasks", "ordering", "--device", "cpu",
            "--out-dir", str(out), "--probe-fit-tokens", "100", "--backend", "batched"]
    ts.main(argv)
    path = out / f"trained_{TINY_STUDY.name}+batched_ordering.json"
    doc = results.load(path)
    # the file and its folder's manifest of digests (result_manifest), nothing else
    assert sorted(p.name for p in out.iterdir()) == sorted([path.name, MANIFEST_NAME])
    assert doc["provenance"]["profile"] == TINY_STUDY.batched().name
    assert doc["provenance"]["runs_from_cache"] == 0
    assert [r["seed"] for r in doc["runs"]] == [0, 1]
    for run in doc["runs"]:
        assert run["profile"] == TINY_STUDY.batched().name
        assert run["trajectory"]["step"][-1] == run["steps"]
    path.unlink()
    ts.main([*argv, "--cached-only"])  # the runs are in the cache under the twin's keys
    again = results.load(path)
    assert again["provenance"]["runs_from_cache"] == 2
    assert [{**r, "origin": None} for r in again["runs"]] == [
        {**r, "origin": None} for r in doc["runs"]]
