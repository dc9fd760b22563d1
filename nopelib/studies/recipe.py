"""The recipe study: NoPE beside a learned position embedding, past the budget.

The recipe study: test exact match against training steps, NoPE beside a learned position
embedding of the same size and budget, out to a multiple of a profile's budget.

It trains longer than a chapter may, so it runs by hand, once, with one command; the trained
chapter draws every small JSON file it writes (committed as ``book/results/recipe_*.json``, one
file per study)::

    python -m nopelib.studies.recipe --out book/results/recipe_addition_reversal.json \
        --tasks addition reversal

Every run goes through ``train_many`` (the run cache), so an interrupted study resumes where it
stopped. The file records its provenance: the command, the git commit, the machine, the torch
version and the wall time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from nopelib.core.tasks import TASKS
from nopelib.results import files as results, guard
from nopelib.training.launch import train_many, train_missing
from nopelib.training.profiles import PROFILES, get_profile
from nopelib.training.train_profile import RECIPE_ENCODINGS, TrainProfile

MAX_SEEDS = 20  # a bound on --seeds: each seed adds a NoPE and a learned-position run per task


def run_study(base: TrainProfile, tasks: list[str], seeds: list[int], scale: int,
              device: str = "auto") -> list[dict]:
    """Train (or load) every (task, seed, position encoding) and return one row per run.

    The runs of both encodings share one pool of workers (``train_missing``), the costliest
    first, so no core waits for one encoding to finish before the other starts."""
    profiles = {pe: base.scaled(scale, pe) for pe in RECIPE_ENCODINGS}
    train_missing([(t, s, prof) for prof in profiles.values() for t in tasks for s in seeds],
                  device=device)
    rows = []
    for pe, prof in profiles.items():
        runs = train_many([(t, s) for t in tasks for s in seeds], prof, device=device)
        for (task, seed), run in runs.items():
            m = run.metrics
            rows.append({"task": task, "seed": seed, "pos_encoding": pe, "steps": m["steps"],
                         "accuracy": m["accuracy"], "n_test": m["n_test"],
                         "train_seconds": m["train_seconds"], "curve": m["curve"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.recipe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--scale", type=int, default=4, help="multiple of the profile's steps")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--replace", action="store_true",
                        help="replace the file at --out (default: an existing file is refused)")
    args = parser.parse_args(argv)
    from nopelib.core.params import SEED, Choice, Device, Int, ListOf, OutPath, check_args
    from nopelib.training.gate import training_time_problem

    # exit 2 now, not after hours of training
    check_args(parser, {
        "--out": (args.out, OutPath()),
        "--tasks": (args.tasks, ListOf(Choice(TASKS), unique=True)),
        "--seeds": (args.seeds, ListOf(SEED, unique=True, max_len=MAX_SEEDS,
                                       why="each seed adds 2 runs per task: NoPE and learned")),
        "--scale": (args.scale, Int(min=1, max=25, why="the cpu profile's 4,000 reversal steps "
                                    "x 25 is 100,000 steps, ~0.11 s each on one core: ~3 h per "
                                    "run")),
        "--device": (args.device, Device()),
    })
    would = guard.summary("recipe", {"profile": args.profile, "scale": args.scale,
                                            "task": args.tasks, "seed": args.seeds})
    if problem := guard.single_problem(args.out, "recipe", would, args.replace):
        parser.error(problem)
    base = get_profile(args.profile)  # resolved once, passed on
    # each run costed as a learned-position one, the larger model
    slow = training_time_problem(base.scaled(args.scale, "learned"),
                                 len(RECIPE_ENCODINGS) * len(args.tasks) * len(args.seeds),
                                 args.device,
                                 allowed="a GPU (--device cuda), fewer --tasks or --seeds, or a "
                                         "smaller --scale")
    if slow is not None:
        parser.error(f"--profile {args.profile} --scale {args.scale} --device {args.device}: "
                     f"{slow}")
    start = time.perf_counter()
    rows = run_study(base, args.tasks, args.seeds, args.scale, args.device)
    result = {
        "provenance": results.provenance(
            "python -m nopelib.studies.recipe", argv, start, profile=args.profile, scale=args.scale,
            training=base.record()),
        "runs": rows,
    }
    results.write(args.out, result, "recipe",
                  merge=None if args.replace else guard.unwritten(args.out, would))
    print(f"wrote {args.out}: {len(rows)} runs in {result['provenance']['wall_seconds']} s")


# the committed recipe studies, read for the trained chapter
PLATEAU_MARGIN = 0.1  # a curve leaves its plateau this far above the majority-answer share



def leaves_plateau(run: Mapping, baselines: Mapping[str, float],
                   margin: float = PLATEAU_MARGIN) -> int | None:
    """The first step of ``run``'s learning curve whose exact match exceeds its task's
    majority-answer share (``baselines``; 0 for a task without one) by ``margin``, or None."""
    floor = baselines.get(run["task"], 0.0) + margin
    curve = zip(run["curve"]["step"], run["curve"]["accuracy"])
    hits = [step for step, accuracy in curve if accuracy > floor]
    return hits[0] if hits else None



def recipe_budgets(recipe: Mapping, prof: TrainProfile) -> list[str]:
    """One line per task of a committed recipe study: the training settings its provenance
    records beside today's profile ``prof``, in examples seen per run (steps x batch), and the
    study's budget as a multiple of today's."""
    then = TrainProfile.from_record(recipe["provenance"]["training"])
    lines = []
    for task in sorted({r["task"] for r in recipe["runs"]}):
        was, now = then.for_task(task), prof.for_task(task)
        seen_then, seen_now = was.steps * was.batch_size, now.steps * now.batch_size
        ratio = recipe["provenance"]["scale"] * seen_then / seen_now
        lines.append(f"  {task}: the study's profile then: batch {was.batch_size}, "
                     f"lr {was.lr}, "
                     f"{seen_then:,} examples per run; today's {prof.name} profile: "
                     f"batch {now.batch_size}, lr {now.lr}, {seen_now:,} examples per run "
                     f"(the study saw {ratio:.1f} x today's budget)")
    return lines



def recipe_table(studies: Mapping[str, Mapping],
                 baselines: Mapping[str, float]) -> pd.DataFrame:
    """Every run of the committed recipe studies (``results.load_all("recipe")``), one row
    each, without its curve and with the step where it leaves its plateau
    (``leaves_plateau_at``)."""
    return pd.DataFrame([{"file": name, **{k: v for k, v in r.items() if k != "curve"},
                          "leaves_plateau_at": leaves_plateau(r, baselines)}
                         for name, recipe in studies.items() for r in recipe["runs"]])



def recipe_summary(recipe_runs: pd.DataFrame, baselines: Mapping[str, float]) -> str:
    """Markdown: one item per (task, seed) of ``recipe_table``, NoPE's final exact match
    beside the learned position embedding's and the majority-answer share."""
    final = recipe_runs.pivot_table(index=["task", "seed"], columns="pos_encoding",
                                    values=["accuracy", "steps"])
    return "\n".join(
        f"- **{task}**, seed {seed}, {int(row[('steps', 'none')]):,} steps: "
        f"NoPE {row[('accuracy', 'none')]:.3f}, learned position "
        f"{row[('accuracy', 'learned')]:.3f} exact match "
        f"(majority answer {baselines.get(task, float('nan')):.3f})"
        for (task, seed), row in final.iterrows())


if __name__ == "__main__":
    main()
