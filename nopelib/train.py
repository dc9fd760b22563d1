"""Training on the four tasks, exact-match evaluation, and a run cache.

A run is one (task, seed, profile): the model is initialised with ``torch.manual_seed(seed)``
(the same draw as ``analysis.random_model(config, seed)``, so "before training" is exactly the
starting point), trained with the loss on the answer tokens only, AdamW with a linear warm-up
and cosine decay, and gradient clipping, then scored by the exact match of greedy decoding on a
fixed prefix of the test split.

Profiles are named, frozen configurations (``PROFILES``): ``quick`` trains on a 2-core CPU in
minutes, ``paper`` is the base 10.6 M model with a budget meant for one GPU. Nothing else in
this module branches on the profile name.

Finished runs are cached (weights as safetensors, metrics as JSON) under a key that hashes the
full model config, the profile's training fields, the task, the seed and the bytes of
nopelib's training sources (``TRAINING_SOURCES``). A run is written into a temporary
directory and renamed into place: the rename is the commit point, so an interrupted run leaves
nothing that a later call loads.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm import tqdm

from nopelib.model import GPT, GPTConfig
from nopelib.tasks import EOS_ID, IGNORE_INDEX, MAX_SEQ_LEN, encode, encode_batch, encode_inputs, get_task, make_split

CACHE_ENV = "NOPELIB_CACHE_DIR"
DEVICES = ("auto", "cpu", "cuda", "mps")
_PACKAGE_DIR = Path(__file__).resolve().parent


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

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "n_train", "n_test", "n_eval", "eval_batch_size", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be in [0, steps={self.steps}]")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be positive")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if self.n_eval > self.n_test:
            raise ValueError(f"n_eval={self.n_eval} must be <= n_test={self.n_test}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, cosine decay."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


PROFILES: dict[str, TrainProfile] = {
    # A 4-layer, 64-wide NoPE model (0.2 M parameters), 2 seeds, about 75 s per run on one
    # CPU thread (train_many trains two at a time on 2 cores). Smaller than the paper's base
    # model: the chapter says so. Small batches: on this budget more steps beat larger batches.
    "quick": TrainProfile(
        name="quick",
        model=GPTConfig(n_layer=4, n_head=4, n_embd=64),
        steps=1500,
        batch_size=32,
        lr=3e-3,
        min_lr_ratio=0.1,
        warmup_steps=100,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=1_000,
        eval_batch_size=500,
        log_every=50,
        seeds=(0, 1),
    ),
    # The paper's base model (6 layers x 384 wide x 6 heads, 10.6 M parameters), 5 seeds, the
    # whole test split; a budget meant for one GPU (about 10 epochs of the 20,000 examples).
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


def resolve_cache_dir(override: str | Path | None = None) -> Path:
    """Where runs are cached: ``override``, else $NOPELIB_CACHE_DIR, else the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache, then ``nopelib``)."""
    if override is not None:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nopelib"


# The modules whose code decides what a run trains into: the model, the data, the loop.
# Analysis, plotting, probe and benchmark code cannot change a trained model, so editing them
# keeps the cache.
TRAINING_SOURCES = ("model.py", "tasks.py", "train.py")


def source_hash() -> str:
    """SHA-256 of the bytes of nopelib's training sources (TRAINING_SOURCES): a change to any
    of them invalidates every cached run."""
    h = hashlib.sha256()
    for path in (_PACKAGE_DIR / name for name in TRAINING_SOURCES):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def run_key(task: str, seed: int, profile: TrainProfile) -> str:
    """The cache key of a run: the full config, the profile's training fields, task, seed, source."""
    fields = asdict(profile)
    fields.pop("seeds")  # which seeds a chapter trains does not change how one seed trains
    payload = {"task": task, "seed": seed, "profile": fields, "source": source_hash()}
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
        loss_sum += train_step(model, opt, idx, targets, profile.grad_clip, autocast)
        if (step + 1) % profile.log_every == 0 or step + 1 == profile.steps:
            n = (step % profile.log_every) + 1
            losses.append(loss_sum.item() / n)  # the one host sync per log_every steps
            loss_sum.zero_()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            bar.update(n)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
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


