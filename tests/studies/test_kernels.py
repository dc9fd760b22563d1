"""Tests of the kernel-set check's parts that run without training: the environments, the
tagged outputs it compares, and the report's pass / fail rule."""

import json
import time

import pytest

from nopelib.results import files as results
from nopelib.studies import kernels


def test_kernel_sets():
    above = kernels.kernel_sets("AVX512")
    assert above["native"] == {} and above["avx2"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert above["avx2"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert above["avx2"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    # on an AVX2-only CPU the second set is torch's plain kernels
    assert kernels.kernel_sets("AVX2")["avx2"]["ATEN_CPU_CAPABILITY"] == "default"


def test_tagged_outputs(tmp_path):
    cells = [{"cell_type": "code", "metadata": {"tags": [kernels.TAG]},
              "outputs": [{"data": {"text/plain": ["a  cosine\n", "b  cannot tell"]}}]},
             {"cell_type": "code", "metadata": {}, "outputs": [{"text": "ignored"}]}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert kernels.tagged_outputs(path) == ["a  cosine\nb  cannot tell"]


def _result(accuracy: float, inside: bool, passed: bool = True, tagged: str = "x") -> dict:
    run = dict(task="reversal", seed=0, accuracy=accuracy, n_test=20_000, steps=3000,
               train_seconds=300.0, learned=accuracy >= 0.9, inside=inside,
               outside=[] if inside else ["layer 4 score"], scores_after=[0.6, 0.8, 0.7])
    return {"env": {}, "summary": {"capability": "AVX512", "runs": {"reversal seed 0": run}},
            "chapters": {"trained": {"passed": passed, "seconds": 1.0, "error": "",
                                     "tagged": [tagged]}}}


def test_compare_passes_only_when_every_verdict_agrees():
    ok, report = kernels.compare({"native": _result(1.0, True), "avx2": _result(0.99, True)})
    assert ok and "PASSED" in report and "1.0000 in 3,000 steps" in report
    assert "0.9900 in 3,000 steps" in report
    # the reproduction check is reported, and its difference named, but it is no verdict
    ok, report = kernels.compare({"native": _result(1.0, True), "avx2": _result(1.0, False)})
    assert ok and "the reproduction check (reported, not a verdict) differs" in report
    assert "inside the study's spread False (outside: layer 4 score)" in report
    assert not kernels.compare({"native": _result(1.0, True), "avx2": _result(0.5, True)})[0]
    assert not kernels.compare({"native": _result(1.0, True),
                                "avx2": _result(1.0, True, passed=False)})[0]
    assert not kernels.compare({"native": _result(1.0, True),
                                "avx2": _result(1.0, True, tagged="y")})[0]


def test_the_record_is_a_valid_result_and_damage_is_refused(tmp_path):
    by_set = {"native": _result(1.0, True), "avx2": _result(1.0, False)}
    by_set["avx2"]["env"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    doc = kernels.record(by_set, ["--out", "/tmp/k"], time.perf_counter())
    path = tmp_path / "kernels_study.json"
    results.write(path, doc, "kernels")
    back = results.load(path)
    assert [(r["set"], r["inside"], r["outside"]) for r in back["runs"]] == [
        ("native", True, []), ("avx2", False, ["layer 4 score"])]
    assert back["provenance"]["sets"]["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert back["provenance"]["chapters"]["avx2"]["trained"]["passed"] is True
    doc["runs"][1]["set"] = "avx512"  # a row of a set the record does not name
    with pytest.raises(results.ResultsError, match=r"runs\[1\].set = 'avx512'"):
        results.validate(doc, "kernels", "k")
    doc["runs"][1]["set"], doc["runs"][1]["inside"] = "avx2", "no"
    with pytest.raises(results.ResultsError, match=r"runs\[1\].inside"):
        results.validate(doc, "kernels", "k")
