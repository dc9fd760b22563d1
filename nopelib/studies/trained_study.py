"""The trained-model study: five seeds of every task, trained by hand, committed with a trajectory.

The paper's claims about trained models (the adjacency pattern holds after training; the first
layers keep it, later layers weaken it) are judged on this study's runs by the rules in
``nopelib.rules.claims``, fixed before it ran. Each run trains under a profile whose budget follows
progress (``TrainProfile.stop_at``: the learning rate is held until a validation split is at
the level, then decays over a fixed share more steps), so every seed ends well past the point
where it left its plateau, whatever CPU's kernels it ran on. Every curve point records the
run's exact match and the adjacency score of every layer on fixed task inputs: the trajectory,
on which "keeps" and "weakens" are read. The command also runs the position probes of the
probes chapter on every trained model (``probe_study.probe_record``), so that chapter's trained section
reads the study's models with the model as the unit.

It trains longer than a chapter may, so it runs by hand, one file per task, with one command::

    NOPELIB_ALLOW_SLOW=1 python -m nopelib.studies.trained_study --tasks reversal indexing

which writes ``book/results/trained_<profile>_<task>.json`` (``--profile paper_study``: the
paper's base model under the same budget rules). Every run goes through the run cache, so a
study stopped by an interrupt, a kill or a shutdown resumes when the command is rerun: the
runs it finished come from the cache, and each run it was training goes on from its last
checkpoint (``nopelib.store.checkpoint``, one every 5 minutes of training), ending bit for bit as
it would have without the stop (its metrics record where it resumed, ``resumed_at``). Each
run records where it came from (``origin``): trained by the invocation that first wrote it
(its command, commit, machine and CPU kernels) or read from the run cache, and when it
finished; the file's provenance is the invocation that wrote it, with how many of its runs
it read from the cache and how many it kept from the committed file. A file grows by seed
and never shrinks: a committed run is kept over this invocation's run of its seed unless
``--replace SEED ...`` names the seed, and a kept run that this invocation would train under
another run key (other training sources, device or precision) is refused before any
training; so is a file trained under an older record of the profile unless ``--replace`` names
every seed it holds (``kept_runs``: a profile change never drops runs silently). Each write
re-reads the file under its lock (``results.write``), so two invocations merge their runs.

On the CPU, training expected to take over an hour (each run as long as the longest committed
run of its tasks, on one process per core) needs ``NOPELIB_ALLOW_SLOW=1``
(``gate.training_time_problem``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from nopelib.core.devices import resolve_device
from nopelib.core.tasks import TASKS, get_task
from nopelib.rules import claims
from nopelib.store.cache import resolve_cache_dir
from nopelib.results import files as results, guard
from nopelib.results.trained_files import live_seconds
from nopelib.core.one_model import longest_input, similarity_matrices
from nopelib.studies.probe_study import PROBE_FIT_TOKENS, probe_record
from nopelib.training.launch import train_many
from nopelib.training.profiles import PROFILES, get_profile
from nopelib.training.run_entry import load_run
from nopelib.training.runs import TrainedRun, run_key
from nopelib.training.task_precision import task_profile
from nopelib.training.train import TRAJECTORY_SEED
from nopelib.training.train_profile import TrainProfile, check_seed


MATRIX_DECIMALS = 4  # the stored similarity matrices: enough for a heatmap, a small file


def run_record(run: TrainedRun, probe_fit_tokens: int = PROBE_FIT_TOKENS) -> dict:
    """One run as the study file holds it: accuracy on the whole test split, budget, where its
    learning curve reached the learnedness line for good, its trajectory, whether and where it
    was resumed, its wall time (training, curve points and the final evaluation), and the
    self-similarity matrix of every layer on one longest input of its task (the paper's
    Figure 1, drawn from committed data)."""
    m, prof = run.metrics, run.profile
    curve = m.get("curve", {})
    text = longest_input(m["task"])
    if "scores" not in curve or "scores_init" not in m:
        raise ValueError(f"profile {prof.name!r} records no trajectory (n_trajectory=0): the "
                         "study needs one")
    plateau = claims.past_plateau(curve["step"], curve["accuracy"], m["steps"])
    return {
        "task": m["task"], "seed": m["seed"], "profile": prof.name, "key": m["key"],
        "origin": {"how": "run cache" if run.from_cache else "trained",
                   "finished": m["date"]},  # where it trained: stamp
        "accuracy": m["accuracy"], "n_test": m["n_test"], "steps": m["steps"],
        "decay_from": m.get("decay_from"), "train_seconds": m["train_seconds"],
        "wall_seconds": m["train_seconds"] + m.get("curve_seconds", 0.0)
        + m.get("eval_seconds", 0.0),
        "resumed_at": m.get("resumed_at", []), "dtype_policy": m.get("dtype_policy", "float32"),
        "learned_from": plateau["learned_from"], "tail": plateau["tail"],
        "scores_init": m["scores_init"], "scores_after": curve["scores"][-1],
        "trajectory": {name: curve[name] for name in
                       ("step", "accuracy", "val_accuracy", "loss", "scores") if name in curve},
        "probes": probe_record(run, probe_fit_tokens),
        "matrices": {"text": text, "layers": similarity_matrices(run.model, text).round(
            MATRIX_DECIMALS).tolist()},  # [L+1, T, T]
    }


def cached_runs(profile: TrainProfile, tasks: Sequence[str], seeds: Sequence[int],
                device: str = "auto") -> dict[tuple[str, int], TrainedRun]:
    """The (task, seed) runs of ``profile`` already committed to the run cache, nothing
    trained: what a study in flight has finished."""
    dev = resolve_device(device)
    root = resolve_cache_dir() / "runs"
    out = {}
    for task in tasks:
        prof = task_profile(profile, task)
        for seed in seeds:
            key = run_key(task, seed, prof, dev)
            loaded = load_run(root / key, key, prof)
            if loaded is not None:
                out[task, seed] = TrainedRun(*loaded, prof, from_cache=True)
    return out


def train_study_runs(profile: str | TrainProfile, tasks: Sequence[str], seeds: Sequence[int],
                     device: str = "auto", workers: int | None = None,
                     backend: str = "local") -> dict[tuple[str, int], TrainedRun]:
    """Every (task, seed) trained (or loaded) as the study trains it: each task under its
    ``task_profile``, the tasks of one precision as one pool, on any device (a task no
    check cleared trains in float32 on CUDA too: ``devices.dtype_policy``); each run records
    the precision that ran."""
    prof = get_profile(profile)
    profs = {task: task_profile(prof, task) for task in tasks}  # reads the checks once
    by_precision: dict[str, list[str]] = {}
    for task in tasks:
        by_precision.setdefault(profs[task].precision, []).append(task)
    runs: dict[tuple[str, int], TrainedRun] = {}
    for group in by_precision.values():
        runs |= train_many([(t, s) for t in group for s in seeds],
                           profs[group[0]], device=device, workers=workers,
                           backend=backend)
    return runs


def run_study(prof: TrainProfile, tasks: Sequence[str], seeds: Sequence[int],
              device: str = "auto", workers: int | None = None,
              probe_fit_tokens: int = PROBE_FIT_TOKENS, cached_only: bool = False,
              backend: str = "local") -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Train (or load) every (task, seed) of the profile ``prof`` on ``backend`` (``local``: one
    pool, or ``batched``: each task's seeds as one batched model, keyed and recorded under the
    profile's ``batched()`` twin); per task, the run records (``run_record``, with probes
    fitted on ``probe_fit_tokens`` tokens), and how many of them came from the cache.
    ``cached_only``: train nothing, record the runs the cache holds (a task with none is left
    out)."""
    if backend == "batched":
        prof = prof.batched()
    for task in tasks:
        get_task(task)
    for seed in seeds:
        check_seed(seed)
    if not prof.n_trajectory:
        raise ValueError(f"profile={prof.name!r} records no trajectory (n_trajectory=0)")
    if cached_only:
        runs = cached_runs(prof, tasks, seeds, device)
    else:
        runs = train_study_runs(prof, tasks, seeds, device, workers, backend)
    here = {**results.provenance("", [], time.perf_counter()),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    by_task = {task: stamp([run_record(runs[task, s], probe_fit_tokens) for s in seeds
                            if (task, s) in runs], here, TRAINED_ON) for task in tasks}
    by_task = {task: records for task, records in by_task.items() if records}
    cached = {task: sum(runs[task, s].from_cache for s in seeds if (task, s) in runs)
              for task in by_task}
    return by_task, cached


def kept_runs(path: Path, old: dict | None, training: dict, replace: Sequence[int],
              would: str) -> list[dict]:
    """The runs of ``old``, the committed document of the study file at ``path`` (None: no
    file), that a write of runs trained under the profile record ``training`` (``would``, in
    words) keeps: all but those of the seeds ``replace`` names. A file trained under another
    record of the profile (an older version of it) cannot hold today's runs beside its own (a
    file holds one record): unless ``replace`` names every seed it holds, that raises
    ``guard.Refused``, so a profile change never drops runs silently; until then the
    chapters read the file as stale (``trained_files.load_study``) and judge nothing on it."""
    if old is None:
        return []
    guard.refuse(guard.stale_problem(
        path, old, would, training, replace,
        other="move the file aside (--replace names seeds that --seeds trains)"))
    return [r for r in old["runs"] if r["seed"] not in replace]


def committed_runs(path: Path, training: dict, replace: Sequence[int],
                   would: str) -> list[dict]:
    """``kept_runs`` of the study file at ``path`` as it stands now (none without a file).
    An unreadable file raises ResultsError: it is not overwritten unread."""
    return kept_runs(path, results.load(path) if path.is_file() else None, training, replace,
                     would)


def grown(path: Path, old: dict | None, doc: dict, training: dict,
          replace: Sequence[int]) -> dict:
    """What a write of this invocation's ``doc`` leaves at ``path``, whose committed document
    is ``old`` as re-read when it writes (``results.write``: another invocation may have added
    runs since this one started): the runs it keeps (``kept_runs``) and ``doc``'s runs of the
    other seeds. A study grows by seed and never shrinks, and a committed run is kept over
    this invocation's run of its seed unless ``replace`` names the seed. The provenance
    counts the runs kept, and those of ``doc`` written that came from the run cache."""
    seeds = sorted(r["seed"] for r in doc["runs"])
    kept = kept_runs(path, old, training, replace, f"seeds {seeds} of today's profile record")
    held = {r["seed"] for r in kept}
    fresh = [r for r in doc["runs"] if r["seed"] not in held]
    runs = sorted([*kept, *fresh], key=lambda r: r["seed"])
    return {"provenance": {**doc["provenance"], "seeds": [r["seed"] for r in runs],
                           "runs_from_cache": sum(r["origin"]["how"] == "run cache"
                                                  for r in fresh),
                           "runs_kept": len(kept)}, "runs": runs}


# what a run trained here records of where it trained (run_study), and of the command that
# trained it (main): a run keeps them when a later invocation rewrites its file
TRAINED_ON = ("commit", "machine", "cpu_capability")
TRAINED_BY = ("command",)


def stamp(records: list[dict], facts: dict, fields: Sequence[str]) -> list[dict]:
    """``records`` with the runs trained here (``origin`` "trained") holding ``fields`` of
    ``facts`` (a provenance: ``results.provenance`` and the CPU's kernels)."""
    named = {k: facts[k] for k in fields}
    return [{**r, "origin": {**r["origin"], **named}} if r["origin"]["how"] == "trained"
            else r for r in records]


def _committed_problems(folder: Path, names: Sequence[str], tasks: Sequence[str],
                        seeds: Sequence[int], replace: Sequence[int], profile: TrainProfile,
                        training: dict, device: str) -> list[str]:
    """Why the committed files in ``folder`` cannot take this invocation's runs: a file that
    cannot be read (it would be overwritten unread), one trained under another record of the
    profile whose seeds ``replace`` does not all name (``kept_runs``), or a kept run of a seed
    to be trained under another run key (other training sources, device or precision: its
    new run would be trained, then dropped)."""
    dev = resolve_device(device)
    problems = []
    for task, name in zip(tasks, names):
        try:
            runs = committed_runs(folder / name, training, replace,
                                  f"seeds {sorted(seeds)} of today's profile record")
        except results.ResultsError as exc:
            problems.append(f"--out-dir {folder}: {exc}; move the file aside or mend it")
            continue
        except guard.Refused as exc:
            problems.append(str(exc))
            continue
        other = [r["seed"] for r in runs if r["seed"] in seeds
                 and r["key"] != run_key(task, r["seed"], task_profile(profile, task), dev)]
        if other:
            problems.append(
                f"--seeds: {folder / name} holds seed(s) {other} trained under another run "
                "key (other training sources, device or precision), and a committed run is "
                "kept: pass "
                f"--replace {' '.join(map(str, other))} to replace them, or leave them out")
    return problems


def study_profiles() -> list[str]:
    """The profiles a study can train: those that record a trajectory (``n_trajectory``)."""
    return sorted(name for name, prof in PROFILES.items() if prof.n_trajectory)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.trained_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", required=True, choices=list(TASKS))
    parser.add_argument("--profile", default="study", choices=sorted(PROFILES))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: the profile's seeds")
    parser.add_argument("--replace", nargs="+", type=int, default=[], metavar="SEED",
                        help="seeds whose committed run this invocation's run replaces "
                             "(default: a committed run is kept)")
    parser.add_argument("--out-dir", type=Path, default=results.RESULTS_DIR,
                        help="folder of the trained_<profile>_<task>.json files")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=None,
                        help="training processes on the CPU (default: one per core)")
    parser.add_argument("--probe-fit-tokens", type=int, default=PROBE_FIT_TOKENS,
                        help="probed tokens in each fitting split of the probes")
    parser.add_argument("--backend", default="local", choices=["local", "batched"],
                        help="local: one run per process (CPU) or after another (GPU); "
                             "batched: each task's seeds as one batched model (a GPU), "
                             "written as the profile's '+batched' twin")
    parser.add_argument("--cached-only", action="store_true",
                        help="train nothing: write the runs the cache holds (a study in "
                             "flight: k of the seeds)")
    args = parser.parse_args(argv)
    from nopelib.core.params import SEED, Choice, Device, Int, ListOf, OutPath, check_args
    from nopelib.training.gate import training_time_problem

    prof = PROFILES[args.profile]
    if args.backend == "batched":  # its own runs, files and committed records
        prof = prof.batched()
    seeds = list(prof.seeds) if args.seeds is None else args.seeds
    names = [f"trained_{prof.name}_{task}.json" for task in args.tasks]
    check_args(parser, {  # exit 2 now, not after hours of training
        "--tasks": (args.tasks, ListOf(Choice(TASKS), unique=True)),
        "--profile": (args.profile, Choice(study_profiles(), why="the profiles that record "
                                           "a trajectory (n_trajectory > 0), which the study "
                                           "reads")),
        "--seeds": (args.seeds, ListOf(SEED, unique=True).where(
            lambda values, _: set(values) <= set(prof.seeds),
            f"seeds of profile {prof.name!r}, {list(prof.seeds)} (a study file holds at most "
            "those)")),
        "--replace": (args.replace, ListOf(SEED, unique=True, min_len=0).where(
            lambda values, _: set(values) <= set(seeds),
            f"seeds this invocation trains, {seeds}")),
        "--out-dir": (args.out_dir, OutPath(folder=True).where(
            lambda folder, _: Path(folder).is_dir(), "an existing folder").where(
            lambda folder, _: not any((Path(folder) / name).is_dir() for name in names),
            f"a folder in which none of {names} is a folder")),
        "--device": (args.device, Device()),
        "--workers": (args.workers, Int(min=1, max=256, why="one process per core")),
        "--probe-fit-tokens": (args.probe_fit_tokens,
                               Int(min=1, max=10**6, why="the test split's tokens")),
    })
    training = json.loads(json.dumps(prof.record()))  # tuples as a file holds them
    problems = _committed_problems(args.out_dir, names, args.tasks, seeds, args.replace, prof,
                                   training, args.device)
    # the estimate reads the committed study: not once a file of it is refused above
    if not args.cached_only and not problems:
        slow = training_time_problem(
            prof, len(args.tasks) * len(seeds), args.device,
            live_seconds(prof.name, args.tasks), args.workers,
            basis="if each run takes as long as the longest committed training run of these "
                  "tasks",
            allowed="a GPU (--device cuda), fewer --tasks or --seeds per invocation")
        if slow is not None:
            problems.append(f"--profile {prof.name} --device {args.device}: {slow}")
    if problems:
        parser.error("\n  ".join(problems))
    start = time.perf_counter()
    by_task, from_cache = run_study(prof, args.tasks, seeds, args.device, args.workers,
                                    args.probe_fit_tokens, args.cached_only, args.backend)
    for task, records in by_task.items():
        out = args.out_dir / f"trained_{prof.name}_{task}.json"
        provenance = results.provenance(
            "python -m nopelib.studies.trained_study", argv, start, profile=prof.name,
            training=prof.record(), tasks=list(args.tasks),
            seeds=sorted(r["seed"] for r in records),  # grown counts them beside the file's
            runs_from_cache=sum(r["origin"]["how"] == "run cache" for r in records),
            runs_kept=0,
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            trajectory={"n_inputs": prof.n_trajectory, "seed": TRAJECTORY_SEED})
        doc = {"provenance": provenance, "runs": stamp(records, provenance, TRAINED_BY)}
        results.write(out, doc, "trained", merge=lambda old, new, out=out: grown(
            out, old, new, training, args.replace))
        print(f"wrote {out}: {len(records)} runs, accuracy "
              + ", ".join(f"{r['accuracy']:.4f}" for r in records))
    print(f"{sum(map(len, by_task.values()))} runs ({sum(from_cache.values())} from the "
          f"cache) in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
