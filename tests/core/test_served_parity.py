"""The two cores' ``ServedSteps`` and ``ServedEpisodes`` (a served env's steps and episode
tallies) agree, call for call.

``ServedSteps`` is driven over small scripted envs whose step results cover what envs return
(float32 and float64 observations, lists, views, 0-d arrays, images, NaN, values outside a
``Discrete``; rewards and flags as Python and numpy scalars; a raising env, a short tuple).
Both cores must give the same leaves, rewards, masks and infos, deliver the same actions, or
raise the same error. The Rust core writes conforming arrays' bytes itself: a counter on
``encode`` checks that it does, and that everything else still goes through ``encode``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmesh.core import load_core
from rlmesh.errors import EnvError
from rlmesh.remote.codec import SpaceCodec
from rlmesh.remote.env_server import NO_PLAIN_RULE, ValueChecks
from rlmesh.spaces import leaf_shape

CORES = {"python": load_core("python"), "rust": load_core("rust")}


class Scripted(gym.Env):
    """Returns its script's step results in turn (an exception in the script is raised)."""

    def __init__(self, observation_space: gym.Space, script: list[Any]) -> None:
        self.observation_space = observation_space
        self.action_space = gym.spaces.Discrete(3)
        self.script = list(script)
        self.actions: list[Any] = []

    def step(self, action: Any) -> Any:
        self.actions.append(action)
        result = self.script.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


class Encoder:
    """The observation leaves as the server encodes them, counting its calls."""

    def __init__(self, space: gym.Space) -> None:
        self.codec = SpaceCodec(space)
        self.checks = ValueChecks(space, "observation")
        self.calls = 0

    def __call__(self, observations: list[Any], lanes: np.ndarray) -> list[bytes]:
        self.calls += 1
        batch = np.asarray(observations)
        problem = self.checks.first_failure(batch)
        if problem is not None:
            raise ValueError(f"lane {int(lanes[problem[0]])}: {problem[1]}")
        return self.codec.encode_leaves(batch, len(lanes))


def layout(space: gym.Space) -> tuple[Any, tuple[int, ...], Any] | None:
    rule = ValueChecks(space, "observation").plain_rule
    return None if rule is NO_PLAIN_RULE else (space.dtype, leaf_shape(space), rule)


def outcome(core: Any, space: gym.Space, scripts: list[list[Any]], rounds: int) -> Any:
    """What ``rounds`` steps of every lane gave on ``core``: results or the error, the
    actions each env saw, and how often ``encode`` ran."""
    envs = [Scripted(space, script) for script in scripts]
    encode = Encoder(space)
    steps = core.ServedSteps([env.step for env in envs], "scripted", encode, layout(space))
    lanes = np.arange(len(envs), dtype=np.int64)
    results = []
    try:
        for k in range(rounds):
            leaves, rewards, terminated, truncated, infos = steps.step(lanes, (lanes + k) % 3)
            results.append((leaves, rewards, [type(r) for r in rewards], terminated, truncated))
            results.append(infos)
    except Exception as err:  # the same error on both cores, whatever it is
        cause = err.__cause__
        results.append(("raise", type(err), str(err), type(cause), str(cause)))
    seen = [[(type(a), int(a)) for a in env.actions] for env in envs]
    return results, seen, encode.calls


BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
F32 = np.float32


def steps_of(observations: list[Any], **fields: Any) -> list[Any]:
    reward, terminated, truncated, info = (
        fields.get("reward", 1.0),
        fields.get("terminated", False),
        fields.get("truncated", False),
        fields.get("info", {}),
    )
    return [(obs, reward, terminated, truncated, info) for obs in observations]


