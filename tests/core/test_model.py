"""The model: size, causality, the two attention paths, controls, and bad configurations."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nopelib.core.cost import model_params
from nopelib.core.model import GPT, GPTConfig, POS_ENCODINGS
from nopelib.core.tasks import VOCAB
from nopelib.studies.grid import GRIDS
from nopelib.training.profiles import PROFILES

SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=24)


def _model(config: GPTConfig = SMALL, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


def _tokens(B: int = 3, T: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, len(VOCAB), (B, T), generator=g)


def test_base_config_is_the_papers_model() -> None:
    cfg = GPTConfig()
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.pos_encoding, cfg.causal) == (6, 6, 384, "none", True)
    n = GPT(cfg).num_params()
    d, L, V = 384, 6, len(VOCAB)
    per_block = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 4 * d
    assert n == L * per_block + V * d + 2 * d  # blocks, tied embedding/head, final LayerNorm
    assert 10.5e6 < n < 10.7e6  # "about 10.6 M parameters"
    with torch.device("meta"):  # shapes only, nothing drawn: the same count
        assert GPT(cfg).num_params() == n
    assert cfg.block_size >= 39  # the longest task sequence: reversal, 22 + 16 + 1



def test_the_count_from_shapes_is_the_models_own_count() -> None:
    # every model the project prices: the profiles, the grids, and the controls' variants
    configs = {p.model for p in PROFILES.values()}
    configs |= {p.model for grid in GRIDS.values() for p in grid.profiles}
    configs |= {replace(SMALL, pos_encoding=pe, bias=bias, block_size=block, vocab_size=vocab)
                for pe in POS_ENCODINGS for bias in (True, False)
                for block, vocab in ((24, 25), (57, 13))}
    assert len(configs) > 20
    for config in configs:
        with torch.device("meta"):
            assert model_params(config) == GPT(config).num_params(), config

@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_causality(pos_encoding: str) -> None:
    model = _model(replace(SMALL, pos_encoding=pos_encoding))
    idx = _tokens()
    t = 9
    changed = idx.clone()
    changed[:, t] = (changed[:, t] - 2 + 1) % (len(VOCAB) - 2) + 2  # another real token
    with torch.no_grad():
        h0, h1 = model.hidden_states(idx), model.hidden_states(changed)
        l0, l1 = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(h0[:, :, :t], h1[:, :, :t], rtol=0, atol=0)
    torch.testing.assert_close(l0[:, :t], l1[:, :t], rtol=0, atol=1e-6)
    assert not torch.allclose(h0[:, :, t], h1[:, :, t])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_fused_and_explicit_attention_agree(pos_encoding: str, causal: bool) -> None:
    model = _model(replace(SMALL, pos_encoding=pos_encoding, causal=causal, init_std=0.2))
    idx = _tokens()
    with torch.no_grad():
        fused, _ = model(idx, attn_impl="fused")
        explicit, _ = model(idx, attn_impl="explicit")
    torch.testing.assert_close(fused, explicit, atol=2e-5, rtol=1e-4)


def test_bidirectional_nope_is_permutation_equivariant() -> None:
    model = _model(replace(SMALL, causal=False))
    idx = _tokens(B=2, T=12)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h, h_perm = model.hidden_states(idx), model.hidden_states(idx[:, perm])
    torch.testing.assert_close(h[:, :, perm], h_perm, atol=1e-5, rtol=1e-5)


def test_causal_nope_is_not_permutation_equivariant() -> None:
    model = _model()
    idx = _tokens(B=1, T=12)
    perm = torch.arange(11, -1, -1)
    with torch.no_grad():
        h, h_perm = model.hidden_states(idx), model.hidden_states(idx[:, perm])
    assert not torch.allclose(h[-1][:, perm], h_perm[-1], atol=1e-4)


def test_hidden_states_and_attention_weights() -> None:
    model = _model()
    idx = _tokens(B=2, T=10)
    with torch.no_grad():
        h = model.hidden_states(idx)
        att = model.attention_weights(idx)
        logits, _ = model(idx)
    assert h.shape == (SMALL.n_layer + 1, 2, 10, SMALL.n_embd)
    torch.testing.assert_close(h[0], model.transformer.wte(idx))
    torch.testing.assert_close(model.lm_head(model.transformer.ln_f(h[-1])), logits, atol=1e-5, rtol=1e-5)
    assert att.shape == (SMALL.n_layer, 2, SMALL.n_head, 10, 10)
    torch.testing.assert_close(att.sum(-1), torch.ones(att.shape[:-1]))
    assert (att.triu(diagonal=1) == 0).all()


def test_loss_ignores_masked_targets() -> None:
    model = _model()
    idx = _tokens(B=2, T=8)
    targets = torch.full_like(idx, -100)
    targets[:, 5] = idx[:, 6]
    logits, loss = model(idx, targets)
    expected = torch.nn.functional.cross_entropy(logits[:, 5], idx[:, 6])
    torch.testing.assert_close(loss, expected)


def test_initialisation_readings() -> None:
    emb_only = _model(replace(SMALL, init_mean=4.0, init_std=0.2, init_target="embedding"))
    everything = _model(replace(SMALL, init_mean=4.0, init_std=0.2, init_target="all"))
    default = _model(SMALL)
    assert emb_only.transformer.wte.weight.mean().item() == pytest.approx(4.0, abs=0.05)
    assert emb_only.transformer.wte.weight.std().item() == pytest.approx(0.2, rel=0.1)
    # "embedding" leaves every other weight exactly at nanoGPT's initialisation (same seed)
    for (name, p), (_, q) in zip(emb_only.named_parameters(), default.named_parameters()):
        if name != "transformer.wte.weight":
            assert torch.equal(p, q), name
    w = everything.transformer.h[0].mlp.c_fc.weight
    assert w.mean().item() == pytest.approx(4.0, abs=0.05) and w.std().item() == pytest.approx(0.2, rel=0.1)
    assert (everything.transformer.h[0].attn.c_attn.bias == 0).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(pos_encoding="xpos"), "pos_encoding='xpos'"),
        (dict(init_target="mlp"), "init_target='mlp'"),
        (dict(n_embd=30, n_head=4), "n_embd=30 must be divisible by n_head=4"),
        (dict(init_std=0.0), "init_std=0.0"),
        (dict(init_std=-0.02), "init_std=-0.02"),
        (dict(n_layer=0), "n_layer=0"),
        (dict(dropout=1.0), "dropout=1.0"),
    ],
)
def test_bad_configs_fail_at_construction(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        replace(SMALL, **overrides)


def test_bad_inputs_fail_with_clear_errors() -> None:
    model = _model()
    with pytest.raises(ValueError, match="input length 25 exceeds block_size=24"):
        model(_tokens(T=25))
    bad = _tokens(T=5)
    bad[0, 2] = len(VOCAB)
    with pytest.raises(ValueError, match=f"token id {len(VOCAB)} is outside the vocabulary"):
        model(bad)
    bad[0, 2] = -1
    with pytest.raises(ValueError, match="token id -1"):
        model.hidden_states(bad)
    with pytest.raises(ValueError, match="attn_impl='flash'"):
        model(_tokens(), attn_impl="flash")


def test_generate_appends_greedy_tokens() -> None:
    model = _model()
    idx = _tokens(B=2, T=5)
    out = model.generate(idx, 3)
    assert out.shape == (2, 8) and torch.equal(out[:, :5], idx)
    with torch.no_grad():
        assert torch.equal(out[:, 5], model(idx)[0][:, -1].argmax(-1))


def test_compiled_forward_is_one_graph():
    # the vocabulary check reads idx.min()/max(); under torch.compile it must not split the graph
    torch._dynamo.reset()
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32)).train()
    idx = torch.randint(0, 20, (4, 12))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons


def test_sliding_window_attention():
    """window: position i sees i - window + 1 .. i alone, on both attention paths; a window
    as long as the sequence is global attention; bad windows raise."""
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 23, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model.hidden_states(idx)
        torch.testing.assert_close(model.hidden_states(idx, window=40), full)
        win = model.hidden_states(idx, window=8)
        torch.testing.assert_close(model.hidden_states(idx, "fused", window=8), win)
        changed = idx.clone()
        changed[:, 5] = (changed[:, 5] + 1) % 23
        moved = model.hidden_states(changed, window=8)
    # two blocks of 8-wide windows reach 2 x 7 positions back: 20 no longer sees 5
    assert torch.equal(moved[:, :, 20:], win[:, :, 20:])
    assert not torch.equal(moved[:, :, 6:12], win[:, :, 6:12])
    assert not torch.allclose(win[:, :, 20:], full[:, :, 20:])
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="window"):
            model.hidden_states(idx, window=bad)
    with pytest.raises(ValueError, match="causal"):
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, causal=False)).hidden_states(idx, window=4)
