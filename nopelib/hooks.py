"""Capture the outputs of named submodules during a forward pass, leaving no hook behind.

Forward hooks that outlive an analysis silently keep references to activations (memory) and
run on every later call; ``capture_activations`` removes them when its ``with`` block ends,
even when the block raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn as nn


@contextmanager
def capture_activations(model: nn.Module, names: Sequence[str]) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Record the output of each named submodule (e.g. ``"transformer.h.0.attn"``).

    Yields {name: [output of each call, detached]}; one list entry per forward call, in call
    order. The hooks only read the outputs, so the model computes exactly what it would without
    them.
    """
    modules = dict(model.named_modules())
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise ValueError(f"names={unknown!r} are not submodules of the model; e.g. {list(modules)[1:4]!r}")
    captured: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = []
    try:
        for n in names:
            def hook(module: nn.Module, args: tuple, output: torch.Tensor, n: str = n) -> None:
                captured[n].append(output.detach())
            handles.append(modules[n].register_forward_hook(hook))
        yield captured
    finally:
        for h in handles:
            h.remove()
