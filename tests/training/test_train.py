"""Tests of nopelib.training.train: determinism, evaluation, the run cache and its atomic commit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn as nn

import nopelib.store.cache as cache
import nopelib.training.train as tr
from nopelib.core import devices
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.tasks import (EOS_ID, MAX_SEQ_LEN, TASKS, VOCAB, encode, encode_batch, get_task,
                                make_split, sample_inputs)
from nopelib.store import sources
from nopelib.results import files as results
from nopelib.core.one_model import random_model
from nopelib.training import exact_match, launch, profiles, run_entry, runs as rc, train_profile

TINY = replace(
    profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
    steps=12, batch_size=8, warmup_steps=3, n_train=96, n_test=40, n_eval=40,
    eval_batch_size=16, log_every=5, seeds=(0,), task_budgets=(), curve_every=0, n_curve=40,
)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))


pytestmark = pytest.mark.usefixtures("one_thread")


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: nn.Module, b: nn.Module) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# --- training ---------------------------------------------------------------------------------

def test_training_is_deterministic_on_cpu_and_changes_the_weights():
    cpu = torch.device("cpu")
    m1, met1 = tr.train("reversal", 3, TINY, cpu, progress=False)
    m2, met2 = tr.train("reversal", 3, TINY, cpu, progress=False)
    assert _same(m1, m2)
    assert met1["loss_curve"] == met2["loss_curve"]
    torch.manual_seed(3)
    assert not _same(m1, GPT(TINY.model))  # training moved the weights away from the init
    m3, _ = tr.train("reversal", 4, TINY, cpu, progress=False)
    assert not _same(m1, m3)  # another seed, another run


def test_training_lowers_the_loss():
    prof = replace(TINY, steps=60, log_every=20)
    _, met = tr.train("addition", 0, prof, torch.device("cpu"), progress=False)
    assert len(met["loss_curve"]) == 3
    assert met["loss_curve"][-1] < 0.9 * met["loss_curve"][0], met["loss_curve"]
    assert met["steps"] == 60 and met["tokens_per_s"] > 0 and met["step_ms"] > 0


def test_learning_rate_schedule():
    p = replace(TINY, steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert p.lr_at(0) == pytest.approx(1e-4)
    assert p.lr_at(9) == pytest.approx(1e-3)
    assert p.lr_at(99) == pytest.approx(1e-4, rel=1e-2)
    lrs = [p.lr_at(s) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # cosine decay never rises


# --- evaluation -------------------------------------------------------------------------------

class OracleModel(nn.Module):
    """Answers with the task's oracle at every position after the "="; ``wrong(text)`` says which
    inputs it answers badly, and ``no_eos`` makes it continue with a digit where the end token
    belongs."""

    def __init__(self, task: str, wrong=lambda text: False, no_eos: bool = False):
        super().__init__()
        self.config = GPTConfig()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.task, self.wrong, self.no_eos = get_task(task), wrong, no_eos

    def forward(self, idx: torch.Tensor):
        B, T = idx.shape
        logits = torch.zeros(B, T, len(VOCAB))
        for b, row in enumerate(idx.tolist()):
            text = "".join(VOCAB[i] for i in row)
            end = text.index("=") + 1
            answer = self.task.solve(text[:end])
            if self.wrong(text[:end]):
                answer = answer[:-1] + str((int(answer[-1]) + 1) % 10)
            for t in range(end - 1, T):  # position t has seen text[:t + 1]
                n = t + 1 - end  # answer characters already in the prefix
                if n < len(answer):
                    nxt = encode(answer[n])[0]
                else:
                    nxt = encode("7")[0] if self.no_eos else EOS_ID
                logits[b, t, nxt] = 1.0
        return logits, None


def test_evaluate_exact_match_counts_only_exact_answers():
    pairs = make_split("addition", 0, n_train=0, n_test=60).test
    assert len({len(x) for x, _ in pairs}) > 1  # several input lengths: exercises the grouping
    wrong = lambda text: text[0] in "13579"  # noqa: E731
    expected = sum(not wrong(x) for x, _ in pairs) / len(pairs)
    assert 0 < expected < 1
    for accuracy in (tr.evaluate, exact_match.greedy_accuracy):
        assert accuracy(OracleModel("addition"), pairs, batch_size=7) == 1.0
        assert accuracy(OracleModel("addition", no_eos=True), pairs, batch_size=7) == 0.0
        assert accuracy(OracleModel("addition", wrong=wrong), pairs, batch_size=7) == pytest.approx(expected)


def test_teacher_forced_evaluation_equals_greedy_decoding():
    # a briefly trained model gets some answers right and some wrong, some only in their tail
    prof = replace(TINY, model=GPTConfig(n_layer=2, n_head=2, n_embd=32), steps=300, lr=3e-3,
                   n_train=2000, log_every=100)
    model, _ = tr.train("reversal", 0, prof, torch.device("cpu"), progress=False)
    pairs = make_split("reversal", 1, n_train=0, n_test=300).test
    reference = exact_match.greedy_accuracy(model, pairs, batch_size=64)
    assert 0 < reference < 1, reference  # some answers right, some wrong
    assert exact_match.evaluate(model, pairs, batch_size=64) == reference
    for pair in pairs[:40]:  # row by row: the same verdict on every single pair
        assert exact_match.evaluate(model, [pair]) == exact_match.greedy_accuracy(model, [pair])


def test_evaluate_untrained_model_scores_low():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32)).eval()
    pairs = make_split("reversal", 0, n_train=0, n_test=100).test
    assert exact_match.evaluate(model, pairs, batch_size=32) < 0.05


def test_evaluate_rejects_empty_pairs_and_bad_batch():
    for accuracy in (tr.evaluate, exact_match.greedy_accuracy):
        with pytest.raises(ValueError, match="pairs"):
            accuracy(OracleModel("addition"), [])
        with pytest.raises(ValueError, match="batch_size=0"):
            accuracy(OracleModel("addition"), [("1+2=", "3")], batch_size=0)
    with pytest.raises(ValueError, match="causal"):
        exact_match.evaluate(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, causal=False)), [("1+2=", "3")])


# --- the cache --------------------------------------------------------------------------------

def test_cache_hit_returns_the_same_model_and_metrics(tmp_path):
    first = rc.train_or_load("indexing", 0, TINY, device="cpu", progress=False)
    second = rc.train_or_load("indexing", 0, TINY, device="cpu", progress=False)
    assert not first.from_cache and second.from_cache
    assert _same(first.model, second.model)
    assert first.metrics == second.metrics
    assert 0.0 <= first.metrics["accuracy"] <= 1.0 and first.metrics["n_test"] == TINY.n_eval
    assert not second.model.training and next(second.model.parameters()).device.type == "cpu"
    assert (tmp_path / "cache" / "runs" / first.metrics["key"] / "model.safetensors").is_file()
    # the seed list is not part of a run's key
    assert rc.train_or_load("indexing", 0, replace(TINY, seeds=(0, 1)), device="cpu", progress=False).from_cache


@pytest.mark.parametrize("change", ["seed", "task", "lr", "model", "source"])
def test_cache_miss_when_the_key_changes(change, monkeypatch):
    rc.train_or_load("ordering", 0, TINY, device="cpu", progress=False)
    task, seed, prof = "ordering", 0, TINY
    if change == "seed":
        seed = 1
    elif change == "task":
        task = "addition"
    elif change == "lr":
        prof = replace(TINY, lr=TINY.lr / 2)
    elif change == "model":
        prof = replace(TINY, model=replace(TINY.model, init_std=0.03))
    else:
        monkeypatch.setattr(rc, "source_hash", lambda: "edited source")
    assert not rc.train_or_load(task, seed, prof, device="cpu", progress=False).from_cache


def test_a_run_whose_recorded_key_differs_is_not_loaded(tmp_path):
    run = rc.train_or_load("reversal", 0, TINY, device="cpu", progress=False)
    metrics_path = tmp_path / "cache" / "runs" / run.metrics["key"] / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["key"] = "0" * 32
    metrics_path.write_text(json.dumps(metrics))
    assert not rc.train_or_load("reversal", 0, TINY, device="cpu", progress=False).from_cache


def test_source_hash_follows_the_training_sources_only(tmp_path, monkeypatch):
    # the sources are the import closure of the training code, read from its imports
    assert {"training/train.py", "core/model.py", "core/tasks.py", "training/batched.py",
            "store/cache.py"} <= set(rc.training_sources())
    assert not {"book/viz.py", "core/probe.py", "studies/analysis.py"} & set(
        rc.training_sources())
    pkg = tmp_path / "nopelib"
    for name in (*rc.training_sources(), "book/viz.py"):
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_bytes((sources.PACKAGE_DIR / name).read_bytes())
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)
    original = rc.source_hash()
    assert len(original) == 64
    (pkg / "book/viz.py").write_text("# plotting code cannot change a trained model\n")
    assert rc.source_hash() == original
    for name in ("core/model.py", "training/batched.py"):  # batched seeds train runs too
        before = rc.source_hash()
        with (pkg / name).open("a") as f:
            f.write("\n# a comment is no change to what a run computes\n")
        assert rc.source_hash() == before
        with (pkg / name).open("a") as f:
            f.write("\nEDITED = 1\n")
        assert rc.source_hash() != before
    # a module the training code starts to import joins the key
    (pkg / "core/helper.py").write_text("X = 1\n")
    before = rc.source_hash()
    with (pkg / "core/tasks.py").open("a") as f:
        f.write("\nfrom nopelib.core import helper  # noqa\n")
    assert "core/helper.py" in rc.training_sources()
    (pkg / "core/helper.py").write_text("X = 2\n")
    assert rc.source_hash() != before


def test_train_many_in_parallel_matches_one_by_one(tmp_path):
    runs = [("reversal", 0), ("indexing", 1)]
    parallel = launch.train_many(runs, TINY, device="cpu", cache_dir=tmp_path / "a", workers=2)
    for task, seed in runs:
        alone = rc.train_or_load(task, seed, TINY, device="cpu", cache_dir=tmp_path / "b", progress=False)
        assert not alone.from_cache and not parallel[task, seed].from_cache
        assert _same(parallel[task, seed].model, alone.model)
        assert parallel[task, seed].metrics["accuracy"] == alone.metrics["accuracy"]
    again = launch.train_many(runs, TINY, device="cpu", cache_dir=tmp_path / "a", workers=2)
    assert all(again[run].from_cache for run in runs)
    with pytest.raises(ValueError, match="task='sort'"):
        launch.train_many([("sort", 0)], TINY, cache_dir=tmp_path / "c")


def inline_pool(submitted: list, on_shutdown=lambda: None) -> type:
    """A ProcessPoolExecutor stand-in that trains in this process and records each submitted
    job's arguments (task, seed, profile, ...) in ``submitted``, in order."""

    class Finished:
        def result(self):
            return None

    class InlinePool:
        def __init__(self, *args, **kwargs):
            pass

        def submit(self, fn, *args):
            submitted.append(args)
            fn(*args)
            return Finished()

        def shutdown(self, wait=True, cancel_futures=False):
            on_shutdown()

    return InlinePool


