"""A nanoGPT-style decoder with no positional encoding (NoPE) by default.

Pre-LayerNorm blocks (causal self-attention, then a GELU MLP, each added to the residual
stream), a final LayerNorm and a language-model head tied to the token embedding, as in
Karpathy's nanoGPT. Position encodings ("learned", "sinusoidal", "rope", "alibi") and
bidirectional attention exist only as controls for the experiments.

Two attention paths compute the same function: ``fused`` (``scaled_dot_product_attention``,
used for training) and ``explicit`` (softmax of QK^T written out, used for analysis because it
has the attention pattern to show).

Activations are observed one way, in the style of TransformerLens: ``HookPoint`` modules sit at
named places of the forward pass (``blocks.{l}.hook_resid_pre``, ``blocks.{l}.hook_attn_out``,
``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_pattern``; blocks 0-based) and
``GPT.run_with_cache`` records the ones asked for. ``hidden_states`` and ``attention_weights``
are views of that cache.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from nopelib.core.encodings import alibi_bias, rope_rotate, sinusoidal_table, window_band

POS_ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi")
INIT_TARGETS = ("embedding", "all")
ATTN_IMPLS = ("fused", "explicit")
# len(nopelib.core.tasks.VOCAB), the shared character vocabulary of the four tasks; a constant here
# so that the model does not import the tasks (tests/core/test_model.py checks that they agree)
VOCAB_SIZE = 25
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # attention heads per block
    n_embd: int = 384  # width of the residual stream
    vocab_size: int = VOCAB_SIZE  # the shared character vocabulary of the four tasks
    block_size: int = 64  # longest sequence; every task needs at most MAX_SEQ_LEN = 39
    bias: bool = True  # biases in Linear layers and LayerNorms, as in GPT-2
    dropout: float = 0.0
    pos_encoding: str = "none"  # one of POS_ENCODINGS; "none" is the paper's NoPE model
    causal: bool = True  # False gives a bidirectional control model
    init_mean: float = 0.0  # mean of the initial weights that init_target names
    init_std: float = 0.02  # their standard deviation (nanoGPT's 0.02)
    init_target: str = "embedding"  # "embedding": only the token embedding; "all": every weight

    def __post_init__(self) -> None:
        # exact types: True is an int and "no" is truthy, and both would otherwise pass
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for name in ("bias", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        for name in ("dropout", "init_mean", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name}={value!r} must be a real number")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}"
            )
        if self.pos_encoding not in POS_ENCODINGS:
            raise ValueError(
                f"pos_encoding={self.pos_encoding!r} is unknown; allowed: {POS_ENCODINGS}"
            )
        if self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"pos_encoding='rope' needs an even head size; got {self.n_embd // self.n_head}"
            )
        if self.init_target not in INIT_TARGETS:
            raise ValueError(
                f"init_target={self.init_target!r} is unknown; allowed: {INIT_TARGETS}"
            )
        if not (self.init_std > 0 and math.isfinite(self.init_std)):
            raise ValueError(f"init_std={self.init_std!r} must be a positive finite number")
        if not math.isfinite(self.init_mean):
            raise ValueError(f"init_mean={self.init_mean!r} must be finite")
        # weights are float32: a draw beyond mean + 8 std (probability ~1e-15) must still fit
        if abs(self.init_mean) + 8 * self.init_std > FLOAT32_MAX:
            raise ValueError(f"init_mean={self.init_mean!r}, init_std={self.init_std!r} give "
                             "weights outside float32 (|mean| + 8 std must be <= "
                             f"{FLOAT32_MAX:.3g})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be in [0, 1)")

    def to_dict(self) -> dict:
        return asdict(self)


class HookPoint(nn.Identity):
    """A named place in the forward pass: returns its input unchanged, so a forward hook on it
    sees the activation there without the model computing anything differently."""

    name: str = ""  # set by GPT: "blocks.{l}...", TransformerLens's names


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.causal = config.causal
        self.pos_encoding = config.pos_encoding
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.hook_pattern = HookPoint()  # attention probabilities [B, H, T, T] (explicit path)

    def forward(self, x: torch.Tensor, attn_impl: str = "fused",
                window: int | None = None) -> torch.Tensor:
        """Attention over the sequence; ``window`` (causal only) lets position i attend to
        positions i - window + 1 .. i alone: sliding-window attention."""
        B, T, C = x.shape  # batch, time, channels
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # [B, H, T, hs]
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.pos_encoding == "rope":
            q, k = rope_rotate(q), rope_rotate(k)
        bias = None
        if self.pos_encoding == "alibi":
            bias = alibi_bias(self.n_head, T, self.causal, x.device).to(q.dtype)

        band = None if window is None else window_band(T, window, x.device)  # [T, T], True: seen
        if band is not None and bias is not None:
            bias = bias.masked_fill(~band, float("-inf"))
        if attn_impl == "fused":
            mask = self._fused_mask(bias, T, x.device)
            y = F.scaled_dot_product_attention(
                q, k, v,
                attn_mask=band if mask is None and band is not None else mask,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=self.causal and bias is None and band is None,
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # [B, H, T, T]
            if bias is not None:
                att = att + bias
            if self.causal:
                mask = band if band is not None else torch.ones(
                    T, T, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~mask, float("-inf"))
            att = self.hook_pattern(F.softmax(att, dim=-1))
            y = self.attn_dropout(att) @ v  # [B, H, T, hs]
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads
        return self.resid_dropout(self.c_proj(y))

    def _fused_mask(
        self, bias: torch.Tensor | None, T: int, device: torch.device
    ) -> torch.Tensor | None:
        if bias is None or not self.causal:
            return bias
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        return bias.masked_fill(~causal, float("-inf"))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.hook_resid_pre = HookPoint()  # the residual stream entering the block [B, T, C]
        self.hook_attn_out = HookPoint()  # what attention adds to it (c_proj's output)
        self.hook_resid_post = HookPoint()  # the residual stream leaving the block

    def forward(self, x: torch.Tensor, attn_impl: str = "fused",
                window: int | None = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.ln_1(x), attn_impl, window))
        x = x + self.mlp(self.ln_2(x))
        return self.hook_resid_post(x)


class GPT(nn.Module):
    """The decoder. ``GPT(GPTConfig())`` is the paper's 6-layer, 384-wide NoPE base model."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        if config.pos_encoding == "learned":
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying, as in nanoGPT
        self.hook_points = {}  # TransformerLens's name -> HookPoint
        for path, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = path.replace("transformer.h.", "blocks.")
                self.hook_points[module.name] = module
        if self.lm_head.weight.device.type != "meta":  # shapes only there: nothing to draw
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nanoGPT's initialisation, with ``init_mean``/``init_std`` applied to ``init_target``.

        Every Linear and Embedding weight starts at N(0, 0.02), biases at 0, residual output
        projections at N(0, 0.02/sqrt(2 n_layer)). Then ``init_target="embedding"`` redraws the
        token embedding from N(init_mean, init_std); ``"all"`` draws every weight from it (the
        residual projections with std init_std/sqrt(2 n_layer)).
        """
        cfg = self.config
        mean, std = (cfg.init_mean, cfg.init_std) if cfg.init_target == "all" else (0.0, 0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=mean, std=std / math.sqrt(2 * cfg.n_layer))
            elif p.dim() == 2 and name != "transformer.wte.weight":
                nn.init.normal_(p, mean=mean, std=std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
        nn.init.normal_(self.transformer.wte.weight, mean=cfg.init_mean, std=cfg.init_std)

    def num_params(self) -> int:
        """Number of parameters, the tied head counted once."""
        return sum(p.numel() for p in self.parameters())

    def _check_idx(self, idx: torch.Tensor) -> None:
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape [batch, time]; got {tuple(idx.shape)}")
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"idx must hold integer token ids; got dtype {idx.dtype}")
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"input length {T} exceeds block_size={self.config.block_size}")
        if torch.compiler.is_compiling():
            # reading min/max inside a compiled graph breaks it in two; an id outside the
            # vocabulary still fails in the embedding lookup
            return
        if self.training and idx.device.type != "cpu":
            # reading min/max is a host sync per step; training batches come from
            # tasks.encode, which already rejects characters outside the vocabulary
            return
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            vocab = self.config.vocab_size
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.transformer.wte(idx)  # [B, T, C]
        if self.config.pos_encoding == "learned":
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        elif self.config.pos_encoding == "sinusoidal":
            x = x + sinusoidal_table(T, self.config.n_embd, idx.device).to(x.dtype)
        return x

    def _run(self, idx: torch.Tensor, attn_impl: str, n_blocks: int | None = None,
             window: int | None = None) -> torch.Tensor:
        """The residual stream after the first ``n_blocks`` blocks (all by default): [B, T, C]."""
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl={attn_impl!r} is unknown; allowed: {ATTN_IMPLS}")
        if window is not None:
            if type(window) is not int or window < 1:
                raise ValueError(f"window={window!r} must be a positive integer or None")
            if not self.config.causal:
                raise ValueError("window needs causal=True: a sliding window looks back")
        self._check_idx(idx)
        x = self.transformer.drop(self._embed(idx))
        for block in self.transformer.h[:n_blocks]:
            x = block(x, attn_impl, window)
        return x

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, attn_impl: str = "fused"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, T, vocab] at every position, and the mean cross-entropy over the targets
        that are not IGNORE_INDEX (None without targets)."""
        logits = self.lm_head(self.transformer.ln_f(self._run(idx, attn_impl)))
        loss = None
        if targets is not None:
            on_device = self.training and idx.device.type != "cpu"  # a read is a host sync there
            may_read = not torch.compiler.is_compiling() and not on_device
            if may_read and not bool((targets != -100).any()):
                # a mean over no targets is NaN; checked where a host read is free (the CPU, eval)
                raise ValueError("targets are all IGNORE_INDEX (-100): there is no loss to take")
            flat = logits.view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, targets.view(-1), ignore_index=-100)
        return logits, loss

    def run_with_cache(
        self,
        idx: torch.Tensor,
        names: Sequence[str] | None = None,
        attn_impl: str = "explicit",
        stop_at_layer: int | None = None,
        window: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward pass that records the activations at the hook points ``names`` (all if None).

        Returns (logits [B, T, vocab], {name: activation, detached}). The hooks only read, so
        the logits are bit for bit those of ``forward(idx, attn_impl=attn_impl)``, and no hook
        outlives the call, even when it raises. With ``stop_at_layer=n`` only blocks 0..n-1 run
        (a sweep that needs block 0 alone skips the rest) and the first item is the residual
        stream after them [B, T, C], as in TransformerLens. ``attn_impl="fused"`` is faster but
        has no attention pattern to record. ``window`` restricts attention to the last
        ``window`` positions (sliding-window attention; None: the whole causal prefix).
        """
        names = list(self.hook_points) if names is None else list(names)
        unknown = [n for n in names if n not in self.hook_points]
        if unknown:
            some = list(self.hook_points)[:4]
            raise ValueError(f"names {unknown!r} are not hook points; e.g. {some!r}")
        cache: dict[str, torch.Tensor] = {}

        def store(name: str, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            cache[name] = output.detach()

        handles = [self.hook_points[n].register_forward_hook(partial(store, n)) for n in names]
        try:
            x = self._run(idx, attn_impl, stop_at_layer, window)
        finally:
            for h in handles:
                h.remove()
        missing = [n for n in names if n not in cache]
        if missing:
            raise ValueError(f"{missing!r} did not run with attn_impl={attn_impl!r}, "
                             f"stop_at_layer={stop_at_layer!r}")
        out = x if stop_at_layer is not None else self.lm_head(self.transformer.ln_f(x))
        return out, cache

    def hidden_states(self, idx: torch.Tensor, attn_impl: str = "explicit",
                      window: int | None = None) -> torch.Tensor:
        """Residual stream at every layer: [n_layer + 1, B, T, n_embd].

        Index 0 is the token embedding (plus the position encoding, if any) that enters block 1;
        index l is the residual stream after block l. Computed with the explicit attention path
        unless ``attn_impl="fused"`` (no [B, H, T, T] tensor: long sequences); ``window`` as in
        ``run_with_cache``.
        """
        L = self.config.n_layer
        names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.hook_resid_post" for l in range(L)]
        _, cache = self.run_with_cache(idx, names, attn_impl, window=window)
        return torch.stack([cache[n] for n in names])

    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Attention probabilities of every layer and head: [n_layer, B, n_head, T, T]."""
        names = [f"blocks.{l}.attn.hook_pattern" for l in range(self.config.n_layer)]
        _, cache = self.run_with_cache(idx, names)
        return torch.stack([cache[n] for n in names])

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation of every row of idx [B, T]: [B, T + max_new_tokens]."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx
