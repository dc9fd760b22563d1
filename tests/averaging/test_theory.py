import math

import numpy as np
import pytest
import torch

from nopelib.averaging import attention_null, theory as th, theory_config as thc
from nopelib.core.metrics import adjacency_score, cosine_similarity_matrix
from nopelib.averaging import block1, theory_studies as ts
from nopelib.core import one_model
from nopelib.core.one_model import random_model


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
    s = block1.measure_value_scale(model, idx)
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


# --- issue 14: sampling error of the checks, the threshold study, the large-sigma limit ---

def test_null_attention_checks_centres_on_the_closed_form():
    seqs = [list(range(12)), list(range(20, 32))]  # distinct tokens: repeat-aware = sqrt(min/max)
    null = attention_null.null_attention_checks(seqs, n_models=2, d=256, n_rep=60, seed=1)
    ideal = th.uniform_cosine_matrix(12)
    se = null["cos_sd"] / math.sqrt(60) + 1e-12
    assert np.all(np.abs(null["cos_mean"] - ideal) < 5 * se + 0.02)  # ratio bias is O(1/d)
    np.testing.assert_allclose(null["dev_repeat"], null["dev_ideal"])
    assert abs(null["shrink"].mean()) < 4 * null["shrink"].std() / math.sqrt(60)
    assert np.all((null["slope"] > -1.2) & (null["slope"] < -0.8))


def test_null_value_vectors_scatter_like_a_product_of_two_gaussian_matrices():
    # one model, one sequence: a cosine of two value vectors has variance ~ 3/d, not 1/d
    d, n = 128, 400
    null = attention_null.null_attention_checks([[1, 2, 3]], n_models=1, d=d, n_rep=n, seed=2)
    # cos(a_1, a_2) = cos(u_1, (u_1 + u_2)/2); its scatter scales with that of cos(u_1, u_2)
    iso = th.simulate_averaged(n, 3, d, seed=3)  # i.i.d. isotropic value vectors
    iso_cos = cosine_similarity_matrix(torch.from_numpy(iso))[:, 0, 1].numpy()
    ratio = null["cos_sd"][0, 1] / iso_cos.std()
    assert 1.4 < ratio < 2.1, ratio  # sqrt(3) ~ 1.73


def test_null_attention_checks_bad_input():
    with pytest.raises(ValueError, match="one length"):
        attention_null.null_attention_checks([[1, 2, 3], [1, 2]], 1, 16, n_rep=2)
    with pytest.raises(ValueError, match="n_rep"):
        attention_null.null_attention_checks([[1, 2, 3]], 1, 16, n_rep=0)


def test_attention_logit_variance_matches_a_random_model():
    model = random_model(seed=0)
    d, h = 384, model.config.n_head
    blk = model.transformer.h[0]
    with torch.no_grad():
        x = blk.ln_1(model.transformer.wte.weight)  # [vocab, d] (token embeddings at init)
        n = x.shape[0]
        q, k, _ = blk.attn.c_attn(x).split(d, dim=1)
        dh = d // h
        q, k = q.view(n, h, dh), k.view(n, h, dh)
        logits = torch.einsum("qhc,khc->hqk", q, k) / math.sqrt(dh)  # [h, n, n]
    measured = float(logits.var(dim=-1).mean())
    assert measured == pytest.approx(attention_null.attention_logit_variance(d), rel=0.15)


def test_layer0_expected_score_is_exact():
    assert th.layer0_expected_score(list(range(10))) == pytest.approx(0.5)
    tokens = [3, 4, 3, 3, 9, 4, 4, 7, 3, 9]
    n, d = 3000, 16
    rng = np.random.default_rng(7)
    _, ids = np.unique(tokens, return_inverse=True)
    e = rng.standard_normal((n, ids.max() + 1, d))[:, ids]  # [n, T, d]
    scores = adjacency_score(cosine_similarity_matrix(torch.from_numpy(e)))
    se = scores.std() / math.sqrt(n)
    assert abs(scores.mean() - th.layer0_expected_score(tokens)) < 4 * se
    assert abs(scores.mean() - 0.5) > 4 * se  # the repeats move it: the check can fail
    with pytest.raises(ValueError, match="length"):
        th.layer0_expected_score([1, 2])


