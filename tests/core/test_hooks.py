"""The one capture mechanism: named hook points and ``GPT.run_with_cache``."""

import pytest
import torch

from nopelib.core.one_model import random_model


@pytest.fixture(scope="module", params=[True, False], ids=["causal", "bidirectional"])
def model(request):
    return random_model(seed=0, n_layer=2, n_embd=48, n_head=4, causal=request.param)


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_cache_names_are_transformer_lens_names(model):
    points = ("hook_resid_pre", "hook_attn_out", "hook_resid_post", "attn.hook_pattern")
    expected = {f"blocks.{l}.{point}" for l in range(2) for point in points}
    assert set(model.hook_points) == expected
    idx = torch.tensor([[3, 5, 7, 9]])
    _, cache = model.run_with_cache(idx)
    assert set(cache) == expected
    assert cache["blocks.1.hook_resid_post"].shape == (1, 4, 48)
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, 4, 4, 4)
    # a block's input is the previous block's output
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])


@pytest.mark.parametrize("names", [None,
                                   ["blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post"]])
def test_capture_does_not_change_logits(model, names):
    idx = torch.tensor([[4, 8, 15, 16, 23], [1, 2, 3, 4, 5]])
    with torch.no_grad():
        plain, _ = model(idx, attn_impl="explicit")
        observed, _ = model.run_with_cache(idx, names)
    assert torch.equal(observed, plain)
    fused, _ = model.run_with_cache(idx, ["blocks.1.hook_resid_post"], attn_impl="fused")
    assert torch.equal(fused, model(idx)[0])


def test_captures_attention_output_and_removes_hooks(model):
    idx = torch.tensor([[3, 5, 7, 9]])
    _, cache = model.run_with_cache(idx, ["blocks.0.hook_attn_out", "blocks.0.hook_resid_post"])
    assert _hook_count(model) == 0
    # the attention output is what block 1 adds to the residual stream
    with torch.no_grad():
        x = model.transformer.wte(idx)
        expected = model.transformer.h[0].attn(model.transformer.h[0].ln_1(x))
    torch.testing.assert_close(cache["blocks.0.hook_attn_out"], expected)
    assert not cache["blocks.0.hook_resid_post"].requires_grad  # cached values are detached


def test_views_and_early_stop_agree_with_the_cache(model):
    idx = torch.tensor([[3, 5, 7, 9, 11]])
    _, cache = model.run_with_cache(idx)
    h = model.hidden_states(idx)  # [L+1, B, T, d]
    assert torch.equal(h[0], cache["blocks.0.hook_resid_pre"])
    assert torch.equal(h[2], cache["blocks.1.hook_resid_post"])
    assert torch.equal(model.attention_weights(idx)[1], cache["blocks.1.attn.hook_pattern"])
    resid, early = model.run_with_cache(idx, ["blocks.0.hook_resid_post"], stop_at_layer=1)
    assert torch.equal(resid, cache["blocks.0.hook_resid_post"])
    assert torch.equal(early["blocks.0.hook_resid_post"], cache["blocks.0.hook_resid_post"])


def test_hooks_removed_when_the_forward_raises(model):
    with pytest.raises(ValueError, match="vocabulary"):
        model.run_with_cache(torch.tensor([[1, 10_000]]))
    assert _hook_count(model) == 0


def test_unknown_or_unreachable_names_rejected(model):
    with pytest.raises(ValueError, match="blocks.9.hook_resid_post"):
        model.run_with_cache(torch.tensor([[1, 2, 3]]), ["blocks.9.hook_resid_post"])
    with pytest.raises(ValueError, match="did not run"):  # the fused path has no pattern
        model.run_with_cache(torch.tensor([[1, 2, 3]]), ["blocks.0.attn.hook_pattern"],
                             attn_impl="fused")
    with pytest.raises(ValueError, match="did not run"):
        model.run_with_cache(torch.tensor([[1, 2, 3]]), ["blocks.1.hook_resid_post"],
                             stop_at_layer=1)
    assert _hook_count(model) == 0
