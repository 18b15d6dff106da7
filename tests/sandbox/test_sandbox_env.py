"""Sandboxed envs (``rlmesh.sandbox.SandboxEnv``): real servers in their own environments
under bubblewrap, driven by real runs, every episode compared with the same env run in this
process; the sandbox's walls (network, files), numpy 1.x beside numpy 2, and the faults (a
crash, a kill, a server that does not start, a missing bubblewrap, Ctrl-C)."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES, cartpole_policy, comparable
from rlmesh.sandbox import (
    SandboxEnv,
    SandboxEnvCrashedError,
    SandboxModel,
    SandboxStartError,
    SandboxUnavailableError,
    sandbox_python,
)
from rlmesh.sandbox.bwrap import find_bwrap
from sandbox_envs import HERE as ENVS
from sandbox_policies import HERE as POLICIES
from servers import read_line

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

RUN = {"episodes": 5, "max_episode_steps": 60}


def wobbly(obs):
    """A weak CartPole heuristic: episodes of different lengths, so lanes end apart."""
    return int(obs[2] > 0)


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("core", CORES)
def test_a_sandboxed_env_plays_the_episodes_of_the_local_run(core, num_envs):
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=num_envs, core=core, **RUN)
    env = SandboxEnv("CartPole-v1", num_envs=num_envs, core=core)
    sandboxed = rlmesh.run(cartpole_policy, env, core=core, **RUN)
    assert comparable(sandboxed) == comparable(local)
    assert env.sandboxed and env.num_lanes == num_envs and not env.running


def test_worker_processes_step_the_lanes_inside_the_sandbox():
    local = rlmesh.run(wobbly, "CartPole-v1", num_envs=4, **RUN)
    env = SandboxEnv("CartPole-v1", num_envs=4, workers=2)
    assert comparable(rlmesh.run(wobbly, env, **RUN)) == comparable(local)


def test_an_envs_keyword_arguments_reach_it_in_the_sandbox():
    heavy = functools.partial(gym.make, "Pendulum-v1", g=3.0)
    local = rlmesh.run(lambda obs: [0.5], heavy, **RUN)
    env = SandboxEnv("Pendulum-v1", g=3.0)
    assert comparable(rlmesh.run(lambda obs: [0.5], env, **RUN)) == comparable(local)
    plain = rlmesh.run(lambda obs: [0.5], "Pendulum-v1", **RUN)
    assert comparable(plain) != comparable(local)  # the argument changes the episodes


def test_a_built_in_benchmark_env_runs_from_its_own_packages():
    pytest.importorskip(
        "gym_pusht", reason="the pusht extra (gym-pusht) is not installed"
    )  # the local run this one is compared with
    from rlmesh import benchmarks
    from rlmesh.sandbox import extra_requirements

    task = benchmarks.suite("pusht", episodes=3, max_episode_steps=25)[0]

    def policy(obs):
        return obs["agent_pos"] + 30.0

    for num_envs in (1, 3):
        local = rlmesh.run(policy, task.make_env(), num_envs=num_envs, **task.run_arguments())
        env = SandboxEnv(
            task.env,
            packages=extra_requirements("pusht"),
            num_envs=num_envs,
            **task.env_kwargs,
        )
        sandboxed = rlmesh.run(policy, env, **task.run_arguments())
        # pymunk's contacts move the rewards' last bits from run to run (benchmarks/pusht.py).
        assert comparable(sandboxed, reward_digits=9) == comparable(local, reward_digits=9)


@pytest.fixture
def listener():
    """A TCP server on the host's loopback that accepts nothing by itself: what reached it
    waits in its queue."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


def reached(server):
    """What connections to ``server`` sent, those queued so far."""
    said = []
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return said
        with connection:
            connection.settimeout(5)
            said.append(connection.recv(100))


def test_the_sandbox_keeps_the_env_off_the_hosts_network(listener):
    port = listener.getsockname()[1]
    env = SandboxEnv(f"{ENVS}:make_connecting", port=port)
    with pytest.raises(rlmesh.EnvError) as caught:
        rlmesh.run(cartpole_policy, env, episodes=1)
    assert "ConnectionRefusedError" in str(caught.value)
    assert reached(listener) == []
    # The same env with the host's network reaches the server: the wall above was the sandbox.
    env = SandboxEnv(f"{ENVS}:make_connecting", port=port, network=True)
    rlmesh.run(cartpole_policy, env, episodes=1, max_episode_steps=3)
    assert reached(listener) == [b"the env got out"]


def test_the_sandbox_keeps_the_env_from_writing_outside_its_directory(tmp_path):
    home_file = Path.home() / f"rlmesh-sandbox-probe-{uuid.uuid4().hex}"
    try:
        env = SandboxEnv(f"{ENVS}:make_writing", path=str(home_file))
        with pytest.raises(rlmesh.EnvError) as caught:
            rlmesh.run(cartpole_policy, env, episodes=1)
        assert "Read-only file system" in str(caught.value)
        assert not home_file.exists()
    finally:
        home_file.unlink(missing_ok=True)
    # Without the sandbox the same env writes where it is told: the wall was the sandbox's.
    written = tmp_path / "written"
    env = SandboxEnv(f"{ENVS}:make_writing", path=str(written), sandbox=False)
    rlmesh.run(cartpole_policy, env, episodes=1, max_episode_steps=3)
    assert written.read_text() == "written by the env"