def test_train_many_submits_the_costliest_runs_first(tmp_path, monkeypatch):
    jobs, trained = [], []
    # the sources are edited as the pool finishes: the runs stay those of the start
    InlinePool = inline_pool(
        jobs, lambda: monkeypatch.setattr(rc, "source_hash", lambda: "edited meanwhile"))
    real_train = tr.train

    def counting_train(task, seed, *args, **kwargs):
        trained.append((task, seed))
        return real_train(task, seed, *args, **kwargs)

    monkeypatch.setattr(launch, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(rc, "train", counting_train)
    runs = [("addition", 0), ("reversal", 0), ("ordering", 0), ("indexing", 0), ("addition", 1)]
    done = launch.train_many(runs + [("reversal", 0), ("addition", 1)], TINY, device="cpu", cache_dir=tmp_path,
                         workers=2)  # duplicates are trained once
    submitted = [job[:2] for job in jobs]
    lengths = [get_task(task).max_input_len for task, _ in submitted]
    assert sorted(submitted) == sorted(runs) and lengths == sorted(lengths, reverse=True)
    assert submitted[0] == ("reversal", 0) and set(done) == set(runs)
    assert sorted(trained) == sorted(runs) and not any(r.from_cache for r in done.values())
    # a task's own budget counts: ten times the steps put addition first
    jobs.clear()
    monkeypatch.undo()
    monkeypatch.setattr(launch, "ProcessPoolExecutor", InlinePool)
    long_addition = replace(TINY, task_budgets=(("addition", TINY.steps * 10),))
    launch.train_many(runs, long_addition, device="cpu", cache_dir=tmp_path / "b", workers=2)
    assert [job[0] for job in jobs[:2]] == ["addition", "addition"]


def test_train_missing_pools_jobs_of_several_profiles(tmp_path, monkeypatch):
    jobs_seen = []
    InlinePool = inline_pool(jobs_seen)
    monkeypatch.setattr(launch, "ProcessPoolExecutor", InlinePool)
    learned = replace(TINY, name="tiny-learned",
                      model=replace(TINY.model, pos_encoding="learned"),
                      task_budgets=(("addition", TINY.steps * 10),))
    jobs = [("reversal", 0, TINY), ("addition", 0, learned), ("addition", 0, TINY),
            ("reversal", 0, TINY)]  # listed twice: trained once
    trained = launch.train_missing(jobs, device="cpu", cache_dir=tmp_path, workers=2)
    submitted = [(t, s, prof.name) for t, s, prof, *_ in jobs_seen]
    assert submitted == [("addition", 0, "tiny-learned"), ("reversal", 0, "tiny"),
                         ("addition", 0, "tiny")]  # the costliest first, across profiles
    assert sorted((j.task, j.seed, j.profile.name) for j in trained) == sorted(submitted)
    assert all(j.missing for j in trained)
    # each profile's runs are in its own cache entries, and nothing is missing any more
    again = launch.train_missing(jobs, device="cpu", cache_dir=tmp_path, workers=2)
    assert len(again) == 3 and not any(j.missing for j in again)
    done = launch.train_many([("addition", 0)], learned, device="cpu", cache_dir=tmp_path)
    assert done["addition", 0].from_cache
    assert done["addition", 0].metrics["steps"] == TINY.steps * 10


def test_exception_mid_training_leaves_nothing(tmp_path, monkeypatch):
    real_lr_at = train_profile.TrainProfile.lr_at

    def failing_lr_at(self, step, *args):
        if step == 6:
            raise RuntimeError("interrupted")
        return real_lr_at(self, step, *args)

    monkeypatch.setattr(train_profile.TrainProfile, "lr_at", failing_lr_at)
    with pytest.raises(RuntimeError, match="interrupted"):
        rc.train_or_load("addition", 0, TINY, device="cpu", progress=False)
    runs = tmp_path / "cache" / "runs"
    assert not runs.exists() or not any(runs.iterdir())
    monkeypatch.undo()
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    assert not rc.train_or_load("addition", 0, TINY, device="cpu", progress=False).from_cache


def test_process_killed_while_writing_leaves_nothing_loadable(tmp_path):
    """A child process trains, starts writing, and is SIGKILLed after the weights are on disk
    but before the commit: the parent must retrain, not load the half-written run."""
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os, signal
        from dataclasses import replace
        from nopelib.training import profiles
        from nopelib.training import runs as rc
        from nopelib.core.model import GPTConfig
        tiny = replace(profiles.PROFILES["cpu"], name="tiny", model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
                       steps=12, batch_size=8, warmup_steps=3, n_train=96, n_test=40, n_eval=40,
                       eval_batch_size=16, log_every=5, seeds=(0,), task_budgets=(),
                       curve_every=0, n_curve=40)
        real_save = rc.save_model
        def save_then_die(model, path):
            real_save(model, path)
            os.kill(os.getpid(), signal.SIGKILL)
        rc.save_model = save_then_die
        rc.train_or_load("addition", 0, tiny, device="cpu", cache_dir={str(cache)!r}, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    leftovers = list((cache / "runs").iterdir())
    assert leftovers and all(p.name.startswith(".tmp-") for p in leftovers)  # partial, uncommitted
    assert any((p / "model.safetensors").is_file() for p in leftovers)
    run = rc.train_or_load("addition", 0, TINY, device="cpu", cache_dir=cache, progress=False)
    assert not run.from_cache
    assert rc.train_or_load("addition", 0, TINY, device="cpu", cache_dir=cache, progress=False).from_cache


def test_cache_dir_resolution(tmp_path, monkeypatch):
    assert cache.resolve_cache_dir(tmp_path / "x") == tmp_path / "x"
    assert cache.resolve_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.resolve_cache_dir() == tmp_path / "xdg" / "nopelib"


# --- profiles, devices and bad input ----------------------------------------------------------

def test_profiles():
    assert set(profiles.PROFILES) == {"cpu", "study", "paper", "paper_study"}
    study = profiles.PROFILES["study"]
    assert len(study.seeds) == 5 and set(study.claim_tasks) == set(TASKS)
    assert study.n_eval == study.n_test == 20_000 and study.n_trajectory >= 64
    assert profiles.PROFILES["paper"].model == GPTConfig()
    assert len(profiles.PROFILES["paper"].seeds) == 5
    assert profiles.PROFILES["paper"].n_eval == profiles.PROFILES["paper"].n_test
    with pytest.raises(ValueError, match="warmup_steps"):
        replace(TINY, warmup_steps=TINY.steps + 1)


def test_the_paper_study_profile_is_the_base_model_under_the_study_budget():
    paper_study, study = profiles.PROFILES["paper_study"], profiles.PROFILES["study"]
    assert paper_study.model == GPTConfig()
    assert replace(paper_study, name="study", model=study.model, n_trajectory=128,
                   curve_dense_every=0, curve_dense_until=0, precision="float32") == study
    assert (paper_study.n_trajectory, paper_study.curve_dense_every,
            paper_study.curve_dense_until, paper_study.precision) == (64, 25, 1_000,
                                                                      "bfloat16")
    # adopted after the precision check, which is committed with its verdict
    check = results.load(results.RESULTS_DIR / "precision_paper_study_reversal.json")
    assert check["provenance"]["verdict"] == "no change"


def test_records_of_the_profiles_before_the_dense_curve_are_unchanged():
    # committed studies compare the record of their day with today's (trained_files.is_current)
    for name in ("cpu", "study", "paper"):
        record = profiles.PROFILES[name].record()
        assert not set(train_profile.RECORDED_WHEN_SET) & set(record)
        assert train_profile.TrainProfile.from_record(record) == replace(profiles.PROFILES[name],
                                                                     seeds=(0,))
    record = json.loads(json.dumps(profiles.PROFILES["paper_study"].record()))
    assert record["curve_dense_every"] == 25 and record["curve_dense_until"] == 1_000
    assert record["precision"] == "bfloat16"
    assert train_profile.TrainProfile.from_record(record) == replace(
        profiles.PROFILES["paper_study"], seeds=(0,))


def test_curve_steps_are_dense_up_to_their_limit_then_sparse_and_at_the_end():
    p = replace(TINY, steps=1_000, curve_every=250, curve_dense_every=25,
                curve_dense_until=1_000)
    steps = [i for i in range(1, 2_991) if p.is_curve_step(i, end=2_990)]
    assert steps == [*range(25, 1_001, 25), 1_250, 1_500, 1_750, 2_000, 2_250, 2_500, 2_750,
                     2_990]
    plain = replace(p, curve_dense_every=0, curve_dense_until=0)
    assert [i for i in range(1, 1_001) if plain.is_curve_step(i, end=1_000)] == [250, 500, 750,
                                                                               1_000]
    assert not any(replace(plain, curve_every=0).is_curve_step(i, end=10) for i in range(1, 11))


def test_a_run_takes_its_dense_curve_points():
    p = replace(TINY, steps=13, curve_every=6, curve_dense_every=2, curve_dense_until=5)
    _, m = tr.train("reversal", 0, p, torch.device("cpu"), progress=False)
    assert m["curve"]["step"] == [2, 4, 6, 12, 13]


@pytest.mark.parametrize("change, match", [
    (dict(curve_dense_every=-1), r"curve_dense_every=-1 must be a non-negative integer"),
    (dict(curve_dense_until=2.5), r"curve_dense_until=2.5 must be a non-negative integer"),
    (dict(curve_dense_until=100), r"curve_dense_every=0 must be an integer in \[1, "
                                  r"curve_every=10\] when curve_dense_until=100"),
    (dict(curve_dense_every=11, curve_dense_until=100),
     r"curve_dense_every=11 must be an integer in \[1, curve_every=10\]"),
    (dict(curve_dense_every=5), r"curve_dense_every=5 needs curve_dense_until > 0"),
    (dict(curve_every=0, curve_dense_every=5, curve_dense_until=100),
     r"curve_dense_until=100 needs curve points \(curve_every > 0, is 0\)"),
])
def test_a_dense_curve_that_cannot_work_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        replace(TINY, **{"curve_every": 10, **change})


def test_resolve_device():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else None
    if expected is None and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        expected = "mps"
    assert devices.resolve_device("auto").type == (expected or "cpu")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(task="division"), r"task='division'.*addition"),
        (dict(profile="huge"), r"profile='huge'.*cpu.*paper"),
        (dict(device="tpu"), r"device='tpu'.*auto"),
        (dict(seed=-1), r"seed=-1"),
    ],
)
def test_bad_inputs_name_the_value_and_the_allowed_ones(kwargs, match):
    args = dict(task="addition", seed=0, profile=TINY, device="cpu", progress=False) | kwargs
    with pytest.raises(ValueError, match=match):
        rc.train_or_load(**args)


