"""What a position probe reads: windows of a hidden state's features, and the states themselves.

The paper's two hypotheses as features of a token's hidden state over a window of its
neighbours: the *similarity* of nearby states (cosine features, the adjacency pattern) and
their *variance* (Chi et al.), beside the full hidden state; the random token sequences probed
and a model's states on them.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
import torch.nn.functional as F

from nopelib.core.metrics import embedding_variance
from nopelib.core.model import GPT
from nopelib.core.tasks import encode


FEATURE_SETS = ("cosine", "variance", "hidden")


def _is_count(value: object) -> bool:
    """A positive integer of any integer type (numpy's too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _check_window(states: torch.Tensor, w: int) -> None:
    if not _is_count(w):
        raise ValueError(f"w={w!r} must be a positive integer")
    if states.dim() < 3:
        raise ValueError(f"states must have shape [..., N, T, d]; got {tuple(states.shape)}")
    if states.shape[-2] <= w:
        raise ValueError(f"w={w} needs sequences longer than w; got T={states.shape[-2]}")


def window_positions(T: int, w: int) -> np.ndarray:
    """The probed positions of a length-T sequence with window w: k = w, ..., T - 1."""
    if not _is_count(w):
        raise ValueError(f"w={w!r} must be a positive integer")
    if T <= w:
        raise ValueError(f"T={T} must exceed w={w}")
    return np.arange(w, T)


def cosine_window_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """cos(h_k, h_{k-j}) for j = 1..w at positions k = w..T-1:
    [..., N, T, d] -> [..., N, T-w, w]."""
    _check_window(states, w)
    T = states.shape[-2]
    unit = F.normalize(states.float(), dim=-1)  # [..., N, T, d]
    here = unit[..., w:, :]  # [..., N, T-w, d]
    # w x [..., N, T-w]
    cols = [(here * unit[..., w - j : T - j, :]).sum(-1) for j in range(1, w + 1)]
    return torch.stack(cols, dim=-1)  # [..., N, T-w, w]


def variance_window_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """var(h_{k-j}) for j = 0..w-1 at positions k = w..T-1: [..., N, T, d] -> [..., N, T-w, w].

    The window includes position k itself (Chi et al.'s feature for k), then its w-1
    predecessors, so it has as many inputs as the cosine window."""
    _check_window(states, w)
    T = states.shape[-2]
    var = embedding_variance(states.float())  # [..., N, T]
    cols = [var[..., w - j : T - j] for j in range(w)]  # w x [..., N, T-w]
    return torch.stack(cols, dim=-1)  # [..., N, T-w, w]


def hidden_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """The hidden state h_k at the same positions k = w..T-1: [..., N, T, d] -> [..., N, T-w, d]."""
    _check_window(states, w)
    return states[..., w:, :].float()


def features(states: torch.Tensor, kind: str, w: int) -> torch.Tensor:
    """The feature set ``kind`` (one of FEATURE_SETS) at positions w..T-1: [..., N, T-w, F]."""
    fns = {"cosine": cosine_window_features, "variance": variance_window_features,
           "hidden": hidden_features}
    if kind not in fns:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {FEATURE_SETS}")
    return fns[kind](states, w)


def random_token_sequences(n: int, T: int, alphabet: str, seed: int = 0) -> torch.Tensor:
    """``n`` sequences of ``T`` characters drawn i.i.d. uniformly from ``alphabet``: ids [n, T].

    Token identity is independent of position here, so any position a probe reads must come
    from the model's computation, not from the input's format."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer")
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T={T!r} must be a positive integer")
    if not alphabet:
        raise ValueError(f"alphabet={alphabet!r} must hold at least one character")
    ids = torch.tensor(encode("".join(sorted(set(alphabet)))))
    g = torch.Generator().manual_seed(seed)
    return ids[torch.randint(len(ids), (n, T), generator=g)]  # [n, T]


@torch.no_grad()
def model_states(model: GPT, idx: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Residual stream of every layer for ids [N, T]: [n_layer + 1, N, T, d] (float32, CPU)."""
    parts = [model.hidden_states(idx[i : i + batch]).float().cpu()
             for i in range(0, len(idx), batch)]
    return torch.cat(parts, dim=1)
