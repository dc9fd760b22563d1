"""The built book in a real browser: headless Chromium, every request outside the book blocked.

Each page must draw all of its plotly figures (an SVG inside every figure div), typeset its
math, and log no console error, with no request leaving the book. Read at 1280 px, no code
block scrolls sideways (chapter code is written to 88 characters) and no text shows raw
``$...$`` (math that was never typeset, e.g. in a computed sentence).
"""

from __future__ import annotations

import re

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [entry["file"] for entry in toc.get("chapters", [])]


@pytest.mark.parametrize("page_name", _toc_pages())
def test_page_draws_offline_without_errors(open_page, page_name: str) -> None:
    opened = open_page(page_name)
    n_figures = opened.figures_drawn()
    if (ROOT / f"{page_name}.ipynb").exists():
        assert n_figures >= 1, f"{page_name}: no plotly figure on a chapter page"
    if opened.page.locator("span.math, div.math").count():
        opened.page.wait_for_selector("mjx-container", state="attached", timeout=30_000)
    opened.page.wait_for_timeout(500)  # late console errors (resize handlers, fonts)
    assert opened.blocked == [], f"{page_name}: requests left the book: {opened.blocked}"
    assert opened.errors == [], f"{page_name}: console errors: {opened.errors}"


# text between dollar signs that MathJax would have typeset: raw LaTeX left on the page
RAW_MATH = re.compile(r"\$[^$\s][^$\n]{0,80}\$")


@pytest.mark.parametrize("page_name", _toc_pages())
def test_code_fits_the_column_and_no_math_is_raw(open_page, page_name: str) -> None:
    opened = open_page(page_name, width=1280)
    if opened.page.locator("span.math, div.math").count():  # typeset before it is read
        opened.page.wait_for_selector("mjx-container", state="attached", timeout=30_000)
    opened.page.wait_for_timeout(1000)
    scrolling = opened.page.evaluate(
        """() => [...document.querySelectorAll('div.cell_input pre')]
               .filter(p => p.scrollWidth > p.clientWidth + 1)
               .map(p => p.textContent.trim().split('\\n')[0].slice(0, 60))""")
    assert scrolling == [], f"{page_name}: code blocks that scroll sideways: {scrolling}"
    # nothing else wider than the text column either: shell commands, the package's code,
    # printed output, tables
    wide = opened.page.evaluate(
        """() => { const column = document.querySelector('article').getBoundingClientRect();
               return [...document.querySelectorAll('article pre, article table, '
                                                    + 'div.cell_output > *')]
                   .filter(e => e.scrollWidth > column.width + 2)
                   .map(e => e.tagName + ': ' + e.textContent.trim().slice(0, 60)); }""")
    assert wide == [], f"{page_name}: wider than the column: {wide}"
    text = opened.page.evaluate(
        """() => { const a = document.querySelector('article').cloneNode(true);
                   a.querySelectorAll('pre, code, mjx-container, script').forEach(e => e.remove());
                   return a.innerText; }""")
    raw = RAW_MATH.findall(text)
    assert raw == [], f"{page_name}: raw LaTeX on the page: {raw[:5]}"


def _anchors(page: str) -> set[str]:
    """The element ids of a built page (``book/<page>.html``)."""
    return set(re.findall(r'\bid="([^"]+)"', (HTML_DIR / page).read_text()))


HTML_DIR = ROOT / "_build" / "html" / "book"
SCORECARD_VERDICTS = {"replicates", "partly", "fails", "cannot tell", "untested"}


