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


def _result(accuracy: float, verdict: str, passed: bool = True, tagged: str = "x") -> dict:
    claim = dict(task="reversal", reading="layer 1 at least 0.8", verdict=verdict, mean=0.9,
                 lo=0.85, hi=0.95)
    return {"env": {}, "summary": {"capability": "AVX512", "learned": ["reversal"],
                                   "accuracy": {"reversal seed 0": accuracy},
                                   "claims": [claim]},
            "chapters": {"trained": {"passed": passed, "seconds": 1.0, "error": "",
                                     "tagged": [tagged]}}}


def test_compare_passes_only_when_everything_agrees():
    ok, report = kernels.compare({"native": _result(1.0, "holds"),
                                  "avx2": _result(0.99, "holds")})
    assert ok and "PASSED" in report and "1.0000 | 0.9900" in report
    assert not kernels.compare({"native": _result(1.0, "holds"),
                                "avx2": _result(1.0, "cannot tell")})[0]
    assert not kernels.compare({"native": _result(1.0, "holds"),
                                "avx2": _result(1.0, "holds", passed=False)})[0]
    assert not kernels.compare({"native": _result(1.0, "holds"),
                                "avx2": _result(1.0, "holds", tagged="y")})[0]