def test_rescaled_embedding_is_random_model_at_that_sigma():
    base = random_model(seed=3, n_layer=2, n_embd=48)
    other = random_model(seed=3, n_layer=2, n_embd=48, init_std=0.07)
    torch.testing.assert_close(block1.unit_embedding(base) * 0.07, other.transformer.wte.weight)


def test_padded_three_scores_match_per_length_batches():
    model = random_model(seed=1, n_layer=1, n_embd=48)
    texts = ["rev(123)=", "rev(98765)=", "mpwx+", "rev(4)="]
    three = block1.block1_three_scores(model, texts)
    np.testing.assert_allclose(three[:, 1:], block1.block1_scores(model, texts), atol=1e-6)


def test_threshold_study_small():
    texts = {"reversal": ["rev(12345678)=", "rev(87654321)="]}
    long_texts = ["rev(12345678)="]
    out = block1.threshold_study([(1, 48), (2, 48)], texts, [1e-3, 1.0], 2, long_texts)
    df = out["scores"]
    assert len(df) == 2 * 2 * 2 and set(df["task"]) == {"reversal"}
    assert list(out["s_inf"]["n_layer"]) == [1, 2]
    # deeper: smaller c_proj init, smaller value vectors (1/sqrt(2 L))
    s1, s2 = out["s_inf"]["s_inf"]
    assert s2 / s1 == pytest.approx(math.sqrt(2 / 4), rel=0.25)
    small, large = (df[df["sigma"] == s].groupby("n_layer")["ea"].mean() for s in (1e-3, 1.0))
    assert np.all(small > large)


# ---------------------------------------------------------------------------------------------
# the closed-form prediction for any configuration


def test_closed_form_value_scale_matches_the_measured_one() -> None:
    """s_inf from the init alone against the value vectors of real random models."""
    from nopelib.core.model import GPTConfig
    for L, d in ((2, 192), (8, 96)):
        cfg = GPTConfig(n_layer=L, n_head=6, n_embd=d, init_std=0.2)
        idx = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
        measured = np.mean([block1.measure_value_scale(random_model(cfg, seed=s), idx)
                            for s in range(3)])
        assert thc.closed_form_value_scale(cfg) == pytest.approx(measured, rel=0.1)


def test_closed_form_ratio_formula() -> None:
    from nopelib.core.model import GPTConfig
    cfg = GPTConfig(n_layer=12, n_embd=192)
    assert thc.closed_form_ratio(cfg, eps=0.0) == pytest.approx(
        0.02 * math.sqrt(24) / (0.02 * 0.02 * 192))
    all_cfg = GPTConfig(n_layer=6, n_embd=384, init_target="all", init_std=0.01)
    assert thc.closed_form_ratio(all_cfg, eps=0.0) == pytest.approx(math.sqrt(12) / (0.01 * 384))


def test_comparison_probabilities_reduce_to_predicted_row_scores() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    K = th.residual_gram(tokens, 0.7)
    idx = th.all_triples(len(tokens))
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
    t = thc.sample_triples(30, 5000, seed=1)
    assert t.shape == (5000, 3) and np.all((t[:, 1] < t[:, 2]) & (t[:, 2] < t[:, 0]))
    assert t[:, 0].min() == 2 and t[:, 0].max() == 29
    from nopelib.core.model import GPTConfig
    seq = [list(range(30))]  # C(30, 3) = 4060 comparisons
    exact = thc.predict_config_score(GPTConfig(), seq)
    sampled = thc.predict_config_score(GPTConfig(), seq, max_triples=3000)
    assert sampled == pytest.approx(exact, abs=0.02) and sampled != exact


