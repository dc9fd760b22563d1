"""The position encodings of the model's controls: a sinusoidal table, RoPE, ALiBi, a window.

The paper's model has none (NoPE); these give the controls position for free: a fixed
sine/cosine table added to the embedding (Vaswani et al.), rotary queries and keys (RoPE), a
linear distance penalty on the attention logits (ALiBi, Press et al.), and the band of keys a
sliding-window query sees.
"""

from __future__ import annotations

import math

import torch


def sinusoidal_table(T: int, d: int, device: torch.device | None = None) -> torch.Tensor:
    """The fixed sine/cosine position table of Vaswani et al.: [T, d]."""
    pos = torch.arange(T, device=device, dtype=torch.float32)[:, None]  # [T, 1]
    even = torch.arange(0, d, 2, device=device, dtype=torch.float32)
    freq = torch.exp(even * (-math.log(10000.0) / d))
    table = torch.zeros(T, d, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return table


def rope_rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of queries or keys x: [B, H, T, hs] -> same shape."""
    T, hs = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs))
    angles = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # [T, hs/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def alibi_bias(
    n_head: int, T: int, causal: bool, device: torch.device | None = None
) -> torch.Tensor:
    """ALiBi's linear distance penalty (Press et al.): [H, T, T], slope 2^(-8h/H) per head."""
    slopes = torch.tensor([2 ** (-8 * (h + 1) / n_head) for h in range(n_head)], device=device)
    pos = torch.arange(T, device=device)
    dist = (pos[None, :] - pos[:, None]).float()  # j - i: <= 0 for the keys a causal query sees
    dist = dist if causal else -dist.abs()
    return slopes[:, None, None] * dist  # [H, T, T]


def window_band(T: int, window: int, device: torch.device) -> torch.Tensor:
    """[T, T] bool, True where query i may see key j: i - window < j <= i."""
    i = torch.arange(T, device=device)
    gap = i[:, None] - i[None, :]  # [T, T]: query minus key
    return (gap >= 0) & (gap < window)
