"""Policies and envs the Ray workers of tests/cluster/test_cluster_ray.py import by name.

The workers import this module as the tests do (the coordinator sends its import path along),
so everything here is module-level and picklable by reference.
"""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import rlmesh


def balance(obs):
    """CartPole: push toward the side the pole falls to."""
    return int(obs[2] + 0.3 * obs[3] > 0)


def slow_balance(obs):
    """``balance``, taking a millisecond a step, as a policy on a GPU might."""
    time.sleep(0.001)
    return balance(obs)


class BalanceChunks(rlmesh.Model):
    """CartPole in chunks: the heuristic's action, then its alternation, H actions a call."""

    def predict_chunk(self, obs, execution_horizon):
        first = balance(obs)
        return np.array([first ^ (k % 2) for k in range(execution_horizon)], dtype=np.int64)


def swing(obs):
    """Pendulum: a torque against the angular velocity and the angle's sine."""
    return np.clip(np.array([-2.0 * obs[1] - 0.5 * obs[2]], dtype=np.float32), -2.0, 2.0)


class SwingChunks(rlmesh.Model):
    """Pendulum in chunks, batched: the torque, then decaying copies of it."""

    def predict_chunk_batch(self, obs, execution_horizon):  # obs: [N, 3] -> [N, H, 1]
        torque = np.clip(-2.0 * obs[:, 1] - 0.5 * obs[:, 2], -2.0, 2.0).astype(np.float32)
        decay = 0.5 ** np.arange(execution_horizon, dtype=np.float32)
        return (torque[:, None] * decay[None, :])[:, :, None]


class KillsItsWorker(gym.Wrapper):
    """Kills its own process (SIGKILL: no cleanup, as a crashed node) at step ``at_step`` of
    the episode reset with ``seed``: once, if ``marker`` is given (the first process to create
    that file dies), else every time that episode runs."""

    def __init__(self, env, *, seed, at_step, marker):
        super().__init__(env)
        self.target_seed, self.at_step, self.marker = seed, at_step, marker
        self.doomed, self.steps = False, 0

    def reset(self, *, seed=None, options=None):
        self.doomed, self.steps = seed == self.target_seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.doomed and self.steps == self.at_step and self._claim():
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)

    def _claim(self):
        if self.marker is None:
            return True
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


class KillingFactory:
    """Makes ``env_id`` envs wrapped in ``KillsItsWorker``: a picklable env factory."""

    def __init__(self, env_id, *, seed, at_step=20, marker=None):
        self.env_id, self.seed, self.at_step, self.marker = env_id, seed, at_step, marker

    def __call__(self):
        return KillsItsWorker(
            gym.make(self.env_id), seed=self.seed, at_step=self.at_step, marker=self.marker
        )


class CountsItsLifecycle(rlmesh.Model):
    """``balance``, whose ``load`` and ``close`` each append a line to the file ``log``
    (``load PID`` / ``close PID``): how often each worker process loaded and closed it."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def load(self):
        self._note("load")

    def close(self):
        self._note("close")

    def predict(self, obs):
        return balance(obs)

    def _note(self, what):
        with open(self.log, "a") as log:
            log.write(f"{what} {os.getpid()}\n")


def lifecycle_of(log):
    """What ``CountsItsLifecycle`` wrote to ``log``: each process's calls, in order."""
    calls = {}
    with open(log) as lines:
        for line in lines:
            what, pid = line.split()
            calls.setdefault(int(pid), []).append(what)
    return calls


class FailsToClose(rlmesh.Model):
    """``balance``, whose ``close`` raises."""

    def predict(self, obs):
        return balance(obs)

    def close(self):
        raise RuntimeError("the weights would not unload")
