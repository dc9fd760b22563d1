"""The static σ × layer slider figure of the random-initialisation chapter.

A unit test checks that the two-slider figure shows ``frames[a, b]`` after any sequence of
moves (plotly's restyle semantics, replayed in Python); the browser test moves each slider of
the built page in headless Chromium and checks that the drawn heatmap changes, with no console
error.
"""

from __future__ import annotations

import itertools

import numpy as np

from nopelib.book.random_init import heatmap_two_sliders

FIGURE = """() => [...document.querySelectorAll('.plotly-graph-div')]
                  .findIndex(d => d.querySelectorAll('g.slider-group').length === 2)"""


def _replay(fig, moves: list[tuple[int, int]]) -> np.ndarray:
    """The z of the visible trace after clicking step ``s`` of slider ``k`` for each (k, s).

    Step matrices are rounded to 4 decimals in the figure, hence the tolerance below.
    """
    z = [np.asarray(t.z) for t in fig.data]
    visible = [bool(t.visible) for t in fig.data]
    for k, s in moves:
        update = fig.layout.sliders[k].steps[s].args[0]
        z = [np.asarray(m) for m in update.get("z", z)]
        visible = list(update.get("visible", visible))
    assert sum(visible) == 1
    return z[visible.index(True)]


def test_two_sliders_show_the_chosen_frame_in_any_order() -> None:
    rng = np.random.default_rng(0)
    frames = {(a, b): rng.random((3, 3)) for a in (0.1, 0.2, 0.3) for b in range(4)}
    fig = heatmap_two_sliders(frames, ("σ", "layer"))
    np.testing.assert_allclose(_replay(fig, []), frames[0.1, 0], atol=5e-5)
    for (i, a), (j, b) in itertools.product(enumerate((0.1, 0.2, 0.3)), enumerate(range(4))):
        np.testing.assert_allclose(_replay(fig, [(0, i), (1, j)]), frames[a, b], atol=5e-5)
        np.testing.assert_allclose(_replay(fig, [(1, j), (0, i)]), frames[a, b], atol=5e-5)
        np.testing.assert_allclose(_replay(fig, [(1, 3 - j), (0, i), (1, j)]), frames[a, b], atol=5e-5)


def test_two_sliders_reject_missing_pairs() -> None:
    import pytest
    with pytest.raises(ValueError, match="frames"):
        heatmap_two_sliders({(0, 0): np.eye(2), (1, 1): np.eye(2)}, ("a", "b"))


def test_moving_a_slider_redraws_the_heatmap(open_page) -> None:
    opened = open_page("book/random_init")
    opened.figures_drawn()
    page = opened.page
    index = page.evaluate(FIGURE)
    assert index >= 0, "no figure with two sliders on the page"
    figure = page.locator(".plotly-graph-div").nth(index)
    figure.scroll_into_view_if_needed()
    image = figure.locator("g.hm image").first

    def href() -> str:
        return image.get_attribute("href") or image.get_attribute("xlink:href") or ""

    for slider in range(2):
        before = href()
        assert before.startswith("data:image"), f"slider figure shows no heatmap image: {before[:40]!r}"
        rail = figure.locator("g.slider-group").nth(slider).locator("rect.slider-rail-touch-rect")
        box = rail.bounding_box()
        page.mouse.click(box["x"] + box["width"] - 4, box["y"] + box["height"] / 2)  # the last step
        page.wait_for_function(
            "([i, old]) => { const img = document.querySelectorAll('.plotly-graph-div')[i].querySelector('g.hm image');"
            " return img && (img.getAttribute('href') || img.getAttribute('xlink:href')) !== old; }",
            arg=[index, before], timeout=10_000,
        )
    page.wait_for_timeout(300)
    assert opened.blocked == [], f"requests left the book: {opened.blocked}"
    assert opened.errors == [], f"console errors: {opened.errors}"