def test_predict_config_score_follows_width_depth_and_mean() -> None:
    from nopelib.core.model import GPTConfig
    seqs = [list(range(20)), [5, 2, 7, 2, 9, 1, 3, 5, 8, 0, 4, 6]]
    score = {(L, d): thc.predict_config_score(GPTConfig(n_layer=L, n_embd=d), seqs)
             for L in (6, 24) for d in (192, 768)}
    assert score[6, 768] > score[6, 192] and score[6, 192] > score[24, 192]
    assert score[6, 768] > 0.9 and 0.45 < score[24, 192] < 0.6
    shifted = thc.predict_config_score(GPTConfig(init_mean=4.0), seqs)
    assert shifted != thc.predict_config_score(GPTConfig(), seqs)


def test_predict_config_score_refuses_what_it_does_not_model() -> None:
    from nopelib.core.model import GPTConfig
    with pytest.raises(ValueError, match="init_mean"):
        thc.predict_config_score(GPTConfig(init_target="all", init_mean=1.0), [[1, 2, 3]])
    with pytest.raises(ValueError, match="uniform"):
        thc.predict_config_score(GPTConfig(init_target="all", init_std=0.2), [[1, 2, 3]])
    with pytest.raises(ValueError, match="length"):
        thc.predict_config_score(GPTConfig(), [[1, 2]])
    with pytest.raises(ValueError, match="at least one"):
        thc.predict_config_score(GPTConfig(), [])


# ---------------------------------------------------------------------------------------------
# the module split: theory is closed forms only; the studies that run models are theory_studies


def _import_time_imports(path) -> set[str]:
    """The nopelib modules a file imports when it is imported (not inside functions, not under
    ``if TYPE_CHECKING``), and the private names it takes from them."""
    import ast
    found: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nopelib"):
                if node.module == "nopelib":
                    found.update(f"nopelib.{a.name}" for a in node.names)
                else:
                    found.add(node.module)
                found.update(f"private:{node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_"))
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("nopelib."))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []))
            elif isinstance(node, ast.ExceptHandler):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found


def test_theory_imports_no_model_and_no_study() -> None:
    from pathlib import Path
    path = Path(th.__file__)
    assert _import_time_imports(path) == set()  # numpy and torch only
    studies = (block1, one_model, ts)
    for name in ("random_model", "block1_activations", "sigma_sweep", "threshold_study",
                 "measure_value_scale", "predicted_config_scores"):
        assert not hasattr(th, name) and any(name in vars(m) for m in studies), name


def test_no_module_imports_private_names() -> None:
    # import circles and the wings' order: tests/test_house.py
    from pathlib import Path

    import nopelib
    for path in sorted(Path(nopelib.__file__).parent.rglob("*.py")):
        private = sorted(d for d in _import_time_imports(path) if d.startswith("private:"))
        assert not private, f"{path.name} imports private names: {private}"


def test_repeat_aware_cosine_and_self_coincidences() -> None:
    distinct = [list(range(6)), list(range(10, 16))]
    np.testing.assert_allclose(th.repeat_aware_cosine(distinct), th.uniform_cosine_matrix(6))
    np.testing.assert_allclose(th.mean_self_coincidences(distinct), np.arange(1, 7))
    seqs = [[3, 4, 3, 3], [1, 2, 3, 4]]
    expected = np.mean([th.gram_cosine(th.averaged_gram(t)) for t in seqs], axis=0)
    np.testing.assert_array_equal(th.repeat_aware_cosine(seqs), expected)
    # [3, 4, 3, 3]: n_kk = 1, 2, 5, 10; distinct: 1, 2, 3, 4
    np.testing.assert_allclose(th.mean_self_coincidences(seqs), [1, 2, 4, 7])


