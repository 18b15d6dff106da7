"""Latency statistics: one ``record_many`` of 4096 durations into a LatencyStats.

The durations are log-normal around 50 µs with a tail to tens of milliseconds, as the
per-lane step times of a large lane vector; the stats already hold one batch, so the buckets
that batch needs exist (the steady state of a long run).

Run: ``pytest benches/test_bench_telemetry.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np

SIZE = 4096


def test_latency_stats_record_many(benchmark, core):
    rng = np.random.default_rng(0)
    durations = rng.lognormal(np.log(50_000), 1.0, SIZE).astype(np.int64)
    stats = core.LatencyStats()
    stats.record_many(durations)
    benchmark.group = f"latency stats, record {SIZE}"
    benchmark(stats.record_many, durations)
    assert stats.count % SIZE == 0 and stats.count >= 2 * SIZE
    assert stats.max_ns == durations.max()
    exact = np.quantile(durations, 0.5, method="inverted_cdf")
    assert abs(stats.quantile(0.5) - exact) <= exact / 128
