"""Fixtures for the browser tests: the built book served on loopback, and headless Chromium.

``book_url`` builds the book (incrementally: executed notebooks come from the jupyter-cache,
so after the README's build command this costs seconds) and serves ``_build/html`` on
loopback. ``open_page`` opens a page with every request outside the book blocked and console
errors recorded.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def book_url() -> Iterator[str]:
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb), "build", str(ROOT)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    handler = functools.partial(QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="session")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}; install Debian's chromium package")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


@pytest.fixture
def open_page(browser, book_url: str):
    """Factory: ``open_page("book/intro")`` -> an OpenedPage, closed after the test."""
    opened: list[OpenedPage] = []

    def factory(page_name: str) -> OpenedPage:
        opened.append(OpenedPage(browser, book_url, page_name))
        return opened[-1]

    yield factory
    for page in opened:
        page.close()


class OpenedPage:
    """A page of the book opened with outside requests blocked and console errors recorded."""

    def __init__(self, browser, book_url: str, page_name: str):
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.route("**/*", self._route(book_url))
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{book_url}{page_name}.html", wait_until="load")

    def _route(self, book_url: str):
        def handle(route):
            if route.request.url.startswith(book_url):
                route.continue_()
            else:
                self.blocked.append(route.request.url)
                route.abort()
        return handle

    def figures_drawn(self, timeout_ms: int = 60_000) -> int:
        """Waits until every plotly figure div holds an SVG; returns the number of figures."""
        self.page.wait_for_function(
            """() => [...document.querySelectorAll('.plotly-graph-div')]
                     .every(d => d.querySelector('svg.main-svg'))""",
            timeout=timeout_ms,
        )
        return self.page.locator(".plotly-graph-div").count()

    def close(self) -> None:
        self.context.close()


