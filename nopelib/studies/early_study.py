"""The early-dynamics study: what the first steps of training do to the layer-1 pattern.

The early-dynamics study: what the first steps of training do to the layer-1 pattern, and
why. Each run trains a study profile's model (the same loop, data order and learning-rate
schedule as the trained study's runs of that seed: ``train.train``) over its first steps with
a curve point every few steps, each recording every layer's adjacency score on the profile's
fixed trajectory inputs, exact match, the learning rate, and block 1 as the averaging theory
reads it on those very inputs (``nopelib.averaging.dynamics``: rho, the shared direction of the
value vectors and of the embeddings, the attention entropy over log k) with the layer-1 score the
theory predicts from the measured attention and from uniform attention. The ablations hold parts at
their initial values (``nopelib.core.ablation``: the token embedding, block 1's queries and keys, or
both); the rule that says which of them explains a collapse is ``beyond_claims.collapse_cause``, fixed
before this study ran.

It trains longer than a chapter may, so it runs by hand, one file per profile::

    python -m nopelib.studies.early_study --profile study --tasks addition reversal indexing
    ordering

which writes ``book/results/early_<profile>.json``. Each finished run is kept in the results
cache (``nopelib.store.memo``), so an interrupted study goes on with the runs it had not finished
when the same command is run again at the same commit.

With ``--full``, each ablated run trains to the end of its task's budget instead (the profile
itself: its steps, its budget that follows progress, its curve points, block 1 measured at
each) and is scored on the whole test split: is the task learned with the pattern kept
(``beyond_claims.full_reading``)? Seed 0 by default; the unablated run of that length is the
trained study's own. It writes ``book/results/early_full_<profile>.json``, and a run stopped
midway goes on from its last checkpoint (``nopelib.store.checkpoint``) when the command is run
again::

    NOPELIB_ALLOW_SLOW=1 python -m nopelib.studies.early_study --full --tasks reversal

A run here is its seed's study run up to the point where the two part: a curve point reads
the validation split, and a run whose validation reaches the profile's ``stop_at`` in the
window starts its decaying tail at that point, where the study's run, with sparser points,
may start it later.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import pandas as pd
import torch

from nopelib.averaging import dynamics
from nopelib.core.ablation import check_parts
from nopelib.core.devices import dtype_policy
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.params import SEED, Choice, ListOf
from nopelib.core.tasks import TASKS, get_task, sample_inputs
from nopelib.store.cache import resolve_cache_dir
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.store.memo import is_cached, memo
from nopelib.store.memo_key import call_key
from nopelib.results import files as results, guard
from nopelib.results.early_kept import kept_runs
from nopelib.results.schema import EARLY_FULL_PREFIX
from nopelib.core.one_model import random_model
from nopelib.training.gate import training_time_problem
from nopelib.training.profiles import PROFILES, get_profile
from nopelib.training.runs import run_key, score
from nopelib.training.task_precision import task_profile
from nopelib.training.train import TRAJECTORY_SEED, train
from nopelib.training.train_profile import TrainProfile, check_seed

# the window and the curve spacing per profile: the 4 x 96 study model over its first 1,000
# steps, the paper's model (a step costs about 20 times more) over its first 500
WINDOWS = {"study": (1_000, 10), "paper_study": (500, 10)}
# one run's seconds on one loaded core of the 2-core development VM, curve points included
# (measured: 2.5 to 6 minutes a run of the study model; the paper's model's 500 steps at about
# 1.3 s plus 50 points of about 15 s): the estimate the command's time gate uses
RUN_SECONDS = {"study": 330.0, "paper_study": 1_400.0}
# --full: one run's seconds, as long as the longest committed study run could be (60,000
# steps: indexing seed 4 trained 5,210 s) with its block-1 points and the whole test split
FULL_SECONDS = {"study": 6_000.0}
N_INPUTS = 64  # trajectory inputs, for both models (the paper_study profile's own count)
# exact match at a curve point on the first N_CURVE test examples: a point every 10 steps on
# the profile's 1,000 would cost more than the training (the curve draws no random numbers,
# so the runs train alike either way)
N_CURVE = 200
ABLATIONS = {"none": (), "embedding": ("embedding",), "qk": ("qk",),
             "both": ("embedding", "qk"),
             # every token's value vector as at initialisation: the leading axis held
             "values": ("embedding", "value"),
             # block 1's attention output as at initialisation: only its MLP moves layer 1
             "attention": ("embedding", "qk", "value"),
             # block 1's MLP as at initialisation: does layer 1 fall without it?
             "mlp": ("mlp",),
             # the embedding held with the head untied and trained: the control for
             # "embedding", whose held tied head keeps the model from learning
             "untied": ("input",)}


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
    point), its initial scores and measurement, its training time, and how its steps computed
    (``dtype_policy``: the precision the trained study trains the task in, on this CPU)."""
    base = task_profile(get_profile(profile), task)  # the trained study's precision
    steps, every = WINDOWS[profile]
    prof = early_profile(base, steps, every)
    texts = sample_inputs(task, prof.n_trajectory, seed=TRAJECTORY_SEED)  # train()'s own
    _, m = train(task, seed, prof, torch.device("cpu"), progress=False, frozen=frozen,
                 measure=block1_measure(texts, prof.model))
    return {"task": task, "seed": seed, "frozen": list(frozen), "steps": m["steps"],
            "dtype_policy": dtype_policy("cpu", prof.precision),
            "train_seconds": m["train_seconds"], "curve_seconds": m["curve_seconds"],
            "scores_init": m["scores_init"], "measure_init": m["measure_init"],
            "curve": {k: list(v) for k, v in m["curve"].items()}}


