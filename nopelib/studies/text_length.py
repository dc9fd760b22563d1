"""The text-length study: text models trained at 256 characters, read up to 2,048.

Each run trains one language model exactly as the text study does (``text_lm.train_text``: the
``text`` profile, the same rows in the same order for a seed) with one of the encodings of
``length_claims.LENGTH_ENCODINGS``, then reads it on ``length_claims.BPC_WINDOWS`` windows of
the test books, each one pass of ``text_lm.REACH`` + 1 characters (a causal model's first n
predictions are its predictions on the window's first n characters, so one pass gives every
length): the bits per character at each of ``LENGTH_LENGTHS`` the model can read (a learned
table stops at its context), a per-position curve, for NoPE the same with the log-length
temperature of ``length_claims.temperature`` on its queries (evaluation only), and, on the
first ``STATE_WINDOWS`` windows, every layer's adjacency score at each length, the share of
rows i in [n/2, n) that rank i - 1 above i - n/2, and the ordering by distance per octave of
rows from which the long-sequences chapter reads the resolution d*(i). The rule that judges
it is ``length_claims.length_claims``, committed before it ran.

It trains for hours, so it runs by hand, one run at a time on one thread, each finished run
written into its file at once::

    python -m nopelib.studies.text_length --until 18:20

which writes ``book/results/length_text.json``; ``--until`` starts no run that would not
finish by then (a run stopped anyway resumes from its checkpoints at the same commit).

The verdicts stand where a rerun under a second CPU kernel set agrees
(``rules/length_kernels``); it trains the same runs in a cache of its own::

    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
    NOPELIB_CACHE_DIR=~/.cache/nopelib-avx2 python -m nopelib.studies.text_length \
        --encodings none rope alibi --out book/results/length_text_avx2.json

(``ATEN_CPU_CAPABILITY=default`` on a CPU whose best is AVX2). Each run records the kernels
it trained under, and a run cached under other kernels than the command's is refused.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nopelib.core.corpus import CorpusError, load
from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.core.model import GPT
from nopelib.core.params import SEED, Choice, ListOf, check_args
from nopelib.results import files as results
from nopelib.results import guard as result_guard
from nopelib.rules import length_claims as rule
from nopelib.rules.length_kernels import KERNEL_FILE
from nopelib.store.cache import CACHE_ENV, resolve_cache_dir
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.store.memo import is_cached, memo
from nopelib.studies.campaign import parse_until
from nopelib.studies.long_context import order_outcomes, resolution_triples
from nopelib.training.text_lm import (REACH, TEXT_PROFILES, TextProfile, bits_per_char,
                                      get_text_profile, run_key, train_text, unigram_bits)

# one run's seconds on one loaded core: the text study's 3,000 (text_study.RUN_SECONDS) and
# about 5 minutes of reading at 2,048 characters; the tiny profile's 30 s
RUN_SECONDS = {"text": 3_300.0, "text_tiny": 30.0}


def held_out(n: int = rule.BPC_WINDOWS) -> np.ndarray:
    """The rule's windows: ``n`` windows of REACH + 1 characters of the test books, drawn with
    ``length_claims.WINDOW_SEED`` [n, REACH + 1]."""
    return load().windows("test", REACH + 1, n, rule.WINDOW_SEED)


@contextmanager
def log_length_temperature(model: GPT, context: int) -> Iterator[None]:
    """Within the block, every attention layer's queries at position i are multiplied by
    ``length_claims.temperature``'s factor (so are its logits): forward hooks on the q part
    of each ``c_attn``, removed on leaving; the model's weights are not touched."""
    n_embd = model.config.n_embd

    def scale(_: torch.nn.Module, __: tuple, out: torch.Tensor) -> torch.Tensor:
        T = out.shape[1]  # out: [B, T, 3 * n_embd], q first
        t = torch.from_numpy(rule.temperature(T, context)).to(out)  # [T]
        return torch.cat([out[..., :n_embd] * t[:, None], out[..., n_embd:]], dim=-1)

    hooks = [block.attn.c_attn.register_forward_hook(scale) for block in model.transformer.h]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def position_bits(model: GPT, rows: np.ndarray, batch: int = 8) -> np.ndarray:
    """Bits of every next-character prediction on ``rows`` [N, T + 1]: [N, T]."""
    out = []
    for lo in range(0, len(rows), batch):
        chunk = torch.from_numpy(rows[lo:lo + batch])
        logits, _ = model(chunk[:, :-1])  # [b, T, vocab]
        nats = F.cross_entropy(logits.float().transpose(1, 2), chunk[:, 1:],
                               reduction="none")  # [b, T]
        out.append(nats.numpy() / np.log(2))
    return np.concatenate(out)


