"""Tests of nopelib.params and of every chapter's parameter check (issue 12).

The papermill tests run each chapter with one bad parameter and an empty cache: the chapter must
fail in the check cell right after ``parameters`` (seconds, counting the kernel start), with an
error that names the parameter.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest

from nopelib.params import (ALLOW_SLOW_ENV, Choice, Device, Float, Int, ListOf, Optional,
                            check_params, check_training_time)

BOOK = Path(__file__).resolve().parent.parent / "book"


def test_every_bad_parameter_is_named_once_with_its_value_and_what_is_allowed():
    spec = {"n": Int(min=1), "x": Float(min=0, max=1), "task": Choice(["a", "b"]),
            "seeds": ListOf(Int(min=0), unique=True), "maybe": Optional(ListOf(Int())),
            "ok": Int()}
    values = {"n": 0, "x": float("nan"), "task": "c", "seeds": [0, 0], "maybe": "[1]", "ok": 3}
    with pytest.raises(ValueError) as err:
        check_params(spec, values)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 5
    assert "n=0 is not allowed: an integer >= 1" in lines[0]
    assert "x=nan" in lines[1] and "finite" in lines[1]
    assert "task='c'" in lines[2] and "['a', 'b']" in lines[2]
    assert "seeds=[0, 0]" in lines[3] and "no repeats" in lines[3]
    assert "maybe='[1]'" in lines[4] and "-y" in lines[4]  # papermill's -p passes a list as text


def test_types_are_exact():
    assert Int().problem(True, {}) is not None
    assert Int().problem(2.0, {}) is not None
    assert Float().problem("1", {}) is not None
    assert ListOf(Choice(["nope"])).problem('["nope"]', {}) is not None  # a string, not a list
    assert Int().problem(2, {}) is None and Float().problem(2, {}) is None


def test_conditions_may_look_at_other_parameters():
    spec = {"T": Int(min=1).where(lambda t, p: t > p["w"], "greater than w"), "w": Int(min=1)}
    check_params(spec, {"T": 5, "w": 2})
    with pytest.raises(ValueError, match="T=2 is not allowed: greater than w"):
        check_params(spec, {"T": 2, "w": 2})
    with pytest.raises(ValueError, match="w is missing"):
        check_params(spec, {"T": 2})


def test_devices():
    assert Device().problem("cpu", {}) is None
    assert Device().problem("tpu", {}) is not None


def test_paper_training_on_a_cpu_needs_an_opt_in(monkeypatch):
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"profile='paper'.*about \d+ h.*{ALLOW_SLOW_ENV}=1"):
        check_training_time("paper", 20, "cpu")
    check_training_time("cpu", 8, "cpu")  # minutes: no word
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"about \d+ h"):
        check_training_time("paper", 20, "cpu")


# --- the chapters -----------------------------------------------------------------------------

BAD = [  # (chapter, parameters, what the error must name): every finding of issue 12
    ("averaging_effect", {"n_texts": 0}, "n_texts=0"),
    ("averaging_effect", {"task": "nope"}, "task='nope'"),
    ("averaging_effect", {"level": 1.5}, "level=1.5"),
    ("random_init", {"n_seeds": 0}, "n_seeds=0"),
    ("random_init", {"lengths": [2, 64]}, "lengths=[2, 64]"),
    ("random_init", {"grid_widths": [100]}, "grid_widths=[100]"),
    ("random_init", {"init_stds": [0.02, -1.0]}, "init_stds=[0.02, -1.0]"),
    ("random_init", {"init_means": []}, "init_means=[]"),
    ("trained", {"n_analysis": 0}, "n_analysis=0"),
    ("trained", {"profile": "bogus"}, "profile='bogus'"),
    ("trained", {"tasks": '["nope"]'}, "tasks='[\"nope\"]'"),
    ("trained", {"seeds": []}, "seeds=[]"),
    ("trained", {"heatmap_task": "addition", "tasks": ["reversal"]}, "heatmap_task='addition'"),
    ("trained", {"profile": "paper", "device": "cpu"}, "profile='paper'"),
    ("averaging_effect", {"archs": [[6, 100]]}, "archs=[[6, 100]]"),
    ("averaging_effect", {"excess_seeds": 0}, "excess_seeds=0"),
    ("random_init", {"level": 1.0}, "level=1.0"),
    ("random_init", {"length_seqs": 0}, "length_seqs=0"),
    ("probes", {"n_fit_tokens": 3}, "n_fit_tokens=3"),
    ("probes", {"profile": "bogus"}, "profile='bogus'"),
    ("probes", {"model_seeds": [0, 1]}, "model_seeds=[0, 1]"),  # fewer than 5
    ("probes", {"T": 8}, "T=8"),
    ("probes", {"grid_lengths": [8], "grid_windows": [8]}, "grid_lengths=[8]"),
]


def _cells(chapter: str) -> tuple[str, str]:
    """Sources of the chapter's parameters cell and of the check cell after it."""
    notebook = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    i = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    return cells[i].source, cells[i + 1].source


@pytest.mark.parametrize("chapter, params, named", BAD,
                         ids=[f"{c}-{'-'.join(p)}" for c, p, _ in BAD])
def test_the_check_cell_names_each_bad_parameter(monkeypatch, chapter, params, named):
    """The cell after ``parameters``, run in this process on the chapter's defaults plus the bad
    values (as papermill injects them), rejects them; the defaults pass."""
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    parameters, check = _cells(chapter)
    namespace: dict = {}
    exec(parameters, namespace)
    if chapter == "trained":
        namespace["device"] = "cpu"  # the defaults must pass on a GPU-less machine too
    exec(check, dict(namespace))
    namespace.update(params)
    with pytest.raises(ValueError) as err:
        exec(check, namespace)
    assert named in str(err.value)


PAPERMILL = [("averaging_effect", {"n_texts": 0}, "n_texts=0"),
             ("random_init", {"n_seeds": 0}, "n_seeds=0"),
             ("trained", {"tasks": '["nope"]'}, "tasks='[\"nope\"]'"),
             ("probes", {"n_fit_tokens": 3}, "n_fit_tokens=3")]


@pytest.mark.parametrize("chapter, params, named", PAPERMILL, ids=[c for c, _, _ in PAPERMILL])
def test_a_bad_parameter_fails_the_chapter_within_seconds(tmp_path, monkeypatch, chapter, params,
                                                          named):
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cold-cache"))
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    start = time.perf_counter()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(BOOK / f"{chapter}.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters=params, cwd=str(BOOK), progress_bar=False,
                                   kernel_name="python3")
    seconds = time.perf_counter() - start
    assert err.value.ename == "ValueError"
    assert named in err.value.evalue, err.value.evalue
    assert err.value.source.startswith("# Check every parameter")  # the cell after parameters
    assert seconds < 30, f"{chapter} took {seconds:.1f} s to reject {params}"
