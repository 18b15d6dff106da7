"""Envs and policies the digest tests share: module-level, so worker processes, a served env's
process and Ray workers import them by name.

- ``DictWalk``: a seeded walk toward a goal with a Dict observation (a float32 Box, a float64
  Box and a Discrete returned as a plain int, in an order other than the space's);
- ``make_cartpole(perturb=...)``: CartPole that, under a flag, changes one observation of one
  episode by the smallest float32 step (every field of the results stays the same);
- ``SeedIgnoringCartPole``: CartPole that ignores the seed it is reset with.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

CAPS = {"CartPole-v1": 120, "Pendulum-v1": 60, "dict": 40}


class DictWalk(gym.Env):
    """A point walking toward a goal: ``{"position", "goal", "mode"}`` observations, a Box push;
    terminated at the goal, truncated after 30 steps by the env itself."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "goal": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": spaces.Discrete(3),
                "position": spaces.Box(-5.0, 5.0, (2,), np.float64),
            }
        )
        self.action_space = spaces.Box(-0.2, 0.2, (2,), np.float32)

    def _observation(self):
        # Not the space's (sorted) key order: the digest must not depend on it.
        return {
            "position": self.position.copy(),
            "mode": int(self.t % 3),
            "goal": self.goal.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.position = self.np_random.uniform(-2, 2, 2)
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.position = self.position + np.asarray(action, dtype=np.float64)
        self.t += 1
        distance = float(np.linalg.norm(self.goal - self.position))
        terminated = distance < 0.05
        return self._observation(), -distance, terminated, self.t >= 30, {}


def make_dict_walk():
    return DictWalk()


def walk_policy(obs):
    """Push toward the goal, as hard as the action space allows."""
    return np.clip(obs["goal"] - obs["position"], -0.2, 0.2).astype(np.float32)


def cartpole_policy(obs):
    return int(obs[2] + 0.3 * obs[3] > 0)


def pendulum_policy(obs):
    return np.clip(np.array([-2.0 * obs[1] - 0.5 * obs[2]], dtype=np.float32), -2.0, 2.0)


# env key: (what rlmesh.run takes, the same env made in this process, the policy)
ENVS = {
    "CartPole-v1": ("CartPole-v1", lambda: gym.make("CartPole-v1"), cartpole_policy),
    "Pendulum-v1": ("Pendulum-v1", lambda: gym.make("Pendulum-v1"), pendulum_policy),
    "dict": (make_dict_walk, make_dict_walk, walk_policy),
}


class PerturbedCartPole(gym.Wrapper):
    """CartPole whose observation at step ``at_step`` of the episode reset with ``seed`` is
    nudged by one float32 ulp: too little for the policy, the reward or the episode's length
    to change, so only the digests can tell."""

    def __init__(self, env, *, seed, at_step):
        super().__init__(env)
        self.target_seed, self.at_step = seed, at_step
        self.perturbing, self.t = False, 0

    def reset(self, *, seed=None, options=None):
        self.perturbing, self.t = seed == self.target_seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        if self.perturbing and self.t == self.at_step:
            obs = obs.copy()
            obs[0] = np.nextafter(obs[0], np.float32(np.inf))
        return obs, reward, terminated, truncated, info


class CartPoleFactory:
    """A picklable factory of CartPole, perturbed at ``(seed, step)`` when ``perturb`` is
    given."""

    def __init__(self, perturb=None):
        self.perturb = perturb

    def __call__(self):
        env = gym.make("CartPole-v1")
        if self.perturb is None:
            return env
        seed, at_step = self.perturb
        return PerturbedCartPole(env, seed=seed, at_step=at_step)


class SeedIgnoringCartPole(gym.Wrapper):
    """CartPole that resets from fresh entropy whatever seed it is given."""

    def reset(self, *, seed=None, options=None):
        self.env.unwrapped._np_random = np.random.default_rng()
        return self.env.reset(options=options)


def make_seed_ignoring_cartpole():
    return SeedIgnoringCartPole(gym.make("CartPole-v1"))
