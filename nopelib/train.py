"""Training on the four tasks, exact-match evaluation, and a run cache.

A run is one (task, seed, profile): the model is initialised with ``torch.manual_seed(seed)``
(the same draw as ``analysis.random_model(config, seed)``, so "before training" is exactly the
starting point), trained with the loss on the answer tokens only, AdamW with a linear warm-up
and cosine decay, and gradient clipping, then scored by the exact match of greedy decoding on a
fixed prefix of the test split.

Profiles are named, frozen configurations (``PROFILES``): ``cpu`` trains on a 2-core CPU in
about 17 minutes cold, ``paper`` is the base 10.6 M model with a budget meant for one GPU.
Nothing else in this module branches on the profile name.

Finished runs are cached (weights as safetensors, metrics as JSON) under a key that hashes the
full model config, the profile's training fields, the task, the seed, the bytes of nopelib's
training sources (``TRAINING_SOURCES``), the device type, its dtype policy and the torch
version. A run is written into a temporary directory and renamed into place: the rename is the
commit point, so an interrupted run leaves nothing that a later call loads. The metrics record
the SHA-256 of the weights file, checked on every load; an entry that is unreadable, records
another key or checksum, or holds non-finite weights is moved aside with a warning and retrained
(``nopelib.cache``). A run whose loss or weights are not finite is never committed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm import tqdm

from nopelib import cache
from nopelib.cache import CACHE_ENV, resolve_cache_dir  # noqa: F401  (CACHE_ENV: re-exported)
from nopelib.model import FLOAT32_MAX, GPT, GPTConfig
from nopelib.tasks import TASKS, EOS_ID, IGNORE_INDEX, MAX_SEQ_LEN, encode, encode_batch, encode_inputs, get_task, make_split

DEVICES = ("auto", "cpu", "cuda", "mps")
BACKENDS = ("local", "ray")  # how train_many trains the missing runs


@dataclass(frozen=True)
class TrainProfile:
    """Everything that decides how a run trains and is evaluated, under one name."""

    name: str
    model: GPTConfig  # the full model configuration
    steps: int  # optimizer steps
    batch_size: int  # training sequences per step
    lr: float  # peak learning rate, reached after the warm-up
    min_lr_ratio: float  # the cosine decays to lr * min_lr_ratio at the last step
    warmup_steps: int  # linear warm-up from 0 to lr
    weight_decay: float  # AdamW decay, on matrices only (not biases, LayerNorms)
    betas: tuple[float, float]  # AdamW betas
    grad_clip: float  # clip the global gradient norm to this
    n_train: int  # training examples drawn by tasks.make_split
    n_test: int  # test examples drawn by tasks.make_split
    n_eval: int  # exact match is measured on the first n_eval test examples
    eval_batch_size: int  # rows per evaluation batch (one teacher-forced forward pass each)
    log_every: int  # steps between loss read-outs (the only host syncs in the loop)
    seeds: tuple[int, ...] = field(default=(0,))  # seeds a chapter trains; not part of a run's key
    # a task's own budget, overriding the numbers above for that task: (task, steps) or
    # (task, steps, batch_size, lr)
    task_budgets: tuple[tuple, ...] = ()
    # tasks whose budget is meant to carry every seed well past its plateau: the chapters judge
    # the trained-model claims on these and fail when one is not learned; not part of a key
    claim_tasks: tuple[str, ...] = ()
    curve_every: int = 0  # steps between learning-curve points (0: no curve)
    n_curve: int = 1_000  # a curve point is exact match on the first n_curve test examples

    def __post_init__(self) -> None:
        # exact types and finite float32 values: a profile that cannot train is refused here,
        # not discovered as a NaN run (True is an int, and NaN fails no comparison it is in)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty string")
        if not isinstance(self.model, GPTConfig):
            raise ValueError(f"model={self.model!r} must be a GPTConfig")
        for name in ("steps", "batch_size", "n_train", "n_test", "n_eval", "eval_batch_size", "log_every"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if type(self.warmup_steps) is not int or not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be an integer in "
                             f"[0, steps={self.steps}]")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or abs(value) > FLOAT32_MAX):
                raise ValueError(f"{name}={value!r} must be a finite number within float32")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be positive")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay={self.weight_decay!r} must be >= 0")
        if not self.grad_clip > 0:  # clip_grad_norm_ with a negative norm flips the gradient
            raise ValueError(f"grad_clip={self.grad_clip!r} must be positive")
        if (not isinstance(self.betas, tuple) or len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                           for b in self.betas)):
            raise ValueError(f"betas={self.betas!r} must be a pair of numbers in [0, 1)")
        for entry in self.task_budgets:
            if not (isinstance(entry, tuple) and len(entry) in (2, 4)
                    and isinstance(entry[0], str)):
                raise ValueError(f"task_budgets entry {entry!r} must be (task, steps) or "
                                 "(task, steps, batch_size, lr)")
            try:  # the task's own profile checks its numbers
                self.for_task(entry[0])
            except ValueError as err:
                raise ValueError(f"task_budgets entry {entry!r}: {err}") from None
        tasks = [entry[0] for entry in self.task_budgets]
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"task_budgets={self.task_budgets!r} names a task twice")
        if type(self.curve_every) is not int or self.curve_every < 0:
            raise ValueError(f"curve_every={self.curve_every!r} must be a non-negative integer")
        if type(self.n_curve) is not int or not 1 <= self.n_curve <= self.n_test:
            raise ValueError(f"n_curve={self.n_curve!r} must be an integer in "
                             f"[1, n_test={self.n_test}]")
        if (not isinstance(self.claim_tasks, tuple)
                or not all(t in TASKS for t in self.claim_tasks)
                or len(set(self.claim_tasks)) != len(self.claim_tasks)):
            raise ValueError(f"claim_tasks={self.claim_tasks!r} must be a tuple of distinct "
                             f"tasks from {TASKS}")
        if self.n_eval > self.n_test:
            raise ValueError(f"n_eval={self.n_eval} must be <= n_test={self.n_test}")
        if (not isinstance(self.seeds, tuple) or not self.seeds
                or not all(type(x) is int and x >= 0 for x in self.seeds)):
            raise ValueError(f"seeds={self.seeds!r} must be a non-empty tuple of non-negative "
                             "integers")

    def for_task(self, task: str) -> TrainProfile:
        """This profile with the task's own budget (``task_budgets``) applied, if it has one:
        what a run of ``task`` trains with."""
        budget = {entry[0]: entry[1:] for entry in self.task_budgets}.get(task)
        if budget is None:
            return replace(self, task_budgets=())
        steps, batch_size, lr = budget if len(budget) == 3 else (*budget, self.batch_size,
                                                                 self.lr)
        return replace(self, steps=steps, batch_size=batch_size, lr=lr, task_budgets=())

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, cosine decay."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


PROFILES: dict[str, TrainProfile] = {
    # The default, in the paper's regime on a 2-core CPU: a 4-layer, 96-wide NoPE model
    # (0.45 M parameters) whose initialisation shows the adjacency pattern (the token
    # embedding's std is 0.002, so the averaging theory's ratio rho is small; see the trained
    # chapter), 3 seeds (the fewest for which a t interval over seeds can decide), evaluated
    # on the whole test split.
    # Only reversal is in the claim set (claim_tasks). Its runs leave their plateau between
    # steps 2,000 and 2,500 (recipe and budget studies, committed), so 4,000 steps carry
    # every seed well past it. Addition at 7,000 steps in batches of 64 ended while its runs
    # were still leaving their plateau: 0.925 / 0.945 on an AVX2 CPU, 0.903 / 0.704 under
    # AVX-512 kernels; the budget that learns it with margin (28,000 steps in the recipe
    # study) does not fit a chapter, so addition, like indexing and ordering, gets 500 steps:
    # enough to show its plateau, and no claim.
    "cpu": TrainProfile(
        name="cpu",
        model=GPTConfig(n_layer=4, n_head=4, n_embd=96, init_std=0.002),
        steps=500,
        task_budgets=(("reversal", 4000),),
        claim_tasks=("reversal",),
        batch_size=32,
        lr=2e-3,
        min_lr_ratio=0.1,
        warmup_steps=200,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=500,  # pads less than 1,000: 2-16 % faster by task (reversal most)
        log_every=50,
        seeds=(0, 1, 2),
        curve_every=100,
        n_curve=500,
    ),
    # The paper's base model (6 layers x 384 wide x 6 heads, 10.6 M parameters), 5 seeds, the
    # whole test split; a budget meant for one GPU (5,000 steps of 256: 64 epochs of the 20,000
    # training examples).
    "paper": TrainProfile(
        name="paper",
        model=GPTConfig(),
        steps=5000,
        batch_size=256,
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=250,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=2_000,
        log_every=100,
        seeds=(0, 1, 2, 3, 4),
        claim_tasks=tuple(TASKS),
    ),
}


@dataclass
class TrainedRun:
    """A trained model (eval mode, on the CPU) with its metrics and where it came from."""

    model: GPT
    metrics: dict
    config: GPTConfig
    profile: TrainProfile
    from_cache: bool


def get_profile(profile: str | TrainProfile) -> TrainProfile:
    """The profile called ``profile`` (a TrainProfile passes through, e.g. a test's tiny one)."""
    if isinstance(profile, TrainProfile):
        return profile
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {sorted(PROFILES)}")
    return PROFILES[profile]


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"``: CUDA if available, then Apple MPS, then the CPU; or a named device that exists."""
    kind = device.split(":")[0] if isinstance(device, str) else None
    if kind not in DEVICES or (kind == "auto" and device != "auto"):
        raise ValueError(f"device={device!r} is unknown; allowed: {DEVICES} (or 'cuda:N')")
    mps = getattr(torch.backends, "mps", None)
    mps_ok = mps is not None and mps.is_available()
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu")
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not mps_ok):
        raise ValueError(f"device={device!r} is not available on this machine")
    return torch.device(device)


