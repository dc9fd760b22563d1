"""Tests of the position probe: feature shapes and values, leakage controls, the split, the
ridge and MLP probes, positive and negative control models, paired comparisons, errors."""

import numpy as np
import pandas as pd
import pytest
import torch

from nopelib.core.features import (FEATURE_SETS, cosine_window_features, features, hidden_features,
                                   model_states, random_token_sequences, variance_window_features,
                                   window_positions)
from nopelib.core.metrics import cosine_similarity_matrix, embedding_variance
from nopelib.core.probe import (ProbeConfig, RidgeConfig, probe_model, fit_probe, probe_layers,
                                split_sequences)
from nopelib.core.tasks import CHARS, decode, encode, make_split
from nopelib.rules import init_claims
from nopelib.core.one_model import random_model
from nopelib.book.probes import CHAPTER_PARAMS
from nopelib.studies.probe_study import (format_lift, metric_intervals, paired_differences,
                                         random_study, sequences_for, task_sequences,
                                         trained_study, verdict_layers, with_interval)
from nopelib.training.profiles import PROFILES


@pytest.fixture(scope="module")
def small_states() -> torch.Tensor:
    """States [3, 120, 24, 48] of a small random 2-layer NoPE model on i.i.d. token sequences."""
    model = random_model(n_layer=2, n_head=2, n_embd=48, seed=0)
    return model_states(model, random_token_sequences(120, 24, CHARS, seed=0))


def test_feature_shapes_and_values():
    states = torch.randn(2, 5, 12, 16)  # [L, N, T, d]
    w = 3
    cos = cosine_window_features(states, w)
    var = variance_window_features(states, w)
    hid = hidden_features(states, w)
    assert cos.shape == (2, 5, 9, 3)
    assert var.shape == (2, 5, 9, 3)
    assert hid.shape == (2, 5, 9, 16)
    C = cosine_similarity_matrix(states)  # [2, 5, 12, 12]
    v = embedding_variance(states)  # [2, 5, 12]
    for s, k in enumerate(window_positions(12, w)):
        for j in range(1, w + 1):
            torch.testing.assert_close(cos[..., s, j - 1], C[..., k, k - j])
        for j in range(w):
            torch.testing.assert_close(var[..., s, j], v[..., k - j])
        torch.testing.assert_close(hid[..., s, :], states[..., k, :])


def test_window_positions():
    assert list(window_positions(6, 2)) == [2, 3, 4, 5]


def test_random_token_sequences_are_reproducible_and_use_the_alphabet():
    a = random_token_sequences(10, 7, "0123+", seed=3)
    b = random_token_sequences(10, 7, "0123+", seed=3)
    assert a.shape == (10, 7)
    assert torch.equal(a, b)
    assert not torch.equal(a, random_token_sequences(10, 7, "0123+", seed=4))
    drawn = set(random_token_sequences(2000, 1, "0123+", 0).unique().tolist())
    assert drawn == set(encode("0123+"))


@pytest.mark.parametrize("kind", FEATURE_SETS)
def test_layer0_is_at_chance(small_states, kind):
    """Token embeddings of i.i.d. tokens carry no position: every probe must be at chance."""
    positions = window_positions(small_states.shape[2], 4)
    res = fit_probe(features(small_states[0], kind, 4), positions, seed=0)
    assert abs(res.r) < 0.1, f"{kind}: layer-0 R = {res.r:.3f}"


def test_shuffled_targets_have_no_skill_where_true_targets_do(small_states):
    """No skill = NRMSE >= 0.97; R of a near-constant prediction can align by accident. The
    hidden state is the feature set with a clear layer-1 signal in this small model."""
    kind = "hidden"
    positions = window_positions(small_states.shape[2], 4)
    feats = features(small_states[1], kind, 4)
    mlp = ProbeConfig()  # the paper's probe; the ridge probe's case is the next test
    real = fit_probe(feats, positions, seed=0, config=mlp)
    control = fit_probe(feats, positions, seed=0, config=mlp, shuffle_targets=True)
    assert real.nrmse < 0.95, f"{kind}: layer-1 NRMSE = {real.nrmse:.3f}: the control would show nothing"
    assert control.nrmse >= 0.97, f"{kind}: shuffled-target NRMSE = {control.nrmse:.3f}"


