"""``rlmesh.run`` end to end, beside the hand-written loops a user would otherwise write.

Each round is one whole evaluation of the same policy and seeds; the hand-written loop is the
floor (``extra_info["floor"]``), so ``ratios.py`` reports rlmesh's throughput as a fraction of
it. Both sides do the same steps, so the time ratio is the steps/s ratio.

- CartPole, 1 lane, a numpy policy: ``rlmesh.run`` vs an ``env.reset(seed)`` + ``env.step``
  loop over the same seeds.
- CartPole, 16 lanes, a batched policy: ``rlmesh.run`` on 16 lanes vs a ``SyncVectorEnv``
  stepped by hand for the same number of lane-steps.
- A null env and a null batched model at N = 256 lanes: what the driver and the core cost per
  lane-step when the env and the model cost nothing (both cores).

Run: ``pytest benches/test_bench_driver.py --benchmark-enable``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from rlmesh.core import CORE_NAMES

SEEDS = list(range(20))
ROUNDS = 5
NULL_LANES, NULL_STEPS = 256, 20


def policy(obs):
    return int(obs[2] + 0.3 * obs[3] > 0)


def batched_policy(obs):
    return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


def plain_loop() -> int:
    env = gym.make("CartPole-v1")
    steps = 0
    for seed in SEEDS:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(policy(obs))
            steps, done = steps + 1, terminated or truncated
    return steps


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_cartpole_one_lane(benchmark, core):
    benchmark.group = "run, CartPole 1 lane (vs plain loop)"
    result = benchmark.pedantic(
        lambda: rlmesh.run(policy, "CartPole-v1", seeds=SEEDS, core=core), rounds=ROUNDS
    )
    assert result.total_steps == plain_loop()


def test_plain_loop_cartpole_one_lane(benchmark):
    benchmark.group = "run, CartPole 1 lane (vs plain loop)"
    benchmark.extra_info["floor"] = "a plain gymnasium loop, same policy and seeds"
    assert benchmark.pedantic(plain_loop, rounds=ROUNDS) > 0


def sync_vector_loop(lane_steps: int) -> int:
    """A SyncVectorEnv of 16 CartPoles stepped by hand until `lane_steps` lane-steps."""
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(16)])
    obs, _ = vector.reset(seed=SEEDS[:16])
    done = 0
    while done < lane_steps:
        obs, *_ = vector.step(batched_policy(obs))
        done += 16
    vector.close()
    return done


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_cartpole_sixteen_lanes(benchmark, core):
    benchmark.group = "run, CartPole 16 lanes (vs SyncVectorEnv loop)"
    result = benchmark.pedantic(
        lambda: rlmesh.run(
            batched_policy_model(), "CartPole-v1", episodes=64, num_envs=16, core=core
        ),
        rounds=ROUNDS,
    )
    benchmark.extra_info["lane_steps"] = result.total_steps
    assert result.num_episodes == 64


def batched_policy_model():
    class Batched(rlmesh.Model):
        def predict_batch(self, obs):
            return batched_policy(obs)

    return Batched()


def test_sync_vector_loop_cartpole_sixteen_lanes(benchmark):
    benchmark.group = "run, CartPole 16 lanes (vs SyncVectorEnv loop)"
    benchmark.extra_info["floor"] = "a SyncVectorEnv loop of as many lane-steps"
    lane_steps = rlmesh.run(
        batched_policy_model(), "CartPole-v1", episodes=64, num_envs=16
    ).total_steps
    assert benchmark.pedantic(sync_vector_loop, args=(lane_steps,), rounds=ROUNDS) >= lane_steps


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


@pytest.mark.parametrize("core", CORE_NAMES)
def test_run_null_env_256_lanes(benchmark, core):
    benchmark.group = f"run, null env + null model, N={NULL_LANES}"
    result = benchmark.pedantic(
        lambda: rlmesh.run(
            NullModel(), NullEnv, episodes=2 * NULL_LANES, num_envs=NULL_LANES, core=core
        ),
        rounds=ROUNDS,
    )
    assert result.total_steps == 2 * NULL_LANES * NULL_STEPS
    benchmark.extra_info["lane_steps"] = result.total_steps
