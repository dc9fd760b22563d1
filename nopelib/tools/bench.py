"""Benchmark: where the time goes, and how much each fast path buys over its reference.

``python -m nopelib.tools.bench`` (full sizes, every chapter) or ``--small`` (tiny sizes, no
chapters: a check that it works, well under a minute on 2 cores). Every fast figure is measured in
the same run as its reference and reported as a ratio against it, because absolute times on a shared
machine drift; the load average before and after is recorded too. Each section times the library's
own code paths:

- ``train``: ``train.train_step`` on one batch per task, explicit attention (reference) against
  fused SDPA, fused AdamW, ``torch.compile`` and, on CUDA, bf16 autocast.
- ``extraction``: sequences/s of ``GPT.hidden_states`` against a no-grad forward.
- ``adjacency``: ``metrics.adjacency_score`` on every layer of one long sequence, T = 32 ...
  4096, against the plain-loop definition the tests use (``adjacency_score_reference``).
- ``parallel``: cpu-profile runs one after another against one process per core
  (``launch.train_many``'s scheme), process start included.
- ``evaluation``: ``exact_match.greedy_accuracy`` against ``exact_match.evaluate`` (teacher
  forcing); their accuracies must agree.
- ``probe``: ``features.model_states`` and one ``probe.fit_probe`` per feature set.
- ``chapters``: each chapter of ``_toc.yml`` run with nbclient: results cache off
  (``NOPELIB_MEMO=0``), then on twice; the second is a rerun that reads ``nopelib.store.memo``.

Timings are medians over repeats after a warm-up; the spread is the min and max of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numba
import numpy as np
import torch

from nopelib.core.devices import resolve_device
from nopelib.core.features import (FEATURE_SETS, features, model_states, random_token_sequences,
                                   window_positions)
from nopelib.core.metrics import adjacency_score, adjacency_score_reference
from nopelib.core.model import GPTConfig
from nopelib.core.params import OutPath, check_args
from nopelib.core.probe import ProbeConfig, RidgeConfig, fit_probe
from nopelib.core.tasks import CHARS, TASKS, encode_batch, encode_inputs, make_split
from nopelib.core.one_model import long_sequence, random_model, similarity_matrices
from nopelib.tools.bench_chapters import bench_chapters
from nopelib.tools.bench_report import format_table, write_json
from nopelib.tools.timing import sample_summary, speed_ratio, sync_device, time_call
from nopelib.training.exact_match import evaluate, greedy_accuracy
from nopelib.training.launch import train_many
from nopelib.training.profiles import PROFILES
from nopelib.training.train import adamw, train, train_step

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the full and the small run."""

    models: tuple[tuple[str, GPTConfig], ...]  # (name, config) of the trained models
    batch_size: int  # training sequences per step (and per task batch)
    train_repeats: int  # timed passes over the task batches (one step per task each)
    compile: bool  # also time torch.compile (tens of seconds of compilation on a CPU)
    extract_n: int  # sequences per task for the extraction throughput
    extract_repeats: int
    adjacency_T: tuple[int, ...]  # sequence lengths of the adjacency timings
    adjacency_repeats: int
    reference_max_T: int  # plain-loop reference up to this T (O(T^3) Python)
    probe_n: int  # sequences for the probe
    probe_T: int  # their length
    probe_w: int  # feature window
    probe_max_steps: int
    eval_n: int  # test pairs per task for the evaluation timings
    parallel_steps: int  # optimizer steps per run in the parallel-training comparison
    chapters: bool


FULL = Sizes(
    models=(("base", GPTConfig()), ("cpu", PROFILES["cpu"].model)),
    batch_size=64, train_repeats=3, compile=True,
    extract_n=256, extract_repeats=5,
    adjacency_T=(32, 64, 128, 256, 512, 1024, 2048, 4096), adjacency_repeats=3,
    reference_max_T=64,
    probe_n=512, probe_T=64, probe_w=8, probe_max_steps=300,
    eval_n=1000, parallel_steps=300,
    chapters=True,
)
SMALL = Sizes(
    models=(("tiny", GPTConfig(n_layer=2, n_head=2, n_embd=32)),),
    batch_size=8, train_repeats=2, compile=False,
    extract_n=16, extract_repeats=2,
    adjacency_T=(32, 64, 128, 256), adjacency_repeats=2,
    reference_max_T=64,
    probe_n=40, probe_T=16, probe_w=4, probe_max_steps=20,
    eval_n=24, parallel_steps=4,
    chapters=False,
)


