"""The driver's telemetry: per-op latency and step throughput, per window and for the run.

The driver times every call it makes (``model.predict``, ``env.step``, ``env.reset``, a whole
``driver.round``, the ``hooks``) in integer nanoseconds and counts the steps it takes.
``Telemetry`` keeps one ``LatencyStats`` per op from the active core (bounded memory however
long the run), hands out a window of rows every ``window_s`` seconds, and the cumulative rows
at the end (``RunResult.telemetry``).

Rows (``rlmesh.results.TelemetryRow``) come in the order ops were first recorded: one latency
row per op recorded in the span (``metric="latency"``, ``unit="ms"``), then two throughput
rows, ``op="driver"`` with ``metric`` ``"steps"`` (rounds: each steps every running lane once)
and ``"lane-steps"`` (lane transitions), ``unit="1/s"``.

What one latency sample is, so that a figure means the same at any number of lanes:

- ``model.predict``: one call of the model's corner. A batched corner is called once for the
  P lanes of a round; a per-lane corner P times, and each of those calls is one sample (the
  round's model time shared among them), so the count is the number of model calls.
- ``env.step``: one lane-step, one env's transition. Lanes rlmesh steps one by one are timed
  one by one; a vector stepped in one call shares that call's time among its lanes.
- ``env.reset``, ``hooks``: one call, whatever it covers; ``driver.round``: one round.
- With process lanes (``workers=W``), per step of the lanes: ``worker{w}.step``, the time
  worker ``w`` spent inside its envs' ``step`` calls (one sample per step it took part in),
  and ``driver.wait``, the time the driver waited for the workers' answers. The lanes report
  them through the ``record_latency`` the driver hands ``make_lanes``.

Example:
    >>> telemetry = Telemetry(window_s=1.0, started_ns=0)
    >>> telemetry.record("env.step", 2_000_000)  # 2 ms
    >>> telemetry.count_steps(1, lane_steps=8)
    >>> telemetry.window_due(now_ns=500_000_000), telemetry.window_due(now_ns=1_000_000_000)
    (False, True)
    >>> step, steps, lane_steps = telemetry.take_window(now_ns=1_000_000_000)
    >>> step.op, step.count, step.max, steps.avg, lane_steps.avg
    ('env.step', 1, 2.0, 1.0, 8.0)
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

from . import core as _core_selection
from .results.records import TelemetryRow
from .utils import shares

# The ops the driver records (process lanes add "worker{w}.step" and "driver.wait").
OPS = ("model.predict", "env.step", "env.reset", "driver.round", "hooks")
NS_PER_MS = 1e6
NS_PER_S = 1e9


def _latency_row(op: str, stats: Any) -> TelemetryRow:
    snapshot = stats.snapshot()
    return TelemetryRow(
        op=op,
        metric="latency",
        unit="ms",
        count=snapshot["count"],
        avg=snapshot["avg_ns"] / NS_PER_MS,
        p50=snapshot["p50_ns"] / NS_PER_MS,
        p95=snapshot["p95_ns"] / NS_PER_MS,
        p99=snapshot["p99_ns"] / NS_PER_MS,
        max=snapshot["max_ns"] / NS_PER_MS,
    )


def _rate_row(metric: str, count: int, elapsed_ns: int) -> TelemetryRow:
    # No time elapsed (a clock too coarse, or a zero-length span) gives no rate: nan.
    rate = count * NS_PER_S / elapsed_ns if elapsed_ns > 0 else math.nan
    nan = math.nan
    return TelemetryRow("driver", metric, "1/s", count, rate, nan, nan, nan, nan)


class Telemetry:
    """Latency per op and steps per second, in windows and cumulatively.

    Args:
        window_s: seconds per window (``> 0``; ``math.inf`` for no windows).
        started_ns: the clock reading (``time.perf_counter_ns()``) the run started at; the
            first window and the cumulative span start there.
        core: the core whose ``LatencyStats`` to use; the active core by default.

    Every ``now_ns`` is a reading of the same clock, never before the previous one.
    """

    def __init__(self, window_s: float, started_ns: int, core: ModuleType | None = None) -> None:
        if not (isinstance(window_s, (int, float)) and window_s > 0):  # also refuses nan
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
        self._window_ns = window_s * NS_PER_S
        self._core = core if core is not None else _core_selection.active
        self._started_ns = started_ns
        self._window_started_ns = started_ns
        # The open window's stats per op, and everything before it; taking a window merges the
        # first into the second, so each duration is recorded once.
        self._window: dict[str, Any] = {}
        self._before: dict[str, Any] = {}
        # [steps, lane-steps] of the open window, and of the whole run.
        self._window_steps = [0, 0]
        self._total_steps = [0, 0]

    def _stats(self, op: str) -> Any:
        stats = self._window.get(op)
        if stats is None:
            stats = self._window[op] = self._core.LatencyStats()
            self._before.setdefault(op, self._core.LatencyStats())
        return stats

    def record(self, op: str, ns: int) -> None:
        """One call of ``op`` took ``ns`` nanoseconds."""
        self._stats(op).record(ns)

    def window_stats(self, op: str) -> Any:
        """The open window's ``LatencyStats`` of ``op``, for a caller that records into it
        directly (the core's ``RoundRunner.run_rounds``). The same object serves every window:
        taking a window empties it in place."""
        return self._stats(op)

    @property
    def window_ends_ns(self) -> float:
        """The clock reading at which the open window is due (``math.inf`` without windows)."""
        return self._window_started_ns + self._window_ns

    def record_many(self, op: str, ns: Any) -> None:
        """Calls of ``op`` took ``ns`` nanoseconds each: a ``[K]`` integer array."""
        self._stats(op).record_many(ns)

    def record_shared(self, op: str, ns: int, count: int) -> None:
        """``count`` calls of ``op`` took ``ns`` nanoseconds together (one timing spans them,
        as a vector's step spans its lanes): ``count`` durations of an equal share, the
        remainder spread one nanosecond at a time so they add up to ``ns``.

        Example:
            >>> telemetry = Telemetry(window_s=1.0, started_ns=0)
            >>> telemetry.record_shared("env.step", 8_000_003, 4)  # 4 lane-steps in 8 ms
            >>> stats = telemetry.window_stats("env.step")
            >>> stats.count, stats.total_ns, stats.max_ns
            (4, 8000003, 2000001)
        """
        if count == 1:
            self._stats(op).record(ns)
        elif count > 1:
            self._stats(op).record_many(shares(ns, count))

    def count_steps(self, steps: int, lane_steps: int) -> None:
        """The driver made ``steps`` env step calls, stepping ``lane_steps`` lanes in all."""
        for counts in (self._window_steps, self._total_steps):
            counts[0] += steps
            counts[1] += lane_steps

    def window_due(self, now_ns: int) -> bool:
        """Whether ``window_s`` has passed since the current window started."""
        return now_ns - self._window_started_ns >= self._window_ns

    def _rows(
        self, stats: dict[str, Any], steps: list[int], elapsed_ns: int
    ) -> tuple[TelemetryRow, ...]:
        latency = [_latency_row(op, held) for op, held in stats.items() if held.count]
        return (
            *latency,
            _rate_row("steps", steps[0], elapsed_ns),
            _rate_row("lane-steps", steps[1], elapsed_ns),
        )

    def take_window(self, now_ns: int) -> tuple[TelemetryRow, ...]:
        """The rows of the window ending at ``now_ns``; the next window starts there."""
        rows = self._rows(self._window, self._window_steps, now_ns - self._window_started_ns)
        for op, stats in self._window.items():
            self._before[op].merge(stats)
            stats.reset()
        self._window_steps = [0, 0]
        self._window_started_ns = now_ns
        return rows

    def cumulative_rows(self, now_ns: int) -> tuple[TelemetryRow, ...]:
        """The rows of the whole run so far, from ``started_ns`` to ``now_ns``."""
        totals = {}
        for op, before in self._before.items():
            totals[op] = self._core.LatencyStats()
            totals[op].merge(before)
            totals[op].merge(self._window[op])
        return self._rows(totals, self._total_steps, now_ns - self._started_ns)
