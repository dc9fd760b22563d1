"""Scores of random models and the studies over many: shapes and columns of the frames,
agreement with the plain paths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from nopelib.core.metrics import (layer_scores, length_groups, adjacency_score,
                                  cosine_similarity_matrix)
from nopelib.core.model import GPTConfig
from nopelib.core.tasks import TASKS, encode_inputs
from nopelib.rules.claims import LEARNED_AT
from nopelib.core.analysis import (config_scores, length_scores, mean_std_table,
                                      sample_inputs, seed_series, slider_frames, task_scores)
from nopelib.core.margins import pairwise_differences, per_seed, seed_margins
from nopelib.rules.claims import is_learned
from nopelib.core.one_model import (layer_matrix, long_sequence, permutation_gap,
                                       random_model, similarity_matrices)

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32)


def _texts() -> list[str]:
    return [t for task in TASKS for t in sample_inputs(task, 3, seed=1)]


def _scores_by_length(model, texts: list[str]) -> np.ndarray:
    """layer_scores with every length in its own call: a batch with no padding at all."""
    out = np.empty((len(texts), model.config.n_layer + 1))
    for members in length_groups(texts).values():
        out[members] = layer_scores(model, [texts[i] for i in members])
    return out


def test_layer_scores_batched_equals_scoring_by_length() -> None:
    model = random_model(TINY, seed=3)
    texts = _texts()
    assert len({len(t) for t in texts}) > 1  # the causal batch really is padded
    np.testing.assert_allclose(layer_scores(model, texts), _scores_by_length(model, texts),
                               atol=1e-12)


def test_layer_scores_bidirectional_groups_by_length() -> None:
    model = random_model(TINY, seed=3, causal=False)
    texts = _texts()
    np.testing.assert_array_equal(layer_scores(model, texts), _scores_by_length(model, texts))


def test_layer_scores_match_the_definition() -> None:
    model = random_model(TINY, seed=3)
    text = _texts()[0]
    idx, _ = encode_inputs([text])
    with torch.no_grad():
        C = cosine_similarity_matrix(model.hidden_states(idx)[:, 0])
    np.testing.assert_allclose(layer_scores(model, [text])[0], adjacency_score(C), atol=1e-12)


def test_length_groups_rejects_short_texts() -> None:
    assert length_groups(["abcd", "abc", "wxyz"]) == {3: [1], 4: [0, 2]}
    with pytest.raises(ValueError, match=">= 3"):
        length_groups(["ab", "abc"])


def test_task_scores_and_seed_series() -> None:
    frame = task_scores(TINY, [0, 1], 2)
    assert list(frame.columns) == ["seed", "task", "layer", "score"]
    assert len(frame) == 2 * len(TASKS) * (TINY.n_layer + 1)
    model = random_model(TINY, seed=1)
    expected = layer_scores(model, sample_inputs("reversal", 2, seed=1)).mean(0)
    got = frame[(frame.task == "reversal") & (frame.seed == 1)].score.to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12)
    series = seed_series(frame, "task", label="task {task}")
    assert list(series) == [f"task {t}" for t in sorted(TASKS)]
    mean, std = series["task reversal"]
    per_seed = frame[frame.task == "reversal"].pivot(index="seed", columns="layer", values="score")
    np.testing.assert_allclose(mean, per_seed.mean().to_numpy())
    np.testing.assert_allclose(std, per_seed.std().to_numpy())


def test_config_scores_columns_and_values() -> None:
    overrides = [dict(init_std=0.02), dict(init_std=0.2)]
    frame = config_scores(overrides, [0, 1], 2, base=TINY)
    assert list(frame.columns) == ["init_std", "seed", "layer", "score"]
    assert len(frame) == 2 * 2 * (TINY.n_layer + 1)
    model = random_model(TINY, seed=1, init_std=0.2)
    texts = [t for task in TASKS for t in sample_inputs(task, 2, seed=1)]
    expected = layer_scores(model, texts).mean(0)
    got = frame[(frame.init_std == 0.2) & (frame.seed == 1)].sort_values("layer").score.to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12)


@pytest.mark.parametrize("kwargs, name", [(dict(inputs_per_task=0, seeds=[0]), "inputs_per_task"),
                                          (dict(inputs_per_task=1, seeds=[]), "seeds")])
def test_config_scores_rejects_bad_input(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        config_scores([{}], base=TINY, **kwargs)


def test_mean_std_table_formats_mean_and_std() -> None:
    frame = pd.DataFrame(dict(cfg=["a"] * 4, seed=[0, 1, 0, 1], layer=[0, 0, 1, 1],
                              score=[0.4, 0.6, 0.9, 0.9]))
    table = mean_std_table(frame, ["cfg"])
    assert table.loc["a", 0] == "0.500 ± 0.141"
    assert table.loc["a", 1] == "0.900 ± 0.000"


def test_long_sequence_is_task_text_of_the_length() -> None:
    s = long_sequence(300, seed=2)
    assert len(s) == 300 and s == long_sequence(300, seed=2) != long_sequence(300, seed=3)
    assert s.count("=") >= 300 // 22  # at least one task input per maximal input length
    encode_inputs([s])  # every character is in the vocabulary
    with pytest.raises(ValueError, match="length"):
        long_sequence(2)


def test_length_scores_prefixes_equal_separate_runs() -> None:
    frame, seconds = length_scores([8, 40], [0], base=TINY)
    assert seconds >= 0 and sorted(frame.length.unique()) == [8, 40]
    model = random_model(TINY, seed=0, block_size=40)
    for T in (8, 40):
        idx, _ = encode_inputs([long_sequence(40, 0)[:T]])
        with torch.no_grad():
            C = cosine_similarity_matrix(model.hidden_states(idx)[:, 0])
        got = frame[frame.length == T].sort_values("layer").score.to_numpy()
        np.testing.assert_allclose(got, adjacency_score(C), atol=1e-6)


def test_length_scores_rejects_bidirectional() -> None:
    with pytest.raises(ValueError, match="causal"):
        length_scores([8], [0], base=GPTConfig(n_layer=1, n_head=1, n_embd=8, causal=False))


def test_slider_frames_match_similarity_matrices() -> None:
    text = "rev(1234)="
    frames, scores = slider_frames(text, [0.02, 0.2], seed=0, base=TINY)
    assert set(frames) == {(s, l) for s in (0.02, 0.2) for l in range(TINY.n_layer + 1)}
    mats = similarity_matrices(random_model(TINY, seed=0, init_std=0.2), text)
    np.testing.assert_allclose(frames[0.2, 1], mats[1])
    assert scores[0.2, 1] == pytest.approx(float(adjacency_score(mats[1])))


def test_adjacency_score_with_diagonal_matches_its_definition() -> None:
    from nopelib.core.metrics import adjacency_score_with_diagonal
    rng = np.random.default_rng(0)
    C = rng.normal(size=(3, 9, 9))
    C[:, range(9), range(9)] = 1.0
    C[0, 5, 2] = 1.0  # a tie with the diagonal counts as not in order
    expected = []
    for mat in C:  # 1-based row k: pairs i < j <= k, the diagonal included, over C(k, 2)
        rows = [sum(mat[k - 1, i] < mat[k - 1, j] for j in range(k) for i in range(j))
                / (k * (k - 1) / 2) for k in range(2, 10)]
        expected.append(np.mean(rows))
    np.testing.assert_allclose(adjacency_score_with_diagonal(C), expected)
    assert adjacency_score_with_diagonal(np.eye(5)) > 0.5 == adjacency_score(np.eye(5)) * 0 + 0.5


def test_length_scores_many_sequences_and_iid_control() -> None:
    from nopelib.core.one_model import length_tokens
    frame, _ = length_scores([8, 30], [0, 1], base=TINY, n_seqs=2, vocab_size=500)
    assert len(frame) == 2 * 2 * 2 * (TINY.n_layer + 1)
    assert sorted(frame.seq.unique()) == [0, 1]
    tokens = length_tokens(30, 3, vocab_size=500)  # seed 1, sequence 1
    assert max(tokens) < 500 and tokens != length_tokens(30, 2, vocab_size=500)
    model = random_model(TINY, seed=1, block_size=30, vocab_size=500)
    with torch.no_grad():
        C = cosine_similarity_matrix(model.hidden_states(torch.tensor([tokens]))[:, 0])
    got = frame[(frame.seed == 1) & (frame.seq == 1) & (frame.length == 30)]
    np.testing.assert_allclose(got.sort_values("layer").score, adjacency_score(C), atol=1e-6)
    assert length_tokens(40, 0) == encode_inputs([long_sequence(40, 0)])[0][0].tolist()


def test_a_task_is_learned_only_when_every_seed_passes_on_the_whole_split():
    run = {"accuracy": LEARNED_AT, "n_test": 100}
    assert is_learned([run, {**run, "accuracy": 1.0}], n_test=100)
    assert not is_learned([run, {**run, "accuracy": 0.89}], n_test=100)
    assert not is_learned([run, {**run, "n_test": 50}], n_test=100)  # a prefix
    assert not is_learned([], n_test=100)


def _init_study() -> pd.DataFrame:
    rows = [dict(init_target=r, init_mean=m, init_std=s, seed=seed, layer=layer,
                 score=0.5 + 0.1 * layer * (s < 0.1) + 0.01 * m + 0.001 * seed)
            for r in ("embedding", "all") for m in (0.0, 4.0) for s in (0.02, 0.2)
            for seed in range(2) for layer in range(3)]
    return pd.DataFrame(rows)


def test_layer_matrix_is_one_layer_of_similarity_matrices() -> None:
    text = "rev(1234)="
    matrix, score = layer_matrix(text, 1, TINY, init_std=0.2, init_mean=1.0)
    mats = similarity_matrices(random_model(TINY, seed=0, init_std=0.2, init_mean=1.0), text)
    np.testing.assert_array_equal(matrix, mats[1])
    assert score == float(adjacency_score(mats[1]))


def test_permutation_gap_separates_bidirectional_from_causal() -> None:
    text = "rev(1234)="
    assert permutation_gap(random_model(TINY, seed=0, causal=False), text) < 1e-5
    assert permutation_gap(random_model(TINY, seed=0), text) > 1e-3


def test_per_seed() -> None:
    wide = per_seed(_init_study(), ["init_target", "init_mean", "init_std"])
    assert list(wide.columns) == [0, 1, 2] and len(wide) == 2 * 2 * 2 * 2


def _per_seed_values() -> pd.DataFrame:
    """Two groups x 3 seeds x 2 statistics with known means and sds (sd 0.01 everywhere)."""
    index = pd.MultiIndex.from_product([["a", "b"], range(3)], names=["group", "seed"])
    base = np.array([-0.01, 0.0, 0.01])
    return pd.DataFrame({1: np.r_[0.9 + base, 0.805 + base],
                         2: np.r_[0.7 + base, np.nan, 0.85, 0.86]},
                        index=index).rename_axis(columns="layer")


def test_seed_margins_in_units_of_the_spread_over_seeds() -> None:
    m = seed_margins(_per_seed_values(), 0.8)  # one row per (group, layer); nan dropped
    assert m.index.names == ["group", "layer"] and list(m.n) == [3, 3, 3, 2]
    np.testing.assert_allclose(m["mean"], [0.9, 0.7, 0.805, 0.855])
    np.testing.assert_allclose(m.margin, [0.1, -0.1, 0.005, 0.055], atol=1e-12)
    np.testing.assert_allclose(m.in_sd.iloc[:3], [10, -10, 0.5], rtol=1e-9)
    assert list(m.verdict) == ["holds", "fails", "cannot tell", "holds"]
    below = seed_margins(_per_seed_values(), 0.8, side="below")
    assert list(below.verdict) == ["fails", "holds", "cannot tell", "fails"]
    within = seed_margins(_per_seed_values() - 0.8, 0.05, side="within")
    np.testing.assert_allclose(within.margin, [-0.05, -0.05, 0.045, -0.005], atol=1e-12)
    assert list(within.verdict) == ["fails", "fails", "holds", "cannot tell"]


def test_seed_margins_of_one_series_one_unit_and_misuse() -> None:
    one = seed_margins(pd.Series([0.1, 0.2, 0.3], index=pd.Index(range(3), name="seed")), 0.0)
    assert len(one) == 1 and one.verdict.iloc[0] == "holds"
    single = seed_margins(_per_seed_values().xs(0, level="seed", drop_level=False), 0.8)
    assert (single.verdict == "cannot tell").all()  # no spread from one seed
    seqs = pd.Series([0.2, 0.3, 0.25, 0.35], name="fall",
                     index=pd.MultiIndex.from_product([range(2), range(2)],
                                                      names=["seed", "seq"]))
    assert seed_margins(seqs, 0.0, units=("seed", "seq")).n.iloc[0] == 4
    with pytest.raises(ValueError, match="side"):
        seed_margins(_per_seed_values(), 0.8, side="near")
    with pytest.raises(ValueError, match="no index level"):
        seed_margins(seqs, 0.0, units=("model",))
    with pytest.raises(ValueError, match="no values"):
        seed_margins(seqs.iloc[:0], 0.0)


def test_pairwise_differences_per_seed() -> None:
    init = _init_study()
    embedding = init[init.init_target == "embedding"]
    seeds = embedding.groupby(["init_mean", "init_std", "seed", "layer"]).score.mean()
    pairs = pairwise_differences(seeds, "init_mean")
    assert pairs.index.names == ["init_mean_a", "init_mean_b", "init_std", "seed", "layer"]
    assert set(pairs.index.droplevel([2, 3, 4])) == {(0.0, 4.0)}
    expected = seeds.xs(0.0, level="init_mean") - seeds.xs(4.0, level="init_mean")
    np.testing.assert_allclose(pairs.loc[0.0, 4.0].to_numpy(), expected.to_numpy())
    with pytest.raises(ValueError, match="a pair needs two"):
        pairwise_differences(seeds.xs(0.0, level="init_mean", drop_level=False), "init_mean")


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, 1.5, True])
def test_random_model_refuses_a_seed_torch_cannot_take(seed):
    with pytest.raises(ValueError, match=r"seed=.* must be an integer in \[0, 2\*\*63\)"):
        random_model(seed=seed)
