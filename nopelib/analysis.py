"""Hidden-state analysis shared by the chapters: random models, task inputs, per-layer scores."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import numpy as np
import torch

from nopelib.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.model import GPT, GPTConfig
from nopelib.tasks import encode_inputs, get_task


def random_model(config: GPTConfig | None = None, seed: int = 0, device: str | torch.device = "cpu",
                 **overrides) -> GPT:
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


@torch.no_grad()
def hidden_states_by_length(model: GPT, texts: list[str]) -> dict[int, tuple[list[int], torch.Tensor]]:
    """Hidden states of the texts, batched by length (no padding enters any state).

    Returns {length T: (indices into texts, states [n_layer + 1, B, T, n_embd])}.
    """
    groups: dict[int, list[int]] = defaultdict(list)
    for i, text in enumerate(texts):
        groups[len(text)].append(i)
    device = next(model.parameters()).device
    out = {}
    for T, members in sorted(groups.items()):
        idx, _ = encode_inputs([texts[i] for i in members])
        out[T] = (members, model.hidden_states(idx.to(device)).float().cpu())
    return out


def layer_scores(model: GPT, texts: list[str]) -> np.ndarray:
    """Adjacency score of every text at every layer: [len(texts), n_layer + 1]."""
    scores = np.empty((len(texts), model.config.n_layer + 1))
    for T, (members, states) in hidden_states_by_length(model, texts).items():
        if T < 3:
            raise ValueError(f"texts of length {T} have no row with two earlier positions; need >= 3")
        C = cosine_similarity_matrix(states)  # [L+1, B, T, T]
        scores[members] = adjacency_score(C).T
    return scores


def similarity_matrices(model: GPT, text: str) -> np.ndarray:
    """Self-cosine-similarity matrix of one text at every layer: [n_layer + 1, T, T]."""
    (_, states), = hidden_states_by_length(model, [text]).values()
    return cosine_similarity_matrix(states[:, 0]).numpy()


def summarize(scores: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation along ``axis`` (ddof=1 where there are >= 2 values)."""
    n = scores.shape[axis]
    return scores.mean(axis=axis), (scores.std(axis=axis, ddof=1) if n > 1 else np.zeros_like(scores.mean(axis=axis)))
