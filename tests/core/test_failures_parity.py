"""Parity of abandoning episodes (``RoundRunner.abandon``, ``run_rounds(failures=...)``): the
Rust core and the Python core, driven alike, agree in results, errors and state.

The state machine of ``test_parity.py`` with abandons mixed into its calls: between rounds and
inside an open round, slots given back and failures recorded, with wrong lanes and values now
and then, which both cores must refuse alike.
"""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from rlmesh.errors import EnvError, LaneFailures
from rlmesh.lanes import StepBatch
from rlmesh.model import ModelHandler
from test_parity import OBSERVATION, RustPythonRunnerParity, both_cores, one_in, runner_of

errors = st.one_of(st.none(), st.sampled_from(["RuntimeError: boom", "OSError: gone", ""]))


class AbandonParity(RustPythonRunnerParity):
    """Every call of the runner parity machine, and abandons."""

    def abandoning(self, data) -> tuple[list, list]:
        lanes = self.subset(data, self.lanes_in("running"), min_size=1)
        if one_in(data, 6):  # a lane that holds no running episode: refused
            lanes = [*lanes, *self.subset(data, self.lanes_in("vacant", "idle", "ended"))]
        lanes = self.maybe_intrude(data, lanes)
        outcomes = data.draw(st.lists(errors, min_size=len(lanes), max_size=len(lanes)))
        if one_in(data, 10):
            outcomes = [*outcomes, None]  # one too many
        if outcomes and one_in(data, 10):
            outcomes[0] = 3  # neither None nor a str
        return lanes, outcomes

    @precondition(lambda self: self.runners and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def abandon(self, data):
        lanes, outcomes = self.abandoning(data)
        now_ns = self.tick(data)
        self.both(lambda runner: runner.abandon(lanes, outcomes, now_ns=now_ns))

    @precondition(lambda self: self.runners and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def abandon_inside_a_round(self, data):
        """A round whose step failed on some lanes: they leave it, the rest are recorded."""
        opened = self.both(lambda runner: runner.begin_round())
        predict_lanes = len(opened[1][1][1][3])
        self.both(lambda runner: runner.take_actions(np.zeros(predict_lanes, np.int64), 10))
        lanes, outcomes = self.abandoning(data)
        now_ns = self.tick(data)
        self.both(lambda runner: runner.abandon(lanes, outcomes, now_ns=now_ns))
        left = len(self.lanes_in("running"))
        ends = st.lists(st.booleans(), min_size=left, max_size=left)
        terminated = np.array(data.draw(ends), dtype=np.bool_)
        rewards = np.ones(left)
        now_ns = self.tick(data)
        self.both(
            lambda runner: runner.end_round(rewards, terminated, terminated.copy(), 5, now_ns)
        )
        started = self.both(lambda runner: runner.start(self.lanes_in("vacant"), now_ns=now_ns))
        self.observe_first(started)


AbandonParity.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestAbandonParity = AbandonParity.TestCase


def handler():
    """The run's model handler for ``action 0`` on every lane, loaded."""
    model = ModelHandler(lambda observation: 0)
    asyncio.run(model.load())
    return model


def four_lanes_running(core):
    """A runner of 4 lanes and 6 episodes, an episode started on each lane, and the three
    ``LatencyStats`` ``run_rounds`` records into."""
    runner = runner_of(core, 4, 6)
    starts = runner.start(np.arange(4), now_ns=0)
    runner.set_observations(starts.lanes, [OBSERVATION] * 4)
    return runner, [core.LatencyStats() for _ in range(3)]


def test_run_rounds_hands_env_failures_back_alike_in_both_cores():
    def step_of(lane):
        def step(action):
            if lane in (1, 3):
                raise RuntimeError(f"lane {lane} broke")
            return OBSERVATION, 1.0, False, False, {}

        return step

    outcomes = []
    for core in both_cores():
        runner, stats = four_lanes_running(core)
        failures: dict[int, str] = {}
        ended, _, rounds, lane_steps = runner.run_rounds(
            handler(),
            [step_of(lane) for lane in range(4)],
            "Broken",
            until_ns=2**62,
            stats=stats,
            failures=failures,
        )
        assert (ended.tolist(), rounds, lane_steps) == ([], 1, 2)  # it returned after the round
        assert failures == {1: "RuntimeError: lane 1 broke", 3: "RuntimeError: lane 3 broke"}
        # The failed lanes' episodes are still running, their steps not recorded.
        assert [lane["steps"] for lane in runner.snapshot()["lanes"]] == [1, 0, 1, 0]
        summaries, ids, owed = runner.abandon(
            [1, 3], [None, "RuntimeError: lane 3 broke"], now_ns=9
        )
        assert [(s.index, s.steps, s.error) for s in summaries] == [
            (3, 0, "RuntimeError: lane 3 broke")
        ]
        assert (ids.tolist(), owed.tolist()) == ([1, 3], [1, 3])  # the model predicted on both
        again = runner.start([1, 3], now_ns=10)
        assert again.indices.tolist() == [1, 4]  # slot 1 again, then the next new one
        outcomes.append((runner.snapshot(), [s.to_dict() for s in summaries]))
        # Without failures=, a failing step raises as before.
        runner.set_observations(again.lanes, [OBSERVATION] * 2)
        try:
            runner.run_rounds(
                handler(), [step_of(lane) for lane in range(4)], "Broken", until_ns=0, stats=stats
            )
        except EnvError as err:
            assert str(err) == "lane 1 (Broken): step() raised RuntimeError: lane 1 broke"
        else:
            raise AssertionError("run_rounds did not raise")
    assert outcomes[0] == outcomes[1]


def whole_step(
    broken: tuple[int, ...], stepped: list[int] | None = None, observations: int | None = None
):
    """One call stepping every lane asked for, as process and remote lanes' ``step`` does: the
    lanes in ``broken`` fail (``LaneFailures``, the other lanes' batch its outcome);
    ``stepped``, when given, is what the batch claims moved instead, and ``observations`` how
    many it holds."""

    def step(lanes, actions):
        assert actions.shape == (len(lanes),)  # the batch of actions, not one per lane
        kept = [lane for lane in lanes.tolist() if lane not in broken]
        moved = np.array(kept if stepped is None else stepped, dtype=np.int64)
        count = len(moved)
        flags = np.zeros(count, dtype=np.bool_)
        shown = count if observations is None else observations
        batch = StepBatch(
            moved, [OBSERVATION] * shown, np.ones(count), flags, flags.copy(), [{}] * count
        )
        if broken:
            errors = {lane: f"RuntimeError: lane {lane} broke" for lane in broken}
            raise LaneFailures("lanes broke", errors=errors, outcome=batch)
        return batch

    return step


def test_run_rounds_stepping_every_lane_in_one_call_hands_failures_back_alike_in_both_cores():
    outcomes = []
    for core in both_cores():
        runner, stats = four_lanes_running(core)
        failures: dict[int, str] = {}
        ended, _, rounds, lane_steps = runner.run_rounds(
            handler(), whole_step((1, 3)), "Broken", until_ns=2**62, stats=stats,
            failures=failures,
        )  # fmt: skip
        assert (ended.tolist(), rounds, lane_steps) == ([], 1, 2)  # it returned after the round
        assert failures == {1: "RuntimeError: lane 1 broke", 3: "RuntimeError: lane 3 broke"}
        assert [lane["steps"] for lane in runner.snapshot()["lanes"]] == [1, 0, 1, 0]
        assert stats[1].count == 2  # the step's time shared by the two lanes that moved
        outcomes.append(runner.snapshot())
    assert outcomes[0] == outcomes[1]


def test_one_call_stepping_every_lane_raises_as_a_lane_s_step_would_in_both_cores():
    def foreign(lanes, actions):
        raise OSError("the simulator is gone")

    raised = []
    for core in both_cores():
        for step, failures in ((whole_step((1,)), None), (foreign, {}), (foreign, None)):
            runner, stats = four_lanes_running(core)
            try:
                runner.run_rounds(
                    handler(), step, "Broken", until_ns=2**62, stats=stats, failures=failures
                )
            except EnvError as err:
                raised.append((type(err).__name__, str(err), type(err.__cause__).__name__))
            else:
                raise AssertionError("run_rounds did not raise")
            assert failures in (None, {})  # nothing was taken as a lane's failure
    # A LaneFailures in a run that takes none is raised as it is; a foreign error names the env.
    gone = ("EnvError", "Broken: step() raised OSError: the simulator is gone", "OSError")
    assert raised == [("LaneFailures", "lanes broke", "NoneType"), gone, gone] * 2


def test_run_rounds_refuses_one_call_that_moved_other_lanes_alike_in_both_cores():
    cases = {
        "a lane neither stepped nor failed": whole_step((), stepped=[0, 2]),
        "a lane not asked for": whole_step((), stepped=[0, 1, 2, 3, 4]),
        "an observation short": whole_step((), observations=3),
    }
    for name, step in cases.items():
        messages = []
        for core in both_cores():
            runner, stats = four_lanes_running(core)
            try:
                runner.run_rounds(
                    handler(), step, "Broken", until_ns=2**62, stats=stats, failures={}
                )
            except ValueError as err:
                messages.append(str(err))
            else:
                raise AssertionError(f"{name}: run_rounds did not raise")
            # Nothing of the refused round was recorded.
            assert [lane["steps"] for lane in runner.snapshot()["lanes"]] == [0] * 4, name
        assert messages[0] == messages[1], name
        assert "the lanes' step" in messages[0], name


def test_an_episode_abandoned_before_its_first_step_has_zero_means_in_both_cores():
    for core in both_cores():
        runner = runner_of(core, 1, 1)
        runner.start([0], now_ns=0)
        (summary,), _, _ = runner.abandon([0], ["OSError: reset"], now_ns=3_000_000_000)
        assert (summary.steps, summary.predict_ms, summary.step_ms) == (0, 0.0, 0.0)
        assert (summary.duration_s, runner.done) == (3.0, True)
