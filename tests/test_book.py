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

ROOT = Path(__file__).resolve().parents[1]


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
    text = opened.page.evaluate(
        """() => { const a = document.querySelector('article').cloneNode(true);
                   a.querySelectorAll('pre, code, mjx-container, script').forEach(e => e.remove());
                   return a.innerText; }""")
    raw = RAW_MATH.findall(text)
    assert raw == [], f"{page_name}: raw LaTeX on the page: {raw[:5]}"