def full_key(task: str, seed: int, profile: str, frozen: tuple[str, ...]) -> str:
    """The checkpoint key of a ``full_run``: the study run's key, the parts held, the call's
    results-cache key (the code that measures its curve points) and the CPU kernels (a run
    stopped under one kernel set does not go on under another)."""
    from nopelib.studies import early_study  # the importable module's function, as _one's

    payload = {"run": run_key(task, seed, task_profile(get_profile(profile), task), "cpu"),
               "frozen": list(frozen),
               "call": call_key(early_study.full_run, (task, seed, profile, frozen), {}),
               "kernels": torch.backends.cpu.get_cpu_capability()}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:32]


def full_checkpoints(task: str, seed: int, profile: str,
                     frozen: tuple[str, ...]) -> RunCheckpoints:
    """Where a ``full_run`` keeps its checkpoints, in the cache's checkpoints folder."""
    key = full_key(task, seed, profile, frozen)
    return RunCheckpoints(resolve_cache_dir() / "checkpoints", key)


def full_run(task: str, seed: int, profile: str, frozen: tuple[str, ...]) -> dict:
    """One run of ``profile`` to the end of its task's budget with ``frozen`` held on the
    CPU (the seed's study run but for the held parts), as ``early_run`` records one, with its
    exact match on the whole test split (``accuracy``, ``n_test``) and the steps where a
    stopped run went on (``resumed_at``). It checkpoints as it trains, so a stopped run goes
    on from its last checkpoint when called again (``_one_full`` removes them once the
    result is in the results cache)."""
    prof = task_profile(get_profile(profile), task)
    texts = sample_inputs(task, prof.n_trajectory, seed=TRAJECTORY_SEED)  # train()'s own
    checkpoints = full_checkpoints(task, seed, profile, frozen)
    cpu = torch.device("cpu")
    model, m = train(task, seed, prof, cpu, progress=False, checkpoints=checkpoints,
                     frozen=frozen, measure=block1_measure(texts, prof.model))
    _, m = score(model, m, task, seed, prof, cpu, checkpoints.key)
    return {"task": task, "seed": seed, "frozen": list(frozen), "steps": m["steps"],
            "accuracy": m["accuracy"], "n_test": m["n_test"],
            "resumed_at": m.get("resumed_at", []), "train_seconds": m["train_seconds"],
            "dtype_policy": dtype_policy("cpu", prof.precision),
            "curve_seconds": m["curve_seconds"], "scores_init": m["scores_init"],
            "measure_init": m["measure_init"],
            "curve": {k: list(v) for k, v in m["curve"].items()}}


def _one(job: tuple[str, int, str, tuple[str, ...]], full: bool = False) -> dict:
    # the importable module's functions, not this one's: run as ``python -m``, this module is
    # __main__ (and __mp_main__ in a worker), whose functions memo keys by their globals too
    from nopelib.studies import early_study

    torch.set_num_threads(1)  # one process per core
    return memo(early_study.full_run if full else early_study.early_run, *job)


def _one_full(job: tuple[str, int, str, tuple[str, ...]]) -> dict:
    from nopelib.studies import early_study

    out = _one(job, full=True)
    if is_cached(early_study.full_run, *job):  # kept until then: hours of training
        full_checkpoints(*job).clear()
    return out