def test_predicted_shrinkage() -> None:
    assert attention_null.predicted_shrinkage(10, 0.0) == 0.0
    v = 0.03
    g = 1 + v * (1 - 1 / np.arange(1, 4))  # T = 3: g_1 = 1, g_2, g_3
    expected = np.mean([1 - 1 / math.sqrt(g[0] * g[1]), 1 - 1 / math.sqrt(g[1] * g[2])])
    assert attention_null.predicted_shrinkage(3, v) == pytest.approx(expected, rel=1e-12)
    assert attention_null.predicted_shrinkage(20, 2 * v) > attention_null.predicted_shrinkage(20, v) > 0
    with pytest.raises(ValueError, match="logit_var"):
        attention_null.predicted_shrinkage(5, -1.0)


def test_attention_entropy_of_uniform_causal_weights_is_log_k() -> None:
    T = 6
    p = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # row k: 1/k each
    acts = [{"weights": p.expand(2, 3, T, T)} for _ in range(2)]  # 2 models, B=2, H=3
    np.testing.assert_allclose(ts.attention_entropy(acts), np.log(np.arange(1, T + 1)),
                               atol=1e-6)


def test_h1_against_theory_is_block1_beside_the_closed_form() -> None:
    idx = torch.tensor([[4, 9, 4, 12, 13, 20, 9, 7, 4]])
    measured, expected = ts.h1_against_theory(0.02, 5, idx, idx[0].tolist(), s_inf=0.9)
    assert measured.shape == expected.shape == (5, 5)
    h1 = block1.block1_activations(random_model(seed=0, init_std=0.02), idx[:, :5])["hidden"][0]
    np.testing.assert_allclose(measured, cosine_similarity_matrix(h1).numpy())
    rho = float(th.embedding_ratio(0.02, 0.9, 384))
    np.testing.assert_allclose(expected, th.gram_cosine(th.residual_gram([4, 9, 4, 12, 13], rho)))


def _fake_threshold_study(sigmas: np.ndarray) -> dict:
    """A threshold_study result for one architecture and task, scores falling in sigma."""
    import pandas as pd
    rows = [(6, 384, "reversal", seed, float(s), 0.5, 0.95 - 0.4 * n / len(sigmas) - 0.01 * seed,
             0.9 - 0.4 * n / len(sigmas))
            for seed in range(3) for n, s in enumerate(sigmas)]
    scores = pd.DataFrame(rows, columns=["n_layer", "n_embd", "task", "seed", "sigma", "e",
                                         "ea", "h1"])
    return {"scores": scores, "s_inf": pd.DataFrame([(6, 384, 0.9)],
                                                    columns=["n_layer", "n_embd", "s_inf"])}


def test_threshold_crossings_read_each_seed_and_the_prediction() -> None:
    from nopelib.core.tasks import encode
    sigmas = np.geomspace(0.005, 0.15, 6)
    study = _fake_threshold_study(sigmas)
    texts = {"reversal": ["rev(1234)=", "rev(98765)="]}
    table = ts.threshold_crossings(study, texts, sigmas, 0.75)
    assert list(table.columns) == ["arch", "task", "pred", "log_ea", "log_h1"]
    row = table.iloc[0]
    assert row["arch"] == "6x384" and row["log_ea"].shape == (3,)
    curve = [th.predict_layer1_score([encode(t) for t in texts["reversal"]], s, 0.9, 384)
             for s in sigmas]
    assert row["pred"] == th.sigma_at_level(sigmas, curve, 0.75)
    seed1 = study["scores"][study["scores"].seed == 1]
    assert row["log_ea"][1] == np.log(th.sigma_at_level(sigmas, seed1["ea"], 0.75))


