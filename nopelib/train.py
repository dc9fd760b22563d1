"""The training loop and exact-match evaluation, nanoGPT-style.

A run is trained with the loss on the answer tokens only, AdamW (decay on matrices only) with a
linear warm-up and cosine decay, and gradient clipping. ``fit`` is the one loop: it draws each
model's batches in its own seeded order, sets the learning rate, reads the loss every
``log_every`` steps (the only host syncs) and scores the learning curve; how one step updates
the models is the caller's. ``train`` plugs in one model's step (``train_step``);
``nopelib.batched`` plugs in the step of several seeds trained as one batched model.

Evaluation is exact match of greedy decoding, computed with one teacher-forced pass per batch
(``evaluate``); ``greedy_accuracy`` decodes token by token as the reference it is tested against.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from tqdm import tqdm

from nopelib.metrics import layer_scores
from nopelib.model import GPT
from nopelib.profiles import TrainProfile
from nopelib.tasks import (EOS_ID, IGNORE_INDEX, MAX_SEQ_LEN, encode, encode_batch,
                           encode_inputs, make_split, sample_inputs)

DEVICES = ("auto", "cpu", "cuda", "mps")
TRAJECTORY_SEED = 12345  # the trajectory inputs: tasks.sample_inputs(task, n, 12345)


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
def dtype_policy(device_type: str) -> str:
    """How ``train`` computes on a device type: bfloat16 autocast on CUDA, float32 elsewhere."""
    return "autocast-bfloat16" if device_type == "cuda" else "float32"


def autocast_for(device: torch.device) -> AbstractContextManager:
    """bfloat16 autocast on CUDA (``dtype_policy``); float32, no autocast, elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def adamw(params: Iterable[torch.Tensor], profile: TrainProfile, fused: bool | None = None,
          stacked: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (and the tied embedding) only, as in nanoGPT;
    ``stacked`` parameters carry a leading seed dimension (``nopelib.batched``).

    ``fused`` selects the single-kernel update; None picks it on CUDA, as nanoGPT does there (on
    the CPU it bought 2 % in the benchmark, so the CPU keeps the default).
    """
    params = [p for p in params if p.requires_grad]
    matrix = 3 if stacked else 2  # a matrix has two dimensions per model
    decay = [p for p in params if p.dim() >= matrix]
    no_decay = [p for p in params if p.dim() < matrix]
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




# one optimizer step: (rows [S, B] of each model's training split, T positions, learning
# rate) -> each model's loss [S], detached, on the device
StepFn = Callable[[np.ndarray, int, float], torch.Tensor]
# one curve point of every model: [S] dicts with "accuracy" (exact match on the first n_curve
# test examples) and, where the profile asks for them, "val_accuracy" and "scores"
CurveFn = Callable[[], list[dict]]


def fit(profile: TrainProfile, seeds: Sequence[int], lengths: np.ndarray, step: StepFn,
        curve: CurveFn, device: torch.device, desc: str, progress: bool = True) -> list[dict]:
    """The training loop of ``len(seeds)`` models trained side by side (one, for a plain run).

    ``lengths`` [S, N] holds each model's training rows' lengths (input + answer + end token):
    each batch is cut to its longest row, decided on the host without a device sync. Every
    model draws its rows from its own ``numpy.random.default_rng(seed)``, a fresh permutation
    each epoch (the ragged tail dropped). ``curve()`` scores every model every ``curve_every``
    steps, outside the timed steps. With ``profile.stop_at`` the budget follows progress: once
    every model's validation exact match is at ``stop_at`` at a curve point, the run trains
    ``profile.tail_steps`` more steps with a decaying learning rate and ends (``steps`` caps
    it); with ``profile.relearn_below``, a validation point below it in the tail keeps the
    run going, and the tail is counted afresh once validation is back at ``stop_at``.
    Returns each model's training metrics."""
    S, N = lengths.shape
    B = profile.batch_size
    gens = [np.random.default_rng(seed) for seed in seeds]
    orders, cursor = [g.permutation(N) for g in gens], 0
    loss_sum = torch.zeros(S, device=device)  # summed on the device, read every log_every
    losses: list[list[float]] = []  # [log points][S]
    curves: list[dict[str, list]] = [defaultdict(list) for _ in range(S)]
    curve_seconds, tokens = 0.0, 0
    end, decay_from = profile.steps, None  # the run's last step, once its budget is known
    relearning, restarts = False, []  # below relearn_below in the tail; where it restarted
    bar = tqdm(total=profile.steps, desc=desc, disable=not progress, mininterval=1.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    i = 0
    while i < end:
        if cursor + B > N:  # a new epoch for every model: reshuffle, drop the ragged tail
            orders, cursor = [g.permutation(N) for g in gens], 0
        rows = np.stack([order[cursor:cursor + B] for order in orders])  # [S, B]
        cursor += B
        T = int(np.take_along_axis(lengths, rows, axis=1).max()) - 1  # positions that predict
        tokens += S * B * T
        step_losses = step(rows, T, profile.lr_at(i, decay_from, end))  # [S]
        loss_sum += step_losses
        i += 1
        if i % profile.log_every == 0 or i == end:
            n = ((i - 1) % profile.log_every) + 1
            losses.append([x / n for x in loss_sum.tolist()])  # the one host sync
            loss_sum.zero_()
            bar.set_postfix(loss=f"{np.mean(losses[-1]):.4f}")
            bar.update(n)
        if profile.curve_every and (i % profile.curve_every == 0 or i == end):
            # curve() draws no random numbers: the trajectory is the same without a curve
            tic = time.perf_counter()
            points = curve()
            for s, point in enumerate(points):
                curves[s]["step"].append(i)
                curves[s]["loss"].append(float(step_losses[s]))
                for name, value in point.items():
                    curves[s][name].append(value)
            curve_seconds += time.perf_counter() - tic
            if profile.stop_at:
                val = [p["val_accuracy"] for p in points]
                if decay_from is None and min(val) >= profile.stop_at:
                    decay_from, end = i, min(profile.steps, i + profile.tail_steps(i))
                elif decay_from is not None and min(val) < profile.relearn_below:
                    relearning = True  # lost in the tail: the run may not end like this
                elif relearning and min(val) >= profile.stop_at:
                    relearning, end = False, max(end, min(profile.steps,
                                                          i + profile.tail_steps(i)))
                    restarts.append(i)
                if relearning:
                    end = max(end, min(profile.steps, i + profile.curve_every))
                bar.total = end
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start - curve_seconds
    bar.close()
    out = []
    for s in range(S):
        curve_s = [row[s] for row in losses]
        metrics = {"train_seconds": seconds, "steps": end,
                   "step_ms": 1000 * seconds / end, "tokens_per_s": tokens / seconds,
                   "final_loss": curve_s[-1], "loss_curve": curve_s, "device": str(device)}
        if profile.curve_every:
            metrics["curve"] = dict(curves[s])
            metrics["curve_seconds"] = curve_seconds
        if profile.stop_at:
            metrics["decay_from"] = decay_from  # None: the cap ended the run first
            metrics["tail_restarts"] = restarts  # steps where the tail was counted afresh
        out.append(metrics)
    return out


def train(
    task: str, seed: int, profile: TrainProfile, device: torch.device, progress: bool = True
) -> tuple[GPT, dict]:
    """Train one run from scratch; returns the model (on ``device``, eval mode) and its
    training metrics (with the profile's ``n_trajectory``: the adjacency score of every layer
    on fixed task inputs at initialisation, ``scores_init``, and at every curve point)."""
    profile = profile.for_task(task)
    split = make_split(task, seed, n_train=profile.n_train, n_test=profile.n_test,
                       n_val=profile.n_val)
    idx_all, tgt_all = encode_batch(split.train, block_size=MAX_SEQ_LEN)  # [N, T], [N, T]
    idx_all, tgt_all = idx_all.to(device), tgt_all.to(device)
    lengths = np.array([[len(x) + len(a) + 1 for x, a in split.train]])  # [1, N]
    texts = sample_inputs(task, profile.n_trajectory, seed=TRAJECTORY_SEED)

    torch.manual_seed(seed)  # same draw as analysis.random_model(config, seed)
    model = GPT(profile.model).to(device).train()
    opt = adamw(model.parameters(), profile)
    autocast = autocast_for(device)
    scores_init = trajectory_scores(model, texts)

    def step(rows: np.ndarray, T: int, lr: float) -> torch.Tensor:
        rows_t = torch.from_numpy(rows[0]).to(device)
        idx, targets = idx_all[rows_t, :T], tgt_all[rows_t, :T]  # [B, T]
        for group in opt.param_groups:
            group["lr"] = lr
        return train_step(model, opt, idx, targets, profile.grad_clip, autocast)[None]  # [1]

    def curve() -> list[dict]:  # evaluate() switches to eval mode and back
        point = {"accuracy": evaluate(model, split.test[:profile.n_curve],
                                      profile.eval_batch_size)}
        if split.val:
            point["val_accuracy"] = evaluate(model, split.val, profile.eval_batch_size)
        if texts:
            point["scores"] = trajectory_scores(model, texts)
        return [point]

    (metrics,) = fit(profile, [seed], lengths, step, curve, device, f"{task} seed {seed}",
                     progress)
    if texts:
        metrics["scores_init"] = scores_init
    return model.eval(), metrics


def trajectory_scores(model: GPT, texts: list[str]) -> list[float]:
    """The mean adjacency score of every layer over ``texts`` ([L+1]; empty without texts),
    in eval mode and back."""
    if not texts:
        return []
    was_training = model.training
    scores = layer_scores(model.eval(), texts).mean(0)  # [L+1]
    model.train(was_training)
    return [float(x) for x in scores]


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

