"""Tests of the scorecard's assembly (nopelib.scorecard): the chapters' defaults it judges,
a row's verdict and measurement from claim tables, untested rows, and the HTML table. The
whole page runs in the book build and under nbval."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from nopelib import claims, scorecard


def test_chapter_defaults_are_the_parameters_cells():
    p = scorecard.chapter_defaults("random_init")
    cells = json.loads((scorecard.BOOK / "random_init.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if "parameters" in c["metadata"].get("tags", []))
    names: dict = {}
    exec(source, {}, names)
    assert p == names and isinstance(p["n_seeds"], int)
    assert scorecard.chapter_defaults("probes")["model_seeds"] == list(range(10))
    with pytest.raises(FileNotFoundError):
        scorecard.chapter_defaults("no_such_chapter")


def _table(verdicts: list[str], means: list[float]) -> pd.DataFrame:
    return pd.DataFrame(dict(claim="1: layer 1 jumps to 0.8-1.0", reading="layer 1",
                             group=[f"g{i}" for i in range(len(verdicts))], verdict=verdicts,
                             mean=means, lo=[m - 0.05 for m in means],
                             hi=[m + 0.05 for m in means], bound=0.8, above=True, n=5,
                             m=4, holds_level=0.95, fails_level=1 - 0.05 / 4, weakest_layer=1,
                             tests=1))


def test_a_row_reads_its_groups_and_names_the_weakest():
    row = scorecard._row("1: layer 1 jumps to 0.8-1.0", "paper", "random_init", "x",
                         _table(["holds", "fails"], [0.95, 0.6]), "group", "live")
    assert row["verdict"] == "partly"
    assert "g1, layer 1, 0.600 [0.550, 0.650]" in row["measured"]
    assert "5 seeds" in row["evidence"] and "Bonferroni over 4 tests" in row["evidence"]
    assert row["section"] == '<a href="random_init.html#x">random init</a>'
    assert list(row["groups"].columns) == list(scorecard.GROUP_COLUMNS)
    held = scorecard._row("c", "p", "random_init", "x", _table(["holds"] * 3, [0.9] * 3),
                          "group", "live")
    assert held["verdict"] == "replicates"
    probe = _table(["holds"], [0.9]).assign(group="random init, layer 2")
    named = scorecard._row("c", "p", "probes", "z", probe, "group", "live")["measured"]
    assert "random init, layer 2, 0.900" in named and named.count("layer") == 1
    empty = scorecard._row("c", "p", "trained", "y", None, "task", "committed", "no study")
    assert empty["verdict"] == "untested" and empty["measured"] == "no study"


def test_the_rows_name_the_claims_of_the_rules():
    labels = ({c for c, _ in claims.INIT_CLAIMS} | {c for c, _ in claims.TRAINED_CLAIMS})
    numbered = [c for c, *_ in scorecard.PAPER_ROWS if not c.startswith(("5", "6"))]
    assert set(numbered) == labels
    assert {c.split(":")[0] for c, *_ in scorecard.PAPER_ROWS} == {str(n) for n in range(1, 7)}


def test_the_html_table_escapes_all_but_the_link():
    row = dict(claim="3: <b>", paper="σ <= 0.02", measured="a < b", verdict="cannot tell",
               evidence="e & f", section='<a href="random_init.html#x">random init</a>')
    html = scorecard.to_html(pd.DataFrame([row]))
    assert "3: &lt;b&gt;" in html and "a &lt; b" in html and "e &amp; f" in html
    assert '<a href="random_init.html#x">' in html and 'class="verdict-cannot-tell"' in html
    assert html.count("<td>") == len(scorecard.COLUMNS)


def test_the_margins_figure_puts_the_claims_side_to_the_right():
    from nopelib import viz

    groups = pd.DataFrame(dict(
        claim=["1: a", "3: b"], group=["base model", "mean 0, sigma 0.2"], reading="r",
        weakest_layer=[1, 2], mean=[0.9, 0.05], lo=[0.85, 0.0], hi=[0.95, 0.12],
        bound=[0.8, 0.1], above=[True, False], verdict=["holds", "cannot tell"]))
    fig = viz.claim_margins(groups, "t")
    held, undecided = fig.data
    assert held.name == "holds" and held.x[0] == pytest.approx(0.1)
    assert held.error_x.array[0] == pytest.approx(0.05)
    # "below 0.1": 0.05 is 0.05 on the claim's side; its interval runs from -0.02 to 0.1
    assert undecided.x[0] == pytest.approx(0.05)
    assert undecided.error_x.arrayminus[0] == pytest.approx(0.07)
    assert undecided.y[0] == "3 · mean 0, sigma 0.2 · layer 2"


def test_the_provenance_box_names_what_the_page_depends_on():
    from nopelib import results, viz

    fields = results.page_provenance(profile="study", seeds=[0, 1])
    assert {"commit", "built", "torch", "numpy", "CPU kernels", "GPU"} <= set(fields)
    html = viz.provenance_box({**fields, "note": "<b>"})
    assert html.startswith("<details") and "&lt;b&gt;" in html and "seeds" in html


def test_long_rows_are_untested_without_the_committed_study(monkeypatch):
    monkeypatch.setattr(scorecard.results, "load_all", lambda kind: {})
    rows = scorecard.long_rows()
    assert [r["claim"] for r in rows] == [c for c, _ in claims.LONG_CLAIMS]
    assert all(r["verdict"] == "untested" and "long_sequences.html#" in r["section"]
               for r in rows)