def test_ridge_shuffled_targets_have_no_skill():
    """Position along a random direction plus noise: the ridge probe reads it with true
    targets and has no skill (NRMSE >= 0.97) with shuffled ones."""
    rng = np.random.default_rng(3)
    N, S, F = 150, 20, 6
    positions = np.arange(4, 4 + S)
    feats = positions[None, :, None] * rng.normal(size=F) + rng.normal(scale=4.0, size=(N, S, F))
    real = fit_probe(feats, positions, seed=0)
    control = fit_probe(feats, positions, seed=0, shuffle_targets=True)
    assert real.nrmse < 0.7, real.nrmse
    assert control.nrmse >= 0.97, control.nrmse


@pytest.mark.parametrize("config", [RidgeConfig(), ProbeConfig()], ids=["ridge", "mlp"])
def test_linearly_encoded_position_is_found(config):
    """Features = position along a random direction plus noise: the probe must recover it."""
    rng = np.random.default_rng(0)
    N, S, F = 100, 20, 6
    positions = np.arange(5, 5 + S)
    direction = rng.normal(size=F)
    feats = positions[None, :, None] * direction + rng.normal(scale=2.0, size=(N, S, F))
    res = fit_probe(feats, positions, seed=0, config=config)
    assert res.r > 0.9, f"R = {res.r:.3f}"
    assert res.nrmse < 0.45, f"NRMSE = {res.nrmse:.3f}"


def test_split_is_by_sequence():
    rng = np.random.default_rng(1)
    N, S = 50, 7
    res = fit_probe(rng.normal(size=(N, S, 3)), np.arange(S), seed=2)
    train, test = set(res.train_sequences.tolist()), set(res.test_sequences.tolist())
    assert not train & test
    assert train | test == set(range(N))
    assert len(res.pred) == len(test) * S  # every token of a test sequence, none of the others
    rest, held = split_sequences(40, 0.25, seed=0)
    assert len(held) == 10 and not set(rest) & set(held) and len(rest) + len(held) == 40


def test_deterministic_for_a_seed(small_states):
    positions = window_positions(small_states.shape[2], 4)
    feats = features(small_states[1], "cosine", 4)
    a, b = fit_probe(feats, positions, seed=5), fit_probe(feats, positions, seed=5)
    np.testing.assert_array_equal(a.pred, b.pred)
    assert a.nrmse == b.nrmse and a.r == b.r
    c = fit_probe(feats, positions, seed=6)
    assert not np.array_equal(a.pred, c.pred)


def test_probe_layers_table(small_states):
    table = probe_layers(small_states, w=4, seeds=(0,), kinds=("cosine", "variance"), layers=[0, 1])
    assert list(table.columns) == ["layer", "features", "seed", "nrmse", "r"]
    assert len(table) == 4


def test_probe_layers_in_parallel_equals_one_fit_at_a_time(small_states):
    """The ridge fits run on several threads; each row is the fit made alone, in order, and
    torch's thread count is as before."""
    threads = torch.get_num_threads()
    table = probe_layers(small_states, w=4, seeds=(0, 1), layers=[1, 2])
    assert torch.get_num_threads() == threads
    positions = window_positions(small_states.shape[2], 4)
    alone = [(layer, kind, seed,
              fit_probe(features(small_states[layer], kind, 4), positions, seed))
             for layer in (1, 2) for kind in FEATURE_SETS for seed in (0, 1)]
    assert [tuple(r) for r in table[["layer", "features", "seed"]].to_numpy()] == [
        a[:3] for a in alone]
    assert table.nrmse.tolist() == [a[3].nrmse for a in alone]
    assert table.r.tolist() == [a[3].r for a in alone]


