"""Interop with the published rlmesh 0.1.0 (in its own venv): its EnvServer driven by our
rlmesh.run, and our env server stepped by its RemoteEnv, each equal to a local env."""

from __future__ import annotations

import json
import os
import subprocess

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, cartpole_policy
from servers import peer_python, rlmesh_cli, served
from test_remote_env_cases import comparable_fields

pytest.importorskip("grpc")

# The peer's own package, not this checkout's (which PYTHONPATH may point at).
PEER_ENVIRONMENT = {"PYTHONPATH": ""}

PEER_SERVES = """
import sys
import gymnasium as gym
import rlmesh

width = int(sys.argv[2])
if width == 1:
    env = gym.make(sys.argv[1])
else:
    env = gym.vector.SyncVectorEnv([lambda: gym.make(sys.argv[1]) for _ in range(width)])
server = rlmesh.EnvServer(env, "127.0.0.1:0")
server.start()
print(server.address, flush=True)
server.wait()
"""

PEER_STEPS = """
import json, sys
from rlmesh.numpy import RemoteEnv

address, seed, actions = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
env = RemoteEnv(address)
observation, _ = env.reset(seed=seed)
steps = [{"observation": observation.tolist()}]
for action in actions:
    observation, reward, terminated, truncated, _ = env.step(action)
    steps.append({
        "observation": observation.tolist(),
        "reward": float(reward),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
    })
    if terminated or truncated:
        break
env.close()
print(json.dumps(steps))
"""


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("peer")
    (directory / "serves.py").write_text(PEER_SERVES)
    (directory / "steps.py").write_text(PEER_STEPS)
    return peer_python(), directory


@pytest.fixture(scope="module")
def peer_cartpole(peer):
    python, directory = peer
    argv = [python, str(directory / "serves.py"), "CartPole-v1", "1"]
    with served(argv, env=PEER_ENVIRONMENT) as address:
        yield address


@pytest.mark.parametrize("core", CORES)
def test_our_run_on_the_peers_env_server_equals_the_local_run(peer_cartpole, core):
    options = {"episodes": 4, "seed": 9, "max_episode_steps": 150}
    remote = rlmesh.run(cartpole_policy, peer_cartpole, core=core, **options)
    local = rlmesh.run(cartpole_policy, "CartPole-v1", **options)
    assert comparable_fields(remote) == comparable_fields(local)


def test_the_peers_lockstep_vector_server_is_refused_saying_what_to_serve(peer):
    python, directory = peer
    argv = [python, str(directory / "serves.py"), "CartPole-v1", "4"]
    refused = pytest.raises(rlmesh.RemoteError, match="rlmesh serve env ID --num-envs 4")
    with served(argv, env=PEER_ENVIRONMENT) as address, refused:
        rlmesh.RemoteEnv(address)


def _local_trajectory(env_id: str, seed: int, actions: list) -> list[dict]:
    env = gym.make(env_id)
    observation, _ = env.reset(seed=seed)
    steps = [{"observation": observation.tolist()}]
    for action in actions:
        # The wire delivers an action at the space's dtype (edition 2026.06), so does this.
        action = np.asarray(action, dtype=env.action_space.dtype)
        observation, reward, terminated, truncated, _ = env.step(action)
        steps.append(
            {
                "observation": observation.tolist(),
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            }
        )
        if terminated or truncated:
            break
    env.close()
    return steps


@pytest.mark.parametrize(
    ("env_id", "actions"),
    [
        ("CartPole-v1", [1, 1, 0, 1, 1, 1, 0, 1] * 8),  # ends (terminated) on the way
        ("Pendulum-v1", [[0.5], [-1.5], [2.0], [0.0]] * 5),
    ],
)
def test_the_peers_remote_env_steps_our_server_as_a_local_env(peer, env_id, actions):
    python, directory = peer
    with served(rlmesh_cli("serve", "env", env_id)) as address:
        done = subprocess.run(
            [python, str(directory / "steps.py"), address, "17", json.dumps(actions)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **PEER_ENVIRONMENT},
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == _local_trajectory(env_id, 17, actions)