def _load(run_dir: Path, key: str, profile: TrainProfile) -> tuple[GPT, dict] | None:
    """The committed run under ``run_dir`` if its recorded key is ``key``; else None."""
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        return None
    metrics = json.loads(metrics_path.read_text())
    if metrics.get("key") != key:
        return None
    model = GPT(profile.model)
    load_model(model, str(run_dir / "model.safetensors"), device="cpu")
    return model.eval(), metrics


def _commit(runs: Path, key: str, model: GPT, metrics: dict) -> None:
    """Write weights and metrics to a temporary directory, then rename it to ``runs/key``."""
    runs.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=runs))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
        try:
            os.replace(tmp, runs / key)  # the commit point
        except OSError:
            if not (runs / key / "metrics.json").is_file():  # not a concurrent writer's success
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def train_or_load(
    task: str,
    seed: int = 0,
    profile: str | TrainProfile = "quick",
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
    key = run_key(task, seed, prof)
    runs = resolve_cache_dir(cache_dir) / "runs"
    loaded = _load(runs / key, key, prof)
    if loaded is not None:
        model, metrics = loaded
        return TrainedRun(model, metrics, prof.model, prof, from_cache=True)

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
    test = make_split(task, seed, n_train=prof.n_train, n_test=prof.n_test).test[: prof.n_eval]
    start = time.perf_counter()
    metrics["accuracy"] = evaluate(model, test, batch_size=prof.eval_batch_size)
    metrics["eval_seconds"] = time.perf_counter() - start
    metrics.update(
        n_test=len(test), task=task, seed=seed, key=key, profile=prof.name,
        num_params=model.num_params(), config=prof.model.to_dict(), torch=torch.__version__,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    model = model.cpu().eval()
    _commit(runs, key, model, metrics)
    return TrainedRun(model, metrics, prof.model, prof, from_cache=False)


def _train_in_worker(task: str, seed: int, profile: str | TrainProfile, device: str,
                     cache_dir: str | Path | None) -> None:
    train_or_load(task, seed, profile, device=device, cache_dir=cache_dir, progress=False)


def train_many(
    runs: list[tuple[str, int]],
    profile: str | TrainProfile = "quick",
    device: str = "auto",
    cache_dir: str | Path | None = None,
    workers: int | None = None,
) -> dict[tuple[str, int], TrainedRun]:
    """``train_or_load`` for every (task, seed), the missing CPU runs trained in parallel.

    On the CPU, each run trains on one thread (see ``train_or_load``), so ``workers`` processes
    (default: one per core) train that many runs at once, and the results are identical to
    training them one by one. On an accelerator the runs train one after another in this
    process. Every run is committed to the cache by whoever trains it and loaded from there.
    """
    prof = get_profile(profile)
    for task, _ in runs:
        get_task(task)
    dev = resolve_device(device)
    root = resolve_cache_dir(cache_dir) / "runs"
    keys = {(t, s): run_key(t, s, prof) for t, s in runs}
    missing = [(t, s) for t, s in runs if _load(root / keys[t, s], keys[t, s], prof) is None]
    # longest sequences first (a run's time grows with its task's length): the runs left for
    # the end are the short ones, so workers idle less while the last run finishes
    missing.sort(key=lambda run: -get_task(run[0]).max_input_len)
    n_workers = min(workers or os.cpu_count() or 1, len(missing))
    if dev.type == "cpu" and n_workers > 1:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads
        with ProcessPoolExecutor(n_workers, mp_context=context) as pool:
            futures = [pool.submit(_train_in_worker, t, s, prof, device, cache_dir) for t, s in missing]
            for future in tqdm(futures, desc=f"training {len(missing)} runs on {n_workers} processes"):
                future.result()
    return {(t, s): train_or_load(t, s, prof, device=device, cache_dir=cache_dir) for t, s in runs}