def test_scorecard_rows_have_a_verdict_a_model_a_working_link_and_rendered_numbers(open_page):
    opened = open_page("book/scorecard")
    rows = opened.page.evaluate(
        """() => [...document.querySelectorAll('.scorecard details.sc-row')].map(d => ({
               ref: d.querySelector('.sc-ref').textContent.trim(),
               verdict: d.querySelector('.sc-badge').textContent.trim(),
               model: d.querySelector('.sc-model').textContent.trim(),
               href: d.querySelector('.sc-body a')?.getAttribute('href') || ''}))""")
    refs = [r["ref"] for r in rows]
    assert {r.rstrip("abcdefgh") for r in refs} >= {str(n) for n in range(1, 7)}, refs
    for row in rows:
        ref, verdict = row["ref"], row["verdict"]
        assert verdict in SCORECARD_VERDICTS, f"{ref}: verdict {verdict!r}"
        assert row["model"], f"{ref}: no model named"
        page, _, anchor = row["href"].partition("#")
        assert (HTML_DIR / page).is_file(), f"{ref}: link to a missing page {row['href']}"
        assert anchor in _anchors(page), f"{ref}: no section #{anchor} on {page}"
    glued = opened.page.locator(".pasted-text").all_inner_texts()
    assert len(glued) >= 6 and all(t.strip() for t in glued), glued


def test_the_introduction_opens_with_figure_1_and_the_scorecards_summary(open_page):
    opened = open_page("book/intro")
    assert opened.figures_drawn() >= 1
    order = opened.page.evaluate(
        """() => { const fig = document.querySelector('.plotly-graph-div');
                   const h2 = document.querySelector('article h2');
                   return fig.compareDocumentPosition(h2)
                          & Node.DOCUMENT_POSITION_FOLLOWING; }""")
    assert order, "the first figure is not above the first section"
    panels = opened.page.evaluate(
        """() => document.querySelector('.plotly-graph-div')
                 .querySelectorAll('g.cartesianlayer > g.subplot').length""")
    assert panels >= 7, f"{panels} heatmap panels: the paper's model has 7 layers (0-6)"
    text = opened.page.evaluate("() => document.querySelector('article').innerText")
    # (Sphinx renders the apostrophe as a typographic one)
    # the tally per model comes first, each model's counts and rows rendered
    per_model = re.search(r"per model \(the paper.s own model first\): (.+?)\n", text)
    assert per_model and re.search(r"\(of \d+ rows?\)", per_model.group(1)), (
        "no tally per model rendered")
    line = re.search(r"[Oo]f the (\d+) rows for the paper.s results.*?(\d+) replicate, "
                     r"(\d+) partly replicate, (\d+) fail, for (\d+) the data cannot tell\s+"
                     r"\((\d+) of them wait for tasks still training\), and (\d+) are not "
                     r"tested yet", text, re.S)
    assert line, "no scorecard summary line with its numbers rendered"
    total, replicate, partly, fail, cannot, waiting, untested = map(int, line.groups())
    assert replicate + partly + fail + cannot + untested == total, line.group(0)
    assert waiting <= cannot, line.group(0)
    provisional = re.search(r"(\d+) of the failing and partly\s+replicating rows are "
                            r"provisional", text)
    assert provisional, "no count of provisional rows rendered"
    assert int(provisional.group(1)) <= partly + fail, provisional.group(0)


def test_every_citation_resolves_to_the_bibliography(open_page):
    entries = _anchors("bibliography.html")
    keys = re.findall(r"^@\w+\{([^,]+),", (ROOT / "book" / "references.bib").read_text(), re.M)
    cited = 0
    for page_name in _toc_pages():
        opened = open_page(page_name)
        links = opened.page.evaluate(
            """() => [...document.querySelectorAll('article a[href*="bibliography.html#"]')]
                     .map(a => [a.innerText.trim(), a.getAttribute('href')])""")
        text = opened.page.evaluate("() => document.querySelector('article').innerText")
        # an unresolved citation shows its role or its key as text
        left = [k for k in keys if k in text] + (["{cite"] if "{cite" in text else [])
        assert not left, f"{page_name}: unresolved citations {left}"
        for label, href in links:
            assert label and href.split("#")[1] in entries, f"{page_name}: {label} -> {href}"
        cited += len(links)
        opened.close()
    assert cited >= len(keys), f"{cited} citation links for {len(keys)} references"
