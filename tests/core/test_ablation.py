"""Parts held at their initial values while a model trains (nopelib.core.ablation), and the
curve-point measurements a run can carry (train.train's ``frozen`` and ``measure``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nopelib.core.ablation import PARTS, Frozen, check_parts
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.one_model import random_model
from nopelib.training import profiles, train as tr

TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=20, batch_size=8, warmup_steps=3, n_train=96, n_test=40, n_eval=40,
    eval_batch_size=16, log_every=5, seeds=(0,), task_budgets=(), curve_every=10, n_curve=40,
    lr=3e-3,
)
CPU = torch.device("cpu")


def _initial(seed: int) -> GPT:
    torch.manual_seed(seed)  # the draw train() makes
    return GPT(TINY.model)


def test_a_frozen_part_stays_bit_for_bit_while_the_rest_trains():
    init = _initial(3)
    model, metrics = tr.train("reversal", 3, TINY, CPU, progress=False,
                              frozen=["embedding", "qk"])
    assert metrics["frozen"] == ["embedding", "qk"]
    C = TINY.model.n_embd
    w0, w1 = init.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.weight
    assert torch.equal(init.transformer.wte.weight, model.transformer.wte.weight)
    assert torch.equal(w0[: 2 * C], w1[: 2 * C])  # queries and keys of block 1
    assert not torch.equal(w0[2 * C:], w1[2 * C:])  # its values trained
    assert not torch.equal(init.transformer.h[1].attn.c_attn.weight,
                           model.transformer.h[1].attn.c_attn.weight)  # block 2 trained


def test_holding_the_value_path_and_the_embedding_keeps_every_value_vector():
    # the 'values' ablation: what block 1's attention averages stays as at initialisation,
    # while block 1's queries and keys, its MLP and the later blocks train
    init = _initial(3)
    model, _ = tr.train("reversal", 3, TINY, CPU, progress=False,
                        frozen=["embedding", "value"])
    C = TINY.model.n_embd
    b0, b1 = init.transformer.h[0], model.transformer.h[0]
    for name in ("ln_1.weight", "ln_1.bias", "attn.c_proj.weight", "attn.c_proj.bias"):
        assert torch.equal(b0.get_parameter(name), b1.get_parameter(name)), name
    w0, w1 = b0.attn.c_attn.weight, b1.attn.c_attn.weight
    assert torch.equal(w0[2 * C:], w1[2 * C:])  # the value rows
    assert not torch.equal(w0[: 2 * C], w1[: 2 * C])  # queries and keys trained
    assert not torch.equal(b0.mlp.c_fc.weight, b1.mlp.c_fc.weight)

    def values(m: GPT) -> torch.Tensor:  # every token's value vector, output-projected
        block = m.transformer.h[0]
        v = block.ln_1(m.transformer.wte.weight) @ block.attn.c_attn.weight[2 * C:].T
        if block.attn.c_attn.bias is not None:
            v = v + block.attn.c_attn.bias[2 * C:]
        return block.attn.c_proj(v)

    with torch.no_grad():
        assert torch.equal(values(init), values(model))


def test_holding_block_1_s_mlp_keeps_it_while_its_attention_and_the_rest_train():
    init = _initial(3)
    model, _ = tr.train("reversal", 3, TINY, CPU, progress=False, frozen=["mlp"])
    b0, b1 = init.transformer.h[0], model.transformer.h[0]
    for name in ("ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias"):
        assert torch.equal(b0.get_parameter(name), b1.get_parameter(name)), name
    assert not torch.equal(b0.attn.c_attn.weight, b1.attn.c_attn.weight)
    assert not torch.equal(init.transformer.h[1].mlp.c_fc.weight,
                           model.transformer.h[1].mlp.c_fc.weight)  # block 2's MLP trained
    assert not torch.equal(init.transformer.wte.weight, model.transformer.wte.weight)


def test_input_holds_the_embedding_the_blocks_read_and_trains_an_untied_head():
    init = _initial(3)
    model, _ = tr.train("reversal", 3, TINY, CPU, progress=False, frozen=["input"])
    assert torch.equal(init.transformer.wte.weight, model.transformer.wte.weight)
    head = model.lm_head.weight
    assert head is not model.transformer.wte.weight  # untied: a parameter of its own
    assert not torch.equal(head, init.transformer.wte.weight)  # and it trained
    held, _ = tr.train("reversal", 3, TINY, CPU, progress=False, frozen=["embedding"])
    assert torch.equal(held.lm_head.weight, init.transformer.wte.weight)  # tied and held
    with pytest.raises(ValueError, match="'input' unties the head"):
        Frozen(_initial(0), ["embedding", "input"])


def test_an_unfrozen_run_moves_what_the_ablation_holds():
    init = _initial(3)
    model, metrics = tr.train("reversal", 3, TINY, CPU, progress=False)
    assert "frozen" not in metrics
    assert not torch.equal(init.transformer.wte.weight, model.transformer.wte.weight)
    b0, b1 = init.transformer.h[0], model.transformer.h[0]
    for name in ("ln_1.weight", "attn.c_proj.weight", "attn.c_attn.weight"):
        assert not torch.equal(b0.get_parameter(name), b1.get_parameter(name)), name


def test_the_measure_rides_on_every_curve_point_and_the_learning_rate_is_recorded():
    calls = []

    def measure(model: GPT) -> dict:
        calls.append(model.training)
        return {"embedding_norm": float(model.transformer.wte.weight.detach().norm())}

    _, metrics = tr.train("reversal", 3, TINY, CPU, progress=False, measure=measure)
    curve = metrics["curve"]
    assert curve["step"] == [10, 20]
    assert len(curve["embedding_norm"]) == len(curve["step"]) == len(curve["lr"])
    assert metrics["measure_init"]["embedding_norm"] > 0
    assert curve["lr"] == [TINY.lr_at(9), TINY.lr_at(19)]
    # a measure that draws no random number leaves the run as it is without it
    _, plain = tr.train("reversal", 3, TINY, CPU, progress=False)
    assert plain["loss_curve"] == metrics["loss_curve"]
    assert len(calls) == 3


@pytest.mark.parametrize("parts, match", [(["embeding"], "unknown; allowed"),
                                          (["qk", "qk"], "names a part twice")])
def test_bad_parts_are_refused_before_training(parts, match):
    with pytest.raises(ValueError, match=match):
        check_parts(parts)
    with pytest.raises(ValueError, match=match):
        tr.train("reversal", 3, TINY, CPU, progress=False, frozen=parts)


def test_restore_puts_back_what_an_optimizer_step_moved():
    model = random_model(TINY.model, seed=0).train()
    held = Frozen(model, [p for p in PARTS if p != "input"])  # input: a head of its own
    before = model.transformer.wte.weight.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    idx = torch.randint(0, TINY.model.vocab_size, (2, 6))
    _, loss = model(idx, idx)
    loss.backward()
    assert float(model.transformer.wte.weight.grad.abs().max()) == 0.0  # zeroed for clipping
    opt.step()  # weight decay alone moves a zero-gradient matrix
    assert not torch.equal(before, model.transformer.wte.weight)
    held.restore()
    assert torch.equal(before, model.transformer.wte.weight)
