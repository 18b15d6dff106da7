"""The driver's Telemetry: per-op latency rows and throughput, per window and for the run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rlmesh import core as core_selection
from rlmesh.results import TelemetryRow
from rlmesh.telemetry import OPS, Telemetry

SECOND = 1_000_000_000
MS = 1_000_000


def by_metric(rows) -> dict[tuple[str, str], TelemetryRow]:
    return {(row.op, row.metric): row for row in rows}


def test_a_window_converts_latencies_to_ms_and_counts_steps_per_second(core):
    telemetry = Telemetry(window_s=2.0, started_ns=5 * SECOND, core=core)
    telemetry.record("model.predict", 4 * MS)
    telemetry.record_many("env.step", np.array([1, 2, 3, 100], dtype=np.int64) * MS)
    telemetry.count_steps(3, lane_steps=24)
    telemetry.count_steps(1, lane_steps=8)
    rows = telemetry.take_window(now_ns=7 * SECOND)
    assert [(row.op, row.metric, row.unit) for row in rows] == [
        ("model.predict", "latency", "ms"),
        ("env.step", "latency", "ms"),
        ("driver", "steps", "1/s"),
        ("driver", "lane-steps", "1/s"),
    ]
    predict, step, steps, lane_steps = rows
    assert predict == TelemetryRow("model.predict", "latency", "ms", 1, 4.0, 4.0, 4.0, 4.0, 4.0)
    assert (step.count, step.avg, step.max) == (4, 26.5, 100.0)
    assert step.p50 == pytest.approx(2.0, rel=1 / 128)
    assert (steps.count, steps.avg, lane_steps.count, lane_steps.avg) == (4, 2.0, 32, 16.0)
    assert all(math.isnan(value) for value in (steps.p50, steps.p95, steps.p99, steps.max))


def test_windows_fall_due_every_window_s_from_the_last_one(core):
    telemetry = Telemetry(window_s=0.5, started_ns=1_000, core=core)
    assert not telemetry.window_due(1_000)
    assert not telemetry.window_due(1_000 + SECOND // 2 - 1)
    assert telemetry.window_due(1_000 + SECOND // 2)
    telemetry.take_window(now_ns=1_000 + SECOND)  # taken late: the next window starts here
    assert not telemetry.window_due(1_000 + SECOND + SECOND // 2 - 1)
    assert telemetry.window_due(1_000 + SECOND + SECOND // 2)


def test_an_infinite_window_never_falls_due(core):
    telemetry = Telemetry(window_s=math.inf, started_ns=0, core=core)
    assert not telemetry.window_due(10**18)


def test_each_window_holds_only_its_own_records_and_the_run_holds_all(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    telemetry.record("env.reset", 10 * MS)
    telemetry.record("env.step", 1 * MS)
    telemetry.count_steps(1, 4)
    first = by_metric(telemetry.take_window(now_ns=SECOND))
    telemetry.record("env.step", 3 * MS)
    telemetry.record("env.step", 5 * MS)
    telemetry.count_steps(2, 8)
    second = by_metric(telemetry.take_window(now_ns=3 * SECOND))

    assert first["env.step", "latency"].count == 1
    assert (second["env.step", "latency"].count, second["env.step", "latency"].avg) == (2, 4.0)
    assert ("env.reset", "latency") not in second  # nothing recorded in that window
    assert second["driver", "steps"].avg == 1.0  # 2 steps in 2 s
    assert second["driver", "lane-steps"].avg == 4.0

    telemetry.record("env.step", 7 * MS)  # in the open window: still counted for the run
    telemetry.count_steps(1, 4)
    total = by_metric(telemetry.cumulative_rows(now_ns=4 * SECOND))
    assert (total["env.step", "latency"].count, total["env.step", "latency"].avg) == (4, 4.0)
    assert total["env.step", "latency"].max == 7.0
    assert total["env.reset", "latency"].count == 1
    assert (total["driver", "steps"].count, total["driver", "steps"].avg) == (4, 1.0)
    assert (total["driver", "lane-steps"].count, total["driver", "lane-steps"].avg) == (16, 4.0)
    # Reading the run's rows takes nothing away from the open window.
    window = by_metric(telemetry.take_window(now_ns=4 * SECOND))
    assert window["env.step", "latency"].count == 1


def test_the_driver_ops_keep_the_order_they_were_first_recorded_in(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    for op in reversed(OPS):
        telemetry.record(op, 1_000)
    ops = [row.op for row in telemetry.cumulative_rows(now_ns=SECOND)]
    assert ops == [*reversed(OPS), "driver", "driver"]


def test_a_span_without_time_has_no_rate(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    telemetry.count_steps(5, 5)
    steps, lane_steps = telemetry.take_window(now_ns=0)
    assert (steps.count, lane_steps.count) == (5, 5)
    assert math.isnan(steps.avg) and math.isnan(lane_steps.avg)


def test_stats_come_from_the_given_core_else_the_active_one(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    telemetry.record("hooks", 1)
    assert type(telemetry._window["hooks"]) is core.LatencyStats
    default = Telemetry(window_s=1.0, started_ns=0)
    default.record("hooks", 1)
    assert type(default._window["hooks"]) is core_selection.active.LatencyStats


def test_bad_durations_and_windows_are_refused(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    with pytest.raises(ValueError, match=r"^ns must be a non-negative duration, got -4$"):
        telemetry.record("env.step", -4)
    for window_s in (0, -1.0, math.nan, "1"):
        with pytest.raises(ValueError, match=r"^window_s must be a positive number of seconds"):
            Telemetry(window_s=window_s, started_ns=0, core=core)
