"""Confidence intervals and robust means: pure math on arrays of numbers.

The formulas, for n episode values x_1..x_n:

- ``bootstrap_mean_ci``: the percentile bootstrap. Draw ``resamples`` samples of size n with
  replacement (numpy ``default_rng(seed)``, so the interval is reproducible), take each one's
  mean, and return the ``(1-c)/2`` and ``(1+c)/2`` quantiles of those means (numpy's default
  linear interpolation). One value gives ``(x, x)``; none gives ``(nan, nan)``. The resamples
  are drawn ``BOOTSTRAP_BLOCK`` at a time, so memory stays bounded. Above
  ``BOOTSTRAP_EXACT_MAX`` values the resampled means are not drawn: their distribution is, to
  well within the resampling noise, the normal limit ``N(mean, s^2/n)`` (``s`` the standard
  deviation with divisor n, as the bootstrap's), and its quantiles are returned; drawing
  ``resamples * n`` indices would cost seconds per 100k values.
  Non-finite values: a nan, or +inf with -inf, gives ``(nan, nan)``; with m values at +inf
  (or -inf), a resampled mean is infinite unless it drew none of them, so the bounds are
  infinite where that share of resamples reaches them (``[1, 2, inf]`` gives a finite lower
  bound and an upper bound of inf).
- ``stratified_bootstrap_mean_ci``: the same percentile bootstrap for the mean of several
  groups' means (each group weighing the same, whatever its size): every resample redraws
  each group's values from that group alone, with replacement, and averages the groups'
  means. One group is ``bootstrap_mean_ci``'s interval, draw for draw. Above
  ``BOOTSTRAP_EXACT_MAX`` values in all, the normal limit again: ``N(m, sum_g s_g^2/n_g / G^2)``
  for G groups, ``m`` the mean of the group means; with a non-finite value the resamples are
  drawn whatever the size.
- ``interquartile_mean``: the mean of the middle half, as in Agarwal et al. (2021), "Deep RL at
  the edge of the statistical precipice": sort, drop ``floor(n/4)`` values from each end, and
  average the rest (``scipy.stats.trim_mean(x, 0.25)``). Fewer than 4 values drop nothing.
- ``wilson_interval``: the Wilson score interval for k successes in n trials, with
  ``z = Phi^-1((1+c)/2)`` and ``p = k/n``:
  ``(p + z^2/2n -/+ z * sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``. Unlike ``p -/+ z*se`` it
  stays inside [0, 1] and is not degenerate at p = 0 or 1.

- ``mcnemar_exact_p``: McNemar's exact test of two paired success rates. Of the N discordant
  pairs (one run succeeded, the other failed), k went one way; under the null hypothesis each
  way is as likely, so the two-sided p-value is ``min(1, 2 * P(X <= min(k, N - k)))`` for
  ``X ~ Binomial(N, 1/2)`` (``scipy.stats.binomtest(k, N).pvalue``), and 1 when N = 0. The
  tail is summed from its largest term down, in log space, so N in the millions costs
  microseconds.
- ``paired_rate_difference_ci``: Newcombe's (1998) hybrid score interval for the difference
  of two paired success rates (his method 10). With the pairs' table (``both``, ``only_a``,
  ``only_b``, ``neither``; n pairs), ``p_a = (both + only_a) / n``, ``p_b = (both + only_b) / n``,
  their Wilson intervals ``[l_a, u_a]``, ``[l_b, u_b]`` and the outcomes' correlation
  ``phi = (both * neither - only_a * only_b) / sqrt(product of the four margins)`` (0 when a
  margin is 0), the interval of ``p_b - p_a`` is ``p_b - p_a - sqrt((p_b - l_b)^2 - 2 phi (p_b -
  l_b)(u_a - p_a) + (u_a - p_a)^2)`` to ``p_b - p_a + sqrt((u_b - p_b)^2 - 2 phi (u_b - p_b)(p_a -
  l_a) + (p_a - l_a)^2)``. Unlike a bootstrap it is not degenerate when no pair is discordant.

Example:
    >>> wilson_interval(8, 10)
    (0.4901624..., 0.9433178...)
    >>> interquartile_mean([1, 2, 3, 4, 5, 6, 7, 100])
    4.5
    >>> bootstrap_mean_ci([1, 2, float("inf")])
    (1.0, inf)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

# Resampled means are computed this many resamples at a time: memory stays at
# BOOTSTRAP_BLOCK * n indices (at most 32 MB), however many resamples are asked for.
BOOTSTRAP_BLOCK = 1_000
# Up to this many values the bootstrap draws its resamples; above, it uses their normal limit.
BOOTSTRAP_EXACT_MAX = 4_096


def bootstrap_mean_ci(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The percentile-bootstrap confidence interval of the mean of ``values``.

    Example:
        >>> bootstrap_mean_ci([3.0, 3.0, 3.0])
        (3.0, 3.0)
        >>> lo, hi = bootstrap_mean_ci(range(100))
        >>> lo < 49.5 < hi
        True
    """
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0 or np.isnan(data).any():
        return (math.nan, math.nan)
    tail = (1.0 - confidence) / 2.0
    if data.size > BOOTSTRAP_EXACT_MAX:
        return _normal_limit_ci(data, tail)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, BOOTSTRAP_BLOCK):
        count = min(BOOTSTRAP_BLOCK, resamples - start)
        picks = rng.integers(0, data.size, size=(count, data.size))
        with np.errstate(invalid="ignore"):  # +inf with -inf: a nan mean, handled below
            means[start : start + count] = data[picks].mean(axis=1)
    if np.isfinite(means).all():
        lo, hi = np.quantile(means, [tail, 1.0 - tail])
        return (float(lo), float(hi))
    return (_quantile(np.sort(means), tail), _quantile(np.sort(means), 1.0 - tail))


