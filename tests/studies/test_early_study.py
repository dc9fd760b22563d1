"""The early-dynamics study's command (nopelib.studies.early_study) on a tiny model: every run's
curve carries block 1's measurements, the file validates, the cache resumes, and the
claims' rule reads it."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from nopelib.core.cost import ALLOW_SLOW_ENV
from nopelib.core.model import GPTConfig
from nopelib.book import early_dynamics
from nopelib.rules import beyond_claims
from nopelib.store import cache
from nopelib.results import files as results, schema
from nopelib.book import early_tables
from nopelib.studies import early_study
from nopelib.training import profiles

TINY = replace(profiles.PROFILES["study"], model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
               warmup_steps=5, n_train=96, n_test=200, n_eval=200, n_curve=200, n_val=40,
               log_every=5)


@pytest.fixture
def tiny_study(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setitem(profiles.PROFILES, "study", TINY)
    monkeypatch.setitem(early_study.WINDOWS, "study", (20, 10))
    monkeypatch.setitem(early_study.RUN_SECONDS, "study", 5.0)  # a tiny run's cost
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    return tmp_path / "early_tiny.json"


def test_the_study_writes_every_run_with_its_measurements_and_resumes_from_the_cache(
        tiny_study, capsys):
    argv = ["--tasks", "addition", "--seeds", "0", "1", "2", "--ablations", "none", "qk",
            "--out", str(tiny_study)]
    early_study.main(argv)
    doc = results.load(tiny_study)
    runs = doc["runs"]
    assert [(r["frozen"], r["seed"]) for r in runs] == [
        ([], 0), ([], 1), ([], 2), (["qk"], 0), (["qk"], 1), (["qk"], 2)]
    for run in runs:
        assert run["curve"]["step"] == [10, 20]
        assert set(schema.EARLY_CURVE) <= set(run["curve"])
        assert len(run["scores_init"]) == TINY.model.n_layer + 1
    assert doc["provenance"]["window"] == 20 and doc["provenance"]["every"] == 10
    # the rule fixed before the study reads the file's layer-1 scores
    lows = {tuple(r["frozen"]): {} for r in runs}
    for r in runs:
        layer1 = [row[1] for row in r["curve"]["scores"]]
        lows[tuple(r["frozen"])][r["seed"]] = beyond_claims.window_min(r["curve"]["step"], layer1)
    assert beyond_claims.collapse_cause(lows[()], lows[("qk",)]) in beyond_claims.CAUSE_VERDICTS
    first = tiny_study.read_text()
    early_study.main(argv)  # every run now comes from the results cache
    again = json.loads(tiny_study.read_text())
    assert again["runs"] == json.loads(first)["runs"]


def test_a_study_grows_by_the_runs_it_adds_and_keeps_the_committed_ones(tiny_study,
                                                                         tmp_path, monkeypatch):
    first = ["--tasks", "addition", "--seeds", "0", "--ablations", "none", "qk",
             "--out", str(tiny_study)]
    early_study.main(first)
    before = results.load(tiny_study)
    # another machine: an empty cache; only the ablation asked for is trained
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "other cache"))
    early_study.main(["--tasks", "addition", "--seeds", "0", "--ablations", "embedding",
                      "--out", str(tiny_study)])
    after = results.load(tiny_study)
    assert [r["frozen"] for r in after["runs"]] == [[], ["embedding"], ["qk"]]
    assert [after["runs"][0], after["runs"][2]] == before["runs"]  # kept, not retrained
    prov = after["provenance"]
    assert prov["ablations"] == ["none", "embedding", "qk"] and prov["seeds"] == [0]
    assert prov["kept_from"] == [{k: before["provenance"][k]
                                  for k in ("command", "commit", "date")}]
    # asking for a run the file holds trains it again and replaces it
    early_study.main(["--tasks", "addition", "--seeds", "0", "--ablations", "qk",
                      "--out", str(tiny_study)])
    again = results.load(tiny_study)
    assert [r["frozen"] for r in again["runs"]] == [[], ["embedding"], ["qk"]]
    assert len(again["provenance"]["kept_from"]) == 2


def test_a_file_with_a_curve_field_missing_is_refused(tiny_study):
    early_study.main(["--tasks", "reversal", "--seeds", "0", "--ablations", "none",
                      "--out", str(tiny_study)])
    doc = json.loads(tiny_study.read_text())
    del doc["runs"][0]["curve"]["rho"]
    bad = tiny_study.with_name("early_bad.json")
    bad.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError, match=r"early_bad.json: runs\[0\].curve.*rho"):
        results.load(bad)


def test_a_file_from_other_cpu_kernels_is_refused_before_training(tiny_study, capsys,
                                                                   monkeypatch):
    argv = ["--tasks", "reversal", "--seeds", "0", "--ablations", "none",
            "--out", str(tiny_study)]
    early_study.main(argv)
    doc = json.loads(tiny_study.read_text())
    here = torch.backends.cpu.get_cpu_capability()
    assert doc["provenance"]["cpu_capability"] == here
    doc["provenance"]["cpu_capability"] = "other" if here != "other" else "else"
    tiny_study.write_text(json.dumps(doc))
    results.sign(tiny_study)  # as the command that wrote it elsewhere signed it
    trained = []
    monkeypatch.setattr(early_study, "run_study", lambda *a, **k: trained.append(a) or [])
    with pytest.raises(SystemExit) as exit_:
        early_study.main(["--tasks", "addition", "--seeds", "0", "--ablations", "none",
                          "--out", str(tiny_study)])
    assert exit_.value.code == 2
    assert "kernels" in capsys.readouterr().err and not trained


def test_a_task_s_runs_share_one_precision_and_a_file_says_which(tiny_study, capsys,
                                                                  monkeypatch):
    # the profile asks bf16; no committed check cleared a task of it, so its runs train
    # in float32 (task_precision.task_profile) and say so, while the file's record asks bf16
    monkeypatch.setitem(profiles.PROFILES, "study", replace(TINY, precision="bfloat16"))
    argv = ["--tasks", "addition", "--ablations", "none", "--out", str(tiny_study)]
    early_study.main([*argv, "--seeds", "0"])
    doc = json.loads(tiny_study.read_text())
    assert doc["provenance"]["training"]["precision"] == "bfloat16"
    assert [r["dtype_policy"] for r in doc["runs"]] == ["float32"]
    assert early_tables.precisions(doc).to_dict("records") == [
        {"task": "addition", "precision": "float32", "seeds": "0"}]
    # a run from before runs recorded it: under a bf16 record it may have trained either way
    del doc["runs"][0]["dtype_policy"]
    tiny_study.write_text(json.dumps(doc))
    results.sign(tiny_study)  # as the command that wrote it elsewhere signed it
    results.load(tiny_study)  # valid: one task, one (unknown) precision
    assert early_tables.precisions(doc).precision.tolist() == [
        "not recorded (the profile asked bfloat16)"]
    trained = []
    real = early_study.run_study
    monkeypatch.setattr(early_study, "run_study", lambda *a, **k: trained.append(a) or [])
    with pytest.raises(SystemExit) as exit_:  # would set seed 1 beside it
        early_study.main([*argv, "--seeds", "1"])
    assert exit_.value.code == 2 and not trained
    assert "another precision" in capsys.readouterr().err
    # every seed of the task again replaces it; a task it does not touch is kept as it is
    monkeypatch.setattr(early_study, "run_study", real)
    doc["runs"][0]["task"] = "reversal"
    doc["provenance"]["tasks"] = ["reversal"]  # what the file holds (early_study.contents)
    tiny_study.write_text(json.dumps(doc))
    results.sign(tiny_study)  # as the command that wrote it elsewhere signed it
    early_study.main([*argv, "--seeds", "0"])
    after = results.load(tiny_study)
    assert [(r["task"], r.get("dtype_policy")) for r in after["runs"]] == [
        ("addition", "float32"), ("reversal", None)]
    # a file that mixes them within a task, or says bf16 where its profile asks float32
    mixed = json.loads(tiny_study.read_text())
    mixed["runs"][1]["task"], mixed["runs"][1]["seed"] = "addition", 1
    bad = tiny_study.with_name("early_bad.json")
    bad.write_text(json.dumps(mixed))
    with pytest.raises(results.ResultsError, match=r"\['addition'\].*more than one precision"):
        results.load(bad)
    mixed["runs"][1]["dtype_policy"] = "autocast-bfloat16"
    mixed["provenance"]["training"].pop("precision")
    bad.write_text(json.dumps(mixed))
    with pytest.raises(results.ResultsError, match=r"runs\[1\].dtype_policy.*asks float32"):
        results.load(bad)


@pytest.mark.parametrize("argv, match", [
    (["--seeds", "0", "0"], "names one twice"),
    (["--workers", "0"], "--workers"),
    (["--out", "/nonexistent/early_x.json"], "is not a writable folder"),
    (["--out", "/tmp/result.json"], "must be named early_"),
])
def test_bad_arguments_are_usage_errors_before_any_training(tiny_study, capsys, argv, match):
    with pytest.raises(SystemExit) as exit_:
        early_study.main(["--tasks", "addition", *argv])
    assert exit_.value.code == 2
    assert match in capsys.readouterr().err


def test_the_tables_read_every_run_from_its_initialisation_on(tiny_study):
    early_study.main(["--tasks", "addition", "reversal", "--seeds", "0", "1", "2",
                      "--ablations", "none", "embedding", "--out", str(tiny_study)])
    runs = early_tables.frame(results.load(tiny_study))
    assert len(runs) == 2 * 2 * 3 * 3  # tasks x ablations x seeds x (init + 2 points)
    assert set(runs.ablation) == {"none", "embedding"}
    assert (runs[runs.step == 0].lr == 0).all()
    falls = early_tables.falls(runs)
    assert len(falls) == 6 and set(falls.task) == {"addition", "reversal"}
    for _, row in falls.iterrows():  # the first step below the level, or none
        g = runs[(runs.task == row.task) & (runs.seed == row.seed) & (runs.ablation == "none")]
        below = g[g.layer1 < beyond_claims.FALLS_AT].step
        assert (below.min() if len(below) else float("nan")) == pytest.approx(
            row.falls_at, nan_ok=True)
    assert (falls.last_layer1 >= falls.lowest_layer1).all()
    last = runs[runs.ablation == "none"].sort_values("step").groupby(["task", "seed"]).last()
    assert list(falls.set_index(["task", "seed"]).last_value_axis) == list(last.value_axis)
    gaps = early_tables.agreement(runs)
    assert (gaps.gap_without_mlp >= 0).all() and set(gaps.at_step) <= {0, 10, 20}
    table = early_tables.causes(runs)
    assert list(table.ablation) == ["embedding", "embedding"]
    assert set(table.verdict) <= set(beyond_claims.CAUSE_VERDICTS) and (table.seeds == 3).all()
    held = runs[(runs.ablation == "embedding") & (runs.step <= beyond_claims.EARLY_STEPS)]
    for task, row in table.set_index("task").iterrows():  # reported beside the verdict
        assert row.lowest_ablated_without_mlp == held[held.task == task].score_without_mlp.min()
    sentences = early_tables.answers(falls, gaps, table)
    assert set(sentences) == {"addition", "reversal"}
    for task, text in sentences.items():  # each names its verdict, computed by the rule
        verdict = table[table.task == task].verdict.iloc[0]
        assert text.endswith(f": {verdict}.") and "missed the no-MLP score" in text


def test_an_unknown_ablation_in_a_file_is_named():
    with pytest.raises(ValueError, match="is no ablation"):
        early_study.ablation_name(["qk", "embedding", "qk"])


def test_hours_of_runs_are_refused_unless_asked_for_and_cached_runs_cost_nothing(
        tiny_study, capsys, monkeypatch):
    argv = ["--tasks", "addition", "--seeds", "0", "--ablations", "none", "--out",
            str(tiny_study)]
    monkeypatch.setitem(early_study.RUN_SECONDS, "study", 7200.0)  # two hours a run
    with pytest.raises(SystemExit) as exit_:
        early_study.main(argv)
    assert exit_.value.code == 2 and "1 run(s)" in capsys.readouterr().err
    assert not tiny_study.exists()  # refused before any work
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match="about 2"):
        early_study.main(argv)
    monkeypatch.delenv(ALLOW_SLOW_ENV)
    early_study.main(argv)  # the run is in the cache now: nothing to train, nothing gated
    assert results.load(tiny_study)["runs"][0]["task"] == "addition"


def test_a_run_is_cached_under_the_module_s_key_whether_run_as_a_command_or_imported(
        tiny_study):
    import runpy
    import sys

    from nopelib.store import memo

    argv = ["--tasks", "addition", "--seeds", "0", "--ablations", "none", "--out",
            str(tiny_study)]
    saved = sys.argv
    sys.argv = ["early_study", *argv]
    try:  # as ``python -m nopelib.studies.early_study`` does: the module is __main__
        runpy.run_module("nopelib.studies.early_study", run_name="__main__")
    finally:
        sys.argv = saved
    assert memo.is_cached(early_study.early_run, "addition", 0, "study", ())


# --full: each ablated run to the end of its task's budget, checkpointed
TINY_FULL = replace(TINY, steps=30, curve_every=10)


@pytest.fixture
def tiny_full(tiny_study, monkeypatch):
    monkeypatch.setitem(profiles.PROFILES, "study", TINY_FULL)
    monkeypatch.setitem(early_study.FULL_SECONDS, "study", 5.0)
    return tiny_study.with_name("early_full_tiny.json")


def test_a_full_run_trains_to_the_end_of_its_budget_and_is_read_by_the_rule(tiny_full):
    argv = ["--full", "--tasks", "addition", "--ablations", "both", "embedding",
            "--out", str(tiny_full)]
    early_study.main(argv)
    doc = results.load(tiny_full)
    prov = doc["provenance"]
    assert prov["window"] == TINY_FULL.steps and prov["every"] == TINY_FULL.curve_every
    assert prov["seeds"] == [0] and prov["ablations"] == ["embedding", "both"]
    for run in doc["runs"]:
        assert run["steps"] == TINY_FULL.steps  # a tiny model never reaches stop_at
        assert run["curve"]["step"] == [10, 20, 30] and run["resumed_at"] == []
        assert run["n_test"] == TINY_FULL.n_eval and 0 <= run["accuracy"] <= 1
        assert set(schema.EARLY_CURVE) <= set(run["curve"])
        layer1 = [run["scores_init"][1], *(row[1] for row in run["curve"]["scores"])]
        reading = beyond_claims.full_reading(run["accuracy"], run["curve"]["step"],
                                             run["curve"]["accuracy"], layer1, run["steps"])
        assert reading == ("not learned, pattern kept" if min(layer1) >= 0.8
                           else "not learned, pattern lost")
    first = tiny_full.read_text()
    early_study.main(argv)  # from the results cache: the same runs
    assert json.loads(tiny_full.read_text())["runs"] == json.loads(first)["runs"]


def test_a_stopped_full_run_goes_on_from_its_checkpoint_to_the_same_run(tiny_full,
                                                                         monkeypatch):
    import nopelib.training.train as tr
    from nopelib.store import checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as _one_full trains: a reduction's bits depend on threads
    whole = early_study.full_run("reversal", 0, "study", ("qk",))
    monkeypatch.setenv(checkpoint.SECONDS_ENV, "0")  # a checkpoint after every step
    real, calls = tr.train_step, {"n": 0}

    def stop_at_17(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 17:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(tr, "train_step", stop_at_17)
        with pytest.raises(KeyboardInterrupt):
            early_study.full_run("reversal", 0, "study", ("qk",))
    key = early_study.full_key("reversal", 0, "study", ("qk",))
    assert key != early_study.full_key("reversal", 0, "study", ("embedding",))
    # another kernel set does not go on with this run's checkpoint
    with monkeypatch.context() as m:
        m.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "other")
        assert key != early_study.full_key("reversal", 0, "study", ("qk",))
    folder = cache.resolve_cache_dir() / "checkpoints" / key
    assert folder.is_dir()
    again = early_study._one_full(("reversal", 0, "study", ("qk",)))
    assert again["resumed_at"] == [16]
    assert not folder.exists()  # in the results cache: its checkpoints are gone
    timings = {"resumed_at", "train_seconds", "curve_seconds"}
    assert ({k: v for k, v in again.items() if k not in timings}
            == {k: v for k, v in whole.items() if k not in timings})
    torch.set_num_threads(threads)


@pytest.mark.parametrize("argv, match", [
    (["--full", "--ablations", "none"], "trained study's own"),
    (["--full", "--profile", "paper_study"], "allowed: ['study']"),
])
def test_a_full_run_that_is_not_one_is_a_usage_error(tiny_full, capsys, argv, match):
    with pytest.raises(SystemExit) as exit_:
        early_study.main(["--tasks", "addition", *argv, "--out", str(tiny_full)])
    assert exit_.value.code == 2
    assert match in capsys.readouterr().err and not tiny_full.exists()


@pytest.mark.parametrize("full, name", [(True, "early_study.json"),
                                        (False, "early_full_study.json")])
def test_a_full_study_and_a_window_study_never_write_each_other_s_file(
        tiny_full, capsys, full, name):
    out = tiny_full.with_name(name)
    with pytest.raises(SystemExit) as exit_:
        early_study.main([*(["--full"] if full else []), "--tasks", "addition",
                          "--ablations", "qk", "--out", str(out)])
    assert exit_.value.code == 2 and "must be named" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("edit, match", [
    (lambda run: run.pop("accuracy"), r"runs\[0\]\.accuracy is missing"),
    (lambda run: run.update(n_test=7), r"runs\[0\]\.n_test"),
    (lambda run: run.update(resumed_at=[10_000]), r"runs\[0\]\.resumed_at"),
])
def test_a_full_file_with_a_run_that_is_not_whole_is_refused(tiny_full, edit, match):
    early_study.main(["--full", "--tasks", "addition", "--ablations", "qk", "--out",
                      str(tiny_full)])
    doc = json.loads(tiny_full.read_text())
    edit(doc["runs"][0])
    tiny_full.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError, match=match):
        results.load(tiny_full)
    # a window study's file does not hold a full run's fields
    doc = json.loads(tiny_full.read_text())
    bad = tiny_full.with_name("early_window.json")
    bad.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError, match="only an early_full_"):
        results.load(bad)


@pytest.mark.parametrize("accuracy, curve, layer1, reading", [
    (0.95, [0.5, 0.92, 0.95, 0.96], [0.85, 0.82, 0.81, 0.84, 0.9], "learned, pattern kept"),
    (0.95, [0.5, 0.92, 0.95, 0.96], [0.85, 0.42, 0.81, 0.84, 0.9], "learned, pattern lost"),
    # at the level only at the last point: a tail of 0 %, short of the study's margin
    (0.95, [0.5, 0.6, 0.7, 0.95], [0.85, 0.82, 0.81, 0.84, 0.9], "not learned, pattern kept"),
    (0.85, [0.5, 0.92, 0.95, 0.96], [0.85, 0.82, 0.81, 0.84, 0.7], "not learned, pattern lost"),
])
def test_the_full_reading_asks_the_study_s_margin_and_every_point_of_layer_1(
        accuracy, curve, layer1, reading):
    assert beyond_claims.full_reading(accuracy, [10, 20, 30, 40], curve, layer1, 40) == reading


def test_the_full_reading_refuses_a_curve_without_its_initial_score():
    with pytest.raises(ValueError, match="initial one"):
        beyond_claims.full_reading(0.9, [10, 20], [0.9, 0.9], [0.8, 0.8], 20)


def test_the_full_table_reads_each_ablated_run_beside_the_unablated_run_of_its_seed(
        tiny_full):
    early_study.main(["--full", "--tasks", "addition", "--ablations", "qk", "--out",
                      str(tiny_full)])
    doc = results.load(tiny_full)
    plain = early_study.full_run("addition", 0, "study", ())  # the trained study's run
    trained = {"addition": {
        "provenance": {"cpu_capability": "AVX512"},
        "runs": [{"seed": s, "accuracy": plain["accuracy"], "steps": plain["steps"],
                  "scores_init": plain["scores_init"],
                  "trajectory": {k: plain["curve"][k] for k in ("step", "accuracy",
                                                                  "scores")}}
                 for s in (0, 1)]},  # seed 1 has no ablated run: left out
        "reversal": {"provenance": {}, "runs": []}}
    table = early_tables.full_table([doc], trained)
    assert list(table.ablation) == ["none", "qk"] and list(table.seed) == [0, 0]
    here = doc["provenance"]["cpu_capability"]
    assert list(table.kernels) == ["AVX512", here]
    for row, run in zip(table.itertuples(), (plain, doc["runs"][0])):
        layer1 = [run["scores_init"][1], *(s[1] for s in run["curve"]["scores"])]
        assert row.lowest_layer1 == min(layer1) and row.last_layer1 == layer1[-1]
        assert row.accuracy == run["accuracy"] and row.steps == run["steps"]
        assert row.reading == beyond_claims.full_reading(
            run["accuracy"], run["curve"]["step"], run["curve"]["accuracy"], layer1,
            run["steps"])
    # the same runs point by point, initialisation first, and drawn one line per ablation
    frame = early_tables.full_frame([doc], trained)
    for name, run in (("none", plain), ("qk", doc["runs"][0])):
        g = frame[frame.ablation == name]
        assert list(g.step) == [0, *run["curve"]["step"]] and g.accuracy.isna().sum() == 1
        assert list(g.layer1) == [run["scores_init"][1],
                                  *(s[1] for s in run["curve"]["scores"])]
    one = frame.assign(kernels="AVX2")  # one kernel set: the legend names the ablations
    fig = early_dynamics.full_curves(one)
    assert sorted({t.name for t in fig.data}) == ["none", "qk"] and len(fig.data) == 4
    assert sum(t.showlegend for t in fig.data) == 2


def test_the_full_table_keeps_a_run_of_each_kernel_set_apart():
    """The same (task, seed, ablation) committed under two kernel sets is two rows, each
    read on its own, and two lines in the figure, the legend naming the kernels."""
    def run(first: float) -> dict:
        return {"task": "reversal", "seed": 0, "frozen": ["embedding", "qk"],
                "accuracy": 1.0, "steps": 40, "scores_init": [0.9, 0.85],
                "curve": {"step": [10, 20, 30, 40], "accuracy": [0.2, 0.95, 0.99, 1.0],
                          "scores": [[0.9, first], [0.9, 0.84], [0.9, 0.83], [0.9, 0.82]]}}
    docs = [{"provenance": {"cpu_capability": k}, "runs": [run(v)]}
            for k, v in (("AVX512", 0.81), ("AVX2", 0.5))]
    table = early_tables.full_table(docs, {})
    assert list(table.kernels) == ["AVX2", "AVX512"]  # sorted within the same run
    assert list(table.lowest_layer1) == [0.5, 0.81]
    assert table.reading.iloc[0] != table.reading.iloc[1]  # 0.5 loses what 0.81 keeps
    assert early_tables.kernel_splits(table) == (1, 1)  # one run twice, two readings
    assert early_tables.kernel_splits(table.iloc[:1]) == (0, 0)  # once: nothing to split
    assert early_tables.kernel_splits(table.assign(reading="same")) == (1, 0)
    todo = early_tables.untrained_full(table, ["reversal", "ordering"],
                                       ["none", "both", "qk"])
    assert todo == ["reversal qk", "ordering both", "ordering qk"]  # "none" is not asked
    fig = early_dynamics.full_curves(early_tables.full_frame(docs, {}))
    assert {t.name for t in fig.data} == {"both (AVX2)", "both (AVX512)"}
    assert len(fig.data) == 4 and sum(t.showlegend for t in fig.data) == 2


def test_the_kernel_table_sets_the_verdicts_of_two_kernel_sets_side_by_side(tiny_study):
    early_study.main(["--tasks", "addition", "--seeds", "0", "1", "2", "--ablations",
                      "none", "embedding", "--out", str(tiny_study)])
    runs = early_tables.frame(results.load(tiny_study))
    # natively, the unablated runs fall and the ablated ones keep the pattern: "explains"
    native = runs.assign(layer1=runs.layer1.where(runs.ablation != "none", 0.3)
                         .where(runs.ablation == "none", 0.9))
    same = early_tables.kernel_agreement(native, native)
    assert list(same.verdict) == ["explains"] and same.agree.all()
    # under the other kernels the unablated runs never fall: a verdict that differs
    other = native.assign(layer1=0.9)
    moved = early_tables.kernel_agreement(native, other)
    assert list(moved.verdict_other) == ["no collapse"] and not moved.agree.any()
    assert list(moved.lowest_unablated_other) == [0.9]
    # pairs the other file lacks, or holds without its unablated runs or on other seeds,
    # are left out, not read as disagreements
    for part in (other[other.task != "addition"], other[other.ablation != "none"],
                 other[~((other.ablation == "none") & (other.seed == 2))]):
        assert early_tables.kernel_agreement(native, part).empty
    fewer = early_tables.kernel_agreement(native, other[other.seed < 2])
    assert list(fewer.seeds) == [2] and list(fewer.verdict) == ["cannot tell"]
    # a verdict the kernel sets differ on is withdrawn, and the answer says why
    causes = early_tables.causes(native)
    assert list(early_tables.with_kernels(causes, same).verdict) == ["explains"]
    withdrawn = early_tables.with_kernels(causes, moved)
    assert list(withdrawn.verdict) == ["cannot tell"] and list(withdrawn.kernels) == ["differ"]
    assert list(early_tables.with_kernels(causes, moved.iloc[:0]).kernels) == ["one set"]
    # several reruns stacked: the verdict stands only where every one agrees with native
    both = pd.concat([same, same])
    assert list(early_tables.with_kernels(causes, both).kernels) == ["agree"]
    for stacked in (pd.concat([same, moved]), pd.concat([moved, same])):
        split = early_tables.with_kernels(causes, stacked)
        assert list(split.verdict) == ["cannot tell"] and list(split.kernels) == ["differ"]
    text = early_tables.answers(early_tables.falls(native), early_tables.agreement(native),
                                withdrawn)["addition"]
    assert text.endswith(f"cannot tell{early_tables.KERNELS_DIFFER}.")


@pytest.mark.parametrize("verdicts, combined", [
    (["explains", "explains"], "explains"),
    (["does not explain", "cannot tell"], "cannot tell"),
    (["no collapse", "explains"], "cannot tell"),
    (["no collapse"], "no collapse"),
])
def test_a_verdict_stands_across_kernel_sets_only_where_they_agree(verdicts, combined):
    assert beyond_claims.across_kernels(verdicts) == combined


@pytest.mark.parametrize("verdicts", [[], ["holds"]])
def test_across_kernels_refuses_what_is_no_verdict(verdicts):
    with pytest.raises(ValueError, match="across_kernels"):
        beyond_claims.across_kernels(verdicts)


def _runs(rows: list[tuple]) -> pd.DataFrame:
    """A stand-in for early_tables.frame: (task, ablation, seed, step, loss, layer1) rows,
    with the other measured quantities constant except value_axis = layer1's fall."""
    frame = pd.DataFrame(rows, columns=["task", "ablation", "seed", "step", "loss", "layer1"])
    return frame.assign(score_without_mlp=frame.layer1 + 0.05, value_axis=1 - frame.layer1,
                        rho=0.3, entropy=1.0)


