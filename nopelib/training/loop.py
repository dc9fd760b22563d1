"""The training loop (``fit``): one loop for one run and for several seeds trained as one.

``fit`` draws each model's batches in its own seeded order, sets the learning rate, reads the
loss every ``log_every`` steps (the only host syncs) and scores the learning curve; how one
step updates the models is the caller's (``train.train_step`` for one run,
``nopelib.training.batched`` for batched seeds). Each model keeps its own budget: a fixed
number of steps, or one that follows its progress (a validation split at the profile's level,
then a decaying tail, counted afresh when it relearns). Given a run's checkpoints
(``nopelib.store.checkpoint``), ``fit`` saves the loop's state with the caller's models and
optimizers every few minutes (``Checkpointing``) and a stopped run goes on from there, ending
bit for bit as if it had never stopped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from nopelib.store.checkpoint import RunCheckpoints
from nopelib.training.train_profile import TrainProfile


# one optimizer step: (rows [S, B] of each model's training split, T positions, each model's
# learning rate [S]; 0.0 for a model whose run has ended, which must then not change) -> each
# model's loss [S], detached, on the device
StepFn = Callable[[np.ndarray, int, list[float]], torch.Tensor]
# one curve point of the models named by their indices: a dict each with "accuracy" (exact
# match on the first n_curve test examples) and, where the profile asks for them,
# "val_accuracy" and "scores"
CurveFn = Callable[[list[int]], list[dict]]


@dataclass(frozen=True)
class Checkpointing:
    """What ``fit`` needs to checkpoint a run and resume it: the run's checkpoints, and the
    caller's part of its state (models, optimizers, fields of its own): ``save()`` returns
    its tensors and JSON fields, ``load(tensors, fields)`` puts them back, and ``shapes`` names
    every tensor ``save`` returns with its shape (a checkpoint with others is not used)."""

    checkpoints: RunCheckpoints
    shapes: dict[str, tuple[int, ...]]
    save: Callable[[], tuple[dict[str, torch.Tensor], dict]]
    load: Callable[[dict[str, torch.Tensor], dict], None]

    @classmethod
    def of_model(cls, checkpoints: RunCheckpoints, model: torch.nn.Module,
                 opt: torch.optim.Optimizer, fields: dict) -> Checkpointing:
        """Checkpointing of one model and its AdamW: the tensors ``model.<parameter>`` and
        ``optimizer.<j>.<state>`` (j numbers the parameters as ``opt.state_dict`` does), the
        param groups, and the caller's JSON ``fields`` (replaced in place on resume)."""
        params = [p for group in opt.param_groups for p in group["params"]]
        shapes = {f"model.{name}": tuple(p.shape) for name, p in model.named_parameters()}
        for j, p in enumerate(params):  # both moments and the step count
            shapes.update({f"optimizer.{j}.exp_avg": tuple(p.shape),
                           f"optimizer.{j}.exp_avg_sq": tuple(p.shape),
                           f"optimizer.{j}.step": ()})

        def save() -> tuple[dict[str, torch.Tensor], dict]:
            state = opt.state_dict()
            tensors = {f"model.{name}": p for name, p in model.named_parameters()}
            tensors.update({f"optimizer.{j}.{name}": t for j, per_param in state["state"].items()
                            for name, t in per_param.items()})
            return tensors, {"param_groups": state["param_groups"], **fields}

        def load(tensors: dict[str, torch.Tensor], saved: dict) -> None:
            groups = [{**g, "betas": tuple(g["betas"])} for g in saved["param_groups"]]
            mine = {k: saved[k] for k in fields}  # read all before changing anything
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(tensors[f"model.{name}"])
            opt.load_state_dict({"state": {j: {name: tensors[f"optimizer.{j}.{name}"]
                                               for name in ("step", "exp_avg", "exp_avg_sq")}
                                           for j in range(len(params))},
                                 "param_groups": groups})
            fields.update(mine)

        return cls(checkpoints, shapes, save, load)


