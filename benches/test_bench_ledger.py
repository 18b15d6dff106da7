"""The ledger's per-step traffic: what the driver asks of it for one step of N lanes.

One round = ``mark_predicted`` + ``record_step`` over all N lanes, then, for the lanes whose
episode ended, ``complete_episodes`` + ``take_model_ends`` + ``start_episodes``. Episodes last
64 steps and are staggered across lanes, so about N/64 lanes end every step, as on a long
evaluation of a CartPole-length task.

Run: ``pytest benches/test_bench_ledger.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np
import pytest

EPISODE_STEPS = 64
LANE_COUNTS = (1, 16, 256, 4096)


class LedgerStepLoop:
    """Drives one ledger with N lanes through staggered 64-step episodes."""

    def __init__(self, core, num_lanes: int) -> None:
        self.ledger = core.RouteLedger(num_lanes, 10**12)
        self.lanes = np.arange(num_lanes, dtype=np.int64)
        self.rewards = np.ones(num_lanes)
        self.truncated = np.zeros(num_lanes, dtype=bool)
        self.step_ns = np.full(num_lanes, 20_000, dtype=np.int64)
        self.predict_ns = np.full(num_lanes, 5_000, dtype=np.int64)
        # Lane i ends on the steps where (step + i) % 64 == 63.
        self.terminated = [
            (np.arange(num_lanes) + phase) % EPISODE_STEPS == EPISODE_STEPS - 1
            for phase in range(EPISODE_STEPS)
        ]
        self.step_count = 0
        self.ledger.start_episodes(self.lanes, now_ns=0)

    def step(self) -> int:
        ledger = self.ledger
        now_ns = self.step_count * 25_000
        ledger.mark_predicted(self.lanes)
        ended = ledger.record_step(
            self.lanes,
            self.rewards,
            self.terminated[self.step_count % EPISODE_STEPS],
            self.truncated,
            self.step_ns,
            self.predict_ns,
        )
        if len(ended):
            ids = ledger.episode_ids(ended)
            ledger.complete_episodes(ended, ids, now_ns=now_ns)
            ledger.take_model_ends(ids)
            ledger.start_episodes(ended, now_ns=now_ns)
        self.step_count += 1
        return len(ended)

    def expected_completions(self) -> int:
        """Episodes the staggered schedule has ended after ``step_count`` steps."""
        first_end = (EPISODE_STEPS - 1 - self.lanes) % EPISODE_STEPS
        ends = (self.step_count - 1 - first_end) // EPISODE_STEPS + 1
        return int(np.where(self.step_count > first_end, ends, 0).sum())


@pytest.mark.parametrize("num_lanes", LANE_COUNTS)
def test_ledger_step(benchmark, core, num_lanes):
    loop = LedgerStepLoop(core, num_lanes)
    for _ in range(EPISODE_STEPS):  # reach the steady state: every lane has restarted once
        loop.step()
    benchmark.group = f"ledger step, N={num_lanes}"
    benchmark(loop.step)
    assert loop.ledger.completed == loop.expected_completions() >= num_lanes
