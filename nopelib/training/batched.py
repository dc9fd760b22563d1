"""Several seeds of one configuration trained as one batched model (for a GPU).

A run of the paper's 10.6 M model at batch 64 leaves a large GPU mostly idle: every step is a
few dozen small kernel launches. ``train_seeds`` trains S seeds of one task at once: the S
models' parameters are stacked (``torch.func.stack_module_state``: every tensor gains a
leading seed axis) and one vmapped forward and backward (``torch.func.vmap`` over
``torch.func.functional_call``) runs all S models, so each kernel does S runs' work.

Each seed keeps everything that makes it that seed: its initialisation (``torch.manual_seed``,
as ``train.train``), its train and validation splits, its shuffling generator, its AdamW state
and its budget. Gradient clipping is per seed (each seed's own global norm), the loss summed
over seeds gives each seed's parameters exactly its own gradient, and the optimizer
(``StackedAdamW``) is AdamW with a learning rate per seed, so a budget that follows progress
(``TrainProfile.stop_at``) is followed by every seed on its own: a seed whose budget is spent
gets learning rate 0 and stops changing while the others train on. Every curve point records
the seed's exact match, validation exact match and, with ``n_trajectory``, the adjacency
score of every layer on the fixed task inputs, as ``train.train`` does. The group is
checkpointed like a run (``nopelib.store.checkpoint``, keyed by its runs' keys): a stopped group
goes on from its last checkpoint bit for bit.

What differs from separate runs is only rounding: a step pads every seed's batch to the
longest row of the seeds still training (padding is ignored by the loss and, being later,
unseen by a causal model's earlier positions), and the kernels reduce in another order. So a
batched run equals a separate one within float tolerance, not bit for bit
(tests/training/test_batched.py measures the difference), and is cached under its own key: its profile
is ``profile.batched()``, named ``<name>+batched``. The loop is ``loop.fit``, the one every
run trains in; this module supplies the batched step, curve and checkpointed state.
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from nopelib.core.devices import autocast_for
from nopelib.core.model import GPT
from nopelib.core.tasks import (IGNORE_INDEX, MAX_SEQ_LEN, PAD_ID, encode_batch, make_split,
                                sample_inputs)
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.training.exact_match import evaluate
from nopelib.training.loop import Checkpointing, fit
from nopelib.training.runs import Job, commit_run, score
from nopelib.training.train import TRAJECTORY_SEED, trajectory_scores
from nopelib.training.train_profile import TrainProfile


class _Loss(nn.Module):
    """GPT.forward's loss without its input checks (a data-dependent read cannot run under
    vmap); the embedding, blocks and head are the model's own modules."""

    def __init__(self, gpt: GPT, attn_impl: str):
        super().__init__()
        self.gpt = gpt
        self.attn_impl = attn_impl

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.gpt.transformer.drop(self.gpt._embed(idx))  # [B, T, C]
        for block in self.gpt.transformer.h:
            x = block(x, self.attn_impl)
        logits = self.gpt.lm_head(self.gpt.transformer.ln_f(x))  # [B, T, vocab]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)


def _clip_per_seed(grads: list[torch.Tensor], max_norm: float) -> None:
    """clip_grad_norm_ for each seed: grads [S, ...] scaled by min(1, max_norm / (norm + 1e-6))
    with norm the seed's global gradient norm, as torch.nn.utils.clip_grad_norm_ does."""
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)  # [S]
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # [S]
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


def _unstack(models: list[GPT], params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for s, model in enumerate(models):
            for name, p in model.named_parameters():
                p.copy_(params[name][s])


class StackedAdamW:
    """AdamW (torch's update, decoupled decay on matrices and the tied embedding only) over
    parameters stacked on a leading seed axis, with a learning rate per seed: torch's AdamW
    takes one per group, and seeds that follow their own budgets need their own. A seed
    stepped at learning rate 0 keeps its parameters bit for bit (its moments move, unread)."""

    def __init__(self, params: dict[str, torch.Tensor], profile: TrainProfile,
                 eps: float = 1e-8):
        self.params = params  # {name: [S, ...]}
        self.betas, self.eps = profile.betas, eps
        # a matrix has two dimensions per model, three stacked
        self.decay = {k: profile.weight_decay if p.dim() >= 3 else 0.0
                      for k, p in params.items()}
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}
        self.t = 0  # steps taken (the bias corrections')

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    @torch.no_grad()
    def step(self, lrs: torch.Tensor) -> None:
        """One AdamW step of every seed, seed s at learning rate ``lrs[s]`` ([S]). A seed at
        learning rate 0 is left as it is, whatever its gradient (a seed whose budget is spent
        still runs forward and backward, on rows cut to the others' length, which may hold
        none of its targets: a NaN loss)."""
        self.t += 1
        beta1, beta2 = self.betas
        bias1, bias2_sqrt = 1 - beta1 ** self.t, math.sqrt(1 - beta2 ** self.t)
        for k, p in self.params.items():
            shape = (-1, *([1] * (p.dim() - 1)))
            lr, moving = lrs.view(shape), (lrs > 0).view(shape)  # [S, 1, ...]
            m, v = self.exp_avg[k], self.exp_avg_sq[k]
            m.copy_(torch.where(moving, m.lerp(p.grad, 1 - beta1), m))
            v.copy_(torch.where(moving, v * beta2 + (1 - beta2) * p.grad * p.grad, v))
            new = p * (1 - lr * self.decay[k]) if self.decay[k] else p.clone()
            new -= lr / bias1 * m / (v.sqrt() / bias2_sqrt + self.eps)
            p.copy_(torch.where(moving, new, p))

    def state(self) -> dict[str, torch.Tensor]:
        """Moments and parameters as named tensors, for a checkpoint."""
        out = {f"params.{k}": p.detach() for k, p in self.params.items()}
        out.update({f"exp_avg.{k}": t for k, t in self.exp_avg.items()})
        out.update({f"exp_avg_sq.{k}": t for k, t in self.exp_avg_sq.items()})
        return out

    def load(self, tensors: dict[str, torch.Tensor], t: int) -> None:
        """Parameters and moments from a checkpoint's tensors (``state``'s names), and the
        step count ``t``."""
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(tensors[f"params.{k}"])
                self.exp_avg[k].copy_(tensors[f"exp_avg.{k}"])
                self.exp_avg_sq[k].copy_(tensors[f"exp_avg_sq.{k}"])
        self.t = t


def group_key(keys: list[str]) -> str:
    """The checkpoint key of a batched group: its runs' keys, in order."""
    return hashlib.sha256(" ".join(keys).encode()).hexdigest()[:32]


