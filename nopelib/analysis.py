"""Adjacency scores of random models: one model's layers, then studies over many models.

The first half measures one model (``layer_scores``, ``similarity_matrices``); the second half
states the chapters' studies in one call each (``config_scores``, ``task_scores``,
``length_scores``, ``slider_frames``) as long pandas DataFrames, one row per (configuration,
seed, layer), so ``groupby`` gives the mean and spread over seeds and a chapter keeps its cells
short. Every study builds freshly initialised models with ``random_model``.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from nopelib.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.model import GPT, GPTConfig
from nopelib.tasks import TASKS, encode_inputs, get_task

# ---------------------------------------------------------------------------------------------
# inputs and models


def random_model(config: GPTConfig | None = None, seed: int = 0,
                 device: str | torch.device = "cpu", **overrides) -> GPT:
    """A freshly initialised model in eval mode; ``overrides`` replace fields of ``config``."""
    config = replace(config or GPTConfig(), **overrides)
    torch.manual_seed(seed)
    return GPT(config).to(device).eval()


def sample_inputs(task: str, n: int, seed: int = 0) -> list[str]:
    """``n`` task inputs (without answers), reproducible for the seed."""
    rng = random.Random(f"inputs-{task}-{seed}")
    t = get_task(task)
    return [t.sample(rng)[0] for _ in range(n)]


def longest_input(task: str, seed: int = 0, tries: int = 2000) -> str:
    """An input of the task's maximal length, for heatmaps that should show every position."""
    t = get_task(task)
    rng = random.Random(f"longest-{task}-{seed}")
    for _ in range(tries):
        text, _ = t.sample(rng)
        if len(text) == t.max_input_len:
            return text
    raise RuntimeError(f"{task}: no input of length {t.max_input_len} in {tries} draws")


def long_sequence(length: int, seed: int = 0) -> str:
    """Task inputs of all four tasks, drawn in random order and concatenated, cut to ``length``.

    The characters and local formats are the tasks' own; only the length is beyond them.
    """
    if length < 3:
        raise ValueError(f"length={length!r} must be >= 3")
    rng = random.Random(f"long-{seed}")
    names = list(TASKS)
    parts, n = [], 0
    while n < length:
        text, _ = get_task(rng.choice(names)).sample(rng)
        parts.append(text)
        n += len(text)
    return "".join(parts)[:length]


def length_groups(texts: Sequence[str]) -> dict[int, list[int]]:
    """{length T: indices of the texts of that length}, by increasing T; rejects T < 3, where no
    row has two earlier positions to compare."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, text in enumerate(texts):
        groups[len(text)].append(i)
    if groups and min(groups) < 3:
        raise ValueError(f"texts of length {min(groups)} have no row with two earlier positions; "
                         "need >= 3")
    return dict(sorted(groups.items()))


# ---------------------------------------------------------------------------------------------
# one model


def adjacency_score_with_diagonal(C: np.ndarray | torch.Tensor) -> np.ndarray:
    """The score's other reading: rows 1-based, row k compares the C(k, 2) pairs among
    positions 1..k, the diagonal C_kk = 1 included: [..., T, T] -> [...].

    Padding C with a leading row and a trailing column shifts row k - 1 (0-based) with its
    diagonal into row k of a [T + 1, T + 1] matrix, whose usual score is this reading.
    """
    arr = C.detach().cpu().numpy() if isinstance(C, torch.Tensor) else np.asarray(C)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"C must have shape [..., T, T]; got {arr.shape}")
    T = arr.shape[-1]
    padded = np.zeros(arr.shape[:-2] + (T + 1, T + 1), dtype=arr.dtype)  # [..., T+1, T+1]
    padded[..., 1:, :T] = arr  # the upper triangle is never read
    return adjacency_score(padded)


@torch.no_grad()
def layer_scores(model: GPT, texts: list[str], diagonal: bool = False) -> np.ndarray:
    """Adjacency score of every text at every layer: [len(texts), n_layer + 1].

    ``diagonal=True`` scores the diagonal-included reading (``adjacency_score_with_diagonal``).

    In a causal model the state at position i depends only on positions <= i, so right padding
    never reaches a text's own positions and one padded batch gives every text's states exactly
    (up to float rounding). A bidirectional model lets padding in, so its texts run in one batch
    per length.
    """
    device = next(model.parameters()).device
    groups = length_groups(texts)
    if model.config.causal:
        batches = [list(range(len(texts)))]
    else:
        batches = list(groups.values())
    scores = np.empty((len(texts), model.config.n_layer + 1))
    for batch in batches:
        idx, _ = encode_inputs([texts[i] for i in batch])  # [B, T_max], right-padded
        states = model.hidden_states(idx.to(device)).float().cpu()  # [L+1, B, T_max, d]
        row = {i: b for b, i in enumerate(batch)}
        for T, members in groups.items():
            rows = [row[i] for i in members if i in row]
            if rows:
                C = cosine_similarity_matrix(states[:, rows, :T])  # [L+1, b, T, T]
                score = adjacency_score_with_diagonal if diagonal else adjacency_score
                scores[[batch[r] for r in rows]] = score(C).T
    return scores


@torch.no_grad()
def similarity_matrices(model: GPT, text: str) -> np.ndarray:
    """Self-cosine-similarity matrix of one text at every layer: [n_layer + 1, T, T]."""
    idx, _ = encode_inputs([text])
    states = model.hidden_states(idx.to(next(model.parameters()).device)).float().cpu()
    return cosine_similarity_matrix(states[:, 0]).numpy()


LEARNED_AT = 0.9  # exact match on the whole test split, every seed: the task is learned


def is_learned(metrics: Sequence[Mapping], n_test: int) -> bool:
    """The book's learnedness criterion for one task: every seed's run (its metrics, with
    ``accuracy`` and ``n_test``) reaches ``LEARNED_AT`` exact match on the whole test split
    of ``n_test`` examples. Claims about trained models are made on learned tasks only."""
    return bool(metrics) and all(m["accuracy"] >= LEARNED_AT and m["n_test"] == n_test
                                 for m in metrics)


def summarize(scores: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation along ``axis`` (ddof=1 where there are >= 2 values)."""
    mean = scores.mean(axis=axis)
    std = scores.std(axis=axis, ddof=1) if scores.shape[axis] > 1 else np.zeros_like(mean)
    return mean, std


