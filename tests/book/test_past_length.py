"""The page past the training length (nopelib.book.past_length): a study file read, counted,
judged once every compared encoding holds its seeds, and drawn."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from nopelib.book import past_length as pl
from nopelib.results import files
from nopelib.rules import length_claims as rule
from nopelib.studies import text_length as tl


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run of the tiny profile (NoPE, seed 0), read on two windows."""
    folder = tmp_path_factory.mktemp("length")
    mp = pytest.MonkeyPatch()
    rows = tl.held_out(2)
    mp.setattr(tl, "held_out", lambda n=2: rows)
    mp.setenv("NOPELIB_CACHE_DIR", str(folder / "cache"))
    out = folder / "length_text_tiny.json"
    tl.main(["--profile", "text_tiny", "--encodings", "none", "--seeds", "0", "--out",
             str(out)])
    mp.undo()
    return json.loads(out.read_text())


def study_file(one_run: dict, folder, encodings, seeds, rise: dict[str, float],
               name: str = pl.FILE, kernels: str | None = None) -> None:
    """A file of ``one_run`` copied to every (encoding, seed), each encoding's bits rising
    past 256 by ``rise`` per octave, written where ``read`` looks (as ``name``; its runs
    trained under ``kernels`` where given)."""
    rng = np.random.default_rng(0)
    doc = {"provenance": one_run["provenance"], "runs": []}
    for enc in encodings:
        for seed in seeds:
            run = copy.deepcopy(one_run["runs"][0])
            run.update(encoding=enc, seed=seed)
            run["curve"]["loss"] = [x + rng.uniform(0, 1e-3) for x in run["curve"]["loss"]]
            for n in run["bpc"]:
                octaves = np.log2(int(n) / 256)
                run["bpc"][n] = 2.0 + rise[enc] * octaves + rng.normal(0, 0.01)
                run["sharpened"][n] = run["bpc"][n] - 0.1 * octaves
            if enc != "none":
                run["sharpened"] = {}
            if kernels is not None:
                run["kernels"] = kernels
            doc["runs"].append(run)
    files.write(folder / name, doc, "length")


def test_an_empty_folder_reads_as_nothing_committed(tmp_path) -> None:
    study = pl.read(tmp_path)
    assert study.doc is None and not study.judged
    assert len(study.todo) == len(rule.LENGTH_ENCODINGS) * 3
    assert pl.bpc_table(study).empty and pl.resolution_table(study).empty
    assert pl.stretch_table(study).empty and pl.verdict_grid(study).empty
    assert len(pl.curves_figure(study).data) == 0 and pl.sharpened_table(study).empty
    rows = pl.length_rows(tmp_path)
    assert len(rows) == len(rule.LENGTH_CLAIMS)
    assert {r["verdict"] for r in rows} == {"untested"}
    assert all(r["claim"].startswith("beyond") for r in rows)
    assert "NoPE 0, RoPE 0, ALiBi 0" in rows[0]["measured"]


def test_one_seed_is_shown_with_no_spread(one_run, tmp_path) -> None:
    study_file(one_run, tmp_path, ("none",), (0,), {"none": 0.3})
    table = pl.bpc_table(pl.read(tmp_path))
    assert list(table.index) == ["NoPE"]
    assert all(cell.endswith(" ± – (1)") for cell in table.loc["NoPE"])