def test_unavailable_device_is_refused():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="not available"):
        devices.resolve_device("cuda")


def test_task_budgets_and_learning_curve():
    prof = replace(TINY, steps=10, task_budgets=(("addition", 14),), curve_every=5, n_curve=20)
    assert prof.for_task("addition").steps == 14 and prof.for_task("reversal").steps == 10
    _, met = tr.train("addition", 0, prof, torch.device("cpu"), progress=False)
    assert met["steps"] == 14
    assert met["curve"]["step"] == [5, 10, 14]  # every curve_every steps, and the last one
    assert all(0.0 <= a <= 1.0 for a in met["curve"]["accuracy"])
    _, plain = tr.train("addition", 0, replace(prof, curve_every=0), torch.device("cpu"),
                        progress=False)
    assert "curve" not in plain
    assert plain["loss_curve"] == met["loss_curve"]  # evaluating does not change training
    with pytest.raises(ValueError, match="task_budgets"):
        replace(TINY, task_budgets=(("addition", 1),))  # fewer steps than the warm-up


def test_a_task_budget_may_set_its_batch_and_learning_rate():
    prof = replace(TINY, task_budgets=(("addition", 14, 8, 1e-3), ("reversal", 12)))
    add, rev, idx = (prof.for_task(t) for t in ("addition", "reversal", "indexing"))
    assert (add.steps, add.batch_size, add.lr) == (14, 8, 1e-3)
    assert (rev.steps, rev.batch_size, rev.lr) == (12, TINY.batch_size, TINY.lr)
    assert (idx.steps, idx.batch_size, idx.lr) == (TINY.steps, TINY.batch_size, TINY.lr)
    assert add.task_budgets == () and add.name == TINY.name
    _, met = tr.train("addition", 0, prof, torch.device("cpu"), progress=False)
    assert met["steps"] == 14
    for bad, named in [(("addition", 14, 0, 1e-3), "batch_size"),
                       (("addition", 14, 8, -1.0), "lr"),
                       (("addition", 14, 8), "task_budgets entry"),
                       ((3, 14), "task_budgets entry")]:
        with pytest.raises(ValueError, match=named):
            replace(TINY, task_budgets=(bad,))
    with pytest.raises(ValueError, match="names a task twice"):
        replace(TINY, task_budgets=(("addition", 14), ("addition", 16)))
    with pytest.raises(ValueError, match="n_curve"):
        replace(TINY, n_curve=TINY.n_test + 1)