def train_seeds(task: str, seeds: list[int], profile: TrainProfile, device: torch.device,
                checkpoints: RunCheckpoints | None = None,
                attn_impl: str | None = None) -> list[tuple[GPT, dict]]:
    """Train ``seeds`` of (task, profile) as one batched model, each seed on its own budget
    (from the group's newest usable checkpoint, given its ``checkpoints``, writing them as it
    goes); per seed, the model (on ``device``, eval mode) and the training metrics
    ``train.train`` records, trajectory included. ``attn_impl`` None picks the device's (fused
    on the CPU, where vmap loops over seeds, a slow path the CPU can afford; explicit on a
    GPU, where every op has a batching rule)."""
    profile = profile.for_task(task)
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds={seeds!r} must be distinct, at least one")
    splits = [make_split(task, s, n_train=profile.n_train, n_test=profile.n_test,
                         n_val=profile.n_val) for s in seeds]
    data = [encode_batch(sp.train, block_size=MAX_SEQ_LEN) for sp in splits]  # [N, T] pairs
    width = max(d[0].shape[1] for d in data)  # each split is padded to its own longest row
    idx_all = torch.stack([F.pad(d[0], (0, width - d[0].shape[1]), value=PAD_ID)
                           for d in data]).to(device)  # [S, N, W]
    tgt_all = torch.stack([F.pad(d[1], (0, width - d[1].shape[1]), value=IGNORE_INDEX)
                           for d in data]).to(device)  # [S, N, W]
    lengths = np.stack([[len(x) + len(a) + 1 for x, a in sp.train] for sp in splits])  # [S, N]
    texts = sample_inputs(task, profile.n_trajectory, seed=TRAJECTORY_SEED)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)  # each seed's own initialisation, as in train.train
        models.append(GPT(profile.model).to(device).train())
    # a resumed group's own come back from its checkpoint (the same numbers)
    run_fields = {"scores_init": [trajectory_scores(model, texts) for model in models]}
    params, buffers = stack_module_state(models)  # {name: [S, ...]}, leaves
    params = {k: v.detach().requires_grad_() for k, v in params.items()}
    if attn_impl is None:
        attn_impl = "fused" if device.type == "cpu" else "explicit"
    loss_of = _Loss(copy.deepcopy(models[0]).to("meta"), attn_impl)

    def one(p: dict, b: dict, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        named = {f"gpt.{k}": v for k, v in p.items()}
        # the head is tied to the embedding; named explicitly, the tie holds on the meta copy
        named["gpt.lm_head.weight"] = p["transformer.wte.weight"]
        return functional_call(loss_of, (named, {f"gpt.{k}": v for k, v in b.items()}),
                               (idx, tgt))

    losses_of = vmap(one)  # per-seed losses [S]
    opt = StackedAdamW(params, profile)
    autocast = autocast_for(device, profile.precision)

    def step(rows: np.ndarray, T: int, lrs: list[float]) -> torch.Tensor:
        rows_t = torch.from_numpy(rows).to(device)  # [S, B]
        pick = rows_t[:, :, None].expand(*rows.shape, width)
        idx = idx_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        targets = tgt_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        with autocast:
            step_losses = losses_of(params, buffers, idx, targets)  # [S]
        opt.zero_grad()
        step_losses.sum().backward()  # each seed's parameters get their own gradient
        _clip_per_seed([p.grad for p in params.values()], profile.grad_clip)
        opt.step(torch.tensor(lrs, dtype=torch.float32, device=device))
        return step_losses.detach()

    def curve(due: list[int]) -> list[dict]:  # evaluate() switches to eval mode and back
        _unstack(models, params)
        points = []
        for s in due:
            point = {"accuracy": evaluate(models[s], splits[s].test[:profile.n_curve],
                                          profile.eval_batch_size)}
            if splits[s].val:
                point["val_accuracy"] = evaluate(models[s], splits[s].val,
                                                 profile.eval_batch_size)
            if texts:
                point["scores"] = trajectory_scores(models[s], texts)
            points.append(point)
        return points

    resumable = None
    if checkpoints is not None:
        shapes = {name: tuple(t.shape) for name, t in opt.state().items()}

        def save() -> tuple[dict[str, torch.Tensor], dict]:
            return opt.state(), {"t": opt.t, **run_fields}

        def load(tensors: dict[str, torch.Tensor], saved: dict) -> None:
            opt.load(tensors, saved["t"])
            run_fields.update(scores_init=saved["scores_init"])

        resumable = Checkpointing(checkpoints, shapes, save, load)
    metrics = fit(profile, seeds, lengths, step, curve, device,
                  f"{task} seeds {list(seeds)}", progress=False, checkpointing=resumable)
    _unstack(models, params)
    for s, m in enumerate(metrics):
        m["batched_seeds"] = list(seeds)
        if texts:
            m["scores_init"] = run_fields["scores_init"][s]
    return [(model.eval(), m) for model, m in zip(models, metrics)]


def train_jobs(missing: list[Job], device: torch.device, root: Path) -> None:
    """The batched backend of ``launch.train_missing``: the missing seeds of each (task,
    profile) trained as one batched model on ``device`` (going on from the group's newest
    checkpoint, if a stopped call left one), scored and committed to the run folder ``root``
    (their profile is already the ``batched()`` one); the group's checkpoints live beside it,
    under ``root.parent / "checkpoints"``, as a run's do."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in missing:
        groups.setdefault((job.task, job.profile.name), []).append(job)
    for jobs in groups.values():
        first = jobs[0]
        checkpoints = RunCheckpoints(root.parent / "checkpoints", group_key([j.key for j in jobs]))
        trained = train_seeds(first.task, [job.seed for job in jobs], first.profile, device,
                              checkpoints)
        for job, (model, metrics) in zip(jobs, trained):
            model, metrics = score(model, metrics, job.task, job.seed, job.profile, device,
                                   job.key)
            commit_run(root, job.key, model, metrics, job.profile)
        checkpoints.clear()
