"""Tests of the benchmark: the small run produces every section with sane numbers, the ratios
are computed from the measurements, the references agree with the fast score, the JSON is
written atomically. Speed is not asserted: CI machines vary."""

import json
import math
import os

import pytest
import torch

from nopelib.tools import bench, bench_chapters, bench_report

SECTIONS = ("meta", "train", "extraction", "adjacency", "parallel", "evaluation", "probe", "chapters")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[dict, dict, object]:
    """(returned result, result read back from the JSON, the JSON's folder) of one small run."""
    folder = tmp_path_factory.mktemp("bench")
    path = folder / "bench.json"
    result = bench.main(["--small", "--device", "cpu", "--json", str(path)])
    return result, json.loads(path.read_text()), folder


def _positive(x: object, what: str) -> None:
    assert isinstance(x, (int, float)) and math.isfinite(x) and x > 0, f"{what} = {x!r}"


def test_every_section_present_without_errors(small):
    result, from_json, folder = small
    assert from_json == result
    assert [p.name for p in folder.iterdir()] == ["bench.json"]  # no temporary file left behind
    for name in SECTIONS:
        assert name in result, name
    for section in [*result["train"].values(), result["extraction"], result["adjacency"], result["parallel"],
                    result["evaluation"], result["probe"]]:
        assert "error" not in section, section.get("error")
    assert result["chapters"]["skipped"] is True and result["chapters"]["rows"] == []
    meta = result["meta"]
    assert meta["small"] is True and meta["device"] == "cpu"
    assert len(meta["loadavg_start"]) == 3 and len(meta["loadavg_end"]) == 3
    _positive(meta["total_s"], "total_s")


def test_train_rows_and_ratios(small):
    result = small[0]
    for name, sec in result["train"].items():
        rows = sec["rows"]
        assert rows[0]["attn_impl"] == "explicit" and not rows[0]["compile"], "the reference comes first"
        assert {r["attn_impl"] for r in rows} == {"explicit", "fused"}
        ref = rows[0]
        tokens_per_pass = sum(sec["seq_len"].values()) * sec["batch_size"]
        for r in rows:
            assert r["status"] == "ok", r
            for key in ("step_ms", "step_ms_min", "step_ms_max", "tokens_per_s", "speedup"):
                _positive(r[key], f"{name} {r['name']} {key}")
            assert r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
            assert r["speedup"] == pytest.approx(ref["step_ms"] / r["step_ms"], rel=1e-9)
            assert r["tokens_per_s"] == pytest.approx(
                tokens_per_pass / (r["step_ms"] / 1000 * sec["steps_per_pass"]), rel=1e-9)
        assert ref["speedup"] == 1.0


def test_extraction_rows_and_ratios(small):
    ext = small[0]["extraction"]
    ref = ext["rows"][0]
    assert ref["name"].startswith("hidden_states")
    assert {r["name"] for r in ext["rows"]} >= {"forward fused", "forward explicit"}
    for r in ext["rows"]:
        for key in ("seq_per_s", "median_s", "min_s", "max_s", "speedup"):
            _positive(r[key], f"{r['name']} {key}")
        assert r["seq_per_s"] == pytest.approx(ext["n_sequences"] / r["median_s"], rel=1e-9)
        assert r["speedup"] == pytest.approx(ref["median_s"] / r["median_s"], rel=1e-9)


def test_adjacency_rows_ratios_and_agreement(small):
    adj = small[0]["adjacency"]
    assert [r["T"] for r in adj["rows"]] == list(bench.SMALL.adjacency_T)
    n_layers = bench.SMALL.models[0][1].n_layer + 1
    compared = 0
    for r in adj["rows"]:
        assert r["n_matrices"] == n_layers
        _positive(r["numba_s"], f"T={r['T']} numba_s")
        assert 0.0 < r["mean_score"] < 1.0
        if "reference_s" in r:
            compared += 1
            _positive(r["reference_s"], f"T={r['T']} reference_s")
            assert r["speedup_vs_reference"] == pytest.approx(r["reference_s"] / r["numba_s"], rel=1e-9)
            assert r["max_abs_diff_vs_reference"] <= 1e-12, r
    assert compared >= 2