def test_majority_baseline():
    from nopelib.core.tasks import majority_baseline

    assert majority_baseline([("a", "1"), ("b", "2"), ("c", "1")]) == ("1", 2 / 3)
    with pytest.raises(ValueError):
        majority_baseline([])


def test_the_loop_trains_exactly_as_the_plain_nanogpt_loop(tmp_path):
    """``train.train`` (the one loop, ``fit``, with one model's step plugged in) gives the same
    weights, bit for bit, as the plain loop it replaced, written out here as the reference:
    seeded epochs of shuffled rows cut to their longest row, the warm-up and cosine rate, one
    ``train_step`` per batch. A change to the loop that moves a single bit fails here."""
    prof = replace(TINY, steps=25, log_every=4, curve_every=10)
    device = torch.device("cpu")
    model, metrics = tr.train("reversal", 3, prof, device, progress=False)

    split = make_split("reversal", 3, n_train=prof.n_train, n_test=prof.n_test)
    idx_all, tgt_all = encode_batch(split.train, block_size=MAX_SEQ_LEN)
    lengths = np.array([len(x) + len(a) + 1 for x, a in split.train])
    torch.manual_seed(3)
    ref = GPT(prof.model).train()
    opt = tr.adamw(ref.parameters(), prof)
    gen = np.random.default_rng(3)
    order, cursor, losses = gen.permutation(len(lengths)), 0, []
    for step in range(prof.steps):
        if cursor + prof.batch_size > len(lengths):
            order, cursor = gen.permutation(len(lengths)), 0
        rows = torch.from_numpy(order[cursor:cursor + prof.batch_size])
        cursor += prof.batch_size
        T = int(lengths[rows.numpy()].max()) - 1
        for group in opt.param_groups:
            group["lr"] = prof.lr_at(step)
        losses.append(float(tr.train_step(ref, opt, idx_all[rows, :T], tgt_all[rows, :T],
                                          prof.grad_clip)))
    for name, value in ref.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    assert metrics["final_loss"] == pytest.approx(np.mean(losses[-1:]), rel=1e-6)
    assert metrics["curve"]["step"] == [10, 20, 25]


