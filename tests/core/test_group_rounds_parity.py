"""Parity of rounds over groups of lanes (``begin_round(lanes)``, ``park_round``,
``resume_round``): the Rust core and the Python core, driven alike, agree in results, errors
and state.

The state machine of ``test_parity.py`` with pipelined rounds mixed into its calls: the running
lanes split into two groups, each group's round opened, its actions taken and the round parked
while "its envs step", then both resumed and ended in either order; now and then a key parked
twice, a key never parked, or a lane out of range, which both cores must refuse alike.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from test_parity import RustPythonRunnerParity, one_in


class GroupRoundParity(RustPythonRunnerParity):
    """Every call of the runner parity machine, and rounds over two groups at once."""

    def open_group(self, data, lanes: list[int], key: int) -> int:
        """Open a round over ``lanes``, take its actions, park it under ``key``; its size."""
        opened = self.both(lambda runner: runner.begin_round(lanes))
        if opened[0] != "returned":
            return -1
        running, predict_lanes = (len(opened[1][1][k][3]) for k in (0, 1))
        self.both(lambda runner: runner.take_actions(np.zeros(predict_lanes, np.int64), 7))
        if one_in(data, 10):
            self.both(lambda runner: runner.park_round(key))  # parked twice: refused
        self.both(lambda runner: runner.park_round(key))
        return running

    def end_group(self, data, key: int, running: int) -> None:
        if one_in(data, 10):
            self.both(lambda runner: runner.resume_round(key + 10))  # never parked: refused
        self.both(lambda runner: runner.resume_round(key))
        ends = st.lists(st.booleans(), min_size=running, max_size=running)
        terminated = np.array(data.draw(ends), dtype=np.bool_)
        now_ns = self.tick(data)
        self.both(
            lambda runner: runner.end_round(
                np.ones(running), terminated, terminated.copy(), 5, now_ns
            )
        )

    @precondition(lambda self: self.runners and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def pipelined_rounds(self, data):
        running = self.lanes_in("running")
        first = self.subset(data, running)
        if one_in(data, 8):
            first = [*first, self.spec.num_lanes]  # out of range: refused
        # The second group: the rest, or every lane (then the parked ones stay out of it).
        second = None if one_in(data, 4) else [lane for lane in running if lane not in first]
        sizes = {0: self.open_group(data, first, 0)}
        opened = self.both(lambda runner: runner.begin_round(second))
        count = len(opened[1][1][0][3])
        predict_lanes = len(opened[1][1][1][3])
        self.both(lambda runner: runner.take_actions(np.zeros(predict_lanes, np.int64), 9))
        self.both(lambda runner: runner.park_round(1))
        sizes[1] = count
        order = [0, 1] if data.draw(st.booleans()) else [1, 0]
        for key in order:
            if sizes[key] >= 0:
                self.end_group(data, key, sizes[key])


GroupRoundParity.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestGroupRoundParity = GroupRoundParity.TestCase


def test_a_parked_round_keeps_its_lanes_out_of_the_next_round(core):
    """What the pipelined driver relies on, on each core: a round over all running lanes
    opened while another is parked holds only the lanes that are not parked."""
    from test_parity import OBSERVATION, runner_of

    runner = runner_of(core, 4, 8)
    starts = runner.start([0, 1, 2, 3], now_ns=0)
    runner.set_observations(starts.lanes, [OBSERVATION] * 4)
    running, predict_lanes, _ = runner.begin_round([1, 3])
    assert running.tolist() == [1, 3] and predict_lanes.tolist() == [1, 3]
    runner.take_actions(np.zeros(2, np.int64), 0)
    runner.park_round(0)
    running, _, _ = runner.begin_round()
    assert running.tolist() == [0, 2]
    runner.take_actions(np.zeros(2, np.int64), 0)
    runner.end_round(np.ones(2), np.zeros(2, bool), np.zeros(2, bool), 0, 1)
    runner.resume_round(0)
    runner.end_round(np.ones(2), np.array([True, False]), np.zeros(2, bool), 0, 2)
    assert runner.rounds == 2
    assert runner.lane_episodes([0, 1, 2, 3])[2].tolist() == [1, 1, 1, 1]
