"""A CPU-heavy env for the process-lanes benchmarks: about 1 ms of pure-Python work per step.

The work is a fixed number of integer LCG iterations (no time-based calibration, no NumPy
threads), so every step costs the same on a given machine and the episode is deterministic:
its observation carries the LCG state. Episodes last 40..119 steps (from the seed), so a
lockstep vector, which cannot pause a lane, runs surplus steps.

Module-level, so worker processes import it to build lanes from ``make_cpu_env``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

BURN_ITERATIONS = 5_000  # about 1 ms of one core on the benchmark machine


def burn(state: int, iterations: int = BURN_ITERATIONS) -> int:
    """``iterations`` steps of a 31-bit LCG from ``state``: deterministic CPU work."""
    for _ in range(iterations):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
    return state


class CpuHeavyEnv(gym.Env):
    """A 1-D walk whose every step burns ``BURN_ITERATIONS`` LCG iterations."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = spaces.Discrete(2)

    def _observation(self) -> np.ndarray:
        return np.array([self.position, self.t, self.state / 0x7FFFFFFF], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = int(self.np_random.integers(0, 0x7FFFFFFF))
        self.length = 40 + int(self.np_random.integers(0, 80))
        self.position, self.t = 0.0, 0
        return self._observation(), {}

    def step(self, action):
        self.state = burn(self.state)
        self.t += 1
        self.position += (1.0 if int(action) else -1.0) * (self.state % 7) / 7
        reward = -abs(self.position)
        return self._observation(), reward, False, self.t >= self.length, {}


def make_cpu_env() -> CpuHeavyEnv:
    return CpuHeavyEnv()


def cpu_policy(obs: np.ndarray) -> np.ndarray:
    """Batched: walk back toward 0."""
    return (obs[:, 0] < 0).astype(np.int64)
