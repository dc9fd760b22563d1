"""Train a named grid (tasks x seeds x configurations) and write its summary.

::

    python -m nopelib.studies.grid tiny --out /tmp/tiny.json       # seconds, on a laptop
    python -m nopelib.studies.grid paper-base --device cuda --batched \
        --out book/results/grid_paper-base.json                     # one GPU
    python -m nopelib.studies.grid paper --address auto \
        --out book/results/grid_paper.json                          # a Ray cluster

``GRIDS`` names the grids. ``paper`` is the paper's trained grid: the four tasks, 5 seeds, and
9 configurations (6, 12, 24 layers x 192, 384, 768 wide, 6 heads, the ``paper`` profile's
training budget; 180 runs up to 170 M parameters). Every run goes through the run cache, so an
interrupted grid resumes where it stopped. The summary (JSON, or CSV with the provenance as
``#`` lines) has one row per run: exact match, the adjacency score at every layer before and
after training (mean over ``n_inputs`` inputs of the task), the training time and device; and
its provenance: command, git commit, machine, torch version, backend, wall time.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nopelib.core import metrics
from nopelib.core.model import GPTConfig
from nopelib.core.tasks import TASKS, sample_inputs
from nopelib.store import cache
from nopelib.store.cache import commit_file
from nopelib.results import files as results, guard
from nopelib.core import one_model
from nopelib.training.launch import BACKENDS, train_many
from nopelib.training.profiles import PROFILES
from nopelib.training.train_profile import TrainProfile


@dataclass(frozen=True)
class Grid:
    """Runs of every task x seed x profile (one profile per model configuration)."""

    name: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    profiles: tuple[TrainProfile, ...]
    n_inputs: int = 64  # inputs per task whose adjacency scores are averaged

    @property
    def n_runs(self) -> int:
        return len(self.tasks) * len(self.seeds) * len(self.profiles)


PAPER = PROFILES["paper"]
# seconds on a laptop: the test suite's kind of tiny model
TINY = replace(
    PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=30, batch_size=8, warmup_steps=5, n_train=256, n_test=64, n_eval=64,
    eval_batch_size=64, log_every=10, seeds=(0, 1), task_budgets=(), curve_every=0, n_curve=64,
)
GRIDS: dict[str, Grid] = {
    "paper": Grid("paper", tuple(TASKS), PAPER.seeds,
                  tuple(PAPER.sized(n_layer, n_embd) for n_layer in (6, 12, 24)
                        for n_embd in (192, 384, 768))),
    "paper-base": Grid("paper-base", tuple(TASKS), PAPER.seeds, (PAPER,)),
    "cpu": Grid("cpu", tuple(TASKS), PROFILES["cpu"].seeds, (PROFILES["cpu"],)),
    "tiny": Grid("tiny", ("addition", "reversal"), (0, 1), (TINY, replace(
        TINY, name="tiny-L3", model=replace(TINY.model, n_layer=3))), n_inputs=16),
}


def get_grid(name: str | Grid) -> Grid:
    if isinstance(name, Grid):
        return name
    if name not in GRIDS:
        raise ValueError(f"grid={name!r} is unknown; allowed: {sorted(GRIDS)}")
    return GRIDS[name]


def _mean_scores(model: torch.nn.Module, texts: list[str]) -> list[float]:
    return metrics.layer_scores(model, texts).mean(axis=0).round(6).tolist()  # [n_layer + 1]


def run_grid(grid: str | Grid, device: str = "auto", backend: str = "local",
             address: str | None = None, batched: bool = False, workers: int | None = None,
             gpu_fraction: float | None = None) -> list[dict]:
    """Train (or load) every run of ``grid``; one summary row per run."""
    grid = get_grid(grid)
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; allowed: {BACKENDS}")
    if batched and backend not in ("local", "batched"):
        raise ValueError(f"batched=True trains in this process: it cannot use backend={backend!r}")
    backend = "batched" if batched else backend
    started = False
    if backend == "ray":  # one Ray instance or connection for the whole grid
        from nopelib.training import distributed

        started = distributed.connect(address, workers)
    try:
        rows = _train_and_score(grid, device, backend, address, workers, gpu_fraction)
    finally:
        if started:
            import ray

            ray.shutdown()
    return rows


def _train_and_score(grid: Grid, device: str, backend: str, address: str | None,
                     workers: int | None, gpu_fraction: float | None) -> list[dict]:
    runs = [(t, s) for t in grid.tasks for s in grid.seeds]
    inputs = {t: sample_inputs(t, grid.n_inputs, seed=0) for t in grid.tasks}
    rows = []
    for i, prof in enumerate(grid.profiles):
        print(f"[{i + 1}/{len(grid.profiles)}] {prof.name}: {len(runs)} runs", flush=True)
        trained = train_many(runs, prof, device, workers=workers, backend=backend,
                             address=address, gpu_fraction=gpu_fraction)
        for (task, seed), run in trained.items():
            m, cfg = run.metrics, prof.model
            before = one_model.random_model(cfg, seed)
            rows.append({
                "profile": run.profile.name, "n_layer": cfg.n_layer, "n_embd": cfg.n_embd,
                "n_head": cfg.n_head, "num_params": m["num_params"], "task": task,
                "seed": seed, "accuracy": m["accuracy"], "n_test": m["n_test"],
                "final_loss": m["final_loss"], "train_seconds": m["train_seconds"],
                "device": m["device"], "torch": m["torch"], "key": m["key"],
                "from_cache": run.from_cache,
                "adjacency_before": _mean_scores(before, inputs[task]),
                "adjacency_after": _mean_scores(run.model, inputs[task]),
            })
    return rows


def write_summary(path: Path, provenance: dict, rows: list[dict]) -> None:
    """JSON (``{"provenance", "runs"}``) or, for a ``.csv`` path, CSV with the provenance as
    leading ``# key: value`` lines (values in JSON) and the per-layer scores as JSON lists."""
    if path.suffix == ".csv":
        out = io.StringIO()
        out.writelines(f"# {k}: {json.dumps(v)}\n" for k, v in provenance.items())
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()}
                         for r in rows)
        commit_file(path, out.getvalue().encode())
    else:
        commit_file(path, json.dumps({"provenance": provenance, "runs": rows}, indent=1).encode())


