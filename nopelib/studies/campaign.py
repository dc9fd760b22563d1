"""The paper-model campaign: train the paper study's queued runs until a deadline, each sitting.

Three more seeds of ordering, indexing and addition on the paper's 6 x 384 model cost about 40
core-hours, while a development sitting has under three hours on two cores and may come up on
another machine. So the study advances as a campaign: one command, started in the first
minutes of every sitting from a clone of the repository at a recorded commit::

    cd <clone> && NOPELIB_CACHE_DIR=<cache> python -m nopelib.studies.campaign \\
        --until 2h40m --out-dir <checkout>/book/results

It takes the next run from ``QUEUE`` (committed here, in the order the study needs them) that
its task's study file does not hold yet, a run with a checkpoint on this machine first (it was
in flight when a sitting stopped), and trains it with ``nopelib.studies.trained_study`` (the
committed profile, budget rules, precision checks and probes; one thread a run), which writes
the finished run into ``trained_paper_study_<task>.json`` at once, so that committing it is
one ``git add``. At the deadline it stops each run in flight right after its next checkpoint
(written every ``CHECKPOINT_SECONDS`` here), so a stop loses seconds, and starts no run with
less than ``MIN_START_SECONDS`` left.

Streams: one run at a time by default (``--streams 1``), so the other core stays free for
the sitting's other work; ``--streams 2`` when nothing else needs the cores (two one-thread
runs side by side did 1.14x the steps of one run on two threads, measured with
``nopelib.tools.bench_paper``). A run is never split over two threads: a CPU run trains on one
thread so that its bits do not depend on the core count (``runs.train_and_score``).

The ledger ``campaign_paper_study.json`` (beside the study files) records every sitting: its
commit, machine, CPU kernels, deadline and streams, and per run the step it started from, the
step it reached, its wall time, whether it finished, and the steps it lost to a machine change
(a step an earlier sitting reached that this machine's checkpoints no longer hold).

On a GPU (``--device cuda``: up to 8 streams, a run each, filed under the profile itself)
the next task's missing seeds start together; no run starts with under ``--min-start`` left,
and at the deadline the runs in flight stop at once, recorded as not finished with their steps
lost (no checkpoint leaves that machine). Its prepared command: ``nopelib.studies.campaign_gpu``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch

from nopelib.core.tasks import TASKS
from nopelib.store.cache import resolve_cache_dir
from nopelib.results import files as results
from nopelib.results.schema import CAMPAIGN_STREAMS
from nopelib.training.profiles import get_profile
from nopelib.training.runs import run_key
from nopelib.training.task_precision import task_profile

PROFILE = "paper_study"
# the runs the study still needs, in the order the scorecard needs them: three seeds of each
# task without a verdict, addition's missing two of its first three, then fourth and fifth seeds
QUEUE: tuple[tuple[str, int], ...] = (
    ("ordering", 0), ("ordering", 1), ("ordering", 2),
    ("indexing", 0), ("indexing", 1), ("indexing", 2),
    ("addition", 0), ("addition", 2),
    ("ordering", 3), ("indexing", 3), ("addition", 3),
    ("ordering", 4), ("indexing", 4), ("addition", 4),
)
CHECKPOINT_SECONDS = 120  # between a campaign run's checkpoints (about 0.5 s each to write)
MIN_START_SECONDS = 600  # no run starts with less left: it would not reach a checkpoint worth it
GRACE_SECONDS = 60  # past the deadline and one checkpoint interval, a run is stopped anyway
# on a GPU: a run's checkpoints never come back, so they only tell the ledger its step, and
# the default --min-start is short (a run that cannot finish loses its steps)
CUDA_CHECKPOINT_SECONDS = 60
CUDA_MIN_START_SECONDS = 120
LEDGER = f"campaign_{PROFILE}.json"
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
CLOCK = re.compile(r"^(\d{1,2}):(\d{2})$")


def parse_until(text: str, now: datetime) -> datetime:
    """The deadline ``--until`` names: a duration from ``now`` (``2h40m``, ``90m``, ``300s``)
    or a UTC clock time (``15:30``, the next such time)."""
    clock = CLOCK.match(text)
    if clock and int(clock[1]) < 24 and int(clock[2]) < 60:
        at = now.replace(hour=int(clock[1]), minute=int(clock[2]), second=0, microsecond=0)
        return at if at > now else at + timedelta(days=1)
    return now + timedelta(seconds=parse_duration(text, "--until"))


def parse_duration(text: str, flag: str = "--min-start") -> int:
    """The seconds a duration names (``2h40m``, ``90m``, ``300s``); ``flag`` names it."""
    parts = DURATION.match(text)
    if not text or not parts or not any(parts.groups()):
        raise ValueError(f"{flag}={text!r} is not allowed: a duration such as 2h40m, 90m or "
                         "300s" + (", or a UTC time such as 15:30" if flag == "--until" else ""))
    hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return 3600 * hours + 60 * minutes + seconds


def committed_seeds(folder: Path, task: str) -> set[int]:
    """The seeds the study file of ``task`` in ``folder`` holds (none without a file)."""
    path = folder / f"trained_{PROFILE}_{task}.json"
    return {run["seed"] for run in results.load(path)["runs"]} if path.is_file() else set()


def committed_steps(folder: Path, task: str, seed: int) -> int:
    """The steps the committed run of (task, seed) in ``folder`` trained."""
    runs = results.load(folder / f"trained_{PROFILE}_{task}.json")["runs"]
    return next(run["steps"] for run in runs if run["seed"] == seed)


def pending(folder: Path, queue: Sequence[tuple[str, int]] = QUEUE) -> list[tuple[str, int]]:
    """The runs of ``queue`` that the study files in ``folder`` do not hold yet, in order."""
    held = {task: committed_seeds(folder, task) for task in {t for t, _ in queue}}
    return [(task, seed) for task, seed in queue if seed not in held[task]]


def key_of(task: str, seed: int, device: str = "cpu") -> str:
    """The run key the study trains (task, seed) under on ``device`` (cpu or cuda)."""
    return run_key(task, seed, task_profile(get_profile(PROFILE), task), device)


def newest_step(checkpoints: Path, key: str) -> int:
    """The step of the newest checkpoint of run ``key`` under ``checkpoints`` (0: none)."""
    folder = checkpoints / key
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return max(steps, default=0)


def begun(cache: Path, key: str) -> bool:
    """Whether run ``key`` is under way in the cache at ``cache``: a checkpoint of it, or
    its trained model (stopped while its probes ran)."""
    return newest_step(cache / "checkpoints", key) > 0 or (cache / "runs" / key).is_dir()


def next_run(todo: Sequence[tuple[str, int]], busy: set[tuple[str, int]],
             begun: Callable[[str, int], bool]) -> tuple[str, int] | None:
    """The run to start: the first of ``todo`` not ``busy`` that is ``begun`` here (in
    flight when a sitting stopped), else the first not ``busy``; None when all are."""
    free = [run for run in todo if run not in busy]
    return next((run for run in free if begun(*run)), free[0] if free else None)


def by_task(todo: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """``todo`` with each task's runs together, the tasks in the order of their first run: on
    a GPU the next task's missing seeds train side by side, as a batch of its seeds would."""
    tasks = list(dict.fromkeys(task for task, _ in todo))
    return sorted(todo, key=lambda run: tasks.index(run[0]))


