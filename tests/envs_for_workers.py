"""Envs for process-lanes tests: module-level, so worker processes can import and build them.

Every env is seeded and deterministic. The faulty env misbehaves (exits, is killed, hangs) at a
chosen step of a chosen episode, at most once per marker file: it deletes the marker first,
so a restarted worker replaying the same episode carries on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictObservationEnv(gym.Env):
    """A point chasing a goal: a Dict observation (two Boxes and a Discrete), a Box action."""

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
        return {
            "goal": self.goal.copy(),
            "mode": int(self.t % 3),
            "position": self.position.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.position = self.np_random.uniform(-2, 2, 2)
        self.t = 0
        self.length = 10 + int(self.np_random.integers(0, 20))
        return self._observation(), {"start": self.position.tolist()}

    def step(self, action):
        self.t += 1
        noise = self.np_random.normal(0, 0.01, 2)
        self.position = np.clip(self.position + np.asarray(action, np.float64) + noise, -5, 5)
        distance = float(np.linalg.norm(self.position - self.goal))
        reached = distance < 0.1
        return (
            self._observation(),
            -distance,
            reached,
            self.t >= self.length,
            {"distance": distance, "is_success": reached},
        )


def dict_policy(obs):
    """Steps toward the goal, a little slower in mode 2."""
    direction = np.asarray(obs["goal"], np.float64) - obs["position"]
    scale = 0.1 if obs["mode"] == 2 else 0.2
    return np.clip(direction, -scale, scale).astype(np.float32)


class PixelEnv(gym.Env):
    """A 64x64x3 frame with a square that the action moves; uint8 pixels."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.action_space = spaces.Discrete(3)

    def _frame(self):
        frame = np.zeros((64, 64, 3), np.uint8)
        frame[..., 0] = self.background
        x, y = self.x, self.y
        frame[y : y + 8, x : x + 8, 1] = 255
        frame[:, :, 2] = (self.t * 7) % 256
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.background = int(self.np_random.integers(0, 200))
        self.x, self.y = (int(v) for v in self.np_random.integers(0, 56, 2))
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        self.x = int(np.clip(self.x + int(action) - 1, 0, 56))
        self.y = int((self.y + 1 + self.np_random.integers(0, 2)) % 56)
        reward = float(self.x) / 56.0
        return self._frame(), reward, self.x == 56, self.t >= 25, {}


def pixel_policy(obs):
    """Left, stay or right from the frame's mean green column."""
    green = obs[..., 1].astype(np.float64)
    columns = green.sum(axis=0)
    centre = float((columns * np.arange(64)).sum() / max(columns.sum(), 1.0))
    return int(centre * 3 // 64)


def make_cartpole():
    """A module-level factory: picklable, so workers can build lanes from it."""
    return gym.make("CartPole-v1")


def make_dict_env():
    return DictObservationEnv()


def make_pixel_env():
    return PixelEnv()


class SlowOnOddSeeds(gym.Wrapper):
    """CartPole whose steps take ``delay_s`` longer (asleep) in episodes with an odd seed: a
    worker that answers long after another."""

    def __init__(self, delay_s):
        super().__init__(gym.make("CartPole-v1"))
        self.delay_s, self.slow = delay_s, False

    def reset(self, *, seed=None, options=None):
        self.slow = seed is not None and seed % 2 == 1
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.slow:
            time.sleep(self.delay_s)
        return self.env.step(action)


def make_slow_on_odd_seeds(delay_s):
    """``SlowOnOddSeeds``; wrap in ``functools.partial`` to make a zero-argument factory."""
    return SlowOnOddSeeds(delay_s)


class LoggedSlowResets(gym.Wrapper):
    """CartPole whose resets of seed ``slow_seed`` sleep ``delay_s``, and which appends what
    it does (``reset-start``, ``reset-end``, ``step``) with ``time.monotonic()`` and its process
    id to files in ``log_dir``: a test reads which worker stepped while another reset."""

    def __init__(self, slow_seed, delay_s, log_dir):
        super().__init__(gym.make("CartPole-v1"))
        self.slow_seed, self.delay_s = slow_seed, delay_s
        self.log = Path(log_dir, f"{os.getpid()}-{id(self)}.log")

    def _note(self, what):
        with self.log.open("a") as log:
            log.write(f"{os.getpid()} {what} {time.monotonic()!r}\n")

    def reset(self, *, seed=None, options=None):
        if seed == self.slow_seed:
            self._note("reset-start")
            time.sleep(self.delay_s)
            self._note("reset-end")
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self._note("step")
        return self.env.step(action)


def make_logged_slow_resets(slow_seed, delay_s, log_dir):
    """``LoggedSlowResets``; wrap in ``functools.partial`` for a zero-argument factory."""
    return LoggedSlowResets(slow_seed, delay_s, log_dir)


class FaultyCartPole(gym.Wrapper):
    """CartPole that, at step ``at_step`` (0: its reset) of the episode seeded ``seed``, exits
    (``exit``), kills itself (``kill``), hangs (``hang``) or raises (``raise``), if ``marker``
    exists (it is deleted first) or always when ``marker`` is None. With ``pid_dir``, each env
    writes its process id there, so a test can check every worker is gone."""

    def __init__(self, mode, seed, at_step, marker=None, pid_dir=None):
        super().__init__(gym.make("CartPole-v1"))
        self.mode, self.fault_seed, self.at_step, self.marker = mode, seed, at_step, marker
        if pid_dir is not None:
            Path(pid_dir, str(os.getpid())).touch()

    def reset(self, *, seed=None, options=None):
        self.seed_value, self.t = seed, 0
        self._maybe_fail()
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        self._maybe_fail()
        return self.env.step(action)

    def _maybe_fail(self):
        """At step ``at_step`` (0: the reset) of the episode seeded ``fault_seed``."""
        if self.seed_value == self.fault_seed and self.t == self.at_step and self._armed():
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(600)
            if self.mode == "raise":
                raise RuntimeError(f"a fault at step {self.t}")

    def _armed(self):
        if self.marker is None:
            return True
        try:
            os.remove(self.marker)
        except FileNotFoundError:
            return False
        return True


def make_faulty(mode, seed, at_step, marker=None, pid_dir=None):
    """``FaultyCartPole``; wrap in ``functools.partial`` to make a zero-argument factory."""
    return FaultyCartPole(mode, seed, at_step, marker, pid_dir)


def make_recorded_cartpole(pid_dir):
    """CartPole whose process id is written to ``pid_dir`` (an orphan check's record)."""
    return FaultyCartPole("none", -1, -1, None, pid_dir)
