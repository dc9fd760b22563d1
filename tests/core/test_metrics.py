"""The metrics against their definitions: brute force, hand-made patterns, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nopelib.core.metrics import (adjacency_row_scores, adjacency_score, adjacency_score_reference,
                                  cosine_similarity_matrix, embedding_variance, nrmse, pearson_r)


def _square(draw_values):
    return st.integers(3, 24).flatmap(
        lambda T: st.integers(1, 3).flatmap(lambda B: arrays(np.float64, (B, T, T), elements=draw_values))
    )


@settings(max_examples=60, deadline=None)
@given(_square(st.floats(-1, 1, allow_nan=False, width=32)))
def test_matches_brute_force_on_continuous_values(C: np.ndarray) -> None:
    np.testing.assert_allclose(adjacency_score(C), adjacency_score_reference(C), rtol=0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(_square(st.integers(-2, 2).map(float)))
def test_matches_brute_force_with_many_ties(C: np.ndarray) -> None:
    np.testing.assert_allclose(adjacency_score(C), adjacency_score_reference(C), rtol=0, atol=1e-12)


def test_float32_and_torch_inputs_agree_with_float64() -> None:
    C = np.random.default_rng(0).standard_normal((2, 40, 40)).astype(np.float32)
    expected = adjacency_score_reference(C)
    np.testing.assert_allclose(adjacency_score(C), expected, atol=1e-12)
    np.testing.assert_allclose(adjacency_score(torch.from_numpy(C)), expected, atol=1e-12)


def _distance_pattern(T: int, sign: float) -> np.ndarray:
    i = np.arange(T)
    return sign * -np.abs(i[:, None] - i[None, :]).astype(float)  # sign=+1: nearer is more similar


def test_perfect_reversed_and_random_patterns() -> None:
    assert adjacency_score(_distance_pattern(50, +1)) == pytest.approx(1.0)
    assert adjacency_score(_distance_pattern(50, -1)) == pytest.approx(0.0)
    random = np.random.default_rng(1).standard_normal((20, 100, 100))
    assert adjacency_score(random).mean() == pytest.approx(0.5, abs=0.01)


def test_row_scores_layout_and_ties() -> None:
    rows = adjacency_row_scores(_distance_pattern(6, +1))
    assert np.isnan(rows[:2]).all() and np.allclose(rows[2:], 1.0)
    assert adjacency_score(np.ones((5, 5))) == 0.0  # all ties: nothing is strictly in order
    assert adjacency_score(np.zeros((3, 4, 4))).shape == (3,)


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 2)])
def test_bad_shapes_raise(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="C must"):
        adjacency_score(np.zeros(shape))


def test_long_sequence_matches_reference_on_a_slice() -> None:
    # a 600-token matrix exercises many merge levels; rows 2..40 are checked by brute force
    C = np.random.default_rng(2).standard_normal((600, 600))
    rows = adjacency_row_scores(C)
    for k in (2, 17, 40, 599):
        x = C[k, :k]
        expected = sum(x[i] < x[j] for j in range(k) for i in range(j)) / (k * (k - 1) / 2)
        assert rows[k] == pytest.approx(expected, abs=1e-12)


def test_cosine_similarity_matrix() -> None:
    h = torch.randn(2, 5, 8)
    C = cosine_similarity_matrix(h)
    expected = torch.nn.functional.cosine_similarity(h[:, :, None], h[:, None, :], dim=-1)
    torch.testing.assert_close(C, expected, atol=1e-5, rtol=0)
    assert torch.allclose(C.diagonal(dim1=-2, dim2=-1), torch.ones(2, 5))
    with pytest.raises(ValueError, match="h must"):
        cosine_similarity_matrix(torch.randn(5))


def test_identical_vectors_tie_exactly() -> None:
    # layer 0 of a NoPE model: a repeated token has the same embedding, so its similarities tie
    emb = torch.randn(10, 384)
    h = emb[torch.tensor([0, 1, 2, 1, 3, 1, 0, 4, 2, 1] * 3)]
    C = cosine_similarity_matrix(h)
    k = 29
    assert C[k, 1] == C[k, 3] == C[k, 5]


def test_variance_nrmse_pearson() -> None:
    h = np.random.default_rng(3).standard_normal((4, 7, 16))
    np.testing.assert_allclose(embedding_variance(h), h.var(axis=-1))
    np.testing.assert_allclose(embedding_variance(torch.from_numpy(h)).numpy(), h.var(axis=-1))
    true = np.arange(10.0)
    assert nrmse(true, true) == 0.0
    assert nrmse(np.full(10, true.mean()), true) == pytest.approx(1.0)
    assert pearson_r(2 * true + 1, true) == pytest.approx(1.0)
    assert pearson_r(-true, true) == pytest.approx(-1.0)
    assert pearson_r(np.ones(10), true) == 0.0
    with pytest.raises(ValueError, match="same"):
        nrmse(true[:3], true)
    with pytest.raises(ValueError, match="constant"):
        nrmse(true, np.ones(10))


def test_repeated_rows_tie_exactly_whatever_the_kernels():
    """A repeated token gives identical rows at layer 0; their similarities must be equal bit
    for bit, or the metric's ties (counted as not in order) would break at random, one way
    on one CPU's kernels and another way on the next (float64 and float32 alike)."""
    rng = np.random.default_rng(0)
    for dtype in (torch.float32, torch.float64):
        e = torch.from_numpy(rng.standard_normal((6, 40, 16))).to(dtype)
        e[:, 7], e[:, 21], e[:, 33] = e[:, 3], e[:, 3], e[:, 12]  # repeats
        C = cosine_similarity_matrix(e)
        for a, b in ((3, 7), (3, 21), (12, 33)):
            assert torch.equal(C[:, :, a], C[:, :, b]) and torch.equal(C[:, a], C[:, b])
        unit = e / e.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(C, unit @ unit.transpose(-2, -1))
    # a batch without repeats is the plain product
    x = torch.randn(3, 10, 8)
    u = x / x.norm(dim=-1, keepdim=True)
    assert torch.equal(cosine_similarity_matrix(x), u @ u.transpose(-2, -1))


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (2, 0, 4), (0, 3, 4)])
def test_an_empty_input_to_the_similarity_matrix_is_a_clear_error(shape):
    with pytest.raises(ValueError, match=r"no empty dimension.*got \(" ):
        cosine_similarity_matrix(torch.zeros(shape))
