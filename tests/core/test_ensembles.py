"""Temporal ensembling in the core (``TemporalEnsembles``, and the ``RoundRunner`` that owns
one): against ACT's formula written here, on both cores, and the same to the bit in both."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rlmesh._pycore.ensembles import TemporalEnsembles as PythonEnsembles
from rlmesh.adapters import compile_spec
from rlmesh.core import load_core
from rlmesh.errors import ModelOutputError


def raises(error: type[Exception], message: str):
    """pytest.raises matching the whole message exactly."""
    return pytest.raises(error, match="^" + re.escape(message) + "$")


def act_reference(chunks: list[np.ndarray], starts: list[int], step: int, m: float) -> np.ndarray:
    """ACT's temporal ensemble for one step: every chunk predicted at ``starts[j]`` that reaches
    ``step``, oldest first, weighted ``exp(-m * i)`` and normalised (written from the formula
    in ACT's evaluation loop, not from either core)."""
    covering = [
        chunk[step - start]
        for chunk, start in zip(chunks, starts, strict=True)
        if start <= step < start + len(chunk)
    ]
    weights = np.exp(-m * np.arange(len(covering)))
    weights = weights / weights.sum()
    return (np.stack(covering) * weights[:, None]).sum(axis=0)


class Episodes:
    """Random chunks for a few lanes whose episodes end at different steps and restart on the
    same lane: what each lane was given, to check what it executes."""

    def __init__(self, num_lanes: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_lanes = num_lanes

    def run(self, core, m: float, rounds: int, dtype=np.float32) -> tuple[list, list]:
        """Drive ``core.TemporalEnsembles`` for ``rounds`` steps; returns what it executed
        per (episode, step) and what ACT's formula gives for the same chunks."""
        ensembles = core.TemporalEnsembles(self.num_lanes, m)
        rng = np.random.default_rng(self.rng.integers(2**32))
        episode = list(range(self.num_lanes))  # each lane's running episode
        left = [int(rng.integers(2, 9)) for _ in range(self.num_lanes)]
        given: dict[int, tuple[list, list]] = {e: ([], []) for e in episode}
        step = dict.fromkeys(episode, 0)
        executed, expected = [], []
        next_episode = self.num_lanes
        for _ in range(rounds):
            horizon = int(rng.integers(1, 7))  # chunks differ in length from call to call
            chunks = rng.normal(size=(self.num_lanes, horizon, 3)).astype(dtype)
            lanes = np.arange(self.num_lanes)
            ensembles.push(lanes, episode, chunks)
            actions = ensembles.pop(lanes, episode)
            for lane in range(self.num_lanes):
                e = episode[lane]
                given[e][0].append(chunks[lane].astype(np.float64))
                given[e][1].append(step[e])
                executed.append(actions[lane])
                expected.append(act_reference(*given[e], step[e], m))
                step[e] += 1
                left[lane] -= 1
                if left[lane] == 0:  # the episode ends; the lane's next one starts afresh
                    reaching = sum(
                        start + len(chunk) > step[e] for chunk, start in zip(*given[e], strict=True)
                    )
                    assert ensembles.drop(e) == reaching  # the chunks still held
                    episode[lane] = next_episode
                    given[next_episode] = ([], [])
                    step[next_episode] = 0
                    left[lane] = int(rng.integers(2, 9))
                    next_episode += 1
        return executed, expected


@pytest.mark.parametrize("m", [0.0, 0.01, 0.7, 5.0])
def test_each_step_executes_acts_weighted_average_of_the_chunks_covering_it(core, m):
    executed, expected = Episodes(num_lanes=3, seed=1).run(core, m, rounds=40)
    for action, reference in zip(executed, expected, strict=True):
        assert action.dtype == np.float32
        np.testing.assert_allclose(action, reference.astype(np.float32), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_both_cores_execute_the_same_actions_to_the_bit(dtype):
    rust, python = load_core("rust"), load_core("python")
    for m in (0.0, 0.01, 1.3):
        from_rust, _ = Episodes(num_lanes=4, seed=7).run(rust, m, rounds=30, dtype=dtype)
        from_python, _ = Episodes(num_lanes=4, seed=7).run(python, m, rounds=30, dtype=dtype)
        assert (
            [a.dtype for a in from_rust]
            == [a.dtype for a in from_python]
            == [np.dtype(dtype)] * len(from_rust)
        )
        assert [a.tobytes() for a in from_rust] == [a.tobytes() for a in from_python]


def test_a_lanes_actions_do_not_depend_on_the_other_lanes(core):
    """The same episode's chunks on lane 0 alone, or on lane 2 beside two busy lanes."""
    rng = np.random.default_rng(3)
    chunks = [rng.normal(size=(4, 2)).astype(np.float32) for _ in range(6)]
    alone = core.TemporalEnsembles(1, 0.2)
    crowded = core.TemporalEnsembles(3, 0.2)
    for chunk in chunks:
        alone.push([0], [9], chunk[None])
        crowded.push([0, 1, 2], [4, 5, 9], np.stack([chunk * 0 + 7, chunk * 0 - 7, chunk]))
        assert alone.pop([0], [9])[0].tobytes() == crowded.pop([0, 1, 2], [4, 5, 9])[2].tobytes()


def test_dict_actions_are_averaged_leaf_by_leaf_in_their_dtypes(core):
    ensembles = core.TemporalEnsembles(2, 0.0)
    first = {"arm": np.ones((2, 3, 2), np.float32), "grip": np.zeros((2, 3), np.float64)}
    second = {"arm": 3 * np.ones((2, 3, 2), np.float32), "grip": np.ones((2, 3), np.float64)}
    ensembles.push([0, 1], [0, 1], first)
    ensembles.pop([0, 1], [0, 1])
    ensembles.push([0, 1], [0, 1], second)
    actions = ensembles.pop([0, 1], [0, 1])
    assert list(actions) == ["arm", "grip"]
    assert actions["arm"].dtype == np.float32 and actions["arm"].shape == (2, 2)
    assert actions["arm"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert actions["grip"].dtype == np.float64 and actions["grip"].tolist() == [0.5, 0.5]
    assert ensembles.held().tolist() == [2, 2]


def test_chunks_leave_once_they_end_and_a_dropped_episode_leaves_nothing(core):
    ensembles = core.TemporalEnsembles(2, 0.01)
    ensembles.push([0, 1], [0, 1], np.zeros((2, 2, 1), np.float32))  # covers steps 0..1
    ensembles.pop([0, 1], [0, 1])
    ensembles.push([0, 1], [0, 1], np.zeros((2, 1, 1), np.float32))  # covers step 1 only
    ensembles.pop([0, 1], [0, 1])
    assert ensembles.held().tolist() == [0, 0]  # both chunks ended at step 1
    ensembles.push([0], [0], np.zeros((1, 5, 1), np.float32))
    ensembles.pop([0], [0])
    assert ensembles.held([1, 0]).tolist() == [0, 1]
    assert ensembles.drop(0) == 1 and ensembles.drop(0) == 0
    ensembles.push([0], [2], np.ones((1, 1, 1), np.float32))  # lane 0's next episode
    assert ensembles.pop([0], [2]).tolist() == [[1.0]]
    assert repr(ensembles) == "TemporalEnsembles(num_lanes=2, m=0.01, held=0)"


def test_misuse_is_refused_with_the_same_messages(core):
    ensembles = core.TemporalEnsembles(2, 0.5)
    with raises(
        ValueError,
        "lane 0 holds chunks of episode None, not episode 1: push a chunk "
        "for the episode's step first, and drop an episode's chunks when it ends",
    ):
        ensembles.pop([0], [1])
    ensembles.push([0], [1], np.zeros((1, 2, 3)))
    with raises(
        ValueError,
        "lane 0 already has the chunk of step 0 of episode 1: pop its action before pushing again",
    ):
        ensembles.push([0], [1], np.zeros((1, 2, 3)))
    with raises(ValueError, "episode 1 already has chunks on lane 0: an episode lives on one lane"):
        ensembles.push([1], [1], np.zeros((1, 2, 3)))
    ensembles.pop([0], [1])
    with raises(
        ValueError,
        "lane 0 has no chunk for step 1 of episode 1: with temporal "
        "ensembling the model predicts at every step",
    ):
        ensembles.pop([0], [1])
    with raises(
        ValueError,
        "lane 0 holds chunks of episode 1, not episode 2: drop an episode's chunks when it ends",
    ):
        ensembles.push([0], [2], np.zeros((1, 2, 3)))
    with raises(
        ValueError,
        "action holds float64 actions of shape (4,) but earlier pushes "
        "held float64 actions of shape (3,)",
    ):
        ensembles.push([0], [1], np.zeros((1, 2, 4)))
    with raises(
        ModelOutputError,
        'action["b"] holds int64 actions: temporal ensembling '
        "averages actions, so every action leaf must hold floats (a Box space of "
        "floats)",
    ):
        core.TemporalEnsembles(1, 0.0).push(
            [0], [0], {"a": np.zeros((1, 2)), "b": np.zeros((1, 2), np.int64)}
        )
    with raises(ValueError, "lane 1 appears twice in lanes"):
        ensembles.push([1, 1], [3, 4], np.zeros((2, 2, 3)))
    for bad, message in [
        (-0.5, "m must be a finite number >= 0, got -0.5"),
        (float("inf"), "m must be a finite number >= 0, got inf"),
        ("0.1", "m must be a number >= 0, got str"),
        (True, "m must be a number >= 0, got bool"),
    ]:
        with raises(ValueError, message):
            core.TemporalEnsembles(1, bad)


def test_the_python_core_is_the_specification_the_rust_core_is_checked_against():
    """The Rust class is not the Python one under another name."""
    assert load_core("rust").TemporalEnsembles is not PythonEnsembles


# ---------------------------------------------------------------------------------- the runner


def test_a_runner_with_an_ensemble_executes_the_average_and_drops_it_at_the_episodes_end(core):
    import gymnasium as gym

    plan = compile_spec(None, gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-5, 5, (1,)))
    runner = core.RoundRunner(1, 2, plan.observation, plan.action, ensemble=0.0)
    with raises(
        ValueError,
        "ensemble and execution_horizon are two ways to execute chunks: a "
        "run averages every step's chunks (ensemble) or replays one chunk's actions "
        "(execution_horizon), not both",
    ):
        core.RoundRunner(1, 2, plan.observation, plan.action, ensemble=0.0, execution_horizon=2)
    starts = runner.start([0], now_ns=0)
    runner.set_observations(starts.lanes, [np.zeros(2, np.float32)])
    executed = []
    for step, value in enumerate([0.0, 2.0, 4.0]):
        running, predict_lanes, _ = runner.begin_round()
        assert running.tolist() == predict_lanes.tolist() == [0]  # predicts every step
        executed.append(runner.take_actions(np.full((1, 3, 1), value, np.float32), 1).item())
        assert runner.snapshot()["ensembled"] == [min(step + 1, 2)]  # step 0's chunk ends at 2
        ended, _ = runner.end_round([0.0], [step == 2], [False], 1, 1)
    # step 0: 0; step 1: mean(0, 2); step 2: mean(0, 2, 4)
    assert executed == [0.0, 1.0, 2.0]
    assert ended.tolist() == [0]
    runner.finish(ended, [None])
    assert runner.snapshot()["ensembled"] == [0] and runner.snapshot()["queued"] is None