CASES = {
    # name: (space, per-lane scripts, rounds, the Rust core's encode calls)
    "float32 arrays": (
        BOX,
        [
            steps_of([np.full(4, 0.25 * k, F32) for k in range(3)]),
            steps_of([np.full(4, -0.5, F32)] * 2 + [np.ones(4, F32)], info={"x": 1}),
        ],
        3,
        0,
    ),
    "numpy and plain scalars": (
        BOX,
        [
            [(np.zeros(4, F32), np.float32(0.5), np.bool_(True), 0, {})],
            [(np.ones(4, F32), 2, 1, np.bool_(False), {})],
            [(np.ones(4, F32), True, False, 1.0, {})],
        ],
        1,
        0,
    ),
    "float64 for a float32 space": (BOX, [steps_of([np.zeros(4), np.ones(4)])], 2, 2),
    "a list": (BOX, [steps_of([[0.0, 0.1, 0.2, 0.3]])], 1, 1),
    "a strided view": (BOX, [steps_of([np.arange(8, dtype=F32)[::2] / 8])], 1, 0),
    "a NaN": (BOX, [steps_of([np.array([0, np.nan, 0, 0], F32)])], 1, 1),
    "a float16 NaN": (
        gym.spaces.Box(-1, 1, (2,), np.float16),
        [steps_of([np.array([0, 0.5], np.float16), np.array([np.nan, 0], np.float16)])],
        2,
        1,
    ),
    "discrete 0-d arrays": (
        gym.spaces.Discrete(5, start=-2),
        [steps_of([np.array(-2), np.array(2)]), steps_of([np.array(0), np.int64(1)])],
        2,
        1,
    ),
    "a discrete value out of range": (
        gym.spaces.Discrete(5, start=-2),
        [steps_of([np.array(3)])],
        1,
        1,
    ),
    "images": (
        gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
        [steps_of([np.full((2, 2, 3), k, np.uint8) for k in (0, 255)])] * 2,
        2,
        0,
    ),
    "multi-binary": (
        gym.spaces.MultiBinary(3),
        [steps_of([np.array([0, 1, 1], np.int8), np.array([0, 2, 1], np.int8)])],
        2,
        1,
    ),
    "multi-discrete": (
        gym.spaces.MultiDiscrete([2, 3]),
        [steps_of([np.array([1, 2]), np.array([1, 3])])],
        2,
        2,
    ),
    "a dict space": (
        gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": BOX}),
        [steps_of([{"a": np.int64(1), "b": np.zeros(4, F32)}])],
        1,
        1,
    ),
    "an env that raises on lane 1": (
        BOX,
        [steps_of([np.zeros(4, F32)] * 2), [RuntimeError("boom")], steps_of([np.zeros(4, F32)])],
        1,
        0,
    ),
    "a short step tuple": (BOX, [[(np.zeros(4, F32), 1.0, False, {})]], 1, 0),
    "a reward that is an array": (BOX, [steps_of([np.zeros(4, F32)], reward=np.ones(1))], 1, 0),
    "ended episodes": (
        BOX,
        [
            steps_of([np.zeros(4, F32)], terminated=True, info={"final": [1, 2]}),
            steps_of([np.zeros(4, F32)], truncated=np.bool_(True)),
        ],
        1,
        0,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_served_steps_agree_on_both_cores(name):
    space, scripts, rounds, rust_encodes = CASES[name]
    python = outcome(CORES["python"], space, scripts, rounds)
    rust = outcome(CORES["rust"], space, scripts, rounds)
    assert rust[:2] == python[:2]
    assert rust[2] == rust_encodes  # the Rust core wrote every conforming array itself


def test_a_raising_env_is_named_with_its_lane_and_stops_the_step():
    for core in CORES.values():
        results, seen, _ = outcome(core, BOX, CASES["an env that raises on lane 1"][1], 1)
        _, kind, message, cause, cause_text = results[-1]
        assert kind is EnvError and cause is RuntimeError and cause_text == "boom"
        assert message == "lane 1 (scripted): step() raised RuntimeError: boom"
        assert [len(actions) for actions in seen] == [1, 1, 0]  # lane 2 never stepped


def test_the_leaves_are_the_encoders_bytes():
    encode = Encoder(BOX)
    observations = [np.full(4, 0.5, F32), np.arange(4, dtype=F32) / 4]
    envs = [Scripted(BOX, steps_of([obs])) for obs in observations]
    steps = CORES["rust"].ServedSteps([env.step for env in envs], "scripted", encode, layout(BOX))
    leaves, rewards, terminated, truncated, infos = steps.step(np.array([1, 0]), np.array([2, 0]))
    assert encode.calls == 0  # the Rust core wrote them
    assert leaves == encode(observations[::-1], np.array([1, 0]))
    assert rewards == [1.0, 1.0] and terminated == truncated == b"\x00\x00"
    assert infos == [{}, {}]
    assert [env.actions for env in envs] == [[0], [2]]  # lane k got its row of the batch


@pytest.mark.parametrize("core", list(CORES))
def test_a_malformed_check_is_refused(core):
    with pytest.raises(ValueError, match=r'must be None, "nan" or \(low, high\), got range'):
        CORES[core].ServedSteps([], "x", Encoder(BOX), (np.float32, (4,), "range"))


# ------------------------------------------------------------------------------ episodes

LANES = 4
lanes = st.lists(st.integers(-1, LANES), max_size=5).map(lambda x: np.array(x, np.int64))
calls = st.one_of(
    st.tuples(st.just("start"), lanes),
    st.tuples(st.just("not_running"), lanes),
    st.tuples(
        st.just("add"),
        lanes,
        st.lists(st.floats(-10, 10, allow_nan=False), max_size=5),
    ),
    st.tuples(st.just("finish"), st.integers(-1, LANES)),
    st.tuples(st.just("running_lanes")),
    st.tuples(st.just("stop")),
)


def play(core: Any, sequence: list[tuple[Any, ...]]) -> list[Any]:
    episodes = core.ServedEpisodes(LANES)
    out = []
    for name, *args in sequence:
        try:
            value = getattr(episodes, name)(*args)
        except Exception as err:  # the same error on both cores, whatever it is
            out.append(("raise", type(err), str(err)))
        else:
            out.append(("ok", value))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(calls, max_size=30))
def test_served_episodes_agree_on_both_cores(sequence):
    assert play(CORES["rust"], sequence) == play(CORES["python"], sequence)


def test_served_episodes_tally_steps_and_returns():
    for core in CORES.values():
        episodes = core.ServedEpisodes(3)
        episodes.start(np.array([0, 2]))
        assert episodes.not_running(np.array([2, 1, 0])) == [1]
        episodes.add(np.array([2, 0]), [0.5, 1.0])
        episodes.add(np.array([2]), [0.25])
        assert episodes.finish(2) == (2, 0.75) and episodes.running_lanes() == [0]
        episodes.start(np.array([2]))
        assert episodes.finish(2) == (0, 0.0)
        episodes.stop()
        assert episodes.running_lanes() == []


def test_lanes_given_as_a_list_step_alike():
    for core in CORES.values():
        envs = [Scripted(BOX, steps_of([np.full(4, 0.5, F32)])) for _ in range(2)]
        steps = core.ServedSteps([env.step for env in envs], "scripted", Encoder(BOX), None)
        leaves, rewards, *_ = steps.step([1], np.array([2]))
        assert leaves == [np.full((1, 4), 0.5, F32).tobytes()] and rewards == [1.0]
        assert [env.actions for env in envs] == [[], [2]]


def test_a_dict_batch_of_actions_reaches_each_lane_as_its_dict():
    seen, errors = [], []
    for core in CORES.values():
        envs = [Scripted(BOX, steps_of([np.zeros(4, F32)])) for _ in range(2)]
        steps = core.ServedSteps([env.step for env in envs], "scripted", Encoder(BOX), None)
        batch = {"a": np.array([1, 2]), "b": np.array([[0.5], [1.5]], np.float32)}
        steps.step(np.array([0, 1]), batch)
        seen.append([(env.actions[0]["a"].item(), env.actions[0]["b"].tolist()) for env in envs])
        with pytest.raises(ValueError) as caught:
            steps.step(np.array([0, 1]), {"a": np.array([1])})
        errors.append(str(caught.value))
    assert seen[0] == seen[1] == [(1, [0.5]), (2, [1.5])]
    assert errors[0] == errors[1] and 'actions["a"]' in errors[0] and "(2)" in errors[0]
