"""A model served in its own process (``rlmesh serve model``) and driven by ``rlmesh.run``:
per-episode results equal the in-process run's, on both cores."""

from __future__ import annotations

import contextlib
import doctest
import importlib
import importlib.util
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from servers import read_line, rlmesh_cli, served

POLICIES = '''
"""Deterministic policies served by the tests (each reads only its own row)."""
import numpy as np
import rlmesh
from rlmesh.adapters import ModelSpec, State


class CartPole(rlmesh.Model):
    def predict_batch(self, obs):  # [K, 4]
        return (obs[:, 2] > 0).astype(np.int64)


class Pendulum(rlmesh.Model):
    def predict_batch(self, obs):  # [K, 3] -> [K, 1]
        return np.clip(-2.0 * obs[:, 2:3] - obs[:, 0:1], -2.0, 2.0)


class Notes(rlmesh.Model):
    def predict_batch(self, obs):  # {"mode": [K], "note": K strings, "pos": [K, 2]}
        lengths = np.array([len(note) for note in obs["note"]], dtype=np.float64)
        score = obs["pos"][:, 0] + 0.1 * obs["mode"] - 0.01 * lengths
        return (score > 0).astype(np.int64)


class Chunks(rlmesh.Model):
    def predict_chunk_batch(self, obs, execution_horizon=1):  # [K, 5], more than H = 4
        first = (obs[:, 2] > 0).astype(np.int64)
        return np.stack([first, first, 1 - first, first, 1 - first], axis=1)


class Stacked(rlmesh.Model):
    spec = ModelSpec(input=State(None, stack=3))

    def predict_batch(self, obs):  # [K, 3, 4], oldest frame first
        velocity = obs[:, -1, 2] - obs[:, 0, 2]
        return (obs[:, -1, 2] + 2.0 * velocity > 0).astype(np.int64)
'''


class NotesEnv(gym.Env):
    """A Dict observation with a Box, a Discrete and a Text leaf; deterministic per seed."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "mode": gym.spaces.Discrete(3),
            "note": gym.spaces.Text(12),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.pos = (self.pos + (0.3 if action else -0.25) * np.array([1, -0.5], np.float32)).astype(
            np.float32
        )
        terminated = bool(abs(self.pos[0]) > 2.5)
        return self._obs(), float(self.pos[1]), terminated, self.t >= 30, {}

    def _obs(self):
        note = "ab" * (1 + self.t % 5)
        return {"pos": self.pos.copy(), "mode": int(self.t % 3), "note": note}


def load_policies(path):
    spec = importlib.util.spec_from_file_location("served_policies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "policies.py"
    path.write_text(POLICIES)
    return path


@pytest.fixture(scope="module")
def serving(policy_file):
    """``serving(name)``: the address of ``rlmesh serve model policies.py:name``, one process
    per policy for the whole module, all stopped at its end."""
    with contextlib.ExitStack() as stack:
        addresses = {}

        def address_of(name):
            if name not in addresses:
                argv = rlmesh_cli(
                    "serve", "model", f"{policy_file}:{name}", "--address", "127.0.0.1:0"
                )
                addresses[name] = stack.enter_context(served(argv))
            return addresses[name]

        yield address_of


def local_and_remote(serving, policy_file, name, env, core, **run):
    local_model = getattr(load_policies(policy_file), name)()
    local = rlmesh.run(local_model, env(), core=core, **run)
    remote = rlmesh.run(rlmesh.RemoteModel(serving(name)), env(), core=core, **run)
    return local, remote


def assert_same_episodes(local, remote):
    fields = ("index", "seed", "steps", "reward", "terminated", "truncated")
    assert [[getattr(e, f) for f in fields] for e in remote.episodes] == [
        [getattr(e, f) for f in fields] for e in local.episodes
    ]
    assert comparable(remote) == comparable(local)


CASES = {
    "cartpole": ("CartPole", lambda: "CartPole-v1", {"episodes": 6}),
    "pendulum": ("Pendulum", lambda: "Pendulum-v1", {"episodes": 3}),
    "dict": ("Notes", lambda: NotesEnv, {"episodes": 6}),
    "chunks-h4": ("Chunks", lambda: "CartPole-v1", {"episodes": 6, "execution_horizon": 4}),
    "stack3": ("Stacked", lambda: "CartPole-v1", {"episodes": 6}),
}


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_a_model_served_in_its_own_process_gives_the_local_results(
    serving, policy_file, case, num_envs, core
):
    name, env, run = CASES[case]
    local, remote = local_and_remote(
        serving, policy_file, name, env, core, num_envs=num_envs, seed=3, **run
    )
    assert len(local.episodes) == run["episodes"]
    assert_same_episodes(local, remote)


def test_eval_of_an_address_evaluates_the_served_model(serving, policy_file, tmp_path):
    address = serving("CartPole")
    common = ["--env", "CartPole-v1", "--episodes", "5", "--num-envs", "2", "--no-progress"]
    remote_out, local_out = tmp_path / "remote.jsonl", tmp_path / "local.jsonl"
    for policy, out in ((address, remote_out), (f"{policy_file}:CartPole", local_out)):
        done = subprocess.run(
            rlmesh_cli("eval", policy, *common, "--out", str(out)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    remote, local = rlmesh.read_results(remote_out), rlmesh.read_results(local_out)
    assert remote[0]["policy"] == address
    assert comparable_rows(remote[1]) == comparable_rows(local[1])


def comparable_rows(episodes):
    return [(e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated) for e in episodes]


def test_serve_model_stops_cleanly_on_sigterm(policy_file):
    import signal

    process = subprocess.Popen(
        rlmesh_cli("serve", "model", f"{policy_file}:CartPole", "--address", "127.0.0.1:0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = read_line(process)
        assert "tcp://127.0.0.1:" in line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        process.stdout.close()
        process.stderr.close()


def test_a_served_model_needs_a_policy_that_loads(tmp_path):
    done = subprocess.run(
        rlmesh_cli("serve", "model", f"{tmp_path}/missing.py:Policy"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no file" in done.stderr


@pytest.mark.parametrize(
    "module_name", ["rlmesh.remote.model_server", "rlmesh.remote.model_client"]
)
def test_docstring_examples_hold(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_import_rlmesh_does_not_import_grpc():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, rlmesh, rlmesh.cli; print('grpc' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr
