"""Honest statistics of a run: confidence intervals, robust means, and the summary table.

The formulas, for n episode values x_1..x_n:

- ``bootstrap_mean_ci``: the percentile bootstrap. Draw ``resamples`` samples of size n with
  replacement (numpy ``default_rng(seed)``, so the interval is reproducible), take each one's
  mean, and return the ``(1-c)/2`` and ``(1+c)/2`` quantiles of those means (numpy's default
  linear interpolation). One value gives ``(x, x)``; none gives ``(nan, nan)``.
- ``interquartile_mean``: the mean of the middle half, as in Agarwal et al. (2021), "Deep RL at
  the edge of the statistical precipice": sort, drop ``floor(n/4)`` values from each end, and
  average the rest (``scipy.stats.trim_mean(x, 0.25)``). Fewer than 4 values drop nothing.
- ``wilson_interval``: the Wilson score interval for k successes in n trials, with
  ``z = Phi^-1((1+c)/2)`` and ``p = k/n``:
  ``(p + z^2/2n -/+ z * sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``. Unlike ``p -/+ z*se`` it
  stays inside [0, 1] and is not degenerate at p = 0 or 1.

``summarize`` turns a ``RunResult`` into the JSON-ready dict the ``rlmesh`` command prints
(``--json``) or renders as a table (``format_summary``). A value that does not exist (no
episodes, an env that reports no success, a latency never measured) is None, never nan, so the
JSON is strict.

Example:
    >>> wilson_interval(8, 10)
    (0.4901624..., 0.9433178...)
    >>> interquartile_mean([1, 2, 3, 4, 5, 6, 7, 100])
    4.5
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from .results import RunResult, TelemetryRow, succeeded

# Resampled means are computed this many resamples at a time, so memory stays at
# BOOTSTRAP_BLOCK * n indices however many resamples are asked for.
BOOTSTRAP_BLOCK = 1_000


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
    if data.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, BOOTSTRAP_BLOCK):
        count = min(BOOTSTRAP_BLOCK, resamples - start)
        picks = rng.integers(0, data.size, size=(count, data.size))
        means[start : start + count] = data[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return (float(lo), float(hi))


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


def _number(value: float | None) -> float | None:
    """A JSON-ready float: None for nan or a missing value."""
    return None if value is None or math.isnan(value) else float(value)


def _row(telemetry: Sequence[TelemetryRow], op: str, metric: str) -> TelemetryRow | None:
    return next((row for row in telemetry if row.op == op and row.metric == metric), None)


def _latency(telemetry: Sequence[TelemetryRow], op: str) -> dict[str, float | None]:
    row = _row(telemetry, op, "latency")
    return {q: None if row is None else _number(getattr(row, q)) for q in ("p50", "p95", "p99")}


def summarize(result: RunResult, *, core: str, elapsed_s: float | None = None) -> dict[str, Any]:
    """Every figure of the summary table, as a JSON-ready dict.

    ``success_rate`` is ``RunResult.success_rate``: each episode by ``results.succeeded`` (what
    the env reported, else ``terminated``); ``success_reported`` says for how many episodes
    the env reported success itself, so a reader knows when ``terminated`` stood in (for
    CartPole it means the pole fell). ``steps_per_s`` is the driver's lane-steps per second
    (telemetry). The figures mean the same at any number of lanes (``rlmesh.telemetry`` says
    what one sample is): ``predict_ms`` is per model call and ``predicts_per_episode`` counts
    model calls per scored episode (a per-lane corner is called once per lane that needs an
    action, a batched corner once for all of them; the statefulness probe's calls are not
    counted); ``env_step_ms`` is per lane-step, one env's transition. ``elapsed_s`` is the
    caller's wall clock, reported as given.

    Example:
        >>> from rlmesh.results import EpisodeResult
        >>> episodes = [EpisodeResult(k, k, k, 0, 10 + k, float(k), True, False, k % 2 == 0,
        ...                           0.1, 0.1, 0.1) for k in range(4)]
        >>> summary = summarize(RunResult(episodes, base_seed=0), core="python")
        >>> summary["episodes"], summary["mean_reward"], summary["success_rate"]
        (4, 1.5, 0.5)
    """
    episodes = result.episodes
    rewards = [episode.reward for episode in episodes]
    lengths = [episode.steps for episode in episodes]
    successes = sum(map(succeeded, episodes))
    reported = [episode for episode in episodes if episode.success is not None]
    telemetry = result.telemetry
    predict = _row(telemetry, "model.predict", "latency")
    lane_steps = _row(telemetry, "driver", "lane-steps")
    reward_lo, reward_hi = bootstrap_mean_ci(rewards)
    success_lo, success_hi = wilson_interval(successes, len(episodes))
    return {
        "episodes": len(episodes),
        "total_steps": result.total_steps,
        "mean_reward": _number(result.mean_reward),
        "mean_reward_ci95": [_number(reward_lo), _number(reward_hi)],
        "iqm_reward": _number(interquartile_mean(rewards)),
        "success_rate": _number(result.success_rate) if episodes else None,
        "success_ci95": [_number(success_lo), _number(success_hi)],
        "success_reported": len(reported),
        "episode_length_mean": _number(float(np.mean(lengths))) if lengths else None,
        "episode_length_min": min(lengths, default=None),
        "episode_length_max": max(lengths, default=None),
        "steps_per_s": None if lane_steps is None else _number(lane_steps.avg),
        "predict_ms": _latency(telemetry, "model.predict"),
        "env_step_ms": _latency(telemetry, "env.step"),
        "predicts_per_episode": (
            predict.count / len(episodes) if predict is not None and episodes else None
        ),
        "wasted_steps": result.wasted_steps,
        "base_seed": result.base_seed,
        "core": core,
        "elapsed_s": _number(elapsed_s),
    }


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _interval(pair: Sequence[float | None], spec: str = ".3f") -> str:
    return "-" if pair[0] is None else f"[{_fmt(pair[0], spec)}, {_fmt(pair[1], spec)}]"


def _percentiles(latency: dict[str, float | None]) -> str:
    return " / ".join(_fmt(latency[q]) for q in ("p50", "p95", "p99"))


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, text) rows, in table order."""
    success = (
        "-"
        if summary["success_rate"] is None
        else f"{summary['success_rate']:.1%}  95% CI "
        + _interval(summary["success_ci95"], ".1%")
        + f"  (env reported {summary['success_reported']} of {summary['episodes']}; "
        + "else terminated)"
    )
    return [
        ("episodes", str(summary["episodes"])),
        ("total steps", str(summary["total_steps"])),
        (
            "mean reward",
            f"{_fmt(summary['mean_reward'])}  95% CI " + _interval(summary["mean_reward_ci95"]),
        ),
        ("IQM reward", _fmt(summary["iqm_reward"])),
        ("success rate", success),
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


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a plain aligned two-column table (what ``rlmesh`` prints).

    Example:
        >>> print(format_summary(summarize(RunResult((), base_seed=3), core="rust")).split()[:2])
        ['episodes', '0']
    """
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {text}" for label, text in rows)