# ---------------------------------------------------------------------------------------------
# a budget that follows progress (stop_at) and the trajectory (n_trajectory)

ADAPTIVE = replace(TINY, name="tiny-adaptive", steps=400, warmup_steps=2, curve_every=5,
                   n_curve=40, n_val=16, stop_at=0.5, tail_share=0.5, n_trajectory=4)


def test_a_validation_split_leaves_train_and_test_as_they_are():
    plain = make_split("ordering", 3, n_train=50, n_test=20)
    with_val = make_split("ordering", 3, n_train=50, n_test=20, n_val=10)
    assert (with_val.train, with_val.test) == (plain.train, plain.test)
    assert len(with_val.val) == 10 and plain.val == []
    inputs = [x for x, _ in with_val.train + with_val.test + with_val.val]
    assert len(set(inputs)) == len(inputs)
    with pytest.raises(ValueError, match="n_val=-1"):
        make_split("ordering", 3, n_val=-1)


def test_the_schedule_is_stable_until_the_level_then_decays_to_the_end():
    p = replace(ADAPTIVE, lr=1e-3, min_lr_ratio=0.1, warmup_steps=10)
    assert p.lr_at(4) == pytest.approx(5e-4)  # the warm-up
    assert p.lr_at(10_000) == p.lr_at(50) == 1e-3  # stable: the level is not reached yet
    assert p.lr_at(100, decay_from=100, end=150) == pytest.approx(1e-3)
    assert p.lr_at(125, decay_from=100, end=150) == pytest.approx(0.55e-3)
    assert p.lr_at(150, decay_from=100, end=150) == pytest.approx(1e-4)
    assert p.tail_steps(1000) == 500 and p.tail_steps(2) == p.curve_every


