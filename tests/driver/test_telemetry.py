"""The driver's Telemetry: per-op latency rows and throughput, per window and for the run, and
what one sample is in a run (a model call, a lane-step) at any number of lanes."""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, AwaitEveryStep
from rlmesh import core as core_selection
from rlmesh.results import TelemetryRow
from rlmesh.stats import summarize, summary_rows
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


# ----------------------------------------------------------------------------------------------
# What a sample is, in a run: a model call, a lane-step; the same figures at any lane count

EPISODES = 6


class Sleeps2ms(gym.Env):
    """Every step takes 2 ms; episodes of 8..12 steps, by seed."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, 8 + int(self.np_random.integers(5))
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(0.002)
        self.t += 1
        return np.full(2, self.t / 20, np.float32), 1.0, self.t >= self.length, False, {}


class PerLane(rlmesh.Model):
    """A pure per-lane policy that counts its calls; promises statelessness, so no probe
    call mixes into the count."""

    stateless = True

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict(self, obs):
        self.calls += 1
        return int(obs[0] > 0.2)


class Batched(PerLane):
    def predict_batch(self, obs):
        self.calls += 1
        return (obs[:, 0] > 0.2).astype(np.int64)


class PerLaneChunks(PerLane):
    def predict_chunk(self, obs, execution_horizon=None):
        self.calls += 1
        return np.zeros(3, np.int64)


def evaluate(model, core, num_envs, awaited, **kwargs):
    result = rlmesh.run(
        model,
        Sleeps2ms,
        episodes=EPISODES,
        num_envs=num_envs,
        core=core,
        hooks=[AwaitEveryStep()] if awaited else None,
        **kwargs,
    )
    return result, by_metric(result.telemetry), summarize(result, core=core)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("awaited", [False, True], ids=["core rounds", "awaited rounds"])
@pytest.mark.parametrize(
    ("model_class", "horizon"),
    [(PerLane, 1), (Batched, 1), (PerLaneChunks, 3)],
    ids=["predict", "predict_batch", "predict_chunk"],
)
def test_predicts_per_episode_are_the_model_calls_at_four_lanes(
    core, awaited, model_class, horizon
):
    model = model_class()
    result, rows, summary = evaluate(model, core, 4, awaited, execution_horizon=horizon)
    assert rows["model.predict", "latency"].count == model.calls
    assert summary["predicts_per_episode"] == model.calls / EPISODES
    if model_class is PerLane:  # one call per lane-step
        assert model.calls == result.total_steps
    elif model_class is Batched:  # one call per round, for all the lanes running in it
        assert model.calls == rows["driver", "steps"].count < result.total_steps


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("awaited", [False, True], ids=["core rounds", "awaited rounds"])
def test_env_step_latency_is_per_lane_step_whatever_the_lane_count(core, awaited):
    figures = {}
    for num_envs in (1, 4):
        result, rows, summary = evaluate(PerLane(), core, num_envs, awaited)
        step = rows["env.step", "latency"]
        assert step.count == result.total_steps  # one sample per lane-step
        figures[num_envs] = summary["env_step_ms"]["p50"]
    assert figures[1] >= 2.0  # each step sleeps 2 ms
    # Four lanes stepped in a round do not make a step four times as slow.
    assert figures[4] < 1.5 * figures[1]


def test_the_summary_table_says_what_a_latency_figure_is_per():
    labels = [label for label, _ in summary_rows(summarize(rlmesh.RunResult((), 0), core="rust"))]
    assert "predict ms per call p50 / p95 / p99" in labels
    assert "env step ms per lane-step p50 / p95 / p99" in labels
    assert "model calls per episode" in labels


def test_record_shared_splits_one_timing_into_equal_shares_adding_up(core):
    telemetry = Telemetry(window_s=1.0, started_ns=0, core=core)
    telemetry.record_shared("model.predict", 10, 4)
    telemetry.record_shared("model.predict", 7, 1)
    telemetry.record_shared("env.step", 5, 0)  # no calls: nothing recorded
    stats = telemetry.window_stats("model.predict")
    assert (stats.count, stats.total_ns, stats.max_ns) == (5, 17, 7)
    assert stats.quantile(0.0) == 2  # shares 3, 3, 2, 2
    assert telemetry.window_stats("env.step").count == 0