def load_summary(path: str | Path) -> tuple[dict, pd.DataFrame]:
    """The provenance and the runs (one row each) of a summary that ``write_summary`` wrote,
    validated by ``results.validate`` (the file and the field are named when something is
    wrong); ``adjacency_before``/``adjacency_after`` hold one score per layer (0 = embeddings)."""
    path = Path(path)
    try:
        text = cache.read_bytes(path, results.MAX_BYTES).decode()
        if path.suffix == ".csv":
            lines = text.splitlines()
            head = [ln[2:].split(": ", 1) for ln in lines if ln.startswith("# ")]
            provenance = {k: results.parse_json(v, f"{path}: provenance.{k}") for k, v in head}
            table = pd.read_csv(io.StringIO("\n".join(ln for ln in lines
                                                      if not ln.startswith("#"))))
            runs = table.to_dict("records")
            for i, row in enumerate(runs):
                for col in ("adjacency_before", "adjacency_after"):
                    if not isinstance(row.get(col), str):  # an empty cell reads as NaN
                        raise ValueError(f"runs[{i}].{col} = {row.get(col)!r}: must be the "
                                         "layers' scores as a JSON list")
                    row[col] = results.parse_json(row[col], f"{path}: runs[{i}].{col}")
            data = {"provenance": provenance, "runs": runs}
        else:
            data = results.parse_json(text, str(path))
    except results.ResultsError:
        raise  # already names the file and the field
    except (OSError, ValueError, KeyError) as exc:
        raise results.ResultsError(f"{path}: cannot be read as a grid summary: {exc}") from None
    results.validate(data, "grid", str(path))
    return data["provenance"], pd.DataFrame(data["runs"])


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and task: seeds, exact match and the adjacency score after the first
    layer and at the last layer, before and after training, as mean and sample std over
    seeds."""
    df = runs.assign(
        first_before=runs["adjacency_before"].map(lambda s: s[1]),
        first_after=runs["adjacency_after"].map(lambda s: s[1]),
        last_before=runs["adjacency_before"].map(lambda s: s[-1]),
        last_after=runs["adjacency_after"].map(lambda s: s[-1]),
    )
    cols = ["accuracy", "first_before", "first_after", "last_before", "last_after"]
    g = df.groupby(["n_layer", "n_embd", "task"], sort=True)
    table = g[cols].agg(["mean", "std"]).round(3)
    table.columns = [f"{c} {stat}" for c, stat in table.columns]
    table.insert(0, "seeds", g.size())
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.grid",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(GRIDS))
    parser.add_argument("--out", type=Path, help="summary file, .json or .csv "
                        "(default: grid_NAME.json here)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="default: ray with --address, else local")
    parser.add_argument("--address", default=None, help="a Ray cluster ('auto', host:port)")
    parser.add_argument("--batched", action="store_true",
                        help="the seeds of a task as one batched model (a GPU)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--gpu-fraction", type=float, default=None)
    parser.add_argument("--replace", action="store_true",
                        help="replace the file at --out (default: an existing file is refused)")
    args = parser.parse_args(argv)
    backend = args.backend or ("ray" if args.address else "local")
    if args.batched and backend == "local":  # --batched names the batched backend
        backend = "batched"
    out = args.out or Path(f"grid_{args.name}.json")
    from nopelib.training.distributed import ADDRESS_ENV, RAY_DEVICES
    from nopelib.core.params import Choice, Device, Float, Int, OutPath, check_args
    from nopelib.training.gate import training_time_problem

    cluster = backend == "ray" and bool(args.address or os.environ.get(ADDRESS_ENV))
    if cluster:  # a Ray cluster trains on its own devices, not this machine's
        device = Choice(RAY_DEVICES, why="the ray backend's; Ray assigns the GPU itself")
    elif backend == "ray":  # a Ray instance on this machine: its devices, as Ray names them
        device = Device().where(lambda d, _: d in RAY_DEVICES,
                                f"one of {list(RAY_DEVICES)}, the ray backend's")
    else:
        device = Device()
    # exit 2 now, not after hours of training
    check_args(parser, {
        "--out": (out, OutPath()),
        "--device": (args.device, device),
        "--workers": (args.workers, Int(min=1, max=1024, why="training processes (or Ray "
                                        "CPUs) at once, ~0.3 GB of memory apiece")),
        "--gpu-fraction": (args.gpu_fraction, Float(min=0.0, max=1.0, open_min=True,
                                                    why="the share of one GPU a Ray run asks for")),
    })
    if args.batched and backend not in ("local", "batched"):
        parser.error(f"--batched trains in this process: it cannot use --backend {backend}")
    would = guard.summary("grid", {"grid": args.name, "backend": backend})
    if problem := guard.single_problem(out, "grid", would, args.replace):
        parser.error(problem)
    grid = get_grid(args.name)
    if not cluster:  # a cluster's devices and cores are not known here
        slow = training_time_problem(list(grid.profiles), len(grid.tasks) * len(grid.seeds),
                                     args.device, workers=args.workers,
                                     allowed="a GPU (--device cuda), a Ray cluster (--address)")
        if slow is not None:
            parser.error(f"grid {grid.name} --device {args.device}: {slow}")
    print(f"grid {grid.name}: {len(grid.tasks)} tasks x {len(grid.seeds)} seeds x "
          f"{len(grid.profiles)} configurations = {grid.n_runs} runs ({backend})", flush=True)
    start = time.perf_counter()
    rows = run_grid(grid, args.device, backend, args.address, args.batched, args.workers,
                    args.gpu_fraction)
    provenance = results.provenance(
        "python -m nopelib.studies.grid", argv, start, grid=grid.name, backend=backend,
        batched=args.batched, devices=sorted({r["device"] for r in rows}),
        trained=sum(not r["from_cache"] for r in rows))
    with results.locked(out):  # a file written meanwhile is replaced only with --replace
        if not args.replace:
            guard.refuse(guard.appeared_problem(out, would))
        write_summary(out, provenance, rows)
    acc = np.mean([r["accuracy"] for r in rows])
    print(f"wrote {out}: {len(rows)} runs ({provenance['trained']} trained) in "
          f"{provenance['wall_seconds']:.1f} s; "
          f"mean exact match {acc:.3f}")


# the command that produces each grid's summary, from the repository root
GRID_COMMANDS = {
    "paper-base": "python -m nopelib.studies.grid paper-base --device cuda --batched "
                  "--out book/results/grid_paper-base.json",
    "paper": "python -m nopelib.studies.grid paper --address auto "
             "--out book/results/grid_paper.json",
}



def grid_caption(name: str, provenance: Mapping, n_runs: int) -> str:
    """Markdown: a committed grid summary's size and provenance."""
    return (f"Grid `{name}` (committed): {n_runs} runs, trained by "
            f"`{provenance['command']}` at commit `{provenance['commit'][:12]}` on "
            f"{provenance['machine']} (torch {provenance['torch']}, backend "
            f"{provenance['backend']}, {provenance['wall_seconds'] / 60:.1f} min wall, "
            f"{provenance['date']}).")



if __name__ == "__main__":
    main()
