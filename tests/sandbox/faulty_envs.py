"""Envs whose ``step()`` or ``render()`` raise in some episodes, served from a sandbox by
``path/to/faulty_envs.py:make_faulty`` and built in-process for the runs they are compared
with: each imports nothing of the tests (it runs in the sandbox's interpreter)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve()


class _Faulty(gym.Wrapper):
    """CartPole whose ``fails`` (``"step"`` or ``"render"``) raises ``RuntimeError`` from step
    ``at_step`` of each episode reset with a seed divisible by ``modulo``; its ``render()``
    otherwise draws the step count and the cart's place with numpy (no pygame needed)."""

    FRAME = (16, 24, 3)

    def __init__(self, render_mode=None, fails="render", at_step=5, modulo=3):
        super().__init__(gym.make("CartPole-v1"))
        self._render_mode = render_mode
        self.fails, self.at_step, self.modulo = fails, at_step, modulo
        self.steps, self.doomed = 0, False

    @property
    def render_mode(self):
        return self._render_mode

    def reset(self, *, seed=None, options=None):
        self.steps, self.doomed = 0, seed is not None and seed % self.modulo == 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.fails == "step" and self.doomed and self.steps >= self.at_step:
            raise RuntimeError(f"the simulator diverged at step {self.steps}")
        return self.env.step(action)

    def render(self):
        if self.fails == "render" and self.doomed and self.steps >= self.at_step:
            raise RuntimeError(f"the renderer lost its context at step {self.steps}")
        frame = np.zeros(self.FRAME, np.uint8)
        frame[0, : self.steps % self.FRAME[1], 2] = 255
        width = self.FRAME[1] - 1
        x = float(self.env.unwrapped.state[0])
        frame[4:, int(np.clip((x + 2.4) / 4.8 * width, 0, width)), 0] = 255
        return frame


def make_faulty(render_mode=None, fails="render", at_step=5, modulo=3):
    """A ``_Faulty`` CartPole."""
    return _Faulty(render_mode, fails, at_step, modulo)
