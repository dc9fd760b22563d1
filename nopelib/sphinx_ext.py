"""Sphinx extension of the book: serves plotly.js from the book itself, never from a CDN.

Figures drawn by ``nopelib.viz`` are HTML divs that call the page's ``Plotly`` global; this
extension copies the installed plotly package's ``plotly.min.js`` into ``_static`` and adds it
to every page's head, so the built book works with no network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import plotly
from sphinx.application import Sphinx

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _copy_plotly(app: Sphinx, exc: Exception | None) -> None:
    if exc is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")


def setup(app: Sphinx) -> dict:
    app.add_js_file("plotly.min.js", priority=100)
    app.connect("build-finished", _copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
