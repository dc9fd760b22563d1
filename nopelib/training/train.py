"""One run trained, nanoGPT-style: AdamW, one optimizer step, and ``train``.

A run is trained with the loss on the answer tokens only, AdamW (decay on matrices only) with a
linear warm-up and cosine decay, and gradient clipping. ``train`` plugs one model's step
(``train_step``) into the one loop (``nopelib.training.loop.fit``), with the run's split,
learning curve (exact match on the first test examples, ``exact_match.evaluate``), validation
split and trajectory (every layer's adjacency score on fixed inputs, ``trajectory_scores``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

from nopelib.core.ablation import Frozen, check_parts
from nopelib.core.devices import autocast_for
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPT
from nopelib.core.tasks import MAX_SEQ_LEN, encode_batch, make_split, sample_inputs
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.training.exact_match import evaluate
from nopelib.training.loop import Checkpointing, fit
from nopelib.training.train_profile import TrainProfile

TRAJECTORY_SEED = 12345  # the trajectory inputs: tasks.sample_inputs(task, n, 12345)


def adamw(params: Iterable[torch.Tensor], profile: TrainProfile,
          fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (and the tied embedding) only, as in nanoGPT.

    ``fused`` selects the single-kernel update; None picks it on CUDA, as nanoGPT does there (on
    the CPU it bought 2 % in the benchmark, so the CPU keeps the default).
    """
    params = [p for p in params if p.requires_grad]
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
    task: str, seed: int, profile: TrainProfile, device: torch.device, progress: bool = True,
    checkpoints: RunCheckpoints | None = None, frozen: Sequence[str] = (),
    measure: Callable[[GPT], dict] | None = None,
) -> tuple[GPT, dict]:
    """Train one run, from scratch or, with ``checkpoints``, from its newest usable checkpoint
    (writing them as it goes); returns the model (on ``device``, eval mode) and its training
    metrics (with the profile's ``n_trajectory``: the adjacency score of every layer on fixed
    task inputs at initialisation, ``scores_init``, and at every curve point).

    ``frozen`` names parts held at their initial values (``nopelib.core.ablation.PARTS``);
    ``measure(model)`` adds its fields to every curve point and, as ``measure_init``, to the
    initial model (it must draw no random numbers, as the curve draws none)."""
    frozen = check_parts(frozen)
    profile = profile.for_task(task)
    split = make_split(task, seed, n_train=profile.n_train, n_test=profile.n_test,
                       n_val=profile.n_val)
    idx_all, tgt_all = encode_batch(split.train, block_size=MAX_SEQ_LEN)  # [N, T], [N, T]
    idx_all, tgt_all = idx_all.to(device), tgt_all.to(device)
    lengths = np.array([[len(x) + len(a) + 1 for x, a in split.train]])  # [1, N]
    texts = sample_inputs(task, profile.n_trajectory, seed=TRAJECTORY_SEED)

    torch.manual_seed(seed)  # same draw as one_model.random_model(config, seed)
    model = GPT(profile.model).to(device).train()
    held = Frozen(model, frozen) if frozen else None  # before the optimizer: it may untie
    opt = adamw(model.parameters(), profile)
    autocast = autocast_for(device, profile.precision)
    # a resumed run's own comes back from its checkpoint (the same numbers)
    run_fields = {"scores_init": trajectory_scores(model, texts)}
    if measure is not None:
        run_fields["measure_init"] = measure(model)
    resumable = (None if checkpoints is None
                 else Checkpointing.of_model(checkpoints, model, opt, run_fields))

    def step(rows: np.ndarray, T: int, lrs: list[float]) -> torch.Tensor:
        rows_t = torch.from_numpy(rows[0]).to(device)
        idx, targets = idx_all[rows_t, :T], tgt_all[rows_t, :T]  # [B, T]
        for group in opt.param_groups:
            group["lr"] = lrs[0]
        loss = train_step(model, opt, idx, targets, profile.grad_clip, autocast)
        if held is not None:
            held.restore()
        return loss[None]  # [1]

    def curve(_: list[int]) -> list[dict]:  # evaluate() switches to eval mode and back
        point = {"accuracy": evaluate(model, split.test[:profile.n_curve],
                                      profile.eval_batch_size)}
        if split.val:
            point["val_accuracy"] = evaluate(model, split.val, profile.eval_batch_size)
        if texts:
            point["scores"] = trajectory_scores(model, texts)
        if measure is not None:
            point.update(measure(model))
        return [point]

    (metrics,) = fit(profile, [seed], lengths, step, curve, device, f"{task} seed {seed}",
                     progress, resumable)
    if texts:
        metrics["scores_init"] = run_fields["scores_init"]
    if measure is not None:
        metrics["measure_init"] = run_fields["measure_init"]
    if frozen:
        metrics["frozen"] = list(frozen)
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
