"""``rlmesh.run`` end to end, beside the hand-written loops a user would otherwise write.

Each round is one whole evaluation of the same policy and seeds; the hand-written loop is the
floor (``extra_info["floor"]``), so ``ratios.py`` reports rlmesh's throughput as a fraction of
it. Both sides do the same steps, so the time ratio is the steps/s ratio.

- CartPole, 1 lane, a numpy policy: ``rlmesh.run`` vs an ``env.reset(seed)`` + ``env.step``
  loop over the same seeds; and the same for a model that defines both ``predict`` and
  ``predict_batch`` (one lane runs its per-lane corner).
- CartPole, 16 lanes, a batched policy: ``rlmesh.run`` on 16 lanes vs a ``SyncVectorEnv``
  stepped by hand for the same number of lane-steps.
- A null env and a null batched model at N = 256 lanes: what the driver and the core cost per
  lane-step when the env and the model cost nothing (both cores).
- A user's lockstep ``SyncVectorEnv`` of 16 CartPoles: ``rlmesh.run`` (wasted steps and
  predictions per episode recorded) vs the same vector stepped by hand.
- A chunk policy on 16 CartPole lanes replaying H = 1, 4, 16 actions per prediction.

Run: ``pytest benches/test_bench_driver.py --benchmark-enable``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from cartpole import ENV_ID, SEEDS, VECTOR_EPISODES, VECTOR_LANES, batched_policy, policy
from rlmesh.core import CORE_NAMES

ROUNDS = 5
NULL_LANES, NULL_STEPS = 256, 20
# Episodes per lane in a null run: enough that one run's set-up (building the envs, the event
# loop, the statefulness probe) weighs on it as little as on a real evaluation.
NULL_EPISODES_PER_LANE = 8
CHUNK_LENGTH = 16  # the chunk policy's native chunk; a run replays its first H actions


def plain_loop(seeds=SEEDS) -> int:
    """A plain gymnasium loop over ``seeds``, one episode each; returns the steps taken."""
    env = gym.make(ENV_ID)
    steps = 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(policy(obs))
            steps, done = steps + 1, terminated or truncated
    return steps


def run_one_lane(core=None, seeds=SEEDS) -> rlmesh.RunResult:
    """``rlmesh.run`` of the same policy and seeds as ``plain_loop``."""
    return rlmesh.run(policy, ENV_ID, seeds=seeds, core=core)


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_cartpole_one_lane(benchmark, core):
    benchmark.group = "run, CartPole 1 lane (vs plain loop)"
    result = benchmark.pedantic(run_one_lane, args=(core,), rounds=ROUNDS)
    assert result.total_steps == plain_loop()


def test_plain_loop_cartpole_one_lane(benchmark):
    benchmark.group = "run, CartPole 1 lane (vs plain loop)"
    benchmark.extra_info["floor"] = "a plain gymnasium loop, same policy and seeds"
    assert benchmark.pedantic(plain_loop, rounds=ROUNDS) > 0


class BothCorners(rlmesh.Model):
    """The CartPole policy through both a per-lane and a batched corner (a model written for
    any lane count)."""

    def predict(self, obs):
        return policy(obs)

    def predict_batch(self, obs):
        return batched_policy(obs)


def run_one_lane_both_corners(core=None, seeds=SEEDS) -> rlmesh.RunResult:
    """``rlmesh.run`` of ``BothCorners`` on one lane, same seeds as ``plain_loop``."""
    return rlmesh.run(BothCorners(), ENV_ID, seeds=seeds, core=core)


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_cartpole_one_lane_both_corners(benchmark, core):
    benchmark.group = "run, CartPole 1 lane, predict + predict_batch (vs plain loop)"
    result = benchmark.pedantic(run_one_lane_both_corners, args=(core,), rounds=ROUNDS)
    assert result.total_steps == plain_loop()


def test_plain_loop_cartpole_one_lane_both_corners(benchmark):
    benchmark.group = "run, CartPole 1 lane, predict + predict_batch (vs plain loop)"
    benchmark.extra_info["floor"] = "a plain gymnasium loop, same policy and seeds"
    assert benchmark.pedantic(plain_loop, rounds=ROUNDS) > 0


def sync_vector_loop(lane_steps: int) -> int:
    """A SyncVectorEnv of 16 CartPoles stepped by hand until `lane_steps` lane-steps."""
    vector = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(VECTOR_LANES)])
    obs, _ = vector.reset(seed=SEEDS[:VECTOR_LANES])
    done = 0
    while done < lane_steps:
        obs, *_ = vector.step(batched_policy(obs))
        done += VECTOR_LANES
    vector.close()
    return done


class BatchedPolicy(rlmesh.Model):
    def predict_batch(self, obs):
        return batched_policy(obs)


def run_sixteen_lanes(core=None, episodes=VECTOR_EPISODES) -> rlmesh.RunResult:
    """``rlmesh.run`` of the batched policy on 16 CartPole lanes."""
    return rlmesh.run(BatchedPolicy(), ENV_ID, episodes=episodes, num_envs=VECTOR_LANES, core=core)


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_cartpole_sixteen_lanes(benchmark, core):
    benchmark.group = "run, CartPole 16 lanes (vs SyncVectorEnv loop)"
    result = benchmark.pedantic(run_sixteen_lanes, args=(core,), rounds=ROUNDS)
    benchmark.extra_info["lane_steps"] = result.total_steps
    assert result.num_episodes == VECTOR_EPISODES


def test_sync_vector_loop_cartpole_sixteen_lanes(benchmark):
    benchmark.group = "run, CartPole 16 lanes (vs SyncVectorEnv loop)"
    benchmark.extra_info["floor"] = "a SyncVectorEnv loop of as many lane-steps"
    lane_steps = run_sixteen_lanes().total_steps
    assert benchmark.pedantic(sync_vector_loop, args=(lane_steps,), rounds=ROUNDS) >= lane_steps


class CountingPolicy(rlmesh.Model):
    """The batched policy, counting the lane predictions it makes."""

    def __init__(self) -> None:
        self.predicted_rows = 0

    def predict_batch(self, obs):
        self.predicted_rows += len(obs)
        return batched_policy(obs)


LOCKSTEP_EPISODES = 24  # not a multiple of the 16 lanes: the last wave runs 8 surplus episodes


def run_lockstep(core=None, episodes=LOCKSTEP_EPISODES):
    """``rlmesh.run`` on a user's lockstep ``SyncVectorEnv`` of 16 CartPoles (autoreset
    DISABLED, so rlmesh resets each episode with its seed).

    Returns the result and the lane predictions per scored episode.
    """
    vector = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(VECTOR_LANES)],
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    )
    model = CountingPolicy()
    result = rlmesh.run(model, vector, episodes=episodes, core=core, close_env=True)
    return result, model.predicted_rows / result.num_episodes


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_lockstep_sixteen_lanes(benchmark, core):
    benchmark.group = "run, a user's SyncVectorEnv, 16 lanes (vs SyncVectorEnv loop)"
    result, predicts_per_episode = benchmark.pedantic(run_lockstep, args=(core,), rounds=ROUNDS)
    assert result.num_episodes == LOCKSTEP_EPISODES
    # Surplus episodes are stepped (and predicted for) but never scored.
    assert result.wasted_steps > 0
    assert predicts_per_episode * result.num_episodes >= result.total_steps


def test_sync_vector_loop_cartpole_lockstep(benchmark):
    benchmark.group = "run, a user's SyncVectorEnv, 16 lanes (vs SyncVectorEnv loop)"
    benchmark.extra_info["floor"] = "a SyncVectorEnv loop of as many lane-steps, waste included"
    result, _ = run_lockstep()
    lane_steps = result.total_steps + result.wasted_steps
    assert benchmark.pedantic(sync_vector_loop, args=(lane_steps,), rounds=ROUNDS) >= lane_steps


class ChunkPolicy(rlmesh.Model):
    """Plans CHUNK_LENGTH actions at once (the current decision, repeated); counts its rows."""

    def __init__(self) -> None:
        self.predicted_rows = 0

    def predict_chunk_batch(self, obs):
        self.predicted_rows += len(obs)
        return np.repeat(batched_policy(obs)[:, None], CHUNK_LENGTH, axis=1)


def run_chunked(horizon: int, core=None, episodes=VECTOR_EPISODES):
    """The chunk policy on 16 CartPole lanes replaying H = ``horizon`` actions per chunk.

    Returns the result and the lane predictions per scored episode.
    """
    model = ChunkPolicy()
    result = rlmesh.run(
        model,
        ENV_ID,
        episodes=episodes,
        num_envs=VECTOR_LANES,
        execution_horizon=horizon,
        core=core,
    )
    return result, model.predicted_rows / result.num_episodes


@pytest.mark.parametrize("core", CORE_NAMES)
@pytest.mark.parametrize("horizon", [1, 4, 16])
def test_run_chunked_sixteen_lanes(benchmark, core, horizon):
    benchmark.group = f"run, chunk policy H={horizon}, CartPole 16 lanes"
    result, predicts_per_episode = benchmark.pedantic(
        run_chunked, args=(horizon, core), rounds=ROUNDS
    )
    assert result.num_episodes == VECTOR_EPISODES
    # One prediction per lane serves up to H steps.
    assert predicts_per_episode * horizon >= result.total_steps / result.num_episodes


class NullEnv(gym.Env):
    """Costs nothing: a constant observation, no reward, episodes of NULL_STEPS steps."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    _observation = np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._observation, {}

    def step(self, action):
        self.t += 1
        return self._observation, 0.0, self.t >= NULL_STEPS, False, {}


class NullModel(rlmesh.Model):
    def predict_batch(self, obs):
        return np.zeros(len(obs), dtype=np.int64)


def run_null(core=None, episodes=NULL_EPISODES_PER_LANE * NULL_LANES) -> rlmesh.RunResult:
    """``rlmesh.run`` of the null model on 256 null envs."""
    return rlmesh.run(NullModel(), NullEnv, episodes=episodes, num_envs=NULL_LANES, core=core)


def null_plain_loop(lane_steps: int) -> int:
    """The null envs alone: 256 of them stepped in a plain loop for ``lane_steps`` lane-steps."""
    envs = [NullEnv() for _ in range(NULL_LANES)]
    for env in envs:
        env.reset()
    done = 0
    while done < lane_steps:
        for env in envs:
            if env.step(0)[2]:
                env.reset()
        done += NULL_LANES
    return done


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_null_env_256_lanes(benchmark, core):
    benchmark.group = f"run, null env + null model, N={NULL_LANES}"
    result = benchmark.pedantic(run_null, args=(core,), rounds=ROUNDS)
    assert result.total_steps == NULL_EPISODES_PER_LANE * NULL_LANES * NULL_STEPS
    benchmark.extra_info["lane_steps"] = result.total_steps
