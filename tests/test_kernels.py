"""Tests of the kernel-set check's parts that run without training: the environments, the
tagged outputs it compares, and the report's pass / fail rule."""

import json

from nopelib import kernels


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
    run = dict(accuracy=accuracy, steps=3000, learned=accuracy >= 0.9, inside=inside)
    return {"env": {}, "summary": {"capability": "AVX512", "runs": {"reversal seed 0": run}},
            "chapters": {"trained": {"passed": passed, "seconds": 1.0, "error": "",
                                     "tagged": [tagged]}}}


def test_compare_passes_only_when_everything_agrees():
    ok, report = kernels.compare({"native": _result(1.0, True), "avx2": _result(0.99, True)})
    assert ok and "PASSED" in report and "1.0000 in 3,000 steps" in report
    assert "0.9900 in 3,000 steps" in report
    assert not kernels.compare({"native": _result(1.0, True), "avx2": _result(1.0, False)})[0]
    assert not kernels.compare({"native": _result(1.0, True), "avx2": _result(0.5, True)})[0]
    assert not kernels.compare({"native": _result(1.0, True),
                                "avx2": _result(1.0, True, passed=False)})[0]
    assert not kernels.compare({"native": _result(1.0, True),
                                "avx2": _result(1.0, True, tagged="y")})[0]