def test_each_stretch_is_its_own_positions_mean_over_seeds(one_run, tmp_path) -> None:
    # bin k of seed s reads 1 + k / 100 + s / 2 bits: a stretch's mean is its bins', its sd
    # the seeds'
    doc = {"provenance": one_run["provenance"], "runs": []}
    for seed in (0, 1):
        run = copy.deepcopy(one_run["runs"][0])
        bins = len(run["position_bits"])
        run.update(encoding="none", seed=seed,
                   position_bits=[1 + k / 100 + seed / 2 for k in range(bins)])
        run["curve"]["loss"] = [x + seed * 1e-3 for x in run["curve"]["loss"]]  # its own run
        doc["runs"].append(run)
    files.write(tmp_path / pl.FILE, doc, "length")
    table = pl.stretch_table(pl.read(tmp_path))
    per_bin = rule.CURVE_BIN
    assert list(table.columns) == [f"[{lo:,}, {hi:,})" for lo, hi in pl.stretches()]
    assert pl.stretches()[0] == (0, rule.LENGTH_CONTEXT)
    for (lo, hi), cell in zip(pl.stretches(), table.loc["NoPE"]):
        mean = 1 + (lo / per_bin + hi / per_bin - 1) / 200 + 0.25  # the two seeds' mean
        assert cell == f"{mean:.3f} ± {0.5 / np.sqrt(2):.3f} (2)"


def test_too_few_seeds_are_counted_not_judged(one_run, tmp_path) -> None:
    study_file(one_run, tmp_path, ("none", "rope"), (0, 1, 2),
               {"none": 0.3, "rope": 1.5})
    study = pl.read(tmp_path)
    assert study.seeds["none"] == [0, 1, 2] and study.seeds["alibi"] == []
    assert not study.judged and ("alibi", 0) in study.todo and ("none", 0) not in study.todo


def test_a_full_study_is_judged_and_drawn(one_run, tmp_path) -> None:
    study_file(one_run, tmp_path, ("none", "rope", "alibi"), (0, 1, 2),
               {"none": 0.3, "rope": 1.5, "alibi": 0.05})
    study = pl.read(tmp_path)
    assert study.judged
    rises = study.tests[study.tests.claim == rule.LENGTH_CLAIMS[0][0]]
    assert set(rises.verdict) == {"holds"}
    assert set(study.tests.loc[study.tests.claim == rule.LENGTH_CLAIMS[1][0],
                               "verdict"]) == {"holds"}
    assert set(study.tests.loc[study.tests.claim == rule.LENGTH_CLAIMS[2][0],
                               "verdict"]) == {"fails"}
    assert len(study.explained) == 3
    grid = pl.verdict_grid(study)
    assert list(grid.columns) == [f"{n} chars" for n in rule.LENGTH_LENGTHS]
    assert len(grid) == len(rule.LENGTH_CLAIMS)
    rise_row, rope_row, alibi_row = (grid.iloc[i] for i in range(3))
    assert rise_row["256 chars"] == "" and set(rise_row[1:]) == {"holds"}
    assert set(rope_row[1:]) == {"holds"} and set(alibi_row[1:]) == {"fails"}
    assert grid.iloc[5]["256 chars"] != ""  # the pattern is read within the context too
    table = pl.bpc_table(study)
    assert list(table.index) == ["NoPE", "RoPE", "ALiBi"]
    assert table.loc["NoPE", 256].endswith("(3)")
    assert set(pl.sharpened_table(study).gain.round(2)[lambda s: s.index > 256]) == {
        0.1, 0.2, 0.3}
    res = pl.resolution_table(study)
    assert list(res.index) == list(range(one_run["runs"][0]["scores"]["256"].__len__()))
    assert len(pl.curves_figure(study).data) == 3
    assert len(pl.pattern_figure(study).data) == 2 * len(res.index)
    judged = pl.length_rows(tmp_path)
    assert not any("not judged" in r["measured"] for r in judged)
    rows = {r["reading"]: r["verdict"] for r in judged}
    assert rows[rule.LENGTH_CLAIMS[0][1]] == "replicates"  # the rise holds at every length
    assert rows[rule.LENGTH_CLAIMS[2][1]] == "fails"


