import math

import numpy as np
import pytest
import torch

from nopelib import theory as th
from nopelib.analysis import random_model
from nopelib.metrics import adjacency_score, cosine_similarity_matrix


def test_uniform_cosine_matrix_closed_form_and_ideal_score():
    C = th.uniform_cosine_matrix(6)
    assert C.shape == (6, 6)
    np.testing.assert_allclose(np.diag(C), 1.0)
    np.testing.assert_allclose(C, C.T)
    assert C[1, 3] == pytest.approx(math.sqrt(2 / 4))
    assert float(adjacency_score(th.uniform_cosine_matrix(20))) == 1.0


def test_row_is_strictly_increasing_towards_the_diagonal():
    C = th.uniform_cosine_matrix(15)
    for k in range(2, 15):
        assert np.all(np.diff(C[k, :k]) > 0)


def test_inner_products_match_monte_carlo():
    T, d, n = 8, 32, 4000
    a = th.simulate_averaged(n, T, d, seed=1)  # [n, T, d]
    G = np.einsum("ntd,nsd->nts", a, a)  # [n, T, T]
    mean, se = G.mean(0), G.std(0) / math.sqrt(n)
    expected = th.expected_inner_product(T)
    assert np.all(np.abs(mean - expected) < 5 * se + 1e-12), np.max(np.abs(mean - expected) / se)


def test_monte_carlo_detects_a_wrong_law():
    # the same check must reject 1/min(i, j) (the shared-summand count read the wrong way)
    T, d, n = 8, 32, 4000
    a = th.simulate_averaged(n, T, d, seed=1)
    G = np.einsum("ntd,nsd->nts", a, a)
    p = np.arange(1, T + 1)
    wrong = 1 / np.minimum.outer(p, p)
    assert np.any(np.abs(G.mean(0) - wrong) > 5 * G.std(0) / math.sqrt(n))


def test_norm_falls_like_one_over_k():
    T = 30
    a = th.simulate_averaged(2000, T, 64, seed=2)
    sq = (a**2).sum(-1).mean(0)  # [T]
    k = np.arange(1, T + 1)
    slope = np.polyfit(np.log(k), np.log(sq), 1)[0]
    assert slope == pytest.approx(-1.0, abs=0.03)
    np.testing.assert_allclose(sq, th.expected_sq_norm(T), rtol=0.1)


def test_non_zero_mean_breaks_the_law():
    # with a common mean the averaged term keeps a shared component: cosines stay near 1
    a = th.simulate_averaged(200, 20, 64, seed=3, mean=0.5)
    C = cosine_similarity_matrix(torch.from_numpy(a)).mean(0).numpy()
    assert C[19, 0] > 0.9 > th.uniform_cosine_matrix(20)[19, 0]


def test_averaged_gram_distinct_tokens_and_repeats():
    np.testing.assert_allclose(th.averaged_gram([5, 6, 7, 8]), th.expected_inner_product(4))
    tokens = [3, 4, 3, 3, 9, 4]
    a = th.simulate_averaged(6000, 6, 32, seed=4, tokens=tokens)
    G = np.einsum("ntd,nsd->nts", a, a)
    mean, se = G.mean(0), G.std(0) / math.sqrt(len(G))
    assert np.all(np.abs(mean - th.averaged_gram(tokens)) < 5 * se)
    assert th.coincidence_counts(tokens)[2, 2] == 5  # pairs of equal tokens among 3, 4, 3


def test_residual_cosine_limits_and_monotonicity():
    i, j = np.meshgrid(np.arange(1, 11), np.arange(1, 11), indexing="ij")
    np.testing.assert_allclose(th.residual_cosine(i, j, 0.0), th.uniform_cosine_matrix(10))
    prev = th.residual_cosine(i, j, 0.0)
    for rho in (0.1, 0.5, 1.0, 3.0):
        cur = th.residual_cosine(i, j, rho)
        off = i != j
        assert np.all(cur[off] < prev[off])  # a larger embedding lowers every cosine
        for k in range(2, 10):  # yet each row stays ordered in expectation
            assert np.all(np.diff(cur[k, :k]) > 0)
        prev = cur
    K = th.residual_gram(list(range(10)), 0.7)
    norm = np.sqrt(np.diag(K))
    np.testing.assert_allclose(K / np.outer(norm, norm), th.residual_cosine(i, j, 0.7))


