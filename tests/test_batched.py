"""Tests of several seeds trained as one batched model (issue 16, nopelib.batched).

On the CPU, a batched run ends with the weights of the separate run of the same seed within
float tolerance (not bit for bit: padding and reduction order differ), with per-seed gradient
clipping active; batched runs are cached under their own key.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import nopelib.train as tr
from nopelib import profiles
from nopelib import runs as rc
from nopelib import batched, launch
from nopelib.analysis import random_model
from nopelib.model import GPTConfig

# clipping at 0.05 is active at every step: a clip shared across seeds would show here
TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=40, batch_size=8, warmup_steps=4, n_train=64, n_test=16, n_eval=16,
    eval_batch_size=16, log_every=10, seeds=(0,), task_budgets=(), curve_every=20, n_curve=16,
    grad_clip=0.05,
)
SEEDS = [0, 1, 2]
TOLERANCE = 1e-4  # float32 rounding carried through 40 AdamW steps; measured max is printed


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_batched_seeds_equal_separate_runs_within_float_tolerance():
    cpu = torch.device("cpu")
    together = batched.train_seeds("addition", SEEDS, TINY, cpu)
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