def _curve(task, ablation, seed, losses, layer1):
    steps = [0, 10, 20, 30, 40]
    return [(task, ablation, seed, s, l, v) for s, l, v in zip(steps, losses, layer1)]


def test_matched_loss_reads_each_ablation_where_it_learned_as_far_as_the_unablated_run():
    rows = []
    for seed in range(3):
        rows += _curve("addition", "none", seed, [None, 3.0, 2.0, 1.5, 1.0],
                       [0.9, 0.9, 0.5, 0.4, 0.4])  # falls at 20, loss 2.0 there
        rows += _curve("addition", "embedding", seed, [None, 3.2, 3.1, 3.0, 3.0],
                       [0.9, 0.9, 0.9, 0.9, 0.9])  # never learns as far
        rows += _curve("addition", "qk", seed, [None, 3.0, 1.9, 1.5, 1.0],
                       [0.9, 0.9, 0.5, 0.5, 0.5])  # as far at 20, layer 1 fallen
    per_seed, verdicts = early_tables.matched(_runs(rows))
    verdict = dict(zip(verdicts.ablation, verdicts.verdict))
    assert verdict == {"embedding": "not matched", "qk": "does not explain"}
    qk = per_seed[per_seed.ablation == "qk"].iloc[0]
    assert (qk.falls_at, qk.matched_loss, qk.matched_step, qk.layer1) == (20, 2.0, 20, 0.5)
    assert qk.without_mlp == pytest.approx(0.55)
    assert per_seed[per_seed.ablation == "embedding"].matched_step.isna().all()


def test_correlates_are_read_at_the_fall_and_at_the_same_step_where_layer_1_holds():
    rows = (_curve("addition", "none", 0, [None, 3, 2, 1, 1], [0.9, 0.9, 0.5, 0.4, 0.4])
            + _curve("addition", "none", 1, [None, 3, 2, 1, 1], [0.9, 0.9, 0.9, 0.6, 0.6])
            + _curve("reversal", "none", 0, [None, 3, 2, 1, 1], [0.9, 0.85, 0.8, 0.8, 0.8]))
    table = early_tables.correlates(_runs(rows)).set_index(["task", "seed"])
    assert table.falls.tolist() == [True, True, False]
    # falls at 20 and 30: the run that holds is read at their median step, 25 -> nearest 20
    assert table.step.tolist() == [20.0, 30.0, 20.0]
    assert table.loc[("reversal", 0), "value_axis"] == pytest.approx(0.2)
    assert table.loc[("reversal", 0), "value_axis_init"] == pytest.approx(0.1)
