"""LatencyStats, against both cores: quantile accuracy, merging, bounded memory, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rlmesh._pycore import LatencyStats as PythonLatencyStats
from rlmesh._pycore.telemetry import (
    EXACT_BELOW,
    MAX_BUCKETS,
    RELATIVE_ERROR,
    bucket_bounds,
    bucket_index,
)

I64_MAX = 2**63 - 1
QUANTILES = (0.0, 0.001, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def raises(error: type[Exception], message: str):
    """pytest.raises matching the whole message exactly."""
    return pytest.raises(error, match="^" + re.escape(message) + "$")


def latencies(size: int, seed: int = 0) -> np.ndarray:
    """Durations like a driver's: log-normal around 50 µs, a tail to seconds, some tiny."""
    rng = np.random.default_rng(seed)
    body = rng.lognormal(mean=np.log(50_000), sigma=1.5, size=size)
    values = body.astype(np.int64)
    values[rng.integers(0, size, size // 50)] = rng.integers(0, EXACT_BELOW, size // 50)
    return values


def test_the_bucket_layout_is_exact_below_128_and_tight_above():
    assert MAX_BUCKETS == bucket_index(I64_MAX) + 1 == 3712
    assert RELATIVE_ERROR == 1 / 128
    for ns in [*range(EXACT_BELOW), 128, 129, 1000, 10**9, 2**40 + 12345, I64_MAX]:
        start, width = bucket_bounds(bucket_index(ns))
        assert start <= ns < start + width
        assert width == 1 or width <= start / 64  # a bucket is at most 1/64 of its start


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantiles_are_within_the_documented_relative_error_of_numpy(core, seed):
    data = latencies(10_007, seed)  # a prime count: q * count is never near a whole rank
    stats = core.LatencyStats()
    stats.record_many(data)
    for q in QUANTILES:
        exact = int(np.quantile(data, q, method="inverted_cdf"))  # nearest rank
        got = stats.quantile(q)
        assert abs(got - exact) <= exact * RELATIVE_ERROR, (q, got, exact)
        assert got <= data.max()
        if exact < EXACT_BELOW:
            assert got == exact
    assert stats.quantile(1.0) == stats.max_ns == data.max()


def test_count_total_mean_and_max_are_exact(core):
    data = latencies(5_000)
    stats = core.LatencyStats()
    stats.record_many(data)
    assert stats.count == 5_000
    assert stats.total_ns == int(data.sum())
    assert stats.snapshot()["avg_ns"] == float(int(data.sum())) / 5_000
    assert stats.max_ns == int(data.max())


def test_record_one_at_a_time_equals_record_many(core):
    data = latencies(500)
    one, many = core.LatencyStats(), core.LatencyStats()
    for value in data.tolist():
        one.record(value)
    many.record_many(data)
    assert one.snapshot() == many.snapshot()
    assert [one.quantile(q) for q in QUANTILES] == [many.quantile(q) for q in QUANTILES]


def test_merge_equals_recording_everything_into_one(core):
    first, second = latencies(3_000, 1), latencies(2_000, 2) * 40  # the second reaches further
    merged, left, right = core.LatencyStats(), core.LatencyStats(), core.LatencyStats()
    merged.record_many(np.concatenate([first, second]))
    left.record_many(first)
    right.record_many(second)
    left.merge(right)
    assert left.snapshot() == merged.snapshot()
    assert [left.quantile(q) for q in QUANTILES] == [merged.quantile(q) for q in QUANTILES]
    assert right.count == 2_000  # merged from, not changed


def test_merging_with_itself_doubles_everything_but_the_max(core):
    stats = core.LatencyStats()
    stats.record_many([10, 20, 5_000])
    stats.merge(stats)
    assert (stats.count, stats.total_ns, stats.max_ns) == (6, 10_060, 5_000)
    assert stats.quantile(0.5) == 20


def test_memory_is_bounded_by_the_largest_value_never_by_the_count():
    """The Python core's buckets, read directly (no caller needs their count); the Rust core's
    are checked alike by its unit test of the same name in ``rust/src/telemetry.rs``."""
    stats = PythonLatencyStats()
    stats.record(999_999)
    buckets = len(stats._buckets)
    assert buckets == bucket_index(999_999) + 1
    rng = np.random.default_rng(0)
    for _ in range(20):
        stats.record_many(rng.integers(0, 1_000_000, 50_000))
    assert stats.count == 1_000_001
    assert len(stats._buckets) == buckets  # a million values, no more buckets
    stats.record(I64_MAX)
    assert len(stats._buckets) == MAX_BUCKETS  # the most any LatencyStats ever holds
    stats.reset()
    assert stats._buckets == []  # the memory went with the values


def test_empty_stats_read_as_zeros_and_reset_empties(core):
    stats = core.LatencyStats()
    empty = {"count": 0, "avg_ns": 0.0, "p50_ns": 0, "p95_ns": 0, "p99_ns": 0, "max_ns": 0}
    assert stats.snapshot() == empty
    assert (stats.count, stats.total_ns, stats.max_ns) == (0, 0, 0)
    assert stats.quantile(0.5) == 0
    stats.record_many(latencies(100))
    stats.reset()
    assert stats.snapshot() == empty
    assert repr(stats) == "LatencyStats(count=0, total_ns=0, max_ns=0)"


def test_the_snapshot_reads_the_quantiles_and_keeps_its_key_order(core):
    stats = core.LatencyStats()
    stats.record_many(np.arange(1, 101))  # 1..100: every value exact
    snapshot = stats.snapshot()
    assert list(snapshot) == ["count", "avg_ns", "p50_ns", "p95_ns", "p99_ns", "max_ns"]
    assert snapshot == {
        "count": 100,
        "avg_ns": 50.5,
        "p50_ns": 50,
        "p95_ns": 95,
        "p99_ns": 99,
        "max_ns": 100,
    }
    assert type(snapshot["p50_ns"]) is int and type(snapshot["avg_ns"]) is float


def test_a_quantile_is_never_above_the_max(core):
    stats = core.LatencyStats()
    stats.record(1_000_000)  # its bucket's midpoint is 1_003_520
    assert stats.quantile(0.5) == 1_000_000


def test_huge_durations_keep_an_exact_total(core):
    stats = core.LatencyStats()
    stats.record_many(np.full(4, I64_MAX))
    assert stats.total_ns == 4 * I64_MAX  # past int64: no overflow
    assert stats.snapshot()["avg_ns"] == float(I64_MAX)


def test_negative_durations_are_named_and_nothing_is_recorded(core):
    stats = core.LatencyStats()
    stats.record(7)
    with raises(ValueError, "ns must be a non-negative duration, got -1"):
        stats.record(-1)
    with raises(ValueError, "ns[2] must be a non-negative duration, got -5"):
        stats.record_many(np.array([1, 2, -5, -6]))
    assert (stats.count, stats.total_ns) == (1, 7)


def test_bad_arguments_are_refused(core):
    stats = core.LatencyStats()
    with raises(ValueError, "ns must be an integer in [-2**63, 2**63), got float"):
        stats.record(1.5)
    with raises(ValueError, f"ns must be an integer in [-2**63, 2**63), got {2**63}"):
        stats.record(2**63)
    with raises(ValueError, "ns must hold integers, got dtype float64"):
        stats.record_many(np.array([1.0]))
    with raises(ValueError, "ns must be a 1-D array, got shape (2, 1)"):
        stats.record_many(np.zeros((2, 1), dtype=np.int64))
    for q in (-0.1, 1.5, float("nan")):
        with raises(ValueError, f"q must be a number in [0, 1], got {q!r}"):
            stats.quantile(q)
    with raises(ValueError, "q must be a number in [0, 1], got str"):
        stats.quantile("0.5")
    with raises(TypeError, "merge needs a LatencyStats from the same core, got builtins.dict"):
        stats.merge({})
    assert stats.count == 0


def test_stats_of_one_core_do_not_merge_into_the_other(core):
    from rlmesh.core import load_core

    other = load_core("python" if core.__name__ == "rlmesh._core" else "rust")
    with pytest.raises(TypeError, match="merge needs a LatencyStats from the same core"):
        core.LatencyStats().merge(other.LatencyStats())
