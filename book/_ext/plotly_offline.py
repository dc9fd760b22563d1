"""Sphinx extension of the book: plotly figures render from the book itself, never a CDN,
and chapter code fits the page.

Figures drawn by ``nopelib.book.viz`` carry two outputs: plotly JSON for live front ends and an
HTML div that calls the page's ``Plotly`` global. This extension copies the installed plotly
package's ``plotly.min.js`` into ``_static`` and adds it to every page's head, so the built
book works with no network. That MyST-NB draws the HTML twin and never the JSON is set in
``_config.yml`` (``nb_mime_priority_overrides``). Jupyter Book finds this file through
``sphinx: local_extensions`` in ``_config.yml``: it is build glue, not part of ``nopelib``.

Chapter code is written to 88 characters a line; at the theme's 14 px a 1280 px window's
column holds about 80 (measured: a 684 px code block, 666 px in a collapsed cell), so code
cells are set at 11.5 px, which holds 88 with room for the block's padding (``tests/test_book.py`` checks that none scrolls).
The package's own code, shown beside the prose (``literalinclude``, language python), is
written to 100 characters a line: it is set at 11 px, which holds 100. Shell commands (the
README's, the appendices') wrap at the column's edge rather than scroll: a command line runs
as long as its flags.

Outputs fit the column too: printed text wraps at the column's edge instead of scrolling, and
tables are set at 12 px with narrow padding, their column names free to break (a name such as
``d_nrmse lo`` is otherwise as wide as the numbers under it are not).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import plotly
from sphinx.application import Sphinx

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
BOOK_CSS = """div.cell_input pre { font-size: 11.5px; }
div.highlight-python pre { font-size: 11px; }
div.highlight-bash pre { white-space: pre-wrap; overflow-wrap: anywhere; }
div.cell_output pre { white-space: pre-wrap; overflow-wrap: anywhere; }
div.cell_output table { font-size: 12px; }
div.cell_output th, div.cell_output td { padding: 2px 5px; }
div.cell_output th { overflow-wrap: anywhere; }
"""


def _copy_plotly(app: Sphinx, exc: Exception | None) -> None:
    if exc is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")
        (static / "nopelib.css").write_text(BOOK_CSS)


def _dedupe_scripts(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: object
) -> None:
    """Drops repeated script tags: sphinx-thebe registers its inline config once per build
    phase, and a second ``const THEBE_JS_URL`` is a console error on every page."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # the repeat is registered with filename "" instead of None: compare what is emitted
        attributes = repr(sorted(getattr(script, "attributes", {}).items()))
        key = (getattr(script, "filename", script) or "", attributes)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app: Sphinx) -> dict:
    app.add_js_file("plotly.min.js", priority=100)
    app.add_css_file("nopelib.css")
    app.connect("build-finished", _copy_plotly)
    app.connect("html-page-context", _dedupe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
