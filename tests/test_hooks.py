import pytest
import torch

from nopelib.analysis import random_model
from nopelib.hooks import capture_activations


@pytest.fixture(scope="module")
def model():
    return random_model(seed=0, n_layer=2, n_embd=48, n_head=4)


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_captures_attention_output_and_removes_hooks(model):
    idx = torch.tensor([[3, 5, 7, 9]])
    with capture_activations(model, ["transformer.h.0.attn", "transformer.h.1.mlp"]) as cap:
        assert _hook_count(model) == 2
        model(idx)
        model(idx)
    assert _hook_count(model) == 0
    assert len(cap["transformer.h.0.attn"]) == 2
    assert cap["transformer.h.0.attn"][0].shape == (1, 4, 48)
    # the attention output is what block 1 adds to the residual stream
    with torch.no_grad():
        x = model.transformer.wte(idx)
        expected = model.transformer.h[0].attn(model.transformer.h[0].ln_1(x))
    torch.testing.assert_close(cap["transformer.h.0.attn"][0], expected)


def test_hooks_removed_when_block_raises(model):
    with pytest.raises(RuntimeError, match="boom"):
        with capture_activations(model, ["transformer.h.0.attn"]):
            raise RuntimeError("boom")
    assert _hook_count(model) == 0


def test_hooks_do_not_change_outputs(model):
    idx = torch.tensor([[4, 8, 15, 16, 23]])
    with torch.no_grad():
        before, _ = model(idx)
        with capture_activations(model, ["transformer.h.0.attn", "transformer.h.0"]):
            during, _ = model(idx)
    torch.testing.assert_close(during, before, rtol=0, atol=0)


def test_unknown_name_rejected(model):
    with pytest.raises(ValueError, match="transformer.h.9.attn"):
        with capture_activations(model, ["transformer.h.9.attn"]):
            pass
    assert _hook_count(model) == 0