def test_predicted_score_limits_and_monotonicity():
    tokens = [list(range(12))]
    assert th.predicted_score(tokens, 0.0, 384) > 0.97
    assert th.predicted_score(tokens, 1e3, 384) == pytest.approx(0.5, abs=0.01)
    scores = [th.predicted_score(tokens, r, 384) for r in (0.0, 0.3, 1.0, 3.0, 10.0)]
    assert np.all(np.diff(scores) < 0)


@pytest.mark.parametrize("rho", [0.3, 1.5])
def test_predicted_score_matches_gaussian_monte_carlo(rho):
    tokens = [2, 5, 2, 7, 8, 5, 9, 10, 2, 11, 12, 13, 14]
    T, d, n = len(tokens), 128, 300
    rng = np.random.default_rng(5)
    _, ids = np.unique(tokens, return_inverse=True)
    e = rng.normal(0, rho / math.sqrt(d), size=(n, ids.max() + 1, d))[:, ids]  # [n, T, d]
    a = th.simulate_averaged(n, T, d, seed=6, tokens=tokens)
    measured = float(adjacency_score(cosine_similarity_matrix(torch.from_numpy(e + a))).mean())
    assert th.predicted_score([tokens], rho, d) == pytest.approx(measured, abs=0.03)


def test_embedding_ratio_and_layer_norm_floor():
    d, s_inf = 384, 0.9
    assert th.embedding_ratio(1.0, s_inf, d) == pytest.approx(math.sqrt(d) / s_inf, rel=1e-4)
    assert th.embedding_ratio(1e-7, s_inf, d) == pytest.approx(math.sqrt(d * th.LN_EPS) / s_inf, rel=1e-3)
    assert th.value_scale(1e-4, s_inf) < 0.05 * s_inf


def test_predict_layer1_score_limits():
    tokens = [list(range(15))]
    small = th.predict_layer1_score(tokens, 1e-6, s_inf=0.9, d=384, eps=0.0)
    large = th.predict_layer1_score(tokens, 1e3, s_inf=0.9, d=384)
    assert small > 0.97
    assert large == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="sigma"):
        th.predict_layer1_score(tokens, -1.0, 0.9, 384)


def test_sigma_at_level():
    sig = np.array([0.01, 0.1, 1.0])
    assert th.sigma_at_level(sig, [0.9, 0.8, 0.6]) == pytest.approx(10 ** (-1 + 0.25))
    assert math.isnan(th.sigma_at_level(sig, [0.9, 0.85, 0.8]))
    with pytest.raises(ValueError):
        th.sigma_at_level([1.0, 0.1], [0.9, 0.6])


def test_measure_value_scale_matches_value_vectors():
    model = random_model(seed=0)
    idx = torch.tensor([[4, 9, 4, 12, 13, 20, 9, 7, 4, 15]])
    s = th.measure_value_scale(model, idx)
    blk = model.transformer.h[0]
    with torch.no_grad():
        x = blk.ln_1(model.transformer.wte(idx[0]))  # [T, d]
        v = x @ blk.attn.c_attn.weight[2 * 384:].T + blk.attn.c_attn.bias[2 * 384:]
        u = blk.attn.c_proj(v)  # the projected value vector of each token
    assert s == pytest.approx(float(u.pow(2).sum(-1).mean().sqrt()), rel=0.1)


def test_bad_input():
    with pytest.raises(ValueError, match="T=0"):
        th.uniform_cosine_matrix(0)
    with pytest.raises(ValueError, match="rho"):
        th.residual_gram([1, 2, 3], -1.0)
    with pytest.raises(ValueError, match="length"):
        th.predicted_row_scores([1, 2], 0.5, 384)


# ---------------------------------------------------------------------------------------------
# the closed-form prediction for any configuration


def test_closed_form_value_scale_matches_the_measured_one() -> None:
    """s_inf from the init alone against the value vectors of real random models."""
    from nopelib.model import GPTConfig
    for L, d in ((2, 192), (8, 96)):
        cfg = GPTConfig(n_layer=L, n_head=6, n_embd=d, init_std=0.2)
        idx = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
        measured = np.mean([th.measure_value_scale(random_model(cfg, seed=s), idx)
                            for s in range(3)])
        assert th.closed_form_value_scale(cfg) == pytest.approx(measured, rel=0.1)