@dataclass
class _Loop:
    """Where ``fit``'s loop stands, the models aside: all that a resumed run needs to go on as
    if it had never stopped (``tensors`` and ``fields`` are its part of a checkpoint). Each
    model has its own budget (``end``, ``decay_from``, ``relearning``, ``restarts``): models
    trained side by side follow their own progress, and one whose budget is spent stops
    changing while the others go on."""

    gens: list[np.random.Generator]  # each model's data order
    orders: list[np.ndarray]  # each model's permutation of its rows, this epoch
    loss_sum: torch.Tensor  # [S], summed on the device, read every log_every
    curves: list[dict[str, list]]  # each model's learning curve
    end: list[int]  # each model's last step, once its budget is known
    cursor: int = 0  # rows of this epoch drawn
    i: int = 0  # steps taken
    losses: list[list[float]] = field(default_factory=list)  # each model's [log points]
    logged: list[int] = field(default_factory=list)  # each model's last log step
    curve_seconds: list[float] = field(default_factory=list)  # each model's share
    tokens: list[int] = field(default_factory=list)  # each model's tokens trained on
    decay_from: list[int | None] = field(default_factory=list)  # where each tail began
    relearning: list[bool] = field(default_factory=list)  # below relearn_below in the tail
    restarts: list[list[int]] = field(default_factory=list)  # where tails were counted afresh
    seconds: float = 0.0  # training seconds of the run's earlier segments (before a stop)
    resumed_at: list[int] = field(default_factory=list)  # the steps it went on from
    ended_seconds: list[float | None] = field(default_factory=list)  # training s at each end

    @classmethod
    def start(cls, seeds: Sequence[int], n_rows: int, steps: int,
              device: torch.device) -> _Loop:
        gens, S = [np.random.default_rng(seed) for seed in seeds], len(seeds)
        return cls(gens, [g.permutation(n_rows) for g in gens],
                   torch.zeros(S, device=device), [defaultdict(list) for _ in seeds],
                   end=[steps] * S, losses=[[] for _ in seeds], logged=[0] * S,
                   curve_seconds=[0.0] * S, tokens=[0] * S,
                   decay_from=[None] * S, relearning=[False] * S,
                   restarts=[[] for _ in seeds], ended_seconds=[None] * S)

    def live(self) -> list[int]:
        """The models whose budget has steps left."""
        return [s for s, end in enumerate(self.end) if self.i < end]

    def draw(self, batch_size: int) -> np.ndarray:
        """Each model's next batch of rows [S, B]: a new permutation every epoch, the ragged
        tail dropped."""
        n_rows = len(self.orders[0])
        if self.cursor + batch_size > n_rows:
            self.orders, self.cursor = [g.permutation(n_rows) for g in self.gens], 0
        rows = np.stack([order[self.cursor:self.cursor + batch_size] for order in self.orders])
        self.cursor += batch_size
        return rows

    def follow(self, profile: TrainProfile, s: int, val: float) -> None:
        """Model ``s``'s budget that follows progress, at a curve point where its validation
        exact match is ``val`` (see ``fit``)."""
        i, cap = self.i, profile.steps
        if self.decay_from[s] is None and val >= profile.stop_at:
            self.decay_from[s], self.end[s] = i, min(cap, i + profile.tail_steps(i))
        elif self.decay_from[s] is not None and val < profile.relearn_below:
            self.relearning[s] = True  # lost in the tail: the run may not end like this
        elif self.relearning[s] and val >= profile.stop_at:
            self.relearning[s] = False
            self.end[s] = max(self.end[s], min(cap, i + profile.tail_steps(i)))
            self.restarts[s].append(i)
        if self.relearning[s]:
            self.end[s] = max(self.end[s], min(cap, i + profile.curve_every))

    def tensors(self) -> dict[str, torch.Tensor]:
        # torch's generator draws nothing in a run today (no dropout); kept for one that does
        return {"loop.orders": torch.from_numpy(np.stack(self.orders)),
                "loop.loss_sum": self.loss_sum, "loop.torch_rng": torch.get_rng_state()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.tensors().items()}

    def fields(self, seconds: float) -> dict:
        """The JSON part; ``seconds``: the run's training seconds so far."""
        return {"generators": [g.bit_generator.state for g in self.gens],
                "cursor": self.cursor, "i": self.i, "losses": self.losses, "logged": self.logged,
                "curves": [dict(c) for c in self.curves], "curve_seconds": self.curve_seconds,
                "tokens": self.tokens, "end": self.end, "decay_from": self.decay_from,
                "relearning": self.relearning, "restarts": self.restarts, "seconds": seconds,
                "resumed_at": self.resumed_at, "ended_seconds": self.ended_seconds}

    @classmethod
    def restored(cls, tensors: dict[str, torch.Tensor], fields: dict,
                 device: torch.device) -> _Loop:
        """The loop a checkpoint saved (``tensors``, ``fields``), going on from its step."""
        gens = []
        for state in fields["generators"]:
            gen = np.random.Generator(np.random.PCG64())
            gen.bit_generator.state = state  # another generator's state is a ValueError
            gens.append(gen)
        orders = list(tensors["loop.orders"].numpy())
        per_model = ("losses", "logged", "curves", "curve_seconds", "tokens", "end",
                     "decay_from", "relearning", "restarts", "ended_seconds")
        wrong = [name for name in per_model if len(fields[name]) != len(gens)]
        if len(gens) != len(orders) or wrong:
            raise ValueError(f"{len(gens)} generators for {len(orders)} data orders and "
                             f"per-model fields {wrong} of other lengths")
        return cls(gens, orders, tensors["loop.loss_sum"].to(device),
                   [defaultdict(list, c) for c in fields["curves"]], end=fields["end"],
                   cursor=fields["cursor"], i=fields["i"], losses=fields["losses"],
                   logged=fields["logged"], curve_seconds=fields["curve_seconds"],
                   tokens=fields["tokens"],
                   decay_from=fields["decay_from"], relearning=fields["relearning"],
                   restarts=fields["restarts"], seconds=fields["seconds"],
                   resumed_at=[*fields["resumed_at"], fields["i"]],
                   ended_seconds=fields["ended_seconds"])


