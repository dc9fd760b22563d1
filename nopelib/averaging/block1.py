"""Block 1 of a random model, read from its hook points: the quantities the averaging theory uses.

The value scale of a configuration, block 1's activations and scores (with and without the
embedding), the sweeps over the initialisation's sigma, and the threshold study: each builds or
runs a GPT and reads ``run_with_cache``'s named hook points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from nopelib.averaging.theory import coincidence_counts
from nopelib.core.metrics import (adjacency_row_scores, adjacency_score, cosine_similarity_matrix,
                                  length_groups)
from nopelib.core.model import GPT
from nopelib.core.tasks import encode_inputs
from nopelib.core.one_model import random_model


@torch.no_grad()
def measure_value_scale(model: GPT, idx: torch.Tensor) -> float:
    """RMS norm of one projected value vector of block 1, from its attention output.

    Under uniform attention |a_k|^2 = s^2 n_kk / k^2 (repeats counted), so s^2 is estimated as
    the mean of |a_k|^2 k^2 / n_kk over the batch idx [B, T] (no padding) and all positions.
    Position 1 alone would be exact (it attends only to itself) but sees only the first token.
    """
    name = "blocks.0.hook_attn_out"
    _, cache = model.run_with_cache(idx, [name], attn_impl="fused", stop_at_layer=1)
    a = cache[name].double()  # [B, T, d]
    k2 = torch.arange(1, idx.shape[1] + 1, dtype=torch.float64) ** 2  # [T]
    n_kk = torch.stack([torch.tensor(np.diag(coincidence_counts(row.tolist()))) for row in idx])
    return float(((a.pow(2).sum(-1) * k2 / n_kk).mean()).sqrt())  # n_kk: [B, T]


@torch.no_grad()
def block1_activations(model: GPT, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run only block 1 of a NoPE model on idx [B, T] (no padding) and return its pieces.

    {"embedding": e [B, T, d], "attn_out": a [B, T, d] (c_proj's output, before the residual
    add), "hidden": h1 [B, T, d] (the residual stream after block 1, MLP included), "weights":
    [B, H, T, T] attention probabilities}. Skipping blocks 2..L makes a sweep over many models
    affordable.
    """
    if model.config.pos_encoding != "none":
        raise ValueError(f"pos_encoding={model.config.pos_encoding!r}: block1_activations "
                         "models NoPE only ('none')")
    names = {"embedding": "blocks.0.hook_resid_pre", "attn_out": "blocks.0.hook_attn_out",
             "hidden": "blocks.0.hook_resid_post", "weights": "blocks.0.attn.hook_pattern"}
    _, cache = model.run_with_cache(idx, list(names.values()), stop_at_layer=1)
    return {key: cache[name] for key, name in names.items()}


def block1_scores(model: GPT, texts: Sequence[str]) -> np.ndarray:
    """Layer-1 adjacency score of each text for h = e + a (the model of
    ``nopelib.averaging.theory``: block 1 without its MLP) and for the real h1: [len(texts), 2].
    Texts are batched by length."""
    out = np.empty((len(texts), 2))
    for members in length_groups(texts).values():
        idx, _ = encode_inputs([texts[n] for n in members])
        act = block1_activations(model, idx)
        states = torch.stack([act["embedding"] + act["attn_out"], act["hidden"]])  # [2, B, T, d]
        out[members] = adjacency_score(cosine_similarity_matrix(states)).T
    return out