@pytest.mark.parametrize("w", [0, -1, 2.5])
def test_bad_window_raises(w):
    states = torch.randn(3, 10, 8)
    for fn in (cosine_window_features, variance_window_features, hidden_features):
        with pytest.raises(ValueError, match="w="):
            fn(states, w)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="T=5"):
        cosine_window_features(torch.randn(3, 5, 8), 5)
    with pytest.raises(ValueError, match="states"):
        variance_window_features(torch.randn(5, 8), 2)
    with pytest.raises(ValueError, match="positions"):
        fit_probe(np.zeros((10, 4, 2)), np.arange(5))
    with pytest.raises(ValueError, match="feats"):
        fit_probe(np.zeros((10, 4)), np.arange(4))
    with pytest.raises(ValueError, match="kind="):
        features(torch.randn(3, 10, 8), "norm", 2)
    with pytest.raises(ValueError, match="width="):
        ProbeConfig(width=0)
    with pytest.raises(ValueError, match="n_random="):
        RidgeConfig(n_random=-1)
    with pytest.raises(ValueError, match="penalties="):
        RidgeConfig(penalties=(1.0, 0.0))
    with pytest.raises(ValueError, match="config="):
        fit_probe(np.zeros((10, 4, 2)), np.arange(4), config="ridge")
    with pytest.raises(ValueError, match="valid"):
        fit_probe(np.zeros((10, 4, 2)), np.arange(4), valid=np.ones((10, 3), dtype=bool))
    with pytest.raises(ValueError, match="alphabet="):
        random_token_sequences(2, 3, "", 0)


def test_nonlinear_position_is_found():
    """Features = 1/position (the variance law) plus noise: the random units must bend it back."""
    rng = np.random.default_rng(1)
    N, S = 200, 24
    positions = np.arange(8, 8 + S)
    feats = (1.0 / positions)[None, :, None] + rng.normal(scale=0.002, size=(N, S, 1))
    ridge = fit_probe(feats, positions, seed=0)
    linear = fit_probe(feats, positions, seed=0, config=RidgeConfig(n_random=0))
    assert ridge.nrmse < 0.5 * linear.nrmse, (ridge.nrmse, linear.nrmse)
    assert ridge.r > 0.95, ridge.r


def test_valid_mask_drops_tokens():
    """Tokens marked invalid (past a sequence's end) are neither fitted nor scored."""
    rng = np.random.default_rng(2)
    N, S = 60, 10
    valid = np.arange(S)[None, :] < rng.integers(3, S + 1, size=N)[:, None]  # [N, S]
    feats = np.where(valid[..., None], rng.normal(size=(N, S, 3)), np.nan)
    res = fit_probe(feats, np.arange(S), seed=0, valid=valid)
    assert len(res.pred) == valid[res.test_sequences].sum()
    assert np.isfinite(res.pred).all()
    assert set(res.true.tolist()) <= set(range(S))


def test_positive_and_negative_control_models():
    """Same probe, same data: a sinusoidal-PE model shows position in the full state, a
    bidirectional NoPE model (permutation-equivariant) shows none with any feature set."""
    ids = random_token_sequences(300, 24, CHARS, seed=1)
    kw = dict(n_layer=2, n_head=2, n_embd=48, seed=0)
    pe = probe_model(random_model(pos_encoding="sinusoidal", **kw), ids, [4], kinds=("hidden",))
    assert (pe.r >= 0.9).all(), pe
    bidir = probe_model(random_model(causal=False, **kw), ids, [4])
    assert (bidir.r.abs() <= 0.1).all(), bidir
    causal = probe_model(random_model(**kw), ids, [4], kinds=("hidden",), layers=[1])
    assert (causal.r > 0.3).all(), causal


def test_format_lift_is_each_layer_minus_the_same_models_layer_0():
    rows = [dict(layer=layer, features=kind, model_seed=m, seed=s,
                 nrmse=1.0 - 0.1 * layer - 0.01 * m, r=0.2 * layer + 0.1 * m + 0.01 * s)
            for layer in range(3) for kind in ("cosine", "variance")
            for m in range(4) for s in range(2)]
    lift = format_lift(pd.DataFrame(rows))
    assert list(lift.index.get_level_values("layer").unique()) == [1, 2]
    # every model's layer 0 is subtracted from its own layers: no spread is left
    np.testing.assert_allclose(lift.loc[(2, "cosine"), ["r lift", "r lo", "r hi"]], 0.4)
    np.testing.assert_allclose(lift.loc[(1, "variance"), "nrmse lift"], -0.1)
    assert (lift["n"] == 4).all()
    with pytest.raises(ValueError, match="layer 0"):
        format_lift(pd.DataFrame(rows).query("layer > 0"))


