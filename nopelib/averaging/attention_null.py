"""The averaging chapter's attention checks from the theory alone: their null, the large-sigma limit.

The null distribution of the chapter's attention-output statistics when causal attention is
exactly uniform (``null_attention_checks``), the variance of the attention logits at
initialisation, and the shrinkage of the pattern it predicts (``predicted_shrinkage``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from nopelib.averaging.theory import (LN_EPS, positions, check_positive_int, mean_self_coincidences,
                                      repeat_aware_cosine, uniform_cosine_matrix)


def _layer_norm_rows(z: np.ndarray) -> np.ndarray:
    """LayerNorm at init (weight 1, bias 0) of the last axis, as ln_1 applies it."""
    z = z - z.mean(-1, keepdims=True)
    return z / np.sqrt(z.var(-1, keepdims=True) + LN_EPS)


def null_attention_checks(token_seqs: Sequence[Sequence[int]], n_models: int, d: int,
                          n_rep: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
    """Null distributions of the chapter's attention-output statistics under the theory alone.

    Each replicate draws ``n_models`` models' worth of exactly uniform causal attention whose
    value vectors are those of a random model at init: u = W_O W_V LN(e) with independent
    Gaussian W_V, W_O (their scales cancel in cosines and in the relative variance) and one
    Gaussian embedding per token, shared by all sequences of one model, as a real model shares
    its table. The u are therefore not isotropic: the product of two square Gaussian matrices
    has E tr(S^2) / (tr S)^2 = 3/d, so each cosine scatters sqrt(3) times more than for i.i.d.
    vectors. Each replicate averages over models and sequences (all of one length T) the
    statistics the chapter computes from real models:

    {"cos_mean": [T, T] the expected mean cosine matrix (mean over replicates), "cos_sd":
    [T, T] its sampling sd (over replicates), "dev_repeat": [n_rep] its largest
    |deviation| from the repeat-aware closed form (mean of ``gram_cosine(averaged_gram)``),
    "dev_ideal": [n_rep] the same from sqrt(min/max), "var_rel": [n_rep] the largest relative
    deviation of the mean feature variance from var_1 n_kk / k^2, "slope": [n_rep] its log-log
    slope, "shrink": [n_rep] the mean relative shortfall of the adjacent cosines C[k, k+1]
    below "cos_mean", 0 on average: the null of the shrinkage that non-uniform attention
    causes, read where the null scatters least}.
    """
    check_positive_int("n_models", n_models)
    check_positive_int("n_rep", n_rep)
    check_positive_int("d", d)
    lengths = sorted({len(t) for t in token_seqs})
    if len(lengths) != 1 or lengths[0] < 3:
        raise ValueError(f"token_seqs must be sequences of one length >= 3; got lengths {lengths}")
    seqs = np.asarray(token_seqs)
    B, T = seqs.shape
    _, ids = np.unique(seqs, return_inverse=True)
    ids = ids.reshape(B, T)
    V = int(ids.max()) + 1
    k = positions(T)
    repeat_C = repeat_aware_cosine(seqs)  # [T, T]
    ideal_C = uniform_cosine_matrix(T)
    n_kk = mean_self_coincidences(seqs)  # [T]
    rng = np.random.default_rng(seed)
    cos_reps = np.empty((n_rep, T, T))
    out = {"dev_repeat": np.empty(n_rep),
           "dev_ideal": np.empty(n_rep), "var_rel": np.empty(n_rep), "slope": np.empty(n_rep)}
    for r in range(n_rep):
        cos_sum, var_sum = np.zeros((T, T)), np.zeros(T)
        for _ in range(n_models):
            u = _layer_norm_rows(rng.standard_normal((V, d)))  # [V, d] LN(e)
            for _ in range(2):  # u <- u W with W Gaussian d x d: W_V, then W_O
                # the columns of u W are i.i.d. N(0, u u^T): a V x V draw replaces a d x d one
                u = np.linalg.cholesky(u @ u.T) @ rng.standard_normal((V, d))
            a = u[ids].cumsum(axis=1) / k[None, :, None]  # [B, T, d]
            unit = a / np.linalg.norm(a, axis=-1, keepdims=True)
            cos_sum += np.einsum("btd,bsd->ts", unit, unit)
            var_sum += a.var(axis=-1).sum(0)
        C, var_k = cos_sum / (n_models * B), var_sum / (n_models * B)
        law = var_k[0] * n_kk / k**2
        cos_reps[r] = C
        out["dev_repeat"][r] = np.abs(C - repeat_C).max()
        out["dev_ideal"][r] = np.abs(C - ideal_C).max()
        out["var_rel"][r] = np.abs(var_k / law - 1).max()
        out["slope"][r] = np.polyfit(np.log(k), np.log(var_k), 1)[0]
    cos_mean = cos_reps.mean(0)
    adj = np.arange(T - 1)
    out["shrink"] = 1 - (cos_reps[:, adj, adj + 1] / cos_mean[adj, adj + 1]).mean(1)
    return {"cos_mean": cos_mean, "cos_sd": cos_reps.std(0, ddof=1), **out}


def attention_logit_variance(d: int, init_std: float = 0.02) -> float:
    """Variance over keys of block 1's attention logits q.k/sqrt(d_h) at init: (init_std^2 d)^2.

    LN(e) has unit-variance features, so q and k have entries of variance init_std^2 d; for a
    fixed query, q.k_m / sqrt(d_h) over keys m has variance |q|^2 init_std^2 d / d_h, and
    E|q|^2 = d_h init_std^2 d. The head size cancels.
    """
    check_positive_int("d", d)
    return (init_std**2 * d) ** 2


def predicted_shrinkage(T: int, logit_var: float) -> float:
    """Mean relative shrinkage of the adjacent cosines C[k, k+1] (k = 1..T-1) below uniform
    attention, from the attention logits' variance v over keys (``attention_logit_variance``).

    The weights p_km ~ e^l_km scatter around 1/k with relative variance v (1 - 1/k), one draw
    per query, so |a_k|^2 grows by g_k = 1 + v (1 - 1/k) while E<a_i, a_j> does not, and
    C[k, k+1] shrinks by the factor (g_k g_{k+1})^(-1/2).
    """
    check_positive_int("T", T)
    if not (logit_var >= 0 and math.isfinite(logit_var)):
        raise ValueError(f"logit_var={logit_var!r} must be a finite number >= 0")
    k = np.arange(1, T + 1)
    grow = 1 + logit_var * (1 - 1 / k)  # [T] growth of |a_k|^2, 1-based k
    return float(np.mean(1 - 1 / np.sqrt(grow[:-1] * grow[1:])))
