"""The summary's statistics, pinned against hand computations and textbook values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rlmesh.results import EpisodeResult, RunResult, TelemetryRow
from rlmesh.stats import (
    BOOTSTRAP_EXACT_MAX,
    bootstrap_mean_ci,
    format_summary,
    interquartile_mean,
    summarize,
    summary_rows,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        (8, 10, (0.4901625, 0.9433178)),  # the textbook example
        (50, 100, (0.4038315, 0.5961685)),
        (0, 10, (0.0, 0.2775328)),
        (10, 10, (0.7224672, 1.0)),
    ],
)
def test_wilson_interval_matches_known_values(successes, n, expected):
    assert wilson_interval(successes, n) == pytest.approx(expected, abs=1e-6)


def test_wilson_interval_by_hand_at_90_percent():
    z = 1.6448536269514722  # Phi^-1(0.95)
    p, n = 0.3, 20
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(6, 20, confidence=0.9) == pytest.approx((center - half, center + half))


def test_wilson_interval_of_nothing_is_nan():
    assert all(math.isnan(bound) for bound in wilson_interval(0, 0))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 100], 4.5),  # drops 1, 2 and 7, 100
        ([10, 1, 2, 3], 2.5),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 5.0),  # n = 9 drops 2 from each end: mean of 3..7
        ([4.0], 4.0),
        ([1, 5], 3.0),
    ],
)
def test_interquartile_mean(values, expected):
    assert interquartile_mean(values) == expected


def test_interquartile_mean_of_nothing_is_nan():
    assert math.isnan(interquartile_mean([]))


def test_bootstrap_of_a_constant_is_that_constant():
    assert bootstrap_mean_ci([2.5] * 7) == (2.5, 2.5)
    assert bootstrap_mean_ci([9.0]) == (9.0, 9.0)


def test_bootstrap_is_reproducible_and_seeded():
    values = [1.3, 4.7, 2.2, 8.9, 5.1, 7.6, 0.4, 3.3]
    assert bootstrap_mean_ci(values) == bootstrap_mean_ci(values)
    assert bootstrap_mean_ci(values, resamples=50, seed=1) != bootstrap_mean_ci(
        values, resamples=50, seed=0
    )


def test_bootstrap_agrees_with_the_normal_interval_on_a_large_sample():
    values = [0.0, 1.0] * 500  # mean 0.5, standard error 0.5 / sqrt(1000)
    half = 1.959964 * 0.5 / math.sqrt(1000)
    lo, hi = bootstrap_mean_ci(values)
    assert lo == pytest.approx(0.5 - half, abs=0.004)
    assert hi == pytest.approx(0.5 + half, abs=0.004)


def test_bootstrap_of_nothing_is_nan():
    assert all(math.isnan(bound) for bound in bootstrap_mean_ci([]))


def _episode(index, reward, success=None, steps=10):
    return EpisodeResult(index, index, index, 0, steps, reward, True, False, success, 0.1, 0.1, 0.1)


def test_summarize_has_every_field():
    episodes = [_episode(k, float(k), success=k < 3, steps=10 + k) for k in range(4)]
    telemetry = (
        TelemetryRow("model.predict", "latency", "ms", 20, 1.0, 0.9, 1.5, 2.0, 3.0),
        TelemetryRow("env.step", "latency", "ms", 20, 0.5, 0.4, 0.8, 0.9, 1.0),
        TelemetryRow("driver", "lane-steps", "1/s", 46, 1000.0, *[math.nan] * 4),
    )
    summary = summarize(
        RunResult(episodes, base_seed=7, wasted_steps=3, telemetry=telemetry), core="python"
    )
    assert summary["episodes"] == 4
    assert summary["total_steps"] == 46
    assert summary["mean_reward"] == 1.5
    assert summary["iqm_reward"] == 1.5  # n = 4 drops 0 and 3
    assert summary["success_rate"] == 0.75
    assert summary["success_ci95"] == list(wilson_interval(3, 4))
    assert summary["episode_length_mean"] == 11.5
    assert (summary["episode_length_min"], summary["episode_length_max"]) == (10, 13)
    assert summary["steps_per_s"] == 1000.0
    assert summary["predict_ms"] == {"p50": 0.9, "p95": 1.5, "p99": 2.0}
    assert summary["env_step_ms"] == {"p50": 0.4, "p95": 0.8, "p99": 0.9}
    assert summary["predicts_per_episode"] == 5.0
    assert (summary["wasted_steps"], summary["base_seed"], summary["core"]) == (3, 7, "python")
    text = format_summary(summary)
    assert "75.0%" in text and "[0.000, 3.000]" not in text


def test_without_a_verdict_success_is_not_available_and_never_terminated():
    # Episode 0 terminated, episode 1 was truncated; nothing judged either.
    truncated = EpisodeResult(1, 1, 1, 0, 10, 2.0, False, True, None, 0.1, 0.1, 0.1)
    result = RunResult([_episode(0, 1.0), truncated], base_seed=0)
    summary = summarize(result, core="rust")
    assert summary["success_rate"] is None and result.success_rate is None
    assert summary["success_ci95"] == [None, None]
    assert summary["success_reported"] == 0
    assert summary["success_rule"] == "not available"
    rows = dict(summary_rows(summary))
    assert rows["success rate"] == "n/a" and rows["success rule"] == "not available"


def test_summarize_of_no_episodes_is_strict_json():
    import json

    summary = summarize(RunResult((), base_seed=0), core="rust")
    json.dumps(summary, allow_nan=False)
    assert summary["mean_reward"] is None


def _plain_bootstrap(values, resamples, seed=0, confidence=0.95):
    """The textbook percentile bootstrap in plain numpy: every resample at once."""
    data = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))
    tail = (1 - confidence) / 2
    return tuple(np.quantile(data[picks].mean(axis=1), [tail, 1 - tail]))


@pytest.mark.parametrize("n", [2, 17, 300, BOOTSTRAP_EXACT_MAX])
def test_the_blocked_bootstrap_equals_the_plain_one(n):
    values = np.random.default_rng(n).exponential(3.0, n)
    assert bootstrap_mean_ci(values, resamples=2_500, seed=4) == _plain_bootstrap(values, 2_500, 4)


def test_above_the_exact_size_the_interval_is_the_bootstraps_normal_limit():
    values = np.random.default_rng(1).exponential(3.0, BOOTSTRAP_EXACT_MAX + 904)  # skewed
    lo, hi = bootstrap_mean_ci(values)
    ref_lo, ref_hi = _plain_bootstrap(values, 4_000)
    standard_error = values.std() / math.sqrt(values.size)
    # Within the reference's own resampling noise (about 0.06 standard errors at 4000).
    assert lo == pytest.approx(ref_lo, abs=0.2 * standard_error)
    assert hi == pytest.approx(ref_hi, abs=0.2 * standard_error)
    big = np.concatenate([values, [math.inf]])  # one inf: about e^-1 of resamples miss it
    lo_inf, hi_inf = bootstrap_mean_ci(big)
    assert math.isfinite(lo_inf) and hi_inf == math.inf
    assert bootstrap_mean_ci(np.concatenate([values, [math.inf] * 10])) == (math.inf, math.inf)


@pytest.mark.parametrize(("n", "limit_mb"), [(BOOTSTRAP_EXACT_MAX, 80), (1_000_000, 40)])
def test_the_bootstrap_runs_in_bounded_memory(n, limit_mb):
    import tracemalloc

    values = np.random.default_rng(0).normal(size=n)
    tracemalloc.start()
    try:
        bootstrap_mean_ci(values)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit_mb * 2**20
