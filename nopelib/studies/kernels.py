"""Does a verdict depend on the CPU's float kernels? The chapters under two kernel sets.

Does a verdict depend on the CPU's float kernels? The trained and probes chapters, run under
two kernel sets on one machine.

Float results depend on which kernels the CPU runs (AVX-512, AVX2 or torch's plain ones), and
a training run amplifies the last bits into other weights. torch, MKL and oneDNN let one
machine choose its kernels, so this check trains the live profile twice, each time in a cache
of its own, and runs both chapters against each:

- ``native``: the machine's own kernels;
- ``avx2``: ``ATEN_CPU_CAPABILITY=avx2`` (``=default`` on a CPU whose best is AVX2) with
  ``MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``.

It passes when every chapter passes under both sets and every verdict is the same under both:
the claims' verdicts (computed from the committed study, so they cannot move), the tagged
chapter outputs and whether each live run learned its task. The live runs' numbers are printed
side by side, with the trained chapter's reproduction check (every layer inside the study's
interval for one more seed). That check is reported, not required to agree: its outcome was
measured to depend on the kernels (``book/results/kernels_study.json``), so the chapter reports
it and asserts only that the live run learned. A difference is printed as such. It trains the
live runs twice, so it runs by hand, not in the default test run; ``--record`` also writes its
outcome as a committed result, which the trained chapter shows:

    python -m nopelib.studies.kernels --out /tmp/kernels --chapters trained probes \
        --record book/results/kernels_study.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from nopelib.core.params import Choice, ListOf, OutPath, check_args
from nopelib.rules.claims import LEARNED_AT
from nopelib.store import cache
from nopelib.results import files as results, guard
from nopelib.results.trained_files import live_seconds, load_study
from nopelib.results.trained_tables import reproduction
from nopelib.training.gate import training_time_problem
from nopelib.training.launch import train_many
from nopelib.training.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ("trained", "probes")
SETS = ("native", "avx2")  # the kernel sets (kernel_sets)
TAG = "kernelcheck"  # chapter cells whose text output is compared between kernel sets
# the trained chapter's live runs (its default live_tasks x live_seeds), trained once per set
LIVE_PROFILE, LIVE_TASKS, LIVE_SEEDS = "study", ("reversal",), (0,)


def kernel_sets(capability: str | None = None) -> dict[str, dict[str, str]]:
    """The two kernel sets' environment variables: native, and the next set down (AVX2 on a
    CPU above it, torch's plain kernels on an AVX2 one)."""
    capability = capability or torch.backends.cpu.get_cpu_capability()
    lower = "default" if capability in ("AVX2", "DEFAULT", "NO AVX") else "avx2"
    return {"native": {},
            "avx2": {"ATEN_CPU_CAPABILITY": lower, "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                     "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def summarize(profile: str = LIVE_PROFILE, tasks: tuple[str, ...] = LIVE_TASKS,
              seeds: tuple[int, ...] = LIVE_SEEDS) -> dict:
    """What the trained chapter's live reproduction computes, under this process's kernels:
    per live run its exact match, budget, whether it is learned, whether it is inside the
    committed study's spread (``trained_tables.reproduction``) and the layers outside it."""
    runs = train_many([(t, s) for t in tasks for s in seeds], PROFILES[profile])
    docs, _ = load_study(profile, tasks)
    out = {}
    for (task, seed), run in runs.items():
        check = reproduction(run.metrics, docs[task]["runs"]) if task in docs else None
        out[f"{task} seed {seed}"] = {
            "task": task, "seed": seed, "accuracy": run.metrics["accuracy"],
            "n_test": run.profile.n_test, "steps": run.metrics["steps"],
            "train_seconds": run.metrics["train_seconds"],
            "learned": run.metrics["accuracy"] >= LEARNED_AT,
            "inside": None if check is None else bool(check.inside.all()),
            "outside": [] if check is None else check.quantity[~check.inside].tolist(),
            "scores_after": run.metrics["curve"]["scores"][-1]}
    return {"capability": torch.backends.cpu.get_cpu_capability(), "runs": out}


def record(results_by_set: dict[str, dict], argv: list[str] | None, start: float,
           profile: str = LIVE_PROFILE) -> dict:
    """The committed form of a kernel check (``results`` kind ``kernels``): its provenance,
    with each set's environment and chapter outcomes, and one row per live run and set."""
    runs = [{"set": name, "capability": res["summary"]["capability"], **run}
            for name, res in results_by_set.items()
            for run in res["summary"]["runs"].values() if run["inside"] is not None]
    chapters = {name: {ch: {"passed": c["passed"], "seconds": c["seconds"]}
                       for ch, c in res["chapters"].items()}
                for name, res in results_by_set.items()}
    return {"provenance": results.provenance(
                "python -m nopelib.studies.kernels", argv, start, profile=profile,
                sets={name: res["env"] for name, res in results_by_set.items()},
                chapters=chapters),
            "runs": runs}


def tagged_outputs(notebook: Path) -> list[str]:
    """The text output of every cell tagged TAG in an executed notebook."""
    cells = json.loads(notebook.read_text())["cells"]
    texts = []
    for cell in cells:
        if TAG in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                text = out.get("data", {}).get("text/plain") or out.get("text") or ""
                texts.append("".join(text))
    return texts


def run_set(name: str, env_vars: dict[str, str], out: Path, chapters: list[str]) -> dict:
    """Run the chapters and the summary under one kernel set, in its own cache."""
    where = out / name
    where.mkdir(parents=True, exist_ok=True)  # papermill writes its output notebook first
    env = {**os.environ, **env_vars, cache.CACHE_ENV: str(where / "cache")}
    env.pop("NOPELIB_MEMO", None)
    result = {"env": env_vars, "chapters": {}}
    for chapter in chapters:
        t0 = time.perf_counter()
        executed = where / f"{chapter}.ipynb"
        proc = subprocess.run(
            [sys.executable, "-m", "papermill", str(ROOT / "book" / f"{chapter}.ipynb"),
             str(executed), "--cwd", str(ROOT / "book"), "--no-progress-bar"],
            env=env, capture_output=True, text=True)
        result["chapters"][chapter] = {
            "passed": proc.returncode == 0, "seconds": round(time.perf_counter() - t0, 1),
            "error": proc.stderr[-3000:] if proc.returncode else "",
            "tagged": tagged_outputs(executed) if executed.is_file() else []}
        print(f"[{name}] {chapter}: {'passed' if proc.returncode == 0 else 'FAILED'} "
              f"in {result['chapters'][chapter]['seconds']:.0f} s", flush=True)
    proc = subprocess.run([sys.executable, "-m", "nopelib.studies.kernels", "--summarize"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"[{name}] summary failed:\n{proc.stderr[-3000:]}")
    result["summary"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def compare(by_set: dict[str, dict]) -> tuple[bool, str]:
    """Side-by-side report of the kernel sets, and whether the check passes: every chapter
    passed under every set, and the verdicts (whether each live run learned, and the tagged
    chapter outputs) agree. The reproduction check is reported beside them, and a difference
    in it is named, but it is not a verdict (see the module's docstring)."""
    names = list(by_set)
    lines = ["kernel sets: " + ", ".join(
        f"{n} ({by_set[n]['summary']['capability']}, env {by_set[n]['env'] or 'none'})"
        for n in names), "", "live run | " + " | ".join(names)]
    ok = True
    for run in by_set[names[0]]["summary"]["runs"]:
        cells = [by_set[n]["summary"]["runs"].get(run) for n in names]
        lines.append(f"{run} | " + " | ".join(
            f"{c['accuracy']:.4f} in {c['steps']:,} steps, learned {c['learned']}, "
            f"inside the study's spread {c['inside']}"
            + (f" (outside: {', '.join(c.get('outside', []))})" if c.get("outside") else "")
            if c else "absent" for c in cells))
        ok &= len({c["learned"] if c else None for c in cells}) == 1
        if len({c["inside"] if c else None for c in cells}) > 1:
            lines.append(f"  {run}: the reproduction check (reported, not a verdict) differs "
                         "between kernel sets")
    for chapter in by_set[names[0]]["chapters"]:
        status = [by_set[n]["chapters"][chapter] for n in names]
        lines.append(f"\nchapter {chapter}: " + " | ".join(
            f"{n}: {'passed' if s['passed'] else 'FAILED'} ({s['seconds']:.0f} s)"
            for n, s in zip(names, status)))
        ok &= all(s["passed"] for s in status)
        if len({tuple(s["tagged"]) for s in status}) > 1:
            ok = False
            lines.append(f"  the {TAG} outputs of {chapter} differ between kernel sets:")
        for n, s in zip(names, status):
            lines += [f"  [{n}] {text}" for text in s["tagged"]]
            if s["error"]:
                lines.append(f"  [{n}] error: {s['error']}")
    lines.append("\nkernel check: " + ("PASSED: every chapter passed and every verdict agrees"
                                        if ok else "FAILED"))
    return ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for each set's cache and notebooks")
    parser.add_argument("--chapters", nargs="*", default=list(CHAPTERS), choices=CHAPTERS)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--record", type=Path, default=None,
                        help="also write the outcome as a committed result "
                             "(book/results/kernels_<profile>.json)")
    parser.add_argument("--replace", action="store_true",
                        help="replace the file at --record (default: an existing file is "
                             "refused)")
    parser.add_argument("--summarize", action="store_true",
                        help="print this process's summary as JSON (used by each set)")
    args = parser.parse_args(argv)
    if args.summarize:
        print(json.dumps(summarize()))
        return 0
    if args.out is None:
        parser.error("--out is required")
    checks = {"--out": (args.out, OutPath(folder=True)),  # before hours of training
              "--chapters": (args.chapters, ListOf(Choice(CHAPTERS), unique=True, min_len=0)),
              "--sets": (args.sets, ListOf(Choice(SETS), unique=True))}
    if args.record is not None:
        checks["--record"] = (args.record, OutPath())
    check_args(parser, checks)
    if args.record is not None and not (args.record.name.startswith("kernels_")
                                        and args.record.suffix == ".json"):
        parser.error(f"--record={str(args.record)!r}: the name must be kernels_*.json")
    would = guard.summary("kernels", {"profile": LIVE_PROFILE, "set": args.sets})
    if args.record is not None and (problem := guard.single_problem(
            args.record, "kernels", would, args.replace, "--record")):
        parser.error(problem)
    # the sets train one after another, each the live runs once
    slow = training_time_problem(
        PROFILES[LIVE_PROFILE], len(args.sets) * len(LIVE_TASKS) * len(LIVE_SEEDS), workers=1,
        run_seconds=live_seconds(LIVE_PROFILE, LIVE_TASKS),
        basis="if each run takes as long as the longest committed training run of its task",
        allowed="fewer --sets")
    if slow is not None:
        parser.error(f"--sets {' '.join(args.sets)}: {slow}")
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    sets = kernel_sets()
    by_set = {name: run_set(name, sets[name], args.out, args.chapters) for name in args.sets}
    ok, report = compare(by_set)
    cache.commit_file(args.out / "kernels.json", json.dumps(by_set, indent=1).encode())
    if args.record is not None:
        results.write(args.record, record(by_set, argv, start), "kernels", merge=None
                      if args.replace else guard.unwritten(args.record, would, "--record"))
    print(report)
    return 0 if ok else 1


def kernel_check(doc: Mapping) -> tuple[str, pd.DataFrame]:
    """A committed kernel check (``nopelib.studies.kernels --record``): a Markdown caption (where it
    ran, its kernel sets, and whether the live runs' verdict and their reproduction check agree
    across the sets) and one row per live run and kernel set."""
    p = doc["provenance"]
    table = pd.DataFrame([dict(set=r["set"], kernels=r["capability"], task=r["task"],
                               seed=r["seed"], accuracy=r["accuracy"], steps=r["steps"],
                               train_s=r["train_seconds"], learned=r["learned"],
                               inside=r["inside"],
                               outside=", ".join(r["outside"]) or "none",
                               scores_after=" ".join(f"{x:.3f}" for x in r["scores_after"]))
                          for r in doc["runs"]])
    by_run = table.groupby(["task", "seed"])
    learned_same = bool((by_run.learned.nunique() == 1).all())
    inside_same = bool((by_run.inside.nunique() == 1).all())
    same, differs = "the same under every set", "**differs between the sets**"
    sets = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in env.items()) or 'native'}"
                     for name, env in p["sets"].items())
    caption = (f"Kernel check (committed): `{p['command']}` at commit `{p['commit'][:12]}` "
               f"on {p['machine']} ({p['date']}); kernel sets {sets}. Whether each live run "
               f"learned: {same if learned_same else differs}; whether it lies inside the "
               f"study's interval: {same if inside_same else differs}.")
    return caption, table



if __name__ == "__main__":
    sys.exit(main())
