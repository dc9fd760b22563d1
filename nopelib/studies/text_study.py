"""The text study: NoPE and learned-position language models on the King James Bible.

Each run trains one model (``text_lm.train_text``: an encoding, a seed, the ``text`` profile)
and measures, on the initial and on the trained model: every layer's adjacency score on
``beyond_claims.TEXT_WINDOWS`` windows of the test books at each of ``beyond_claims.TEXT_LENGTHS`` (a learned
table stops at its context; NoPE is scored past it), the position probes of the probes chapter
(``probe.probe_model``: ridge on the cosine and variance windows and on the full state, every
layer) at the context length and, for NoPE, at the longest; and, once trained, bits per
character on the whole validation and test books and a few generated lines. The rule that
judges the study is ``beyond_claims.text_claims``, committed before it ran.

It trains longer than a chapter may, so it runs by hand with one command::

    NOPELIB_ALLOW_SLOW=1 python -m nopelib.studies.text_study --workers 2

which writes ``book/results/text_study.json``. Each finished run is kept in the results cache
(``nopelib.store.memo``) and each run in flight keeps checkpoints (``nopelib.store.checkpoint``,
under its ``text_lm.run_key``), so a stopped study goes on where it stopped when the same command is
run again at the same commit.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nopelib.averaging.theory_config import closed_form_ratio, predict_config_score
from nopelib.core.corpus import CorpusError, load
from nopelib.core.model import GPT
from nopelib.core.params import SEED, Choice, ListOf
from nopelib.core.probe import RidgeConfig, probe_model
from nopelib.rules import beyond_claims
from nopelib.store.cache import resolve_cache_dir
from nopelib.store.checkpoint import RunCheckpoints
from nopelib.store.memo import is_cached, memo
from nopelib.results import files as results, guard
from nopelib.studies.probe_study import sequences_for
from nopelib.training.text_lm import (ENCODINGS, TEXT_PROFILES, TextProfile, bits_per_char,
                                      get_text_profile, layer_scores, lengths_for, run_key, sample,
                                      train_text, unigram_bits)

PROBE_W = 4  # the probes' window, as the trained study's
PROBE_SEEDS = (0, 1, 2)
PROBE_FIT_TOKENS = 8_000  # probed tokens in each fitting split, as the trained study's
PROMPTS = ("And God said", "Blessed are the", "In the beginning")
SAMPLE_CHARS = 200
# one run's seconds on one loaded core, used by the time gate: the text profile's 4,000 steps
# at the 0.58 s measured for it (text_lm.TextProfile) and about 10 minutes of curve points
# and measurements; the tiny profile's 20 s measured on the same core
RUN_SECONDS = {"text": 3_000.0, "text_tiny": 20.0}


def rule_windows(n: int) -> np.ndarray:
    """The windows a score reads under the rule: ``beyond_claims.TEXT_WINDOWS`` windows of ``n``
    characters of the test books, drawn with ``beyond_claims.TEXT_WINDOW_SEED`` [windows, n]."""
    return load().windows("test", n, beyond_claims.TEXT_WINDOWS, beyond_claims.TEXT_WINDOW_SEED)


def initial_model(prof: TextProfile, encoding: str, seed: int) -> GPT:
    """``train_text``'s initial draw for ``seed`` (eval mode)."""
    torch.manual_seed(seed)
    return GPT(prof.config(encoding, len(load().vocab))).eval()


def measure(model: GPT, encoding: str, profile: TextProfile) -> tuple[dict, list[dict]]:
    """The adjacency score of every layer per length (mean and sd over the windows), and the
    probe rows (stage left to the caller) at the context length and, for NoPE, the longest."""
    corpus = load()
    scores = {}
    for n in lengths_for(encoding, profile):
        per = layer_scores(model, rule_windows(n))  # [windows, L+1]
        scores[str(n)] = {"mean": per.mean(0).tolist(), "sd": per.std(0, ddof=1).tolist()}
    probes = []
    config = RidgeConfig()
    for n in sorted({profile.context, lengths_for(encoding, profile)[-1]}):
        count = sequences_for(PROBE_FIT_TOKENS, n, PROBE_W, config)
        idx = torch.from_numpy(corpus.windows("test", n, count, beyond_claims.TEXT_WINDOW_SEED + 1))
        table = probe_model(model, idx, [PROBE_W], list(PROBE_SEEDS), config=config)
        probes += [{"length": n, "layer": int(r.layer), "features": r.features,
                    "seed": int(r.seed), "nrmse": float(r.nrmse), "r": float(r.r)}
                   for r in table.itertuples()]
    return scores, probes


