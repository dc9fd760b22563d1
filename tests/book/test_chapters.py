"""Tests of the chapters' specs (nopelib.core.chapter, nopelib.book.chapters): every notebook's
parameters cell holds its spec's defaults, its check cell calls its spec, the scorecard's rows
find their sections through the specs, and bad defaults or overrides fail naming the value."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from nopelib.book import chapters, score_rows
from nopelib.core.chapter import ChapterSpec
from nopelib.core.params import Int, ListOf
from nopelib.rules import beyond_claims, claims, init_claims

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
NAMES = {spec.name: name for name, spec in vars(chapters).items()
         if isinstance(spec, ChapterSpec)}  # notebook -> the spec's name in the module


def cells(chapter: str) -> list[dict]:
    return json.loads((BOOK / f"{chapter}.ipynb").read_text())["cells"]


def parameters_cell(chapter: str) -> list[tuple[str, object]]:
    """The (name, value) assignments of a notebook's cell tagged ``parameters``, each value a
    literal (papermill rewrites the cell; anything else would not survive it)."""
    source = next("".join(c["source"]) for c in cells(chapter)
                  if "parameters" in c["metadata"].get("tags", []))
    pairs = []
    for node in ast.parse(source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.dump(node)
        pairs.append((node.targets[0].id, ast.literal_eval(node.value)))
    return pairs


def test_every_notebook_with_parameters_has_a_spec_and_nothing_else_does():
    tagged = {p.stem for p in BOOK.glob("*.ipynb")
              if any("parameters" in c["metadata"].get("tags", []) for c in cells(p.stem))}
    assert tagged == set(chapters.CHAPTERS) == set(NAMES)


@pytest.mark.parametrize("chapter", sorted(chapters.CHAPTERS))
def test_the_parameters_cell_is_the_specs_defaults(chapter):
    spec = chapters.CHAPTERS[chapter]
    # names in order, and values with their types (0.1 is not 0, 16 is not 16.0)
    assert [(n, repr(v)) for n, v in parameters_cell(chapter)] == [
        (n, repr(v)) for n, v in spec.defaults.items()]


@pytest.mark.parametrize("chapter", sorted(chapters.CHAPTERS))
def test_the_check_cell_follows_the_parameters_and_calls_the_spec(chapter):
    all_cells = cells(chapter)
    at = next(i for i, c in enumerate(all_cells)
              if "parameters" in c["metadata"].get("tags", []))
    check = "".join(all_cells[at + 1]["source"])
    assert f"from nopelib.book.chapters import {NAMES[chapter]}" in check
    assert f"params = {NAMES[chapter]}.check(globals())" in check
    assert "check_params" not in check and "CHAPTER_PARAMS" not in check


def test_the_chapter_and_the_scorecard_make_the_same_study_calls():
    # the chapter and its second page (controls and length)
    code = "".join("".join(c["source"]) for page in ("random_init", "random_init_more")
                   for c in cells(page))
    for fn in ("init_base", "init_sigmas", "init_grid", "init_grid_predicted",
               "init_controls"):
        assert f"chapters.{fn}(params)" in code
    assert "chapters.text_init(params)" in "".join("".join(c["source"])
                                                     for c in cells("text"))


def test_no_module_executes_code_it_reads():
    for path in (ROOT / "nopelib").rglob("*.py"):
        calls = [n.func.id for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        assert "exec" not in calls and "eval" not in calls, path


def test_every_paper_claim_is_judged_by_one_chapter_and_its_label_is_a_rules_label():
    labels = ({c for c, _ in init_claims.INIT_CLAIMS} | {c for c, _ in claims.TRAINED_CLAIMS}
              | {init_claims.PROBE_RANDOM, init_claims.PROBE_RANDOM_MLP,
                 init_claims.PROBE_TRAINED, beyond_claims.SHORT_INPUTS})
    judged = [c for spec in chapters.CHAPTERS.values() for c in spec.claims]
    assert sorted(judged) == sorted(labels)  # each once
    assert [row[0] for row in score_rows.PAPER_ROWS] == [c for c, _ in score_rows.PAPER_CLAIMS]
    for claim, _, page, anchor in score_rows.PAPER_ROWS:
        assert chapters.CHAPTERS[page].claims[claim] == anchor
    with pytest.raises(ValueError, match="'7: no such claim' is judged by 0"):
        chapters.section_of("7: no such claim")


def test_the_readings_print_the_thresholds_they_test():
    assert init_claims.LAYER1 == f"1: layer 1 jumps to {claims.KEEPS_AT:g}-1.0"
    assert dict(init_claims.INIT_CLAIMS)[init_claims.LAYER0] == (
        f"layer 0 within {init_claims.NEAR_CHANCE:g} of {claims.CHANCE:g}")
    assert chapters.RANDOM_INIT.defaults["gone_margin"] == init_claims.GONE


RULES = {"n": Int(min=1, max=10), "xs": ListOf(Int(min=0))}


def test_a_spec_refuses_defaults_that_its_rules_refuse_or_do_not_name():
    with pytest.raises(ValueError, match=r"n=0 is not allowed: an integer >= 1"):
        ChapterSpec("c", RULES, dict(n=0, xs=[1]))
    with pytest.raises(ValueError, match=r"the defaults name \['xs', 'n'\]"):
        ChapterSpec("c", RULES, dict(xs=[1], n=2))  # same names, another order


def test_params_are_checked_copies_and_check_reads_a_namespace():
    spec = ChapterSpec("c", RULES, dict(n=2, xs=[1, 2]))
    p = spec.params(n=3)
    assert p == {"n": 3, "xs": [1, 2]}
    p["xs"].append(99)  # a caller's edit reaches neither the spec nor the next call
    assert spec.params()["xs"] == [1, 2] and spec.defaults["xs"] == [1, 2]
    with pytest.raises(ValueError, match=r"has no parameter\(s\) \['m'\]"):
        spec.params(m=1)
    with pytest.raises(ValueError, match=r"n=11 is not allowed"):
        spec.params(n=11)
    namespace = {"n": 4, "xs": [0]}
    got = spec.check(namespace)
    assert dict(got) == namespace
    namespace["got"] = got  # the check run again in the same kernel
    assert dict(spec.check(namespace)) == {"n": 4, "xs": [0]}
    with pytest.raises(ValueError, match=r"xs=\[-1\] is not allowed"):
        spec.check({"n": 4, "xs": [-1]})


def test_a_second_page_reads_its_chapters_rules_and_defaults():
    # random_init_more's studies are the chapter's and the scorecard's cached calls only
    # while its parameters are the chapter's: same rules (costs included), same defaults
    more, parent = chapters.RANDOM_INIT_MORE, chapters.RANDOM_INIT
    assert set(more.rules) < set(parent.rules) and not more.claims
    for name in more.rules:
        assert more.rules[name] is parent.rules[name], name
        assert more.defaults[name] == parent.defaults[name], name


def test_the_registry_names_the_chapter_modules_specs_and_the_studies_hold_no_rules(
        monkeypatch):
    from nopelib.averaging import theory_studies
    from nopelib.book import averaging_effect, long_sequences, random_init
    from nopelib.core import analysis
    from nopelib.core.cost import ALLOW_SLOW_ENV
    from nopelib.studies import long_context

    assert chapters.AVERAGING_EFFECT is averaging_effect.CHAPTER
    assert chapters.RANDOM_INIT is random_init.CHAPTER
    assert chapters.RANDOM_INIT_MORE is random_init.MORE
    assert chapters.LONG_SEQUENCES is long_sequences.CHAPTER
    for module in (theory_studies, analysis, long_context):
        assert not hasattr(module, "CHAPTER_PARAMS"), module.__name__
    # the second page refuses what the chapter refuses: a joint cost travels with its rule
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError, match="grid_inputs_per_task"):
        chapters.RANDOM_INIT_MORE.params(grid_seeds=100, grid_inputs_per_task=512)