def run_study(profile: str, tasks: Sequence[str], seeds: Sequence[int],
              ablations: Sequence[str], workers: int = 1, full: bool = False) -> list[dict]:
    """Every (task, ablation, seed) run of the study, in that order, from the results cache
    where it holds them, on ``workers`` processes; ``full``: each to the end of its task's
    budget (``full_run``)."""
    if profile not in (FULL_SECONDS if full else WINDOWS):
        raise ValueError(f"profile={profile!r}: the study has a window for {sorted(WINDOWS)}"
                         f" and runs to the end of the budget for {sorted(FULL_SECONDS)}")
    for task in tasks:
        get_task(task)
    for seed in seeds:
        check_seed(seed)
    for name in ablations:
        if name not in ABLATIONS:
            raise ValueError(f"ablation {name!r} is unknown; allowed: {list(ABLATIONS)}")
        check_parts(ABLATIONS[name])
    todo = jobs(profile, tasks, seeds, ablations)
    one = _one_full if full else _one
    if workers == 1:
        return [one(job) for job in todo]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(one, todo))


def jobs(profile: str, tasks: Sequence[str], seeds: Sequence[int],
         ablations: Sequence[str]) -> list[tuple[str, int, str, tuple[str, ...]]]:
    """The (task, seed, profile, frozen parts) of every run, task by task, then ablation by
    ablation, then seed by seed: the order of the file's runs."""
    return [(t, s, profile, ABLATIONS[a]) for t in tasks for a in ablations for s in seeds]


def run_order(runs: Sequence[dict]) -> list[dict]:
    """``runs`` in the file's order: task, then ablation, then seed."""
    tasks, names = list(TASKS), list(ABLATIONS)
    return sorted(runs, key=lambda r: (tasks.index(r["task"]),
                                       names.index(ablation_name(r["frozen"])), r["seed"]))


def contents(runs: Sequence[dict]) -> dict:
    """What a file of ``runs`` holds, as its provenance names it: tasks, seeds, ablations."""
    return {"tasks": [t for t in TASKS if any(r["task"] == t for r in runs)],
            "seeds": sorted({r["seed"] for r in runs}),
            "ablations": [a for a in ABLATIONS if any(ablation_name(r["frozen"]) == a
                                                      for r in runs)]}


def grown(path: Path, old: dict | None, doc: dict, todo: Sequence[tuple],
          replace: Sequence[int]) -> dict:
    """What a write of this invocation's ``doc`` (the runs of ``todo``) leaves at ``path``,
    whose committed document is ``old`` as re-read when it writes (another invocation may
    have added runs since this one started): the committed runs it keeps
    (``early_kept.kept_runs``) beside its own, in the file's order, and a provenance that
    names what the file holds and the invocations the kept runs came from (``kept_from``)."""
    prov = doc["provenance"]
    kept, kept_from = kept_runs(path, old, prov["training"], todo, replace)
    runs = run_order([*kept, *doc["runs"]])
    return {"provenance": {**prov, **contents(runs),
                           **({"kept_from": kept_from} if kept_from else {})}, "runs": runs}


# ---------------------------------------------------------------------------------------------
# the chapter's live part: block 1 at initialisation, measured and predicted

# The rules of the chapter's parameters (its spec: ``nopelib.book.chapters.EARLY_DYNAMICS``)
CHAPTER_PARAMS = {
    "profile": Choice(WINDOWS),
    "paper_profile": Choice(WINDOWS),
    "init_profiles": ListOf(Choice(WINDOWS), unique=True),
    "init_seeds": ListOf(SEED, unique=True, max_len=10,
                         why="each seed builds one model per profile and task, a few seconds "
                             "each"),
}


def init_check(profile: TrainProfile, tasks: Sequence[str],
               seeds: Sequence[int]) -> pd.DataFrame:
    """Block 1 of ``profile``'s model at initialisation, per task and seed, on the study's
    trajectory inputs: the ``dynamics`` quantities, the theory's predicted layer-1 score and
    the measured one (``layer1``). The profile comes resolved (a chapter resolves its names
    once, where it starts)."""
    if not isinstance(profile, TrainProfile):
        raise TypeError(f"init_check: profile={profile!r}; allowed: a TrainProfile "
                        "(nopelib.training.profiles.get_profile resolves a name)")
    config = profile.model
    rows = []
    for task in tasks:
        texts = sample_inputs(task, N_INPUTS, seed=TRAJECTORY_SEED)
        for seed in seeds:
            model = random_model(config, seed=seed)  # train()'s initial draw for the seed
            point = block1_measure(texts, config)(model)
            rows.append({"profile": profile.name, "task": task, "seed": seed,
                         "layer1": float(layer_scores(model, texts).mean(0)[1]), **point})
    return pd.DataFrame(rows)


