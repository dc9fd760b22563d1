"""The studies that test the averaging theory on random NoPE models.

The studies that test the averaging theory on models: random NoPE models beside the closed
forms of ``nopelib.averaging.theory``.

Every function here builds or runs a GPT, or sets a study's measurements beside a prediction:
block 1's pieces read from the hook points (``block1_activations``), the value scale
(``measure_value_scale``), the sigma sweep and the threshold study of the averaging chapter,
and the closed-form predictions on the very inputs ``analysis`` scores (the depth-and-width
grid and the length study of the random-initialisation chapter). The chapters call these in
one line each, so their cells show the argument and not the bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from nopelib.averaging.theory import (embedding_ratio, gram_cosine, layer0_expected_score,
                                      predict_layer1_score, residual_gram, sigma_at_level)
from nopelib.averaging.theory_config import closed_form_ratio, predict_config_score
from nopelib.core.metrics import cosine_similarity_matrix, layer_scores
from nopelib.core.model import GPTConfig
from nopelib.core.stats import normal_interval, pooled_sd, seed_interval
from nopelib.core.tasks import encode, encode_inputs, sample_inputs
from nopelib.averaging.block1 import block1_activations, measure_value_scale
from nopelib.core.one_model import length_tokens, random_model, study_texts

# ---------------------------------------------------------------------------------------------
# block 1 of a random model, read from its hook points


# ---------------------------------------------------------------------------------------------
# the averaging chapter: its checks on block 1, the threshold study, the large-sigma excess


def attention_entropy(acts: Sequence[Mapping[str, torch.Tensor]]) -> np.ndarray:
    """Entropy (nats) of block 1's attention at each query position k, mean over models,
    inputs and heads: [T]. ``acts`` holds one ``block1_activations`` result per model, each
    with "weights" [B, H, T, T]; uniform attention over k keys has the maximum, log k."""
    p = torch.stack([a["weights"] for a in acts])  # [models, B, H, T, T]
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [models, B, H, T]
    return entropy.mean(dim=(0, 1, 2)).numpy()


def h1_against_theory(sigma: float, length: int, idx: torch.Tensor, tokens: Sequence[int],
                      s_inf: float) -> tuple[np.ndarray, np.ndarray]:
    """The h1 cosine matrix of a random base model (seed 0) with embedding std ``sigma``, on
    the first ``length`` positions of the input idx [1, T], beside the expected cosine of
    h = e + a for its ``tokens``: ([length, length], [length, length])."""
    model = random_model(seed=0, init_std=sigma)
    h1 = block1_activations(model, idx[:1, :length])["hidden"][0]  # [length, d]
    rho = float(embedding_ratio(sigma, s_inf, model.config.n_embd))
    expected = gram_cosine(residual_gram(list(tokens)[:length], rho))
    return cosine_similarity_matrix(h1).numpy(), expected


def threshold_crossings(study: Mapping[str, pd.DataFrame], texts: Mapping[str, Sequence[str]],
                        sigmas: Sequence[float], level: float) -> pd.DataFrame:
    """Where each (architecture, task) cell of ``threshold_study`` crosses the score ``level``.

    ``study`` is the study's result, ``texts`` and ``sigmas`` its arguments. One row per cell:
    "arch" ("6x384"), "task", "pred" (the sigma at which ``predict_layer1_score``, with the
    cell's measured s_inf, crosses ``level``), and "log_ea", "log_h1": arrays [seeds] of the
    log sigma at which each seed's e + a and h1 curves cross it (``sigma_at_level`` on the same
    grid, so prediction and measurement share the grid's interpolation).
    """
    s_arch = {(r.n_layer, r.n_embd): r.s_inf for r in study["s_inf"].itertuples()}
    cells = []
    for (n_layer, n_embd, name), g in study["scores"].groupby(["n_layer", "n_embd", "task"]):
        toks = [encode(t) for t in texts[name]]
        pred_curve = [predict_layer1_score(toks, s, s_arch[n_layer, n_embd], n_embd)
                      for s in sigmas]
        row = {"arch": f"{n_layer}x{n_embd}", "task": name,
               "pred": sigma_at_level(sigmas, pred_curve, level)}
        for col in ("ea", "h1"):
            per_seed = [sigma_at_level(sigmas, s.sort_values("sigma")[col], level)
                        for _, s in g.groupby("seed")]
            row[f"log_{col}"] = np.log(per_seed)
        cells.append(row)
    return pd.DataFrame(cells)


def crossing_tests(table: pd.DataFrame, n_se: float = 3) -> pd.DataFrame:
    """The threshold test of each cell of ``threshold_crossings``, for e + a and for h1.

    The seeds' log crossings give a pooled sd over all cells (``stats.pooled_sd``); a cell
    passes when the log of predicted over measured crossing lies within ``n_se`` standard
    errors of the mean, pooled sd / sqrt(seeds). Adds, for col in ea, h1: "<col>_meas" (the
    geometric mean crossing over seeds), "<col>_tol", "<col>_dev" (log(pred / meas)) and
    "<col>_ok"; returns a new frame.
    """
    table = table.copy()
    for col in ("ea", "h1"):
        logs = np.stack(table[f"log_{col}"])  # [cells, seeds]
        table[f"{col}_meas"] = np.exp(logs.mean(axis=1))
        table[f"{col}_tol"] = n_se * pooled_sd(logs) / math.sqrt(logs.shape[1])
        table[f"{col}_dev"] = np.log(table["pred"] / table[f"{col}_meas"])
        table[f"{col}_ok"] = table[f"{col}_dev"].abs() < table[f"{col}_tol"]
    return table


def excess_table(scores: pd.DataFrame, token_seqs: Sequence[Sequence[int]], s_inf: float,
                 d: int, z: float = 1.96) -> pd.DataFrame:
    """The large-sigma study against its expectations, one row per sigma.

    ``scores`` is ``threshold_study(...)["scores"]`` of one architecture and task (one row per
    seed and sigma). Columns: "sigma", "predicted" (``predict_layer1_score`` of e + a),
    "layer-0 exact" (``layer0_expected_score`` of the embedding alone, mean over
    ``token_seqs``), and for each of e, ea, h1 its "mean", "lo", "hi" (the normal interval
    mean ± z SE over seeds, ``stats.normal_interval``) and "sd".
    """
    exact0 = np.mean([layer0_expected_score(t) for t in token_seqs])
    rows = []
    for s, g in scores.groupby("sigma"):
        row = {"sigma": s, "predicted": predict_layer1_score(token_seqs, s, s_inf, d),
               "layer-0 exact": exact0}
        for col in ("e", "ea", "h1"):
            m, lo, hi, sd = normal_interval(g[col], z)
            row.update({f"{col} mean": m, f"{col} lo": lo, f"{col} hi": hi, f"{col} sd": sd})
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the random-initialisation chapter: closed-form predictions beside the studies of ``analysis``


def predicted_config_scores(overrides: Sequence[dict[str, object]], seeds: Sequence[int],
                            inputs_per_task: int, base: GPTConfig | None = None
                            ) -> pd.DataFrame:
    """``predict_config_score`` on the very inputs ``analysis.config_scores`` scores: one row
    per configuration and seed, columns the override keys, ``seed``, ``predicted``."""
    base = base or GPTConfig()
    rows = []
    for fields in overrides:
        config = replace(base, **fields)
        for seed in seeds:
            seqs = [encode(t) for t in study_texts(inputs_per_task, seed)]
            rows.append(dict(fields, seed=seed, predicted=predict_config_score(config, seqs)))
    return pd.DataFrame(rows)


def prediction_table(scores: pd.DataFrame, predicted: pd.DataFrame, level: float,
                     base: GPTConfig | None = None) -> pd.DataFrame:
    """Layer-1 measurement against prediction, one row per (n_layer, n_embd) configuration.

    ``scores`` is ``analysis.config_scores`` of a depth-and-width grid, ``predicted``
    ``predicted_config_scores`` of the same grid and seeds. Columns: "config" ("6 × 384"),
    "rho" (``closed_form_ratio``), "predicted" (mean over seeds), "measured" (mean over
    seeds), "sd" (of the measured scores), "residual" (mean of measured minus predicted per
    seed), "tol_mean" and "tolerance" (``stats.seed_interval``'s half-widths at ``level``: for
    the mean residual, and for one new seed's), "min_deep" (the lowest mean score of a layer
    >= 1).
    """
    base = base or GPTConfig()
    l1 = scores[scores.layer == 1].merge(predicted, on=["n_layer", "n_embd", "seed"])
    l1["residual"] = l1.score - l1.predicted  # per seed
    rows = []
    for (L, W), f in l1.groupby(["n_layer", "n_embd"]):
        measured, _, _ = seed_interval(f.score, level)
        residual, tol_mean, tol_one = seed_interval(f.residual, level)
        deep = scores[(scores.n_layer == L) & (scores.n_embd == W) & (scores.layer >= 1)]
        rows.append(dict(config=f"{L} × {W}",
                         rho=closed_form_ratio(replace(base, n_layer=L, n_embd=W)),
                         predicted=f.predicted.mean(), measured=measured,
                         sd=f.score.std(ddof=1), residual=residual, tol_mean=tol_mean,
                         tolerance=tol_one,
                         min_deep=deep.groupby("layer").score.mean().min()))
    return pd.DataFrame(rows)


def config_listing(rows: pd.DataFrame) -> str:
    """The configurations of ``prediction_table`` rows as text: "6 × 384 (measured 0.912,
    predicted 0.934); ...", or "none"."""
    return "; ".join(f"{r.config} (measured {r.measured:.3f}, "
                     f"predicted {r.predicted:.3f})"
                     for r in rows.itertuples()) or "none"


