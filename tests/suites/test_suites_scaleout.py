"""A suite whose tasks step their lanes in worker processes (``workers=``): each task's run
goes through rlmesh.run's process lanes, and its episodes equal a solo in-process run's."""

from __future__ import annotations

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.results import read_suite

TASKS = [
    rlmesh.Task("cartpole", "CartPole-v1", episodes=6, seed=2, max_episode_steps=50),
    rlmesh.Task(
        "pendulum", "Pendulum-v1", env_kwargs={"g": 12.0}, episodes=5, max_episode_steps=20
    ),
]


def policy(obs):
    """One deterministic policy for both tasks' observation spaces."""
    if obs.shape == (4,):
        return int(obs[2] + 0.3 * obs[3] > 0)
    return np.clip(-0.5 * obs[2:3], -2.0, 2.0).astype(np.float32)


def episodes(run):
    return comparable(run, drop=("env_index", "task"))


@pytest.mark.parametrize("core", CORES)
def test_a_suite_on_worker_processes_equals_solo_runs(core, tmp_path):
    path = tmp_path / "suite.jsonl"
    suite = rlmesh.run_suite(policy, TASKS, core=core, num_envs=4, workers=2, results_path=path)
    _, on_file = read_suite(path)
    for task in TASKS:
        alone = rlmesh.run(policy, task.make_env(), core=core, **task.run_arguments())
        assert episodes(suite[task.name]) == episodes(alone), task.name
        assert episodes(on_file[task.name]) == episodes(alone), task.name
