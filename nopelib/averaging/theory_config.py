"""The layer-1 score of any configuration, predicted from its initialisation alone.

The layer-1 score of any configuration from its initialisation alone: the averaging
theory's closed forms (``nopelib.averaging.theory``) fed with the scales a configuration's init
gives, and the comparison probabilities with a common embedding mean. No model is built or run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nopelib.averaging.theory import (LN_EPS, check_positive_int, comparison_probabilities,
                                      embedding_ratio, gram_row_scores, residual_gram, value_scale)

if TYPE_CHECKING:  # the closed forms read a configuration's fields; they build no model
    from nopelib.core.model import GPTConfig


# The layer-1 score of any configuration from the initialisation alone (no measured number)
#
# One token's value vector is u = W_P W_V LN_1(e). LN_1(e) has norm sqrt(d) sigma_e /
# sqrt(sigma_e^2 + eps) and no common mean (LayerNorm removes it); W_V (std sigma_V) scales a
# norm by sigma_V sqrt(d), and c_proj (std sigma_P / sqrt(2L)) by sigma_P sqrt(d / (2L)). So
#     s_inf = sigma_V sigma_P d^{3/2} / sqrt(2L),  rho = sigma_e sqrt(2L) / (sigma_V sigma_P d)
# for sigma_e^2 >> eps. A mean mu of the embedding stays in the residual stream as the vector
# mu 1, the same at every position, of squared norm mu^2 d: in units of s^2 it adds the
# constant M = mu^2 d / s^2 to every entry of the mean Gram matrix, and M times sums of K to
# the covariance of its fluctuations (``comparison_probabilities``).


def init_scales(config: GPTConfig) -> dict[str, float]:
    """Standard deviations and mean of the weights that set block 1's scales.

    {"sigma_e": token embedding std, "mu": its mean, "sigma_v": W_V's std, "sigma_p": c_proj's
    std before nanoGPT's 1/sqrt(2L), "sigma_qk": W_Q's and W_K's std}. Raises for a nonzero mean
    of every weight (init_target "all"), which the closed forms do not reach.
    """
    if config.init_target == "embedding":
        return {"sigma_e": config.init_std, "mu": config.init_mean, "sigma_v": 0.02,
                "sigma_p": 0.02, "sigma_qk": 0.02}
    if config.init_mean != 0.0:
        raise ValueError(f"init_mean={config.init_mean!r} with init_target='all': a mean on "
                         "every weight is outside the closed forms (allowed: init_mean=0, or "
                         "init_target='embedding')")
    s = config.init_std
    return {"sigma_e": s, "mu": 0.0, "sigma_v": s, "sigma_p": s, "sigma_qk": s}


def attention_logit_scale(config: GPTConfig) -> float:
    """Std of block 1's attention logits, sigma_qk^2 d: q and k have coordinates of std
    sigma_qk sqrt(d), and q.k / sqrt(d_head) sums d_head of their products. Attention is near
    uniform, as the averaging effect assumes, while this is well below 1."""
    return init_scales(config)["sigma_qk"] ** 2 * config.n_embd


def closed_form_value_scale(config: GPTConfig) -> float:
    """s_inf of block 1 from the initialisation alone: sigma_V sigma_P d^{3/2} / sqrt(2L)."""
    sc = init_scales(config)
    return sc["sigma_v"] * sc["sigma_p"] * config.n_embd**1.5 / math.sqrt(2 * config.n_layer)


def closed_form_ratio(config: GPTConfig, eps: float = LN_EPS) -> float:
    """rho = |e| / |u| of block 1 from the initialisation alone (``embedding_ratio`` with the
    closed-form s_inf); sigma_e sqrt(2L) / (sigma_V sigma_P d) when sigma_e^2 >> eps."""
    sigma = init_scales(config)["sigma_e"]
    return float(embedding_ratio(sigma, closed_form_value_scale(config), config.n_embd, eps))


def sample_triples(T: int, n: int, seed: int = 0) -> np.ndarray:
    """n comparisons (k, i, j), i < j < k, 0-based: k uniform over rows 2..T-1, the pair uniform
    within the row, so their mean estimates the score's mean of row means: [n, 3]."""
    check_positive_int("n", n)
    if T < 3:
        raise ValueError(f"T={T!r} must be >= 3 (rows k >= 2 have earlier pairs)")
    rng = np.random.default_rng(seed)
    k = rng.integers(2, T, size=n)
    a = rng.integers(0, k)
    b = rng.integers(0, k - 1)
    b = b + (b >= a)  # a second position, distinct from a
    return np.stack([k, np.minimum(a, b), np.maximum(a, b)], axis=1)


def comparison_model(config: GPTConfig) -> tuple[float, float]:
    """The residual-stream model of block 1 for ``config``, from the configuration alone:
    (rho, the common vector's squared norm in units of s^2), as ``comparison_probabilities``
    takes them (its width is n_embd). Raises where attention is far from uniform (logit std
    above 1), outside the averaging effect, or where ``init_scales`` does not reach."""
    logits = attention_logit_scale(config)
    if logits > 1.0:
        raise ValueError(f"init_std={config.init_std!r}, n_embd={config.n_embd!r}: attention "
                         f"logits of std {logits:.3g} (> 1) are far from uniform, outside the "
                         "averaging effect")
    sc = init_scales(config)
    s = float(value_scale(sc["sigma_e"], closed_form_value_scale(config)))
    return closed_form_ratio(config), sc["mu"] ** 2 * config.n_embd / s**2


def predict_config_score(config: GPTConfig, token_seqs: Sequence[Sequence[int]],
                         max_triples: int = 200_000, seed: int = 0,
                         window: int | None = None) -> float:
    """Predicted layer-1 adjacency score of a random model of ``config``, mean over sequences.

    Everything comes from the configuration: rho from ``closed_form_ratio``, the common vector
    from the embedding mean, the width d; no score or activation is measured. Each sequence's
    score is the mean of its row scores, computed over every comparison when there are at most
    ``max_triples`` of them and estimated from ``max_triples`` sampled ones otherwise. Deeper
    layers are outside the model (it describes block 1 only). ``window``: sliding-window
    attention (``theory.averaged_gram``). Raises where the closed forms do not reach
    (``comparison_model``).
    """
    if len(token_seqs) == 0:
        raise ValueError("token_seqs must hold at least one sequence")
    rho, common = comparison_model(config)
    d = config.n_embd
    scores = []
    for n, tokens in enumerate(token_seqs):
        T = len(tokens)
        if T < 3:
            raise ValueError(f"token_seqs[{n}] has length {T}; need >= 3")
        K = residual_gram(tokens, rho, window)
        if T * (T - 1) * (T - 2) // 6 <= max_triples:
            scores.append(np.mean(gram_row_scores(K, d, common)[2:]))
        else:
            idx = sample_triples(T, max_triples, seed=seed + n)
            scores.append(comparison_probabilities(K, idx, d, common).mean())
    return float(np.mean(scores))