def length_predictions(sources: Mapping[str, int | None], lengths: Sequence[int],
                       seeds: Sequence[int], n_seqs: int, base: GPTConfig,
                       max_triples: int = 20_000) -> pd.DataFrame:
    """``predict_config_score`` of layer 1 on the sequences ``analysis.length_scores`` scores.

    ``sources`` maps a kind of sequence to its ``vocab_size`` (None: the task alphabet); for
    each kind, seed s and sequence n the tokens are ``length_tokens(max(lengths),
    s * n_seqs + n, vocab_size)``, predicted at each prefix length (estimated from
    ``max_triples`` sampled comparisons where a prefix has more). Columns "source", "seed",
    "seq", "length", "predicted".
    """
    rows = []
    for name, vocab in sources.items():
        for seed in seeds:
            for n in range(n_seqs):
                tokens = length_tokens(max(lengths), seed * n_seqs + n, vocab)
                rows += [dict(source=name, seed=seed, seq=n, length=T,
                              predicted=predict_config_score(base, [tokens[:T]],
                                                             max_triples=max_triples))
                         for T in lengths]
    return pd.DataFrame(rows)


def length_series(runs: Mapping[str, pd.DataFrame], predicted: pd.DataFrame,
                  layers: Sequence[int]
                  ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """What ``random_init.length_study`` draws: ({"<kind>, layer <l>": (mean, std) over sequences
    against length}, {"<kind>, layer 1 predicted": mean prediction against length}).
    ``runs`` maps each kind to its ``analysis.length_scores`` frame, ``predicted`` is
    ``length_predictions``."""
    measured, pred_lines = {}, {}
    for name, frame in runs.items():
        for layer in layers:
            per_len = frame[frame.layer == layer].groupby("length").score
            measured[f"{name}, layer {layer}"] = (per_len.mean().to_numpy(),
                                                  per_len.std().to_numpy())
        by_length = predicted[predicted.source == name].groupby("length").predicted
        pred_lines[f"{name}, layer 1 predicted"] = by_length.mean().to_numpy()
    return measured, pred_lines


def length_residuals(runs: Mapping[str, pd.DataFrame], predicted: pd.DataFrame
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Layer-1 measurement beside prediction in the length study.

    Returns (one row per kind, seed, sequence and length with "score", "predicted" and
    "residual" = score - predicted; the mean over sequences per kind and length: "measured",
    "sd", "predicted", "residual")."""
    both = pd.concat([f.assign(source=name) for name, f in runs.items()])
    both = both[both.layer == 1].merge(predicted, on=["source", "seed", "seq", "length"])
    both["residual"] = both.score - both.predicted
    summary = both.groupby(["source", "length"]).agg(
        measured=("score", "mean"), sd=("score", "std"), predicted=("predicted", "mean"),
        residual=("residual", "mean"))
    return both, summary


def length_falls(both: pd.DataFrame, short: int, long: int, level: float) -> pd.DataFrame:
    """How far layer 1 falls from length ``short`` to ``long``, per kind of sequence.

    ``both`` is the first frame of ``length_residuals``. One row per kind (indexed by it, in
    the order of ``both``): "fall" and "half", the mean fall over sequences and the half-width
    of its interval at ``level`` (``stats.seed_interval``: Student t over sequences);
    "predicted" and "predicted_min", the mean and the smallest predicted fall.
    """
    rows = {}
    for name in dict.fromkeys(both.source):
        per_seq = both[both.source == name].pivot_table(index=["seed", "seq"],
                                                        columns="length",
                                                        values=["score", "predicted"])
        fall = per_seq["score"][short] - per_seq["score"][long]  # per sequence
        mean_fall, half, _ = seed_interval(fall, level)
        pred_fall = per_seq["predicted"][short] - per_seq["predicted"][long]
        rows[name] = dict(fall=mean_fall, half=half, predicted=float(pred_fall.mean()),
                          predicted_min=float(pred_fall.min()))
    return pd.DataFrame.from_dict(rows, orient="index")


# the initial pattern of a trained profile's architecture (the trained chapter)
INIT_INPUTS = 16  # task inputs per task for the initial-pattern measurement

INIT_SEED = 99  # their seed

VALUE_SCALE_INPUT_SEED = 98  # the reversal input the value scale is measured on

VALUE_SCALE_STD = 0.2  # init std of the model that measures the value scale (sigma^2 >> eps)



def init_row(name: str, config: GPTConfig, tasks: Sequence[str],
             seeds: Sequence[int]) -> dict:
    """The initial pattern of one architecture: its embedding ratio rho, the layer-1 score the
    averaging theory predicts from it (nothing fitted), and the mean layer-1 score measured on
    ``INIT_INPUTS`` inputs of every task over the initialisations of ``seeds``."""
    texts = [t for task in tasks for t in sample_inputs(task, INIT_INPUTS, seed=INIT_SEED)]
    ids = [encode_inputs([t])[0][0].tolist() for t in texts]
    probe_idx, _ = encode_inputs(
        sample_inputs("reversal", 8, seed=VALUE_SCALE_INPUT_SEED)[:1])
    big = random_model(config, seed=0, init_std=VALUE_SCALE_STD)  # the value scale
    s_inf = measure_value_scale(big, probe_idx)
    rho = float(embedding_ratio(config.init_std, s_inf, config.n_embd))
    measured = np.mean([layer_scores(random_model(config, seed=s), texts)[:, 1].mean()
                        for s in seeds])
    predicted = predict_layer1_score(ids, config.init_std, s_inf, config.n_embd)
    return dict(model=name, layers=config.n_layer, width=config.n_embd,
                sigma_e=config.init_std, rho=rho, predicted=predicted,
                measured=measured)



def initial_pattern(configs: Mapping[str, GPTConfig], tasks: Sequence[str],
                    seeds: Sequence[int]) -> pd.DataFrame:
    """``init_row`` of every named architecture in ``configs``: one row per model (the index),
    columns layers, width, sigma_e, rho, predicted, measured."""
    return pd.DataFrame([init_row(name, config, tasks, seeds)
                         for name, config in configs.items()]).set_index("model")