# The modules whose code decides what a run trains into: the model, the data, the loop.
# Analysis, plotting, probe and benchmark code cannot change a trained model, so editing them
# keeps the cache.
TRAINING_SOURCES = ("model.py", "tasks.py", "train.py")


def source_hash() -> str:
    """SHA-256 of the bytes of nopelib's training sources (TRAINING_SOURCES): a change to any
    of them invalidates every cached run."""
    return cache.source_hash(TRAINING_SOURCES)


def dtype_policy(device_type: str) -> str:
    """How ``train`` computes on a device type: bfloat16 autocast on CUDA, float32 elsewhere."""
    return "autocast-bfloat16" if device_type == "cuda" else "float32"


def run_key(task: str, seed: int, profile: TrainProfile, device: str | torch.device = "cpu") -> str:
    """The cache key of a run: the full config, the profile's training fields, task, seed, source,
    and what else changes the trained weights: the device type, its dtype policy, torch's version
    (a CUDA bfloat16 run is another run than a CPU float32 one)."""
    # the task's own budget, not the whole profile: changing another task's steps leaves this
    # run's key alone; which seeds a chapter trains does not change how one seed trains
    fields = asdict(profile.for_task(task))
    fields.pop("seeds")
    fields.pop("claim_tasks")  # which tasks a chapter judges does not change a run
    kind = torch.device(device).type
    payload = {"task": task, "seed": seed, "profile": fields, "source": source_hash(),
               "device_type": kind, "dtype_policy": dtype_policy(kind), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def adamw(model: GPT, profile: TrainProfile, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (and the tied embedding) only, as in nanoGPT.

    ``fused`` selects the single-kernel update; None picks it on CUDA, as nanoGPT does there (on
    the CPU it bought 2 % for the quick model in the benchmark, so the CPU keeps the default).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": profile.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if fused is None:
        fused = bool(params) and params[0].device.type == "cuda"
    return torch.optim.AdamW(groups, lr=profile.lr, betas=profile.betas, fused=fused or None)


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    idx: torch.Tensor,
    targets: torch.Tensor,
    grad_clip: float,
    autocast: AbstractContextManager | None = None,
    attn_impl: str = "fused",
) -> torch.Tensor:
    """One optimizer step on a batch idx, targets [B, T]: forward with the loss on the answer
    tokens, backward, gradient clipping, AdamW. Returns the loss, detached, on the device (no
    host sync); the benchmark times exactly this step."""
    with autocast or nullcontext():
        _, loss = model(idx, targets, attn_impl=attn_impl)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.detach()


def train(
    task: str, seed: int, profile: TrainProfile, device: torch.device, progress: bool = True
) -> tuple[GPT, dict]:
    """Train one run from scratch; returns the model (on ``device``) and its training metrics."""
    profile = profile.for_task(task)
    split = make_split(task, seed, n_train=profile.n_train, n_test=profile.n_test)
    idx_all, tgt_all = encode_batch(split.train, block_size=MAX_SEQ_LEN)  # [N, T], [N, T]
    # Each row's length (input + answer, the last target position + 1) lets every batch be cut
    # to its longest row, decided on the host from this array without a device sync.
    lengths = np.array([len(x) + len(a) + 1 for x, a in split.train])  # [N]
    idx_all, tgt_all = idx_all.to(device), tgt_all.to(device)

    torch.manual_seed(seed)  # same draw as analysis.random_model(config, seed)
    model = GPT(profile.model).to(device).train()
    opt = adamw(model, profile)
    gen = np.random.default_rng(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _NoAutocast()

    N, B = len(split.train), profile.batch_size
    order, cursor = gen.permutation(N), 0
    loss_sum = torch.zeros((), device=device)  # summed on the device, read every log_every steps
    losses: list[float] = []
    tokens = 0
    curve_pairs = split.test[: profile.n_curve]
    curve: dict[str, list] = {"step": [], "accuracy": [], "loss": []}
    curve_seconds = 0.0  # spent on the curve's evaluations, kept out of the step time
    bar = tqdm(total=profile.steps, desc=f"{task} seed {seed}", disable=not progress, mininterval=1.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for step in range(profile.steps):
        if cursor + B > N:  # a new epoch: reshuffle, drop the ragged tail
            order, cursor = gen.permutation(N), 0
        rows = order[cursor:cursor + B]
        cursor += B
        T = int(lengths[rows].max()) - 1  # positions that predict something
        rows_t = torch.from_numpy(rows).to(device)
        idx, targets = idx_all[rows_t, :T], tgt_all[rows_t, :T]  # [B, T]
        tokens += B * T
        for group in opt.param_groups:
            group["lr"] = profile.lr_at(step)
        step_loss = train_step(model, opt, idx, targets, profile.grad_clip, autocast)
        loss_sum += step_loss
        if (step + 1) % profile.log_every == 0 or step + 1 == profile.steps:
            n = (step % profile.log_every) + 1
            losses.append(loss_sum.item() / n)  # the one host sync per log_every steps
            loss_sum.zero_()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            bar.update(n)
        last = step + 1 == profile.steps
        if profile.curve_every and ((step + 1) % profile.curve_every == 0 or last):
            # evaluate() switches to eval mode and back; it draws no random numbers, so the
            # training trajectory is the same with or without a curve
            tic = time.perf_counter()
            curve["step"].append(step + 1)
            curve["accuracy"].append(evaluate(model, curve_pairs, profile.eval_batch_size))
            curve["loss"].append(float(step_loss))
            curve_seconds += time.perf_counter() - tic
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start - curve_seconds
    bar.close()
    metrics = {
        "train_seconds": seconds,
        "steps": profile.steps,
        "step_ms": 1000 * seconds / profile.steps,
        "tokens_per_s": tokens / seconds,
        "final_loss": losses[-1],
        "loss_curve": losses,
        "device": str(device),
    }
    if profile.curve_every:
        metrics["curve"] = curve
        metrics["curve_seconds"] = curve_seconds
    return model.eval(), metrics


class _NoAutocast:
    """A no-op context manager for devices that train in float32."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@torch.no_grad()
def evaluate(model: GPT, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """Exact-match accuracy of greedy decoding: the fraction of (input, answer) pairs for which
    greedy decoding after the input produces exactly the answer followed by the end token.

    Computed with one teacher-forced forward pass per batch instead of one pass per generated
    token. The two are the same test: greedy decoding reproduces answer + end token if and only
    if, at every answer position, the argmax of the logits given the true prefix is the true
    next token (up to the first mismatch, greedy decoding has seen exactly the true prefix).
    Rows are right-padded, and in a causal model padding never reaches earlier positions.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if not model.config.causal:
        raise ValueError("evaluate needs a causal model (config.causal=True): teacher forcing "
                         "equals greedy decoding only when no position sees later ones")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    # batches of similar lengths pad less; the count of exact matches does not depend on order
    pairs = sorted(pairs, key=lambda pair: len(pair[0]) + len(pair[1]))
    correct = 0
    for lo in range(0, len(pairs), batch_size):
        idx, targets = encode_batch(pairs[lo:lo + batch_size], block_size=model.config.block_size)  # [b, T]
        logits, _ = model(idx.to(device))  # [b, T, vocab]
        hit = logits.argmax(-1).cpu() == targets  # [b, T]
        scored = targets != IGNORE_INDEX  # the answer tokens and the end token
        correct += int((hit | ~scored).all(dim=1).sum())
    model.train(was_training)
    return correct / len(pairs)


@torch.no_grad()
def greedy_accuracy(model: GPT, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """The reference for ``evaluate``: exact match by decoding token by token.

    Inputs are grouped by length (no padding enters the model); each batch feeds back its own
    argmax one token at a time and stops once every row has produced the end token. One forward
    pass per generated token, so ``evaluate`` gives the same number many times faster; the tests
    and the benchmark compare the two.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (text, _) in enumerate(pairs):
        groups[len(text)].append(i)
    correct = 0
    for members in groups.values():
        for lo in range(0, len(members), batch_size):
            chunk = [pairs[i] for i in members[lo:lo + batch_size]]
            idx, _ = encode_inputs([text for text, _ in chunk])  # [b, T], all rows length T
            idx = idx.to(device)
            expected = [encode(answer) + [EOS_ID] for _, answer in chunk]
            n_new = min(max(len(e) for e in expected), model.config.block_size - idx.shape[1])
            done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device)
            out = []
            for _ in range(n_new):
                logits, _ = model(idx)
                nxt = logits[:, -1].argmax(-1)  # [b]
                out.append(nxt)
                idx = torch.cat([idx, nxt[:, None]], dim=1)
                done |= nxt == EOS_ID
                if bool(done.all()):
                    break
            generated = torch.stack(out, dim=1).cpu().tolist()  # [b, generated]
            correct += sum(g[:len(e)] == e for g, e in zip(generated, expected))
    model.train(was_training)
    return correct / len(pairs)


class _BadEntry(Exception):
    """A run cache entry that must not be used; the message says why."""


def _check_entry(run_dir: Path, key: str, profile: TrainProfile) -> tuple[GPT, dict]:
    """The committed run under ``run_dir``, verified; raises _BadEntry naming the problem."""
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError) as exc:
        raise _BadEntry(f"metrics.json: {type(exc).__name__}: {exc}") from None
    if not isinstance(metrics, dict) or metrics.get("key") != key:
        got = metrics.get("key") if isinstance(metrics, dict) else None
        raise _BadEntry(f"metrics.json records key {got!r}, not {key!r}")
    weights = run_dir / "model.safetensors"
    try:
        digest = cache.file_sha256(weights)
    except OSError as exc:
        raise _BadEntry(f"model.safetensors: {exc}") from None
    if metrics.get("weights_sha256") != digest:
        raise _BadEntry("model.safetensors does not match the SHA-256 in metrics.json")
    model = GPT(profile.model)
    try:
        load_model(model, str(weights), device="cpu")
    except Exception as exc:  # noqa: BLE001  (safetensors raises its own types)
        raise _BadEntry(f"model.safetensors: {type(exc).__name__}: {exc}") from None
    if not _finite_weights(model):
        raise _BadEntry("model.safetensors holds non-finite weights")
    return model.eval(), metrics


def _load(run_dir: Path, key: str, profile: TrainProfile) -> tuple[GPT, dict] | None:
    """The committed run under ``run_dir``, or None: absent, or unusable and moved aside."""
    if not os.path.lexists(run_dir):
        return None
    try:
        return _check_entry(run_dir, key, profile)
    except _BadEntry as exc:
        cache.quarantine(run_dir, str(exc))
        return None


def _finite_weights(model: GPT) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.state_dict().values())


def _commit(runs: Path, key: str, model: GPT, metrics: dict, profile: TrainProfile) -> None:
    """Write weights and metrics to a temporary directory, then rename it to ``runs/key``.

    Refuses (RuntimeError) a run whose loss or weights are not finite: such a run is a failed
    run, and caching it would serve the failure as a result."""
    losses = [metrics["final_loss"], *metrics["loss_curve"]]
    if not all(math.isfinite(x) for x in losses) or not _finite_weights(model):
        raise RuntimeError(f"run {metrics.get('task')!r} seed {metrics.get('seed')!r} of profile "
                           f"{profile.name!r} diverged (non-finite loss or weights); not cached")
    tmp = cache.staging_dir(runs, key)
    save_model(model, str(tmp / "model.safetensors"))
    metrics["weights_sha256"] = cache.file_sha256(tmp / "model.safetensors")
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
    cache.commit_dir(tmp, runs / key, lambda d: _valid(d, key, profile))


def _valid(run_dir: Path, key: str, profile: TrainProfile) -> bool:
    try:
        _check_entry(run_dir, key, profile)
    except _BadEntry:
        return False
    return True


def train_and_score(task: str, seed: int, prof: TrainProfile, dev: torch.device, key: str,
                    progress: bool = True) -> tuple[GPT, dict]:
    """Train one run, evaluate it and fill in its metrics; nothing is written. The model comes
    back on the CPU in eval mode. Every backend trains a run through this function, so a seed
    gives the same weights whichever process or machine runs it."""
    if dev.type == "cpu":
        # one thread: CPU results are then identical whatever the core count (a reduction
        # split over threads rounds differently); train_many runs in parallel instead
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            model, metrics = train(task, seed, prof, dev, progress=progress)
        finally:
            torch.set_num_threads(threads)
    else:
        model, metrics = train(task, seed, prof, dev, progress=progress)
    return score(model, metrics, task, seed, prof, dev, key)


def score(model: GPT, metrics: dict, task: str, seed: int, prof: TrainProfile,
          dev: torch.device, key: str) -> tuple[GPT, dict]:
    """Exact match of a trained run on its test prefix, and the metrics that describe the run
    (``metrics`` is completed in place); the model comes back on the CPU in eval mode."""
    test = make_split(task, seed, n_train=prof.n_train, n_test=prof.n_test).test[: prof.n_eval]
    start = time.perf_counter()
    metrics["accuracy"] = evaluate(model, test, batch_size=prof.eval_batch_size)
    metrics["eval_seconds"] = time.perf_counter() - start
    metrics.update(
        n_test=len(test), task=task, seed=seed, key=key, profile=prof.name,
        num_params=model.num_params(), config=prof.model.to_dict(), torch=torch.__version__,
        dtype_policy=dtype_policy(dev.type),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    return model.cpu().eval(), metrics


def train_or_load(
    task: str,
    seed: int = 0,
    profile: str | TrainProfile = "cpu",
    device: str = "auto",
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainedRun:
    """The trained run of (task, seed, profile): from the cache when its key matches, otherwise
    trained on ``device``, evaluated, and committed to the cache. The model comes back on the
    CPU in eval mode."""
    get_task(task)
    prof = get_profile(profile)
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative integer")
    dev = resolve_device(device)
    key = run_key(task, seed, prof, dev)
    runs = resolve_cache_dir(cache_dir) / "runs"
    loaded = _load(runs / key, key, prof)
    if loaded is not None:
        model, metrics = loaded
        return TrainedRun(model, metrics, prof.model, prof, from_cache=True)

    model, metrics = train_and_score(task, seed, prof, dev, key, progress)
    _commit(runs, key, model, metrics, prof)
    return TrainedRun(model, metrics, prof.model, prof, from_cache=False)


# Sustained training FLOP/s of one run on one CPU thread, measured on the old quick profile (about
# 6 * params * tokens / seconds); only for the expected time that train_many warns with.
CPU_FLOPS_PER_RUN = 3e10


def expected_cpu_seconds(profile: TrainProfile) -> float:
    """Rough seconds one run of ``profile`` trains on one CPU thread: 6 FLOPs per parameter
    and token (forward and backward), every row at the longest task's length, the steps
    averaged over the tasks (``task_budgets``)."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        n_params = GPT(profile.model).num_params()
    rows = sum(profile.for_task(t).steps * profile.for_task(t).batch_size for t in TASKS)
    tokens = rows / len(TASKS) * MAX_SEQ_LEN
    return 6 * n_params * tokens / CPU_FLOPS_PER_RUN


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this process when the parent dies or is interrupted.

    Linux delivers SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG; strictly, when the
    thread that started the worker ends: train_many's caller); a daemon thread also polls the
    parent's id, the only mechanism elsewhere. SIGINT is ignored: Ctrl-C reaches the whole process group,
    and the parent decides (it cancels queued runs and terminates the running ones).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _train_in_worker(task: str, seed: int, profile: str | TrainProfile, device: str,
                     cache_dir: str | Path | None) -> None:
    train_or_load(task, seed, profile, device=device, cache_dir=cache_dir, progress=False)


def _train_in_pool(jobs: list[tuple[str, int, TrainProfile]], device: str,
                   cache_dir: str | Path | None, n_workers: int) -> None:
    """Train ``jobs`` (task, seed, profile) in ``n_workers`` spawned processes that cannot
    outlive this one.

    On any exception, KeyboardInterrupt included, queued runs are cancelled and running workers
    terminated before it propagates: control returns at once, not after the runs in flight.
    """
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads
    pool = ProcessPoolExecutor(n_workers, mp_context=context, initializer=_die_with_parent,
                               initargs=(os.getpid(),))
    futures = []
    try:
        futures += [pool.submit(_train_in_worker, t, s, prof, device, cache_dir)
                    for t, s, prof in jobs]
        for future in tqdm(futures, desc=f"training {len(jobs)} runs on {n_workers} processes"):
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        for process in list((pool._processes or {}).values()):  # no public API to stop workers
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def train_missing(jobs: list[tuple[str, int, str | TrainProfile]], device: str = "auto",
                  cache_dir: str | Path | None = None,
                  workers: int | None = None) -> list[tuple[str, int, TrainProfile]]:
    """Train the (task, seed, profile) jobs that the cache lacks, and return them.

    On the CPU with more than one worker they train in one pool (``workers`` processes, default
    one per core), the costliest first (a run's time grows with its steps, batch and task
    length), so workers idle less while the last finishes; the jobs may mix profiles, as the
    recipe study's NoPE and learned-position runs do. Otherwise they are left to the caller,
    which trains them in its own process (``train_or_load``). Training expected to take over an
    hour on the CPU warns first, with the expected time.
    """
    dev = resolve_device(device)
    root = resolve_cache_dir(cache_dir) / "runs"
    jobs = [(t, s, get_profile(p)) for t, s, p in jobs]
    by_key = {run_key(t, s, p, dev): (t, s, p) for t, s, p in jobs}  # a job listed twice: once
    missing = [job for key, job in by_key.items() if _load(root / key, key, job[2]) is None]

    def cost(job: tuple[str, int, TrainProfile]) -> int:
        own = job[2].for_task(job[0])
        return own.steps * own.batch_size * get_task(job[0]).max_input_len

    missing.sort(key=cost, reverse=True)
    n_workers = min(workers or os.cpu_count() or 1, len(missing))
    if dev.type == "cpu" and missing:
        seconds = sum(expected_cpu_seconds(p) for _, _, p in missing)
        hours = seconds / max(1, n_workers) / 3600
        if hours > 1:
            names = sorted({p.name for _, _, p in missing})
            warnings.warn(f"training {len(missing)} runs of profile(s) {names} on the CPU is "
                          f"expected to take about {hours:.0f} h on {n_workers} processes; "
                          "a GPU (device='cuda') or profile 'cpu' is faster", stacklevel=3)
    if dev.type == "cpu" and n_workers > 1:
        _train_in_pool(missing, device, cache_dir, n_workers)
    return missing


def train_many(
    runs: list[tuple[str, int]],
    profile: str | TrainProfile = "cpu",
    device: str = "auto",
    cache_dir: str | Path | None = None,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    gpu_fraction: float | None = None,
) -> dict[tuple[str, int], TrainedRun]:
    """``train_or_load`` for every (task, seed), the missing CPU runs trained in parallel.

    ``backend="local"`` (the default) trains here, as below; ``backend="ray"`` trains the missing
    runs as Ray tasks, on a Ray instance started for the call or on the cluster at ``address``
    (or $NOPELIB_RAY_ADDRESS), each task asking for one CPU, or ``gpu_fraction`` of a GPU
    (``nopelib.distributed``). Either way a run has the same cache key and, on the CPU, the
    same weights, and is committed to this process's cache.

    On the CPU, each run trains on one thread (see ``train_or_load``), so ``workers`` processes
    (default: one per core) train that many runs at once, and the results are identical to
    training them one by one. On an accelerator the runs train one after another in this
    process. Every run is committed to the cache by whoever trains it and loaded from there.
    A (task, seed) listed twice is trained once. Training that is expected to take over an hour
    on the CPU warns first, with the expected time. Workers die with this process, and an
    interrupt (Ctrl-C) cancels queued runs and terminates running ones.
    """
    prof = get_profile(profile)
    runs = list(dict.fromkeys((t, s) for t, s in runs))  # duplicates train once; order kept
    for task, _ in runs:
        get_task(task)
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; allowed: {BACKENDS}")
    if backend == "ray":
        from nopelib import distributed  # ray is imported only when asked for

        return distributed.train_many_ray(runs, prof, device, cache_dir, address=address,
                                          gpu_fraction=gpu_fraction, workers=workers)
    dev = resolve_device(device)
    root = resolve_cache_dir(cache_dir) / "runs"
    keys = {(t, s): run_key(t, s, prof, dev) for t, s in runs}
    missing = {(t, s) for t, s, _ in train_missing([(t, s, prof) for t, s in runs], device,
                                                  cache_dir, workers)}
    done = {}
    for t, s in runs:
        # by the keys of the start: sources edited while the pool trained do not retrain here
        loaded = _load(root / keys[t, s], keys[t, s], prof)
        if loaded is None:  # one worker, an accelerator, or an entry that proved unusable
            done[t, s] = train_or_load(t, s, prof, device=device, cache_dir=cache_dir)
        else:
            done[t, s] = TrainedRun(*loaded, prof.model, prof, from_cache=(t, s) not in missing)
    return done