def trained_study_command(task: str, seed: int, out_dir: Path,
                          device: str = "cpu") -> list[str]:
    """The command that trains one queued run on ``device`` and writes it into its study
    file."""
    return [sys.executable, "-m", "nopelib.studies.trained_study", "--profile", PROFILE,
            "--tasks", task, "--seeds", str(seed), "--workers", "1", "--device", device,
            "--out-dir", str(out_dir)]


@dataclass
class Flight:
    """A run this sitting trains: its process and what the ledger says of it."""
    task: str
    seed: int
    key: str
    process: subprocess.Popen
    record: dict
    started: float = field(default_factory=time.monotonic)
    stop_after: int | None = None  # set at the deadline: stop once a checkpoint passes it


def stop(process: subprocess.Popen) -> None:
    """End a run's process group (trained_study and its worker), politely first."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        with suppress(ProcessLookupError):  # the group is gone: the wait returns at once
            os.killpg(process.pid, sig)
        with suppress(subprocess.TimeoutExpired):
            process.wait(20)


def on_cpu(run: dict) -> bool:
    """Whether a ledger record's run trained on a CPU (no device: an early sitting); a GPU's
    record counts its steps lost itself."""
    return run.get("device", "cpu") == "cpu"


def reached_before(ledger: Sequence[dict], key: str) -> int:
    """The step the latest CPU sitting in ``ledger`` (its run records, in sitting order) left
    ``key`` at: where its newest checkpoint stands, if this machine is that one. Not the
    furthest step any sitting reached: after a machine change the run starts again, and a
    later change loses only what was trained since."""
    return next((r["to_step"] for r in reversed(ledger) if r["key"] == key and on_cpu(r)), 0)


def elsewhere(ledger: Sequence[dict], todo: Sequence[tuple[str, int]]) -> list[str]:
    """For each unfinished run of ``todo`` that an earlier sitting left in flight under
    another run key than this clone gives it (the training sources changed since): where its
    checkpoints can be resumed, a clone at the commit that trained it."""
    last: dict[tuple[str, int], dict] = {}
    for run in filter(on_cpu, ledger):  # in sitting order: the newest record of a run wins
        last[run["task"], run["seed"]] = run
    out = []
    for task, seed in todo:
        run = last.get((task, seed))
        if run and not run["finished"] and run["to_step"] and run["key"] != key_of(task, seed):
            out.append(f"{task} seed {seed} reached step {run['to_step']:,} under run key "
                       f"{run['key'][:12]} at commit {run['commit'][:12]} on {run['machine']}; "
                       "this clone's training sources give it another key, so it starts "
                       "again: to resume it, run the campaign from a clone at that commit")
    return out


def read_ledger(path: Path) -> list[dict]:
    """The run records of the committed ledger at ``path`` (none without one)."""
    return results.load(path)["runs"] if path.is_file() else []


def run_campaign(until: datetime, out_dir: Path, streams: int = 1,
                 launch: Callable[[str, int, Path, Path], subprocess.Popen] | None = None,
                 poll: float = 5.0, argv: Sequence[str] = (), device: str = "cpu",
                 min_start: float | None = None) -> dict:
    """Train queued runs until ``until`` on ``streams`` processes on ``device`` (no run
    starting with less than ``min_start`` seconds left), writing each finished run (by
    ``launch``: ``trained_study``) and the ledger into ``out_dir``; this sitting's run
    records (one per run it trained, each naming the sitting)."""
    start = time.perf_counter()
    cache = resolve_cache_dir()
    checkpoints, logs = cache / "checkpoints", cache / "campaign_logs"
    logs.mkdir(parents=True, exist_ok=True)
    cuda = device == "cuda"
    if min_start is None:
        min_start = CUDA_MIN_START_SECONDS if cuda else MIN_START_SECONDS
    threads = max(1, (os.cpu_count() or 1) // streams) if cuda else 1  # a GPU's CPU cores
    launch = launch or (lambda t, s, o, lg: launch_run(t, s, o, lg, device, threads))
    ledger_path = out_dir / LEDGER
    before = read_ledger(ledger_path)
    here = results.provenance("python -m nopelib.studies.campaign", list(argv), start)
    sitting = {"commit": here["commit"], "machine": here["machine"],
               "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "started": here["date"], "until": until.isoformat(timespec="seconds"),
               "streams": streams, "device": device}
    if cuda and torch.cuda.is_available():
        sitting["gpu"] = torch.cuda.get_device_name()
    records: list[dict] = []
    flights: list[Flight] = []
    failed: set[tuple[str, int]] = set()

    def save() -> None:
        """Write the ledger: the committed records, with this sitting's in their newest
        state (one campaign writes a ledger at a time)."""
        mine = {(r["key"], r["started"]) for r in records}
        kept = [r for r in read_ledger(ledger_path) if (r["key"], r["started"]) not in mine]
        provenance = results.provenance("python -m nopelib.studies.campaign", list(argv),
                                        start, profile=PROFILE,
                                        queue=[list(run) for run in QUEUE])
        results.write(ledger_path, {"provenance": provenance, "runs": kept + records},
                      "campaign")

    while True:
        now = datetime.now(timezone.utc)
        left = (until - now).total_seconds()
        todo = [run for run in pending(out_dir) if run not in failed]
        todo = by_task(todo) if cuda else todo
        busy = {(f.task, f.seed) for f in flights}
        while len(flights) < streams and left >= min_start:
            run = next_run(todo, busy, lambda t, s: begun(cache, key_of(t, s, device)))
            if run is None:
                break
            key = key_of(*run, device)
            step = newest_step(checkpoints, key)
            record = {"task": run[0], "seed": run[1], "key": key, "from_step": step,
                      "to_step": step, "steps_lost": max(0, reached_before(before, key) - step),
                      "wall_seconds": 0.0, "finished": False, **sitting}
            records.append(record)
            flights.append(Flight(*run, key, launch(*run, out_dir, logs), record))
            busy.add(run)
            print(f"started {run[0]} seed {run[1]} from step {step:,}", flush=True)
            save()
        if not flights:
            break
        time.sleep(poll)
        if cuda and datetime.now(timezone.utc) >= until:  # no checkpoint returns: stop all
            for flight in flights:
                with suppress(ProcessLookupError):
                    os.killpg(flight.process.pid, signal.SIGTERM)
        for flight in list(flights):
            step = newest_step(checkpoints, flight.key)
            flight.record["wall_seconds"] = round(time.monotonic() - flight.started, 1)
            if step > flight.record["to_step"]:  # a new checkpoint: the ledger says so now,
                flight.record["to_step"] = step  # so a sitting cut off still records it
                save()
            done = flight.process.poll()
            past = (datetime.now(timezone.utc) - until).total_seconds()
            if done is None and past >= 0:
                if flight.stop_after is None:
                    flight.stop_after = step
                if cuda or step > flight.stop_after or past > CHECKPOINT_SECONDS + GRACE_SECONDS:
                    stop(flight.process)
                    done = flight.process.poll()
            if done is None:
                continue
            flights.remove(flight)  # a checkpoint written while it stopped counts
            flight.record["to_step"] = max(step, newest_step(checkpoints, flight.key))
            finished = (flight.task, flight.seed) not in pending(out_dir)
            flight.record["finished"] = finished
            if finished:
                flight.record["to_step"] = committed_steps(out_dir, flight.task, flight.seed)
            elif cuda:  # its checkpoints stay on this machine, which goes back
                lost = flight.record["to_step"] - flight.record["from_step"]
                flight.record["steps_lost"] += lost
            if not finished and datetime.now(timezone.utc) < until:  # failed: not again
                failed.add((flight.task, flight.seed))
                print(f"{flight.task} seed {flight.seed} stopped with exit code {done} "
                      f"before the deadline; see {logs}", flush=True)
            print(f"{flight.task} seed {flight.seed}: "
                  + ("finished and written" if finished else
                     f"stopped at step {flight.record['to_step']:,}"), flush=True)
            save()
    return records


def launch_run(task: str, seed: int, out_dir: Path, logs: Path, device: str = "cpu",
               threads: int = 1) -> subprocess.Popen:
    """Start ``trained_study_command`` for one run on ``device``, in its own process group,
    on ``threads`` CPU threads (one on the CPU), checkpointing every CHECKPOINT_SECONDS (on
    cuda CUDA_CHECKPOINT_SECONDS), its output in ``logs``."""
    every = CUDA_CHECKPOINT_SECONDS if device == "cuda" else CHECKPOINT_SECONDS
    env = {**os.environ, "NOPELIB_ALLOW_SLOW": "1", "OMP_NUM_THREADS": str(threads),
           "NOPELIB_CHECKPOINT_SECONDS": str(every)}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    log = open(logs / f"{task}_{seed}_{stamp}.log", "w")  # the child keeps the descriptor
    with log:
        return subprocess.Popen(trained_study_command(task, seed, out_dir, device), env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nopelib.studies.campaign", description=__doc__.split("\n\n")[0],
        epilog="--streams 1 (the default) leaves a core free for other work; --streams 2 "
               "when nothing else needs the cores (1.14x the steps of one run on two "
               "threads). Run it from a clone at a fixed commit, with --out-dir pointing at "
               "the checkout whose book/results you commit. On a GPU machine: "
               "python -m nopelib.studies.campaign_gpu --help.")
    parser.add_argument("--until", required=True,
                        help="when to stop: a duration (2h40m, 90m) or a UTC time (15:30)")
    parser.add_argument("--device", default="cpu", choices=list(CAMPAIGN_STREAMS))
    parser.add_argument("--streams", type=int, default=1,
                        help=f"runs trained at once, one process each: 1 (the default) to "
                             f"{CAMPAIGN_STREAMS['cpu']} on the CPU (one thread each), up to "
                             f"{CAMPAIGN_STREAMS['cuda']} with --device cuda")
    parser.add_argument("--min-start", metavar="DURATION",
                        help="start no run with less left (default 10m, on cuda 2m)")
    parser.add_argument("--out-dir", type=Path, default=results.RESULTS_DIR,
                        help="folder of the study files and the ledger")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the queue still to train and the next run; train nothing")
    args = parser.parse_args(argv)
    try:
        until = parse_until(args.until, datetime.now(timezone.utc))
        margin = None if args.min_start is None else parse_duration(args.min_start)
    except ValueError as exc:
        parser.error(str(exc))
    most = CAMPAIGN_STREAMS[args.device]
    if not 1 <= args.streams <= most:
        parser.error(f"--streams={args.streams} is not allowed with --device {args.device}: "
                     f"1 to {most} (up to {CAMPAIGN_STREAMS['cuda']} with --device cuda)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device='cuda' is not allowed here: torch sees no CUDA device on this "
                     "machine (--device cpu trains on its cores)")
    if not args.out_dir.is_dir():
        parser.error(f"--out-dir={str(args.out_dir)!r} is not allowed: an existing folder")
    for task, _ in QUEUE:
        if task not in TASKS:
            parser.error(f"QUEUE names task {task!r}, not one of {list(TASKS)}")
    todo = pending(args.out_dir)
    print(f"{len(todo)} of {len(QUEUE)} queued runs to train: "
          + ", ".join(f"{t} {s}" for t, s in todo), flush=True)
    for line in elsewhere(read_ledger(args.out_dir / LEDGER), todo):
        print(line, flush=True)
    if args.dry_run or not todo:
        return
    records = run_campaign(until, args.out_dir, args.streams,
                           argv=argv if argv is not None else sys.argv[1:],
                           device=args.device, min_start=margin)
    for run in records:
        print(f"{run['task']} seed {run['seed']}: "
              + ("finished" if run["finished"] else f"at step {run['to_step']:,}"))


if __name__ == "__main__":
    main()
