"""A model's action of the wrong shape is refused, never reshaped, through ``rlmesh.run``.

Both cores, every corner, the core's own loop of rounds and the driver's awaited one. The env
stands in for HalfCheetah (MuJoCo is not installed here): a ``Box(6,)`` action space whose
``step`` refuses any other shape, as MuJoCo's envs do.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, AwaitEveryStep, comparable
from rlmesh.errors import ModelOutputError

SEED_BASE = 100  # episode index k resets with seed SEED_BASE + k


class SixJointEnv(gym.Env):
    """HalfCheetah's spaces in miniature: obs ``[step, seed, 0...]``, action ``Box(6,)``.

    Episode index k lasts 4 steps when k is even and 6 when it is odd, so on two lanes lane 0
    finishes first and runs episode index 2.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        # A surplus episode of a lockstep vector resets with seed None: it shows as seed -1.
        self._seed, self._step = (-1 if seed is None else seed), 0
        self._length = 4 if (self._seed - SEED_BASE) % 2 == 0 else 6
        return self._observation(), {}

    def step(self, action):
        action = np.asarray(action)
        if action.shape != (6,):
            raise ValueError(f"action of shape {action.shape}, expected (6,)")
        self._step += 1
        reward = -float(np.square(action).sum())
        return self._observation(), reward, self._step == self._length, False, {}

    def _observation(self):
        observation = np.zeros(8)
        observation[:2] = self._step, self._seed
        return observation


def episode_index_and_step(obs):
    return int(obs[1]) - SEED_BASE, int(obs[0])


def action_for(obs, wrong_at):
    """Six small torques, or the same six values as [3, 2] at ``wrong_at`` (index, step)."""
    action = np.full(6, 0.1 * episode_index_and_step(obs)[1], np.float32)
    return action.reshape(3, 2) if episode_index_and_step(obs) == wrong_at else action


def chunk_for(obs, wrong_at, horizon):
    """The actions of the next ``horizon`` steps, as ``action_for`` gives them one by one."""
    index, step = episode_index_and_step(obs)
    chunk = np.stack([np.full(6, 0.1 * (step + ahead), np.float32) for ahead in range(horizon)])
    return chunk.reshape(horizon, 3, 2) if (index, step) == wrong_at else chunk


class PerLane(rlmesh.Model):
    def __init__(self, wrong_at=None):
        self.wrong_at = wrong_at

    def predict(self, obs):
        return action_for(obs, self.wrong_at)


def batch_for(rows, wrong_at, action):
    """One batch of ``action(row)``; all of it as [..., 3, 2] when a row is at ``wrong_at``."""
    batch = np.stack([action(row) for row in rows])
    if any(episode_index_and_step(row) == wrong_at for row in rows):
        return batch.reshape(*batch.shape[:-1], 3, 2)
    return batch


class Batched(PerLane):
    def predict_batch(self, obs):
        return batch_for(obs, self.wrong_at, lambda row: action_for(row, None))


class Chunked(PerLane):
    def predict_chunk(self, obs, execution_horizon=None):
        return chunk_for(obs, self.wrong_at, execution_horizon or 1)


class ChunkBatched(PerLane):
    def predict_chunk_batch(self, obs, execution_horizon=None):
        return batch_for(
            obs, self.wrong_at, lambda row: chunk_for(row, None, execution_horizon or 1)
        )


# (model, num_envs, execution_horizon, hooks, where the model goes wrong, the step it is
# caught at). One lane for the per-lane corners: on several lanes, one lane's odd shape
# already keeps the outputs from stacking into a batch. A chunk is planned every 4 steps.
CASES = {
    "predict": (PerLane, 1, 1, None, (2, 3), 3),
    "predict_batch": (Batched, 2, 1, None, (2, 3), 3),
    "predict_batch, awaited": (Batched, 2, 1, AwaitEveryStep(), (2, 3), 3),
    "predict_chunk": (Chunked, 1, 4, None, (2, 0), 0),
    "predict_chunk_batch": (ChunkBatched, 2, 4, None, (3, 4), 4),
    "predict_chunk_batch, awaited": (ChunkBatched, 2, 4, AwaitEveryStep(), (3, 4), 4),
}


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_wrongly_shaped_action_names_the_lane_episode_and_step(core, case):
    model, num_envs, horizon, hooks, (index, step), caught_at = CASES[case]
    # Episode index 2 runs on lane 0 (episode 0 ends first), index 3 on lane 1.
    lane = 0 if num_envs == 1 else index - 2
    with pytest.raises(ModelOutputError) as caught:
        rlmesh.run(
            model(wrong_at=(index, step)),
            SixJointEnv,
            seeds=[SEED_BASE + k for k in range(5)],
            num_envs=num_envs,
            execution_horizon=horizon,
            hooks=hooks,
            core=core,
        )
    message = (
        f"lane {lane} (episode index {index}, step {caught_at}): action: expected shape [6] "
        f"per lane for Box float32[6], got [3,2]"
    )
    assert str(caught.value) == message
    assert [episode.index for episode in caught.value.partial_result.episodes] == list(range(index))


