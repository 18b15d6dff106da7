"""Served models across implementations: the published rlmesh 0.1.0 serves a model and our
driver evaluates it, and we serve a model and the peer's client drives it. Results equal the
local run's, episode by episode."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import numpy as np
import pytest
import rlmesh
from servers import peer_python, served

PEER_POLICIES = """
import numpy as np
import rlmesh


class PerLane(rlmesh.numpy.Model):
    def predict(self, obs):
        return int(obs[2] > 0)


class Batched(rlmesh.numpy.Model):
    def predict_batch(self, obs):
        return (obs[:, 2] > 0).astype(np.int64)


class Chunks(rlmesh.numpy.Model):
    def predict_chunk_batch(self, obs, execution_horizon=1):
        first = (obs[:, 2] > 0).astype(np.int64)
        return np.stack([first, first, 1 - first, first, 1 - first], axis=1)
"""

PEER_DRIVER = """
import json, sys
import gymnasium as gym
import rlmesh

env = rlmesh.EnvServer(gym.make("CartPole-v1"), "127.0.0.1:0")
env.start()
seeds = [int(seed) for seed in sys.argv[2].split(",")]
result = rlmesh.run(rlmesh.RemoteModel(sys.argv[1]), env.address, seeds=seeds)
print(json.dumps([
    [e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated] for e in result.episodes
]))
env.shutdown()
"""


def pole_angle(obs):
    return int(obs[2] > 0)


class LocalChunks(rlmesh.Model):
    def predict_chunk_batch(self, obs, execution_horizon=1):
        first = (obs[:, 2] > 0).astype(np.int64)
        return np.stack([first, first, 1 - first, first, 1 - first], axis=1)


def peer_environment():
    """The peer's interpreter must not see this checkout (PYTHONPATH) or its settings."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rows(result):
    return [
        [e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated] for e in result.episodes
    ]


@pytest.fixture(scope="module")
def peer():
    return peer_python()


@pytest.fixture
def peer_serving(peer, tmp_path):
    """``peer_serving(name)``: the address of ``python -m rlmesh.serve peer_policies:name``
    (rlmesh 0.1.0) on RLMESH_ADDRESS; each stopped when the test ends."""
    (tmp_path / "peer_policies.py").write_text(PEER_POLICIES)
    stack = []

    def start(name):
        port = free_port()
        # The peer prints its bare host:port; print the address in the form served() reads.
        boot = (
            f"import runpy, sys; sys.path.insert(0, {str(tmp_path)!r}); "
            f"print('tcp://127.0.0.1:{port}', flush=True); "
            f"sys.argv = ['rlmesh.serve', 'peer_policies:{name}']; "
            f"runpy.run_module('rlmesh.serve', run_name='__main__')"
        )
        context = served(
            [peer, "-E", "-c", boot],
            env={"RLMESH_ADDRESS": f"127.0.0.1:{port}", "PYTHONPATH": ""},
        )
        address = context.__enter__()
        stack.append(context)
        return address

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)


@pytest.mark.parametrize(("name", "num_envs"), [("PerLane", 1), ("Batched", 1), ("Batched", 4)])
def test_our_driver_evaluates_a_model_the_peer_serves(peer_serving, name, num_envs):
    model = rlmesh.RemoteModel(peer_serving(name), connect_timeout=30)
    assert model.spec is None  # the peer sends no ModelSpec: the raw observation goes
    remote = rlmesh.run(model, "CartPole-v1", episodes=6, num_envs=num_envs, seed=5)
    local = rlmesh.run(pole_angle, "CartPole-v1", episodes=6, num_envs=num_envs, seed=5)
    assert rows(remote) == rows(local)


def test_our_driver_replays_the_chunks_of_a_peer_served_model(peer_serving):
    model = rlmesh.RemoteModel(peer_serving("Chunks"), connect_timeout=30)
    run = {"episodes": 6, "execution_horizon": 4, "seed": 2}
    remote = rlmesh.run(model, "CartPole-v1", **run)
    local = rlmesh.run(LocalChunks(), "CartPole-v1", **run)
    assert rows(remote) == rows(local)


def test_a_peer_served_model_answers_several_rows_with_one_frame(peer_serving):
    """A deviation of rlmesh 0.1.0 from its edition: for a predict of several rows it calls the
    chunk corner with execution_horizon=1 and answers actions[0] alone, whatever horizon
    ResolveAdapter pinned (a one-row predict gets its H frames). Our driver then re-plans
    those lanes every step, which stays correct, but the chunking the run asked for is lost."""
    frames_by_rows = set()

    class Recording(rlmesh.RemoteModel):
        def predict_chunk_batch(self, obs, execution_horizon=None, context=()):
            chunk = super().predict_chunk_batch(obs, execution_horizon, context)
            frames_by_rows.add((len(context) > 1, chunk.shape[1]))
            return chunk

    model = Recording(peer_serving("Chunks"), connect_timeout=30)
    result = rlmesh.run(model, "CartPole-v1", episodes=6, num_envs=4, execution_horizon=4)
    assert [episode.index for episode in result.episodes] == list(range(6))
    assert frames_by_rows == {(True, 1), (False, 4)}


def test_the_peer_drives_a_model_we_serve(peer, tmp_path):
    script = tmp_path / "peer_driver.py"
    script.write_text(PEER_DRIVER)
    seeds = [3, 14, 15, 92]
    with rlmesh.serve_model(pole_angle) as server:
        done = subprocess.run(
            [peer, "-E", str(script), server.address, ",".join(map(str, seeds))],
            capture_output=True,
            text=True,
            timeout=120,
            env=peer_environment(),
        )
        stats = server.stats()
    assert done.returncode == 0, done.stderr[-3000:]
    peer_rows = json.loads(done.stdout.strip().splitlines()[-1])
    local = rlmesh.run(pole_angle, "CartPole-v1", seeds=seeds)
    assert peer_rows == rows(local)
    assert stats.rows == local.total_steps
