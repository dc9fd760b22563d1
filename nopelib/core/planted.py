"""Planted hidden states: synthetic residual streams with the position signal where we put it.

The probes chapter compares a cosine-window probe with a variance-window probe
(``nopelib.core.probe``). A comparison that can only ever come out one way tests nothing, so the
chapter runs it first on states whose answer is known, shaped like the base model's residual
streams (``n_seq`` sequences x ``T`` positions x ``d`` = 384 features, layers 0..6):

- **layer 0** of every stack is pure noise, i.i.d. N(0, 1) in every feature at every position:
  no position anywhere (the chance control).
- ``"variance"``, position **only in the variance**: at layer l >= 1, position k holds
  g / sqrt(k + 1), g ~ N(0, I_d) drawn afresh for every position. Its norm shrinks like
  1/sqrt(k + 1), as uniform causal averaging of i.i.d. values gives, and the variance across
  its d features (what ``nopelib.core.metrics.embedding_variance`` and the variance window read)
  is 1/(k + 1) on average; its direction is uniform and independent from position to
  position, so neighbours are no more similar than distant positions and the cosine window
  carries nothing.
- ``"adjacency"``, position **only in the adjacency**: at layer l >= 1, position k holds the
  running mean of i.i.d. vectors g_0..g_k (the averaging effect: cos(a_i, a_j) ~
  sqrt(min(i, j) / max(i, j))), centred across its d features and renormalised to norm
  sqrt(d), so that its variance across features is exactly 1 at every position.
  Centring matters: the variance across features is the mean of squares minus the square of
  the mean, and the mean of a running average is itself a running average, as smooth along
  the sequence as the cosines are. Renormalising alone leaves that mean in the variance
  window, and a nonlinear probe reads position from how smoothly it varies; the centred
  vector's variance is its squared norm over d, fixed.

Every layer >= 1 of both stacks then gets fresh position-free noise, N(0, ``noise``^2) in every
feature, drawn independently at every position: it leaves each stack's signal where it was
(isotropic noise independent of position changes neither the cosine's distribution in
``"variance"`` nor the variance's in ``"adjacency"``) and keeps every feature a noisy
measurement rather than a constant. The layers >= 1 of one stack are independent draws of the
same construction: the stack has the base model's depth so that a comparison judged on it
has the same family of tests (``nopelib.rules.init_claims.probe_claims``) as the model's.
"""

from __future__ import annotations

import numbers

import torch

PLANTED = ("variance", "adjacency")  # where the position signal is planted
# the verdict of the cosine-vs-variance comparison each planted stack must give at layers >= 1
EXPECTED = {"variance": "variance", "adjacency": "cosine"}
NOISE = 0.1  # per-feature sd of the position-free noise added at every layer >= 1


def _is_count(value: object) -> bool:
    """A positive integer of any integer type (numpy's too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def planted_states(kind: str, n_seq: int, T: int, d: int = 384, n_layer: int = 6,
                   seed: int = 0, noise: float = NOISE) -> torch.Tensor:
    """Synthetic residual streams [n_layer + 1, n_seq, T, d] (float32) with position planted
    only in the variance (``kind="variance"``) or only in the adjacency (``"adjacency"``) at
    every layer >= 1, layer 0 pure noise (see the module docstring).

    ``seed`` fixes the draw; the two kinds of one seed are drawn independently of each other.
    ``noise`` is the per-feature sd of the position-free noise added at layers >= 1."""
    if kind not in PLANTED:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {PLANTED}")
    for name, value in (("n_seq", n_seq), ("T", T), ("d", d), ("n_layer", n_layer)):
        if not _is_count(value):
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if d < 2:
        raise ValueError(f"d={d} must be at least 2: a centred vector of one feature is 0")
    if not (isinstance(noise, numbers.Real) and noise >= 0):
        raise ValueError(f"noise={noise!r} must be a number >= 0")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an integer >= 0")
    g = torch.Generator().manual_seed(2 * int(seed) + PLANTED.index(kind))
    states = torch.empty(n_layer + 1, n_seq, T, d)
    states[0] = torch.randn(n_seq, T, d, generator=g)  # layer 0: no position
    count = torch.arange(1, T + 1, dtype=torch.float32)[:, None]  # [T, 1]: k + 1
    for layer in range(1, n_layer + 1):
        x = torch.randn(n_seq, T, d, generator=g)  # i.i.d. per position
        if kind == "variance":
            signal = x / count.sqrt()  # norm ~ sqrt(d / (k + 1)), random direction
        else:
            mean = x.cumsum(dim=1) / count  # running mean over positions 0..k
            mean = mean - mean.mean(dim=-1, keepdim=True)  # centred across the d features
            signal = mean * (d ** 0.5 / mean.norm(dim=-1, keepdim=True))  # norm sqrt(d)
        states[layer] = signal + noise * torch.randn(n_seq, T, d, generator=g)
    return states