def stratified_bootstrap_mean_ci(
    groups: Sequence[Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile-bootstrap confidence interval of the mean of the groups' means, each
    group resampled within itself (a stratified bootstrap; see the module docstring).

    ``groups``: G sequences of values, e.g. one per task of a suite. ``(nan, nan)`` when there
    is no group or a group is empty.

    Example:
        >>> stratified_bootstrap_mean_ci([[1.0, 1.0], [3.0, 3.0, 3.0]])  # (1 + 3) / 2
        (2.0, 2.0)
        >>> stratified_bootstrap_mean_ci([range(10)]) == bootstrap_mean_ci(range(10))
        True
    """
    data = [np.asarray(group, dtype=np.float64) for group in groups]
    if len(data) == 1:
        return bootstrap_mean_ci(data[0], confidence, resamples, seed)
    if not data or any(group.size == 0 or np.isnan(group).any() for group in data):
        return (math.nan, math.nan)
    tail = (1.0 - confidence) / 2.0
    finite = all(np.isfinite(group).all() for group in data)
    if finite and sum(group.size for group in data) > BOOTSTRAP_EXACT_MAX:
        center = float(np.mean([group.mean() for group in data]))
        variance = math.fsum(float(group.var()) / group.size for group in data)
        spread = math.sqrt(variance) / len(data)
        if spread == 0:
            return (center, center)
        z = NormalDist()
        return (center + spread * z.inv_cdf(tail), center + spread * z.inv_cdf(1.0 - tail))
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples, dtype=np.float64)
    for start in range(0, resamples, BOOTSTRAP_BLOCK):
        count = min(BOOTSTRAP_BLOCK, resamples - start)
        for group in data:
            picks = rng.integers(0, group.size, size=(count, group.size))
            with np.errstate(invalid="ignore"):  # +inf with -inf: a nan mean, handled below
                means[start : start + count] += group[picks].mean(axis=1)
    means /= len(data)
    if np.isfinite(means).all():
        lo, hi = np.quantile(means, [tail, 1.0 - tail])
        return (float(lo), float(hi))
    ordered = np.sort(means)
    return (_quantile(ordered, tail), _quantile(ordered, 1.0 - tail))


def _quantile(ordered: np.ndarray, q: float) -> float:
    """numpy's linear-interpolation quantile of sorted values, exact where they are infinite
    (numpy interpolates inf with a finite neighbour to nan)."""
    if np.isnan(ordered).any():
        return math.nan
    position = q * (ordered.size - 1)
    below = math.floor(position)
    above = min(below + 1, ordered.size - 1)
    low, high = float(ordered[below]), float(ordered[above])
    fraction = position - below
    if fraction == 0 or low == high:
        return low
    if math.isinf(low):
        return low
    if math.isinf(high):
        return high
    return float(np.quantile(ordered[below : above + 1], fraction))


def _normal_limit_ci(data: np.ndarray, tail: float) -> tuple[float, float]:
    """The percentile bootstrap's interval in its large-n limit (see the module docstring)."""
    n = data.size
    finite = data[np.isfinite(data)]
    infinite = data[~np.isfinite(data)]
    if infinite.size and (infinite.min() < 0 < infinite.max()):
        return (math.nan, math.nan)  # some resamples draw both: their mean is nan
    z = NormalDist()
    # A resample is finite iff it drew none of the m infinite values: probability (1-m/n)^n;
    # given that, its draws are uniform over the finite values.
    finite_share = math.exp(n * math.log1p(-infinite.size / n)) if infinite.size else 1.0
    center = float(finite.mean()) if finite.size else math.nan
    spread = float(finite.std()) / math.sqrt(n) if finite.size else math.nan

    def finite_quantile(q: float) -> float:
        if spread == 0:
            return center
        return center + spread * z.inv_cdf(min(max(q, 1e-300), 1 - 1e-16))

    sign = 1.0 if not infinite.size else float(np.sign(infinite[0]))
    # With +inf among the values the infinite resamples sort last, with -inf first.
    bounds = []
    for q in (tail, 1.0 - tail):
        if sign > 0:
            bounds.append(finite_quantile(q / finite_share) if q < finite_share else math.inf)
        else:
            share = 1.0 - finite_share
            bounds.append(-math.inf if q <= share else finite_quantile((q - share) / finite_share))
    return (bounds[0], bounds[1])


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of ``values`` (nan when empty).

    Example:
        >>> interquartile_mean([10, 1, 2, 3])  # drops 1 and 10
        2.5
    """
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        return math.nan
    cut = data.size // 4
    with np.errstate(invalid="ignore"):  # +inf with -inf in the middle: nan, no mean
        return float(data[cut : data.size - cut].mean())


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (``(nan, nan)`` when ``n == 0``).

    Example:
        >>> wilson_interval(0, 10)
        (0.0, 0.2775327...)
    """
    if n == 0:
        return (math.nan, math.nan)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / n
    denominator = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    # At k = 0 and k = n the bound is exactly 0 (or 1); say so rather than a rounding residue.
    lo = 0.0 if successes == 0 else center - half
    hi = 1.0 if successes == n else center + half
    return (lo, hi)


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p-value for ``only_a`` pairs where only run a succeeded and
    ``only_b`` where only run b did (see the module docstring).

    Example:
        >>> mcnemar_exact_p(0, 0), mcnemar_exact_p(3, 3)
        (1.0, 1.0)
        >>> round(mcnemar_exact_p(0, 6), 6)  # 2 / 2**6
        0.03125
    """
    discordant = only_a + only_b
    fewer = min(only_a, only_b)
    if 2 * fewer >= discordant:  # includes no discordant pair: the two ways are as likely
        return 1.0
    # P(X <= fewer) = t_fewer * (1 + r_1 + r_1 r_2 + ...), t_k = C(N, k) / 2^N; below the
    # mode each term is t_{k-1} = t_k * k / (N - k + 1), so the sum shrinks fast.
    log_largest = (
        math.lgamma(discordant + 1)
        - math.lgamma(fewer + 1)
        - math.lgamma(discordant - fewer + 1)
        - discordant * math.log(2.0)
    )
    terms, term = [1.0], 1.0
    for k in range(fewer, 0, -1):
        term *= k / (discordant - k + 1)
        if term < 1e-18 * terms[0]:
            break
        terms.append(term)
    tail = math.fsum(terms)
    return min(1.0, 2.0 * math.exp(log_largest + math.log(tail)))


def paired_rate_difference_ci(
    both: int, only_a: int, only_b: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``rate_b - rate_a`` for paired successes (method
    10; see the module docstring): ``(nan, nan)`` with no pair.

    Example:
        >>> lo, hi = paired_rate_difference_ci(both=5, only_a=0, only_b=10, neither=5)
        >>> 0.2 < lo < 0.5 < hi < 0.8
        True
    """
    n = both + only_a + only_b + neither
    if n == 0:
        return (math.nan, math.nan)
    successes_a, successes_b = both + only_a, both + only_b
    rate_a, rate_b = successes_a / n, successes_b / n
    low_a, high_a = wilson_interval(successes_a, n, confidence)
    low_b, high_b = wilson_interval(successes_b, n, confidence)
    margins = successes_a * (n - successes_a) * successes_b * (n - successes_b)
    phi = (both * neither - only_a * only_b) / math.sqrt(margins) if margins else 0.0
    below_b, above_a = rate_b - low_b, high_a - rate_a
    above_b, below_a = high_b - rate_b, rate_a - low_a
    # A rounding residue can make the sums a hair negative when both spreads are 0.
    down = math.sqrt(max(0.0, below_b**2 - 2 * phi * below_b * above_a + above_a**2))
    up = math.sqrt(max(0.0, above_b**2 - 2 * phi * above_b * below_a + below_a**2))
    difference = rate_b - rate_a
    return (max(-1.0, difference - down), min(1.0, difference + up))