def task_batches(batch_size: int, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One training batch per task, (idx, targets) [B, T_task], cut to the longest row as in
    training (``encode_batch`` pads to the batch's longest sequence)."""
    return {name: encode_batch(make_split(name, seed, n_train=batch_size, n_test=0).train)
            for name in TASKS}


VARIANT_FIELDS = ("name", "attn_impl", "compile", "fused_adamw", "bf16_autocast")
VARIANTS = (  # the reference first
    ("eager explicit (ref)", "explicit", False, False, False),
    ("fused SDPA", "fused", False, False, False),
    ("fused SDPA + AdamW fused", "fused", False, True, False),
    ("fused SDPA + compile", "fused", True, False, False),
    ("fused + AdamW fused + bf16", "fused", False, True, True),
    ("fused + compile + AdamW fused + bf16", "fused", True, True, True),
)


def train_variants(device: torch.device, compile: bool) -> list[dict]:
    """The training-step variants that exist on ``device`` (bf16 on CUDA only), as dicts."""
    return [dict(zip(VARIANT_FIELDS, v)) for v in VARIANTS
            if (compile or not v[2]) and (device.type == "cuda" or not v[4])]


def bench_train(config: GPTConfig, sizes: Sizes, device: torch.device) -> dict:
    """Step time and tokens/s of every variant on the same task batches and initial weights.

    The variants are timed interleaved (one pass of each per repeat) so that load changes on a
    shared machine hit them alike; compilation is timed on its own in the first pass."""
    named = task_batches(sizes.batch_size)
    batches = [(i.to(device), t.to(device)) for i, t in named.values()]
    tokens_per_pass = sum(i.numel() for i, _ in batches)
    runs = []
    for v in train_variants(device, sizes.compile):
        model = random_model(config, seed=0, device=device).train()  # the same weights for all
        runs.append(dict(variant=v, model=torch.compile(model) if v["compile"] else model,
                         opt=adamw(model.parameters(), PROFILES["paper"], fused=v["fused_adamw"]),
                         samples=[], status="ok"))

    def one_pass(r: dict) -> None:
        v = r["variant"]
        for idx, targets in batches:
            bf16 = torch.autocast(device.type, dtype=torch.bfloat16) if v["bf16_autocast"] else None
            train_step(r["model"], r["opt"], idx, targets, 1.0, bf16, v["attn_impl"])
        sync_device(device)

    for r in runs:  # warm-up: the first pass holds compilation (one graph per distinct T)
        start = time.perf_counter()
        try:  # a recompile for dynamic shapes lands in a second pass
            for _ in range(2 if r["variant"]["compile"] else 1):
                one_pass(r)
        except Exception as exc:  # torch.compile may lack a working C++ toolchain
            r["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        r["warmup_s"] = time.perf_counter() - start
    for _ in range(sizes.train_repeats):
        for r in (r for r in runs if r["status"] == "ok"):
            start = time.perf_counter()
            one_pass(r)
            r["samples"].append(time.perf_counter() - start)

    rows, n = [], len(batches)
    ref_step = statistics.median(runs[0]["samples"]) / n
    for r in runs:
        row = {**r["variant"], "status": r["status"]}
        if r["status"] == "ok":
            s = sample_summary([x / n for x in r["samples"]])
            step = s["median_s"]
            row.update(step_ms=1000 * step, step_ms_min=1000 * s["min_s"],
                       step_ms_max=1000 * s["max_s"], repeats=s["repeats"],
                       tokens_per_s=tokens_per_pass / (step * n), speedup=speed_ratio(ref_step, step))
            if r["variant"]["compile"]:  # the warm-up less its two passes at the steady step time
                row["compile_s"] = max(r["warmup_s"] - 2 * step * n, 0.0)
        rows.append(row)
    seq_len = {k: i.shape[1] for k, (i, _) in named.items()}
    return {"config": config.to_dict(), "num_params": runs[0]["model"].num_params(),
            "batch_size": sizes.batch_size, "seq_len": seq_len, "steps_per_pass": n, "rows": rows}


def bench_extraction(config: GPTConfig, sizes: Sizes, device: torch.device) -> dict:
    """Sequences/s of hidden_states (explicit attention, the analysis path) against a no-grad
    forward with fused and with explicit attention, on task inputs of every task."""
    model = random_model(config, seed=0, device=device)
    splits = [make_split(name, 1, n_train=sizes.extract_n, n_test=0) for name in TASKS]
    inputs = [encode_inputs([x for x, _ in split.train])[0].to(device) for split in splits]
    n_seq = sum(len(i) for i in inputs)

    def calls(fn: Callable[[torch.Tensor], object]) -> Callable[[], None]:
        return torch.no_grad()(lambda: [fn(idx) for idx in inputs])

    cases = {
        "hidden_states (explicit, ref)": calls(model.hidden_states),
        "forward explicit": calls(lambda i: model(i, attn_impl="explicit")),
        "forward fused": calls(lambda i: model(i, attn_impl="fused")),
    }
    times = {name: time_call(fn, sizes.extract_repeats, device) for name, fn in cases.items()}
    ref_s = times["hidden_states (explicit, ref)"]["median_s"]
    rows = [{"name": name, "seq_per_s": n_seq / t["median_s"], **t,
             "speedup": speed_ratio(ref_s, t["median_s"])} for name, t in times.items()]
    return {"config": config.to_dict(), "n_sequences": n_seq, "rows": rows}


def bench_adjacency(config: GPTConfig, sizes: Sizes) -> dict:
    """Seconds of adjacency_score on all n_layer + 1 matrices, per T; prefixes of one long
    sequence give every T (causal attention: a prefix's states do not depend on what follows)."""
    T_max = max(sizes.adjacency_T)
    model = random_model(config, seed=0, block_size=max(T_max, config.block_size))
    C_max = similarity_matrices(model, long_sequence(T_max))  # [L+1, T_max, T_max] float32
    adjacency_score(np.eye(8, dtype=np.float32) + 0.1)  # compile (or load) the numba kernel
    rows = []
    for T in sizes.adjacency_T:
        C = np.ascontiguousarray(C_max[:, :T, :T])  # [L+1, T, T]
        fast = time_call(lambda: adjacency_score(C), sizes.adjacency_repeats, torch.device("cpu"))
        scores = adjacency_score(C)
        row = {"T": T, "n_matrices": len(C), "numba_s": fast["median_s"],
               "numba_min_s": fast["min_s"], "numba_max_s": fast["max_s"],
               "mean_score": float(scores.mean())}
        if T <= sizes.reference_max_T:
            start = time.perf_counter()
            ref_scores = adjacency_score_reference(C)
            row["reference_s"] = time.perf_counter() - start
            row["speedup_vs_reference"] = speed_ratio(row["reference_s"], fast["median_s"])
            row["max_abs_diff_vs_reference"] = float(np.abs(ref_scores - scores).max())
        rows.append(row)
    return {"config": config.to_dict(), "numba_threads": numba.get_num_threads(), "rows": rows}


def bench_probe(config: GPTConfig, sizes: Sizes) -> dict:
    """Hidden-state extraction for the probe, and one fit per feature set at layer 1 with
    each probe: the chapter's closed-form ridge probe and the paper's MLP."""
    model = random_model(config, seed=0)
    idx = random_token_sequences(sizes.probe_n, sizes.probe_T, CHARS, seed=0)
    start = time.perf_counter()
    states = model_states(model, idx)  # [L+1, N, T, d]
    rows = [{"name": "model_states", "seconds": time.perf_counter() - start}]
    positions = window_positions(sizes.probe_T, sizes.probe_w)
    probes = {"ridge": RidgeConfig(), "mlp": ProbeConfig(max_steps=sizes.probe_max_steps)}
    for kind in FEATURE_SETS:
        feats = features(states[1], kind, sizes.probe_w)  # [N, S, F]
        for name, probe_config in probes.items():
            start = time.perf_counter()
            result = fit_probe(feats, positions, seed=0, config=probe_config)
            rows.append({"name": f"fit {kind} ({name})",
                         "seconds": time.perf_counter() - start,
                         "selected": result.selected, "nrmse": result.nrmse})
    return {"config": config.to_dict(), "n_sequences": sizes.probe_n, "T": sizes.probe_T,
            "w": sizes.probe_w,  # the probes' settings as JSON has them (tuples as lists)
            "probes": {k: json.loads(json.dumps(asdict(v))) for k, v in probes.items()},
            "rows": rows}


def bench_parallel(sizes: Sizes) -> dict:
    """Wall time of one cpu-profile run per core: one after another in this process on all
    cores (the reference), then ``train_many``'s one single-threaded process per run (process
    start, evaluation and the cache commit included)."""
    n = os.cpu_count() or 1
    if n < 2:
        return {"skipped": True, "reason": "one core: nothing to run in parallel", "rows": []}
    prof = replace(PROFILES["cpu"], steps=sizes.parallel_steps, task_budgets=(), curve_every=0,
                   warmup_steps=min(10, sizes.parallel_steps), n_train=4000, n_test=100,
                   n_eval=100, n_curve=100)
    runs = [("reversal", seed) for seed in range(n)]
    start, sequential = time.perf_counter(), []
    for task, seed in runs:
        sequential.append(-time.perf_counter())
        train(task, seed, prof, torch.device("cpu"), progress=False)
        sequential[-1] += time.perf_counter()
    sequential_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        trained = train_many(runs, prof, "cpu", cache_dir=cache, workers=n)
        parallel_s = time.perf_counter() - start
    rows = [{"name": f"sequential, {n} threads (ref)", "wall_s": sequential_s,
             "run_s": sequential, "speedup": 1.0},
            {"name": f"{n} processes x 1 thread", "wall_s": parallel_s,
             "run_s": [trained[r].metrics["train_seconds"] for r in runs],
             "speedup": speed_ratio(sequential_s, parallel_s)}]
    return {"runs": [list(r) for r in runs], "steps": prof.steps, "batch_size": prof.batch_size,
            "rows": rows}


def bench_evaluation(sizes: Sizes, device: torch.device) -> dict:
    """Seconds to score ``eval_n`` test pairs per task with the cpu profile's model, greedy
    decoding token by token (reference) against teacher forcing (``evaluate``), as a training
    run does after its last step. The model is freshly initialised: it never emits the end
    token early, so greedy decoding runs every answer to full length, as it does on a model
    that has not finished learning."""
    prof = PROFILES["cpu"]
    model = random_model(prof.model, seed=0, device=device)
    rows = []
    for task in TASKS:
        pairs = make_split(task, 0, n_train=0, n_test=sizes.eval_n).test
        acc = {"greedy": greedy_accuracy(model, pairs, prof.eval_batch_size),
               "teacher-forced": evaluate(model, pairs, prof.eval_batch_size)}
        ref = time_call(lambda: greedy_accuracy(model, pairs, prof.eval_batch_size), 1, device)
        fast = time_call(lambda: evaluate(model, pairs, prof.eval_batch_size), 3, device)
        rows.append({"task": task, "greedy_s": ref["median_s"],
                     "teacher_forced_s": fast["median_s"],
                     "speedup": speed_ratio(ref["median_s"], fast["median_s"]),
                     "accuracy_greedy": acc["greedy"],
                     "accuracy_teacher_forced": acc["teacher-forced"]})
    return {"config": prof.model.to_dict(), "n_pairs": sizes.eval_n, "rows": rows}


def _loadavg() -> list[float]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else []


def _guarded(name: str, fn: Callable[[], dict]) -> dict:
    """A section's result with its wall time, or its error: one failing section must not lose
    the others."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception:
        out = {"error": traceback.format_exc(limit=3)}
    out["section_s"] = time.perf_counter() - start
    print(f"[bench] {name}: {out['section_s']:.1f} s", file=sys.stderr, flush=True)
    return out


def run(small: bool = False, device: str = "auto", chapters: bool | None = None) -> dict:
    """Every section of the benchmark; ``chapters`` defaults to on in the full run only."""
    dev = resolve_device(device)
    sizes = SMALL if small else FULL
    do_chapters = sizes.chapters if chapters is None else chapters
    start = time.perf_counter()
    result: dict = {"meta": {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "small": small,
        "device": str(dev), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "loadavg_start": _loadavg(),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
    }}
    base = sizes.models[0][1]
    skipped = {"skipped": True, "rows": [], "section_s": 0.0}
    result["train"] = {name: _guarded(f"train {name}", lambda c=cfg: bench_train(c, sizes, dev))
                       for name, cfg in sizes.models}
    result["extraction"] = _guarded("extraction", lambda: bench_extraction(base, sizes, dev))
    result["adjacency"] = _guarded("adjacency", lambda: bench_adjacency(base, sizes))
    on_cpu = dev.type == "cpu"
    result["parallel"] = _guarded("parallel", lambda: bench_parallel(sizes)) if on_cpu else skipped
    result["evaluation"] = _guarded("evaluation", lambda: bench_evaluation(sizes, dev))
    result["probe"] = _guarded("probe", lambda: bench_probe(base, sizes))
    result["chapters"] = _guarded("chapters", bench_chapters) if do_chapters else skipped
    result["meta"]["loadavg_end"] = _loadavg()
    result["meta"]["total_s"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nopelib.tools.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true",
                        help="tiny sizes, no chapters: checks that it works")
    parser.add_argument("--json", default="bench.json",
                        help="where to write the JSON (default: bench.json)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--no-chapters", action="store_true", help="skip executing the chapters")
    args = parser.parse_args(argv)
    check_args(parser, {"--json": (args.json, OutPath())})  # exit 2 now, not after the run
    result = run(small=args.small, device=args.device, chapters=False if args.no_chapters else None)
    print(format_table(result))
    write_json(result, args.json)
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
