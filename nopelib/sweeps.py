"""Sweeps over random models: adjacency scores per layer as long pandas DataFrames.

Each sweep builds freshly initialised models (``nopelib.analysis.random_model``), runs task
inputs through them and scores every layer, so a chapter can state a study in one call and
keep its cells short. Rows are one (configuration, seed, layer); the configuration fields
that a sweep varies are columns, so ``groupby`` gives the mean and spread over seeds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from nopelib.analysis import layer_scores, random_model, sample_inputs, similarity_matrices
from nopelib.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.model import GPT, GPTConfig
from nopelib.tasks import TASKS, encode_inputs, get_task


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
            texts = [t for task in TASKS for t in sample_inputs(task, inputs_per_task, seed=seed)]
            scores = batch_layer_scores(model, texts).mean(0)  # [n_layer + 1]: equal inputs per task
            rows += [dict(fields, seed=seed, layer=layer, score=s) for layer, s in enumerate(scores)]
            del model
    return pd.DataFrame(rows)


@torch.no_grad()
def batch_layer_scores(model: GPT, texts: list[str]) -> np.ndarray:
    """``layer_scores`` in one forward pass: [len(texts), n_layer + 1].

    In a causal model the state at position i depends only on positions <= i, so right padding
    never reaches a text's own positions and one padded batch gives every text's states exactly
    (up to float rounding). A bidirectional model lets padding in, so it falls back to
    ``layer_scores``, which batches by length.
    """
    if not model.config.causal:
        return layer_scores(model, texts)
    idx, lengths = encode_inputs(texts)  # [B, T_max] right-padded, [B]
    states = model.hidden_states(idx.to(next(model.parameters()).device)).float().cpu()  # [L+1, B, T_max, d]
    scores = np.empty((len(texts), model.config.n_layer + 1))
    for T in sorted(set(lengths.tolist())):
        if T < 3:
            raise ValueError(f"texts of length {T} have no row with two earlier positions; need >= 3")
        members = (lengths == T).nonzero().flatten()
        C = cosine_similarity_matrix(states[:, members, :T])  # [L+1, b, T, T]
        scores[members.numpy()] = adjacency_score(C).T
    return scores


def mean_std_table(scores: pd.DataFrame, by: Sequence[str], digits: int = 3) -> pd.DataFrame:
    """One row per configuration in ``by``, one column per layer, cells "mean ± std" over seeds."""
    stats = scores.groupby([*by, "layer"]).score.agg(["mean", "std"]).fillna(0.0)
    cells = stats["mean"].map(f"{{:.{digits}f}}".format) + " ± " + stats["std"].map(f"{{:.{digits}f}}".format)
    return cells.unstack("layer")


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


@torch.no_grad()
def length_scores(
    lengths: Sequence[int], seeds: Sequence[int], base: GPTConfig | None = None
) -> tuple[pd.DataFrame, float]:
    """Adjacency score per layer of prefixes of one long sequence per seed, for every length.

    A causal model's hidden state at position i depends only on positions <= i, so the states
    of a prefix of length T are the first T states of the full sequence: one forward pass at
    max(lengths) gives every length exactly. Returns (DataFrame with columns ``seed``,
    ``length``, ``layer``, ``score``; wall-clock seconds of ``adjacency_score`` on all layers of
    the longest sequence, for the first seed).
    """
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if min(lengths) < 3:
        raise ValueError(f"lengths={list(lengths)!r} must all be >= 3")
    T_max = max(lengths)
    base = base or GPTConfig()
    if not base.causal:
        raise ValueError("length_scores scores prefixes, which needs causal=True")
    config = replace(base, block_size=max(base.block_size, T_max))
    rows, seconds = [], float("nan")
    for seed in seeds:
        model = random_model(config, seed=seed)
        idx, _ = encode_inputs([long_sequence(T_max, seed)])
        C = cosine_similarity_matrix(model.hidden_states(idx)[:, 0]).numpy()  # [L+1, T_max, T_max]
        del model
        for T in sorted(lengths):
            start = time.perf_counter()
            scores = adjacency_score(C[:, :T, :T])  # [L+1]
            if T == T_max and seed == seeds[0]:
                seconds = time.perf_counter() - start
            rows += [dict(seed=seed, length=T, layer=layer, score=s) for layer, s in enumerate(scores)]
    return pd.DataFrame(rows), seconds


def slider_frames(
    text: str, stds: Sequence[float], seed: int = 0, base: GPTConfig | None = None
) -> tuple[dict[tuple[float, int], np.ndarray], dict[tuple[float, int], float]]:
    """Similarity matrix and adjacency score of ``text`` at every (σ, layer), for static sliders.

    ``stds`` replace ``init_std`` of ``base``; returns ({(σ, layer): [T, T]}, {(σ, layer): score}).
    """
    base = base or GPTConfig()
    matrices, scores = {}, {}
    for std in stds:
        mats = similarity_matrices(random_model(base, seed=seed, init_std=std), text)  # [L+1, T, T]
        for layer, (m, s) in enumerate(zip(mats, adjacency_score(mats))):
            matrices[std, layer], scores[std, layer] = m, float(s)
    return matrices, scores
