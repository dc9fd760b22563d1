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
from pathlib import Path

from nopelib import results
from nopelib.analysis import layer_scores, random_model, sample_inputs
from nopelib.launch import train_many, train_missing
from nopelib.profiles import PROFILES, TrainProfile, check_seed, get_profile
from nopelib.tasks import TASKS, get_task

ANALYSIS_SEED = 12345  # the trained chapter's analysis inputs: sample_inputs(task, n, 12345)


def run_budget_study(profile: str | TrainProfile, task: str, steps: list[int],
                     seeds: list[int], n_analysis: int = 64,
                     device: str = "auto") -> list[dict]:
    """Train (or load) ``task`` for every budget and seed; one row per run with its accuracy
    and the per-layer mean adjacency score of the model before and after training."""
    get_task(task)
    if type(n_analysis) is not int or n_analysis < 1:
        raise ValueError(f"n_analysis={n_analysis!r} must be a positive integer")
    if not seeds:
        raise ValueError(f"seeds={seeds!r} must be a non-empty list of seeds")
    for seed in seeds:
        check_seed(seed)
    if len(set(steps)) != len(steps):
        raise ValueError(f"steps={steps!r} must not repeat a budget")
    base = get_profile(profile)
    profiles = {n: base.with_steps(task, n) for n in steps}  # checks every budget first
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
    from nopelib.params import SEED, Int, OutPath, check_args

    warmup = get_profile(args.profile).warmup_steps
    # exit 2 now, not after hours of training
    check_args(parser, {
        "--out": (args.out, OutPath()),
        "--steps": (args.steps, Int(min=warmup + 1, max=100_000, why=(
            f"above the profile's {warmup} warm-up steps; the cpu profile's step takes ~0.11 s "
            "on one core: ~3 h per run at 100,000"))),
        "--seeds": (args.seeds, SEED),
        "--n-analysis": (args.n_analysis, Int(min=1, max=4096, why=(
            "each input is scored by every run and its initialisation, ~10 ms each: ~16 min at "
            "4096 for 4 budgets x 3 seeds"))),
    })
    seeds = list(get_profile(args.profile).seeds) if args.seeds is None else args.seeds
    start = time.perf_counter()
    rows = run_budget_study(args.profile, args.task, args.steps, seeds, args.n_analysis,
                            args.device)
    prof = get_profile(args.profile)
    result = {
        "provenance": results.provenance(
            "python -m nopelib.budget", argv, start, profile=args.profile,
            profile_steps=prof.for_task(args.task).steps, training=prof.record(),
            analysis={"n_inputs": args.n_analysis, "seed": ANALYSIS_SEED}),
        "runs": rows,
    }
    results.write(args.out, result, "budget")
    print(f"wrote {args.out}: {len(rows)} runs in {result['provenance']['wall_seconds']} s")


if __name__ == "__main__":
    main()
