"""nopelib.core.stats: the quantiles, intervals and tolerances the chapters test against, checked
against known values and against the inline formulas they replace (bit for bit)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from nopelib.core.stats import (binomial_lower_bound, bonferroni_z, normal_interval, pooled_sd,
                                seed_interval, standard_error, student_t_quantile, summarize)


def test_student_t_quantile_and_seed_interval() -> None:
    assert student_t_quantile(0.975, 1) == pytest.approx(12.706, abs=2e-3)
    assert student_t_quantile(0.975, 2) == pytest.approx(4.303, abs=1e-3)
    assert student_t_quantile(0.975, 1000) == pytest.approx(1.962, abs=1e-3)
    mean, h_mean, h_new = seed_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and h_mean == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    assert h_new == pytest.approx(4.303 * math.sqrt(4 / 3), abs=1e-3)
    with pytest.raises(ValueError, match="values"):
        seed_interval([1.0])
    with pytest.raises(ValueError, match="q="):
        student_t_quantile(0.4, 3)


def test_summarize_mean_and_sample_std() -> None:
    x = np.array([[0.4, 0.9], [0.6, 0.9]])
    mean, std = summarize(x)
    np.testing.assert_allclose(mean, [0.5, 0.9])
    np.testing.assert_allclose(std, [math.sqrt(0.02), 0.0], atol=1e-15)
    mean, std = summarize(x[:1])  # one seed: no spread
    np.testing.assert_array_equal(std, [0.0, 0.0])


@pytest.mark.parametrize("kind", ["array", "series"])
def test_standard_error_and_normal_interval_match_the_inline_formulas(kind: str) -> None:
    values = np.random.default_rng(0).normal(0.6, 0.05, size=16)
    x = values if kind == "array" else pd.Series(values)
    assert standard_error(x) == x.std(ddof=1) / math.sqrt(len(x))
    m, sd = x.mean(), x.std(ddof=1)
    half = 1.96 * sd / math.sqrt(len(x))
    assert normal_interval(x) == (m, m - half, m + half, sd)
    lo, hi = normal_interval(x, z=3.0)[1:3]
    assert hi - lo == pytest.approx(2 * 3.0 * sd / 4)
    with pytest.raises(ValueError, match="values"):
        normal_interval(x[:1])


def test_pooled_sd() -> None:
    samples = np.array([[1.0, 2.0, 3.0], [10.0, 10.0, 10.0]])  # variances 1 and 0
    assert pooled_sd(samples) == pytest.approx(math.sqrt(0.5))
    logs = np.log(np.random.default_rng(1).uniform(0.01, 0.1, size=(12, 3)))
    assert pooled_sd(logs) == math.sqrt(np.mean(logs.var(axis=1, ddof=1)))
    with pytest.raises(ValueError, match="samples"):
        pooled_sd(np.ones((3, 1)))


def test_binomial_lower_bound_and_bonferroni_z() -> None:
    wins = np.array([0.5, 0.9, 1.0])
    np.testing.assert_array_equal(binomial_lower_bound(wins, 100),
                                  wins - 3 * np.sqrt(wins * (1 - wins) / 100))
    assert binomial_lower_bound(np.array([0.5]), 100, z=2)[0] == pytest.approx(0.4)
    assert bonferroni_z(1, 0.05) == pytest.approx(1.95996, abs=1e-5)
    assert bonferroni_z(17) == NormalDist().inv_cdf(1 - 0.01 / (2 * 17))
    assert bonferroni_z(10) > bonferroni_z(2)
    with pytest.raises(ValueError, match="n_tests"):
        bonferroni_z(0)
