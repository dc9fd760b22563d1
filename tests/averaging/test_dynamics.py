"""Block 1 as the averaging theory reads it along training (nopelib.averaging.dynamics): the
measured quantities, and the layer-1 prediction they give, against the closed forms at init."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from nopelib.averaging import dynamics, theory
from nopelib.averaging.theory_config import closed_form_ratio, predict_config_score
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPTConfig
from nopelib.core.tasks import encode, encode_inputs, sample_inputs
from nopelib.core.one_model import random_model

SMALL = GPTConfig(n_layer=2, n_head=4, n_embd=96, init_std=0.002)
TEXTS = sample_inputs("reversal", 12, seed=0)


def _uniform(texts: list[str], n_head: int) -> list[np.ndarray]:
    """Uniform causal attention of ``n_head`` heads on each input ([H, T, T] each)."""
    out = []
    for text in texts:
        T = len(text)
        A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
        out.append(np.broadcast_to(A, (n_head, T, T)).copy())
    return out


def test_the_attention_output_is_the_attention_weighted_sum_of_the_value_vectors():
    model = random_model(replace(SMALL, init_std=0.05), seed=1)  # attention far from uniform
    idx, _ = encode_inputs(TEXTS)
    _, cache = model.run_with_cache(idx, ["blocks.0.hook_attn_out"], "explicit")
    A = model.attention_weights(idx)[0]  # [B, H, T, T]
    out = torch.einsum("bhkl,bhlc->bkc", A, dynamics.value_vectors(model, idx))
    ref = cache["blocks.0.hook_attn_out"]
    assert torch.allclose(out, ref, atol=1e-5 * float(ref.abs().max()))


def test_uniform_attention_and_no_shared_direction_give_back_the_theory():
    block = dynamics.Block1(rho=0.3, value_common=0.0, embedding_common=0.0, entropy=1.0,
                            value_axis=0.1, embedding_axis=0.1,
                            score_without_mlp=0.9, embedding_rms=0.3, value_rms=1.0)
    patterns = _uniform(TEXTS, n_head=4)
    tokens = encode(TEXTS[0])
    K, common = dynamics.residual_gram_measured(tokens, patterns[0], block)
    assert common == 0.0
    np.testing.assert_allclose(K, theory.residual_gram(tokens, 0.3), rtol=1e-12)
    predicted = dynamics.predicted_layer1(TEXTS, patterns, block, d=96)
    expected = theory.predicted_score([encode(t) for t in TEXTS], 0.3, 96)
    assert predicted == pytest.approx(expected, abs=1e-12)


def test_attention_on_the_own_token_alone_leaves_no_position_to_read():
    block = dynamics.Block1(rho=0.3, value_common=0.0, embedding_common=0.0, entropy=0.0,
                            value_axis=0.1, embedding_axis=0.1,
                            score_without_mlp=0.5, embedding_rms=0.3, value_rms=1.0)
    texts = ["0123456789"]  # distinct tokens: the expected Gram is diagonal
    own = [np.broadcast_to(np.eye(10), (4, 10, 10)).copy()]
    assert dynamics.predicted_layer1(texts, own, block, d=96) == pytest.approx(0.5)
    uniform = dynamics.predicted_layer1(texts, _uniform(texts, 4), block, 96)
    assert uniform > 0.9


def test_a_large_shared_direction_of_the_value_vectors_fades_the_predicted_pattern():
    block = dynamics.Block1(rho=0.3, value_common=0.0, embedding_common=0.0, entropy=1.0,
                            value_axis=0.1, embedding_axis=0.1,
                            score_without_mlp=0.9, embedding_rms=0.3, value_rms=1.0)
    patterns = _uniform(TEXTS, 4)
    scores = [dynamics.predicted_layer1(TEXTS, patterns, replace(block, value_common=c), 96)
              for c in (0.0, 0.9, 0.99)]
    # (the prediction is not monotone in the share: a moderate one can raise it slightly)
    assert scores[0] > scores[1] > scores[2] and scores[2] < 0.6, scores


def test_common_share_reads_the_shared_direction_without_the_small_sample_bias():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(15, 384, generator=gen)
    assert dynamics.common_share(z) < 0.02  # a plain mean of 15 would read about 1/15
    m = torch.randn(384, generator=gen)
    half = dynamics.common_share(z + m)  # |m|^2 about |z|^2: a share of about 0.5
    assert 0.4 < half < 0.6
    assert dynamics.common_share(m.repeat(5, 1)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two or more distinct tokens"):
        dynamics.common_share(m[None])


@pytest.mark.parametrize("config", [SMALL, GPTConfig()], ids=["4x96-like", "paper 6x384"])
def test_at_initialisation_the_measured_block_matches_the_closed_forms(config):
    model = random_model(config, seed=0)
    block, patterns = dynamics.measure_block1(model, TEXTS)
    assert block.entropy > 0.99  # near-uniform attention: the averaging effect
    assert block.rho == pytest.approx(closed_form_ratio(config), rel=0.1)
    assert block.value_common < 0.1 and block.embedding_common < 0.1
    assert [p.shape for p in patterns] == [(config.n_head, len(t), len(t)) for t in TEXTS]
    predicted = dynamics.predicted_layer1(TEXTS, patterns, block, config.n_embd)
    closed = predict_config_score(config, [encode(t) for t in TEXTS])
    assert predicted == pytest.approx(closed, abs=0.03)
    assert model.training is False  # random_model's eval mode kept


def test_measuring_restores_the_training_mode():
    model = random_model(SMALL, seed=0).train()
    dynamics.measure_block1(model, TEXTS)
    assert model.training


@pytest.mark.parametrize("texts, match", [([], "at least one input"),
                                          (["ab"], "3 or more characters")])
def test_bad_inputs_are_refused(texts, match):
    with pytest.raises(ValueError, match=match):
        dynamics.measure_block1(random_model(SMALL), texts)


def test_a_model_with_a_position_encoding_is_refused():
    model = random_model(replace(SMALL, pos_encoding="learned"))
    with pytest.raises(ValueError, match="pos_encoding='learned'"):
        dynamics.measure_block1(model, TEXTS)


def test_patterns_must_match_the_texts():
    block, patterns = dynamics.measure_block1(random_model(SMALL), TEXTS)
    with pytest.raises(ValueError, match="11 attention patterns for 12 texts"):
        dynamics.predicted_layer1(TEXTS, patterns[:-1], block, 96)
    with pytest.raises(ValueError, match=r"attention must be \[H, "):
        dynamics.residual_gram_measured(encode(TEXTS[0]), patterns[1], block)


def test_axis_share_tells_a_line_of_tokens_from_scattered_ones():
    gen = torch.Generator().manual_seed(0)
    scattered = torch.randn(15, 384, generator=gen)
    assert dynamics.axis_share(scattered) < 0.2  # about 1/14 for 15 centred rows
    w, s = torch.randn(384, generator=gen), torch.randn(15, 1, generator=gen)
    assert dynamics.axis_share(s * w + 0.01 * scattered) > 0.99
    assert dynamics.axis_share(s * w + 5.0) > 0.99  # a shared offset is not an axis


def test_the_measured_no_mlp_score_is_that_of_the_attention_residual():
    model = random_model(SMALL, seed=2)
    block, _ = dynamics.measure_block1(model, TEXTS)
    full = layer_scores(model, TEXTS).mean(0)[1]
    # at init block 1's MLP adds little next to e + attention: the two scores are close
    assert abs(block.score_without_mlp - full) < 0.1
    assert 0.5 < block.score_without_mlp <= 1.0
