"""Tests of several seeds trained as one batched model (issue 16, nopelib.training.batched).

On the CPU, a batched run ends with the weights of the separate run of the same seed within
float tolerance (not bit for bit: padding and reduction order differ), with per-seed gradient
clipping active; batched runs are cached under their own key.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

import nopelib.training.train as tr
from nopelib.core.model import GPTConfig
from nopelib.core.one_model import random_model
from nopelib.training import profiles, runs as rc, batched, launch

# clipping at 0.05 is active at every step: a clip shared across seeds would show here
TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=40, batch_size=8, warmup_steps=4, n_train=64, n_test=16, n_eval=16,
    eval_batch_size=16, log_every=10, seeds=(0,), task_budgets=(), curve_every=20, n_curve=16,
    grad_clip=0.05,
)
SEEDS = [0, 1, 2]
TOLERANCE = 1e-4  # float32 rounding carried through 40 AdamW steps; measured max is printed


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("attn_impl", [None, "explicit"])  # explicit: a GPU's path
def test_batched_seeds_equal_separate_runs_within_float_tolerance(attn_impl):
    cpu = torch.device("cpu")
    together = batched.train_seeds("addition", SEEDS, TINY, cpu, attn_impl=attn_impl)
    worst = 0.0
    for seed, (model, metrics) in zip(SEEDS, together):
        alone, alone_metrics = tr.train("addition", seed, TINY, cpu, progress=False)
        a, b = model.state_dict(), alone.state_dict()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        init = random_model(TINY.model, seed).state_dict()
        moved = max(float((b[k] - init[k]).abs().max()) for k in b)
        worst = max(worst, diff)
        assert diff < TOLERANCE < moved  # equal within tolerance, and training moved them
        assert metrics["loss_curve"] == pytest.approx(alone_metrics["loss_curve"], rel=1e-4)
        assert metrics["curve"]["step"] == alone_metrics["curve"]["step"]
    # the seeds are different models: batching did not mix them
    w = [m.state_dict()["transformer.wte.weight"] for m, _ in together]
    assert not torch.equal(w[0], w[1])
    print(f"max abs weight difference, batched vs separate: {worst:.3g}")


def test_clipping_is_per_seed():
    g = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]  # seed norms 5 and 0.5
    batched._clip_per_seed(g, 1.0)
    assert torch.allclose(g[0].norm(dim=1), torch.tensor([1.0, 0.5]), atol=1e-5)


def test_batched_runs_are_cached_under_their_own_key(tmp_path):
    pairs = [("reversal", 0), ("reversal", 1)]
    first = launch.train_many(pairs, TINY, "cpu", cache_dir=tmp_path, backend="batched")
    again = launch.train_many(pairs, TINY, "cpu", cache_dir=tmp_path, backend="batched")
    for run in pairs:
        assert not first[run].from_cache and again[run].from_cache
        assert first[run].profile.name == "tiny+batched"
        assert first[run].metrics["batched_seeds"] == [0, 1]
        assert 0 <= first[run].metrics["accuracy"] <= 1
    committed = {p.name for p in (tmp_path / "runs").iterdir()}
    assert committed == {rc.run_key("reversal", s, TINY.batched(), "cpu")
                         for s in (0, 1)}
    assert rc.run_key("reversal", 0, TINY, "cpu") not in committed


def test_stacked_adamw_is_torch_adamw_per_seed_and_lr_zero_keeps_a_seed_bit_for_bit():
    # seed 1 at learning rate 0, its gradients NaN: untouched; seeds 0 and 2 as torch's AdamW
    torch.manual_seed(0)
    w = torch.randn(3, 4, 5)  # [S, ...]: a matrix per seed (decayed)
    b = torch.randn(3, 5)  # a vector per seed (not decayed)
    params = {"w": w.clone().requires_grad_(), "b": b.clone().requires_grad_()}
    opt = batched.StackedAdamW(params, TINY)
    lrs = torch.tensor([1e-2, 0.0, 3e-3])
    grads = []
    for _ in range(3):
        g = {k: torch.randn_like(v) for k, v in params.items()}
        for t in g.values():  # a seed past its end may see no target: a NaN loss
            t[1] = float("nan")
        grads.append(g)
        for k, p in params.items():
            p.grad = g[k].clone()
        opt.step(lrs)
    assert torch.equal(params["w"][1], w[1]) and torch.equal(params["b"][1], b[1])
    for s in (0, 2):  # torch's AdamW on seed s's own parameters
        mine = [w[s].clone().requires_grad_(), b[s].clone().requires_grad_()]
        ref = tr.adamw(mine, replace(TINY, lr=float(lrs[s])))
        for g in grads:
            mine[0].grad, mine[1].grad = g["w"][s].clone(), g["b"][s].clone()
            ref.step()
        assert torch.allclose(params["w"][s], mine[0], atol=1e-6)
        assert torch.allclose(params["b"][s], mine[1], atol=1e-6)
        assert not torch.equal(params["w"][s], w[s])


# A budget that follows progress, batched: per seed, the validation exact match of its k-th
# curve point is read from a schedule (not from weights, whose last bits batching changes), so
# each seed's budget must end exactly where its separate run's does. Seed 0 is at the level
# at its 2nd point (step 10, tail to 15); seed 1 at its 3rd (step 15), loses it in the tail
# and is back at step 25 (the tail counted afresh, to 38); seed 2 never (the cap, 40).
FOLLOWING = replace(TINY, name="tiny-following", curve_every=5, n_val=8, stop_at=0.5,
                    tail_share=0.5, relearn_below=0.3, n_trajectory=4, grad_clip=1.0)
SCHEDULE = {0: [0.1, 0.6, 0.7], 1: [0.1, 0.2, 0.6, 0.1, 0.6], 2: [0.1]}


@pytest.fixture
def scheduled_validation(monkeypatch):
    calls: dict[int, int] = {}
    firsts = {tr.make_split("reversal", s, n_train=FOLLOWING.n_train, n_test=FOLLOWING.n_test,
                            n_val=FOLLOWING.n_val).val[0]: s for s in SCHEDULE}
    real = tr.evaluate

    def evaluate(model, pairs, batch_size=500):
        if len(pairs) != FOLLOWING.n_val:
            return real(model, pairs, batch_size)
        seed = firsts[pairs[0]]
        k = calls[seed] = calls.get(seed, -1) + 1
        return SCHEDULE[seed][min(k, len(SCHEDULE[seed]) - 1)]

    monkeypatch.setattr(tr, "evaluate", evaluate)
    monkeypatch.setattr(batched, "evaluate", evaluate)
    return calls


def test_batched_seeds_follow_their_own_budgets_as_separate_runs_do(scheduled_validation):
    cpu = torch.device("cpu")
    seeds = sorted(SCHEDULE)
    together = batched.train_seeds("reversal", seeds, FOLLOWING, cpu)
    ends = []
    for seed, (model, m) in zip(seeds, together):
        scheduled_validation.clear()
        alone, a = tr.train("reversal", seed, FOLLOWING, cpu, progress=False)
        for name in ("steps", "decay_from", "tail_restarts"):
            assert m[name] == a[name], (seed, name)
        assert m["curve"]["step"] == a["curve"]["step"]
        assert m["curve"]["lr"] == pytest.approx(a["curve"]["lr"])
        assert m["curve"]["val_accuracy"] == a["curve"]["val_accuracy"]
        assert len(m["loss_curve"]) == len(a["loss_curve"])
        assert m["scores_init"] == pytest.approx(a["scores_init"], abs=1e-6)
        assert len(m["curve"]["scores"]) == len(m["curve"]["step"])
        # a seed that ended early stopped changing: its weights are its separate run's
        x, y = model.state_dict(), alone.state_dict()
        assert max(float((x[k] - y[k]).abs().max()) for k in x) < TOLERANCE
        ends.append((m["steps"], m["decay_from"], m["tail_restarts"]))
    assert ends == [(15, 10, []), (38, 15, [25]), (40, None, [])]


def test_a_stopped_batched_group_resumes_bit_for_bit(tmp_path, monkeypatch,
                                                     scheduled_validation):
    from nopelib.store import checkpoint as ck
    from nopelib.store.cache import file_sha256

    pairs = [("reversal", s) for s in sorted(SCHEDULE)]
    monkeypatch.setattr(batched, "RunCheckpoints",
                        functools.partial(ck.RunCheckpoints, every_steps=4))

    def trained(cache) -> dict:
        runs = launch.train_many(pairs, FOLLOWING, "cpu", cache_dir=cache, backend="batched")
        return {p: (file_sha256(cache / "runs" / r.metrics["key"] / "model.safetensors"),
                    r.metrics["loss_curve"], r.metrics["curve"]["scores"], r.metrics["steps"],
                    r.metrics["resumed_at"]) for p, r in runs.items()}

    scheduled_validation.clear()
    whole = trained(tmp_path / "whole")
    real, calls = batched.StackedAdamW.step, {"n": 0}

    def stop_at_22(self, lrs):
        calls["n"] += 1
        if calls["n"] == 22:
            raise KeyboardInterrupt
        return real(self, lrs)

    with monkeypatch.context() as m:
        m.setattr(batched.StackedAdamW, "step", stop_at_22)
        scheduled_validation.clear()
        with pytest.raises(KeyboardInterrupt):
            trained(tmp_path / "stopped")
    assert not (tmp_path / "stopped" / "runs").exists() or not any(
        (tmp_path / "stopped" / "runs").iterdir())
    # the stand-in counts curve points per seed: the resumed run reads on after step 20's
    # (seed 0 ended at step 15, its 3rd point; seeds 1 and 2 had their 4th at step 20)
    scheduled_validation.clear()
    scheduled_validation.update({0: 2, 1: 3, 2: 3})
    resumed = trained(tmp_path / "stopped")
    for p, (sha, losses, scores, steps, at) in whole.items():
        # seed 0 had ended at step 15: the stop did not stop it
        assert resumed[p] == (sha, losses, scores, steps, [20] if steps > 20 else [])
        assert at == []
    assert not any((tmp_path / "stopped" / "checkpoints").iterdir())
