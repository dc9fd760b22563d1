"""Several seeds of one configuration trained as one batched model (for a GPU).

A run of the paper's 10.6 M model at batch 256 leaves a large GPU mostly idle: every step is a
few dozen small kernel launches. ``train_seeds`` trains S seeds of one task at once: the S
models' parameters are stacked (``torch.func.stack_module_state``: every tensor gains a
leading seed axis) and one vmapped forward and backward (``torch.func.vmap`` over
``torch.func.functional_call``) runs all S models, so each kernel does S runs' work.

Each seed keeps everything that makes it that seed: its initialisation (``torch.manual_seed``,
as ``train.train``), its train split, its shuffling generator and its AdamW state; gradient
clipping is per seed (each seed's own global norm), and the loss summed over seeds gives each
seed's parameters exactly its own gradient. What differs from separate runs is only rounding:
a step pads every seed's batch to the longest row of all S batches (padding is ignored by the
loss and, being later, unseen by a causal model's earlier positions), and the kernels reduce
in another order. So a batched run equals a separate one within float tolerance, not bit for
bit (tests/test_batched.py measures the difference), and is cached under its own key: its
profile is ``profile.batched()``, named ``<name>+batched``. The loop is ``train.fit``, the one
every run trains in; this module supplies the batched step.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from nopelib.model import GPT
from nopelib.profiles import TrainProfile
from nopelib.runs import Job, commit_run, score
from nopelib.tasks import IGNORE_INDEX, MAX_SEQ_LEN, PAD_ID, encode_batch, make_split
from nopelib.train import adamw, autocast_for, evaluate, fit


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


def train_seeds(task: str, seeds: list[int], profile: TrainProfile,
                device: torch.device) -> list[tuple[GPT, dict]]:
    """Train ``seeds`` of (task, profile) as one batched model; per seed, the model (on
    ``device``, eval mode) and the training metrics ``train.train`` records."""
    profile = profile.for_task(task)
    if profile.stop_at or profile.n_trajectory:
        raise ValueError(f"profile {profile.name!r}: batched seeds train a fixed budget "
                         f"without a trajectory (stop_at={profile.stop_at}, n_trajectory="
                         f"{profile.n_trajectory}; both must be 0): each seed's budget would "
                         "follow its own progress")
    S = len(seeds)
    splits = [make_split(task, s, n_train=profile.n_train, n_test=profile.n_test) for s in seeds]
    data = [encode_batch(sp.train, block_size=MAX_SEQ_LEN) for sp in splits]  # [N, T] pairs
    width = max(d[0].shape[1] for d in data)  # each split is padded to its own longest row
    idx_all = torch.stack([F.pad(d[0], (0, width - d[0].shape[1]), value=PAD_ID)
                           for d in data]).to(device)  # [S, N, W]
    tgt_all = torch.stack([F.pad(d[1], (0, width - d[1].shape[1]), value=IGNORE_INDEX)
                           for d in data]).to(device)  # [S, N, W]
    lengths = np.stack([[len(x) + len(a) + 1 for x, a in sp.train] for sp in splits])  # [S, N]
    models = []
    for seed in seeds:
        torch.manual_seed(seed)  # each seed's own initialisation, as in train.train
        models.append(GPT(profile.model).to(device).train())
    params, buffers = stack_module_state(models)  # {name: [S, ...]}, leaves
    params = {k: v.detach().requires_grad_() for k, v in params.items()}
    # fused attention as train.train on the CPU (vmap loops over seeds there, a slow path the
    # CPU can afford); explicit attention on a GPU, where every op has a batching rule
    attn_impl = "fused" if device.type == "cpu" else "explicit"
    loss_of = _Loss(copy.deepcopy(models[0]).to("meta"), attn_impl)

    def one(p: dict, b: dict, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        named = {f"gpt.{k}": v for k, v in p.items()}
        # the head is tied to the embedding; named explicitly, the tie holds on the meta copy
        named["gpt.lm_head.weight"] = p["transformer.wte.weight"]
        return functional_call(loss_of, (named, {f"gpt.{k}": v for k, v in b.items()}),
                               (idx, tgt))

    losses_of = vmap(one)  # per-seed losses [S]
    opt = adamw(params.values(), profile, stacked=True)
    autocast = autocast_for(device, profile.precision)

    def step(rows: np.ndarray, T: int, lr: float) -> torch.Tensor:
        rows_t = torch.from_numpy(rows).to(device)  # [S, B]
        pick = rows_t[:, :, None].expand(*rows.shape, width)
        idx = idx_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        targets = tgt_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        for group in opt.param_groups:
            group["lr"] = lr
        with autocast:
            step_losses = losses_of(params, buffers, idx, targets)  # [S]
        opt.zero_grad(set_to_none=True)
        step_losses.sum().backward()  # each seed's parameters get their own gradient
        _clip_per_seed([p.grad for p in params.values()], profile.grad_clip)
        opt.step()
        return step_losses.detach()

    def curve() -> list[dict]:
        _unstack(models, params)
        return [{"accuracy": evaluate(model, splits[s].test[:profile.n_curve],
                                      profile.eval_batch_size)}
                for s, model in enumerate(models)]

    metrics = fit(profile, seeds, lengths, step, curve, device,
                  f"{task} seeds {list(seeds)}", progress=False)
    _unstack(models, params)
    for m in metrics:
        m["batched_seeds"] = list(seeds)
    return [(model.eval(), m) for model, m in zip(models, metrics)]


def train_jobs(missing: list[Job], device: torch.device, root: Path) -> None:
    """The batched backend of ``launch.train_missing``: the missing seeds of each (task,
    profile) trained as one batched model on ``device``, scored and committed to the run
    cache under ``root`` (their profile is already the ``batched()`` one)."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in missing:
        groups.setdefault((job.task, job.profile.name), []).append(job)
    for jobs in groups.values():
        first = jobs[0]
        trained = train_seeds(first.task, [job.seed for job in jobs], first.profile, device)
        for job, (model, metrics) in zip(jobs, trained):
            model, metrics = score(model, metrics, job.task, job.seed, job.profile, device,
                                   job.key)
            commit_run(root, job.key, model, metrics, job.profile)
