"""Character-level language models of the book's family on real text (``nopelib.core.corpus``).

The model is the book's decoder (``nopelib.core.model.GPT``) with the corpus's 65 symbols, trained
as a language model: every position of a row predicts the next character. A NoPE model and
ones with a learned position embedding, RoPE or ALiBi (``pos_encoding``, the same size
otherwise) train on the same rows in the same order for a seed, so their bits per character
differ by what the encoding buys. Training is ``loop.fit``, the loop every run of the book trains in
(AdamW with decay on matrices, warm-up then cosine decay, gradient clipping, checkpoints).

- ``TextProfile``: the model size, context and schedule, with why each was chosen.
- ``train_text``: one run, resumable from its checkpoints, its learning curve recording the
  validation bits per character and every layer's adjacency score at the context length.
- ``bits_per_char``: the mean next-character loss in bits on rows of a split.
- ``layer_scores``: the adjacency score of every layer on held-out windows of one length.
- ``sample``: a few generated lines from a prompt, seeded.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from nopelib.core.corpus import Corpus
from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.core.model import GPT, GPTConfig
from nopelib.rules.beyond_claims import TEXT_ENCODINGS, TEXT_LENGTHS
from nopelib.rules.length_claims import LENGTH_ENCODINGS, LENGTH_LENGTHS
from nopelib.store import sources
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.training.loop import Checkpointing, fit
from nopelib.training.train import adamw, train_step
from nopelib.training.train_profile import TrainProfile

ENCODINGS = TEXT_ENCODINGS  # the text study's: NoPE, and a learned position table (the control)
ALL_ENCODINGS = LENGTH_ENCODINGS  # every encoding a text model trains with (text_length's)
LONGEST = max(TEXT_LENGTHS)  # the longest held-out length the text study scores NoPE at
REACH = max(LENGTH_LENGTHS)  # the longest input a model without a position table reads


@dataclass(frozen=True)
class TextProfile:
    """Everything that decides how a text run trains and is evaluated."""

    name: str
    n_layer: int = 4  # the size: 4 layers x 128 wide, a run under an hour on a core
    n_head: int = 4
    n_embd: int = 128
    context: int = 256  # characters a row holds (its training context)
    # 4,000 steps of 32 rows: 33 M characters, about 9 passes over the training books; a step
    # took 0.58 s (median of 6) on one core of the 2-core development VM with two other
    # trainings running, so a run trains in about 40 minutes, under the hour
    steps: int = 4_000  # optimizer steps
    batch_size: int = 32  # rows per step
    lr: float = 1e-3  # nanoGPT's character-level Shakespeare setting
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    init_std: float = 0.02  # nanoGPT's initialisation, the paper's default
    log_every: int = 50
    curve_every: int = 100  # steps between learning-curve points
    n_curve: int = 16  # validation rows a curve point's bits per character read
    n_curve_windows: int = 8  # validation windows a curve point's layer scores read
    seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "context", "steps", "batch_size",
                     "log_every", "curve_every", "n_curve", "n_curve_windows"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not 2 <= self.context <= LONGEST:
            raise ValueError(f"context={self.context} must be in [2, {LONGEST}]")
        self.loop()  # the schedule's own checks (warm-up, rates, betas)

    def record(self) -> dict:
        """The profile's fields as JSON-ready values: what a study records of its day."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_record(cls, fields: dict) -> TextProfile:
        """The profile a study recorded (``record``)."""
        return cls(**{**fields, "betas": tuple(fields["betas"]),
                      "seeds": tuple(fields["seeds"])})

    def config(self, encoding: str, vocab_size: int) -> GPTConfig:
        """The model of a run: NoPE, RoPE and ALiBi reach REACH (no table to outgrow); a
        learned table has one row per position of the context."""
        if encoding not in ALL_ENCODINGS:
            raise ValueError(f"encoding={encoding!r} is unknown; allowed: {ALL_ENCODINGS}")
        block = self.context if encoding == "learned" else REACH
        return GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                         vocab_size=vocab_size, block_size=block, pos_encoding=encoding,
                         init_std=self.init_std)

    def loop(self) -> TrainProfile:
        """The schedule as ``loop.fit`` reads it (a fixed budget, cosine decay). The task
        fields of a TrainProfile mean nothing here and hold placeholders."""
        return TrainProfile(
            name=self.name, model=GPTConfig(), steps=self.steps, batch_size=self.batch_size,
            lr=self.lr, min_lr_ratio=self.min_lr_ratio, warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay, betas=self.betas, grad_clip=self.grad_clip,
            n_train=1, n_test=1, n_eval=1, eval_batch_size=1, log_every=self.log_every,
            curve_every=self.curve_every, n_curve=1)


TEXT_PROFILES = {
    "text": TextProfile(name="text"),
    # seconds on a laptop: the tests' and a chapter's quick check of the machinery
    "text_tiny": TextProfile(name="text_tiny", n_layer=2, n_head=2, n_embd=16, context=32,
                             steps=30, batch_size=4, warmup_steps=3, log_every=5,
                             curve_every=10, n_curve=4, n_curve_windows=2, seeds=(0, 1, 2)),
}


def lengths_for(encoding: str, profile: TextProfile) -> list[int]:
    """The held-out lengths a model is scored at: every one of the rule's TEXT_LENGTHS its
    table holds (a learned table stops at the context; NoPE has none), and the context."""
    top = LONGEST if encoding == "none" else profile.context
    return sorted({n for n in TEXT_LENGTHS if n <= top} | {profile.context})


def get_text_profile(profile: str | TextProfile) -> TextProfile:
    """The text profile called ``profile`` (a TextProfile passes through)."""
    if isinstance(profile, TextProfile):
        return profile
    if profile not in TEXT_PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {sorted(TEXT_PROFILES)}")
    return TEXT_PROFILES[profile]