def _resume(checkpointing: Checkpointing, fresh: _Loop, device: torch.device) -> _Loop:
    """The loop of the run's newest usable checkpoint, its models and optimizers restored;
    ``fresh`` (the run from step 0) without one."""

    def restore(tensors: dict[str, torch.Tensor], fields: dict) -> _Loop:
        loop = _Loop.restored(tensors, fields["loop"], device)  # checks before any change
        checkpointing.load(tensors, fields["caller"])
        torch.set_rng_state(tensors["loop.torch_rng"])
        return loop

    shapes = {**checkpointing.shapes, **fresh.shapes()}
    return checkpointing.checkpoints.resume(shapes, restore) or fresh


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit(profile: TrainProfile, seeds: Sequence[int], lengths: np.ndarray, step: StepFn,
        curve: CurveFn, device: torch.device, desc: str, progress: bool = True,
        checkpointing: Checkpointing | None = None) -> list[dict]:
    """The training loop of ``len(seeds)`` models trained side by side (one, for a plain run).

    ``lengths`` [S, N] holds each model's training rows' lengths (input + answer + end token):
    each batch is cut to the longest row of the models still training, decided on the host
    without a device sync. Every model draws its rows from its own
    ``numpy.random.default_rng(seed)``, a fresh permutation each epoch (the ragged tail
    dropped). ``curve(models)`` scores the models at their curve steps
    (``TrainProfile.is_curve_step``), outside the timed steps. With ``profile.stop_at`` each
    model's budget follows its own progress: once its validation exact match is at
    ``stop_at`` at a curve point, it trains ``profile.tail_steps`` more steps with a decaying
    learning rate and ends (``steps`` caps it); with ``profile.relearn_below``, a validation
    point below it in the tail keeps it going, and the tail is counted afresh once validation
    is back at ``stop_at``. A model whose budget is spent gets learning rate 0.0 from the
    step function while the others go on. With ``checkpointing`` the run goes on from its
    newest usable checkpoint and writes one whenever one is due
    (``checkpoint.RunCheckpoints.due``), outside the timed steps: a resumed run ends bit for
    bit as an uninterrupted one. Returns each model's training metrics."""
    S, N = lengths.shape
    B = profile.batch_size
    run = _Loop.start(seeds, N, profile.steps, device)
    if checkpointing is not None:
        run = _resume(checkpointing, run, device)
    bar = tqdm(total=max(run.end), initial=run.i, desc=desc, disable=not progress,
               mininterval=1.0)
    _sync(device)
    start, untimed = time.perf_counter(), 0.0  # untimed: curve points and checkpoints
    while live := run.live():
        rows = run.draw(B)  # [S, B]
        # positions that predict, for the models still training
        T = int(np.take_along_axis(lengths[live], rows[live], axis=1).max()) - 1
        lrs = [0.0] * S
        for s in live:
            run.tokens[s] += B * T
            lrs[s] = profile.lr_at(run.i, run.decay_from[s], run.end[s])
        step_losses = step(rows, T, lrs)  # [S]
        run.loss_sum += step_losses
        run.i += 1
        i = run.i
        logging = [s for s in live if i % profile.log_every == 0 or i == run.end[s]]
        if logging:
            sums = run.loss_sum.tolist()  # the one host sync
            for s in logging:
                # the steps since its last log point (fewer after an end its tail moved)
                run.losses[s].append(sums[s] / (i - run.logged[s]))
                run.loss_sum[s], run.logged[s] = 0.0, i
            bar.set_postfix(loss=f"{np.mean([run.losses[s][-1] for s in logging]):.4f}")
            bar.update(i - bar.n)
        due = [s for s in live if profile.is_curve_step(i, run.end[s])]
        if due:
            # curve() draws no random numbers: the trajectory is the same without a curve
            tic = time.perf_counter()
            for s, point in zip(due, curve(due)):
                run.curves[s]["step"].append(i)
                run.curves[s]["loss"].append(float(step_losses[s]))
                run.curves[s]["lr"].append(lrs[s])  # of the step just taken
                for name, value in point.items():
                    run.curves[s][name].append(value)
                if profile.stop_at:
                    run.follow(profile, s, point["val_accuracy"])
            bar.total = max(run.end)
            spent = time.perf_counter() - tic
            for s in due:  # the models scored share the time
                run.curve_seconds[s] += spent / len(due)
            untimed += spent
        ended = [s for s in live if i >= run.end[s]]
        if ended:
            _sync(device)
            for s in ended:
                run.ended_seconds[s] = run.seconds + time.perf_counter() - start - untimed
        if checkpointing is not None and checkpointing.checkpoints.due(i):
            _sync(device)
            tic = time.perf_counter()
            so_far = run.seconds + tic - start - untimed  # training seconds, every segment
            tensors, fields = checkpointing.save()
            checkpointing.checkpoints.save(i, {**tensors, **run.tensors()},
                                           {"loop": run.fields(so_far), "caller": fields})
            untimed += time.perf_counter() - tic
    bar.close()
    out = []
    for s in range(S):
        seconds = run.ended_seconds[s]
        metrics = {"train_seconds": seconds, "steps": run.end[s],
                   "step_ms": 1000 * seconds / run.end[s],
                   "tokens_per_s": run.tokens[s] / seconds, "final_loss": run.losses[s][-1],
                   "loss_curve": run.losses[s], "device": str(device),
                   # a stop after this model's end did not stop it (one at its last step
                   # counts, as it does for a single run)
                   "resumed_at": [at for at in run.resumed_at if at <= run.end[s]]}
        if profile.curve_every:
            metrics["curve"] = dict(run.curves[s])
            metrics["curve_seconds"] = run.curve_seconds[s]
        if profile.stop_at:
            metrics["decay_from"] = run.decay_from[s]  # None: the cap ended the run first
            metrics["tail_restarts"] = run.restarts[s]  # steps where the tail began afresh
        out.append(metrics)
    return out
