"""The budget study: how a trained model's adjacency scores depend on how long it trained.

The trained chapter's verdicts on the paper's claims (does a trained model keep layer 1's
adjacency pattern, and weaken it in later layers?) are taken at one budget per task, the
profile's. This study trains one task at several step budgets, every other setting the
profile's (the budget equal to the profile's is the chapter's own run, from the run cache), and
records per budget and seed the exact match on the whole test split and the mean adjacency
score of every layer before and after training, on the trained chapter's analysis inputs.

It trains longer than a chapter may, so it runs by hand, once, with one command; the trained
chapter draws every ``book/results/budget_*.json`` it writes::

    python -m nopelib.budget --task reversal --steps 2000 2500 3000 4000 --out book/results/budget_reversal.json

Every run goes through the run cache, so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from nopelib.analysis import layer_scores, random_model, sample_inputs
from nopelib.recipe import provenance, write_study
from nopelib.tasks import TASKS, get_task
from nopelib.train import PROFILES, TrainProfile, get_profile, train_many, train_missing

ANALYSIS_SEED = 12345  # the trained chapter's analysis inputs: sample_inputs(task, n, 12345)


def budget_profile(base: TrainProfile, task: str, steps: int) -> TrainProfile:
    """``base`` with ``task`` trained for ``steps`` steps. The task's batch and learning rate,
    the warm-up and the schedule's shape are kept; the task's own budget gives ``base``."""
    own = base.for_task(task)
    if type(steps) is not int or steps <= base.warmup_steps:
        raise ValueError(f"steps={steps!r} must be an integer greater than the profile's "
                         f"warmup_steps={base.warmup_steps}")
    if steps == own.steps:
        return base
    others = tuple(b for b in base.task_budgets if b[0] != task)
    return replace(base, name=f"{base.name}-{task}-{steps}-steps",
                   task_budgets=others + ((task, steps, own.batch_size, own.lr),))


def run_budget_study(profile: str | TrainProfile, task: str, steps: list[int],
                     seeds: list[int], n_analysis: int = 64,
                     device: str = "auto") -> list[dict]:
    """Train (or load) ``task`` for every budget and seed; one row per run with its accuracy
    and the per-layer mean adjacency score of the model before and after training."""
    get_task(task)
    if type(n_analysis) is not int or n_analysis < 1:
        raise ValueError(f"n_analysis={n_analysis!r} must be a positive integer")
    if not seeds or any(type(s) is not int or s < 0 for s in seeds):
        raise ValueError(f"seeds={seeds!r} must be a non-empty list of non-negative integers")
    if len(set(steps)) != len(steps):
        raise ValueError(f"steps={steps!r} must not repeat a budget")
    base = get_profile(profile)
    profiles = {n: budget_profile(base, task, n) for n in steps}  # checks every budget first
    # every budget's runs share one pool, the longest first
    train_missing([(task, s, prof) for prof in profiles.values() for s in seeds], device=device)
    texts = sample_inputs(task, n_analysis, seed=ANALYSIS_SEED)
    rows = []
    for n, prof in profiles.items():
        runs = train_many([(task, s) for s in seeds], prof, device=device)
        for seed in seeds:
            m = runs[task, seed].metrics
            before = layer_scores(random_model(prof.model, seed=seed), texts).mean(0)  # [L+1]
            after = layer_scores(runs[task, seed].model, texts).mean(0)  # [L+1]
            rows.append({"task": task, "seed": seed, "steps": n, "accuracy": m["accuracy"],
                         "n_test": m["n_test"], "train_seconds": m["train_seconds"],
                         "before": before.tolist(), "after": after.tolist()})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.budget",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    parser.add_argument("--task", required=True, choices=list(TASKS))
    parser.add_argument("--steps", nargs="+", type=int, required=True, help="step budgets")
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: the profile's seeds")
    parser.add_argument("--n-analysis", type=int, default=64, help="inputs per score")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    seeds = list(get_profile(args.profile).seeds) if args.seeds is None else args.seeds
    start = time.perf_counter()
    rows = run_budget_study(args.profile, args.task, args.steps, seeds, args.n_analysis,
                            args.device)
    result = {
        "provenance": {
            **provenance("python -m nopelib.budget", argv, start),
            "profile": args.profile,
            "profile_steps": get_profile(args.profile).for_task(args.task).steps,
            "analysis": {"n_inputs": args.n_analysis, "seed": ANALYSIS_SEED},
        },
        "runs": rows,
    }
    write_study(args.out, result)
    print(f"wrote {args.out}: {len(rows)} runs in {result['provenance']['wall_seconds']} s")


if __name__ == "__main__":
    main()
