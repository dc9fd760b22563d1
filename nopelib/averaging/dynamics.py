"""Block 1 through the averaging theory while a model trains: what moves, and the score predicted.

What block 1 looks like to the averaging theory while a model trains: the quantities that can
take the layer-1 pattern away, measured on the model, and the layer-1 score the theory
predicts from them.

At initialisation (``nopelib.averaging.theory``) the layer-1 residual is h_k = e_{t_k} + a_k with
a_k the uniform average of the value vectors of positions 1..k, and the pattern fades only when the
token embedding is large next to one value vector (rho = |e| / |u|). Training can move every
ingredient of that picture, and each one is measured here on the very tokens scored:

- ``rho``: the root mean square of the token embeddings e_t over that of the projected value
  vectors u_t (block 1's value vector of the token, through the output projection and its
  bias, summed over heads), both over every position of the inputs;
- ``value_common`` and ``embedding_common``: the share of one direction shared by the
  value vectors of the distinct tokens, |m|^2 / mean |u|^2 for u_t = m + z_t (likewise for
  e), estimated without the bias of a mean over few tokens (``common_share``); about 0 for
  i.i.d. zero-mean vectors;
- ``entropy``: block 1's attention entropy at query position k over log k (1: uniform, the
  averaging the theory assumes; 0: all weight on one key), averaged over heads, positions
  k >= 2 and inputs;
- ``value_axis`` and ``embedding_axis``: the share of the distinct tokens' centred value
  vectors (embeddings) on their leading axis (``axis_share``): about 1 / n for i.i.d.
  vectors, 1 when the alphabet lies on one line, a structure the theory's i.i.d. value
  vectors leave out (it is not a shared direction: the mean is removed first);
- the attention weights themselves, per head;
- ``score_without_mlp``: the layer-1 score of e_t + block 1's attention output alone, the
  residual the theory describes (the chapter's layer-1 score adds block 1's MLP).

In block 1 a value vector depends on its token alone (no position encoding, and block 1's
input is the embedding), so equal tokens share one. Writing u_t = m + z_t and e_t = ebar +
f_t, with the z_t (and f_t) of distinct tokens uncorrelated, the expected Gram matrix of the
h_k in units of E|u|^2 is

    K_ab = rho^2 (1 - embedding_common) [t_a = t_b] + (1 - value_common) mean_h (A_h S A_h')_ab

plus a vector shared by every position of squared norm value_common + rho^2 embedding_common,
with A_h head h's attention [T, T] and S_lm = [t_l = t_m]. Uniform A, no shared direction and
the init's rho give back ``theory.residual_gram``. The score is then predicted as
``theory.predicted_score`` does it (``theory.comparison_probabilities`` at width d). Nothing is
fitted: each quantity is measured once, and the MLP of block 1, as in the theory, is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from nopelib.averaging.theory import gram_row_scores
from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.core.model import GPT
from nopelib.core.tasks import encode, encode_inputs


@dataclass(frozen=True)
class Block1:
    """Block 1 of one model on a set of inputs, as the averaging theory reads it."""

    rho: float  # RMS token embedding over RMS projected value vector
    value_common: float  # share of a direction the distinct tokens' u share (common_share)
    embedding_common: float  # the same of their embeddings e
    entropy: float  # attention entropy over log k, mean over heads, rows k >= 2, inputs
    value_axis: float  # share of the distinct tokens' centred u on their leading axis
    embedding_axis: float  # the same of their centred embeddings
    score_without_mlp: float  # layer-1 score of e + block 1's attention output (no MLP)
    embedding_rms: float  # RMS norm of the token embeddings
    value_rms: float  # RMS norm of the projected value vectors

    def record(self) -> dict[str, float]:
        """The quantities as plain floats (a curve point's fields)."""
        return {k: float(v) for k, v in asdict(self).items()}


def _check_texts(texts: Sequence[str]) -> None:
    if not texts or any(len(t) < 3 for t in texts):
        raise ValueError("texts must hold at least one input, each of 3 or more characters "
                         "(row k >= 2 of the score needs two earlier positions)")


@torch.no_grad()
def value_vectors(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Block 1's projected value vector of every position, per head: [B, H, T, C], so that
    block 1's attention output at position k is sum_h sum_l A_h[k, l] u_h[l] (its output
    projection's bias shared equally by the heads, since every row of A sums to 1)."""
    block = model.transformer.h[0]
    attn = block.attn
    x = model.transformer.wte(idx)  # [B, T, C]: block 1's input, no position encoding
    v = attn.c_attn(block.ln_1(x)).split(attn.n_embd, dim=2)[2]  # [B, T, C]
    B, T, C = v.shape
    H, hs = attn.n_head, C // attn.n_head
    W = attn.c_proj.weight  # [C_out, C_in]
    heads = torch.stack([v[..., h * hs:(h + 1) * hs] @ W[:, h * hs:(h + 1) * hs].T
                         for h in range(H)], dim=1)  # [B, H, T, C]
    if attn.c_proj.bias is not None:
        heads = heads + attn.c_proj.bias / H
    return heads


def common_share(vectors: torch.Tensor) -> float:
    """The share of a direction shared by the rows of ``vectors`` [n, C] (one row per distinct
    token), |m|^2 / mean |v|^2 for v = m + z with zero-mean z: estimated without the bias
    1/n that the mean of n vectors carries (|mean v|^2 - mean |v - mean v|^2 / (n - 1)), so
    i.i.d. zero-mean rows read about 0 whatever n; clipped to [0, 1]."""
    n = vectors.shape[0]
    if n < 2:
        raise ValueError(f"common_share needs two or more distinct tokens; got {n}")
    mean = vectors.mean(0)
    spread = (vectors - mean).pow(2).sum(-1).mean()
    shared = mean.pow(2).sum() - spread / (n - 1)
    return float((shared / vectors.pow(2).sum(-1).mean()).clamp(0.0, 1.0))


def axis_share(vectors: torch.Tensor) -> float:
    """The share of the spread of ``vectors`` [n, C] (one row per distinct token, centred on
    their mean) along its leading axis: the top singular value squared over the sum of all.
    About 1 / min(n, C) spread evenly for i.i.d. rows; 1 when the tokens lie on one line (a
    structure the theory's i.i.d. value vectors exclude, whatever the shared direction)."""
    if vectors.shape[0] < 2:
        raise ValueError(f"axis_share needs two or more distinct tokens; got {vectors.shape[0]}")
    sv = torch.linalg.svdvals((vectors - vectors.mean(0)).double())
    return float(sv[0] ** 2 / sv.pow(2).sum())


@torch.no_grad()
def measure_block1(model: GPT, texts: Sequence[str]) -> tuple[Block1, list[np.ndarray]]:
    """Block 1 of ``model`` on ``texts``: its ``Block1`` quantities and, per input, the
    attention weights of every head on that input's own positions ([H, T_i, T_i]). Computed in
    eval mode, the model's mode restored."""
    _check_texts(texts)
    if model.config.pos_encoding != "none":
        raise ValueError(f"pos_encoding={model.config.pos_encoding!r}: the averaging theory "
                         "reads NoPE models only ('none')")
    was_training = model.training
    model.eval()
    idx, lengths = encode_inputs(list(texts))  # [B, T], [B]
    real = torch.arange(idx.shape[1])[None, :] < lengths[:, None]  # [B, T]
    e = model.transformer.wte(idx)[real].float()  # [N, C], every real position
    u = value_vectors(model, idx).sum(1)[real].float()  # [N, C]
    A = model.attention_weights(idx)[0].float()  # [B, H, T, T]: block 1
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"]
    _, cache = model.run_with_cache(idx, names, "explicit")
    without_mlp = (cache[names[0]] + cache[names[1]]).float()  # [B, T, C]
    model.train(was_training)
    score_without_mlp = float(np.mean([
        adjacency_score(cosine_similarity_matrix(without_mlp[b, :n]))
        for b, n in enumerate(lengths.tolist())]))
    k = torch.arange(1, idx.shape[1] + 1, dtype=torch.float32)  # keys seen by row k - 1
    plogp = torch.where(A > 0, A * A.clamp_min(1e-30).log(), torch.zeros(()))
    rel = -plogp.sum(-1) / k.log().clamp_min(1e-30)  # [B, H, T]; rows 0, 1 read below
    rows = real & (torch.arange(idx.shape[1])[None, :] >= 2)  # [B, T]
    entropy = float(rel.mean(1)[rows].mean())
    e_rms, u_rms = (float(t.pow(2).sum(-1).mean().sqrt()) for t in (e, u))
    tokens = idx[real]  # [N]
    first = [int((tokens == t).nonzero()[0]) for t in tokens.unique()]  # one row per token
    block = Block1(rho=e_rms / u_rms, value_common=common_share(u[first]),
                   embedding_common=common_share(e[first]), entropy=entropy,
                   value_axis=axis_share(u[first]), embedding_axis=axis_share(e[first]),
                   score_without_mlp=score_without_mlp,
                   embedding_rms=e_rms, value_rms=u_rms)
    patterns = [A[b, :, :n, :n].numpy().astype(np.float64)
                for b, n in enumerate(lengths.tolist())]
    return block, patterns


def residual_gram_measured(tokens: Sequence[int], attention: np.ndarray,
                           block: Block1) -> tuple[np.ndarray, float]:
    """The expected Gram matrix K [T, T] of the layer-1 residual of one input (module
    docstring), in units of E|u|^2, and the squared norm of the shared vector."""
    t = np.asarray(tokens)
    T = t.size
    if attention.ndim != 3 or attention.shape[1:] != (T, T):
        raise ValueError(f"attention must be [H, {T}, {T}] for {T} tokens; got "
                         f"{attention.shape}")
    S = (t[:, None] == t[None, :]).astype(np.float64)  # [T, T]
    averaged = np.mean(attention @ S @ attention.transpose(0, 2, 1), axis=0)  # [T, T]
    K = (block.rho**2 * (1 - block.embedding_common) * S
         + (1 - block.value_common) * averaged)
    common = block.value_common + block.rho**2 * block.embedding_common
    return K, float(common)


def predicted_layer1(texts: Sequence[str], patterns: Sequence[np.ndarray], block: Block1,
                     d: int) -> float:
    """The layer-1 adjacency score the theory predicts from the measured ``block`` and
    attention ``patterns`` (``measure_block1``'s), at width ``d``: the mean over inputs of
    each input's mean row score, rows k >= 2, as the metric averages."""
    _check_texts(texts)
    if len(patterns) != len(texts):
        raise ValueError(f"{len(patterns)} attention patterns for {len(texts)} texts")
    scores = []
    for text, A in zip(texts, patterns, strict=True):
        K, common = residual_gram_measured(encode(text), A, block)
        scores.append(float(gram_row_scores(K, d, common)[2:].mean()))
    return float(np.mean(scores))

