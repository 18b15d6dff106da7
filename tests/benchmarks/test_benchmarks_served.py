"""The built-in benchmarks served (``rlmesh.serve_env`` / ``rlmesh serve env``): a served
benchmark env plays the episodes the local one plays, LIBERO's initial states (the trial index
crosses the wire) included."""

from __future__ import annotations

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import benchmarks


def pusher(obs):
    """A deterministic PushT policy that reads both leaves: episodes depend on every pixel."""
    offset = np.array([12.0, -7.0]) if obs["pixels"].mean() > 200 else np.array([-9.0, 5.0])
    return np.clip(obs["agent_pos"] + offset, 0, 512).astype(np.float32)


@pytest.mark.parametrize("core", CORES)
def test_a_served_pusht_plays_the_local_episodes(core):
    [task] = benchmarks.suite("pusht", episodes=5, max_episode_steps=12, seed=3)
    run = {**task.run_arguments(), "core": core}
    local = rlmesh.run(pusher, task.make_env(), num_envs=2, **run)
    with rlmesh.serve_env(task.make_env(), num_envs=2, core=core) as server:
        remote = rlmesh.run(pusher, server.address, **run)
    # pymunk gives one seed rewards that differ in their last bits from run to run.
    assert comparable(remote, reward_digits=9) == comparable(local, reward_digits=9)
    assert {episode.steps for episode in local.episodes} == {12}


class FirstFrames:
    """Keeps a digest of each episode's first observation, by episode seed."""

    def __init__(self):
        self.first = {}

    def __call__(self, observation, context):
        seed = context["episode_seed"]
        if seed is not None and context["predict_index"] == 0:
            parts = [observation[key].tobytes() for key in ("agentview", "eef_pos", "eef_quat")]
            self.first[seed] = hash(b"".join(parts))
        return np.zeros(7, np.float32)


@pytest.mark.benchmarks
@pytest.mark.parametrize("core", CORES)
def test_a_served_libero_task_starts_each_episode_from_the_local_initial_state(core):
    # Indices 0 and 50 start from state 0, 1 from state 1: the server's env gets the indices.
    [task] = benchmarks.suite("libero_goal", image_size=64, max_episode_steps=2, seed=4)[1:2]
    run = {**task.run_arguments(), "episodes": 51, "indices": [0, 1, 50], "core": core}
    local, served = FirstFrames(), FirstFrames()
    rlmesh.run(local, task.make_env(), **run)
    with rlmesh.serve_env(task.make_env(), core=core) as server:
        rlmesh.run(served, server.address, **run)
    assert served.first == local.first and len(local.first) == 3
