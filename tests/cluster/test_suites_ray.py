"""A suite on a real local Ray cluster (``cluster="ray"``): each task's run goes through
rlmesh.run's cluster path into the suite's one results file, equal to solo local runs."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import rlmesh  # noqa: E402
from helpers import CORES, comparable  # noqa: E402
from rlmesh.results import read_suite  # noqa: E402

TASKS = [
    rlmesh.Task("cartpole", "CartPole-v1", episodes=7, seed=4, max_episode_steps=40),
    rlmesh.Task(
        "pendulum", "Pendulum-v1", env_kwargs={"g": 12.0}, episodes=5, max_episode_steps=20
    ),
]


def policy(obs):
    """One deterministic policy for both tasks' observation spaces (the workers import it)."""
    if obs.shape == (4,):
        return int(obs[2] + 0.3 * obs[3] > 0)
    return np.clip(-0.5 * obs[2:3], -2.0, 2.0).astype(np.float32)


def episodes(run):
    return comparable(run, drop=("env_index", "task"))


@pytest.mark.parametrize("core", CORES)
def test_a_suite_on_ray_equals_solo_local_runs_and_resumes(core, tmp_path):
    path = tmp_path / "suite.jsonl"
    suite = rlmesh.run_suite(
        policy, TASKS, only=["cartpole"], core=core, num_envs=2, cluster="ray", workers=2,
        results_path=path,
    )  # fmt: skip
    assert suite["cartpole"].cluster is not None  # the task's run went through the cluster
    # The rest of the suite, resumed into the same file, on the cluster too.
    rest = rlmesh.run_suite(
        policy, TASKS, core=core, cluster="ray", workers=2, results_path=path, resume=True
    )
    _, on_file = read_suite(path)
    for task in TASKS:
        alone = rlmesh.run(policy, task.make_env(), core=core, **task.run_arguments())
        assert episodes(on_file[task.name]) == episodes(alone), task.name
        assert episodes(rest[task.name]) == episodes(alone), task.name