def run_key(encoding: str, seed: int, profile: TextProfile, device: torch.device) -> str:
    """A text run's checkpoint key: the profile, encoding, seed, the sources this module
    imports (``sources``: each by its syntax), the device type, and the torch and numpy
    versions (what changes a run's bits)."""
    payload = {"profile": asdict(profile), "encoding": encoding, "seed": seed,
               "source": sources.module_closure_hash([__name__]), "device_type": device.type,
               "torch": torch.__version__, "numpy": np.__version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


@torch.no_grad()
def bits_per_char(model: GPT, rows: np.ndarray, batch: int = 32) -> float:
    """Mean next-character loss in bits over every position of ``rows`` [N, T + 1] (each row's
    first T ids predict its last T), in eval mode and back."""
    if rows.ndim != 2 or rows.shape[1] < 2 or not len(rows):
        raise ValueError(f"rows must have shape [N >= 1, T + 1 >= 2]; got {rows.shape}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for lo in range(0, len(rows), batch):
        chunk = torch.from_numpy(rows[lo:lo + batch]).to(device)
        logits, _ = model(chunk[:, :-1])  # [b, T, vocab]
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(),
                                       reduction="sum"))
    model.train(was_training)
    return total / (rows.shape[0] * (rows.shape[1] - 1)) / math.log(2)


@torch.no_grad()
def layer_scores(model: GPT, windows: np.ndarray, batch: int = 8) -> np.ndarray:
    """The adjacency score of every layer on each of ``windows`` [N, T]: [N, n_layer + 1], in
    eval mode and back (fused attention: no [T, T] attention tensor per head)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for lo in range(0, len(windows), batch):
        idx = torch.from_numpy(windows[lo:lo + batch]).to(device)
        states = model.hidden_states(idx, attn_impl="fused").float().cpu()  # [L+1, b, T, d]
        out.append(adjacency_score(cosine_similarity_matrix(states)).T)  # [b, L+1]
    model.train(was_training)
    return np.concatenate(out)


@torch.no_grad()
def sample(model: GPT, corpus: Corpus, prompt: str, n_chars: int, seed: int,
           temperature: float = 0.8) -> str:
    """``n_chars`` characters after ``prompt``, drawn at ``temperature`` by a generator seeded
    with ``seed`` (the same text on every call), the context cut to the model's table."""
    if not 0 < temperature <= 10:
        raise ValueError(f"temperature={temperature!r} must be in (0, 10]")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = corpus.encode(prompt).tolist()
    context = model.config.block_size
    for _ in range(n_chars):
        idx = torch.tensor([ids[-context:]], device=device)
        logits, _ = model(idx)
        probs = torch.softmax(logits[0, -1].float().cpu() / temperature, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=gen)))
    model.train(was_training)
    return corpus.decode(ids[len(prompt):])


def train_text(corpus: Corpus, encoding: str, seed: int, profile: TextProfile,
               device: torch.device, checkpoints: RunCheckpoints | None = None,
               progress: bool = False) -> tuple[GPT, dict]:
    """Train one language model on the corpus's training books (from its newest usable
    checkpoint, given ``checkpoints``): rows of ``context + 1`` consecutive characters, a fresh
    permutation of them every epoch drawn by ``numpy.random.default_rng(seed)``, the model
    initialised under ``torch.manual_seed(seed)``. Returns the model (eval mode) and its
    metrics: ``loop.fit``'s, with a curve point every ``curve_every`` steps holding the
    validation bits per character (``val_bpc``, on the first ``n_curve`` validation rows) and
    every layer's adjacency score at the context length (``scores``, the mean over
    ``n_curve_windows`` validation windows)."""
    rows = corpus.rows("train", profile.context + 1)  # [N, context + 1]
    data = torch.from_numpy(rows).to(device)
    val_rows = corpus.rows("validation", profile.context + 1)[: profile.n_curve]
    val_windows = corpus.windows("validation", profile.context, profile.n_curve_windows,
                                 seed=0)
    torch.manual_seed(seed)
    model = GPT(profile.config(encoding, len(corpus.vocab))).to(device).train()
    loop = profile.loop()
    opt = adamw(model.parameters(), loop)
    resumable = (None if checkpoints is None
                 else Checkpointing.of_model(checkpoints, model, opt, {}))

    def step(batch_rows: np.ndarray, T: int, lrs: list[float]) -> torch.Tensor:
        chunk = data[torch.from_numpy(batch_rows[0]).to(device)]  # [B, context + 1]
        for group in opt.param_groups:
            group["lr"] = lrs[0]
        inputs, targets = chunk[:, :T], chunk[:, 1:T + 1].contiguous()  # [B, T] each
        return train_step(model, opt, inputs, targets, loop.grad_clip)[None]

    def curve(_: list[int]) -> list[dict]:
        return [{"val_bpc": bits_per_char(model, val_rows),
                 "scores": layer_scores(model, val_windows).mean(0).tolist()}]

    lengths = np.full((1, len(rows)), profile.context + 1)  # every row is whole
    (metrics,) = fit(loop, [seed], lengths, step, curve, device,
                     f"{encoding} seed {seed}", progress, resumable)
    return model.eval(), metrics


def unigram_bits(corpus: Corpus, split: str = "test") -> float:
    """The baseline a language model must beat: the bits per character of ``split`` under the
    training books' character frequencies (add-one smoothed)."""
    V = len(corpus.vocab)
    counts = np.bincount(corpus.ids("train"), minlength=V) + 1.0
    p = counts / counts.sum()
    held = np.bincount(corpus.ids(split), minlength=V)
    return float(-(held * np.log2(p)).sum() / held.sum())

