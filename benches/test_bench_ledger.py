"""The ledger's per-step traffic, through the runner that owns it: one round of N lanes.

One round = ``begin_round`` (every lane predicts: the payload of N ``Box(1,)`` observations),
``take_actions`` (N ``Discrete(2)`` actions), ``end_round`` (the ledger records N steps), then,
for the lanes whose episode ended, ``finish`` (summaries, model ends) and ``start`` with their
first observations. The spaces are the smallest there are, so the round is mostly the ledger's
bookkeeping. Episodes last 64 steps and are staggered across lanes, so about N/64 lanes end
every round, as on a long evaluation of a CartPole-length task.

Run: ``pytest benches/test_bench_ledger.py --benchmark-enable``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rlmesh.adapters import compile_spec

EPISODE_STEPS = 64
LANE_COUNTS = (1, 16, 256, 4096)
PLAN = compile_spec(None, gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2))


class LedgerStepLoop:
    """Drives one runner with N lanes through staggered 64-step episodes."""

    def __init__(self, core, num_lanes: int) -> None:
        self.runner = core.RoundRunner(num_lanes, 10**12, PLAN.observation, PLAN.action)
        self.lanes = np.arange(num_lanes, dtype=np.int64)
        self.observation = np.zeros(1, np.float32)
        self.observations = [self.observation] * num_lanes
        self.output = np.zeros(num_lanes, dtype=np.int64)
        self.rewards = np.ones(num_lanes)
        self.truncated = np.zeros(num_lanes, dtype=bool)
        # Lane i ends on the rounds where (round + i) % 64 == 63.
        self.terminated = [
            (np.arange(num_lanes) + phase) % EPISODE_STEPS == EPISODE_STEPS - 1
            for phase in range(EPISODE_STEPS)
        ]
        self.step_count = 0
        self.completed = 0
        self.runner.start(self.lanes, now_ns=0)
        self.runner.set_observations(self.lanes, self.observations)

    def step(self) -> int:
        runner = self.runner
        now_ns = self.step_count * 25_000
        runner.begin_round()
        runner.take_actions(self.output, 5_000)
        terminated = self.terminated[self.step_count % EPISODE_STEPS]
        ended, _ = runner.end_round(self.rewards, terminated, self.truncated, 20_000, now_ns)
        if len(ended):
            summaries, _, _ = runner.finish(ended, [None] * len(ended))
            self.completed += len(summaries)
            runner.start(ended, now_ns=now_ns)
            runner.set_observations(ended, self.observations[: len(ended)])
        self.step_count += 1
        return len(ended)

    def expected_completions(self) -> int:
        """Episodes the staggered schedule has ended after ``step_count`` rounds."""
        first_end = (EPISODE_STEPS - 1 - self.lanes) % EPISODE_STEPS
        ends = (self.step_count - 1 - first_end) // EPISODE_STEPS + 1
        return int(np.where(self.step_count > first_end, ends, 0).sum())


@pytest.mark.parametrize("num_lanes", LANE_COUNTS)
def test_ledger_step(benchmark, core, num_lanes):
    loop = LedgerStepLoop(core, num_lanes)
    for _ in range(EPISODE_STEPS):  # reach the steady state: every lane has restarted once
        loop.step()
    benchmark.group = f"ledger step (runner round), N={num_lanes}"
    benchmark(loop.step)
    assert loop.completed == loop.expected_completions() >= num_lanes
    assert loop.runner.snapshot()["completed"] == loop.completed
