"""The recipe study: test exact match against training steps, NoPE beside a learned position
embedding of the same size and budget, out to a multiple of a profile's budget.

It trains longer than a chapter may, so it runs by hand, once, with one command; the trained
chapter draws every small JSON file it writes (committed as ``book/results/recipe_*.json``, one
file per study)::

    python -m nopelib.recipe --out book/results/recipe_addition_reversal.json --tasks addition reversal

Every run goes through ``train_many`` (the run cache), so an interrupted study resumes where it
stopped. The file records its provenance: the command, the git commit, the machine, the torch
version and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from nopelib.cache import commit_file
from nopelib.model import GPTConfig
from nopelib.tasks import TASKS
from nopelib.train import PROFILES, TrainProfile, get_profile, train_many, train_missing

POS_ENCODINGS = ("none", "learned")  # NoPE, and the control that is given position for free


def recipe_profile(base: TrainProfile, pos_encoding: str, scale: int) -> TrainProfile:
    """``base`` with ``scale`` times its steps (every task), a learning curve, and the given
    position encoding; warm-up and schedule shape are kept, so scale 1 is ``base`` itself."""
    if not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale={scale!r} must be a positive integer")
    curve_every = base.curve_every or max(1, base.steps // 10)
    return replace(
        base,
        name=f"{base.name}-x{scale}-{pos_encoding}",
        model=replace(base.model, pos_encoding=pos_encoding),
        steps=base.steps * scale,
        task_budgets=tuple((task, steps * scale, *rest)
                           for task, steps, *rest in base.task_budgets),
        curve_every=curve_every,
    )


def recorded_profile(provenance: dict) -> TrainProfile:
    """The profile a study recorded in its provenance (``"training"``), as it stood then."""
    fields = dict(provenance["training"])
    return TrainProfile(**{
        **fields, "model": GPTConfig(**fields["model"]), "betas": tuple(fields["betas"]),
        "task_budgets": tuple(tuple(b) for b in fields["task_budgets"]),
        "claim_tasks": tuple(fields.get("claim_tasks", ()))})


def run_study(profile: str | TrainProfile, tasks: list[str], seeds: list[int], scale: int,
              device: str = "auto") -> list[dict]:
    """Train (or load) every (task, seed, position encoding) and return one row per run.

    The runs of both encodings share one pool of workers (``train_missing``), the costliest
    first, so no core waits for one encoding to finish before the other starts."""
    base = get_profile(profile)
    profiles = {pe: recipe_profile(base, pe, scale) for pe in POS_ENCODINGS}
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


def _git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "nopelib"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + ("+uncommitted nopelib changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(prog: str, argv: list[str] | None, start: float) -> dict:
    """Where a hand-run study's numbers come from: the command, the git commit, the machine,
    the torch version, the wall time since ``start`` (a perf_counter reading) and the date."""
    import torch

    return {
        "command": f"{prog} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _git_commit(),
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
                   f"{os.cpu_count()} cores",
        "torch": torch.__version__,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_study(out: Path, result: dict) -> None:
    """Write a study's JSON atomically: a reader never sees half a file."""
    commit_file(out, json.dumps(result, indent=1).encode())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.recipe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--scale", type=int, default=4, help="multiple of the profile's steps")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run_study(args.profile, args.tasks, args.seeds, args.scale, args.device)
    result = {
        "provenance": {
            **provenance("python -m nopelib.recipe", argv, start),
            "profile": args.profile,
            "scale": args.scale,
            # the profile as it stood: its numbers change between commits
            "training": {k: v for k, v in asdict(get_profile(args.profile)).items()
                         if k != "seeds"},
        },
        "runs": rows,
    }
    write_study(args.out, result)
    print(f"wrote {args.out}: {len(rows)} runs in {result['provenance']['wall_seconds']} s")


if __name__ == "__main__":
    main()