def test_positive_control_model_finds_position_in_the_full_state():
    """The amplitude-matched position embedding (init_claims.POSITIVE_CONTROL) is visible to the
    full-state probe; the rule reads "finds" and "misses" against init_claims.FINDS_AT."""
    ids = random_token_sequences(300, 24, CHARS, seed=1)
    net = random_model(n_layer=2, n_head=2, n_embd=48, seed=0, **init_claims.POSITIVE_CONTROL)
    table = probe_model(net, ids, [4])
    control = init_claims.positive_control(table)
    assert control.loc[(0, "hidden"), "verdict"] == "finds", control
    assert set(control.verdict) <= {"finds", "misses"}
    low = table.assign(r=init_claims.FINDS_AT - 0.01)
    assert (init_claims.positive_control(low).verdict == "misses").all()
    with pytest.raises(ValueError, match="no probe rows"):
        init_claims.positive_control(table.iloc[:0])


def test_probe_model_windows_and_lengths():
    model = random_model(n_layer=1, n_head=2, n_embd=32, seed=0)
    ids = random_token_sequences(40, 12, CHARS, seed=0)
    table = probe_model(model, ids, [2, 3], kinds=("cosine",), layers=[1])
    assert sorted(table.w) == [2, 3] and set(table.layer) == {1}
    lengths = np.full(40, 8)
    short = probe_model(model, ids, [2], kinds=("cosine",), layers=[1], lengths=lengths)
    full = probe_model(model, ids[:, :8], [2], kinds=("cosine",), layers=[1])
    # causal model: padding after the length changes nothing before it
    np.testing.assert_allclose(short[["nrmse", "r"]], full[["nrmse", "r"]], rtol=1e-4)
    with pytest.raises(ValueError, match="lengths"):
        probe_model(model, ids, [2], lengths=np.full(39, 8))
    with pytest.raises(ValueError, match="windows"):
        probe_model(model, ids, [])


def test_sequences_for_gives_the_fitting_tokens():
    config = RidgeConfig()
    n = sequences_for(1000, 20, 5, config)
    states = torch.randn(n, 20, 4)
    res = fit_probe(states[:, 5:], window_positions(20, 5), seed=0, config=config)
    n_train_tokens = len(res.train_sequences) * 15
    n_fit_tokens = n_train_tokens - round(len(res.train_sequences) * config.val_frac) * 15
    assert n_fit_tokens >= 1000
    assert sequences_for(1000, 20, 5, config) < sequences_for(2000, 20, 5, config)


def test_task_sequences_are_held_out_examples_giving_the_fitting_tokens():
    prof, config, w = PROFILES["cpu"], RidgeConfig(), 4
    fit_frac = (1 - config.test_frac) * (1 - config.val_frac)
    counts = {}
    for task in ("addition", "reversal"):
        ids, lengths = task_sequences(task, 0, PROFILES["cpu"], 500, w, config)
        n = len(ids)
        test = make_split(task, 0, n_train=prof.n_train, n_test=prof.n_test).test[:n]
        assert lengths.shape == (n,)
        for row, length, (text, answer) in zip(ids.tolist(), lengths, test):
            assert decode(row[:length]) == text + answer
        probed = np.clip(lengths - w, 0, None)
        # just enough sequences: one fewer would not give the fitting tokens on average
        assert probed.sum() * fit_frac >= 500 > probed[:-1].sum() * fit_frac
        counts[task] = n
    assert counts["addition"] > counts["reversal"]  # shorter sequences, more of them
    with pytest.raises(ValueError, match="fit_tokens=0"):
        task_sequences("addition", 0, PROFILES["cpu"], 0, w, config)