@pytest.mark.parametrize("core", CORES)
def test_an_env_on_numpy_1_and_a_model_on_numpy_2_in_one_run(core):
    env_python = sandbox_python(["numpy<2"])
    answer = subprocess.run(
        [env_python, "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert answer.stdout.startswith("1.") and np.__version__.startswith("2.")
    env = SandboxEnv(f"{ENVS}:make_numpy1_cartpole", packages=["numpy<2"], num_envs=2, core=core)
    model = SandboxModel(f"{POLICIES}:Numpy2Heuristic", python=sys.executable, core=core)
    result = rlmesh.run(model, env, core=core, **RUN)
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, core=core, **RUN)
    assert comparable(result) == comparable(local)


def test_a_crashed_server_is_a_typed_error_with_its_output():
    env = SandboxEnv(f"{ENVS}:make_crashing", at_step=130, num_envs=2)
    with pytest.raises(SandboxEnvCrashedError) as caught:
        rlmesh.run(cartpole_policy, env, **RUN)
    error = caught.value
    assert error.exit_code == 3
    assert any("boom: the env crashes on purpose at step 130" in line for line in error.output)
    assert "boom" in str(error) and "restart=K" in str(error)
    assert isinstance(error, rlmesh.RemoteError) and isinstance(error, rlmesh.EnvError)
    # Lane 0's env crashed in its third episode (index 4): the four before it are kept.
    assert [episode.index for episode in error.partial_result.episodes] == [0, 1, 2, 3]
    assert not env.running


class KillAt(rlmesh.RunHooks):
    """Kills the env's server (SIGKILL) once, when the episode of index ``index`` ends."""

    def __init__(self, env, index):
        self.env, self.index, self.killed = env, index, []

    def on_episode_end(self, result):
        if result.index == self.index and not self.killed:
            self.killed.append(self.env.pid)
            os.kill(self.env.pid, signal.SIGKILL)


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "isolated"])
@pytest.mark.parametrize("core", CORES)
def test_a_killed_server_restarts_and_the_episodes_stay_those_of_the_local_run(core, sandbox):
    local = rlmesh.run(wobbly, "CartPole-v1", num_envs=3, core=core, **RUN)
    env = SandboxEnv("CartPole-v1", num_envs=3, restart=1, sandbox=sandbox, core=core)
    kill = KillAt(env, index=1)  # while lanes 0 and 2 are inside their episodes
    result = rlmesh.run(wobbly, env, hooks=[kill], core=core, **RUN)
    assert kill.killed and env.restarts == 1
    assert comparable(result) == comparable(local)


def test_a_killed_server_without_restarts_is_a_typed_error():
    env = SandboxEnv("CartPole-v1", num_envs=3)
    kill = KillAt(env, index=1)
    with pytest.raises(SandboxEnvCrashedError) as caught:
        rlmesh.run(wobbly, env, hooks=[kill], **RUN)
    assert caught.value.exit_code == -signal.SIGKILL
    assert 1 in [episode.index for episode in caught.value.partial_result.episodes]


def test_a_run_that_records_env_failures_goes_on_with_a_new_server():
    env = SandboxEnv(f"{ENVS}:make_crashing", at_step=130, num_envs=2)
    result = rlmesh.run(cartpole_policy, env, on_error="record", **RUN)
    failed = [episode for episode in result.episodes if episode.error]
    assert [episode.index for episode in failed] == [4]
    assert "SandboxCrashedError" in failed[0].error and len(result.episodes) == 5


def test_a_closed_env_starts_no_new_server():
    # A run whose lanes another thread closed (a Ray actor being ended) rebuilds them after
    # the failure: that must not start a server the actor's end would leave behind.
    env = SandboxEnv("CartPole-v1", num_envs=2)
    env.reset(np.arange(2), seeds=[1, 2], trials=[0, 1])
    env.close()
    with pytest.raises(rlmesh.RemoteError, match="is closed: it starts no new server"):
        env.rebuild(np.arange(2))
    assert not env.running  # and the fixture checks that no run directory was made


def test_a_server_that_cannot_start_is_a_typed_error_with_its_output():
    with pytest.raises(SandboxStartError) as caught:
        SandboxEnv("no_such_module_for_rlmesh_tests:Env-v0")
    assert caught.value.exit_code == 2  # rlmesh serve's usage error
    assert any("no_such_module_for_rlmesh_tests" in line for line in caught.value.output)


def test_a_server_slower_than_its_start_timeout_is_stopped():
    with pytest.raises(SandboxStartError, match="did not listen within 1 s"):
        SandboxEnv(f"{ENVS}:make_sleeping", seconds=60, start_timeout=1)


def test_without_bubblewrap_a_sandbox_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it: no bwrap
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        SandboxEnv("CartPole-v1")
    # sandbox=False runs the same isolated interpreter without the namespaces.
    env = SandboxEnv("CartPole-v1", num_envs=2, sandbox=False)
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, **RUN)
    assert comparable(rlmesh.run(cartpole_policy, env, **RUN)) == comparable(local)


INTERRUPTED = """
import sys, rlmesh
from rlmesh.sandbox import SandboxEnv

class Announce(rlmesh.RunHooks):
    def on_episode_end(self, result):
        print("episode", result.index, flush=True)

env = SandboxEnv("CartPole-v1", num_envs=2)
print("server", env.pid, flush=True)
rlmesh.run(lambda obs: int(obs[2] > 0), env, episodes=1_000_000, hooks=[Announce()])
"""


def test_ctrl_c_stops_the_server_and_leaves_nothing():
    run = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server = int(read_line(run, timeout=120).split()[1])
        assert read_line(run, timeout=60).startswith("episode")
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode != 0 and "KeyboardInterrupt" in stderr
    assert not Path(f"/proc/{server}").exists()
