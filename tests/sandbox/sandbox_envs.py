"""Envs the sandbox tests serve from a sandbox, by ``path/to/sandbox_envs.py:make_...``: each
runs in the sandbox's interpreter, so it imports nothing of the tests."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve()


class _OnReset(gym.Wrapper):
    """CartPole that does ``probe()`` before each reset."""

    def __init__(self, probe):
        super().__init__(gym.make("CartPole-v1"))
        self._probe = probe

    def reset(self, **kwargs):
        self._probe()
        return self.env.reset(**kwargs)


class _Drawn(gym.Wrapper):
    """CartPole whose ``render()`` draws its state with numpy (no pygame in a sandbox): the
    cart a column that moves with its position, the pole a row band that tilts with its
    angle, the step count in the top rows."""

    FRAME = (48, 80, 3)

    def __init__(self, render_mode=None):
        super().__init__(gym.make("CartPole-v1"))
        self._render_mode = render_mode
        self._steps = 0

    @property
    def render_mode(self):
        return self._render_mode

    def reset(self, **kwargs):
        self._steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self._steps += 1
        return self.env.step(action)

    def render(self):
        x, _, angle, _ = self.env.unwrapped.state
        frame = np.zeros(self.FRAME, np.uint8)
        column = int(np.clip((x + 2.4) / 4.8 * (self.FRAME[1] - 1), 0, self.FRAME[1] - 1))
        frame[8:, column, 0] = 255
        band = int(np.clip((angle + 0.21) / 0.42 * (self.FRAME[0] - 9), 0, self.FRAME[0] - 9))
        frame[8 + band, :, 1] = 200
        frame[: self._steps % 8, :, 2] = 255
        return frame


def make_drawn_cartpole(render_mode=None):
    """CartPole drawn by numpy in ``rgb_array`` mode (``_Drawn``)."""
    return _Drawn(render_mode)


def make_numpy1_cartpole():
    """CartPole, refusing to be built on any numpy but 1.x."""
    if not np.__version__.startswith("1."):
        raise RuntimeError(f"expected numpy 1.x in the env's environment, got {np.__version__}")
    return gym.make("CartPole-v1")


def make_connecting(port):
    """CartPole that opens a TCP connection to 127.0.0.1:``port`` before each reset."""

    def connect():
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(b"the env got out")

    return _OnReset(connect)


def make_writing(path):
    """CartPole that writes a file at ``path`` before each reset."""
    return _OnReset(lambda: Path(path).write_text("written by the env"))


class _Crashing(gym.Wrapper):
    def __init__(self, at_step):
        super().__init__(gym.make("CartPole-v1"))
        self._at_step = at_step
        self._steps = 0

    def step(self, action):
        self._steps += 1
        if self._steps == self._at_step:
            print(f"boom: the env crashes on purpose at step {self._steps}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        return self.env.step(action)


def make_crashing(at_step):
    """CartPole whose process exits (status 3, a line on stderr) at its ``at_step``-th step."""
    return _Crashing(at_step)


def make_sleeping(seconds):
    """CartPole built only after ``seconds`` (a server slow to start)."""
    import time

    time.sleep(seconds)
    return gym.make("CartPole-v1")