def test_closed_form_ratio_formula() -> None:
    from nopelib.model import GPTConfig
    cfg = GPTConfig(n_layer=12, n_embd=192)
    assert th.closed_form_ratio(cfg, eps=0.0) == pytest.approx(
        0.02 * math.sqrt(24) / (0.02 * 0.02 * 192))
    all_cfg = GPTConfig(n_layer=6, n_embd=384, init_target="all", init_std=0.01)
    assert th.closed_form_ratio(all_cfg, eps=0.0) == pytest.approx(math.sqrt(12) / (0.01 * 384))


def test_comparison_probabilities_reduce_to_predicted_row_scores() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    K = th.residual_gram(tokens, 0.7)
    idx = th._triples(len(tokens))
    p = th.comparison_probabilities(K, idx, 64)
    rows = np.bincount(idx[:, 0], weights=p, minlength=8)[2:]
    rows /= np.arange(2, 8) * np.arange(1, 7) / 2
    np.testing.assert_allclose(rows, th.predicted_row_scores(tokens, 0.7, 64)[2:])


@pytest.mark.parametrize("common", [0.0, 30.0])
def test_comparison_probabilities_match_gaussian_monte_carlo(common: float) -> None:
    """States m + z with z Gaussian of covariance K/d per coordinate and a shared vector m."""
    T, d, n, rho = 7, 256, 6000, 0.6
    K = th.residual_gram(list(range(T)), rho)
    rng = np.random.default_rng(0)
    z = np.einsum("ts,nsd->ntd", np.linalg.cholesky(K), rng.normal(size=(n, T, d))) / math.sqrt(d)
    m = rng.normal(size=d)
    x = z + m * math.sqrt(common) / np.linalg.norm(m)  # [n, T, d]
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    C = np.einsum("ntd,nsd->nts", x, x)
    triples = np.array([(6, 0, 5), (6, 3, 4), (4, 1, 2), (5, 0, 1)])
    empirical = np.array([(C[:, k, j] > C[:, k, i]).mean() for k, i, j in triples])
    predicted = th.comparison_probabilities(K, triples, d, common)
    np.testing.assert_allclose(predicted, empirical, atol=0.03)
    assert not np.allclose(th.comparison_probabilities(K, triples, d, 0.0 if common else 30.0),
                           empirical, atol=0.03)


def test_sample_triples_are_comparisons_and_estimate_the_score() -> None:
    t = th.sample_triples(30, 5000, seed=1)
    assert t.shape == (5000, 3) and np.all((t[:, 1] < t[:, 2]) & (t[:, 2] < t[:, 0]))
    assert t[:, 0].min() == 2 and t[:, 0].max() == 29
    from nopelib.model import GPTConfig
    seq = [list(range(30))]  # C(30, 3) = 4060 comparisons
    exact = th.predict_config_score(GPTConfig(), seq)
    sampled = th.predict_config_score(GPTConfig(), seq, max_triples=3000)
    assert sampled == pytest.approx(exact, abs=0.02) and sampled != exact


def test_predict_config_score_follows_width_depth_and_mean() -> None:
    from nopelib.model import GPTConfig
    seqs = [list(range(20)), [5, 2, 7, 2, 9, 1, 3, 5, 8, 0, 4, 6]]
    score = {(L, d): th.predict_config_score(GPTConfig(n_layer=L, n_embd=d), seqs)
             for L in (6, 24) for d in (192, 768)}
    assert score[6, 768] > score[6, 192] and score[6, 192] > score[24, 192]
    assert score[6, 768] > 0.9 and 0.45 < score[24, 192] < 0.6
    shifted = th.predict_config_score(GPTConfig(init_mean=4.0), seqs)
    assert shifted != th.predict_config_score(GPTConfig(), seqs)


def test_predict_config_score_refuses_what_it_does_not_model() -> None:
    from nopelib.model import GPTConfig
    with pytest.raises(ValueError, match="init_mean"):
        th.predict_config_score(GPTConfig(init_target="all", init_mean=1.0), [[1, 2, 3]])
    with pytest.raises(ValueError, match="uniform"):
        th.predict_config_score(GPTConfig(init_target="all", init_std=0.2), [[1, 2, 3]])
    with pytest.raises(ValueError, match="length"):
        th.predict_config_score(GPTConfig(), [[1, 2]])
    with pytest.raises(ValueError, match="at least one"):
        th.predict_config_score(GPTConfig(), [])