# ---------------------------------------------------------------------------------------------
# studies over many random models


def study_texts(inputs_per_task: int, seed: int) -> list[str]:
    """The inputs a study scores for one seed: ``inputs_per_task`` of every task, in task order
    (drawn with the seed, as in the Figure 1 study)."""
    return [t for task in TASKS for t in sample_inputs(task, inputs_per_task, seed=seed)]


def config_scores(
    overrides: Sequence[Mapping[str, object]],
    seeds: Sequence[int],
    inputs_per_task: int,
    base: GPTConfig | None = None,
) -> pd.DataFrame:
    """Adjacency score per layer for every configuration and seed, averaged over task inputs.

    Each entry of ``overrides`` replaces fields of ``base`` (default ``GPTConfig()``); for each
    seed the model is initialised with that seed and scores ``inputs_per_task`` inputs of every
    task (drawn with the same seed, as in the Figure 1 study), averaged with equal weight.
    Returns columns: the override keys, ``seed``, ``layer``, ``score``.
    """
    if inputs_per_task < 1:
        raise ValueError(f"inputs_per_task={inputs_per_task!r} must be >= 1")
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    base = base or GPTConfig()
    rows = []
    for fields in overrides:
        config = replace(base, **fields)
        for seed in seeds:
            model = random_model(config, seed=seed)
            texts = study_texts(inputs_per_task, seed)
            scores = layer_scores(model, texts).mean(0)  # [L+1]: equal inputs per task
            rows += [dict(fields, seed=seed, layer=layer, score=s)
                     for layer, s in enumerate(scores)]
            del model
    return pd.DataFrame(rows)


def task_scores(config: GPTConfig, seeds: Sequence[int], inputs_per_task: int,
                diagonal: bool = False) -> pd.DataFrame:
    """Adjacency score per layer of each task's inputs, for a model of every seed (Figure 1);
    ``diagonal=True`` scores the diagonal-included reading.

    Returns columns ``seed``, ``task``, ``layer``, ``score`` (the mean over the task's inputs).
    """
    rows = []
    for seed in seeds:
        model = random_model(config, seed=seed)
        for task in TASKS:
            texts = sample_inputs(task, inputs_per_task, seed=seed)
            scores = layer_scores(model, texts, diagonal=diagonal)
            rows += [dict(seed=seed, task=task, layer=layer, score=s)
                     for layer, s in enumerate(scores.mean(0))]
    return pd.DataFrame(rows)