def ablation_name(frozen: Sequence[str]) -> str:
    """The ablation a run's ``frozen`` parts make (ABLATIONS' key)."""
    for name, parts in ABLATIONS.items():
        if list(parts) == list(frozen):
            return name
    raise ValueError(f"frozen={list(frozen)!r} is no ablation of {list(ABLATIONS)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.early_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="study", choices=sorted(WINDOWS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: 0 1 2 (--full: 0)")
    parser.add_argument("--ablations", nargs="+", default=None, choices=list(ABLATIONS),
                        help="default: every one (--full: every one but none)")
    parser.add_argument("--full", action="store_true",
                        help="each run to the end of its task's budget, checkpointed")
    parser.add_argument("--workers", type=int, default=1,
                        help="training processes (one thread each)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: book/results/early_<profile>.json (--full: "
                             "early_full_<profile>.json)")
    parser.add_argument("--replace", nargs="+", type=int, default=[], metavar="SEED",
                        help="seeds whose committed runs may go: those of a file trained under "
                             "another profile record (default: such a write is refused)")
    args = parser.parse_args(argv)
    from nopelib.core.params import Int, check_args

    full = args.full
    seeds = args.seeds if args.seeds is not None else [0] if full else [0, 1, 2]
    ablations = (args.ablations if args.ablations is not None
                 else [a for a in ABLATIONS if a != "none" or not full])
    check_args(parser, {"--seeds": (seeds, SEED),
                        "--workers": (args.workers, Int(min=1, max=64,
                                                        why="one process per core"))})
    for name, values in (("--seeds", seeds), ("--tasks", args.tasks),
                         ("--ablations", ablations)):
        if len(set(values)) != len(values):
            parser.error(f"{name} {values} names one twice")
    if full and args.profile not in FULL_SECONDS:
        parser.error(f"--full --profile {args.profile}: allowed: {sorted(FULL_SECONDS)}")
    if full and "none" in ablations:
        parser.error("--full --ablations none: the unablated run to the end of its budget is "
                     "the trained study's own (book/results/trained_<profile>_<task>.json)")
    from nopelib.studies import early_study  # the keys _one caches the runs under

    run = early_study.full_run if full else early_study.early_run
    todo = [job for job in jobs(args.profile, args.tasks, seeds, ablations)
            if not is_cached(run, *job)]  # runs in the cache cost nothing
    prof = PROFILES[args.profile]  # resolved once (argparse checked the name), passed on
    slow = training_time_problem(
        prof, len(todo), "cpu", (FULL_SECONDS if full else RUN_SECONDS)[args.profile],
        args.workers, basis="as measured on the development VM",
        allowed="fewer tasks, seeds or ablations, more --workers")
    if slow is not None:
        parser.error(slow)
    prefix = EARLY_FULL_PREFIX if full else "early_"
    out = results.RESULTS_DIR / f"{prefix}{args.profile}.json" if args.out is None else args.out
    if (not out.name.startswith(prefix) or out.suffix != ".json"
            or not full and out.name.startswith(EARLY_FULL_PREFIX)):
        parser.error(f"--out={str(out)!r}: the file must be named {prefix}<name>.json"
                     + ("" if full else f", not {EARLY_FULL_PREFIX}<name>.json (--full's)"))
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        parser.error(f"--out={str(out)!r}: {str(out.parent)!r} is not a writable folder")
    start = time.perf_counter()
    steps, every = ((max(prof.for_task(t).steps for t in TASKS), prof.curve_every)
                    if full else WINDOWS[args.profile])
    training = (prof if full else early_profile(prof, steps, every)).record()
    everything = jobs(args.profile, args.tasks, seeds, ablations)
    try:  # before any training: the file as it stands now
        kept_runs(out, results.load(out) if out.is_file() else None, training, everything,
                  args.replace)
    except (results.ResultsError, guard.Refused) as exc:
        parser.error(str(exc))
    runs = run_study(args.profile, args.tasks, seeds, ablations, args.workers, full)
    doc = {"provenance": results.provenance(
        "python -m nopelib.studies.early_study", argv, start, profile=args.profile,
        training=training, window=steps, every=every,
        cpu_capability=torch.backends.cpu.get_cpu_capability(), **contents(runs)),
        "runs": run_order(runs)}
    written = results.write(out, doc, "early", merge=lambda old, new: grown(
        out, old, new, everything, args.replace))
    print(f"wrote {out}: {len(written['runs'])} runs ({len(written['runs']) - len(runs)} kept "
          f"from the committed file) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
