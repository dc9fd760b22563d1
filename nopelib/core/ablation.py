"""Parts of a model held at their initial values while it trains.

Parts of a model held at their initial values while it trains: the early-dynamics study's
ablations, which isolate what takes the layer-1 pattern away.

- ``embedding``: the token embedding. It is tied to the output head (as in nanoGPT), so the
  head is held too: the rest of the model learns to read a fixed random vocabulary.
- ``input``: the token embedding as the blocks read it, with the output head untied from it
  (a copy at the same initial values) and trained: the control for ``embedding``, whose held
  head keeps a model from learning at all.
- ``qk``: block 1's queries and keys (the first two thirds of its ``c_attn`` weight and bias),
  so block 1's attention can only change through its input, never through its own logits.
- ``value``: block 1's value path: its first LayerNorm, the value third of ``c_attn`` and the
  attention's output projection. Held with the embedding, every token's value vector (what
  block 1's attention averages, after the output projection) stays as at initialisation, and
  with it the shared direction and leading axis the averaging theory reads.
- ``mlp``: block 1's MLP and the LayerNorm before it: what block 1 adds after its attention.

A held part gets a zero gradient (so gradient clipping sees only what trains) and is put back
after every optimizer step (AdamW's decoupled weight decay would shrink it otherwise), so it
stays bit for bit at its initial values while everything else trains as in an unablated run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nopelib.core.model import GPT

PARTS = ("embedding", "qk", "value", "mlp", "input")  # what can be held


def check_parts(parts: Sequence[str]) -> tuple[str, ...]:
    """``parts`` as a tuple if every name is in PARTS, none repeats and they can be held
    together; a ValueError naming the bad one otherwise."""
    parts = tuple(parts)
    for name in parts:
        if name not in PARTS:
            raise ValueError(f"frozen part {name!r} is unknown; allowed: {list(PARTS)}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"frozen={list(parts)!r} names a part twice")
    if "embedding" in parts and "input" in parts:
        raise ValueError(f"frozen={list(parts)!r}: 'input' unties the head that 'embedding' "
                         "holds; name one of them")
    return parts


def _masks(model: GPT, part: str) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(parameter, bool mask of its held entries) for one part."""
    if part in ("embedding", "input"):
        w = model.transformer.wte.weight
        return [(w, torch.ones_like(w, dtype=torch.bool))]
    block = model.transformer.h[0]
    if part == "mlp":
        whole = (block.ln_2.weight, block.ln_2.bias, *block.mlp.parameters())
        return [(p, torch.ones_like(p, dtype=torch.bool)) for p in whole if p is not None]
    attn = block.attn
    rows = slice(0, 2 * attn.n_embd) if part == "qk" else slice(2 * attn.n_embd, None)
    out = []
    for p in (attn.c_attn.weight, attn.c_attn.bias):  # rows q, k, v: a third each
        if p is None:
            continue
        mask = torch.zeros_like(p, dtype=torch.bool)
        mask[rows] = True
        out.append((p, mask))
    if part == "value":  # what else a value vector passes through in block 1
        whole = (block.ln_1.weight, block.ln_1.bias, attn.c_proj.weight, attn.c_proj.bias)
        out += [(p, torch.ones_like(p, dtype=torch.bool)) for p in whole if p is not None]
    return out


class Frozen:
    """Holds ``parts`` of ``model`` at their current values while it trains: construct it
    before the optimizer (``input`` gives the model a head of its own to train) and call
    ``restore()`` after every optimizer step."""

    def __init__(self, model: GPT, parts: Sequence[str]):
        self.parts = check_parts(parts)
        if "input" in self.parts:  # the head: a trained copy of the embedding's initial values
            head = model.transformer.wte.weight.detach().clone()
            model.lm_head.weight = torch.nn.Parameter(head)
        self._held: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []
        for part in self.parts:
            for p, mask in _masks(model, part):
                self._held.append((p, mask, p.detach().clone()))
                p.register_hook(lambda g, m=mask: g.masked_fill(m, 0.0))

    @torch.no_grad()
    def restore(self) -> None:
        """Put every held entry back to its initial value."""
        for p, mask, initial in self._held:
            p.copy_(torch.where(mask, initial, p))
