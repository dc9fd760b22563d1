"""Benchmark of the paper model's training step on a CPU: precision, compilation, threads.

``python -m nopelib.tools.bench_paper`` times ``train.train_step`` of the paper's base model (6 x
384, the ``paper_study`` profile's model) at batch 64 on one batch of every task (each cut to its
own length), on one thread as the study trains, under:

- float32 eager (the reference);
- bf16 autocast, where the CPU has bf16 units (``devices.bf16_available``);
- ``torch.compile`` of each of them;

interleaved (one step of each per repeat, so load changes hit them alike), medians over the
repeats after a warm-up that holds the compilation. It then compares the two ways to use two
cores for the study: one run on two threads against two runs side by side on one thread each
(separate processes), as steps per second of the machine. Every figure is a ratio against a
reference measured in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

from nopelib.core.devices import bf16_available
from nopelib.core.model import GPTConfig
from nopelib.core.params import Int, OutPath, check_args
from nopelib.core.tasks import TASKS, encode_batch, make_split
from nopelib.core.one_model import random_model
from nopelib.tools.bench_report import write_json
from nopelib.training.profiles import PROFILES
from nopelib.training.train import adamw, train_step

PROFILE = "paper_study"
MODES = (  # (name, bf16 autocast, torch.compile); the reference first
    ("float32 (ref)", False, False),
    ("bf16 autocast", True, False),
    ("float32 + compile", False, True),
    ("bf16 autocast + compile", True, True),
)


def _batch(task: str, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One training batch of ``task``, [B, T_task], cut to its longest row as in training."""
    return encode_batch(make_split(task, 0, n_train=batch_size, n_test=0).train)


def _stepper(config: GPTConfig, bf16: bool, compile: bool, task: str, batch_size: int):
    """A closure that runs one training step of a fresh ``config`` model on ``task``'s
    batch, with the paper study's optimiser."""
    prof = PROFILES[PROFILE]
    model = random_model(config, seed=0).train()
    opt = adamw(model.parameters(), prof)
    net = torch.compile(model) if compile else model
    idx, targets = _batch(task, batch_size)

    def step() -> None:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else None
        train_step(net, opt, idx, targets, prof.grad_clip, autocast)

    return step


def bench_modes(config: GPTConfig, tasks: list[str], batch_size: int,
                repeats: int) -> list[dict]:
    """Per task and mode: median ms per step on one thread and the speed-up over float32."""
    modes = [m for m in MODES if bf16_available() or not m[1]]
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for task in tasks:
            steps = {name: _stepper(config, bf16, comp, task, batch_size)
                     for name, bf16, comp in modes}
            warm, failed = {}, {}
            for name, step in list(steps.items()):  # compilation lands in the warm-up
                start = time.perf_counter()
                try:  # torch.compile needs a working C++ toolchain
                    step()
                    step()
                except Exception as exc:  # noqa: BLE001
                    failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    del steps[name]
                warm[name] = time.perf_counter() - start
            samples: dict[str, list[float]] = {name: [] for name in steps}
            for _ in range(repeats):
                for name, step in steps.items():
                    start = time.perf_counter()
                    step()
                    samples[name].append(time.perf_counter() - start)
            ref = statistics.median(samples[modes[0][0]])
            for name, *_ in modes:
                if name in failed:
                    rows.append(dict(task=task, mode=name, status=f"failed: {failed[name]}"))
                    continue
                med = statistics.median(samples[name])
                rows.append(dict(task=task, mode=name,
                                 seq_len=_batch(task, batch_size)[0].shape[1],
                                 step_ms=1000 * med, min_ms=1000 * min(samples[name]),
                                 max_ms=1000 * max(samples[name]), warmup_s=warm[name],
                                 speedup=ref / med, status="ok"))
    finally:
        torch.set_num_threads(threads)
    return rows


def _steps_for(seconds_out: mp.Queue, config: GPTConfig, threads: int, bf16: bool, task: str,
               batch_size: int, n: int) -> None:
    torch.set_num_threads(threads)
    step = _stepper(config, bf16, False, task, batch_size)
    step()  # warm-up
    start = time.perf_counter()
    for _ in range(n):
        step()
    seconds_out.put(time.perf_counter() - start)


def bench_threads(config: GPTConfig, task: str, batch_size: int, n: int) -> list[dict]:
    """Steps per second of the machine: one run on two threads (the reference) against two
    runs side by side on one thread each, each in its own process, in the precision the CPU
    trains fastest in."""
    bf16 = bf16_available()
    ctx = mp.get_context("spawn")
    out: list[dict] = []
    for name, procs, threads in (("1 run x 2 threads (ref)", 1, 2),
                                 ("2 runs x 1 thread", 2, 1)):
        queue = ctx.Queue()
        workers = [ctx.Process(target=_steps_for, args=(queue, config, threads, bf16, task,
                                                        batch_size, n)) for _ in range(procs)]
        for w in workers:
            w.start()
        seconds = [queue.get() for _ in workers]
        for w in workers:
            w.join()
        out.append(dict(setting=name, precision="bf16 autocast" if bf16 else "float32",
                        steps=n * procs, wall_s=max(seconds),
                        steps_per_s=n * procs / max(seconds)))
    for row in out:
        row["speedup"] = row["steps_per_s"] / out[0]["steps_per_s"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nopelib.tools.bench_paper",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--thread-steps", type=int, default=20,
                        help="steps per run in the threads comparison")
    parser.add_argument("--json", default="bench_paper.json")
    args = parser.parse_args(argv)
    check_args(parser, {"--json": (args.json, OutPath()),
                        "--repeats": (args.repeats, Int(min=1, max=100, why="1 s a step")),
                        "--thread-steps": (args.thread_steps,
                                           Int(min=1, max=1000, why="1 s a step"))})
    config, batch = PROFILES[PROFILE].model, PROFILES[PROFILE].batch_size
    start = time.perf_counter()
    result = {"meta": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "torch": torch.__version__, "cpu_count": os.cpu_count(),
                       "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "bf16_units": bf16_available(), "batch_size": batch,
                       "loadavg_start": list(os.getloadavg())},
              "modes": bench_modes(config, args.tasks, batch, args.repeats),
              "threads": bench_threads(config, "reversal", batch, args.thread_steps)}
    result["meta"].update(loadavg_end=list(os.getloadavg()),
                          total_s=time.perf_counter() - start)
    for key in ("modes", "threads"):
        rows = result[key]
        cols = list(dict.fromkeys(c for r in rows for c in r))
        print("\n".join([" | ".join(cols)] + [" | ".join(
            f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols)
            for r in rows]) + "\n")
    if not result["meta"]["bf16_units"]:
        print("this CPU has no bf16 units: bf16 autocast was not timed (float32 only)")
    write_json(result, args.json)
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
