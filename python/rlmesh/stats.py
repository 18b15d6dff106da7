"""Honest statistics of a run: confidence intervals, robust means, and the summary table.

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

``summarize`` turns a ``RunResult`` (or the ``RunColumns`` of a results file) into the
JSON-ready dict the ``rlmesh`` command prints (``--json``, through ``results.dumps``) or renders
as a table (``format_summary``). A value that does not exist (no episodes, success that is not
available, a latency never measured) is None, never nan; an infinite one stays a float, which
``results.dumps`` writes as ``"Infinity"`` / ``"-Infinity"``, so the JSON is strict.

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
from typing import Any

import numpy as np

from .results import RunColumns, RunResult, TelemetryRow, mean
from .success import describe

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


def _number(value: float | None) -> float | None:
    """A JSON-ready float: None for nan or a missing value."""
    return None if value is None or math.isnan(value) else float(value)


def _row(telemetry: Sequence[TelemetryRow], op: str, metric: str) -> TelemetryRow | None:
    return next((row for row in telemetry if row.op == op and row.metric == metric), None)


def _latency(telemetry: Sequence[TelemetryRow], op: str) -> dict[str, float | None]:
    row = _row(telemetry, op, "latency")
    return {q: None if row is None else _number(getattr(row, q)) for q in ("p50", "p95", "p99")}


def summarize(
    result: RunResult | RunColumns, *, core: str | None = None, elapsed_s: float | None = None
) -> dict[str, Any]:
    """Every figure of the summary table, as a JSON-ready dict (``RunResult.summary()``).

    ``success_rate`` counts the episodes with a verdict (``rlmesh.success``: the env's info,
    else the run's rule); it is None, and so is its interval, when no episode has one.
    ``success_rule`` names the rule used, ``success_reported`` for how many episodes the env
    reported success itself. ``episodes_requested`` is what the run asked for and
    ``complete`` whether every one of them is there (None when not known). ``steps_per_s`` is
    the driver's lane-steps per second (telemetry). The figures mean the same at any number of
    lanes (``rlmesh.telemetry`` says what one sample is): ``predict_ms`` is per model call and
    ``predicts_per_episode`` counts model calls per scored episode (a per-lane corner is called
    once per lane that needs an action, a batched corner once for all of them; the
    statefulness probe's calls are not counted); ``env_step_ms`` is per lane-step, one env's
    transition. ``core`` and ``elapsed_s`` default to the result's own.

    Failed episodes (their env raised, recorded with ``on_error``: ``EpisodeResult.error``)
    count in ``episodes`` and ``total_steps``, are counted in ``failed`` and listed in
    ``failed_indices``, and are left out of every reward, length and success figure, which
    describe the ``episodes - failed`` episodes that ran to their end.

    Example:
        >>> from rlmesh.results import EpisodeResult
        >>> episodes = [EpisodeResult(k, k, k, 0, 10 + k, float(k), True, False, k % 2 == 0,
        ...                           0.1, 0.1, 0.1, True) for k in range(4)]
        >>> summary = summarize(RunResult(episodes, base_seed=0), core="python")
        >>> summary["episodes"], summary["mean_reward"], summary["success_rate"]
        (4, 1.5, 0.5)
        >>> summary["success_rule"]
        'env info'
    """
    run = result.columns() if isinstance(result, RunResult) else result
    n = int(run.index.size)
    total_steps = int(run.steps.sum())
    failed = run.failed if run.failed is not None else np.zeros(n, dtype=bool)
    ended = ~failed
    rewards, lengths, success = run.reward[ended], run.steps[ended], run.success[ended]
    finished = int(rewards.size)
    judged = success >= 0
    judged_count = int(np.count_nonzero(judged))
    successes = int(np.count_nonzero(success == 1))
    reported = int(np.count_nonzero(run.success_reported[ended] & judged))
    telemetry = run.telemetry
    predict = _row(telemetry, "model.predict", "latency")
    lane_steps = _row(telemetry, "driver", "lane-steps")
    reward_lo, reward_hi = bootstrap_mean_ci(rewards)
    success_lo, success_hi = wilson_interval(successes, judged_count)
    requested = run.episodes_requested
    elapsed = run.elapsed_s if elapsed_s is None else elapsed_s
    return {
        "episodes": n,
        "episodes_requested": requested,
        "complete": None if requested is None else n >= requested,
        "failed": n - finished,
        "failed_indices": run.index[failed].tolist(),
        "total_steps": total_steps,
        "mean_reward": _number(mean(rewards)),
        "mean_reward_ci95": [_number(reward_lo), _number(reward_hi)],
        "iqm_reward": _number(interquartile_mean(rewards)),
        "success_rate": successes / judged_count if judged_count else None,
        "success_ci95": [_number(success_lo), _number(success_hi)],
        "success_rule": describe(run.success_rule, episodes=finished, reported=reported),
        "success_reported": reported,
        "episode_length_mean": _number(float(lengths.mean())) if finished else None,
        "episode_length_min": int(lengths.min()) if finished else None,
        "episode_length_max": int(lengths.max()) if finished else None,
        "steps_per_s": None if lane_steps is None else _number(lane_steps.avg),
        "predict_ms": _latency(telemetry, "model.predict"),
        "env_step_ms": _latency(telemetry, "env.step"),
        "predicts_per_episode": (predict.count / n if predict is not None and n else None),
        "wasted_steps": run.wasted_steps,
        "base_seed": run.base_seed,
        "core": core or run.core or "unknown",
        "elapsed_s": _number(elapsed),
    }


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _interval(pair: Sequence[float | None], spec: str = ".3f") -> str:
    return "-" if pair[0] is None else f"[{_fmt(pair[0], spec)}, {_fmt(pair[1], spec)}]"


def _percentiles(latency: dict[str, float | None]) -> str:
    return " / ".join(_fmt(latency[q]) for q in ("p50", "p95", "p99"))


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, text) rows, in table order."""
    episodes = str(summary["episodes"])
    if summary.get("complete") is False:
        episodes = f"{summary['episodes']} of {summary['episodes_requested']}, incomplete"
    success = (
        "n/a"
        if summary["success_rate"] is None
        else f"{summary['success_rate']:.1%}  95% CI " + _interval(summary["success_ci95"], ".1%")
    )
    failed = [("failed episodes (env error)", _listed(summary))] if summary.get("failed") else []
    return [
        ("episodes", episodes),
        *failed,
        ("total steps", str(summary["total_steps"])),
        (
            "mean reward",
            f"{_fmt(summary['mean_reward'])}  95% CI " + _interval(summary["mean_reward_ci95"]),
        ),
        ("IQM reward", _fmt(summary["iqm_reward"])),
        ("success rate", success),
        ("success rule", summary["success_rule"]),
        (
            "episode length mean / min / max",
            " / ".join(
                [
                    _fmt(summary["episode_length_mean"], ".1f"),
                    _fmt(summary["episode_length_min"], "d"),
                    _fmt(summary["episode_length_max"], "d"),
                ]
            ),
        ),
        ("lane-steps/s", _fmt(summary["steps_per_s"], ",.0f")),
        ("predict ms per call p50 / p95 / p99", _percentiles(summary["predict_ms"])),
        ("env step ms per lane-step p50 / p95 / p99", _percentiles(summary["env_step_ms"])),
        ("model calls per episode", _fmt(summary["predicts_per_episode"], ".1f")),
        ("wasted steps", str(summary["wasted_steps"])),
        ("base seed", str(summary["base_seed"])),
        ("core", str(summary["core"])),
    ]


LISTED_FAILURES = 20
"""The failed episodes' indices the summary table lists before it says how many more."""


def _listed(summary: dict[str, Any]) -> str:
    """``"3: indices 2, 7, 11"``, the first ``LISTED_FAILURES`` indices then ``", ... (N
    more)"``; the JSON summary holds them all."""
    indices = summary["failed_indices"]
    shown = ", ".join(map(str, indices[:LISTED_FAILURES]))
    more = len(indices) - LISTED_FAILURES
    tail = f", ... ({more} more)" if more > 0 else ""
    return f"{summary['failed']}: indices {shown}{tail}"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a plain aligned two-column table (what ``rlmesh`` prints).

    Example:
        >>> print(format_summary(summarize(RunResult((), base_seed=3), core="rust")).split()[:2])
        ['episodes', '0']
    """
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {text}" for label, text in rows)


# ---------------------------------------------------------------------------- suites


OVERALL_METHOD = (
    "the unweighted mean of the per-task figures (each task counts once, whatever its "
    "episodes); 95% CI: stratified bootstrap, each task's episodes resampled within the task "
    "({resamples} resamples, seed {seed})"
)


def summarize_suite(
    runs: dict[str, RunResult | RunColumns],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """A suite's summary, JSON-ready: one row per task and the overall row.

    Args:
        runs: task name -> that task's ``RunResult`` or ``RunColumns`` (``rlmesh.run_suite``'s
            ``SuiteResult.runs``, or ``results.read_suite_columns``), in suite order.

    Each task row holds the task's ``summarize`` figures of its episodes that did not fail
    (``success_rate`` with its Wilson ``success_ci95``, ``mean_reward`` with its bootstrap
    ``mean_reward_ci95``, ...), with ``episodes`` counting every episode, ``errors`` the
    failed ones (``EpisodeResult.error`` set) and ``error_indices`` their indices. The
    overall row holds ``success_rate``, the mean of the per-task success rates (of the
    ``success_tasks`` tasks whose success is available), and ``mean_reward``, the mean of the
    per-task mean rewards, each with a ``stratified_bootstrap_mean_ci`` (``seed``, ``resamples``);
    ``method`` says so in words.

    Example:
        >>> from rlmesh.results import EpisodeResult
        >>> def episode(k, reward, success):
        ...     return EpisodeResult(k, k, k, 0, 10, reward, True, False, success, 0, 0, 0, True)
        >>> a = RunResult([episode(0, 1.0, True), episode(1, 0.0, False)], base_seed=0)
        >>> b = RunResult([episode(0, 4.0, True)], base_seed=0)
        >>> overall = summarize_suite({"a": a, "b": b})["overall"]
        >>> overall["success_rate"], overall["mean_reward"]
        (0.75, 2.25)
    """
    rows, rates, returns = [], [], []
    for name, run in runs.items():
        columns = run.columns() if isinstance(run, RunResult) else run
        failed = columns.failed
        if failed is None:
            failed = np.zeros(columns.num_episodes, dtype=bool)
        kept = columns.select(~failed)
        row = summarize(kept)
        requested = columns.episodes_requested
        row.update(
            task=name,
            episodes=columns.num_episodes,
            complete=None if requested is None else columns.num_episodes >= requested,
            errors=int(failed.sum()),
            error_indices=columns.index[failed].tolist(),
        )
        rows.append({"task": name, **row})
        judged = kept.success >= 0
        if judged.any():
            rates.append(kept.success[judged].astype(np.float64))
        if kept.num_episodes:
            returns.append(kept.reward)
    requested = [row["episodes_requested"] for row in rows]
    overall = {
        "tasks": len(rows),
        "episodes": sum(row["episodes"] for row in rows),
        "episodes_requested": None if None in requested else sum(requested),
        "complete": all(row["complete"] is not False for row in rows),
        "errors": sum(row["errors"] for row in rows),
        **suite_overall(rates, returns, confidence=confidence, resamples=resamples, seed=seed),
    }
    return {"tasks": rows, "overall": overall}


def suite_overall(
    rates: Sequence[np.ndarray],
    returns: Sequence[np.ndarray],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """A suite's overall figures from its tasks' success verdicts (``rates``: per task with
    any, its 0/1 values) and returns (per task with episodes): the means of the per-task
    means, each with its stratified bootstrap CI, and the method in words.

    Example:
        >>> overall = suite_overall([np.array([1.0, 0.0]), np.array([1.0])], [np.array([2.0])])
        >>> overall["success_rate"], overall["mean_reward"], overall["mean_reward_ci95"]
        (0.75, 2.0, [2.0, 2.0])
    """
    success_lo, success_hi = stratified_bootstrap_mean_ci(rates, confidence, resamples, seed)
    reward_lo, reward_hi = stratified_bootstrap_mean_ci(returns, confidence, resamples, seed)
    return {
        "success_rate": _number(mean([rate.mean() for rate in rates])) if rates else None,
        "success_ci95": [_number(success_lo), _number(success_hi)],
        "success_tasks": len(rates),
        "mean_reward": _number(mean([float(np.mean(r)) for r in returns])) if returns else None,
        "mean_reward_ci95": [_number(reward_lo), _number(reward_hi)],
        "reward_tasks": len(returns),
        "ci": "stratified bootstrap",
        "resamples": resamples,
        "seed": seed,
        "method": OVERALL_METHOD.format(resamples=resamples, seed=seed),
    }


def format_suite_summary(summary: dict[str, Any]) -> str:
    """The suite's summary (``summarize_suite``) as an aligned table: one row per task, the
    overall row, and a line saying how the overall row is computed.

    Example:
        >>> print(format_suite_summary(summarize_suite({"a": RunResult((), base_seed=0)})))
        ... # doctest: +NORMALIZE_WHITESPACE
        task     episodes  errors  success  95% CI (Wilson)  mean reward  95% CI (bootstrap)
        a        0         0       n/a      -                -            -
        overall  0         0       n/a      -                -            -
        overall: the unweighted mean of the per-task figures ...
    """
    header = [
        "task",
        "episodes",
        "errors",
        "success",
        "95% CI (Wilson)",
        "mean reward",
        "95% CI (bootstrap)",
    ]

    def cells(name: str, row: dict[str, Any]) -> list[str]:
        episodes = str(row["episodes"])
        if row.get("complete") is False:
            episodes = f"{row['episodes']} of {row['episodes_requested']}, incomplete"
        rate = row["success_rate"]
        return [
            name,
            episodes,
            str(row["errors"]),
            "n/a" if rate is None else f"{rate:.1%}",
            "-" if rate is None else _interval(row["success_ci95"], ".1%"),
            _fmt(row["mean_reward"]),
            "-" if row["mean_reward"] is None else _interval(row["mean_reward_ci95"]),
        ]

    lines = [header]
    lines += [cells(row["task"], row) for row in summary["tasks"]]
    overall = summary["overall"]
    lines.append(cells("overall", overall))
    widths = [max(len(line[k]) for line in lines) for k in range(len(header))]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    note = f"overall: {overall['method']}"
    if overall["success_tasks"] < overall["tasks"]:
        note += (
            f"; success over the {overall['success_tasks']} of {overall['tasks']} tasks whose "
            "success is available"
        )
    failed = [f"{row['task']} {row['error_indices']}" for row in summary["tasks"] if row["errors"]]
    if failed:
        note += "\nfailed episodes (kept out of the figures): " + "; ".join(failed)
    return "\n".join(table) + "\n" + note
