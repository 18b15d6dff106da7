"""A CPU-heavy env, about 1 ms of pure-Python work per step, and its policy: the workload of
the scale-out benchmarks (process lanes in ``test_bench_process_lanes.py``, Ray in
``test_bench_cluster_ray.py``), where the env, not rlmesh, is what a run spends its time on,
as with a physics simulator.

The work is a fixed count of integer operations, so a step costs the same CPU every time and
its results are deterministic; episodes last ``shortest`` to ``longest`` steps (default 100 to
300), drawn from their seed, so lanes and windows of episodes are uneven, as real tasks are,
and a lockstep vector, which cannot pause a lane, runs surplus steps. ``import cpu_heavy``
registers the env as ``cpu_heavy:CpuHeavy-v0`` (the form ``gymnasium.make`` imports in a worker
process and on a Ray worker too).
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import rlmesh

ENV_ID = "cpu_heavy:CpuHeavy-v0"
LOAD_S = 0.5  # what SlowToLoad's load takes: loading weights, say
WORK = 10_000  # integer operations a step: about 1 ms of CPU on the machine BENCHMARKS.md names
SHORTEST, LONGEST = 100, 300  # steps an episode lasts, drawn from its seed


def burn(work: int = WORK) -> int:
    """``work`` rounds of integer hashing: CPU time that no cache or vector unit shortens."""
    value = 0
    for step in range(work):
        value = (value * 31 + step) % 1_000_003
    return value


class CpuHeavyEnv(gym.Env):
    """A 4-d drift the action pushes left or right; ``burn()`` once per step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, shortest: int = SHORTEST, longest: int = LONGEST) -> None:
        self.shortest, self.longest = shortest, longest

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length = int(self.np_random.integers(self.shortest, self.longest + 1))
        self.state = self.np_random.normal(size=4).astype(np.float32)
        self.steps = 0
        return self.state.copy(), {}

    def step(self, action):
        burn()
        self.steps += 1
        push = np.float32(0.1 if action else -0.1)
        self.state = (np.float32(0.95) * self.state + push).astype(np.float32)
        reward = float(-abs(self.state[0]))
        return self.state.copy(), reward, self.steps >= self.length, False, {}


def policy(obs):
    """Push the first coordinate back toward zero."""
    return int(obs[0] < 0)


class SlowToLoad(rlmesh.Model):
    """``policy`` behind a ``load`` that takes ``LOAD_S`` seconds, as loading weights does: the
    workload where a cluster run's actor mode (the model loaded once per actor) pays off."""

    def load(self) -> None:
        time.sleep(LOAD_S)

    def predict(self, obs):
        return policy(obs)


def batched_policy(obs: np.ndarray) -> np.ndarray:
    """``policy`` for ``[N, 4]`` observations at once."""
    return (obs[:, 0] < 0).astype(np.int64)


SHORT_EPISODES = {"shortest": 40, "longest": 119}  # many resets, and lanes that end unevenly


def make_short_episodes() -> gym.Env:
    """The env with episodes of 40 to 119 steps, as the process-lanes and served benchmarks
    run it (``rlmesh serve env cpu_heavy:make_short_episodes`` serves it)."""
    return gym.make(ENV_ID, **SHORT_EPISODES)


if "CpuHeavy-v0" not in gym.registry:
    gym.register("CpuHeavy-v0", entry_point=CpuHeavyEnv)