def _resolved(profile: TextProfile, where: str) -> TextProfile:
    # a chapter resolves its profile name once, where it starts, and passes the object on
    if not isinstance(profile, TextProfile):
        raise TypeError(f"{where}: profile={profile!r}; allowed: a TextProfile "
                        "(nopelib.training.text_lm.get_text_profile resolves a name)")
    return profile


def init_scores(profile: TextProfile, seeds: list[int], lengths: list[int]) -> pd.DataFrame:
    """The chapter's live part: every layer's adjacency score of the NoPE models at
    initialisation (``text_run``'s initial draws), the mean over the rule's windows of the
    test books at each of ``lengths``; one row per (seed, layer, length), with the columns
    ``beyond_claims.text_claims`` reads (encoding "none", stage "init")."""
    prof = _resolved(profile, "init_scores")
    rows = []
    for seed in seeds:
        model = initial_model(prof, "none", seed)
        for n in lengths:
            for layer, score in enumerate(layer_scores(model, rule_windows(n)).mean(0)):
                rows.append({"encoding": "none", "stage": "init", "seed": seed,
                             "layer": layer, "length": n, "score": float(score)})
    return pd.DataFrame(rows)


def init_predicted(profile: TextProfile, lengths: list[int]) -> pd.DataFrame:
    """The averaging theory's layer-1 score of the NoPE model at initialisation, from its
    configuration alone (``theory_config.predict_config_score``: nothing measured), on the
    rule's windows at each of ``lengths``; one row per length, with the closed-form ratio
    ``rho`` of the token embedding to one value vector."""
    config = _resolved(profile, "init_predicted").config("none", len(load().vocab))
    rho = closed_form_ratio(config)
    return pd.DataFrame([{"length": n, "rho": rho, "predicted": predict_config_score(
        config, [list(w) for w in rule_windows(n)])} for n in lengths])


def text_run(encoding: str, seed: int, profile: str) -> dict:
    """One run of the study on the CPU (one thread), as the file holds it."""
    prof = get_text_profile(profile)
    corpus = load()
    device = torch.device("cpu")
    initial = initial_model(prof, encoding, seed)
    init_scores, init_probes = measure(initial, encoding, prof)
    checkpoints = RunCheckpoints(resolve_cache_dir() / "checkpoints",
                                 run_key(encoding, seed, prof, device))
    model, m = train_text(corpus, encoding, seed, prof, device, checkpoints)
    tic = time.perf_counter()
    scores, probes = measure(model, encoding, prof)
    rows = {split: corpus.rows(split, prof.context + 1) for split in ("validation", "test")}
    run = {
        "encoding": encoding, "seed": seed, "steps": m["steps"],
        "train_seconds": m["train_seconds"], "curve_seconds": m["curve_seconds"],
        "resumed_at": m["resumed_at"], "loss_curve": m["loss_curve"],
        "curve": {k: list(v) for k, v in m["curve"].items()},
        "val_bpc": bits_per_char(model, rows["validation"]),
        "test_bpc": bits_per_char(model, rows["test"]),
        "scores": {"init": init_scores, "trained": scores},
        "probes": [{"stage": "init", **r} for r in init_probes]
        + [{"stage": "trained", **r} for r in probes],
        "samples": [{"prompt": p, "text": sample(model, corpus, p, SAMPLE_CHARS, seed)}
                    for p in PROMPTS],
    }
    run["measure_seconds"] = time.perf_counter() - tic
    checkpoints.clear()
    return run


def _one(job: tuple[str, int, str]) -> dict:
    # the importable module's function (run as ``python -m`` this module is __main__, whose
    # functions memo keys by their globals too)
    from nopelib.studies.text_study import text_run as run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one process per core
    try:
        return memo(run, *job)
    finally:
        torch.set_num_threads(threads)


def jobs(profile: str, encodings: list[str], seeds: list[int]) -> list[tuple[str, int, str]]:
    """The (encoding, seed, profile) of every run, encoding by encoding: the file's order."""
    return [(e, s, profile) for e in encodings for s in seeds]