@pytest.mark.parametrize("core", CORES)
def test_a_whole_batch_of_the_wrong_shape_is_named_by_its_first_lane(core):
    class AlwaysFlat(rlmesh.Model):
        def predict_batch(self, obs):
            return np.zeros((len(obs), 3, 2), np.float32)

    with pytest.raises(ModelOutputError, match=re.escape("lane 0 (episode index 0, step 0): ")):
        rlmesh.run(
            AlwaysFlat(), SixJointEnv, seeds=[SEED_BASE, SEED_BASE + 1], num_envs=2, core=core
        )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("model", "num_envs", "horizon"),
    [(PerLane, 2, 1), (Batched, 2, 1), (Chunked, 2, 3), (ChunkBatched, 2, 3)],
    ids=["predict", "predict_batch", "predict_chunk", "predict_chunk_batch"],
)
def test_actions_of_the_space_shape_run_on_every_corner(core, model, num_envs, horizon):
    seeds = [SEED_BASE + k for k in range(4)]
    result = rlmesh.run(
        model(), SixJointEnv, seeds=seeds, num_envs=num_envs, execution_horizon=horizon, core=core
    )
    assert [episode.steps for episode in result.episodes] == [4, 6, 4, 6]
    # Every step's six torques are 0.1 * the step: the env got them as they were given.
    expected = [-6 * sum((0.1 * s) ** 2 for s in range(e.steps)) for e in result.episodes]
    np.testing.assert_allclose([e.reward for e in result.episodes], expected, rtol=1e-6)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("env_id", "as_gymnasium_takes", "the_other_form"),
    [
        # Box(1,): Gymnasium's Pendulum takes a [1] array; a float is one value too.
        ("Pendulum-v1", lambda obs: np.array([-obs[2]], np.float32), lambda obs: float(-obs[2])),
        # Discrete: an int, or the [1] array a policy with a kept batch axis returns.
        ("CartPole-v1", lambda obs: int(obs[2] > 0), lambda obs: np.array([obs[2] > 0], int)),
    ],
    ids=["Box1", "Discrete"],
)
def test_a_one_value_action_space_takes_a_scalar_or_a_one_element_vector(
    core, env_id, as_gymnasium_takes, the_other_form
):
    runs = [
        rlmesh.run(policy, env_id, episodes=3, num_envs=2, max_episode_steps=60, core=core)
        for policy in (as_gymnasium_takes, the_other_form)
    ]
    assert comparable(runs[0]) == comparable(runs[1])
    seeds = [episode.seed for episode in runs[0].episodes]
    reference = plain_gymnasium_rewards(env_id, as_gymnasium_takes, seeds)
    assert [episode.reward for episode in runs[1].episodes] == pytest.approx(reference)


def plain_gymnasium_rewards(env_id, policy, seeds):
    env = gym.make(env_id, max_episode_steps=60)
    rewards = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total, done = total + float(reward), terminated or truncated
        rewards.append(total)
    return rewards


@pytest.mark.parametrize("core", CORES)
def test_a_chunk_of_scalars_fits_a_box_of_one(core):
    class TorqueChunks(rlmesh.Model):
        def predict_chunk(self, obs, execution_horizon=None):
            return np.full(execution_horizon or 1, -obs[2], np.float32)  # [H] for Box(1,)

    result = rlmesh.run(
        TorqueChunks(),
        "Pendulum-v1",
        episodes=2,
        execution_horizon=4,
        max_episode_steps=12,
        core=core,
    )
    assert [episode.steps for episode in result.episodes] == [12, 12]


@pytest.mark.parametrize("core", CORES)
def test_an_action_for_a_surplus_episode_is_named_as_one(core):
    """A lockstep vector restarts lane 0 after the budget is claimed: that episode is surplus,
    stepped but never scored, and has no episode index to name."""

    class FlatOnSurplus(rlmesh.Model):
        def predict_batch(self, obs):
            batch = np.zeros((len(obs), 6), np.float32)
            if obs[0, 1] == -1 and obs[0, 0] == 1:  # lane 0's surplus episode, at step 1
                return batch.reshape(len(obs), 3, 2)
            return batch

    vector = gym.vector.SyncVectorEnv(
        [SixJointEnv, SixJointEnv], autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )
    message = "lane 0 (surplus episode, step 1): action: expected shape [6] per lane"
    with pytest.raises(ModelOutputError, match=f"^{re.escape(message)}"):
        rlmesh.run(FlatOnSurplus(), vector, seeds=[SEED_BASE, SEED_BASE + 1], core=core)