def sigma_sweep(sigmas: Sequence[float], n_seeds: int, texts: Sequence[str],
                long_texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Block 1 of random NoPE base models (seeds 0..n_seeds-1) at every embedding std in sigmas.

    Returns {"scores": [σ, seed, 2] layer-1 scores of e + a and of h1, mean over ``texts``;
    "rows": [σ, T-2] row scores k = 2..T-1 of h1 on ``long_texts`` (all of one length T), mean
    over texts and seeds; "cosine": [σ, T, T] the h1 cosine matrix of the first long text,
    seed 0}: every measurement the chapter sets beside its prediction.
    """
    idx, _ = encode_inputs(list(long_texts))  # [n_long, T]
    T = idx.shape[1]
    scores = np.empty((len(sigmas), n_seeds, 2))
    rows = np.empty((len(sigmas), T - 2))
    cosine = np.empty((len(sigmas), T, T))
    for n, sigma in enumerate(sigmas):
        row_scores = []
        for seed in range(n_seeds):
            model = random_model(seed=seed, init_std=float(sigma))
            scores[n, seed] = block1_scores(model, texts).mean(0)
            C = cosine_similarity_matrix(block1_activations(model, idx)["hidden"])  # [n, T, T]
            row_scores.append(adjacency_row_scores(C)[:, 2:])  # rows 0, 1 have no pair
            if seed == 0:
                cosine[n] = C[0].numpy()
        rows[n] = np.concatenate(row_scores).mean(axis=0)
    return {"scores": scores, "rows": rows, "cosine": cosine}


def block1_three_scores(model: GPT, texts: Sequence[str]) -> np.ndarray:
    """Layer-1 scores of e, e + a and h1 for each text: [len(texts), 3].

    One right-padded batch serves every length: with causal attention a text's positions never
    see the padding after them (``metrics.layer_scores`` relies on the same fact); only float
    rounding differs from a batch per length, which can flip a near-tie of repeated tokens.
    """
    out = np.empty((len(texts), 3))
    idx, _ = encode_inputs(list(texts))  # [B, T_max], right-padded
    act = block1_activations(model, idx)
    e = act["embedding"]  # [B, T_max, d]
    states = torch.stack([e, e + act["attn_out"], act["hidden"]])  # [3, B, T_max, d]
    for T, members in length_groups(texts).items():
        C = cosine_similarity_matrix(states[:, members, :T])  # [3, b, T, T]
        out[members] = adjacency_score(C).T
    return out


def unit_embedding(model: GPT) -> torch.Tensor:
    """The token embedding divided by its init std: the N(0, 1) draw that ``random_model``
    scales by ``init_std`` (drawn last when the model initialises), so the same seed at another
    sigma is this table times sigma."""
    return model.transformer.wte.weight.detach().clone() / model.config.init_std


@torch.no_grad()
def threshold_study(archs: Sequence[tuple[int, int]], texts: Mapping[str, Sequence[str]],
                    sigmas: Sequence[float], n_seeds: int,
                    long_texts: Sequence[str]) -> dict[str, object]:
    """Layer-1 scores of random NoPE models of several architectures over a sigma grid.

    ``archs`` holds (n_layer, n_embd); ``texts`` maps each task to its inputs. Each seed's model
    is built once and its token embedding rescaled to every sigma (the same draw times sigma,
    which is what ``random_model(init_std=sigma)`` gives for that seed). Block 1 is all that
    is run: depth enters it only through c_proj's init std 0.02/sqrt(2 n_layer).

    Returns {"scores": DataFrame with one row per (n_layer, n_embd, task, seed, sigma) and the
    mean scores of e alone ("e"), of e + a ("ea") and of the real h1 ("h1") over the task's
    texts; "s_inf":
    DataFrame (n_layer, n_embd, s_inf), the value scale of seed 0 measured on ``long_texts``
    (all of one length) at sigma = 0.2, as the chapter measures it for the default model}.
    """
    if not isinstance(n_seeds, (int, np.integer)) or n_seeds < 1:
        raise ValueError(f"n_seeds={n_seeds!r} must be a positive integer")
    long_idx, _ = encode_inputs(list(long_texts))  # [n_long, T]
    all_texts = [text for task_texts in texts.values() for text in task_texts]
    owner, start = {}, 0  # task -> indices of its texts in all_texts
    for task, task_texts in texts.items():
        owner[task] = list(range(start, start + len(task_texts)))
        start += len(task_texts)
    rows, scales = [], []
    for n_layer, n_embd in archs:
        for seed in range(n_seeds):
            model = random_model(seed=seed, n_layer=n_layer, n_embd=n_embd)
            unit = unit_embedding(model)  # [vocab, d]
            if seed == 0:
                model.transformer.wte.weight.copy_(unit * 0.2)
                scales.append((n_layer, n_embd, measure_value_scale(model, long_idx)))
            for sigma in sigmas:
                model.transformer.wte.weight.copy_(unit * float(sigma))
                scores = block1_three_scores(model, all_texts)  # [texts, 3]
                for task, members in owner.items():
                    e, ea, h1 = scores[members].mean(0)
                    rows.append((n_layer, n_embd, task, seed, float(sigma), e, ea, h1))
    columns = ["n_layer", "n_embd", "task", "seed", "sigma", "e", "ea", "h1"]
    return {"scores": pd.DataFrame(rows, columns=columns),
            "s_inf": pd.DataFrame(scales, columns=["n_layer", "n_embd", "s_inf"])}
