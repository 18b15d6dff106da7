"""Role tags that travel with the env: from a served env's contract (ours and rlmesh 0.1.0's,
both ways), from worker processes' envs, and to a Ray cluster's workers. Each run equals the
local run given the same tags."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh import adapters
from servers import peer_python, rlmesh_cli, served
from test_adapters_v1_libero import TAGS, LiberoLike, RoleModel

pytest.importorskip("grpc")

# Pendulum's [cos, sin, velocity] as joint state; its torque in [-2, 2] as one actuator.
PENDULUM_TAGS = adapters.EnvTags(
    observation=adapters.StateTag(adapters.JOINT_POS),
    action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-2, 2))),
)


class DampingModel(rlmesh.Model):
    """Pushes against the pendulum's velocity, in its own [-1, 1] action range."""

    spec = adapters.ModelSpec(
        input={"state": adapters.State(adapters.JOINT_POS)},
        output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1))),
    )

    def predict_batch(self, payload):
        return np.clip(-0.3 * payload["state"][:, 2:3], -1, 1).astype(np.float32)


class UntaggedLibero(LiberoLike):
    """The LIBERO-like env without tags in its metadata: they come from elsewhere."""

    def __init__(self):
        self.metadata = {}


def _pendulum_run(env, core, **options):
    options = {"episodes": 4, "seed": 2, "max_episode_steps": 40, "core": core, **options}
    return rlmesh.run(DampingModel(), env, **options)


def _libero_run(env, core, **options):
    options = {"episodes": 4, "seed": 3, "max_episode_steps": 10, "core": core, **options}
    return rlmesh.run(RoleModel(), env, **options)


@pytest.mark.parametrize("core", CORES)
def test_a_served_env_publishes_the_tags_in_its_metadata(core):
    with rlmesh.serve_env(LiberoLike, num_envs=2) as server:
        remote = _libero_run(server.address, core)
    local = _libero_run(UntaggedLibero, core, env_tags=TAGS, num_envs=2)
    assert comparable(remote) == comparable(local)
    assert [episode.index for episode in remote.episodes] == list(range(4))


@pytest.mark.parametrize("core", CORES)
def test_serve_env_tags_an_untagged_env(core):
    with rlmesh.serve_env("Pendulum-v1", env_tags=PENDULUM_TAGS.to_json()) as server:
        remote = _pendulum_run(server.address, core)
    assert comparable(remote) == comparable(
        _pendulum_run("Pendulum-v1", core, env_tags=PENDULUM_TAGS)
    )


def test_serve_env_refuses_tags_that_are_not_tags():
    with pytest.raises(adapters.SpecError, match=r"serve_env\(env_tags=...\)"):
        rlmesh.serve_env("Pendulum-v1", env_tags={"observation": 3})


def test_an_untagged_served_env_names_the_roles_no_key_provides():
    with rlmesh.serve_env("Pendulum-v1") as server, pytest.raises(adapters.SpecError) as error:
        _pendulum_run(server.address, "python")
    assert "the env has no tags" in str(error.value)
    assert "proprio/joint_pos" in str(error.value)


def test_rlmesh_serve_env_publishes_a_tags_file(tmp_path):
    tags_file = tmp_path / "tags.json"
    tags_file.write_text(PENDULUM_TAGS.to_json())
    with served(rlmesh_cli("serve", "env", "Pendulum-v1", "--tags", str(tags_file))) as address:
        remote = _pendulum_run(address, "rust")
    assert comparable(remote) == comparable(
        _pendulum_run("Pendulum-v1", "rust", env_tags=PENDULUM_TAGS)
    )


def test_rlmesh_serve_env_refuses_a_bad_tags_file(tmp_path):
    tags_file = tmp_path / "tags.json"
    tags_file.write_text('{"observation": 3}')
    process = subprocess.run(
        rlmesh_cli("serve", "env", "Pendulum-v1", "--tags", str(tags_file)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 2
    assert f"--tags {tags_file}" in process.stderr


@pytest.mark.parametrize("core", CORES)
def test_worker_processes_send_their_envs_tags(core):
    in_workers = _libero_run(LiberoLike, core, num_envs=2, workers=2)
    assert comparable(in_workers) == comparable(_libero_run(LiberoLike, core))


# ------------------------------------------------------------------ rlmesh 0.1.0, both ways

PEER_SERVES_TAGGED = """
import json, sys
import gymnasium as gym
import rlmesh
from rlmesh.adapters import EnvTags

tags = EnvTags.from_dict(json.loads(sys.argv[1]))
server = rlmesh.EnvServer(gym.make("Pendulum-v1"), "127.0.0.1:0", tags=tags)
server.start()
print(server.address, flush=True)
server.wait()
"""

PEER_READS_TAGS = """
import json, sys
from rlmesh.adapters import EnvTags
from rlmesh.numpy import RemoteEnv

env = RemoteEnv(sys.argv[1])
print(json.dumps(EnvTags.from_metadata(env.metadata).to_dict()))
env.close()
"""

PEER_ENVIRONMENT = {"PYTHONPATH": ""}  # the peer's own package, not this checkout's


@pytest.mark.parametrize("core", CORES)
def test_our_run_resolves_the_tags_of_the_peers_served_env(tmp_path, core):
    script = tmp_path / "serves.py"
    script.write_text(PEER_SERVES_TAGGED)
    argv = [peer_python(), str(script), PENDULUM_TAGS.to_json()]
    with served(argv, env=PEER_ENVIRONMENT) as address:
        remote = _pendulum_run(address, core)
    assert comparable(remote) == comparable(
        _pendulum_run("Pendulum-v1", core, env_tags=PENDULUM_TAGS)
    )


def test_the_peer_reads_the_tags_our_server_publishes(tmp_path):
    script = tmp_path / "reads.py"
    script.write_text(PEER_READS_TAGS)
    with rlmesh.serve_env("Pendulum-v1", env_tags=PENDULUM_TAGS) as server:
        read = subprocess.run(
            [peer_python(), str(script), server.address],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **PEER_ENVIRONMENT},
        )
    assert read.returncode == 0, read.stderr
    assert adapters.EnvTags.from_dict(json.loads(read.stdout)) == PENDULUM_TAGS
