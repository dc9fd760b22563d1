"""Tests of the planted hidden states: shapes and draws, and that each stack's position signal
is where it is planted (in the variance only, in the adjacency only) and nowhere at layer 0."""

import numpy as np
import pytest
import torch

from nopelib.core.metrics import embedding_variance
from nopelib.core.planted import EXPECTED, NOISE, PLANTED, planted_states

N, T, D, LAYERS = 200, 24, 384, 2


@pytest.fixture(scope="module")
def stacks() -> dict[str, torch.Tensor]:
    """Both planted kinds, seed 0: [LAYERS + 1, N, T, D] each."""
    return {kind: planted_states(kind, N, T, d=D, n_layer=LAYERS, seed=0) for kind in PLANTED}


def _cos(states: torch.Tensor, lag: int) -> np.ndarray:
    """Mean over sequences of cos(h_k, h_{k-lag}) at k = lag..T-1: [T - lag]."""
    unit = torch.nn.functional.normalize(states, dim=-1)  # [N, T, d]
    return (unit[:, lag:] * unit[:, :-lag]).sum(-1).mean(0).numpy()


def _variance(states: torch.Tensor) -> np.ndarray:
    """Mean over sequences of the variance across features at every position: [T]."""
    return embedding_variance(states).mean(0).numpy()


def test_shapes_kinds_and_draws(stacks):
    for kind, states in stacks.items():
        assert states.shape == (LAYERS + 1, N, T, D) and states.dtype == torch.float32
        assert torch.isfinite(states).all()
        again = planted_states(kind, N, T, d=D, n_layer=LAYERS, seed=0)
        assert torch.equal(states, again)  # a seed fixes the draw
        other = planted_states(kind, N, T, d=D, n_layer=LAYERS, seed=1)
        assert not torch.equal(states, other)
    # the two kinds of one seed are independent draws: even their layer-0 noise differs
    assert not torch.equal(stacks["variance"][0], stacks["adjacency"][0])
    assert set(EXPECTED) == set(PLANTED)
    assert set(EXPECTED.values()) == {"cosine", "variance"}


def test_layer0_carries_no_position(stacks):
    for states in stacks.values():
        var = _variance(states[0])
        np.testing.assert_allclose(var, 1.0, atol=0.03)  # N(0, 1) at every position
        assert abs(np.corrcoef(var, np.arange(T))[0, 1]) < 0.6
        assert np.abs(_cos(states[0], 1)).max() < 0.01
        assert abs(_cos(states[0], 1).mean() - _cos(states[0], 8).mean()) < 0.003


def test_variance_stack_plants_position_in_the_variance_only(stacks):
    for layer in range(1, LAYERS + 1):
        states = stacks["variance"][layer]
        var = _variance(states)
        # what the variance window reads: 1/(k + 1) plus the noise's variance, shrinking
        k = np.arange(T)
        np.testing.assert_allclose(var, 1.0 / (k + 1) + NOISE ** 2, rtol=0.03)
        assert (np.diff(var) < 0).all(), var
        # directions independent per position: neighbours no more similar than distant ones
        near, far = _cos(states, 1), _cos(states, 8)
        assert np.abs(near).max() < 0.01 and np.abs(far).max() < 0.01
        assert abs(near.mean() - far.mean()) < 0.003


def test_adjacency_stack_plants_position_in_the_adjacency_only(stacks):
    for layer in range(1, LAYERS + 1):
        states = stacks["adjacency"][layer]
        norm = states.norm(dim=-1).mean(0).numpy()  # [T]
        # fixed norm: sqrt(d) for the signal, plus the noise's share, at every position
        np.testing.assert_allclose(norm, np.sqrt(D * (1 + NOISE ** 2)), rtol=0.005)
        var = _variance(states)
        np.testing.assert_allclose(var, 1 + NOISE ** 2, rtol=0.005)
        assert abs(np.corrcoef(var, np.arange(T))[0, 1]) < 0.6
        near, far = _cos(states, 1), _cos(states, 8)  # at k = 1.. and k = 8..
        assert (near[7:] > far + 0.1).all()  # the same rows k = 8..T-1
        # the averaging effect: cos(h_k, h_{k-1}) ~ sqrt(k / (k + 1)) / (1 + noise^2)
        k = np.arange(1, T)
        np.testing.assert_allclose(near, np.sqrt(k / (k + 1)) / (1 + NOISE ** 2), atol=0.01)
        assert (np.diff(near) > 0).all()


def test_adjacency_without_noise_has_a_fixed_norm_and_variance():
    states = planted_states("adjacency", 20, 12, d=64, n_layer=1, seed=3, noise=0.0)[1]
    torch.testing.assert_close(states.norm(dim=-1), torch.full((20, 12), 8.0))
    torch.testing.assert_close(embedding_variance(states), torch.ones(20, 12))
    torch.testing.assert_close(states.mean(-1), torch.zeros(20, 12), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="norm"), "kind="), (dict(n_seq=0), "n_seq="), (dict(T=2.5), "T="),
    (dict(d=1), "d=1"), (dict(n_layer=True), "n_layer="), (dict(noise=-0.1), "noise="),
    (dict(seed=-1), "seed=")])
def test_bad_arguments_raise(kwargs, match):
    args = dict(kind="variance", n_seq=2, T=4, d=8, n_layer=1) | kwargs
    with pytest.raises(ValueError, match=match):
        planted_states(**args)


def test_centring_keeps_position_out_of_the_adjacency_stacks_variance_window():
    """Renormalising the running mean without centring it leaves its mean across features in
    the variance (mean of squares minus square of the mean), and that mean is as smooth
    along the sequence as the cosines: the chapter's variance probe reads position from it.
    The planted stack centres first, and its variance window is at chance."""
    from nopelib.core.features import features, window_positions
    from nopelib.core.probe import fit_probe

    n, t, d, w = 600, 32, 384, 8
    planted = planted_states("adjacency", n, t, d=d, n_layer=1, seed=0)[1]
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(n, t, d, generator=g).cumsum(1) / torch.arange(1, t + 1)[:, None]
    uncentred = mean * (d ** 0.5 / mean.norm(dim=-1, keepdim=True))
    positions = window_positions(t, w)
    leak = fit_probe(features(uncentred, "variance", w), positions, seed=0)
    clean = fit_probe(features(planted, "variance", w), positions, seed=0)
    assert leak.r > 0.3, leak.r
    assert abs(clean.r) < 0.1 and clean.nrmse > 0.97, (clean.r, clean.nrmse)
