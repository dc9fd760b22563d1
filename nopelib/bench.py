"""Benchmark: where the time goes, and how much each fast path buys over its reference.

Run ``python -m nopelib.bench`` (full sizes, every chapter) or ``--small`` (tiny sizes, no
chapters: a check that the benchmark works, in well under a minute on 2 cores). Every fast
figure is measured in the same run as its reference and reported as a ratio against it, because
absolute times on a shared machine drift; the load average before and after is recorded too.

Sections of the JSON (and of the printed table):

- ``train``: one optimizer step (forward, loss on the answer tokens, backward, gradient
  clipping, AdamW) on real task batches, one batch per task cut to its longest row as
  ``nopelib.train`` does. Reference: explicit attention, eager. Fast paths: fused SDPA attention,
  alone, with fused AdamW, and with ``torch.compile``; on CUDA also fused AdamW with bf16
  autocast.
- ``extraction``: sequences/s of ``GPT.hidden_states`` (the analysis path, explicit attention)
  against a no-grad forward with fused and with explicit attention.
- ``adjacency``: ``metrics.adjacency_score`` on all n_layer + 1 similarity matrices of one
  sequence, for T = 32 ... 4096; against the plain-loop definition for small T and a vectorised
  O(T^3) pairwise comparison for mid T, which must agree exactly.
- ``parallel``: the quick profile's CPU training workload, one run per core (reversal, the
  longest task), trained one after another in this process on all cores (the reference)
  against one single-threaded process per run, as ``nopelib.train.train_many`` does; wall time
  includes starting the processes.
- ``evaluation``: exact-match accuracy of the quick model on test pairs of every task, by
  token-by-token greedy decoding (``nopelib.train.greedy_accuracy``, the reference) against one
  teacher-forced pass per batch (``nopelib.train.evaluate``); the two accuracies must agree.
- ``probe``: hidden-state extraction and one probe fit per feature set (``nopelib.probe``).
- ``chapters``: wall time of executing each chapter of ``_toc.yml`` with its defaults, first
  with the results cache off (``NOPELIB_MEMO=0``: every study computed), then twice with it on;
  the second of those is a rerun that reads the studies from ``nopelib.memo``.

Timings are medians over repeats after a warm-up; the spread is the min and max of the repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numba
import numpy as np
import torch

from nopelib.metrics import adjacency_score, adjacency_score_reference, cosine_similarity_matrix
from nopelib.model import GPT, GPTConfig
from nopelib.memo import MEMO_ENV
from nopelib.tasks import CHARS, TASKS, encode_batch, encode_inputs, make_split
from nopelib.train import PROFILES, TrainProfile, adamw, evaluate, greedy_accuracy, resolve_device, train

ROOT = Path(__file__).resolve().parents[1]


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
    vectorised_max_T: int  # vectorised pairwise reference up to this T (O(T^3) memory traffic)
    probe_n: int  # sequences for the probe
    probe_T: int  # their length
    probe_w: int  # feature window
    probe_max_steps: int
    eval_n: int  # test pairs per task for the evaluation timings
    parallel_steps: int  # optimizer steps per run in the parallel-training comparison
    chapters: bool


FULL = Sizes(
    models=(("base", GPTConfig()), ("quick", PROFILES["quick"].model)),
    batch_size=64, train_repeats=3, compile=True,
    extract_n=256, extract_repeats=5,
    adjacency_T=(32, 64, 128, 256, 512, 1024, 2048, 4096), adjacency_repeats=3,
    reference_max_T=64, vectorised_max_T=256,
    probe_n=512, probe_T=64, probe_w=8, probe_max_steps=300,
    eval_n=1000, parallel_steps=300,
    chapters=True,
)
SMALL = Sizes(
    models=(("tiny", GPTConfig(n_layer=2, n_head=2, n_embd=32)),),
    batch_size=8, train_repeats=2, compile=False,
    extract_n=16, extract_repeats=2,
    adjacency_T=(32, 64, 128, 256), adjacency_repeats=2,
    reference_max_T=32, vectorised_max_T=64,
    probe_n=40, probe_T=16, probe_w=4, probe_max_steps=20,
    eval_n=24, parallel_steps=4,
    chapters=False,
)


# ---------------------------------------------------------------------------------------------
# timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(samples: list[float]) -> dict:
    """Median and range of per-call seconds."""
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "repeats": len(samples)}


def time_call(fn: Callable[[], object], repeats: int, device: torch.device, min_sample_s: float = 0.02) -> dict:
    """Median seconds per call of ``fn`` after one untimed warm-up call.

    Calls faster than ``min_sample_s`` are looped inside each sample (as ``timeit`` does), so
    microsecond calls are not dominated by the timer's resolution."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    inner = max(1, min(1000, int(min_sample_s / max(time.perf_counter() - start, 1e-9))))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - start) / inner)
    return _summary(samples)


