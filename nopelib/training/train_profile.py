"""A training profile: everything that decides how a run trains and is evaluated, checked.

``TrainProfile`` holds what decides a run besides its task and seed: the model configuration,
the optimiser and schedule, the data sizes, the evaluation and the learning curve, and each
task's own budget; it refuses a profile that cannot work before any training. The studies
derive their profiles with its methods (``scaled``, ``sized``, ``batched``), so a derived
profile has one name wherever it is made; ``nopelib.training.profiles`` names the book's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from nopelib.core.model import FLOAT32_MAX, GPTConfig
from nopelib.core.tasks import TASKS


MAX_SEED = 2**32 - 1  # numpy's default_rng and torch.manual_seed both take [0, 2**32)


BATCHED_SUFFIX = "+batched"


# fields added after studies were committed: a record holds them only when they differ from
# their default, so the records of the profiles before them (which committed studies compare,
# nopelib.results.trained_files.is_current) stay as they were
RECORDED_WHEN_SET = ("curve_dense_every", "curve_dense_until", "precision")


PRECISIONS = ("float32", "bfloat16")


# the recipe study (nopelib.studies.recipe): NoPE, and the control given position for free
RECIPE_ENCODINGS = ("none", "learned")


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
    # denser points early on, where the pattern moves: also every curve_dense_every steps up to
    # step curve_dense_until (0: none)
    curve_dense_every: int = 0
    curve_dense_until: int = 0
    n_curve: int = 1_000  # a curve point is exact match on the first n_curve test examples
    # A budget that follows progress (warm-up, stable, decay) when stop_at > 0: after the
    # warm-up the learning rate stays at lr until exact match on the validation split (n_val
    # examples drawn after the test split, tasks.make_split) reaches stop_at at a curve point;
    # then it decays linearly to lr * min_lr_ratio over a tail of tail_share times the steps
    # taken so far, and the run ends. steps caps the whole run. stop_at = 0: a fixed budget of
    # steps with a cosine decay.
    stop_at: float = 0.0
    tail_share: float = 0.5
    # relearn_below > 0: a validation point below it during the tail means the run lost its
    # task again; the run goes on, and once validation is back at stop_at its tail is counted
    # afresh from there (the end moves to that step plus tail_steps of it, within steps)
    relearn_below: float = 0.0
    n_val: int = 0
    n_trajectory: int = 0  # fixed task inputs whose adjacency scores every curve point records
    # the training step's precision: "bfloat16" is autocast on CUDA and on a CPU with bf16
    # units (devices.dtype_policy; float32 on other CPUs, with a warning)
    precision: str = "float32"

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
        for name in ("n_val", "n_trajectory", "curve_dense_every", "curve_dense_until"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative integer")
        if self.curve_dense_until and not self.curve_every:
            raise ValueError(f"curve_dense_until={self.curve_dense_until} needs curve points "
                             f"(curve_every > 0, is {self.curve_every})")
        if self.curve_dense_until and not 1 <= self.curve_dense_every <= self.curve_every:
            raise ValueError(f"curve_dense_every={self.curve_dense_every!r} must be an integer "
                             f"in [1, curve_every={self.curve_every}] when curve_dense_until="
                             f"{self.curve_dense_until} > 0")
        if self.curve_dense_every and not self.curve_dense_until:
            raise ValueError(f"curve_dense_every={self.curve_dense_every} needs "
                             "curve_dense_until > 0 (is 0): the step up to which it applies")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is unknown; allowed: {PRECISIONS}")
        if (isinstance(self.stop_at, bool) or not isinstance(self.stop_at, (int, float))
                or not 0 <= self.stop_at <= 1):
            raise ValueError(f"stop_at={self.stop_at!r} must be a number in [0, 1]")
        if (isinstance(self.relearn_below, bool) or not isinstance(self.relearn_below, (int, float))
                or not 0 <= self.relearn_below <= max(self.stop_at, 0)):
            raise ValueError(f"relearn_below={self.relearn_below!r} must be a number in "
                             f"[0, stop_at={self.stop_at!r}]")
        if (isinstance(self.tail_share, bool) or not isinstance(self.tail_share, (int, float))
                or not 0 < self.tail_share <= 10):
            raise ValueError(f"tail_share={self.tail_share!r} must be a number in (0, 10]")
        if self.stop_at and not (self.curve_every and self.n_val):
            raise ValueError(f"stop_at={self.stop_at!r} needs curve points (curve_every > 0, "
                             f"is {self.curve_every}) and a validation split (n_val > 0, is "
                             f"{self.n_val})")
        if self.n_trajectory and not self.curve_every:
            raise ValueError(f"n_trajectory={self.n_trajectory} needs curve points "
                             "(curve_every > 0)")
        if (not isinstance(self.claim_tasks, tuple)
                or not all(t in TASKS for t in self.claim_tasks)
                or len(set(self.claim_tasks)) != len(self.claim_tasks)):
            raise ValueError(f"claim_tasks={self.claim_tasks!r} must be a tuple of distinct "
                             f"tasks from {TASKS}")
        if self.n_eval > self.n_test:
            raise ValueError(f"n_eval={self.n_eval} must be <= n_test={self.n_test}")
        if (not isinstance(self.seeds, tuple) or not self.seeds
                or not all(type(x) is int and 0 <= x <= MAX_SEED for x in self.seeds)):
            raise ValueError(f"seeds={self.seeds!r} must be a non-empty tuple of integers in "
                             f"[0, {MAX_SEED}]")

    def for_task(self, task: str) -> TrainProfile:
        """This profile with the task's own budget (``task_budgets``) applied, if it has one:
        what a run of ``task`` trains with."""
        budget = {entry[0]: entry[1:] for entry in self.task_budgets}.get(task)
        if budget is None:
            return replace(self, task_budgets=())
        steps, batch_size, lr = budget if len(budget) == 3 else (*budget, self.batch_size,
                                                                 self.lr)
        return replace(self, steps=steps, batch_size=batch_size, lr=lr, task_budgets=())

    def scaled(self, scale: int, pos_encoding: str = "none") -> TrainProfile:
        """The recipe study's profile: ``scale`` times the steps of every task, a learning
        curve, and the given position encoding; warm-up and schedule shape are kept."""
        if type(scale) is not int or scale < 1:
            raise ValueError(f"scale={scale!r} must be a positive integer")
        return replace(
            self, name=f"{self.name}-x{scale}-{pos_encoding}",
            model=replace(self.model, pos_encoding=pos_encoding), steps=self.steps * scale,
            task_budgets=tuple((task, steps * scale, *rest)
                               for task, steps, *rest in self.task_budgets),
            curve_every=self.curve_every or max(1, self.steps // 10))

    def sized(self, n_layer: int, n_embd: int) -> TrainProfile:
        """A grid configuration: another depth and width; the profile's own size is itself,
        so its runs are the chapters' own."""
        if (n_layer, n_embd) == (self.model.n_layer, self.model.n_embd):
            return self
        return replace(self, name=f"{self.name}-L{n_layer}-d{n_embd}",
                       model=replace(self.model, n_layer=n_layer, n_embd=n_embd))

    def batched(self) -> TrainProfile:
        """The profile that batched seeds (``nopelib.training.batched``) are keyed and recorded
        under: a batched run equals the separate run within float tolerance, not bit for bit."""
        name = self.name if self.name.endswith(BATCHED_SUFFIX) else self.name + BATCHED_SUFFIX
        return replace(self, name=name)

    def record(self) -> dict:
        """The profile's fields as JSON-ready values (seeds left out, and RECORDED_WHEN_SET
        fields at their default): what a study records as the profile of its day, since a
        profile's numbers change between commits."""
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in asdict(self).items()
                if k != "seeds" and not (k in RECORDED_WHEN_SET and v == defaults[k])}

    @classmethod
    def from_record(cls, fields: dict) -> TrainProfile:
        """The profile a study recorded (``record``), as it stood then."""
        fields = dict(fields)
        return cls(**{**fields, "model": GPTConfig(**fields["model"]),
                      "betas": tuple(fields["betas"]),
                      "task_budgets": tuple(tuple(b) for b in fields["task_budgets"]),
                      "claim_tasks": tuple(fields.get("claim_tasks", ()))})

    def is_curve_step(self, step: int, end: int) -> bool:
        """Whether a run whose last step is ``end`` takes a learning-curve point after
        ``step`` steps: every ``curve_every`` steps, every ``curve_dense_every`` up to
        ``curve_dense_until``, and at the end (never without ``curve_every``)."""
        if not self.curve_every:
            return False
        dense = step <= self.curve_dense_until and step % self.curve_dense_every == 0
        return step % self.curve_every == 0 or dense or step == end

    def tail_steps(self, reached: int) -> int:
        """Steps a run trains on after the validation split reached ``stop_at`` at step
        ``reached``: ``tail_share`` of the steps so far, at least one curve interval."""
        return max(self.curve_every, math.ceil(self.tail_share * reached))

    def lr_at(self, step: int, decay_from: int | None = None, end: int | None = None) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then a cosine
        decay over ``steps``; or, when ``stop_at`` > 0, constant until ``decay_from`` (the
        step where the validation split reached it; None: not yet) and linear to ``end``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.stop_at:
            if decay_from is None or step < decay_from:
                return self.lr
            progress = min(1.0, (step - decay_from) / max(1, end - decay_from))
            return self.lr * (1.0 - (1.0 - self.min_lr_ratio) * progress)
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


def check_seed(seed: object) -> None:
    """Refuse a seed that numpy or torch would reject later, mid-run."""
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed!r} must be an integer in [0, {MAX_SEED}]")
