"""The book's statistics: means and spreads over seeds, intervals and tolerances.

Every tolerance a chapter tests against is computed here from a sampling argument: Student t
intervals over seeds (``seed_interval``), normal intervals over many models
(``normal_interval``), a pooled standard deviation over cells (``pooled_sd``), a binomial
lower bound (``binomial_lower_bound``) and a Bonferroni-corrected normal bound
(``bonferroni_z``). The functions take numpy arrays or pandas Series and call the methods of
what they are given (``x.std(ddof=1)`` is pandas' on a Series, numpy's on an array), so a
chapter that calls them gets exactly the numbers it computed inline before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

ArrayOrSeries = np.ndarray | pd.Series
MIN_UNITS = 2  # a t interval needs two units; with fewer, no interval


def summarize(scores: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation along ``axis`` (ddof=1 where there are >= 2 values)."""
    mean = scores.mean(axis=axis)
    std = scores.std(axis=axis, ddof=1) if scores.shape[axis] > 1 else np.zeros_like(mean)
    return mean, std


def student_t_quantile(q: float, df: int) -> float:
    """The q quantile (0.5 < q < 1) of Student's t with df degrees of freedom (scipy's)."""
    if not 0.5 < q < 1:
        raise ValueError(f"q={q!r} must lie in (0.5, 1)")
    if not (isinstance(df, (int, np.integer)) and df >= 1):
        raise ValueError(f"df={df!r} must be a positive integer")
    return float(scipy_stats.t.ppf(q, df))


def t_interval(values: Sequence[float], level: float) -> tuple[float, float, float]:
    """Mean of ``values`` (one per unit) and its two-sided Student t interval at ``level``;
    the interval is (nan, nan) with fewer than MIN_UNITS values."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must be in (0, 1)")
    mean, half = t_half_width(values, 0.5 + level / 2)  # each side at (1 + level) / 2
    return mean, mean - half, mean + half


def t_half_width(values: Sequence[float], level: float) -> tuple[float, float]:
    """Mean of ``values`` (one per unit) and the half-width of its one-sided Student t bound
    at ``level``: the mean lies above mean - half (or below mean + half) with confidence
    ``level``. The half-width is nan with fewer than MIN_UNITS values."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or not np.isfinite(v).all():
        raise ValueError(f"values must be finite numbers in one dimension; got {v!r}")
    if not 0.5 < level < 1.0:
        raise ValueError(f"level={level!r} must be in (0.5, 1)")
    if len(v) < MIN_UNITS:
        return (float(v.mean()) if len(v) else float("nan")), float("nan")
    half = student_t_quantile(level, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return float(v.mean()), float(half)


def seed_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-seed values and two half-widths from their spread (Student t, n - 1 df):
    (mean, t sd / sqrt(n) for the mean, t sd sqrt(1 + 1/n) for one new seed's value)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"values must hold >= 2 per-seed values; got shape {x.shape}")
    t = student_t_quantile(0.5 + level / 2, x.size - 1)
    sd = float(x.std(ddof=1))
    return float(x.mean()), t * sd / math.sqrt(x.size), t * sd * math.sqrt(1 + 1 / x.size)


def standard_error(values: ArrayOrSeries) -> float:
    """Standard error of the mean of ``values`` [n]: the sample sd (ddof=1) over sqrt(n)."""
    if len(values) < 2:
        raise ValueError(f"values must hold >= 2 values; got {len(values)}")
    return values.std(ddof=1) / math.sqrt(len(values))


def normal_interval(values: ArrayOrSeries, z: float = 1.96) -> tuple[float, float, float, float]:
    """(mean, lower, upper, sd) of the normal interval mean ± z sd / sqrt(n) over ``values``
    [n]; z = 1.96 gives 95 %, slightly narrow for a few dozen values (t would be wider)."""
    if len(values) < 2:
        raise ValueError(f"values must hold >= 2 values; got {len(values)}")
    mean, sd = values.mean(), values.std(ddof=1)
    half = z * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half, sd


def pooled_sd(samples: np.ndarray) -> float:
    """Pooled standard deviation of groups of equal size, one per row of ``samples``
    [groups, n]: the square root of the mean of the rows' sample variances (ddof=1)."""
    if samples.ndim != 2 or samples.shape[1] < 2:
        raise ValueError(f"samples must be [groups, n] with n >= 2; got shape {samples.shape}")
    return math.sqrt(np.mean(samples.var(axis=1, ddof=1)))


def binomial_lower_bound(p: np.ndarray, n: int, z: float = 3) -> np.ndarray:
    """Lower bound p - z sqrt(p (1 - p) / n) of a fraction p observed in n independent draws
    (the normal approximation to the binomial): [...] like p."""
    if n < 1:
        raise ValueError(f"n={n!r} must be >= 1")
    return p - z * np.sqrt(p * (1 - p) / n)


def bonferroni_z(n_tests: int, family_error: float = 0.01) -> float:
    """Two-sided normal bound z* = Phi^-1(1 - family_error / (2 n_tests)): n_tests |z| values
    all stay below it with probability at least 1 - family_error."""
    if n_tests < 1:
        raise ValueError(f"n_tests={n_tests!r} must be >= 1")
    if not 0 < family_error < 1:
        raise ValueError(f"family_error={family_error!r} must lie in (0, 1)")
    return NormalDist().inv_cdf(1 - family_error / (2 * n_tests))