def test_probe_rows(small):
    probe = small[0]["probe"]
    names = [r["name"] for r in probe["rows"]]
    assert names[0] == "model_states" and len(names) == 7  # 3 feature sets x 2 probes
    for r in probe["rows"]:
        _positive(r["seconds"], r["name"])


def test_parallel_rows_and_ratio(small):
    par = small[0]["parallel"]
    if os.cpu_count() < 2:
        assert par["skipped"] is True
        return
    ref, fast = par["rows"]
    assert ref["name"].startswith("sequential") and ref["speedup"] == 1.0
    assert par["steps"] == bench.SMALL.parallel_steps and len(par["runs"]) == os.cpu_count()
    for r in (ref, fast):
        _positive(r["wall_s"], r["name"])
        assert len(r["run_s"]) == len(par["runs"]) and all(x > 0 for x in r["run_s"])
    assert ref["wall_s"] >= sum(ref["run_s"])  # the runs are timed inside the sequential wall time
    assert fast["speedup"] == pytest.approx(ref["wall_s"] / fast["wall_s"], rel=1e-9)


def test_evaluation_rows_agree_and_ratios(small):
    ev = small[0]["evaluation"]
    assert [r["task"] for r in ev["rows"]] == ["addition", "reversal", "indexing", "ordering"]
    for r in ev["rows"]:
        _positive(r["greedy_s"], f"{r['task']} greedy_s")
        _positive(r["teacher_forced_s"], f"{r['task']} teacher_forced_s")
        assert r["speedup"] == pytest.approx(r["greedy_s"] / r["teacher_forced_s"], rel=1e-9)
        assert r["accuracy_greedy"] == r["accuracy_teacher_forced"]


def test_chapter_execution_passes_the_results_cache_switch(tmp_path, monkeypatch):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\n"
        f"assert os.environ['{bench_chapters.MEMO_ENV}'] == os.environ['EXPECTED'], os.environ['{bench_chapters.MEMO_ENV}']")]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    monkeypatch.delenv(bench_chapters.MEMO_ENV, raising=False)
    for memo_on, expected in ((False, "0"), (True, "1")):
        monkeypatch.setenv("EXPECTED", expected)
        seconds, status = bench_chapters.execute(path, timeout_s=120, memo_on=memo_on)
        assert status == "ok" and seconds > 0
    assert bench_chapters.MEMO_ENV not in os.environ  # restored after each execution
    monkeypatch.setenv("EXPECTED", "1")
    _, status = bench_chapters.execute(path, timeout_s=120, memo_on=False)
    assert status.startswith("failed: "), status  # the switch really reached the kernel


def test_table_shows_every_section_its_errors_and_skips(small):
    result = json.loads(json.dumps(small[0]))  # a copy to alter
    text = bench_report.format_table(result)
    for title in ("[train: tiny", "[extraction:", "[adjacency_score:", "[parallel:", "[evaluation:", "[probe:",
                  "[chapters]"):
        assert title in text, title
    result["probe"] = {"error": "Traceback: probe exploded", "section_s": 0.1}
    text = bench_report.format_table(result)
    assert "Traceback: probe exploded" in text and text.split("[chapters]")[1].strip().startswith("skipped")


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "out.json"
    bench_report.write_json({"a": 1}, path)
    with pytest.raises(ValueError):  # NaN is refused: the old file must survive intact
        bench_report.write_json({"a": float("nan")}, path)
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_toc_chapters_are_notebooks_in_the_toc():
    chapters = bench_chapters.toc_chapters()
    toc = (bench.ROOT / "_toc.yml").read_text()
    for path in chapters:
        assert path.suffix == ".ipynb" and path.is_file()
        assert f"book/{path.stem}" in toc


def test_bad_device_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["--small", "--device", "tpu"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            bench.run(small=True, device="cuda")