def test_excess_table_intervals_and_expectations() -> None:
    from nopelib.core.stats import normal_interval
    study = _fake_threshold_study(np.array([0.1, 1.0]))["scores"]
    seqs = [[1, 2, 3, 1, 4], [5, 6, 7, 8, 9]]
    table = ts.excess_table(study, seqs, s_inf=0.9, d=384)
    assert list(table.sigma) == [0.1, 1.0] and table.shape[1] == 3 + 3 * 4
    top = table.iloc[-1]
    g = study[study.sigma == 1.0]["h1"]
    assert (top["h1 mean"], top["h1 lo"], top["h1 hi"], top["h1 sd"]) == normal_interval(g)
    assert top["predicted"] == th.predict_layer1_score(seqs, 1.0, 0.9, 384)
    assert top["layer-0 exact"] == np.mean([th.layer0_expected_score(t) for t in seqs])


def test_prediction_table_and_listing() -> None:
    import pandas as pd
    from nopelib.core.stats import seed_interval
    scores = pd.DataFrame([dict(n_layer=L, n_embd=W, seed=s, layer=layer,
                                score=0.6 + 0.1 * layer + 0.01 * s + 0.001 * W / 192)
                           for L in (1, 2) for W in (192, 384) for s in range(3)
                           for layer in range(L + 1)])
    predicted = pd.DataFrame([dict(n_layer=L, n_embd=W, seed=s, predicted=0.7)
                              for L in (1, 2) for W in (192, 384) for s in range(3)])
    table = ts.prediction_table(scores, predicted, 0.95)
    assert list(table.config) == ["1 × 192", "1 × 384", "2 × 192", "2 × 384"]
    row = table.iloc[3]
    l1 = scores[(scores.n_layer == 2) & (scores.n_embd == 384) & (scores.layer == 1)].score
    mean, tol_mean, tol_one = seed_interval(l1.to_numpy() - 0.7, 0.95)
    assert row.residual == pytest.approx(mean) and row.tolerance == pytest.approx(tol_one)
    assert row.tol_mean == pytest.approx(tol_mean) and row.min_deep == pytest.approx(l1.mean())
    from nopelib.core.model import GPTConfig
    assert row.rho == thc.closed_form_ratio(GPTConfig(n_layer=2, n_embd=384))
    assert ts.config_listing(table.iloc[:1]) == (
        f"1 × 192 (measured {table.measured[0]:.3f}, predicted 0.700)")
    assert ts.config_listing(table.iloc[:0]) == "none"


def test_length_study_against_the_closed_form() -> None:
    from nopelib.core.analysis import length_scores
    from nopelib.core.one_model import length_tokens
    from nopelib.core.model import GPTConfig
    base = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=24)
    sources = {"task alphabet": None, "i.i.d. control": 500}
    runs = {name: length_scores([8, 24], [0, 1], base, n_seqs=2, vocab_size=v)[0]
            for name, v in sources.items()}
    predicted = ts.length_predictions(sources, [8, 24], [0, 1], 2, base)
    assert len(predicted) == 2 * 2 * 2 * 2
    tokens = length_tokens(24, 1 * 2 + 1, 500)  # seed 1, sequence 1
    got = predicted[(predicted.source == "i.i.d. control") & (predicted.seed == 1)
                    & (predicted.seq == 1) & (predicted.length == 8)].predicted.item()
    assert got == thc.predict_config_score(base, [tokens[:8]], max_triples=20_000)
    measured, lines = ts.length_series(runs, predicted, (0, 1))
    assert list(measured) == [f"{n}, layer {layer}" for n in sources for layer in (0, 1)]
    assert list(lines) == [f"{n}, layer 1 predicted" for n in sources]
    both, summary = ts.length_residuals(runs, predicted)
    assert len(both) == len(predicted) and summary.shape == (4, 4)
    np.testing.assert_allclose(both.residual, both.score - both.predicted)
    falls = ts.length_falls(both, 8, 24, 0.95)
    assert list(falls.index) == list(sources)
    assert list(falls.columns) == ["fall", "half", "predicted", "predicted_min"]
    assert falls.predicted_min.le(falls.predicted).all()