def test_a_rerun_under_other_kernels_withdraws_what_it_does_not_repeat(one_run,
                                                                        tmp_path) -> None:
    native = {"none": 0.3, "rope": 1.5, "alibi": 0.05}
    study_file(one_run, tmp_path, ("none", "rope", "alibi"), (0, 1, 2), native,
               kernels="AVX512")
    rerun = pl.kernels_rule.KERNEL_FILE
    # a rerun that holds fewer seeds leaves the verdicts one set's
    study_file(one_run, tmp_path, ("none", "rope", "alibi"), (0, 1), native, rerun, "AVX2")
    study = pl.read(tmp_path)
    assert study.kernels == "one set" and study.kernel_seeds["none"] == [0, 1]
    assert "one CPU kernel set" in pl.length_rows(tmp_path)[0]["evidence"]
    # the same study under AVX2: every verdict stands
    study_file(one_run, tmp_path, ("none", "rope", "alibi"), (0, 1, 2), native, rerun, "AVX2")
    study = pl.read(tmp_path)
    assert study.kernels == "two sets" and set(study.tests.kernels) == {"agree"}
    assert rerun in pl.length_rows(tmp_path)[0]["evidence"]
    # a rerun where RoPE rises less than NoPE: that reading is withdrawn, the rest stand
    study_file(one_run, tmp_path, ("none", "rope", "alibi"), (0, 1, 2),
               {**native, "rope": 0.05}, rerun, "AVX2")
    study = pl.read(tmp_path)
    rope = study.tests[study.tests.claim == rule.LENGTH_CLAIMS[1][0]]
    assert set(rope.verdict_native) == {"holds"} and set(rope.verdict) == {"cannot tell"}
    rows = {r["reading"]: r["verdict"] for r in pl.length_rows(tmp_path)}
    assert rows[rule.LENGTH_CLAIMS[1][1]] == "cannot tell"
    assert rows[rule.LENGTH_CLAIMS[0][1]] == "replicates"


def test_a_rerun_under_the_same_kernels_is_refused(one_run, tmp_path) -> None:
    both = ("none", "rope", "alibi"), (0, 1, 2), {"none": 0.3, "rope": 1.5, "alibi": 0.05}
    study_file(one_run, tmp_path, *both, kernels="AVX512")
    study_file(one_run, tmp_path, *both, pl.kernels_rule.KERNEL_FILE, "AVX512")
    with pytest.raises(ValueError, match="differ from"):
        pl.read(tmp_path)


def test_the_kernel_table_gives_each_rerun_seed_against_its_native_run(one_run,
                                                                     tmp_path) -> None:
    rises = {"none": 0.3, "rope": 1.5, "alibi": 0.05}
    both = ("none", "rope", "alibi"), (0, 1, 2), rises
    study_file(one_run, tmp_path, *both, kernels="AVX512")
    assert pl.kernel_table(pl.read(tmp_path)).empty
    # the rerun repeats the native bits (the same draws), but seed 1 of RoPE reads 0.05 more
    rerun = pl.kernels_rule.KERNEL_FILE
    study_file(one_run, tmp_path, *both, rerun, "AVX2")
    doc = files.load(tmp_path / rerun)
    for run in doc["runs"]:
        if (run["encoding"], run["seed"]) == ("rope", 1):
            run["bpc"] = {n: v + 0.05 for n, v in run["bpc"].items()}
    files.write(tmp_path / rerun, doc, "length")
    study = pl.read(tmp_path)
    table = pl.kernel_table(study)
    lengths = sorted(int(n) for n in one_run["runs"][0]["bpc"])
    assert list(table.index) == [(pl.NAMES[e], n) for e in both[0] for n in lengths]
    assert list(table.columns) == ["sd over seeds"] + [
        f"seed {s}: rerun − native" for s in (0, 1, 2)]
    shifted = table.loc["RoPE", "seed 1: rerun − native"]
    assert np.allclose(shifted, 0.05)
    others = table.drop(columns=["sd over seeds", "seed 1: rerun − native"])
    assert np.allclose(others, 0) and np.allclose(table.loc["NoPE"].iloc[:, 1:], 0)
    sd = study.bpc.groupby(["encoding", "length"]).bpc.std(ddof=1)
    assert np.allclose(table.loc["ALiBi", "sd over seeds"], sd["alibi"].round(3))