def bpc_by_length(bits: np.ndarray, lengths: list[int]) -> dict[str, float]:
    """The mean bits over the first n positions of every window, per length n."""
    return {str(n): float(bits[:, :n].mean()) for n in lengths}


@torch.no_grad()
def state_readings(model: GPT, windows: np.ndarray, lengths: list[int]) -> dict:
    """On each of ``windows`` [N, T] (one at a time: [L+1, T, T] similarities): every layer's
    adjacency score at each length (the window's first n positions), the share of rows i in
    [n/2, n) with C[i, i-1] > C[i, i-n/2], and the ordering by distance of
    ``long_context.resolution_triples``; each the mean over the windows."""
    T = windows.shape[1]
    triples = resolution_triples(T)
    keys = triples[["octave", "d"]]
    scores, ordered, order = [], [], []
    for window in windows:
        states = model.hidden_states(torch.from_numpy(window[None]), attn_impl="fused")
        C = cosine_similarity_matrix(states[:, 0].float()).numpy()  # [L+1, T, T]
        scores.append([adjacency_score(C[:, :n, :n]) for n in lengths])  # [lengths, L+1]
        share = []
        for n in lengths:
            k = np.arange(n // 2, n)
            share.append((C[:, k, k - 1] > C[:, k, k - n // 2]).mean(-1))  # [L+1]
        ordered.append(share)
        order.append(order_outcomes(C, triples))  # [L+1, triples]
    scores, ordered = np.mean(scores, 0), np.mean(ordered, 0)  # [lengths, L+1]
    hits = np.mean(order, 0)  # [L+1, triples]
    table = [[layer, int(a), int(d), float(f)] for layer in range(hits.shape[0])
             for (a, d), f in keys.assign(f=hits[layer]).groupby(["octave", "d"]).f.mean()
             .items()]
    return {"scores": {str(n): scores[i].tolist() for i, n in enumerate(lengths)},
            "ordered": {str(n): ordered[i].tolist() for i, n in enumerate(lengths)},
            "order": table}


def read_model(model: GPT, encoding: str, profile: TextProfile) -> dict:
    """Everything a run records of a trained model past its context (see the module)."""
    lengths = rule.lengths_read(encoding, profile.context)
    rows = held_out()[:, : max(lengths) + 1]
    bits = position_bits(model, rows)
    out = {"bpc": bpc_by_length(bits, lengths), "sharpened": {},
           "position_bits": bits.reshape(len(bits), -1, rule.CURVE_BIN).mean((0, 2)).tolist()}
    if encoding == "none":
        with log_length_temperature(model, profile.context):
            out["sharpened"] = bpc_by_length(position_bits(model, rows), lengths)
    out.update(state_readings(model, rows[: rule.STATE_WINDOWS, :-1], lengths))
    return out


def length_run(encoding: str, seed: int, profile: str) -> dict:
    """One run of the study on the CPU, as the file holds it."""
    prof = get_text_profile(profile)
    corpus = load()
    device = torch.device("cpu")
    checkpoints = RunCheckpoints(resolve_cache_dir() / "checkpoints",
                                 run_key(encoding, seed, prof, device))
    model, m = train_text(corpus, encoding, seed, prof, device, checkpoints)
    tic = time.perf_counter()
    run = {"encoding": encoding, "seed": seed, "steps": m["steps"],
           "train_seconds": m["train_seconds"], "curve_seconds": m["curve_seconds"],
           "resumed_at": m["resumed_at"], "loss_curve": m["loss_curve"],
           "curve": {k: list(v) for k, v in m["curve"].items()},
           "test_bpc": bits_per_char(model, corpus.rows("test", prof.context + 1)),
           # the float kernels it trained under: a rerun under others must not be served this
           "kernels": torch.backends.cpu.get_cpu_capability(),
           **read_model(model, encoding, prof)}
    run["measure_seconds"] = time.perf_counter() - tic
    checkpoints.clear()
    return run


def queue(encodings: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """The order runs train in: seed by seed, the encodings the rule compares first, the
    learned table (shown to its context only) after every other run."""
    first = [e for e in encodings if e != "learned"]
    return ([(e, s) for s in seeds for e in first]
            + [("learned", s) for s in seeds if "learned" in encodings])


def merged(path: Path, old: dict | None, new: dict) -> dict:
    """The file at ``path`` (``old``; None: no file) with ``new``'s runs added, one run per
    encoding and seed, the newest kept; a file trained under another profile record is
    refused (its runs would go)."""
    if old is None:
        return new
    result_guard.refuse(result_guard.stale_problem(
        path, old, result_guard.summary("length", {"profile": new["provenance"]["profile"]}),
        new["provenance"]["training"], []))
    mine = {(r["encoding"], r["seed"]) for r in new["runs"]}
    runs = [r for r in old["runs"] if (r["encoding"], r["seed"]) not in mine] + new["runs"]
    return {"provenance": new["provenance"], "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.text_length",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="text", choices=sorted(TEXT_PROFILES))
    parser.add_argument("--encodings", nargs="+", default=list(rule.LENGTH_ENCODINGS),
                        choices=list(rule.LENGTH_ENCODINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: the profile's seeds")
    parser.add_argument("--until", default=None,
                        help="HH:MM (UTC) or a duration such as 2h40m: start no run that "
                             "would not finish by then (default: no deadline)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: book/results/length_<profile>.json")
    args = parser.parse_args(argv)
    try:
        load()
    except CorpusError as exc:
        parser.error(str(exc))
    prof = TEXT_PROFILES[args.profile]
    seeds = list(prof.seeds) if args.seeds is None else args.seeds
    check_args(parser, {
        "--seeds": (seeds, ListOf(SEED, unique=True)),
        "--encodings": (args.encodings, ListOf(Choice(rule.LENGTH_ENCODINGS), unique=True)),
    })
    short = [e for e in args.encodings if not rule.lengths_read(e, prof.context)]
    if short:
        parser.error(f"--encodings {' '.join(short)}: the {prof.name} profile's context "
                     f"{prof.context} is below every length the rule reads "
                     f"{list(rule.LENGTH_LENGTHS)}; allowed: the others")
    now = datetime.now(timezone.utc)
    until = None if args.until is None else parse_until(args.until, now)
    out = results.RESULTS_DIR / f"length_{prof.name}.json" if args.out is None else args.out
    if not out.name.startswith("length_") or out.suffix != ".json":
        parser.error(f"--out={str(out)!r}: the file must be named length_<name>.json")
    if out.name == KERNEL_FILE and not os.environ.get(CACHE_ENV):
        # a checkpoint of the native runs would resume under the other kernels
        parser.error(f"--out={str(out)!r} is the rerun under a second kernel set: it needs "
                     f"{CACHE_ENV} set to a cache of its own; allowed: the command in "
                     "the module's docstring")
    done = ({(r["encoding"], r["seed"]) for r in results.load(out)["runs"]}
            if out.is_file() else set())
    todo = [job for job in queue(args.encodings, seeds) if job not in done]
    torch.set_num_threads(1)  # one thread: the bits of a run do not depend on the cores
    for encoding, seed in todo:
        left = None if until is None else (until - datetime.now(timezone.utc)).total_seconds()
        cached = is_cached(length_run, encoding, seed, prof.name)
        if left is not None and not cached and left < RUN_SECONDS[prof.name]:
            print(f"{encoding} seed {seed}: {left:.0f} s left, a run takes about "
                  f"{RUN_SECONDS[prof.name]:.0f} s; stopping before it")
            break
        start = time.perf_counter()
        run = memo(length_run, encoding, seed, prof.name)
        if run["kernels"] != torch.backends.cpu.get_cpu_capability():
            raise SystemExit(f"{encoding} seed {seed}: the cache at {resolve_cache_dir()} "
                             f"holds this run trained under {run['kernels']} kernels, not "
                             f"{torch.backends.cpu.get_cpu_capability()}; allowed: a "
                             "NOPELIB_CACHE_DIR of its own for each kernel set")
        prov = results.provenance(
            "python -m nopelib.studies.text_length", argv, start, profile=prof.name,
            training=prof.record(), unigram_bpc=unigram_bits(load()),
            windows={"n": rule.BPC_WINDOWS, "states": rule.STATE_WINDOWS,
                     "seed": rule.WINDOW_SEED, "split": "test", "length": REACH + 1})
        # each run keeps where and when it was made: the file's provenance is its last write's
        run["made"] = {k: prov[k] for k in ("commit", "machine", "date", "wall_seconds")}
        results.write(out, {"provenance": prov, "runs": [run]}, "length",
                      merge=lambda old, new: merged(out, old, new))
        print(f"{encoding} seed {seed}: written to {out} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
