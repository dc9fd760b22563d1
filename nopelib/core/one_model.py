"""Inputs, random models, and what one model shows: similarity matrices, one layer.

The inputs the chapters read (a task's longest input, a long sequence's tokens, the texts of
a study), a randomly initialised model of a configuration and seed, the similarity matrices of
every layer on one input, and the permutation control. (The learned criterion of a run is a
rule: ``nopelib.rules.claims.is_learned``.)
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import torch

from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.tasks import TASKS, encode_inputs, get_task, sample_inputs


def random_model(config: GPTConfig | None = None, seed: int = 0,
                 device: str | torch.device = "cpu", **overrides) -> GPT:
    """A freshly initialised model in eval mode; ``overrides`` replace fields of ``config``."""
    if type(seed) is not int or not 0 <= seed < 2**63:  # torch.manual_seed's range
        raise ValueError(f"seed={seed!r} must be an integer in [0, 2**63)")
    config = replace(config or GPTConfig(), **overrides)
    torch.manual_seed(seed)
    return GPT(config).to(device).eval()


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


@torch.no_grad()
def similarity_matrices(model: GPT, text: str) -> np.ndarray:
    """Self-cosine-similarity matrix of one text at every layer: [n_layer + 1, T, T]."""
    idx, _ = encode_inputs([text])
    states = model.hidden_states(idx.to(next(model.parameters()).device)).float().cpu()
    return cosine_similarity_matrix(states[:, 0]).numpy()


@torch.no_grad()
def permutation_gap(model: GPT, text: str, seed: int = 0) -> float:
    """Largest |h(x)[perm] - h(x[perm])| over every layer, position and feature, for one random
    permutation of the positions of ``text`` (drawn with ``seed``): 0 up to float rounding for
    a permutation-equivariant model (bidirectional attention without a position encoding)."""
    idx, _ = encode_inputs([text])  # [1, T]
    perm = torch.randperm(idx.shape[1], generator=torch.Generator().manual_seed(seed))
    h = model.hidden_states(idx)  # [L+1, 1, T, d]
    h_perm = model.hidden_states(idx[:, perm])
    return (h[:, :, perm] - h_perm).abs().max().item()


def layer_matrix(text: str, layer: int, base: GPTConfig | None = None, seed: int = 0,
                 **overrides) -> tuple[np.ndarray, float]:
    """Similarity matrix [T, T] of ``text`` at one layer of a fresh random model (``base`` with
    ``overrides``, e.g. ``init_std``), and its adjacency score."""
    matrix = similarity_matrices(random_model(base, seed=seed, **overrides), text)[layer]
    return matrix, float(adjacency_score(matrix))


def study_texts(inputs_per_task: int, seed: int) -> list[str]:
    """The inputs a study scores for one seed: ``inputs_per_task`` of every task, in task order
    (drawn with the seed, as in the Figure 1 study)."""
    return [t for task in TASKS for t in sample_inputs(task, inputs_per_task, seed=seed)]


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
