"""The early-dynamics study: what the first steps of training do to the layer-1 pattern, and
why. Each run trains a study profile's model (the same loop, data order and learning-rate
schedule as the trained study's runs of that seed: ``train.train``) over its first steps with
a curve point every few steps, each recording every layer's adjacency score on the profile's
fixed trajectory inputs, exact match, the learning rate, and block 1 as the averaging theory
reads it on those very inputs (``nopelib.dynamics``: rho, the shared direction of the value
vectors and of the embeddings, the attention entropy over log k) with the layer-1 score the
theory predicts from the measured attention and from uniform attention. The ablations hold
parts at their initial values (``nopelib.ablation``: the token embedding, block 1's queries
and keys, or both); the rule that says which of them explains a collapse is
``claims.collapse_cause``, fixed before this study ran.

It trains longer than a chapter may, so it runs by hand, one file per profile::

    python -m nopelib.early_study --profile study --tasks addition reversal indexing ordering

which writes ``book/results/early_<profile>.json``. Each finished run is kept in the results
cache (``nopelib.memo``), so an interrupted study goes on with the runs it had not finished
when the same command is run again at the same commit.

A run here is its seed's study run up to the point where the two part: a curve point reads
the validation split, and a run whose validation reaches the profile's ``stop_at`` in the
window starts its decaying tail at that point, where the study's run, with sparser points,
may start it later.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import torch

from nopelib import dynamics, results
from nopelib.ablation import check_parts
from nopelib.memo import memo
from nopelib.model import GPT, GPTConfig
from nopelib.profiles import PROFILES, TrainProfile, check_seed, get_profile
from nopelib.tasks import TASKS, get_task, sample_inputs
from nopelib.train import TRAJECTORY_SEED, train

# the window and the curve spacing per profile: the 4 x 96 study model over its first 1,000
# steps, the paper's model (a step costs about 20 times more) over its first 500
WINDOWS = {"study": (1_000, 10), "paper_study": (500, 10)}
N_INPUTS = 64  # trajectory inputs, for both models (the paper_study profile's own count)
# exact match at a curve point on the first N_CURVE test examples: a point every 10 steps on
# the profile's 1,000 would cost more than the training (the curve draws no random numbers,
# so the runs train alike either way)
N_CURVE = 200
ABLATIONS = {"none": (), "embedding": ("embedding",), "qk": ("qk",),
             "both": ("embedding", "qk")}


def early_profile(base: TrainProfile, steps: int, every: int) -> TrainProfile:
    """``base`` over its first ``steps`` steps with a curve point every ``every`` steps,
    N_INPUTS trajectory inputs and N_CURVE test examples per point; every other field (model, batch, learning rate and its
    schedule, validation split) is the base's (a window shorter than the warm-up is refused
    by the profile's own check)."""
    return replace(base, name=f"{base.name}_early", steps=steps, curve_every=every,
                   curve_dense_every=0, curve_dense_until=0, n_trajectory=N_INPUTS,
                   n_curve=N_CURVE)


def block1_measure(texts: Sequence[str], config: GPTConfig) -> Callable[[GPT], dict]:
    """The curve-point measurement of block 1 on ``texts`` (``dynamics``), with the layer-1
    score the theory predicts from it (``predicted``)."""

    def measure(model: GPT) -> dict:
        block, patterns = dynamics.measure_block1(model, texts)
        return {**block.record(),
                "predicted": dynamics.predicted_layer1(texts, patterns, block, config.n_embd)}
    return measure


def early_run(task: str, seed: int, profile: str, frozen: tuple[str, ...]) -> dict:
    """One run of the study on the CPU: its curve (every field a list, one value per curve
    point), its initial scores and measurement, and its training time."""
    base = get_profile(profile)
    steps, every = WINDOWS[profile]
    prof = early_profile(base, steps, every)
    texts = sample_inputs(task, prof.n_trajectory, seed=TRAJECTORY_SEED)  # train()'s own
    _, m = train(task, seed, prof, torch.device("cpu"), progress=False, frozen=frozen,
                 measure=block1_measure(texts, prof.model))
    return {"task": task, "seed": seed, "frozen": list(frozen), "steps": m["steps"],
            "train_seconds": m["train_seconds"], "curve_seconds": m["curve_seconds"],
            "scores_init": m["scores_init"], "measure_init": m["measure_init"],
            "curve": {k: list(v) for k, v in m["curve"].items()}}


def _one(job: tuple[str, int, str, tuple[str, ...]]) -> dict:
    torch.set_num_threads(1)  # one process per core
    return memo(early_run, *job)


def run_study(profile: str, tasks: Sequence[str], seeds: Sequence[int],
              ablations: Sequence[str], workers: int = 1) -> list[dict]:
    """Every (task, ablation, seed) run of the study, in that order, from the results cache
    where it holds them, on ``workers`` processes."""
    if profile not in WINDOWS:
        raise ValueError(f"profile={profile!r}: the study has a window for {sorted(WINDOWS)}")
    for task in tasks:
        get_task(task)
    for seed in seeds:
        check_seed(seed)
    for name in ablations:
        if name not in ABLATIONS:
            raise ValueError(f"ablation {name!r} is unknown; allowed: {list(ABLATIONS)}")
        check_parts(ABLATIONS[name])
    jobs = [(t, s, profile, ABLATIONS[a]) for t in tasks for a in ablations for s in seeds]
    if workers == 1:
        return [_one(job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_one, jobs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.early_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="study", choices=sorted(WINDOWS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS),
                        choices=list(ABLATIONS))
    parser.add_argument("--workers", type=int, default=1,
                        help="training processes (one thread each)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: book/results/early_<profile>.json")
    args = parser.parse_args(argv)
    from nopelib.params import SEED, Int, check_args

    check_args(parser, {"--seeds": (args.seeds, SEED),
                        "--workers": (args.workers, Int(min=1, max=64,
                                                        why="one process per core"))})
    for name, values in (("--seeds", args.seeds), ("--tasks", args.tasks),
                         ("--ablations", args.ablations)):
        if len(set(values)) != len(values):
            parser.error(f"{name} {values} names one twice")
    out = results.RESULTS_DIR / f"early_{args.profile}.json" if args.out is None else args.out
    if not out.name.startswith("early_") or out.suffix != ".json":
        parser.error(f"--out={str(out)!r}: the file must be named early_<name>.json")
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        parser.error(f"--out={str(out)!r}: {str(out.parent)!r} is not a writable folder")
    start = time.perf_counter()
    runs = run_study(args.profile, args.tasks, args.seeds, args.ablations, args.workers)
    steps, every = WINDOWS[args.profile]
    doc = {"provenance": results.provenance(
        "python -m nopelib.early_study", argv, start, profile=args.profile,
        training=early_profile(PROFILES[args.profile], steps, every).record(),
        window=steps, every=every, tasks=list(args.tasks), seeds=list(args.seeds),
        ablations=list(args.ablations)), "runs": runs}
    results.write(out, doc, "early")
    print(f"wrote {out}: {len(runs)} runs in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