def run_study(profile: str, encodings: list[str], seeds: list[int],
              workers: int = 1) -> list[dict]:
    """Every (encoding, seed) run of ``profile``, from the results cache where it holds it,
    on ``workers`` processes (one thread each)."""
    get_text_profile(profile)
    for e in encodings:
        if e not in ENCODINGS:
            raise ValueError(f"encoding {e!r} is unknown; allowed: {ENCODINGS}")
    todo = jobs(profile, encodings, seeds)
    if workers == 1:
        return [_one(job) for job in todo]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_one, todo))


def drop_problem(path: Path, old: dict | None, profile: TextProfile, encodings: list[str],
                 seeds: list[int], replace: list[int]) -> str | None:
    """Why writing the (encoding, seed) runs of ``profile`` over ``old``, the committed
    document at ``path`` (None: no file), is refused: it would drop committed runs whose seeds
    ``replace`` does not name: every run of a file trained under another profile record (one
    file holds one), else those this invocation does not compute (a run it computes replaces
    its committed one)."""
    if old is None:
        return None
    would = guard.summary("text", {"profile": profile.name, "encoding": encodings,
                                          "seed": seeds})
    mine = {(e, s) for e in encodings for s in seeds}
    return (guard.stale_problem(path, old, would, profile.record(), replace)
            or guard.dropped_problem(
                path, old, would, [r["seed"] for r in old["runs"]
                                   if (r["encoding"], r["seed"]) not in mine], replace,
                "this command does not compute them again"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nopelib.studies.text_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="text", choices=sorted(TEXT_PROFILES))
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS),
                        choices=list(ENCODINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="default: the profile's seeds")
    parser.add_argument("--workers", type=int, default=1,
                        help="training processes (one thread each)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: book/results/text_<profile>.json")
    parser.add_argument("--replace", nargs="+", type=int, default=[], metavar="SEED",
                        help="seeds whose committed runs this write may drop (default: a write "
                             "that would drop one is refused)")
    args = parser.parse_args(argv)
    from nopelib.core.params import Int, check_args
    from nopelib.training.gate import training_time_problem

    try:  # now, not in the first run's worker after the checks: a missing or altered package
        load()
    except CorpusError as exc:
        parser.error(str(exc))
    prof = TEXT_PROFILES[args.profile]
    seeds = list(prof.seeds) if args.seeds is None else args.seeds
    check_args(parser, {
        "--seeds": (seeds, ListOf(SEED, unique=True)),
        "--encodings": (args.encodings, ListOf(Choice(ENCODINGS), unique=True)),
        "--workers": (args.workers, Int(min=1, max=64, why="one process per core")),
    })
    out = results.RESULTS_DIR / f"text_{prof.name}.json" if args.out is None else args.out
    if not out.name.startswith("text_") or out.suffix != ".json":
        parser.error(f"--out={str(out)!r}: the file must be named text_<name>.json")
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        parser.error(f"--out={str(out)!r}: {str(out.parent)!r} is not a writable folder")
    asked = (prof, args.encodings, seeds, args.replace)
    try:  # before any training: the file as it stands now
        problem = drop_problem(out, results.load(out) if out.is_file() else None, *asked)
    except results.ResultsError as exc:
        problem = f"{exc}; move the file aside or mend it"
    if problem:
        parser.error(problem)
    from nopelib.studies.text_study import text_run as run  # the key _one caches it under

    todo = [job for job in jobs(prof.name, args.encodings, seeds) if not is_cached(run, *job)]
    slow = training_time_problem(prof.loop(), len(todo), "cpu", RUN_SECONDS[prof.name],
                                 args.workers, basis="as measured on the development VM",
                                 allowed="fewer --encodings or --seeds, more --workers")
    if slow is not None:
        parser.error(slow)
    start = time.perf_counter()
    runs = run_study(prof.name, args.encodings, seeds, args.workers)
    doc = {"provenance": results.provenance(
        "python -m nopelib.studies.text_study", argv, start, profile=prof.name,
        training=prof.record(), encodings=list(args.encodings), seeds=seeds,
        windows={"n": beyond_claims.TEXT_WINDOWS, "seed": beyond_claims.TEXT_WINDOW_SEED,
                 "split": "test"},
        unigram_bpc=unigram_bits(load())), "runs": runs}

    def checked(old: dict | None, new: dict) -> dict:  # the file as it stands when written
        guard.refuse(drop_problem(out, old, *asked))
        return new

    results.write(out, doc, "text", merge=checked)
    print(f"wrote {out}: {len(runs)} runs in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
