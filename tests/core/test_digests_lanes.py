"""Episode digests across the lanes that step outside this process: worker processes (whole
rounds in the core, and pipelined groups) and a served env on loopback (``rlmesh serve env``
in its own process) give every episode the digests of the same episodes run in this process,
on both cores, for CartPole, Pendulum and a Dict observation."""

from __future__ import annotations

from pathlib import Path

import pytest
import rlmesh
from envs_for_digests import CAPS, ENVS
from servers import rlmesh_cli, served

HERE = Path(__file__).resolve().with_name("envs_for_digests.py")
SERVED = {"CartPole-v1": "CartPole-v1", "Pendulum-v1": "Pendulum-v1", "dict": f"{HERE}:DictWalk"}


def digests_of(result):
    return [(e.index, e.seed, e.reset_digest, e.trajectory_digest) for e in result.episodes]


def in_process(env_key: str, episodes: int) -> list:
    env, _, policy = ENVS[env_key]
    result = rlmesh.run(
        policy, env, episodes=episodes, seed=7, max_episode_steps=CAPS[env_key], core="rust"
    )
    assert all(e.reset_digest and e.trajectory_digest for e in result.episodes)
    return digests_of(result)


@pytest.mark.parametrize("env_key", sorted(ENVS))
@pytest.mark.parametrize("core", ["rust", "python"])
def test_worker_processes_give_the_digests_of_a_run_in_this_process(env_key, core):
    env, _, policy = ENVS[env_key]
    reference = in_process(env_key, 8)
    for pipeline in (False, True):
        result = rlmesh.run(
            policy, env, episodes=8, seed=7, max_episode_steps=CAPS[env_key], core=core,
            num_envs=4, workers=2, pipeline=pipeline,
        )  # fmt: skip
        assert digests_of(result) == reference, pipeline


@pytest.mark.parametrize("env_key", sorted(ENVS))
def test_a_served_env_gives_the_digests_of_a_run_in_this_process(env_key):
    _, _, policy = ENVS[env_key]
    reference = in_process(env_key, 6)
    with served(rlmesh_cli("serve", "env", SERVED[env_key], "--num-envs", "3")) as address:
        for core in ("rust", "python"):
            result = rlmesh.run(
                policy, address, episodes=6, seed=7, max_episode_steps=CAPS[env_key], core=core
            )
            assert digests_of(result) == reference, core