@pytest.mark.parametrize("change, match", [
    (dict(stop_at=0.9, n_val=0), "n_val"),
    (dict(stop_at=0.9, curve_every=0), "curve_every"),
    (dict(stop_at=1.5), "stop_at=1.5"),
    (dict(tail_share=0.0), "tail_share=0.0"),
    (dict(n_trajectory=-1), "n_trajectory=-1"),
    (dict(n_trajectory=4, curve_every=0, stop_at=0.0), "n_trajectory=4"),
])
def test_an_adaptive_profile_that_cannot_work_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        replace(ADAPTIVE, **change)


def test_a_level_never_reached_trains_to_the_cap():
    p = replace(ADAPTIVE, steps=20, stop_at=1.0)  # a tiny model is not exact on every input
    _, m = tr.train("reversal", 0, p, torch.device("cpu"), progress=False)
    assert m["decay_from"] is None and m["steps"] == 20
    assert m["curve"]["step"] == [5, 10, 15, 20]


def test_a_level_reached_at_once_ends_after_its_tail(monkeypatch):
    monkeypatch.setattr(tr, "evaluate", lambda *args, **kwargs: 1.0)
    _, m = tr.train("reversal", 0, ADAPTIVE, torch.device("cpu"), progress=False)
    assert m["decay_from"] == 5 and m["steps"] == 5 + ADAPTIVE.tail_steps(5) == 10
    assert m["curve"]["step"] == [5, 10]


