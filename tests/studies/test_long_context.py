"""Tests of the long-sequence study: the resolution comparisons, their outcomes, the theory's
probabilities, the threshold reading, the frames and the committed file's schema."""

import json

import numpy as np
import pandas as pd
import pytest

from nopelib.core.model import GPTConfig
from nopelib.rules import beyond_claims, claims
from nopelib.results import files as results
from nopelib.studies import long_context as lc

SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=32)


def test_octaves_and_triples_stay_inside_the_prefix():
    assert lc.octaves(100) == [16, 32, 64]
    tr = lc.resolution_triples(64)
    assert set(tr.octave) == {16, 32, 64}
    assert ((tr.k >= tr.octave // 2) & (tr.k < tr.octave)).all()
    assert ((tr.i >= 0) & (tr.i < tr.j) & (tr.j == tr.k - 1)).all()
    assert tr.groupby("octave").d.max().to_dict() == {16: 8, 32: 16, 64: 32}
    with pytest.raises(ValueError, match="T=8"):
        lc.octaves(8)


def test_order_outcomes_read_the_neighbour_against_the_far_position():
    T = 32
    dist = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    C = np.stack([-dist, dist]).astype(float)  # perfect order, reversed order
    hits = lc.order_outcomes(C, lc.resolution_triples(T))
    assert hits[0].all() and not hits[1].any()


def test_threshold_distance():
    d = np.array([2, 4, 8, 16])
    assert lc.threshold_distance(d, [0.5, 0.6, 0.8, 0.9]) == pytest.approx(
        np.exp(np.log(4) + 0.75 * np.log(2)))
    assert lc.threshold_distance(d, [0.8, 0.9, 1.0, 1.0]) == 2
    assert np.isnan(lc.threshold_distance(d, [0.5, 0.5, 0.6, 0.7]))


def test_predicted_order_is_a_probability_and_wider_models_resolve_more():
    tokens = list(range(64))  # distinct tokens: the closed form's plainest case
    tr = lc.resolution_triples(64)
    narrow = lc.predicted_order(GPTConfig(n_embd=192), tokens, tr)
    wide = lc.predicted_order(GPTConfig(n_embd=768), tokens, tr)
    assert ((narrow >= 0) & (narrow <= 1)).all()
    # the signal is the same; the noise shrinks with the width: every comparison is surer
    assert (wide >= narrow - 1e-9).all() and wide.mean() > narrow.mean()


def test_long_run_frames_and_resolution(tmp_path):
    runs = [{"n_embd": SMALL.n_embd, "window": w, "seed": s,
             **lc.long_run(SMALL, s, 64, [32, 64], w)} for w in (None, 8) for s in range(3)]
    frames = lc.run_frames(runs)
    scores = lc.score_table(frames["scores"])
    assert set(scores.window) == {0, 8} and (scores.n_seeds == 3).all()
    assert scores.predicted.notna().eq(scores.layer == 1).all()
    assert ((scores.score > 0) & (scores.score < 1)).all()
    res = lc.resolution(frames["order"])
    assert len(res) == 2 * 3 * 3  # windows x layers x octaves
    assert res.predicted.notna().sum() <= (res.layer == 1).sum()
    # the file round-trips through the schema
    doc = {"provenance": results.provenance("test", [], 0.0, T=64, base=SMALL.to_dict()),
           "runs": runs}
    path = tmp_path / "long_test.json"
    results.write(path, doc, "long")
    assert results.load(path)["runs"][0]["scores"] == runs[0]["scores"]
    bad = json.loads(path.read_text())
    bad["runs"][0]["order"][0][-1] = 1.5
    path.write_text(json.dumps(bad))
    with pytest.raises(results.ResultsError, match="order"):
        results.load(path)


def test_window_changes_nothing_when_it_covers_the_sequence():
    a = lc.long_run(SMALL, 0, 32, [32])
    b = lc.long_run(SMALL, 0, 32, [32], window=32)
    assert a["scores"] == b["scores"] and a["order"] == b["order"]
    np.testing.assert_allclose(np.array(a["predicted_order"]), np.array(b["predicted_order"]))


def test_cli_refuses_bad_flags_before_work(tmp_path, capsys):
    for argv in (["--out", str(tmp_path / "long_x.json"), "--T", "8"],
                 ["--out", str(tmp_path / "long_x.json"), "--widths", "100"],
                 ["--out", str(tmp_path / "long_x.json"), "--seeds", "0", "1"],
                 ["--out", str(tmp_path / "x.json")]):
        with pytest.raises(SystemExit) as exc:
            lc.main(argv)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--T 8" in err and "--widths 100" in err and "long_*.json" in err


def test_figures_draw_every_model_and_the_prediction():
    from nopelib.book import long_sequences, viz

    runs = [{"n_embd": SMALL.n_embd, "window": w, "seed": s,
             **lc.long_run(SMALL, s, 64, [32, 64], w)} for w in (None, 8) for s in range(3)]
    frames = lc.run_frames(runs)
    fig = viz.score_lengths(lc.score_table(frames["scores"]), [1, 2], "t")
    names = [t.name for t in fig.data]
    assert "32 wide, layer 1" in names and "32 wide, window 8, layer 1 predicted" in names
    assert len(fig.data) == 2 * 3  # per model: two layers and the prediction
    res = lc.resolution(frames["order"])
    assert len(long_sequences.resolution_lines(res, 1, "t").data) == 4  # measured + predicted
    assert len(long_sequences.resolution_lines(res, 2, "t").data) == 2  # no prediction past 1
    curves = long_sequences.order_curves(frames["order"], SMALL.n_embd, 0, 1, 0.75, "t")
    assert len(curves.data) == 2 * len(lc.octaves(64))
    up_to = lc.resolved_up_to(res)
    assert set(up_to.model) == {"32 wide", "32 wide, window 8"}
    text = lc.verdict_lines(claims.claim_table(
        beyond_claims.long_claims(frames["scores"], frames["order"]), by="group"))
    assert text.count("\n") == len(beyond_claims.LONG_CLAIMS) - 1 and "**" in text
    table = claims.claim_table(beyond_claims.long_claims(frames["scores"], frames["order"]),
                               by="group")
    words = lc.summary(table, up_to, 64)
    assert words.count("- **") == 2 and "at 64 tokens the score" in words


def test_a_window_s_covered_octaves_are_not_counted_twice_and_agreements_say_their_bounds():
    rows = [dict(n_embd=384, window=window, layer=1, octave=octave, d=d, seed=seed,
                 measured=0.99 if d == 2 else 0.5 + 0.01 * seed, predicted=0.9)
            for window in (0, 64) for octave in (32, 64, 128) for d in (2, 4, 8)
            for seed in range(3)]
    res = lc.resolution(pd.DataFrame(rows))
    kept = set(zip(res.window, res.octave))
    assert kept == {(0, 32), (0, 64), (0, 128), (64, 128)}  # 32 and 64 fit in the window
    cells = pd.DataFrame({"d_hi": [5.0, np.nan, np.nan, 3.0]})
    agree = pd.Series(["agrees", "agrees", "disagrees", "uninformative"])
    assert lc.agreement_bounds(cells, agree) == (1, 1)
