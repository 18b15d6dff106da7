"""rlmesh.lanes: every form of ``env=``, every refusal, and both lane implementations.

``InProcessLanes`` are checked against plain Gymnasium envs driven by hand, ``VectorEnvLanes``
against the same ``SyncVectorEnv`` driven by hand, in each autoreset mode; then the optional
members of the protocol, read through their accessors with their defaults.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from rlmesh.errors import EnvError, RlmeshError
from rlmesh.lanes import (
    InProcessLanes,
    Lanes,
    VectorEnvLanes,
    lanes_accepts_trial_index,
    lanes_autoreset,
    lanes_core_calls_step,
    lanes_pipelined,
    lanes_render_fps,
    lanes_rendering,
    lanes_round_step,
    make_lanes,
)


class RecordingEnv(gym.Env):
    """Ends after ``length`` steps; records every reset's seed and options and every action.

    The observation is ``[start, steps]``: ``start`` is drawn from the seeded generator at
    reset, so equal seeds give equal starts. Declares the trial-index reset option.
    """

    metadata = {"rlmesh.trial_index": True}  # noqa: RUF012 (Gymnasium's convention)
    observation_space = Box(-np.inf, np.inf, (2,), np.float64)
    action_space = Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, length: int = 3, tag: str = "") -> None:
        self.length = length
        self.tag = tag
        self.resets: list[tuple[int | None, dict | None]] = []
        self.actions: list[np.ndarray] = []
        self.closed = 0
        self._start = 0.0
        self._steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets.append((seed, options))
        self._start = float(self.np_random.uniform())
        self._steps = 0
        return self._observation(), {"start": self._start}

    def step(self, action):
        self.actions.append(np.array(action))
        self._steps += 1
        info = {"steps": self._steps, "tag": self.tag}
        return self._observation(), float(action[0]), self._steps >= self.length, False, info

    def close(self):
        self.closed += 1

    def _observation(self) -> np.ndarray:
        return np.array([self._start, self._steps], dtype=np.float64)


class UndeclaredEnv(RecordingEnv):
    metadata = {}  # noqa: RUF012


class LooselyDeclaredEnv(RecordingEnv):
    metadata = {"rlmesh.trial_index": "yes"}  # noqa: RUF012 (only True declares it)


class DictEnv(gym.Env):
    """A Dict observation and a Dict action; the info echoes the action it got."""

    observation_space = Dict({"pos": Box(-100.0, 100.0, (2,), np.float64), "count": Discrete(1000)})
    action_space = Dict({"move": Box(-1.0, 1.0, (2,), np.float32), "grip": Discrete(2)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-1.0, 1.0, 2)
        self._count = 0
        return self._observation(), {}

    def step(self, action):
        self._pos = self._pos + action["move"]
        self._count += 1
        info = {"grip": int(action["grip"]), "move": np.array(action["move"])}
        return self._observation(), float(action["grip"]), self._count >= 5, False, info

    def _observation(self):
        return {"pos": self._pos.copy(), "count": self._count}


class FailingEnv(RecordingEnv):
    def step(self, action):
        raise RuntimeError("the simulator crashed")


def lanes_of(lanes: Lanes) -> list:
    """The envs behind InProcessLanes, to look at what each received."""
    return lanes._envs  # type: ignore[attr-defined]


def all_lanes(lanes: Lanes) -> np.ndarray:
    return np.arange(lanes.num_lanes)


# ---------------------------------------------------------------- what env= may be


def test_an_id_builds_num_envs_independent_lanes():
    lanes = make_lanes("CartPole-v1", num_envs=3)
    assert isinstance(lanes, InProcessLanes)
    assert isinstance(lanes, Lanes)  # the protocol the driver steps
    assert (lanes.num_lanes, lanes.lockstep, lanes.resets_itself) == (3, False, False)
    assert lanes.name == "CartPole-v1" and len(lanes.env_steps) == 3
    assert lanes.single_observation_space == gym.make("CartPole-v1").observation_space
    assert lanes.single_action_space == Discrete(2)
    assert lanes.accepts_trial_index is False
    assert lanes.env_episode_ids() is None
    assert len({id(env) for env in lanes_of(lanes)}) == 3
    assert make_lanes("CartPole-v1").num_lanes == 1


def test_env_kwargs_reach_gymnasium_make():
    lanes = make_lanes("Pendulum-v1", num_envs=2, env_kwargs={"g": 2.0})
    reference = gym.make("Pendulum-v1", g=2.0)
    observations, _ = lanes.reset(np.array([1]), seeds=[4], trials=[None])
    expected, _ = reference.reset(seed=4)
    np.testing.assert_array_equal(observations[0], expected)
    action = np.array([[0.5]], dtype=np.float32)
    batch = lanes.step(np.array([1]), action)
    expected = reference.step(action[0])
    np.testing.assert_array_equal(batch.observations[0], expected[0])
    assert batch.rewards.tolist() == [expected[1]]
    # With the default g the same step goes elsewhere: the keyword really arrived.
    default = gym.make("Pendulum-v1")
    default.reset(seed=4)
    assert not np.array_equal(default.step(action[0])[0], expected[0])


def test_an_env_instance_is_one_lane_driven_in_place():
    env = RecordingEnv()
    lanes = make_lanes(env)
    assert isinstance(lanes, InProcessLanes) and lanes.num_lanes == 1
    assert make_lanes(env, num_envs=1).num_lanes == 1
    lanes.reset(np.array([0]), seeds=[3], trials=[None])
    lanes.step(np.array([0]), np.array([[0.25]], dtype=np.float32))
    assert env.resets == [(3, None)]
    assert [action.tolist() for action in env.actions] == [[0.25]]


def test_a_factory_is_called_once_per_lane():
    made = []

    def factory():
        made.append(RecordingEnv(tag=str(len(made))))
        return made[-1]

    lanes = make_lanes(factory, num_envs=3)
    assert lanes_of(lanes) == made and len(made) == 3
    assert make_lanes(RecordingEnv).num_lanes == 1  # a class is a zero-argument factory too


def test_a_vector_env_becomes_vector_lanes():
    vector = SyncVectorEnv([RecordingEnv] * 3)
    lanes = make_lanes(vector, num_envs=3)
    assert isinstance(lanes, VectorEnvLanes)
    assert isinstance(lanes, Lanes)
    assert (lanes.num_lanes, lanes.lockstep, lanes.resets_itself) == (3, True, True)
    assert lanes.autoreset == "next_step" and lanes.env_steps is None
    assert lanes.single_observation_space == RecordingEnv.observation_space
    assert lanes.single_action_space == RecordingEnv.action_space
    assert lanes.accepts_trial_index is True
    assert make_lanes(vector).num_lanes == 3


@pytest.mark.parametrize(
    ("env", "options", "error", "message"),
    [
        ("NoSuchEnv-v0", {}, EnvError, r"gymnasium.make\('NoSuchEnv-v0'\).*registered"),
        ("CartPole-v1", {"env_kwargs": {"gravity": 1}}, EnvError, r"TypeError.*gravity"),
        ("CartPole-v1", {"num_envs": 0}, ValueError, "num_envs must be a positive integer, got 0"),
        (RecordingEnv(), {"num_envs": 2}, ValueError, "one lane.*id or a zero-argument factory"),
        (RecordingEnv, {"env_kwargs": {"length": 2}}, ValueError, "env_kwargs.*Gymnasium id"),
        (lambda: 42, {}, TypeError, r"returned int for lane 0.*build a gymnasium.Env"),
        (lambda length: RecordingEnv(length), {}, EnvError, "no arguments"),
        (42, {}, TypeError, r"env= must be a Gymnasium id \(str\), a gymnasium.Env.*got int"),
        (SyncVectorEnv([RecordingEnv] * 2), {"num_envs": 3}, ValueError, "num_envs=2.*3"),
    ],
    ids=[
        "unknown-id",
        "bad-kwarg",
        "zero-lanes",
        "instance-many",
        "kwargs-no-id",
        "factory-not-env",
        "factory-args",
        "not-an-env",
        "vector-count",
    ],
)
def test_refusals_say_what_was_expected(env, options, error, message):
    with pytest.raises(error, match=message):
        make_lanes(env, **options)


def test_env_error_is_an_rlmesh_error_chaining_the_cause():
    with pytest.raises(RlmeshError) as caught:
        make_lanes("NoSuchEnv-v0")
    assert isinstance(caught.value.__cause__, gym.error.Error)


def test_a_factory_that_fails_closes_the_lanes_already_built():
    made = []

    def factory():
        if made:
            raise OSError("no more simulators")
        made.append(RecordingEnv())
        return made[-1]

    with pytest.raises(EnvError, match="building lane 1: no more simulators"):
        make_lanes(factory, num_envs=2)
    assert made[0].closed == 1


def test_a_factory_returning_one_env_twice_is_refused():
    env = RecordingEnv()
    with pytest.raises(ValueError, match="same env object for lanes 0 and 1"):
        make_lanes(lambda: env, num_envs=2)


def test_lanes_with_different_spaces_are_refused():
    envs = iter([RecordingEnv(), DictEnv()])
    with pytest.raises(EnvError, match=r"lane 1 .*share lane 0's spaces"):
        make_lanes(lambda: next(envs), num_envs=2)


# ---------------------------------------------------------------- InProcessLanes


def test_seeds_reach_the_lanes_in_the_order_given():
    lanes = make_lanes("CartPole-v1", num_envs=3)
    observations, infos = lanes.reset(np.array([2, 0]), seeds=[5, 7], trials=[None, None])
    reference = gym.make("CartPole-v1")
    for observation, seed in zip(observations, [5, 7], strict=True):
        np.testing.assert_array_equal(observation, reference.reset(seed=seed)[0])
    assert infos == [{}, {}]
    assert lanes_of(lanes)[1].unwrapped.state is None  # lane 1 was never reset


def test_stepping_a_subset_leaves_the_other_lanes_where_they_were():
    lanes = make_lanes("CartPole-v1", num_envs=2)
    lanes.reset(np.array([0, 1]), seeds=[3, 3], trials=[None, None])
    reference = gym.make("CartPole-v1")
    reference.reset(seed=3)
    actions = [1, 0, 1, 1]
    expected = [reference.step(action) for action in actions]
    # Lane 0 runs ahead alone; lane 1 then plays the same actions from where it was left.
    for action, (observation, reward, *_) in zip(actions, expected, strict=True):
        batch = lanes.step(np.array([0]), np.array([action]))
        np.testing.assert_array_equal(batch.observations[0], observation)
        assert batch.rewards.tolist() == [reward]
    for action, (observation, *_) in zip(actions, expected, strict=True):
        batch = lanes.step(np.array([1]), np.array([action]))
        np.testing.assert_array_equal(batch.observations[0], observation)


def test_box_actions_are_split_by_lane_and_results_come_back_in_lane_order():
    lanes = make_lanes("Pendulum-v1", num_envs=3)
    lanes.reset(all_lanes(lanes), seeds=[0, 1, 2], trials=[None] * 3)
    references = [gym.make("Pendulum-v1") for _ in range(3)]
    for seed, reference in enumerate(references):
        reference.reset(seed=seed)
    actions = np.array([[1.5], [-0.5]], dtype=np.float32)
    batch = lanes.step(np.array([2, 0]), actions)
    expected = [references[2].step(actions[0]), references[0].step(actions[1])]
    for k, (observation, reward, term, trunc, _) in enumerate(expected):
        np.testing.assert_array_equal(batch.observations[k], observation)
        assert (batch.rewards[k], batch.terminated[k], batch.truncated[k]) == (
            reward,
            term,
            trunc,
        )
    assert batch.rewards.dtype == np.float64 and batch.rewards.shape == (2,)
    assert batch.terminated.dtype == np.bool_ and batch.truncated.dtype == np.bool_
    assert batch.final_observations is None and batch.reset_lanes is None
    assert batch.reset_infos is None


def test_dict_actions_are_split_leaf_by_leaf():
    lanes = make_lanes(DictEnv, num_envs=2)
    observations, _ = lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    assert set(observations[0]) == {"pos", "count"}
    actions = {
        "move": np.array([[0.5, 0.25], [-1.0, 1.0]], dtype=np.float32),
        "grip": np.array([1, 0]),
    }
    batch = lanes.step(np.array([1, 0]), actions)
    assert [info["grip"] for info in batch.infos] == [1, 0]
    assert batch.infos[0]["move"].tolist() == [0.5, 0.25]
    assert batch.infos[1]["move"].tolist() == [-1.0, 1.0]
    np.testing.assert_array_equal(
        batch.observations[0]["pos"], observations[1]["pos"] + [0.5, 0.25]
    )


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (np.zeros((1, 1), np.float32), r"actions must hold one action per lane stepped \(2\).*1"),
        (np.float32(0.0), "got no lane axis"),
    ],
)
def test_actions_without_one_row_per_lane_step_no_lane(actions, message):
    lanes = make_lanes(RecordingEnv, num_envs=2)
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    with pytest.raises(ValueError, match=message):
        lanes.step(all_lanes(lanes), actions)
    assert [env.actions for env in lanes_of(lanes)] == [[], []]


def test_a_short_dict_leaf_is_named():
    lanes = make_lanes(DictEnv, num_envs=2)
    actions = {"move": np.zeros((2, 2), np.float32), "grip": np.array([1])}
    with pytest.raises(ValueError, match=r'actions\["grip"\] must hold one action per lane'):
        lanes.step(all_lanes(lanes), actions)


@pytest.mark.parametrize(
    ("lanes", "seeds", "message"),
    [
        ([0, 2], [1, 2], "lane 2 is out of range"),
        ([1, 1], [1, 2], "lane 1 appears twice"),
        ([0, 1], [1], "seeds has 1 entries but lanes has 2"),
    ],
)
def test_reset_refuses_bad_lanes(lanes, seeds, message):
    with pytest.raises(ValueError, match=message):
        make_lanes(RecordingEnv, num_envs=2).reset(np.array(lanes), seeds, [None, None])


@pytest.mark.parametrize("env_class", [RecordingEnv, UndeclaredEnv, LooselyDeclaredEnv])
def test_trial_index_reaches_only_envs_that_declare_it(env_class):
    lanes = make_lanes(env_class, num_envs=2)
    lanes.reset(np.array([1, 0]), seeds=[8, 9], trials=[10, None])
    declared = env_class is RecordingEnv
    assert lanes.accepts_trial_index is declared
    envs = lanes_of(lanes)
    assert envs[1].resets == [(8, {"trial_index": 10} if declared else None)]
    assert envs[0].resets == [(9, None)]


def test_an_env_that_raises_names_its_lane():
    lanes = make_lanes(FailingEnv, num_envs=2)
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    with pytest.raises(EnvError, match=r"lane 1 \(FailingEnv\): step\(\) raised RuntimeError"):
        lanes.step(np.array([1]), np.zeros((1, 1), np.float32))


def test_close_closes_every_lane_once():
    lanes = make_lanes(RecordingEnv, num_envs=3)
    lanes.close()
    lanes.close()
    assert [env.closed for env in lanes_of(lanes)] == [1, 1, 1]


# ---------------------------------------------------------------- VectorEnvLanes


def cartpole_vector(mode: AutoresetMode, num_envs: int = 3) -> SyncVectorEnv:
    return SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs, autoreset_mode=mode)


def assert_same_step(batch, expected) -> None:
    observations, rewards, terminated, truncated, _ = expected
    np.testing.assert_array_equal(np.stack(batch.observations), observations)
    np.testing.assert_array_equal(batch.rewards, rewards)
    np.testing.assert_array_equal(batch.terminated, terminated)
    np.testing.assert_array_equal(batch.truncated, truncated)


def test_disabled_vectors_take_masked_seeded_resets_from_the_driver():
    lanes = make_lanes(cartpole_vector(AutoresetMode.DISABLED))
    reference = cartpole_vector(AutoresetMode.DISABLED)
    assert lanes.autoreset == "driver" and lanes.env_episode_ids() is None
    observations, _ = lanes.reset(all_lanes(lanes), seeds=[1, 2, 3], trials=[None] * 3)
    np.testing.assert_array_equal(np.stack(observations), reference.reset(seed=[1, 2, 3])[0])

    rng = np.random.default_rng(0)
    next_seed = 100
    resets = 0
    for _ in range(150):
        actions = rng.integers(0, 2, size=3)
        batch = lanes.step(all_lanes(lanes), actions)
        expected = reference.step(actions)
        assert_same_step(batch, expected)
        ended = np.flatnonzero(batch.terminated | batch.truncated)
        if ended.size:
            seeds = list(range(next_seed, next_seed + ended.size))
            next_seed += ended.size
            observations, _ = lanes.reset(ended, seeds=seeds, trials=[None] * ended.size)
            mask = np.isin(np.arange(3), ended)
            by_hand = [None] * 3
            for lane, seed in zip(ended.tolist(), seeds, strict=True):
                by_hand[lane] = seed
            expected_observations, _ = reference.reset(seed=by_hand, options={"reset_mask": mask})
            np.testing.assert_array_equal(np.stack(observations), expected_observations[ended])
            resets += ended.size
    assert resets >= 3  # the loop really exercised masked resets


def test_disabled_vectors_refuse_a_step_before_ended_lanes_are_reset():
    lanes = make_lanes(
        SyncVectorEnv(
            [lambda: RecordingEnv(length=1), RecordingEnv], autoreset_mode=AutoresetMode.DISABLED
        )
    )
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    actions = np.zeros((2, 1), np.float32)
    lanes.step(all_lanes(lanes), actions)
    with pytest.raises(ValueError, match=r"lanes \[0\] .*ended and were not reset"):
        lanes.step(all_lanes(lanes), actions)
    lanes.reset(np.array([0]), seeds=[5], trials=[None])
    assert lanes.step(all_lanes(lanes), actions).rewards.tolist() == [0.0, 0.0]


def test_each_trial_is_its_own_masked_reset_and_other_lanes_are_untouched():
    vector = SyncVectorEnv([RecordingEnv] * 3, autoreset_mode=AutoresetMode.DISABLED)
    lanes = make_lanes(vector)
    lanes.reset(all_lanes(lanes), seeds=[0, 1, 2], trials=[0, 1, 2])
    lanes.step(all_lanes(lanes), np.zeros((3, 1), np.float32))
    observations, infos = lanes.reset(np.array([2, 0]), seeds=[7, 8], trials=[20, 21])
    # The first reset primes every lane (no options), then gives each lane its trial.
    envs = vector.envs
    assert envs[0].resets == [(0, None), (0, {"trial_index": 0}), (8, {"trial_index": 21})]
    assert envs[1].resets == [(1, None), (1, {"trial_index": 1})]
    assert envs[2].resets == [(2, None), (2, {"trial_index": 2}), (7, {"trial_index": 20})]
    starts = [gym.utils.seeding.np_random(seed)[0].uniform() for seed in (7, 8)]
    assert [observation[0] for observation in observations] == starts
    assert [info["start"] for info in infos] == starts
    # Lane 1 kept its episode: its next step is its second.
    batch = lanes.step(all_lanes(lanes), np.zeros((3, 1), np.float32))
    assert [observation[1] for observation in batch.observations] == [1.0, 2.0, 1.0]


def test_a_first_reset_of_a_subset_also_starts_the_other_lanes_unseeded():
    vector = SyncVectorEnv([UndeclaredEnv] * 3, autoreset_mode=AutoresetMode.DISABLED)
    lanes = make_lanes(vector)
    observations, _ = lanes.reset(np.array([1]), seeds=[6], trials=[None])
    assert observations[0][0] == gym.utils.seeding.np_random(6)[0].uniform()
    assert [env.resets for env in vector.envs] == [[(None, None)], [(6, None)], [(None, None)]]
    # A later subset is one masked reset that leaves the other lanes alone.
    lanes.reset(np.array([2]), seeds=[7], trials=[None])
    assert [len(env.resets) for env in vector.envs] == [1, 1, 2]
    assert vector.envs[2].resets[1] == (7, {})  # the vector took out its reset_mask


def test_a_first_reset_of_one_trial_group_needs_no_priming():
    vector = SyncVectorEnv([RecordingEnv] * 2, autoreset_mode=AutoresetMode.DISABLED)
    make_lanes(vector).reset(np.array([0, 1]), seeds=[3, 4], trials=[9, 9])
    assert [env.resets for env in vector.envs] == [
        [(3, {"trial_index": 9})],
        [(4, {"trial_index": 9})],
    ]
    # A trial for some lanes only must not reach the others, even on the first reset.
    vector = SyncVectorEnv([RecordingEnv] * 2, autoreset_mode=AutoresetMode.DISABLED)
    make_lanes(vector).reset(np.array([1]), seeds=[5], trials=[9])
    assert [env.resets for env in vector.envs] == [
        [(None, None)],
        [(5, None), (5, {"trial_index": 9})],
    ]


def test_next_step_vectors_mark_reset_steps_and_count_env_episodes():
    vector = SyncVectorEnv(
        [lambda: RecordingEnv(length=2, tag="a"), lambda: RecordingEnv(length=3, tag="b")],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )
    lanes = make_lanes(vector)
    assert lanes.autoreset == "next_step"
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    assert lanes.env_episode_ids().tolist() == [0, 0]
    actions = np.full((2, 1), 0.5, np.float32)
    seen = []
    for _ in range(6):
        batch = lanes.step(all_lanes(lanes), actions)
        seen.append(
            (
                batch.reset_lanes.tolist(),
                batch.terminated.tolist(),
                batch.rewards.tolist(),
                [observation[1] for observation in batch.observations],
                lanes.env_episode_ids().tolist(),
            )
        )
    # (reset_lanes, terminated, rewards, steps into the episode, env episode ids) per step.
    assert seen == [
        ([False, False], [False, False], [0.5, 0.5], [1.0, 1.0], [0, 0]),
        ([False, False], [True, False], [0.5, 0.5], [2.0, 2.0], [0, 0]),
        ([True, False], [False, True], [0.0, 0.5], [0.0, 3.0], [1, 0]),
        ([False, True], [False, False], [0.5, 0.0], [1.0, 0.0], [1, 1]),
        ([False, False], [True, False], [0.5, 0.5], [2.0, 1.0], [1, 1]),
        ([True, False], [False, False], [0.0, 0.5], [0.0, 2.0], [2, 1]),
    ]
    # A reset step hands back the new episode's reset info; other steps the step info.
    assert set(batch.infos[0]) == {"start"} and batch.infos[1]["tag"] == "b"
    assert batch.reset_infos is None and batch.final_observations is None
    # The vector ignored lane 0's action on its reset steps: 4 of 6 actions reached it.
    assert len(vector.envs[0].actions) == 4


def test_a_driver_reset_is_no_env_episode_and_cancels_the_pending_autoreset():
    lanes = make_lanes(SyncVectorEnv([lambda: RecordingEnv(length=1)] * 2))
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    actions = np.zeros((2, 1), np.float32)
    lanes.step(all_lanes(lanes), actions)  # both lanes end
    lanes.reset(np.array([1]), seeds=[4], trials=[None])
    batch = lanes.step(all_lanes(lanes), actions)
    assert batch.reset_lanes.tolist() == [True, False]
    assert batch.terminated.tolist() == [False, True]  # lane 1 really stepped its new episode
    assert lanes.env_episode_ids().tolist() == [1, 0]


def test_next_step_vectors_match_the_vector_driven_by_hand():
    lanes = make_lanes(cartpole_vector(AutoresetMode.NEXT_STEP))
    reference = cartpole_vector(AutoresetMode.NEXT_STEP)
    lanes.reset(all_lanes(lanes), seeds=[4, 5, 6], trials=[None] * 3)
    reference.reset(seed=[4, 5, 6])
    rng = np.random.default_rng(1)
    previous_ended = np.zeros(3, bool)
    for _ in range(120):
        actions = rng.integers(0, 2, size=3)
        batch = lanes.step(all_lanes(lanes), actions)
        assert_same_step(batch, reference.step(actions))
        np.testing.assert_array_equal(batch.reset_lanes, previous_ended)
        previous_ended = batch.terminated | batch.truncated
    assert lanes.env_episode_ids().sum() >= 3


def test_same_step_vectors_report_final_observations_and_count_env_episodes():
    vector = SyncVectorEnv(
        [lambda: RecordingEnv(length=2, tag="a"), lambda: RecordingEnv(length=3, tag="b")],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    lanes = make_lanes(vector)
    assert lanes.autoreset == "same_step"
    lanes.reset(all_lanes(lanes), seeds=[0, 1], trials=[None, None])
    actions = np.full((2, 1), 0.5, np.float32)
    first = lanes.step(all_lanes(lanes), actions)
    assert first.final_observations == [None, None] and first.reset_infos == [None, None]
    assert first.infos == [{"steps": 1, "tag": "a"}, {"steps": 1, "tag": "b"}]

    second = lanes.step(all_lanes(lanes), actions)
    assert second.terminated.tolist() == [True, False]
    assert second.reset_lanes is None
    assert lanes.env_episode_ids().tolist() == [1, 0]
    # Lane 0: the ended episode's last observation and info, and the new episode's first.
    assert second.final_observations[0][1] == 2.0 and second.final_observations[1] is None
    assert second.infos[0] == {"steps": 2, "tag": "a"}
    assert second.observations[0][1] == 0.0
    assert set(second.reset_infos[0]) == {"start"}
    assert second.reset_infos[0]["start"] == second.observations[0][0]
    assert second.reset_infos[1] is None and second.infos[1] == {"steps": 2, "tag": "b"}

    third = lanes.step(all_lanes(lanes), actions)
    assert third.terminated.tolist() == [False, True]
    assert lanes.env_episode_ids().tolist() == [1, 1]
    assert third.observations[0][1] == 1.0  # lane 0 stepped straight into its new episode


def test_same_step_vectors_match_the_vector_driven_by_hand():
    lanes = make_lanes(cartpole_vector(AutoresetMode.SAME_STEP))
    reference = cartpole_vector(AutoresetMode.SAME_STEP)
    lanes.reset(all_lanes(lanes), seeds=[4, 5, 6], trials=[None] * 3)
    reference.reset(seed=[4, 5, 6])
    rng = np.random.default_rng(2)
    counts = np.zeros(3, np.int64)
    for _ in range(120):
        actions = rng.integers(0, 2, size=3)
        batch = lanes.step(all_lanes(lanes), actions)
        expected = reference.step(actions)
        assert_same_step(batch, expected)
        ended = expected[2] | expected[3]
        counts += ended
        for lane in range(3):
            if ended[lane]:
                final = expected[4]["final_obs"][lane]
                np.testing.assert_array_equal(batch.final_observations[lane], final)
            else:
                assert batch.final_observations[lane] is None
        np.testing.assert_array_equal(lanes.env_episode_ids(), counts)
    assert counts.sum() >= 3


def test_vector_infos_and_dict_observations_are_split_per_lane():
    vector = SyncVectorEnv([DictEnv] * 3, autoreset_mode=AutoresetMode.DISABLED)
    reference = SyncVectorEnv([DictEnv] * 3, autoreset_mode=AutoresetMode.DISABLED)
    lanes = make_lanes(vector)
    observations, infos = lanes.reset(all_lanes(lanes), seeds=[0, 1, 2], trials=[None] * 3)
    expected, _ = reference.reset(seed=[0, 1, 2])
    assert infos == [{}, {}, {}]
    for lane, observation in enumerate(observations):
        np.testing.assert_array_equal(observation["pos"], expected["pos"][lane])
        assert observation["count"] == 0
    actions = {"move": np.zeros((3, 2), np.float32), "grip": np.array([1, 0, 1])}
    batch = lanes.step(all_lanes(lanes), actions)
    assert [info["grip"] for info in batch.infos] == [1, 0, 1]
    assert all(set(info) == {"grip", "move"} for info in batch.infos)  # no "_grip" masks
    assert [observation["count"] for observation in batch.observations] == [1, 1, 1]


def test_vector_lanes_step_every_lane_and_return_the_rows_of_the_lanes_asked_for():
    vector = SyncVectorEnv([RecordingEnv] * 3, autoreset_mode=AutoresetMode.NEXT_STEP)
    lanes = make_lanes(vector)
    lanes.reset(all_lanes(lanes), seeds=[0, 1, 2], trials=[None] * 3)
    batch = lanes.step(np.array([0, 2]), np.array([[0.25], [0.75]], np.float32))
    # Every lane moved (lane 1 took a placeholder action), and every lane's observation is back.
    assert batch.stepped.tolist() == [0, 1, 2] and len(batch.observations) == 3
    assert [float(env.actions[-1][0]) for env in vector.envs] == [0.25, 0.0, 0.75]
    # The rows are the lanes asked for, in their order.
    assert batch.rewards.tolist() == [0.25, 0.75]
    assert [info["steps"] for info in batch.infos] == [1, 1]
    assert batch.terminated.tolist() == [False, False] and batch.reset_lanes.tolist() == [False] * 2
    # No lane asked for: the vector still steps, every lane with its placeholder.
    empty = lanes.step(np.zeros(0, np.int64), None)
    assert empty.stepped.tolist() == [0, 1, 2] and empty.rewards.tolist() == []
    assert [len(env.actions) for env in vector.envs] == [2, 2, 2]


def test_a_vector_that_restarts_lanes_itself_warns_once_naming_the_fix():
    with pytest.warns(UserWarning, match="seed=None.*AutoresetMode.DISABLED.*env id or factory"):
        make_lanes(SyncVectorEnv([RecordingEnv] * 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_lanes(SyncVectorEnv([RecordingEnv] * 2, autoreset_mode=AutoresetMode.DISABLED))


def test_an_unknown_autoreset_mode_is_refused():
    vector = SyncVectorEnv([RecordingEnv])
    vector.metadata["autoreset_mode"] = "Sometimes"
    with pytest.raises(EnvError, match=r"autoreset_mode.*'Sometimes'.*NEXT_STEP, SAME_STEP"):
        make_lanes(vector)


def test_vector_lanes_close_once():
    vector = SyncVectorEnv([RecordingEnv] * 2)
    lanes = make_lanes(vector)
    lanes.close()
    lanes.close()
    assert [env.closed for env in vector.envs] == [1, 1]


# ---------------------------------------------------------------- names and optional members


def test_the_former_names_of_the_kinds_stay_importable_from_where_they_were():
    import rlmesh.lanes
    import rlmesh.lanes.local
    import rlmesh.lanes.vector

    assert rlmesh.lanes.LaneVector is rlmesh.lanes.local.LaneVector is InProcessLanes
    assert rlmesh.lanes.VectorLanes is rlmesh.lanes.vector.VectorLanes is VectorEnvLanes
    assert rlmesh.lanes.local.checked_reset([1, 0], [None, None], [None, None], 2) == [1, 0]


class BareLanes:
    """Lanes with only the required members of the protocol."""

    num_lanes = 1
    name = "bare"
    single_observation_space = Box(-1.0, 1.0, (1,), np.float32)
    single_action_space = Discrete(2)
    lockstep = False
    resets_itself = False
    env_steps = None
    spec = None
    metadata: dict = {}  # noqa: RUF012
    rebuild = None

    def reset(self, lanes, seeds, trials):
        return [], []

    def step(self, lanes, actions):
        raise NotImplementedError

    def env_episode_ids(self):
        return None

    def close(self):
        pass


def test_optional_members_left_out_read_as_their_defaults():
    lanes = BareLanes()
    assert isinstance(lanes, Lanes) and make_lanes(lanes) is lanes
    assert lanes_core_calls_step(lanes) is False
    assert lanes_round_step(lanes) == lanes.step
    assert lanes_accepts_trial_index(lanes) is False
    assert lanes_autoreset(lanes) == "driver"
    assert lanes_rendering(lanes) is None and lanes_render_fps(lanes) is None
    assert lanes_pipelined(lanes) is None
    lanes.resets_itself = True  # an env that restarts lanes itself, saying no more: Gymnasium's
    assert lanes_autoreset(lanes) == "next_step"


def test_optional_members_declared_are_read_as_declared():
    lanes = make_lanes(RecordingEnv, num_envs=2)
    assert lanes_accepts_trial_index(lanes) is True
    assert lanes_rendering(lanes) is lanes and lanes_autoreset(lanes) == "driver"
    vector = SyncVectorEnv([RecordingEnv] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        vector_lanes = make_lanes(vector)
    assert lanes_autoreset(vector_lanes) == "same_step"
    bare = BareLanes()
    bare.core_calls_step = True
    bare.render_fps = 30
    bare.round_step = bare.step
    assert lanes_core_calls_step(bare) is True and lanes_render_fps(bare) == 30
    assert lanes_round_step(bare) is bare.round_step
    lanes.close()
    vector_lanes.close()