def _ratio(reference_s: float, fast_s: float) -> float:
    """Speed-up of ``fast`` over ``reference``: > 1 means faster."""
    return reference_s / fast_s


# ---------------------------------------------------------------------------------------------
# training step


def task_batches(batch_size: int, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One training batch per task, (idx, targets) [B, T_task], cut to the longest row as in
    training (``encode_batch`` pads to the batch's longest sequence)."""
    return {name: encode_batch(make_split(name, seed, n_train=batch_size, n_test=0).train) for name in TASKS}


@dataclass(frozen=True)
class TrainVariant:
    name: str
    attn_impl: str
    compile: bool
    fused_adamw: bool
    bf16_autocast: bool


def train_variants(device: torch.device, compile: bool) -> list[TrainVariant]:
    """The reference first, then the fast paths that exist on ``device``."""
    out = [TrainVariant("eager explicit (ref)", "explicit", False, False, False),
           TrainVariant("fused SDPA", "fused", False, False, False),
           TrainVariant("fused SDPA + AdamW fused", "fused", False, True, False)]
    if compile:
        out.append(TrainVariant("fused SDPA + compile", "fused", True, False, False))
    if device.type == "cuda":
        out.append(TrainVariant("fused + AdamW fused + bf16", "fused", False, True, True))
        if compile:
            out.append(TrainVariant("fused + compile + AdamW fused + bf16", "fused", True, True, True))
    return out


def bench_train(config: GPTConfig, sizes: Sizes, device: torch.device) -> dict:
    """Step time and tokens/s of every variant on the same task batches and initial weights.

    The variants are timed interleaved (one pass of each per repeat) so that load changes on a
    shared machine hit them alike; compilation is timed on its own in the first pass."""
    batches = {k: (i.to(device), t.to(device)) for k, (i, t) in task_batches(sizes.batch_size).items()}
    tokens_per_pass = sum(i.numel() for i, _ in batches.values())
    torch.manual_seed(0)
    init = GPT(config).state_dict()
    runs = []
    for v in train_variants(device, sizes.compile):
        model = GPT(config).to(device).train()
        model.load_state_dict(init)
        fwd = torch.compile(model) if v.compile else model
        opt = adamw(model, PROFILES["paper"], fused=v.fused_adamw)  # as training builds it, paper settings
        runs.append(dict(variant=v, model=model, fwd=fwd, opt=opt, samples=[], status="ok"))

    def one_pass(r: dict) -> None:
        v = r["variant"]
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if v.bf16_autocast else nullcontext()
        for idx, targets in batches.values():
            with autocast:
                _, loss = r["fwd"](idx, targets, attn_impl=v.attn_impl)
            r["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(r["model"].parameters(), 1.0)
            r["opt"].step()
        _sync(device)

    for r in runs:  # warm-up: the first pass holds compilation (one graph per distinct T)
        start = time.perf_counter()
        try:
            for _ in range(2 if r["variant"].compile else 1):  # a recompile for dynamic shapes
                one_pass(r)  # lands in the second pass
        except Exception as exc:  # torch.compile may lack a working C++ toolchain
            r["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        r["warmup_s"] = time.perf_counter() - start
    for _ in range(sizes.train_repeats):
        for r in runs:
            if r["status"] == "ok":
                start = time.perf_counter()
                one_pass(r)
                r["samples"].append(time.perf_counter() - start)

    rows = []
    ref = runs[0]
    ref_step = statistics.median(ref["samples"]) / len(batches)
    for r in runs:
        row = {**asdict(r["variant"]), "status": r["status"]}
        if r["status"] == "ok":
            s = _summary([x / len(batches) for x in r["samples"]])
            step = s["median_s"]
            row.update(step_ms=1000 * step, step_ms_min=1000 * s["min_s"], step_ms_max=1000 * s["max_s"],
                       repeats=s["repeats"], tokens_per_s=tokens_per_pass / (step * len(batches)),
                       speedup=_ratio(ref_step, step))
            if r["variant"].compile:  # the warm-up less its two passes at the steady step time
                row["compile_s"] = max(r["warmup_s"] - 2 * step * len(batches), 0.0)
        rows.append(row)
    return {"config": config.to_dict(), "num_params": runs[0]["model"].num_params(),
            "batch_size": sizes.batch_size, "seq_len": {k: i.shape[1] for k, (i, _) in batches.items()},
            "steps_per_pass": len(batches), "rows": rows}


# ---------------------------------------------------------------------------------------------
# hidden-state extraction


def bench_extraction(config: GPTConfig, sizes: Sizes, device: torch.device) -> dict:
    """Sequences/s of hidden_states (explicit attention, the analysis path) against a no-grad
    forward with fused and with explicit attention, on task inputs of every task."""
    torch.manual_seed(0)
    model = GPT(config).to(device).eval()
    inputs = [encode_inputs([x for x, _ in make_split(name, 1, n_train=sizes.extract_n, n_test=0).train])[0].to(device)
              for name in TASKS]
    n_seq = sum(len(i) for i in inputs)

    def calls(fn: Callable[[torch.Tensor], object]) -> Callable[[], None]:
        @torch.no_grad()
        def run() -> None:
            for idx in inputs:
                fn(idx)
        return run

    cases = {
        "hidden_states (explicit, ref)": calls(model.hidden_states),
        "forward explicit": calls(lambda i: model(i, attn_impl="explicit")),
        "forward fused": calls(lambda i: model(i, attn_impl="fused")),
    }
    rows = []
    ref_s = None
    for name, fn in cases.items():
        s = time_call(fn, sizes.extract_repeats, device)
        ref_s = ref_s or s["median_s"]
        rows.append({"name": name, "seq_per_s": n_seq / s["median_s"], **s,
                     "speedup": _ratio(ref_s, s["median_s"])})
    return {"config": config.to_dict(), "n_sequences": n_seq, "rows": rows}


# ---------------------------------------------------------------------------------------------
# adjacency score


def pairwise_score(C: np.ndarray, max_elements: int = 1 << 25) -> np.ndarray:
    """Adjacency score [M] of matrices [M, T, T] by comparing every pair i < j < k of every row
    k with torch, a block of rows at a time: the straightforward vectorised O(T^3) reference."""
    t = torch.from_numpy(np.ascontiguousarray(C))
    M, T = t.shape[0], t.shape[-1]
    pos = torch.arange(T)
    before = pos[:, None] < pos[None, :]  # [T(i), T(j)]: i < j
    rows_per_block = max(1, max_elements // (M * T * T))
    total = torch.zeros(M, dtype=torch.float64)
    for lo in range(2, T, rows_per_block):
        ks = pos[lo:lo + rows_per_block]  # [K] the rows of this block
        rows = t[:, ks]  # [M, K, T]
        valid = before & (pos[None, None, :] < ks[:, None, None])  # [K, T(i), T(j)]: i < j < k
        ordered = ((rows[..., :, None] < rows[..., None, :]) & valid).sum((-2, -1))  # [M, K]
        total += (ordered.double() / (ks * (ks - 1) / 2)).sum(-1)
    return (total / (T - 2)).numpy()


@torch.no_grad()
def similarity_stack(config: GPTConfig, T: int, seed: int = 0) -> torch.Tensor:
    """Self-cosine similarity of every layer of a random base model on one sequence of T random
    task characters: [n_layer + 1, T, T]. A NoPE model has no position table, so only
    ``block_size`` has to admit T."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**config.to_dict(), "block_size": max(T, config.block_size)})).eval()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(2, 2 + len(CHARS), (1, T), generator=g)  # [1, T] ids of task characters
    return model.hidden_states(idx)[:, 0]  # [L+1, T, d]


def bench_adjacency(config: GPTConfig, sizes: Sizes) -> dict:
    """Seconds of adjacency_score on all n_layer + 1 matrices, per T; prefixes of one long
    sequence give every T (causal attention: a prefix's states do not depend on what follows)."""
    states = similarity_stack(config, max(sizes.adjacency_T))  # [L+1, Tmax, d]
    adjacency_score(np.eye(8, dtype=np.float32) + 0.1)  # compile (or load) the numba kernel
    rows = []
    for T in sizes.adjacency_T:
        C = cosine_similarity_matrix(states[:, :T]).numpy()  # [L+1, T, T] float32
        fast = time_call(lambda: adjacency_score(C), sizes.adjacency_repeats, torch.device("cpu"))
        scores = adjacency_score(C)
        row = {"T": T, "n_matrices": len(C), "numba_s": fast["median_s"], "numba_min_s": fast["min_s"],
               "numba_max_s": fast["max_s"], "mean_score": float(scores.mean())}
        for name, fn, max_T in (("reference", adjacency_score_reference, sizes.reference_max_T),
                                ("vectorised", pairwise_score, sizes.vectorised_max_T)):
            if T <= max_T:
                start = time.perf_counter()
                ref_scores = fn(C)
                seconds = time.perf_counter() - start
                row[f"{name}_s"] = seconds
                row[f"speedup_vs_{name}"] = _ratio(seconds, fast["median_s"])
                row[f"max_abs_diff_vs_{name}"] = float(np.abs(ref_scores - scores).max())
        rows.append(row)
    return {"config": config.to_dict(), "numba_threads": numba.get_num_threads(), "rows": rows}


# ---------------------------------------------------------------------------------------------
# probe


def bench_probe(config: GPTConfig, sizes: Sizes) -> dict:
    """Hidden-state extraction for the probe, and one fit per feature set at layer 1."""
    from nopelib.probe import FEATURE_SETS, ProbeConfig, features, fit_probe, model_states, \
        random_token_sequences, window_positions

    torch.manual_seed(0)
    model = GPT(config).eval()
    idx = random_token_sequences(sizes.probe_n, sizes.probe_T, CHARS, seed=0)
    start = time.perf_counter()
    states = model_states(model, idx)  # [L+1, N, T, d]
    rows = [{"name": "model_states", "seconds": time.perf_counter() - start}]
    positions = window_positions(sizes.probe_T, sizes.probe_w)
    probe_config = ProbeConfig(max_steps=sizes.probe_max_steps)
    for kind in FEATURE_SETS:
        start = time.perf_counter()
        feats = features(states[1], kind, sizes.probe_w)  # [N, S, F]
        result = fit_probe(feats, positions, seed=0, config=probe_config)
        rows.append({"name": f"fit {kind}", "seconds": time.perf_counter() - start,
                     "best_step": result.steps, "nrmse": result.nrmse})
    return {"config": config.to_dict(), "n_sequences": sizes.probe_n, "T": sizes.probe_T,
            "w": sizes.probe_w, "probe": asdict(probe_config), "rows": rows}


# ---------------------------------------------------------------------------------------------
# parallel training


def _train_seconds(task: str, seed: int, profile: TrainProfile, threads: int) -> float:
    """Seconds of one CPU training run (data, model, loop) on ``threads`` threads."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    train(task, seed, profile, torch.device("cpu"), progress=False)
    return time.perf_counter() - start


def bench_parallel(sizes: Sizes) -> dict:
    """Wall time of ``n`` quick-profile runs: sequential on all cores, then in parallel processes."""
    n = os.cpu_count() or 1
    if n < 2:
        return {"skipped": True, "reason": "one core: nothing to run in parallel", "rows": []}
    prof = replace(PROFILES["quick"], steps=sizes.parallel_steps, warmup_steps=min(10, sizes.parallel_steps),
                   n_train=4000, n_test=100, n_eval=100)
    runs = [("reversal", seed) for seed in range(n)]
    threads = torch.get_num_threads()
    start = time.perf_counter()
    try:
        sequential = [_train_seconds(task, seed, prof, n) for task, seed in runs]
    finally:
        torch.set_num_threads(threads)
    sequential_s = time.perf_counter() - start
    start = time.perf_counter()
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        parallel = list(pool.map(_train_seconds, *zip(*runs), [prof] * n, [1] * n))
    parallel_s = time.perf_counter() - start
    rows = [{"name": f"sequential, {n} threads (ref)", "wall_s": sequential_s, "run_s": sequential, "speedup": 1.0},
            {"name": f"{n} processes x 1 thread", "wall_s": parallel_s, "run_s": parallel,
             "speedup": _ratio(sequential_s, parallel_s)}]
    return {"runs": [list(r) for r in runs], "steps": prof.steps, "batch_size": prof.batch_size, "rows": rows}


# ---------------------------------------------------------------------------------------------
# evaluation


def bench_evaluation(sizes: Sizes, device: torch.device) -> dict:
    """Seconds to score ``eval_n`` test pairs per task with the quick profile's model, greedy
    decoding token by token (reference) against teacher forcing (``evaluate``), as a training
    run does after its last step. The model is freshly initialised: it never emits the end
    token early, so greedy decoding runs every answer to full length, as it does on a model
    that has not finished learning."""
    prof = PROFILES["quick"]
    torch.manual_seed(0)
    model = GPT(prof.model).to(device).eval()
    rows = []
    for task in TASKS:
        pairs = make_split(task, 0, n_train=0, n_test=sizes.eval_n).test
        acc = {"greedy": greedy_accuracy(model, pairs, prof.eval_batch_size),
               "teacher-forced": evaluate(model, pairs, prof.eval_batch_size)}
        ref = time_call(lambda: greedy_accuracy(model, pairs, prof.eval_batch_size), 1, device)
        fast = time_call(lambda: evaluate(model, pairs, prof.eval_batch_size), 3, device)
        rows.append({"task": task, "greedy_s": ref["median_s"], "teacher_forced_s": fast["median_s"],
                     "speedup": _ratio(ref["median_s"], fast["median_s"]),
                     "accuracy_greedy": acc["greedy"], "accuracy_teacher_forced": acc["teacher-forced"]})
    return {"config": prof.model.to_dict(), "n_pairs": sizes.eval_n, "rows": rows}


# ---------------------------------------------------------------------------------------------
# chapters


def toc_chapters(toc: Path = ROOT / "_toc.yml") -> list[Path]:
    """The notebooks listed in ``_toc.yml``, in reading order."""
    files = [line.split("file:", 1)[1].strip() for line in toc.read_text().splitlines() if "file:" in line]
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").is_file()]


def _execute(path: Path, timeout_s: int, memo_on: bool) -> tuple[float, str]:
    """Wall seconds and status of executing one notebook, cwd = its folder."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    previous = os.environ.get(MEMO_ENV)
    os.environ[MEMO_ENV] = "1" if memo_on else "0"  # the kernel inherits this environment
    start = time.perf_counter()
    try:
        client.execute()
        status = "ok"
    except Exception as exc:
        status = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    finally:
        if previous is None:
            os.environ.pop(MEMO_ENV, None)
        else:
            os.environ[MEMO_ENV] = previous
    return time.perf_counter() - start, status


def bench_chapters(timeout_s: int = 3600) -> dict:
    """Wall time of executing each chapter with its default parameters: every study computed
    (results cache off), then a rerun with the studies read from the results cache."""
    rows = []
    for path in toc_chapters():
        computed_s, status = _execute(path, timeout_s, memo_on=False)
        fill_s, fill_status = _execute(path, timeout_s, memo_on=True)  # fills the results cache
        rerun_s, rerun_status = _execute(path, timeout_s, memo_on=True)
        bad = [s for s in (status, fill_status, rerun_status) if s != "ok"]
        rows.append({"chapter": path.stem, "wall_s": computed_s, "fill_s": fill_s, "rerun_s": rerun_s,
                     "speedup": _ratio(computed_s, rerun_s), "status": bad[0] if bad else "ok"})
    return {"note": "trained runs come from the nopelib run cache when it is warm", "rows": rows}


# ---------------------------------------------------------------------------------------------
# driver


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
    result["parallel"] = _guarded("parallel", lambda: bench_parallel(sizes)) if dev.type == "cpu" else skipped
    result["evaluation"] = _guarded("evaluation", lambda: bench_evaluation(sizes, dev))
    result["probe"] = _guarded("probe", lambda: bench_probe(base, sizes))
    result["chapters"] = _guarded("chapters", bench_chapters) if do_chapters else skipped
    result["meta"]["loadavg_end"] = _loadavg()
    result["meta"]["total_s"] = time.perf_counter() - start
    return result


def write_json(result: dict, path: str | Path) -> None:
    """Write atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent.resolve())
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=1, allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _section(out: list[str], title: str, sec: dict, body: Callable[[dict], list[str]]) -> None:
    """Append a section: its title, then its error, "skipped", or the lines ``body`` makes."""
    out.append(f"\n[{title}]")
    if "error" in sec:
        out.append(sec["error"])
    elif sec.get("skipped"):
        out.append("skipped")
    else:
        out += body(sec)


def _train_lines(sec: dict) -> list[str]:
    lines = [f"{'variant':40s} {'step ms':>9s} {'(min-max)':>15s} {'tokens/s':>10s} {'speed-up':>8s} {'compile s':>9s}"]
    for r in sec["rows"]:
        if r["status"] != "ok":
            lines.append(f"{r['name']:40s} {r['status']}")
            continue
        lines.append(f"{r['name']:40s} {r['step_ms']:9.1f} {r['step_ms_min']:7.1f}-{r['step_ms_max']:<7.1f} "
                     f"{r['tokens_per_s']:10.0f} {r['speedup']:7.2f}x {_fmt(r.get('compile_s'), '9.1f')}")
    return lines


def _adjacency_lines(sec: dict) -> list[str]:
    lines = [f"{'T':>5s} {'numba s':>9s} {'loop ref s':>10s} {'x':>8s} {'vectorised s':>12s} {'x':>8s} {'score':>6s}"]
    for r in sec["rows"]:
        lines.append(f"{r['T']:5d} {r['numba_s']:9.4f} {_fmt(r.get('reference_s'), '10.3f')} "
                     f"{_fmt(r.get('speedup_vs_reference'), '8.0f')} {_fmt(r.get('vectorised_s'), '12.3f')} "
                     f"{_fmt(r.get('speedup_vs_vectorised'), '8.0f')} {r['mean_score']:6.3f}")
    return lines


def format_table(result: dict) -> str:
    """The result as readable text tables."""
    m = result["meta"]
    out = [f"nopelib benchmark  device={m['device']}  torch={m['torch']}  threads={m['torch_threads']}  "
           f"small={m['small']}  load avg start={m['loadavg_start']} end={m.get('loadavg_end')}"]
    for name, sec in result["train"].items():
        _section(out, f"train: {name}, batch {sec.get('batch_size')}, T per task {sec.get('seq_len')}", sec, _train_lines)
    ext, adj, par = result["extraction"], result["adjacency"], result["parallel"]
    _section(out, f"extraction: {ext.get('n_sequences')} task inputs", ext, lambda sec: [
        f"{'path':40s} {'seq/s':>10s} {'speed-up':>8s}",
        *(f"{r['name']:40s} {r['seq_per_s']:10.0f} {r['speedup']:7.2f}x" for r in sec["rows"])])
    _section(out, f"adjacency_score: all layers of one sequence, numba threads {adj.get('numba_threads')}", adj,
             _adjacency_lines)
    _section(out, f"parallel: quick profile, {len(par.get('runs', []))} runs of {par.get('steps')} steps", par,
             lambda sec: [f"{r['name']:40s} {r['wall_s']:8.1f} s wall {r['speedup']:7.2f}x  runs "
                          + ", ".join(f"{x:.1f}" for x in r["run_s"]) + " s" for r in sec["rows"]])
    ev, pr = result["evaluation"], result["probe"]
    _section(out, f"evaluation: quick model, {ev.get('n_pairs')} test pairs per task", ev, lambda sec: [
        f"{'task':12s} {'greedy s':>9s} {'teacher-forced s':>17s} {'speed-up':>9s} {'accuracies':>12s}",
        *(f"{r['task']:12s} {r['greedy_s']:9.3f} {r['teacher_forced_s']:17.4f} {r['speedup']:8.1f}x "
          f"{r['accuracy_greedy']:.3f}/{r['accuracy_teacher_forced']:.3f}" for r in sec["rows"])])
    _section(out, f"probe: {pr.get('n_sequences')} sequences of T={pr.get('T')}, window {pr.get('w')}, layer 1", pr,
             lambda sec: [f"{r['name']:40s} {r['seconds']:8.2f} s"
                          + (f"  (best step {r['best_step']})" if "best_step" in r else "") for r in sec["rows"]])
    _section(out, "chapters", result["chapters"], lambda sec: [
        f"{'chapter':24s} {'computed s':>10s} {'fill s':>8s} {'rerun s':>8s} {'speed-up':>9s}",
        *(f"{r['chapter']:24s} {r['wall_s']:10.1f} {r['fill_s']:8.1f} {r['rerun_s']:8.1f} "
          f"{r['speedup']:8.1f}x  {r['status']}" for r in sec["rows"])])
    out.append(f"\ntotal {m.get('total_s', 0):.1f} s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nopelib.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes, no chapters: checks that it works")
    parser.add_argument("--json", default="bench.json", help="where to write the JSON (default: bench.json)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--no-chapters", action="store_true", help="skip executing the chapters")
    args = parser.parse_args(argv)
    result = run(small=args.small, device=args.device, chapters=False if args.no_chapters else None)
    print(format_table(result))
    write_json(result, args.json)
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
