"""Shared fixtures: tiny profiles, a cache of one's own, one thread; the book in a browser.

``TINY_RUN`` is the tiny profile the run-cache tests train (1 layer, 6 steps: seconds on one
thread), ``TINY_STUDY`` the trained study's profile in seconds (its budget follows progress,
with a trajectory); ``one_thread_cache`` points the nopelib cache at the test's own folder and
trains on one thread, as a study's worker does; ``one_thread`` is one thread for a module.
The rest serves the browser tests: the built book on loopback, and headless Chromium.

When a session collects a test that needs the book, the book build (``jupyter-book build``,
incremental: executed notebooks come from the jupyter-cache, so after the README's build
command it costs seconds) starts at once in a subprocess, and the tests are ordered so that it
runs while the unit tests do: unit tests, then the browser tests (which wait for the build),
then the nbval cells, which find the trained runs and studies the build computed in the
nopelib caches. ``book_url`` serves ``_build/html`` on loopback; ``open_page`` opens a page with
every request outside the book blocked and console errors recorded.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nopelib.core.model import GPTConfig
from nopelib.store import cache
from nopelib.training import profiles

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


# the run-cache tests' profile: the cpu profile at 1 layer, 6 steps, a few examples
TINY_RUN = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=1, n_head=2, n_embd=16),
    steps=6, batch_size=8, warmup_steps=2, n_train=64, n_test=16, n_eval=16,
    eval_batch_size=16, log_every=3, seeds=(0,), task_budgets=(), curve_every=0, n_curve=16,
)

# a trained study in seconds: the study profile's rules on a 2-layer model
TINY_STUDY = replace(
    profiles.PROFILES["study"], name="tiny-study", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=30, batch_size=8, warmup_steps=2, n_train=64, n_test=24, n_eval=24, n_curve=24,
    n_val=8, curve_every=10, eval_batch_size=16, log_every=5, seeds=(0, 1), n_trajectory=4,
)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module: tiny models are overhead-bound, and do not contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The nopelib cache in the test's own folder (returned), and torch on one thread."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path / "cache"
    torch.set_num_threads(threads)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class BookBuild:
    """``jupyter-book build`` of the repository in its own process group, started at most once."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self) -> None:
        if self.proc is None:
            self.log = tempfile.TemporaryFile()
            jb = Path(sys.executable).with_name("jupyter-book")
            self.proc = subprocess.Popen([str(jb), "build", str(ROOT)], cwd=ROOT, stdout=self.log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> None:
        self.start()
        code = self.proc.wait()
        if code:
            self.log.seek(0)
            tail = self.log.read()[-6000:].decode(errors="replace")
            pytest.fail(f"jupyter-book build failed with exit code {code}; its output ends:\n{tail}")

    def stop(self) -> None:
        """Ends a build still running (a session stopped early), kernels and workers included."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


BUILD = BookBuild()


def _order(item: pytest.Item) -> int:
    if item.path.suffix == ".ipynb":
        return 2  # nbval cells last: the build has filled the caches they read
    return 1 if "book_url" in getattr(item, "fixturenames", ()) else 0


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_order)  # stable: each notebook's cells keep their order
    if any(_order(item) == 1 for item in items):
        BUILD.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    BUILD.stop()


@pytest.fixture(scope="session")
def book_url() -> Iterator[str]:
    BUILD.wait()
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

    def factory(page_name: str, width: int = 1400) -> OpenedPage:
        opened.append(OpenedPage(browser, book_url, page_name, width))
        return opened[-1]

    yield factory
    for page in opened:
        page.close()


class OpenedPage:
    """A page of the book opened with outside requests blocked and console errors recorded."""

    def __init__(self, browser, book_url: str, page_name: str, width: int = 1400):
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.context = browser.new_context(viewport={"width": width, "height": 1000})
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