def seed_series(
    scores: pd.DataFrame, by: str | Sequence[str], x: str = "layer", label: str | None = None,
    sort: bool = True,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Mean and std over seeds of ``score`` against ``x``, one series per group of ``by``.

    ``label`` formats a series' name from the group's values (e.g. ``"μ={init_mean:g}"``);
    by default the values are joined. The result is what ``viz.score_lines`` draws.
    """
    keys = [by] if isinstance(by, str) else list(by)
    series = {}
    for key, frame in scores.groupby(by, sort=sort):
        values = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        name = label.format(**values) if label else ", ".join(map(str, values.values()))
        series[name] = summarize(frame.pivot(index="seed", columns=x, values="score").to_numpy())
    return series


def mean_std_table(scores: pd.DataFrame, by: Sequence[str], digits: int = 3) -> pd.DataFrame:
    """One row per configuration in ``by``, one column per layer, cells "mean ± std" over seeds."""
    stats = scores.groupby([*by, "layer"]).score.agg(["mean", "std"]).fillna(0.0)
    fmt = f"{{:.{digits}f}}".format
    return (stats["mean"].map(fmt) + " ± " + stats["std"].map(fmt)).unstack("layer")


def length_tokens(length: int, seed: int = 0, vocab_size: int | None = None) -> list[int]:
    """One long sequence of token ids: ``long_sequence`` (the tasks' 23-character alphabet, where
    repeats dominate long sequences) or, with ``vocab_size``, i.i.d. uniform ids below it (a
    control in which repeats are rare while length << vocab_size)."""
    if vocab_size is None:
        return encode_inputs([long_sequence(length, seed)])[0][0].tolist()
    if vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size!r} must be >= 2")
    if length < 3:
        raise ValueError(f"length={length!r} must be >= 3")
    rng = np.random.default_rng([seed, vocab_size])
    return rng.integers(0, vocab_size, size=length).tolist()


@torch.no_grad()
def length_scores(
    lengths: Sequence[int], seeds: Sequence[int], base: GPTConfig | None = None,
    n_seqs: int = 1, vocab_size: int | None = None,
) -> tuple[pd.DataFrame, float]:
    """Adjacency score per layer of prefixes of ``n_seqs`` long sequences per seed, every length.

    Seed s initialises the model and draws its sequences (``length_tokens`` with seeds
    s * n_seqs + n); ``vocab_size`` switches to i.i.d. ids and widens the model's vocabulary. A
    causal model's hidden state at position i depends only on positions <= i, so the states of
    a prefix of length T are the first T states of the full sequence: one forward pass at
    max(lengths) gives every length exactly. Returns (DataFrame with columns ``seed``, ``seq``,
    ``length``, ``layer``, ``score``; wall-clock seconds of ``adjacency_score`` on all layers of
    the longest sequence, for the first sequence).
    """
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if n_seqs < 1:
        raise ValueError(f"n_seqs={n_seqs!r} must be >= 1")
    if min(lengths) < 3:
        raise ValueError(f"lengths={list(lengths)!r} must all be >= 3")
    T_max = max(lengths)
    base = base or GPTConfig()
    if not base.causal:
        raise ValueError("length_scores scores prefixes, which needs causal=True")
    config = replace(base, block_size=max(base.block_size, T_max))
    if vocab_size is not None:
        config = replace(config, vocab_size=vocab_size)
    rows, seconds = [], float("nan")
    for seed in seeds:
        model = random_model(config, seed=seed)
        for n in range(n_seqs):
            tokens = length_tokens(T_max, seed * n_seqs + n, vocab_size)
            states = model.hidden_states(torch.tensor([tokens])).float()  # [L+1, 1, T, d]
            C = cosine_similarity_matrix(states[:, 0]).numpy()  # [L+1, T_max, T_max]
            for T in sorted(lengths):
                start = time.perf_counter()
                scores = adjacency_score(C[:, :T, :T])  # [L+1]
                if T == T_max and np.isnan(seconds):
                    seconds = time.perf_counter() - start
                rows += [dict(seed=seed, seq=n, length=T, layer=layer, score=s)
                         for layer, s in enumerate(scores)]
    return pd.DataFrame(rows), seconds


def slider_frames(
    text: str, stds: Sequence[float], seed: int = 0, base: GPTConfig | None = None
) -> tuple[dict[tuple[float, int], np.ndarray], dict[tuple[float, int], float]]:
    """Similarity matrix and adjacency score of ``text`` at every (σ, layer), for static sliders.

    ``stds`` replace ``init_std`` of ``base``; returns ({(σ, layer): [T, T]},
    {(σ, layer): score}).
    """
    base = base or GPTConfig()
    matrices, scores = {}, {}
    for std in stds:
        mats = similarity_matrices(random_model(base, seed=seed, init_std=std), text)  # [L+1, T, T]
        for layer, (m, s) in enumerate(zip(mats, adjacency_score(mats))):
            matrices[std, layer], scores[std, layer] = m, float(s)
    return matrices, scores


# ---------------------------------------------------------------------------------------------
# tolerances from the spread over seeds


def student_t_quantile(q: float, df: int) -> float:
    """The q quantile (0.5 < q < 1) of Student's t with df degrees of freedom, by bisection on
    its CDF, 1/2 + the integral of the density from 0 (Simpson's rule on 4001 points)."""
    if not 0.5 < q < 1:
        raise ValueError(f"q={q!r} must lie in (0.5, 1)")
    if not (isinstance(df, (int, np.integer)) and df >= 1):
        raise ValueError(f"df={df!r} must be a positive integer")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(x**2 / df))
        h = t / 4000
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < q:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def seed_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-seed values and two half-widths from their spread (Student t, n - 1 df):
    (mean, t sd / sqrt(n) for the mean, t sd sqrt(1 + 1/n) for one new seed's value)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"values must hold >= 2 per-seed values; got shape {x.shape}")
    t = student_t_quantile(0.5 + level / 2, x.size - 1)
    sd = float(x.std(ddof=1))
    return float(x.mean()), t * sd / math.sqrt(x.size), t * sd * math.sqrt(1 + 1 / x.size)
