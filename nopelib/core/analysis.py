"""Adjacency scores of random models: one model's layers, then studies over many models.

The first half measures one model (``layer_scores``, ``similarity_matrices``); the second half
states the chapters' studies in one call each (``config_scores``, ``task_scores``,
``length_scores``, ``slider_frames``) as long pandas DataFrames, one row per (configuration,
seed, layer), so ``groupby`` gives the mean and spread over seeds and a chapter keeps its cells
short. Every study builds freshly initialised models with ``random_model``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix, layer_scores
from nopelib.core.model import GPTConfig
from nopelib.core.stats import summarize
from nopelib.core.tasks import TASKS, sample_inputs
from nopelib.core.one_model import length_tokens, random_model, similarity_matrices, study_texts

# ---------------------------------------------------------------------------------------------
# inputs and models


# ---------------------------------------------------------------------------------------------
# one model


# ---------------------------------------------------------------------------------------------
# studies over many random models


# the controls' (causal, position encoding) pairs: NoPE, bidirectional NoPE, and the encodings
CONTROL_VARIANTS = ((True, "none"), (False, "none"), (True, "learned"), (True, "sinusoidal"),
                    (True, "rope"), (True, "alibi"))


def init_overrides(means: Sequence[float], stds: Sequence[float]) -> list[dict]:
    """The initialisation study's configurations: both readings ("embedding": the token
    embedding only; "all": every weight) at every (mean, std)."""
    return [dict(init_target=r, init_mean=m, init_std=s)
            for r in ("embedding", "all") for m in means for s in stds]


def grid_overrides(layers: Sequence[int], widths: Sequence[int]) -> list[dict]:
    """The depth-and-width grid's configurations."""
    return [dict(n_layer=L, n_embd=W) for L in layers for W in widths]


def control_overrides() -> list[dict]:
    """The controls' configurations (``CONTROL_VARIANTS``)."""
    return [dict(causal=c, pos_encoding=p) for c, p in CONTROL_VARIANTS]


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
    by default the values are joined. The result is what ``random_init.score_lines`` draws.
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


# ---------------------------------------------------------------------------------------------
# outcomes against the spread over seeds


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
