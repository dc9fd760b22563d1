"""Closed forms of the averaging effect, and a residual-stream model of the layer-1 score.

Everything here is a formula, or a Monte Carlo of one (``simulate_averaged``,
``null_attention_checks``): no model is built or run. The layer-1 score of a whole
configuration from its initialisation is ``nopelib.averaging.theory_config``; the studies that set
these closed forms beside random models live in ``nopelib.averaging.theory_studies``.

Positions are 1-based in every formula here (position k averages the value vectors 1..k).

The averaging effect: with uniform causal attention the output at position k is
a_k = (1/k) sum_{m<=k} u_m. For i.i.d. zero-mean u_m with E|u|^2 = s^2,
E<a_i, a_j> = s^2 / max(i, j), E|a_k|^2 = s^2 / k, so cos(a_i, a_j) ~ sqrt(min/max) for large d.

The residual stream (past the paper): after block 1, h_k ~ e_{t_k} + a_k, the token's embedding
plus the averaged term (the MLP of block 1 is left out; the chapter measures what that costs).
Tokens repeat in task inputs, so both terms are written with the token ids t_k: the same token
has the same embedding and the same value vector at every position. With rho = |e| / |u|, the
expected Gram matrix of the h_k, in units of s^2, is

    K_ab = rho^2 [t_a = t_b] + n_ab / (a b),   n_ab = #{(l, l'): l <= a, l' <= b, t_l = t_l'},

and for distinct tokens K_ab = rho^2 [a = b] + 1/max(a, b). The expected cosines are ordered
perfectly for every rho; what fades the pattern is noise: at finite width d, the empirical
Gram matrix scatters around K. Treating the d coordinates as i.i.d. Gaussian with covariance
K/d gives Cov(G_ab, G_ce) = (K_ac K_be + K_ae K_bc)/d, and a first-order (delta-method)
expansion of C_kj - C_ki turns each comparison of the adjacency score into a probability
Phi(mean / std). ``predicted_score`` averages those probabilities exactly as the metric averages
its comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

LN_EPS = 1e-5  # torch.nn.LayerNorm's default epsilon, used by every LayerNorm of the model


def check_positive_int(name: str, value: int) -> None:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def positions(T: int) -> np.ndarray:
    check_positive_int("T", T)
    return np.arange(1, T + 1, dtype=np.float64)


def uniform_cosine_matrix(T: int) -> np.ndarray:
    """Expected cosine of uniform-attention outputs, sqrt(min(i,j)/max(i,j)): [T, T]."""
    p = positions(T)
    return np.sqrt(np.minimum.outer(p, p) / np.maximum.outer(p, p))


def expected_inner_product(T: int, s2: float = 1.0) -> np.ndarray:
    """E<a_i, a_j> = s2 / max(i, j) for i.i.d. zero-mean value vectors with E|u|^2 = s2: [T, T].

    The diagonal is E|a_k|^2 = s2 / k: Chi et al.'s 1/k shrinkage is the same formula.
    """
    p = positions(T)
    return s2 / np.maximum.outer(p, p)


def expected_sq_norm(T: int, s2: float = 1.0) -> np.ndarray:
    """E|a_k|^2 = s2 / k for k = 1..T: [T]."""
    return s2 / positions(T)


def coincidence_counts(tokens: Sequence[int]) -> np.ndarray:
    """n_ab = number of (l <= a, l' <= b) with t_l = t_l': [T, T] (1-based a, b).

    For distinct tokens n_ab = min(a, b); each repeat adds the pairs of equal tokens.
    """
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D sequence; got shape {t.shape}")
    same = (t[:, None] == t[None, :]).astype(np.float64)  # [T, T]
    return same.cumsum(0).cumsum(1)


def averaged_gram(tokens: Sequence[int], window: int | None = None) -> np.ndarray:
    """E<a_a, a_b> / s^2 = n_ab / (a b) when equal tokens share a value vector: [T, T].

    With ``window`` W, a_k averages the last min(k, W) value vectors (sliding-window
    attention): n_ab counts the equal pairs within the two windows, over min(a, W) min(b, W).
    """
    n = coincidence_counts(tokens)
    p = positions(n.shape[0])
    if window is None:
        return n / np.outer(p, p)
    check_positive_int("window", window)
    W = int(window)
    # pairs in (a-W, a] x (b-W, b]: the 2-D prefix sums n, differenced W back on each axis
    pad = np.zeros((n.shape[0] + W, n.shape[1] + W))
    pad[W:, W:] = n
    inside = pad[W:, W:] - pad[:-W, W:] - pad[W:, :-W] + pad[:-W, :-W]
    width = np.minimum(p, W)
    return inside / np.outer(width, width)


def residual_gram(tokens: Sequence[int], rho: float, window: int | None = None) -> np.ndarray:
    """Expected Gram matrix of h_k = e_{t_k} + a_k in units of s^2: [T, T].

    rho = |e| / |u|: the embedding norm over the norm of one (projected) value vector;
    ``window`` as in ``averaged_gram``.
    """
    if not (rho >= 0 and math.isfinite(rho)):
        raise ValueError(f"rho={rho!r} must be a finite number >= 0")
    t = np.asarray(tokens)
    return rho**2 * (t[:, None] == t[None, :]) + averaged_gram(tokens, window)


def residual_cosine(i: np.ndarray | int, j: np.ndarray | int, rho: float) -> np.ndarray:
    """Expected cosine of h_i and h_j for distinct tokens (large d), 1-based positions.

    cos = (1/max) / sqrt((rho^2 + 1/i)(rho^2 + 1/j)) for i != j, and 1 for i == j; at rho = 0
    it is sqrt(min/max), and it falls like 1/(rho^2 max) for large rho.
    """
    i, j = np.asarray(i, dtype=np.float64), np.asarray(j, dtype=np.float64)
    if np.any(i < 1) or np.any(j < 1):
        raise ValueError("positions i, j are 1-based and must be >= 1")
    off = (1 / np.maximum(i, j)) / np.sqrt((rho**2 + 1 / i) * (rho**2 + 1 / j))
    return np.where(i == j, 1.0, off)


def simulate_averaged(n_draws: int, T: int, d: int, seed: int = 0, mean: float = 0.0,
                      tokens: Sequence[int] | None = None) -> np.ndarray:
    """Monte Carlo of uniform causal attention: a_k = mean of u_1..u_k, [n_draws, T, d].

    Each u has i.i.d. N(mean, 1/d) coordinates (E|u|^2 = 1 when mean = 0). With ``tokens``,
    equal tokens share one value vector, as they do in a model.
    """
    for name, value in (("n_draws", n_draws), ("T", T), ("d", d)):
        check_positive_int(name, value)
    rng = np.random.default_rng(seed)
    if tokens is None:
        u = rng.normal(mean, 1 / math.sqrt(d), size=(n_draws, T, d))
    else:
        t = np.asarray(tokens)
        if t.shape != (T,):
            raise ValueError(f"tokens must have length T={T}; got shape {t.shape}")
        _, ids = np.unique(t, return_inverse=True)
        table = rng.normal(mean, 1 / math.sqrt(d), size=(n_draws, ids.max() + 1, d))
        u = table[:, ids]  # [n_draws, T, d]
    return u.cumsum(axis=1) / positions(T)[None, :, None]


def inner_products_at_distance(n_draws: int, T: int, d: int, k0: int, seed: int = 0
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Monte Carlo of the paper's inequality in row k0 (1-based): ``simulate_averaged`` draws
    of i.i.d. value vectors, and for each distance t = 1..T-k0 the inner product
    <a_k0, a_k0+t>, whose expectation is 1/(k0 + t).

    Returns (t [T-k0]; the mean over draws [T-k0] and its standard error; the fraction of
    draws in which the adjacent inner product beats the one at distance t, for t >= 2
    [T-k0-1]).
    """
    if not 1 <= k0 < T:
        raise ValueError(f"k0={k0!r} must lie in 1..T-1 (T={T!r})")
    mc = simulate_averaged(n_draws, T, d, seed=seed)  # [draws, T, d]
    G = np.einsum("ntd,nsd->nts", mc, mc)  # [draws, T, T]
    t = np.arange(1, T - k0 + 1)
    inner = G[:, k0 - 1, k0 - 1 + t]  # [draws, t]: <a_k0, a_k0+t>
    mean, se = inner.mean(0), inner.std(0) / math.sqrt(n_draws)
    wins = (G[:, k0 - 1, k0][:, None] > inner[:, 1:]).mean(0)  # adjacent beats t >= 2
    return t, mean, se, wins


def value_scale(sigma: float | np.ndarray, s_inf: float, eps: float = LN_EPS) -> np.ndarray:
    """Norm of one projected value vector for embedding std sigma:
    s_inf sigma / sqrt(sigma^2 + eps).

    ln_1 divides by sqrt(var + eps), so for sigma^2 >> eps the value vectors do not depend on
    sigma (s = s_inf); for sigma^2 ~ eps = 1e-5 (sigma ~ 3e-3) and below they shrink with it.
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    return s_inf * sigma / np.sqrt(sigma**2 + eps)


def embedding_ratio(
    sigma: float | np.ndarray, s_inf: float, d: int, eps: float = LN_EPS
) -> np.ndarray:
    """rho = |e| / |u| = sigma sqrt(d) / value_scale(sigma): the residual's token term over the
    averaged term's per-token scale. It tends to sqrt(d eps)/s_inf as sigma -> 0, not to 0."""
    check_positive_int("d", d)
    return np.asarray(sigma, dtype=np.float64) * math.sqrt(d) / value_scale(sigma, s_inf, eps)


@lru_cache(maxsize=64)
def all_triples(T: int) -> np.ndarray:
    """All comparisons (k, i, j) of the adjacency score, i < j < k, k >= 2 (0-based): [N, 3].

    Cached per T and shared between callers: read it, do not write to it."""
    return np.array([(k, i, j) for k in range(2, T) for j in range(k) for i in range(j)],
                    dtype=np.int64)


def predicted_row_scores(tokens: Sequence[int], rho: float, d: int) -> np.ndarray:
    """Gaussian-approximate adjacency row scores of h_k = e_{t_k} + a_k: [T], NaN for rows 0, 1.

    Each comparison (k; i < j) counts with P(C_kj > C_ki) (``comparison_probabilities``).
    """
    check_positive_int("d", d)
    return gram_row_scores(residual_gram(tokens, rho), d)


def gram_row_scores(K: np.ndarray, d: int, common: float = 0.0) -> np.ndarray:
    """Gaussian-approximate adjacency row scores of states with expected Gram matrix K [T, T]
    and a shared vector of squared norm ``common`` at width d: [T], NaN for rows 0, 1. Each
    comparison (k; i < j) counts with P(C_kj > C_ki) (``comparison_probabilities``)."""
    T = K.shape[0]
    if T < 3:
        raise ValueError(f"tokens must have length >= 3 (rows k >= 2 have earlier pairs); got {T}")
    idx = all_triples(T)  # [N, 3] as (k, i, j)
    p = comparison_probabilities(K, idx, d, common)  # [N]
    rows = np.full(T, np.nan)
    pairs = np.arange(2, T) * np.arange(1, T - 1) / 2  # C(k, 2) comparisons in row k
    rows[2:] = np.bincount(idx[:, 0], weights=p, minlength=T)[2:] / pairs
    return rows


def predicted_score(token_seqs: Sequence[Sequence[int]], rho: float, d: int) -> float:
    """Mean predicted adjacency score over sequences (each the mean of its rows k >= 2)."""
    if len(token_seqs) == 0:
        raise ValueError("token_seqs must hold at least one sequence")
    return float(np.mean([np.nanmean(predicted_row_scores(t, rho, d)) for t in token_seqs]))


def predict_layer1_score(token_seqs: Sequence[Sequence[int]], sigma: float, s_inf: float, d: int,
                         eps: float = LN_EPS) -> float:
    """Predicted layer-1 adjacency score of a random model whose token embedding has std sigma.

    s_inf is the norm of one projected value vector when sigma^2 >> eps (measure it with
    ``measure_value_scale``); the prediction needs no other measurement.
    """
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma={sigma!r} must be a positive finite number")
    return predicted_score(token_seqs, float(embedding_ratio(sigma, s_inf, d, eps)), d)


def sigma_at_level(sigmas: Sequence[float], scores: Sequence[float], level: float = 0.75) -> float:
    """The sigma where a decreasing score curve first crosses ``level``, interpolated in log sigma.

    Returns NaN if the curve never crosses it on the grid.
    """
    x, y = np.log(np.asarray(sigmas, dtype=np.float64)), np.asarray(scores, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or np.any(np.diff(x) <= 0):
        raise ValueError("sigmas must be increasing, with one score each, at least two points")
    for n in range(x.size - 1):
        if y[n] >= level > y[n + 1]:
            f = (y[n] - level) / (y[n] - y[n + 1])
            return float(np.exp(x[n] + f * (x[n + 1] - x[n])))
    return float("nan")


def gram_cosine(K: np.ndarray) -> np.ndarray:
    """The cosine matrix of a Gram matrix K [T, T]: K_ij / sqrt(K_ii K_jj)."""
    return K / np.sqrt(np.outer(np.diag(K), np.diag(K)))


def repeat_aware_cosine(token_seqs: Sequence[Sequence[int]]) -> np.ndarray:
    """Expected cosine of the averaged terms with each sequence's repeats counted,
    n_ab / sqrt(n_aa n_bb) (``gram_cosine`` of ``averaged_gram``), mean over sequences of one
    length T: [T, T]. For distinct tokens it is ``uniform_cosine_matrix(T)``."""
    return np.mean([gram_cosine(averaged_gram(t)) for t in token_seqs], axis=0)


def mean_self_coincidences(token_seqs: Sequence[Sequence[int]]) -> np.ndarray:
    """n_kk, the pairs of equal tokens among positions 1..k (k for distinct tokens), mean over
    sequences of one length T: [T]. Under uniform attention |a_k|^2 = s^2 n_kk / k^2."""
    return np.mean([np.diag(coincidence_counts(t)) for t in token_seqs], axis=0)


def predicted_rows(token_seqs: Sequence[Sequence[int]], sigma: float, s_inf: float,
                   d: int) -> np.ndarray:
    """Predicted layer-1 row scores of rows k = 2..T-1, averaged over sequences of one length T
    (a random model with embedding std sigma): [T - 2]."""
    rho = float(embedding_ratio(sigma, s_inf, d))
    return np.mean([predicted_row_scores(t, rho, d)[2:] for t in token_seqs], axis=0)


# ---------------------------------------------------------------------------------------------
# exact scores of the embedding alone, and the comparisons behind every predicted score

def layer0_expected_score(tokens: Sequence[int]) -> float:
    """Exact expected adjacency score of i.i.d. continuous token embeddings alone (layer 0, or
    any sigma where the embedding swamps the averaged term), mean over rows k >= 2.

    A comparison (k; i < j) of three distinct tokens is in order with probability 1/2 (the
    draws of t_i and t_j are exchangeable); t_j = t_k != t_i is always in order (cosine 1);
    t_i = t_k, and t_i = t_j (an exact tie, which the metric counts as not in order), never.
    """
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"tokens must be a 1-D sequence of length >= 3; got shape {t.shape}")
    idx = all_triples(t.size)  # [N, 3] as (k, i, j)
    tk, ti, tj = t[idx[:, 0]], t[idx[:, 1]], t[idx[:, 2]]
    p = np.where((ti != tj) & (ti != tk) & (tj != tk), 0.5, 0.0) + ((tj == tk) & (ti != tk))
    k = idx[:, 0]
    pairs = np.arange(2, t.size) * np.arange(1, t.size - 1) / 2  # C(k, 2) per row
    return float(np.mean(np.bincount(k, weights=p, minlength=t.size)[2:] / pairs))


def comparison_probabilities(K: np.ndarray, triples: np.ndarray, d: int,
                             common: float = 0.0) -> np.ndarray:
    """P(C_kj > C_ki) for each comparison (k, i, j) of triples [N, 3] (0-based): [N].

    K [T, T] is the covariance Gram matrix of the position-dependent states (``residual_gram``)
    and ``common`` the squared norm of a vector shared by every position, both in units of s^2.
    D = C_kj - C_ki is expanded to first order in the Gram fluctuations around K + common; with
    W = dD/dG (symmetric, 3 x 3) and w = W 1 its variance is
    (2 tr(W K W K) + 4 common w'Kw) / d (the d coordinates as i.i.d. Gaussian).
    """
    check_positive_int("d", d)
    if not (common >= 0 and math.isfinite(common)):
        raise ValueError(f"common={common!r} must be a finite number >= 0")
    Kc = K[triples[:, :, None], triples[:, None, :]]  # [N, 3, 3] covariance on (k, i, j)
    S = Kc + common  # [N, 3, 3] mean Gram
    kk, ii, jj = S[:, 0, 0], S[:, 1, 1], S[:, 2, 2]
    c_ki = S[:, 0, 1] / np.sqrt(kk * ii)
    c_kj = S[:, 0, 2] / np.sqrt(kk * jj)
    W = np.zeros_like(S)  # dD/dG, symmetrised
    W[:, 0, 1] = W[:, 1, 0] = -0.5 / np.sqrt(kk * ii)
    W[:, 0, 2] = W[:, 2, 0] = 0.5 / np.sqrt(kk * jj)
    W[:, 0, 0] = -(c_kj - c_ki) / (2 * kk)
    W[:, 1, 1] = c_ki / (2 * ii)
    W[:, 2, 2] = -c_kj / (2 * jj)
    M = W @ Kc  # [N, 3, 3]
    w = W.sum(axis=2)  # [N, 3]
    var = (2 * np.einsum("nab,nba->n", M, M)
           + 4 * common * np.einsum("na,nab,nb->n", w, Kc, w)) / d
    z = (c_kj - c_ki) / np.sqrt(np.maximum(var, 1e-300))
    return torch.special.ndtr(torch.from_numpy(z)).numpy()
