"""Whether bf16 autocast changes what the verdicts read.

Whether bf16 autocast changes what the verdicts read: the paper model's first steps in both
precisions, seed by seed.

A training step of the paper's model (6 x 384) under bf16 autocast takes about half the time of
a float32 step on a CPU with bf16 units (``nopelib.tools.bench``), which matters for a study of
hundreds of CPU hours. The verdicts read exact match and the adjacency score of every layer
along training, so a faster precision is adopted only if it moves those no more than the seed
does. The rule (``RULE``), fixed before the check ran:

- the same seeds are trained under float32 and under bf16 autocast for the first ``steps``
  steps of the profile (same initialisation, same data order, same learning rates);
- per task, layer l and seed s, the **precision gap** is the mean over the curve points of
  |score_bf16(s) - score_fp32(s)|, and the **seed gap** the same mean of |score_fp32(s) -
  score_fp32(s')| over the pairs of float32 seeds; the same for validation exact match;
- "no change" when, for every task and quantity, the largest precision gap over seeds is at
  most the median seed gap: bf16 moves a run less than choosing another seed does. Otherwise
  "changes", and the profile keeps float32.

It runs by hand, one command, and commits a small file::

    NOPELIB_ALLOW_SLOW=1 python -m nopelib.studies.precision --tasks addition --seeds 0 1 2 \
        --steps 250

which writes ``book/results/precision_<profile>_<tasks>.json`` (``out_name``): a check of
other tasks is a file beside the committed ones, each with its own provenance and verdict.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from nopelib.core.devices import bf16_available
from nopelib.core.tasks import TASKS
from nopelib.rules.bf16 import RULE, gaps, verdict
from nopelib.results import files as results, guard
from nopelib.studies.trained_study import study_profiles
from nopelib.training.launch import train_many
from nopelib.training.profiles import PROFILES, get_profile
from nopelib.training.train_profile import PRECISIONS, TrainProfile

MAX_SEEDS = 20  # a bound on --seeds: each seed adds a float32 and a bf16 run per task
def check_profiles(prof: TrainProfile, steps: int) -> dict[str, TrainProfile]:
    """The profile's first ``steps`` steps under each precision (its budget rule unchanged,
    capped), named apart from the study's own runs."""
    if type(steps) is not int or not max(1, prof.warmup_steps) <= steps <= prof.steps:
        raise ValueError(f"steps={steps!r} must be an integer in [{max(1, prof.warmup_steps)} "
                         f"(the warm-up), {prof.steps}]")
    return {p: replace(prof, name=f"{prof.name}-first{steps}-{p}", steps=steps, precision=p)
            for p in PRECISIONS}


def out_name(profile: str, tasks: Sequence[str]) -> str:
    """The check's file name: its profile and its tasks in alphabetical order (a rerun of
    the same tasks replaces its file; a check of other tasks sits beside it)."""
    return f"precision_{profile}_{'_'.join(sorted(tasks))}.json"


def run_record(task: str, seed: int, precision: str, metrics: dict) -> dict:
    """One check run as the committed file holds it: its curve and timings."""
    curve = metrics["curve"]
    return {"task": task, "seed": seed, "precision": precision,
            "dtype_policy": metrics["dtype_policy"], "accuracy": metrics["accuracy"],
            "n_test": metrics["n_test"], "steps": metrics["steps"],
            "train_seconds": metrics["train_seconds"], "step_ms": metrics["step_ms"],
            "curve": {k: curve[k] for k in ("step", "accuracy", "val_accuracy", "scores")}}


def speed(runs: Sequence[dict]) -> pd.DataFrame:
    """Per task: median training ms per step under each precision and their ratio (float32
    over bfloat16), from the same invocation."""
    frame = pd.DataFrame([{k: r[k] for k in ("task", "precision", "step_ms")} for r in runs])
    table = frame.pivot_table(index="task", columns="precision", values="step_ms",
                              aggfunc="median")
    return table.assign(ratio=table["float32"] / table["bfloat16"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.precision",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", required=True, choices=list(TASKS))
    parser.add_argument("--profile", default="paper_study", choices=sorted(PROFILES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out-dir", default=str(results.RESULTS_DIR))
    parser.add_argument("--replace", action="store_true",
                        help="replace the committed check of these tasks (default: refused)")
    args = parser.parse_args(argv)
    from nopelib.core.params import SEED, Choice, Int, ListOf, OutPath, check_args
    from nopelib.training.gate import training_time_problem

    out = Path(args.out_dir) / out_name(args.profile, args.tasks)
    base = get_profile(args.profile)  # resolved once (argparse checked the name), passed on
    check_args(parser, {  # exit 2 now, not after hours of training
        "--tasks": (args.tasks, ListOf(Choice(TASKS), unique=True)),
        "--profile": (args.profile, Choice(study_profiles(), why="the rule reads the curve's "
                                           "scores: a profile with a trajectory")),
        "--seeds": (args.seeds, ListOf(SEED, unique=True, min_len=2, max_len=MAX_SEEDS,
                                       why="the seed gap needs two float32 seeds; each seed "
                                           "adds 2 runs per task")),
        "--steps": (args.steps, Int(min=1, max=5_000, why="the check reads the first steps"
                                    ).where(lambda steps, _: base.warmup_steps <= steps,
                                            f"at least the profile's {base.warmup_steps} "
                                            "warm-up steps").where(
            lambda steps, _: steps <= base.steps, f"at most the profile's {base.steps} steps")),
        "--workers": (args.workers, Int(min=1, max=256, why="one process per core")),
        "--out-dir": (args.out_dir, OutPath(folder=True).where(
            lambda _, f: not out.is_dir(), f"a folder in which {out.name} is not a folder")),
    })
    would = guard.summary("precision", {"profile": args.profile, "steps": args.steps,
                                               "task": args.tasks, "seed": args.seeds})
    if problem := guard.single_problem(out, "precision", would, args.replace,
                                              "--out-dir"):
        parser.error(problem)
    if not bf16_available():
        parser.error("this CPU has no bf16 units (torch.ops.mkldnn._is_mkldnn_bf16_supported"
                     "() is False): bf16 autocast would fall back to float32, nothing to check")
    profs = check_profiles(base, args.steps)
    jobs = [(t, s) for t in args.tasks for s in args.seeds]
    # each run costed as a float32 one (bf16 autocast takes about half the time)
    slow = training_time_problem(profs["float32"], len(profs) * len(jobs), "cpu",
                                 workers=args.workers, allowed="fewer --steps, --seeds or --tasks")
    if slow is not None:
        parser.error(f"--steps {args.steps}: {slow}")
    start = time.perf_counter()
    records = []
    for precision, checked in profs.items():
        trained = train_many(jobs, checked, device="cpu", workers=args.workers)
        records += [run_record(t, s, precision, trained[t, s].metrics) for t, s in jobs]
    table = gaps(records)
    doc = {"provenance": results.provenance(
        "python -m nopelib.studies.precision", argv, start, profile=args.profile, steps=args.steps,
        rule=RULE, verdict=verdict(table), training=base.record(),
        cpu_capability=torch.backends.cpu.get_cpu_capability()),
        "runs": records, "gaps": table.to_dict("records")}
    results.write(out, doc, "precision", merge=None if args.replace
                  else guard.unwritten(out, would, "--out-dir"))
    print(table.round(4).to_string(index=False))
    print(speed(records).round(2).to_string())
    print(f"verdict: {verdict(table)}; wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
