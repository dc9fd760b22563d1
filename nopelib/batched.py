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
profile is named ``<name>+batched``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from nopelib import train as tr
from nopelib.model import GPT
from nopelib.tasks import IGNORE_INDEX, MAX_SEQ_LEN, PAD_ID, encode_batch, get_task, make_split

SUFFIX = "+batched"


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


def batched_profile(profile: tr.TrainProfile) -> tr.TrainProfile:
    """The profile batched runs are keyed and recorded under: ``profile`` renamed."""
    name = profile.name if profile.name.endswith(SUFFIX) else profile.name + SUFFIX
    return replace(profile, name=name)


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


def train_seeds(task: str, seeds: list[int], profile: tr.TrainProfile,
                device: torch.device) -> list[tuple[GPT, dict]]:
    """Train ``seeds`` of (task, profile) as one batched model; per seed, the model (on
    ``device``, eval mode) and the training metrics ``train.train`` records."""
    profile = profile.for_task(task)
    S, B = len(seeds), profile.batch_size
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
    # AdamW as train.adamw: decay on the matrices and the tied embedding (dim >= 2 per seed)
    groups = [{"params": [p for p in params.values() if p.dim() >= 3],
               "weight_decay": profile.weight_decay},
              {"params": [p for p in params.values() if p.dim() < 3], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=profile.lr, betas=profile.betas,
                            fused=True if device.type == "cuda" else None)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else tr._NoAutocast())
    gens = [np.random.default_rng(s) for s in seeds]
    N = lengths.shape[1]
    orders, cursor = [g.permutation(N) for g in gens], 0
    loss_sum = torch.zeros(S, device=device)
    losses: list[list[float]] = []
    curves = [{"step": [], "accuracy": [], "loss": []} for _ in seeds]
    curve_seconds, tokens = 0.0, 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for step in range(profile.steps):
        if cursor + B > N:  # every seed starts a new epoch at the same step
            orders, cursor = [g.permutation(N) for g in gens], 0
        rows = np.stack([o[cursor:cursor + B] for o in orders])  # [S, B]
        cursor += B
        T = int(np.take_along_axis(lengths, rows, axis=1).max()) - 1  # the longest of all seeds
        rows_t = torch.from_numpy(rows).to(device)  # [S, B]
        pick = rows_t[:, :, None].expand(S, B, width)
        idx = idx_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        targets = tgt_all.gather(1, pick)[:, :, :T]  # [S, B, T]
        tokens += S * B * T
        for group in opt.param_groups:
            group["lr"] = profile.lr_at(step)
        with autocast:
            step_losses = losses_of(params, buffers, idx, targets)  # [S]
        opt.zero_grad(set_to_none=True)
        step_losses.sum().backward()  # each seed's parameters get their own gradient
        _clip_per_seed([p.grad for p in params.values()], profile.grad_clip)
        opt.step()
        loss_sum += step_losses.detach()
        if (step + 1) % profile.log_every == 0 or step + 1 == profile.steps:
            n = (step % profile.log_every) + 1
            losses.append((loss_sum / n).tolist())
            loss_sum.zero_()
        last = step + 1 == profile.steps
        if profile.curve_every and ((step + 1) % profile.curve_every == 0 or last):
            tic = time.perf_counter()
            _unstack(models, params)
            for s, model in enumerate(models):
                curves[s]["step"].append(step + 1)
                curves[s]["accuracy"].append(tr.evaluate(model, splits[s].test[:profile.n_curve],
                                                         profile.eval_batch_size))
                curves[s]["loss"].append(float(step_losses[s]))
            curve_seconds += time.perf_counter() - tic
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start - curve_seconds
    _unstack(models, params)
    out = []
    for s, model in enumerate(models):
        curve = [row[s] for row in losses]
        metrics = {"train_seconds": seconds, "steps": profile.steps,
                   "step_ms": 1000 * seconds / profile.steps, "tokens_per_s": tokens / seconds,
                   "final_loss": curve[-1], "loss_curve": curve, "device": str(device),
                   "batched_seeds": list(seeds)}
        if profile.curve_every:
            metrics["curve"] = curves[s]
            metrics["curve_seconds"] = curve_seconds
        out.append((model.eval(), metrics))
    return out


def train_many_batched(
    runs: list[tuple[str, int]],
    profile: str | tr.TrainProfile,
    device: str = "auto",
    cache_dir: str | Path | None = None,
) -> dict[tuple[str, int], tr.TrainedRun]:
    """``train.train_many`` with the missing seeds of each task trained as one batched model
    on ``device``, each committed to the run cache under ``batched_profile(profile)``."""
    prof = batched_profile(tr.get_profile(profile))
    runs = list(dict.fromkeys((t, s) for t, s in runs))
    for task, seed in runs:
        get_task(task)
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative integer")
    dev = tr.resolve_device(device)
    root = tr.resolve_cache_dir(cache_dir) / "runs"
    keys = {(t, s): tr.run_key(t, s, prof, dev) for t, s in runs}
    missing = [(t, s) for t, s in runs if tr._load(root / keys[t, s], keys[t, s], prof) is None]
    for task in dict.fromkeys(t for t, _ in missing):
        seeds = [s for t, s in missing if t == task]
        for seed, (model, metrics) in zip(seeds, train_seeds(task, seeds, prof, dev)):
            model, metrics = tr.score(model, metrics, task, seed, prof, dev, keys[task, seed])
            tr._commit(root, keys[task, seed], model, metrics, prof)
    out = {}
    for t, s in runs:
        model, metrics = tr._load(root / keys[t, s], keys[t, s], prof)
        out[t, s] = tr.TrainedRun(model, metrics, prof.model, prof,
                                  from_cache=(t, s) not in missing)
    return out
