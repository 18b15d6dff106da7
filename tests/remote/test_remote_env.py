"""A served env driven by rlmesh.run: the env server in its own process (``rlmesh serve env``),
the driver here, and every episode equal to the in-process run; then the faults (a server
that dies, a resumed run against a restarted one, a hung server, closing)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
import rlmesh
from envs_for_workers import make_recorded_cartpole
from helpers import CORES, cartpole_policy
from rlmesh.errors import ResultsFileError
from rlmesh.remote.address import parse_address
from rlmesh.utils import env_label
from servers import read_address, read_line, rlmesh_cli, served, stop
from test_process_lanes_faults import leftovers, recorded_pids, session_processes, still_alive
from test_remote_env_cases import (
    HERE,
    CartPoleChunks,
    HangingEnv,
    RaisingEnv,
    comparable_fields,
    dict_action_policy,
    dict_policy,
    make_dict_action_env,
    make_dict_env,
)

pytest.importorskip("grpc")

CASES = {
    # name: (ID_OR_FACTORY for the server, the same env in-process, policy, run options)
    "cartpole": ("CartPole-v1", "CartPole-v1", cartpole_policy, {"max_episode_steps": 120}),
    "pendulum": ("Pendulum-v1", "Pendulum-v1", lambda obs: [obs[2]], {"max_episode_steps": 60}),
    "dict": (f"{HERE}:make_dict_env", make_dict_env, dict_policy, {}),
    "dict action": (f"{HERE}:make_dict_action_env", make_dict_action_env, dict_action_policy, {}),
}


@pytest.fixture(scope="module", params=[(case, n) for case in CASES for n in (1, 4)], ids=str)
def server(request):
    """One ``rlmesh serve env`` process per env and width, shared by the tests of both cores."""
    case, num_envs = request.param
    target = CASES[case][0]
    with served(rlmesh_cli("serve", "env", target, "--num-envs", str(num_envs))) as address:
        yield case, num_envs, address


@pytest.mark.parametrize("core", CORES)
def test_every_episode_equals_the_in_process_run(server, core):
    case, num_envs, address = server
    _, local_env, policy, options = CASES[case]
    remote = rlmesh.run(policy, address, episodes=7, seed=11, core=core, **options)
    local = rlmesh.run(policy, local_env, episodes=7, seed=11, num_envs=num_envs, **options)
    assert comparable_fields(remote) == comparable_fields(local)
    assert [e.env_index for e in remote.episodes] == [e.env_index for e in local.episodes]
    assert [e.success for e in remote.episodes] == [e.success for e in local.episodes]


@pytest.mark.parametrize("core", CORES)
def test_chunks_replayed_on_the_driver_equal_the_in_process_run(core):
    options = {"episodes": 6, "seed": 5, "execution_horizon": 4, "max_episode_steps": 90}
    model = CartPoleChunks()
    with served(rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "4")) as address:
        remote = rlmesh.run(model, address, core=core, **options)
    local = rlmesh.run(CartPoleChunks(), "CartPole-v1", num_envs=4, **options)
    assert comparable_fields(remote) == comparable_fields(local)
    steps = sum(episode.steps for episode in remote.episodes)
    assert model.calls * 2 < steps  # chunks were replayed: far fewer calls than steps


def test_the_printed_line_names_the_env_its_lanes_and_the_bound_address():
    argv = rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "3")
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        line = read_line(process)
        assert line.startswith("rlmesh: serving CartPole-v1 (3 lanes) at tcp://127.0.0.1:")
        assert not line.strip().endswith(":0")
        process.terminate()  # SIGTERM: a clean exit
        assert process.wait(timeout=20) == 0
    finally:
        stop(process)


def test_a_width_that_differs_from_the_servers_is_refused_naming_both():
    with rlmesh.serve_env("CartPole-v1", num_envs=2) as server:
        with pytest.raises(ValueError, match=r"has 2 lane\(s\), but num_envs=3"):
            rlmesh.run(cartpole_policy, server.address, episodes=2, num_envs=3)
        result = rlmesh.run(cartpole_policy, server.address, episodes=2, num_envs=2)
    assert result.num_episodes == 2


# ------------------------------------------------------------------------------ workers


@pytest.mark.parametrize("case", ["cartpole", "dict", "dict action"])
@pytest.mark.parametrize("core", CORES)
def test_a_server_stepping_in_worker_processes_serves_the_in_process_runs_episodes(case, core):
    target, local_env, policy, options = CASES[case]
    argv = rlmesh_cli("serve", "env", target, "--num-envs", "4", "--workers", "2")
    with served(argv) as address:
        remote = rlmesh.run(policy, address, episodes=9, seed=3, core=core, **options)
    local = rlmesh.run(policy, local_env, episodes=9, seed=3, num_envs=4, **options)
    assert comparable_fields(remote) == comparable_fields(local)
    assert [e.env_index for e in remote.episodes] == [e.env_index for e in local.episodes]


def test_closing_a_server_with_workers_stops_them_and_frees_their_shared_memory(tmp_path):
    factory = functools.partial(make_recorded_cartpole, str(tmp_path))
    with rlmesh.serve_env(factory, num_envs=4, workers=2) as server:
        result = rlmesh.run(cartpole_policy, server.address, episodes=4, max_episode_steps=20)
        assert result.num_episodes == 4
        workers = recorded_pids(tmp_path)
        assert len(workers) == 2 and still_alive(workers, within_s=0) == workers
        assert leftovers()
    assert not still_alive(workers)
    assert not leftovers()


def test_ctrl_c_stops_a_server_with_workers_leaving_no_process_or_shared_memory():
    argv = rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "4", "--workers", "2")
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        line = read_line(process)
        assert "(4 lanes in 2 worker processes) at tcp://127.0.0.1:" in line, line
        address = line.split(" at ")[-1].strip()
        result = rlmesh.run(cartpole_policy, address, episodes=4, max_episode_steps=50)
        assert result.num_episodes == 4
        # the server, its 2 workers, and the start method's server process
        assert len(session_processes(process.pid)) >= 3
        assert leftovers(process.pid)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)
    assert not still_alive(session_processes(process.pid))
    assert not leftovers(process.pid)


def test_workers_below_one_is_a_usage_error():
    done = subprocess.run(
        rlmesh_cli("serve", "env", "CartPole-v1", "--workers", "0"), capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--workers" in done.stderr
    with pytest.raises(ValueError, match="workers"):
        rlmesh.serve_env("CartPole-v1", workers=0)


def test_a_bad_factory_is_a_one_line_usage_error(tmp_path):
    done = subprocess.run(
        rlmesh_cli("serve", "env", f"{HERE}:no_such_factory"), capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no_such_factory" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ faults


class KillAfter(rlmesh.RunHooks):
    """Kills the server process once ``count`` episodes have completed."""

    def __init__(self, process: subprocess.Popen, count: int) -> None:
        self.process, self.count, self.seen = process, count, 0

    def on_episode_end(self, result):
        self.seen += 1
        if self.seen == self.count:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=20)


def _server_process(address: str) -> tuple[subprocess.Popen, str]:
    argv = rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "2", "--address", address)
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    return process, read_address(process, 60.0)


@pytest.fixture
def socket_address():
    # A unix socket keeps the address (and so the results file's env) across a restart.
    with tempfile.TemporaryDirectory(prefix="rlmesh-") as directory:
        yield f"unix://{directory}/env.sock"


@pytest.mark.parametrize("core", CORES)
def test_a_server_that_dies_mid_run_raises_naming_it_and_resume_finishes_the_run(
    core, socket_address, tmp_path
):
    results = tmp_path / "results.jsonl"
    options = {"episodes": 8, "seed": 2, "max_episode_steps": 80, "core": core}
    process, address = _server_process(socket_address)
    try:
        with pytest.raises(rlmesh.RemoteError) as caught:
            rlmesh.run(
                cartpole_policy,
                address,
                hooks=KillAfter(process, 3),
                results_path=results,
                **options,
            )
    finally:
        stop(process)
    err = caught.value
    assert err.address == address and address in str(err)
    kept = err.partial_result.episodes
    assert len(kept) >= 3 and len(kept) < 8
    assert len(rlmesh.read_results(results)[1]) == len(kept)

    process, address = _server_process(socket_address)  # restarted, same address
    try:
        resumed = rlmesh.run(cartpole_policy, address, results_path=results, resume=True, **options)
    finally:
        stop(process)
    uninterrupted = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, **options)
    assert comparable_fields(resumed) == comparable_fields(uninterrupted)


@pytest.mark.parametrize("core", CORES)
def test_a_run_resumes_on_the_same_server_however_its_address_is_spelled(core, tmp_path):
    results = tmp_path / "results.jsonl"
    options = {"episodes": 6, "seed": 4, "max_episode_steps": 60, "core": core}
    with served(rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "2")) as address:
        assert address.startswith("tcp://")
        bare = address.removeprefix("tcp://")
        rlmesh.run(cartpole_policy, bare, results_path=results, indices=[0, 1, 2], **options)
        resumed = rlmesh.run(cartpole_policy, address, results_path=results, resume=True, **options)
    header = json.loads(results.read_text().splitlines()[0])
    assert header["env"] == address  # the canonical spelling, whichever was passed
    uninterrupted = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, **options)
    assert comparable_fields(resumed) == comparable_fields(uninterrupted)


def test_a_file_whose_header_spells_the_address_otherwise_resumes(tmp_path):
    """A file whose header holds another spelling of the address (as files written before the
    canonical spelling do) resumes on the same server; another server is still refused."""
    results = tmp_path / "results.jsonl"
    options = {"episodes": 4, "seed": 2, "max_episode_steps": 40}
    with served(rlmesh_cli("serve", "env", "CartPole-v1", "--num-envs", "2")) as address:
        rlmesh.run(cartpole_policy, address, results_path=results, indices=[0, 1], **options)
        lines = results.read_text().splitlines(keepends=True)
        header = json.loads(lines[0])
        header["env"] = address.removeprefix("tcp://")
        results.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
        other = address.rsplit(":", 1)[0] + ":1"
        with pytest.raises(ResultsFileError, match="holds another run than this one: env"):
            rlmesh.run(cartpole_policy, other, results_path=results, resume=True, **options)
        resumed = rlmesh.run(cartpole_policy, address, results_path=results, resume=True, **options)
    assert [episode.index for episode in resumed.episodes] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("spellings", "label"),
    [
        (["127.0.0.1:7000", "tcp://127.0.0.1:7000"], "tcp://127.0.0.1:7000"),
        (["localhost:0", "tcp://localhost:0"], "tcp://localhost:0"),
        (["[::1]:7000", "tcp://[::1]:7000"], "tcp://[::1]:7000"),
        (["unix:///tmp/env.sock", "unix:/tmp/env.sock"], "unix:///tmp/env.sock"),
        (["unix:env.sock"], "unix:env.sock"),
    ],
)
def test_an_address_has_one_label_however_it_is_spelled(spellings, label):
    for spelling in spellings:
        assert env_label(spelling) == label == str(parse_address(spelling))


def test_a_gymnasium_id_or_an_address_that_does_not_parse_is_labelled_as_given():
    assert env_label("CartPole-v1") == "CartPole-v1"
    assert env_label("ale_py:Pong-v5") == "ale_py:Pong-v5"
    assert env_label("tcp://no-port") == "tcp://no-port"


@pytest.fixture
def hanging_server():
    release = threading.Event()
    server = rlmesh.serve_env(lambda: HangingEnv(release, hang_after=5))
    try:
        yield server
    finally:
        release.set()
        server.close()


def test_a_hung_server_hits_the_runs_step_timeout(hanging_server):
    started = time.monotonic()
    with pytest.raises(rlmesh.OperationTimeout, match=r"env\.step took longer than its 0\.3 s"):
        rlmesh.run(cartpole_policy, hanging_server.address, episodes=1, timeouts={"step": 0.3})
    assert time.monotonic() - started < 5


def test_a_hung_server_answers_timeout_at_the_requests_timeout_ms(hanging_server):
    env = rlmesh.RemoteEnv(hanging_server.address, request_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(rlmesh.RemoteError) as caught:
        rlmesh.run(cartpole_policy, env, episodes=1)
    assert caught.value.code == "ENV_ERROR_CODE_TIMEOUT"
    assert "timeout_ms=300" in str(caught.value)
    assert time.monotonic() - started < 5


def test_an_env_that_raises_fails_the_run_with_internal_naming_the_server():
    with rlmesh.serve_env(RaisingEnv) as server:
        with pytest.raises(rlmesh.RemoteError) as caught:
            rlmesh.run(cartpole_policy, server.address, episodes=1)
        assert caught.value.code == "ENV_ERROR_CODE_INTERNAL"
        assert "lost its state" in str(caught.value) and server.address in str(caught.value)
        # The session ended; the server serves the next one.
        with rlmesh.RemoteEnv(server.address) as env:
            observations, _ = env.reset(np.array([0]), [1], [None])
    assert observations[0].shape == (4,)


def test_close_ends_the_session_once_and_frees_the_server_for_the_next():
    with rlmesh.serve_env("CartPole-v1") as server:
        env = rlmesh.RemoteEnv(server.address)
        env.reset(np.array([0]), [0], [None])
        env.close()
        env.close()  # idempotent
        with pytest.raises(rlmesh.RemoteError, match="closed"):
            env.step(np.array([0]), np.array([1]))
        with rlmesh.RemoteEnv(server.address) as again:  # the session slot is free at once
            again.reset(np.array([0]), [0], [None])


def test_no_server_at_the_address_is_a_remote_error_within_the_connect_timeout():
    started = time.monotonic()
    with pytest.raises(rlmesh.RemoteError, match=r"no server answered at tcp://127\.0\.0\.1:9 "):
        rlmesh.RemoteEnv("127.0.0.1:9", connect_timeout=0.5)
    assert time.monotonic() - started < 5