def test_a_task_lost_in_the_tail_restarts_the_tail_once_it_is_back(monkeypatch):
    # validation (16 examples) at the level at step 5, lost at 10, back at 15: the run goes
    # on past its first end (10) and trains a whole tail again from 15
    vals = iter([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(tr, "evaluate", lambda model, examples, batch: next(vals)
                        if len(examples) == ADAPTIVE.n_val else 1.0)
    p = replace(ADAPTIVE, relearn_below=0.5)
    _, m = tr.train("reversal", 0, p, torch.device("cpu"), progress=False)
    assert m["decay_from"] == 5 and m["tail_restarts"] == [15]
    assert m["steps"] == 15 + p.tail_steps(15) == 23
    assert m["curve"]["step"] == [5, 10, 15, 20, 23]
    with pytest.raises(ValueError, match="relearn_below=0.6"):
        replace(ADAPTIVE, relearn_below=0.6)


def test_the_trajectory_scores_the_fixed_inputs_from_initialisation_on():
    _, m = tr.train("indexing", 2, replace(ADAPTIVE, steps=10, stop_at=1.0),
                    torch.device("cpu"), progress=False)
    texts = sample_inputs("indexing", ADAPTIVE.n_trajectory, seed=tr.TRAJECTORY_SEED)
    init = layer_scores(random_model(ADAPTIVE.model, seed=2), texts).mean(0)
    assert m["scores_init"] == pytest.approx(init.tolist(), abs=1e-12)
    assert len(m["curve"]["scores"]) == len(m["curve"]["step"]) == 2
    assert all(len(row) == ADAPTIVE.model.n_layer + 1 for row in m["curve"]["scores"])
    assert run_entry.metrics_problem({**m, "accuracy": 0.5, "n_test": 1, "seed": 2,
                               "task": "indexing"}) is None
    bad = {**m, "accuracy": 0.5, "n_test": 1, "seed": 2, "task": "indexing",
           "curve": {**m["curve"], "scores": m["curve"]["scores"][:1]}}
    assert "curve.scores" in run_entry.metrics_problem(bad)


def test_scoring_the_trajectory_leaves_the_run_as_it_would_be_unscored():
    # numba's OpenMP start-up resets the thread count torch uses: scoring a run along its
    # training must neither change the run's bits nor the threads it trains on
    plain = replace(ADAPTIVE, steps=15, stop_at=1.0, n_trajectory=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m0, a = tr.train("ordering", 0, plain, torch.device("cpu"), progress=False)
        m1, b = tr.train("ordering", 0, replace(plain, n_trajectory=4), torch.device("cpu"),
                         progress=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert a["loss_curve"] == b["loss_curve"]
    for p0, p1 in zip(m0.parameters(), m1.parameters()):
        assert torch.equal(p0, p1)
