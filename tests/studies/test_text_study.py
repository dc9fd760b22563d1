"""Language models on real text (nopelib.training.text_lm) and the text study's command
(nopelib.studies.text_study): bits per character, a resumable run, a tiny study's valid file."""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from nopelib.core import corpus
from nopelib.rules import beyond_claims
from nopelib.store import checkpoint as ck
from nopelib.results import files as results, text_tables
from nopelib.studies import text_study as ts
from nopelib.training import text_lm as tl

TINY = tl.TEXT_PROFILES["text_tiny"]


@pytest.fixture(autouse=True)
def _setup(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(ck.SECONDS_ENV, "3600")
    monkeypatch.setattr(ts, "PROBE_FIT_TOKENS", 3_000)  # the probes' machinery, not their power
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def kjv() -> corpus.Corpus:
    return corpus.load()


def test_a_model_that_predicts_nothing_pays_log2_of_the_vocabulary(kjv):
    model = tl.GPT(TINY.config("none", len(kjv.vocab)))
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # tied head: every logit 0, a uniform guess
    rows = kjv.rows("test", 33)[:5]
    assert tl.bits_per_char(model, rows) == pytest.approx(math.log2(len(kjv.vocab)), rel=1e-6)
    # the unigram baseline: the test books under the training books' character counts
    train, test = Counter(kjv.texts["train"]), Counter(kjv.texts["test"])
    total = sum(train.values()) + len(kjv.vocab)
    bits = -sum(n * math.log2((train[c] + 1) / total) for c, n in test.items())
    assert tl.unigram_bits(kjv) == pytest.approx(bits / sum(test.values()), rel=1e-9)
    with pytest.raises(ValueError, match="rows must have shape"):
        tl.bits_per_char(model, rows[:, :1])


def test_profiles_and_encodings_are_checked():
    with pytest.raises(ValueError, match="encoding='sinusoidal' is unknown"):
        TINY.config("sinusoidal", 65)
    with pytest.raises(ValueError, match="context=2000"):
        tl.TextProfile(name="x", context=2000)
    with pytest.raises(ValueError, match="profile='big' is unknown"):
        tl.get_text_profile("big")
    assert tl.TextProfile.from_record(TINY.record()) == TINY
    # a learned table holds the context; NoPE has none to outgrow
    assert TINY.config("learned", 65).block_size == TINY.context
    assert TINY.config("none", 65).block_size == tl.REACH


def test_a_stopped_text_run_resumes_bit_for_bit(kjv, tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    whole, m = tl.train_text(kjv, "learned", 1, TINY, cpu)
    store = functools.partial(ck.RunCheckpoints, tmp_path / "ck", "k", every_steps=4)
    real, calls = tl.train_step, {"n": 0}

    def stop_at_11(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(tl, "train_step", stop_at_11)
        with pytest.raises(KeyboardInterrupt):
            tl.train_text(kjv, "learned", 1, TINY, cpu, store())
    resumed, r = tl.train_text(kjv, "learned", 1, TINY, cpu, store())
    assert r["resumed_at"] == [8] and m["resumed_at"] == []
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert r["loss_curve"] == m["loss_curve"] and r["curve"]["val_bpc"] == m["curve"]["val_bpc"]
    assert m["curve"]["step"] == [10, 20, 30] and len(m["curve"]["scores"][0]) == 3


def test_a_tiny_text_study_writes_a_valid_file_and_reads_back_from_the_cache(tmp_path):
    out = tmp_path / "text_tiny.json"
    argv = ["--profile", "text_tiny", "--seeds", "0", "--out", str(out)]
    ts.main(argv)
    doc = results.load(out)
    assert [(r["encoding"], r["seed"]) for r in doc["runs"]] == [("none", 0), ("learned", 0)]
    nope, learned = doc["runs"]
    assert sorted(map(int, nope["scores"]["trained"])) == list(beyond_claims.TEXT_LENGTHS)
    assert sorted(map(int, learned["scores"]["init"])) == [TINY.context]
    assert {p["length"] for p in nope["probes"]} == {TINY.context, tl.LONGEST}
    assert {p["stage"] for p in learned["probes"]} == {"init", "trained"}
    assert doc["provenance"]["unigram_bpc"] == pytest.approx(tl.unigram_bits(corpus.load()))
    assert len(nope["samples"]) == len(ts.PROMPTS)
    assert all(len(s["text"]) == ts.SAMPLE_CHARS for s in nope["samples"])
    # the chapter's tables of the file: one row per (run, stage, length, layer) of scores,
    # one per run of bits, and NoPE minus learned paired by seed
    tables = text_tables.frames(doc)
    layers = TINY.n_layer + 1
    assert len(tables["scores"]) == layers * sum(
        len(by_length) for r in doc["runs"] for by_length in r["scores"].values())
    first = tables["scores"].query("encoding == 'none' and stage == 'trained' and layer == 1")
    assert first.set_index("length").score[TINY.context] == nope["scores"]["trained"][
        str(TINY.context)]["mean"][1]
    bits = text_tables.bpc_summary(tables["bpc"], doc["provenance"]["unigram_bpc"])
    assert list(bits.encoding) == ["none", "learned", "NoPE - learned"]
    assert bits.test_bpc.iloc[2] == pytest.approx(nope["test_bpc"] - learned["test_bpc"])
    assert len(tables["samples"]) == 2 * len(ts.PROMPTS)
    assert set(tables["probes"].stage) == {"init", "trained"}
    ts.main(argv)  # every run from the results cache: the same runs
    assert results.load(out)["runs"] == doc["runs"]
    # an edited file is refused, naming the field
    bad = {**doc, "runs": [{**nope, "scores": {**nope["scores"], "trained": {
        k: v for k, v in nope["scores"]["trained"].items() if k != "1024"}}}, learned]}
    with pytest.raises(results.ResultsError, match=r"runs\[0\].scores.trained"):
        results.validate(bad, "text", "edited")


@pytest.mark.parametrize("argv, match", [
    (["--encodings", "rope"], "--encodings"),
    (["--seeds", "1", "1"], "--seeds"),
    (["--workers", "0"], "--workers"),
    (["--out", "/tmp/study.json"], "text_<name>.json"),
])
def test_bad_arguments_exit_before_any_training(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_:
        ts.main(["--profile", "text_tiny", *argv])
    assert exit_.value.code == 2 and match in capsys.readouterr().err


def test_the_study_scores_the_rules_windows_of_the_test_books(kjv):
    model = tl.GPT(TINY.config("learned", len(kjv.vocab))).eval()
    scores, probes = ts.measure(model, "learned", TINY)
    assert list(scores) == [str(TINY.context)]  # a learned table stops at its context
    w = kjv.windows("test", TINY.context, beyond_claims.TEXT_WINDOWS, beyond_claims.TEXT_WINDOW_SEED)
    direct = tl.layer_scores(model, w)  # [windows, L+1]
    assert scores[str(TINY.context)]["mean"] == pytest.approx(direct.mean(0).tolist())
    other = tl.layer_scores(model, kjv.windows("test", TINY.context, beyond_claims.TEXT_WINDOWS,
                                               beyond_claims.TEXT_WINDOW_SEED + 7))
    assert not np.allclose(direct.mean(0), other.mean(0))  # other windows, other scores
    assert {(p["layer"], p["features"]) for p in probes} == {
        (layer, f) for layer in range(TINY.n_layer + 1) for f in ("cosine", "variance",
                                                                  "hidden")}