def _table(d_nrmse: list[float], d_r: list[float]) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for seed, (dn, dr) in enumerate(zip(d_nrmse, d_r)):
        rows.append(dict(layer=1, features="variance", seed=seed, nrmse=0.8, r=0.5))
        rows.append(dict(layer=1, features="cosine", seed=seed, nrmse=0.8 + dn, r=0.5 + dr))
        rows.append(dict(layer=1, features="hidden", seed=seed, nrmse=0.1, r=0.99))
    return pd.DataFrame(rows)


def test_paired_differences():
    diffs = paired_differences(_table([-0.1] * 3, [0.2] * 3))
    assert list(diffs.columns) == ["layer", "seed", "d_nrmse", "d_r"]
    np.testing.assert_allclose(diffs.d_r, 0.2)
    with pytest.raises(ValueError, match="both"):
        paired_differences(_table([-0.1] * 3, [0.2] * 3).query("features != 'cosine'"))


def test_metric_intervals():
    ci = metric_intervals(_table([-0.1, -0.12, -0.09], [0.1, 0.08, 0.12]))
    assert ci.loc[(1, "hidden"), "r"] == pytest.approx(0.99)
    row = ci.loc[(1, "cosine")]
    assert row["r lo"] <= row["r"] <= row["r hi"] and row["n"] == 3


# --- the probes chapter's studies and reports -------------------------------------------------


def test_chapter_params_name_the_parameters_cell():
    """The rules and the probes chapter's parameters cell name the same parameters."""
    import ast
    import json
    from pathlib import Path

    book = Path(__file__).resolve().parents[2] / "book"
    cells = json.loads((book / "probes.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if "parameters" in c.get("metadata", {}).get("tags", []))
    names = [t.id for node in ast.parse(source).body for t in node.targets]
    assert names == list(CHAPTER_PARAMS)


TINY = dict(n_layer=2, n_head=2, n_embd=32)


def test_random_study_is_the_model_probed_with_its_control():
    config = RidgeConfig(n_random=16)
    table = random_study(3, 12, [2, 3], 300, config, shuffle_layers=(1,), layers=[0, 1],
                         kinds=("cosine", "hidden"), **TINY)
    real, control = table[~table.shuffled], table[table.shuffled]
    assert sorted(set(real.w)) == [2, 3] and set(real.layer) == {0, 1}
    assert set(real.seed) == {3} and len(real) == 2 * 2 * 2  # windows x layers x kinds
    assert set(control.layer) == {1} and set(control.w) == {2}  # the first window
    assert set(control.features) == set(FEATURE_SETS)
    ids = random_token_sequences(sequences_for(300, 12, 3, config), 12, CHARS, seed=3)
    alone = probe_model(random_model(seed=3, **TINY), ids, [2, 3], seeds=[3],
                        kinds=("cosine", "hidden"), layers=[0, 1], config=config)
    np.testing.assert_allclose(real[["nrmse", "r"]].to_numpy(),
                               alone[["nrmse", "r"]].to_numpy())


def test_trained_study_reads_the_task_sequences():
    model = random_model(seed=0, **TINY)
    config = RidgeConfig(n_random=16)
    table = trained_study("reversal", 0, PROFILES["cpu"], 600, 2, [0, 1], model, config)
    assert set(table.layer) == set(range(TINY["n_layer"] + 1)) and set(table.seed) == {0, 1}
    ids, lengths = task_sequences("reversal", 0, PROFILES["cpu"], 600, 2, config)
    alone = probe_model(model, ids, [2], seeds=[0, 1], config=config, lengths=lengths)
    np.testing.assert_allclose(table[["nrmse", "r"]].to_numpy(),
                               alone[["nrmse", "r"]].to_numpy())
    control = trained_study("reversal", 0, PROFILES["cpu"], 600, 2, [0], model, config,
                            shuffle=True)
    assert set(control.layer) == {1} and len(control) == len(FEATURE_SETS)


def test_verdict_layers():
    import pandas as pd

    comp = pd.DataFrame({"verdict": ["cosine", "cannot tell", "cosine"]},
                        index=pd.Index([1, 2, 3], name="layer"))
    assert verdict_layers(comp) == ("**cosine** at layers 1, 3; **variance** at layers "
                                    "none; **cannot tell** at layers 2")


def test_with_interval():
    ci = metric_intervals(_table([-0.1, -0.12, -0.09], [0.1, 0.08, 0.12]))
    text = with_interval(ci)
    assert list(text.columns) == ["nrmse", "r"] and text.index.equals(ci.index)
    row = ci.loc[(1, "cosine")]
    assert text.loc[(1, "cosine"), "r"] == (
        f"{row['r']:.3f} [{row['r lo']:.3f}, {row['r hi']:.3f}]")


def test_mlp_studies_probe_cosine_and_variance_with_the_papers_mlp(tmp_path, monkeypatch):
    from nopelib.studies.probe_study import mlp_studies

    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path))
    table = mlp_studies([0, 1], 12, 2, 200)
    assert set(table.features) == {"cosine", "variance"} and set(table.seed) == {0, 1}
    assert not table.shuffled.any() and set(table.w) == {2}


