"""Envs and models the remote env tests share, importable by a server process too
(``rlmesh serve env tests/remote/test_remote_env_cases.py:make_dict_env``), and checks of them."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import rlmesh
from gymnasium.utils.env_checker import check_env

HERE = __file__


def comparable_fields(result):
    """The per-episode fields a remote run must equal a local one in."""
    return [
        (e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated) for e in result.episodes
    ]


class DictObservationEnv(gym.Env):
    """A seeded walk with a Dict observation: a position Box and a mode Discrete; it ends when
    the walker leaves [-1, 1] (terminated) or after 40 steps (truncated)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "mode": gym.spaces.Discrete(3),
                "pos": gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(2)
        self._pos = np.zeros(2, np.float32)
        self._steps = 0

    def _observation(self):
        return {"mode": int(self._steps % 3), "pos": self._pos.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-0.5, 0.5, 2).astype(np.float32)
        self._steps = 0
        return self._observation(), {"start": float(self._pos[0])}

    def step(self, action):
        drift = self.np_random.normal(0.0, 0.15, 2).astype(np.float32)
        self._pos = np.clip(self._pos + drift + (0.05 if action else -0.05), -2, 2)
        self._steps += 1
        terminated = bool(np.abs(self._pos).max() > 1.0)
        truncated = self._steps >= 40
        info = {"is_success": bool(not terminated)} if terminated or truncated else {}
        return self._observation(), float(1.0 - abs(self._pos[0])), terminated, truncated, info


def make_dict_env() -> gym.Env:
    return DictObservationEnv()


def dict_policy(obs):
    return int(obs["pos"][0] < 0)


class DictActionEnv(DictObservationEnv):
    """The walk with a Dict action: the push, and a Box scaling it."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Dict(
            {"push": gym.spaces.Discrete(2), "scale": gym.spaces.Box(0.0, 2.0, (1,), np.float32)}
        )

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(int(action["push"]))
        return observation, reward * float(action["scale"][0]), terminated, truncated, info


def make_dict_action_env() -> gym.Env:
    return DictActionEnv()


def dict_action_policy(obs):
    return {"push": dict_policy(obs), "scale": np.array([0.5 + obs["mode"] / 2], np.float32)}


class CartPoleChunks(rlmesh.Model):
    """A chunk corner: the heuristic's action repeated, alternating inside the chunk."""

    calls = 0

    def predict_chunk(self, obs, execution_horizon):
        self.calls += 1
        first = int(obs[2] + 0.3 * obs[3] > 0)
        return np.array([first if k % 2 == 0 else 1 - first for k in range(execution_horizon)])


class CountingEnv(gym.Env):
    """CartPole that counts its resets and steps (shared across its instances via ``calls``)."""

    def __init__(self, calls: dict[str, int]) -> None:
        self._env = gym.make("CartPole-v1")
        self.observation_space = self._env.observation_space
        self.action_space = self._env.action_space
        self.calls = calls

    def reset(self, *, seed=None, options=None):
        self.calls["reset"] += 1
        return self._env.reset(seed=seed, options=options)

    def step(self, action):
        self.calls["step"] += 1
        return self._env.step(action)

    def close(self):
        self._env.close()


class HangingEnv(gym.Env):
    """CartPole whose step waits on ``release`` (at most 10 s) from step ``hang_after`` on."""

    def __init__(self, release: threading.Event, hang_after: int) -> None:
        self._env = gym.make("CartPole-v1")
        self.observation_space = self._env.observation_space
        self.action_space = self._env.action_space
        self.release = release
        self.hang_after = hang_after
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        return self._env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps > self.hang_after:
            self.release.wait(10)
        return self._env.step(action)


class RaisingEnv(gym.Env):
    """CartPole whose third step raises."""

    def __init__(self) -> None:
        self._env = gym.make("CartPole-v1")
        self.observation_space = self._env.observation_space
        self.action_space = self._env.action_space
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        return self._env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the simulator lost its state")
        return self._env.step(action)


def test_the_dict_env_is_a_valid_seeded_gymnasium_env():
    check_env(DictObservationEnv(), skip_render_check=True)
    first, second = DictObservationEnv(), DictObservationEnv()
    assert first.reset(seed=3)[0]["pos"].tolist() == second.reset(seed=3)[0]["pos"].tolist()
