"""Sandboxed models (``rlmesh.sandbox.SandboxModel``): a policy served from a real server in
its own environment under bubblewrap, every episode compared with the same policy run in this
process; its lifecycle across runs, and the faults (a crash, a kill and a restart)."""

from __future__ import annotations

import os
import signal

import pytest
import rlmesh
from helpers import CORES, cartpole_policy, comparable
from rlmesh.sandbox import SandboxCrashedError, SandboxModel
from rlmesh.sandbox.bwrap import find_bwrap
from sandbox_policies import HERE as POLICIES

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

RUN = {"episodes": 5, "max_episode_steps": 60}


@pytest.mark.parametrize("core", CORES)
def test_a_sandboxed_model_plays_the_episodes_of_the_local_run(core):
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=3, core=core, **RUN)
    model = SandboxModel(f"{POLICIES}:heuristic", core=core)
    assert model.sandboxed and model.spec is None
    result = rlmesh.run(model, "CartPole-v1", num_envs=3, core=core, **RUN)
    assert comparable(result) == comparable(local)


def test_each_run_starts_the_server_and_its_end_stops_it():
    model = SandboxModel(f"{POLICIES}:heuristic")
    first = rlmesh.run(model, "CartPole-v1", **RUN)
    assert not model.running
    second = rlmesh.run(model, "CartPole-v1", **RUN)
    assert not model.running
    assert comparable(first) == comparable(second)


def test_a_crashed_policy_server_is_a_typed_error_with_its_output():
    model = SandboxModel(f"{POLICIES}:CrashingHeuristic")
    with pytest.raises(SandboxCrashedError) as caught:
        rlmesh.run(model, "CartPole-v1", **RUN)
    error = caught.value
    assert error.exit_code == 4
    assert any("boom: the policy crashes on purpose" in line for line in error.output)
    assert isinstance(error, rlmesh.RemoteError) and "restart=K" in str(error)
    assert not model.running


class KillModelAt(rlmesh.RunHooks):
    def __init__(self, model, index):
        self.model, self.index, self.killed = model, index, []

    def on_episode_end(self, result):
        if result.index == self.index and not self.killed:
            self.killed.append(self.model.pid)
            os.kill(self.model.pid, signal.SIGKILL)


@pytest.mark.parametrize("core", CORES)
def test_a_killed_policy_server_restarts_and_the_episodes_stay_the_same(core):
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, core=core, **RUN)
    model = SandboxModel(f"{POLICIES}:heuristic", restart=1, core=core)
    kill = KillModelAt(model, index=1)
    result = rlmesh.run(model, "CartPole-v1", num_envs=2, hooks=[kill], core=core, **RUN)
    assert kill.killed and model.restarts == 1
    assert comparable(result) == comparable(local)