# --- the planted controls of the comparison ----------------------------------------------------


def test_planted_controls_give_their_verdict_at_every_layer(tmp_path, monkeypatch):
    """Position only in the variance reads "variance", only in the adjacency "cosine", at
    every layer >= 1 of the base model's depth, even on a tenth of the chapter's tokens and
    four seeds; layer 0 (noise) has no skill. A fit-size cut of the chapter's control."""
    from nopelib.core.planted import PLANTED
    from nopelib.studies.probe_study import planted_comparison, planted_margins, planted_studies

    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path))
    config = RidgeConfig(n_random=64)
    table = planted_studies([0, 1, 2, 3], 20, 4, 1_000, config)
    assert set(table.planted) == set(PLANTED) and set(table.seed) == {0, 1, 2, 3}
    assert set(table.layer) == set(range(7)) and set(table.features) == {"cosine", "variance"}
    layer0 = table[table.layer == 0]
    assert (layer0.nrmse >= 0.97).all(), layer0  # no skill: the chapter's chance rule
    comp = planted_comparison(table)
    assert list(comp.index.get_level_values("layer").unique()) == list(range(1, 7))
    assert (comp.verdict == comp.expected).all(), comp[["verdict", "expected"]]
    assert (comp.loc["variance"].verdict == "variance").all()
    assert (comp.loc["adjacency"].verdict == "cosine").all()
    margins = planted_margins(comp)
    assert list(margins.index) == list(PLANTED)
    assert (margins.at_expected == "6 of 6").all()
    assert (margins[["nrmse margin", "r margin"]] > 0).all().all(), margins
    assert margins.loc["variance", "nrmse bound"] == "d_nrmse lo"
    assert margins.loc["adjacency", "r bound"] == "d_r lo"


def test_planted_margins_are_the_worst_bound_on_the_expected_side():
    from nopelib.studies.probe_study import planted_margins

    index = pd.MultiIndex.from_product([["adjacency", "variance"], [1, 2]],
                                       names=["planted", "layer"])
    comp = pd.DataFrame({
        "d_nrmse lo": [-0.5, -0.6, 0.30, 0.20], "d_nrmse hi": [-0.3, -0.1, 0.4, 0.5],
        "d_r lo": [0.2, 0.4, -0.9, -0.8], "d_r hi": [0.5, 0.6, -0.7, 0.05],
        "verdict": ["cosine", "cosine", "variance", "variance"],
        "expected": ["cosine", "cosine", "variance", "variance"]}, index=index)
    m = planted_margins(comp)
    assert m.loc["adjacency", "nrmse worst"] == -0.1 and m.loc["adjacency", "nrmse layer"] == 2
    assert m.loc["adjacency", "nrmse margin"] == pytest.approx(0.1)
    assert m.loc["adjacency", "r worst"] == 0.2 and m.loc["adjacency", "r layer"] == 1
    assert m.loc["variance", "nrmse worst"] == 0.2 and m.loc["variance", "nrmse layer"] == 2
    # the R bound of layer 2 lies on cosine's side: a negative margin (the NRMSE decides)
    assert m.loc["variance", "r margin"] == pytest.approx(-0.05)
    assert m.loc["variance", "at_expected"] == "2 of 2"


# --- the trained verdict on format-subtracted values -------------------------------------------


def _trained_rows(d_layer0: float, d_layer1: float, n_models: int = 5) -> pd.DataFrame:
    """A probe table of two tasks: variance at R 0.5 everywhere, cosine ahead of it by
    ``d_layer0`` at layer 0 (the format's signal) and ``d_layer1`` at layers 1 and 2, with a
    little spread over models and probe seeds (NRMSE moves against R)."""
    rng = np.random.default_rng(0)
    rows = []
    for task in ("reversal", "indexing"):
        for m in range(n_models):
            for s in range(2):
                for layer in range(3):
                    lead = d_layer0 if layer == 0 else d_layer1
                    for kind, r in (("variance", 0.5), ("cosine", 0.5 + lead),
                                    ("hidden", 0.9)):
                        r = r + rng.normal(scale=0.01)
                        rows.append(dict(task=task, model_seed=m, seed=s, layer=layer,
                                         features=kind, nrmse=1.0 - r, r=r))
    return pd.DataFrame(rows)


def test_format_subtracted_is_each_layer_minus_the_models_layer_0():
    from nopelib.studies.probe_study import format_subtracted

    table = _trained_rows(0.3, 0.1)
    lifted = format_subtracted(table, ["task", "model_seed"])
    assert list(lifted.columns) == ["layer", "features", "task", "model_seed", "nrmse", "r"]
    assert set(lifted.layer) == {1, 2} and len(lifted) == 2 * 3 * 2 * 5
    per_model = table.groupby(["task", "model_seed", "layer", "features"])[["r"]].mean()
    one = lifted.set_index(["task", "model_seed", "layer", "features"]).loc[
        ("indexing", 3, 2, "cosine"), "r"]
    assert one == pytest.approx(per_model.loc[("indexing", 3, 2, "cosine"), "r"]
                                - per_model.loc[("indexing", 3, 0, "cosine"), "r"])
    with pytest.raises(ValueError, match="layer 0"):
        format_subtracted(table[table.layer > 0], ["task", "model_seed"])
    with pytest.raises(ValueError, match="layer 0 row"):  # a model without its layer 0
        format_subtracted(table[(table.layer > 0) | (table.model_seed > 0)],
                          ["task", "model_seed"])


def test_raw_and_format_subtracted_verdicts_differ_where_the_format_leads():
    """Cosine leads variance by 0.3 in R at layer 0 (the format) and by 0.1 at layers 1-2:
    raw, cosine wins every layer; subtracted, cosine gained 0.2 less than variance, so the
    comparison of what the layers added reads "variance"."""
    from nopelib.studies.probe_study import compare_trained

    table = _trained_rows(0.3, 0.1)
    raw = compare_trained(table)
    lifted = compare_trained(table, subtract_format=True)
    assert raw.index.equals(lifted.index) and len(raw) == 2 * 2  # tasks x layers >= 1
    assert (raw.verdict == "cosine").all(), raw
    assert (lifted.verdict == "variance").all(), lifted
    np.testing.assert_allclose(lifted.d_r, -0.2, atol=0.02)
    assert (raw.m == lifted.m).all()  # the same family: layers >= 1, both metrics, tasks
    # no format lead: subtracting layer 0 leaves the verdict as it was
    same = _trained_rows(0.0, 0.1)
    assert (compare_trained(same, subtract_format=True).verdict == "cosine").all()


def test_trained_comparison_reads_the_committed_probes():
    from nopelib.studies.probe_study import compare_trained, trained_comparison

    table = _trained_rows(0.3, 0.1)
    docs = {task: {"runs": [{"seed": m, "probes": {"w": 4, "rows": [
        row for row in group.drop(columns=["task", "model_seed"]).to_dict("records")]}}
        for m, group in by_task.groupby("model_seed")]}
        for task, by_task in table.groupby("task")}
    for subtract in (False, True):
        pd.testing.assert_frame_equal(
            trained_comparison(docs, ["reversal", "indexing"], subtract_format=subtract),
            compare_trained(table, subtract_format=subtract), check_like=True)
