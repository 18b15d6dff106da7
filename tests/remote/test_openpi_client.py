"""``rlmesh.remote.OpenPIModel`` against a real openpi-protocol server on loopback.

The server here is a small one written with ``websockets`` (the protocol as
``rlmesh.remote.openpi`` describes it: a metadata frame, then lockstep msgpack in and out; an
error is a text frame then close code 1011; an optional ``Api-Key``), so these tests do not
depend on rlmesh's own openpi server. Its policy is ``chunk_policy``, the same function the
local runs use as a ``Model``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from http import HTTPStatus

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.cli import main
from rlmesh.errors import RemoteError

pytest.importorskip("websockets")
from rlmesh.remote.openpi.client import OBSERVATION_KEY, OpenPIModel
from rlmesh.remote.openpi.codec import packb, unpackb
from websockets.asyncio.server import serve

CHUNK = 4  # the server's H, whatever the run's execution_horizon
RUN = {"episodes": 6, "seed": 3, "max_episode_steps": 60}
METADATA = {"policy": "test-chunk-policy", "action_dim": 1}


def chunk_policy(obs: np.ndarray, calls: int = 0) -> np.ndarray:
    """A deterministic (CHUNK, 1) CartPole chunk: push toward the fall, a little less sure the
    later the step (so the chunk's actions differ and the horizon matters). ``calls``, the
    episode's earlier predictions, shifts it further with every call (a stateful policy)."""
    lean = obs[2] + 0.3 * obs[3] - 0.01 * calls
    return np.array([[float(lean + 0.02 * k > 0)] for k in range(CHUNK)], dtype=np.float32)


def latest(observation: np.ndarray) -> np.ndarray:
    """The newest frame of a stacked ``[S, 4]`` observation (a plain ``[4]`` one as it is)."""
    return observation[-1] if observation.ndim == 2 else observation


class LocalChunkPolicy(rlmesh.Model):
    """``chunk_policy`` as a local chunked model."""

    stateless = True

    def __init__(self, spec=None):
        super().__init__()
        self.spec = spec

    def predict_chunk(self, obs, execution_horizon=None):
        return chunk_policy(latest(obs[OBSERVATION_KEY] if isinstance(obs, dict) else obs))


class OpenPIServer:
    """An openpi-protocol server on 127.0.0.1, on a thread of its own.

    Args:
        delay_s: how long each answer takes (sleeping, so connections overlap).
        stateful: the policy counts each connection's requests (``chunk_policy``'s
            ``calls``): a connection is an episode, as to rlmesh's openpi server.
        fail: answer every request with the protocol's error, a text frame then close code
            1011; ``"close"``: only the close code 1011.
        api_key: refuse (HTTP 401) a connection without ``Authorization: Api-Key <key>``.
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        stateful: bool = False,
        fail: bool | str = False,
        api_key: str | None = None,
    ):
        self.stateful = stateful
        self.connections = 0
        self.delay_s = delay_s
        self.fail = fail
        self.api_key = api_key
        self.open = self.most_open = 0
        self.in_flight = self.most_in_flight = 0
        self.requests = 0
        self.observations: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.address = f"openpi://127.0.0.1:{self.port}"

    async def _start(self):
        return await serve(
            self._handle,
            "127.0.0.1",
            0,
            process_request=self._check_request,
            compression=None,
            max_size=None,
        )

    def _check_request(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(HTTPStatus.OK, "OK\n")
        key = self.api_key
        if key is not None and request.headers.get("Authorization") != f"Api-Key {key}":
            return connection.respond(HTTPStatus.UNAUTHORIZED, "bad api key\n")
        return None

    async def _handle(self, websocket):
        self.open += 1
        self.connections += 1
        calls = 0
        self.most_open = max(self.most_open, self.open)
        try:
            await websocket.send(packb(METADATA))
            async for frame in websocket:
                obs = unpackb(frame)
                self.requests += 1
                self.observations.append(obs)
                if self.fail == "close":
                    await websocket.close(1011, "out of memory")
                    return
                if self.fail:
                    await websocket.send("Traceback (most recent call last):\nValueError: boom")
                    await websocket.close(1011, "Internal server error")
                    return
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    observation = latest(obs[OBSERVATION_KEY])
                    answer = {"actions": chunk_policy(observation, calls if self.stateful else 0)}
                    calls += 1
                finally:
                    self.in_flight -= 1
                await websocket.send(packb({**answer, "server_timing": {"infer_ms": 0.1}}))
        finally:
            self.open -= 1

    def stop(self):
        if self.loop.is_closed():
            return

        async def closed():
            self.server.close()
            await self.server.wait_closed()

        try:
            asyncio.run_coroutine_threadsafe(closed(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def openpi_server():
    """Start servers with ``openpi_server(**options)``; all stop after the test."""
    servers = []

    def start(**options):
        servers.append(OpenPIServer(**options))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("horizon", [1, 4])
def test_a_served_chunk_policy_gives_the_local_results(openpi_server, core, num_envs, horizon):
    server = openpi_server()
    run = {**RUN, "num_envs": num_envs, "execution_horizon": horizon, "core": core}
    local = rlmesh.run(LocalChunkPolicy(), "CartPole-v1", **run)
    model = OpenPIModel(server.address)
    remote = rlmesh.run(model, "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)
    assert len(remote.episodes) == RUN["episodes"]
    assert model.metadata == METADATA
    # One request per chunk: horizon 4 replays every action of a 4-action chunk.
    steps = sum(episode.steps for episode in remote.episodes)
    assert server.requests >= steps / horizon
    assert server.open == 0 or _closes_soon(server)  # Model.close closed the connections


@pytest.mark.parametrize("core", CORES)
def test_the_payload_the_spec_assembles_is_sent_frame_stacks_included(openpi_server, core):
    server = openpi_server()
    spec = rlmesh.ModelSpec(input={OBSERVATION_KEY: rlmesh.State(stack=2)})
    run = {**RUN, "num_envs": 2, "execution_horizon": 4, "core": core}
    local = rlmesh.run(LocalChunkPolicy(spec), "CartPole-v1", **run)
    remote = rlmesh.run(OpenPIModel(server.address, spec=spec), "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)
    assert {sent[OBSERVATION_KEY].shape for sent in server.observations} == {(2, 4)}


class LocalStatefulPolicy(rlmesh.Model):
    """``chunk_policy`` counting each episode's predictions in its context."""

    def predict_chunk(self, obs, execution_horizon=None, context=None):
        obs = obs[OBSERVATION_KEY] if isinstance(obs, dict) else obs
        return chunk_policy(latest(obs), context["predict_index"])


@pytest.mark.parametrize("core", CORES)
def test_each_episode_has_its_own_connection(openpi_server, core):
    """A served policy that keeps state per connection sees each episode on a connection of
    its own, so its results are a local per-episode stateful model's."""
    server = openpi_server(stateful=True)
    run = {**RUN, "num_envs": 3, "execution_horizon": 2, "core": core}
    local = rlmesh.run(LocalStatefulPolicy(), "CartPole-v1", **run)
    remote = rlmesh.run(OpenPIModel(server.address), "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)
    assert server.connections == RUN["episodes"]
    assert _closes_soon(server)


def test_one_model_serves_several_runs(openpi_server):
    """``close`` at a run's end ends the connections and the thread; the next run dials anew
    (as a suite's tasks run one model one after another)."""
    server = openpi_server()
    model = OpenPIModel(server.address)
    run = {**RUN, "episodes": 2, "num_envs": 2, "execution_horizon": 2}
    first = rlmesh.run(model, "CartPole-v1", **run)
    threads = threading.active_count()
    second = rlmesh.run(model, "CartPole-v1", **run)
    assert comparable(first) == comparable(second)
    assert threading.active_count() <= threads
    assert _closes_soon(server)


def _serve_openpi(model):
    """``model`` served by rlmesh's own openpi server."""
    return rlmesh.serve_model(model, protocol="openpi")


@pytest.mark.parametrize("policy", [LocalChunkPolicy, LocalStatefulPolicy])
@pytest.mark.parametrize(("num_envs", "horizon"), [(1, 1), (4, 4)])
def test_a_model_served_by_rlmesh_s_openpi_server(policy, num_envs, horizon):
    """Both ends of rlmesh: the served model's results are the local run's, a stateful one's
    too (that server makes each connection an episode)."""
    run = {**RUN, "num_envs": num_envs, "execution_horizon": horizon}
    local = rlmesh.run(policy(), "CartPole-v1", **run)
    server = _serve_openpi(policy())
    try:
        remote = rlmesh.run(OpenPIModel(server.address), "CartPole-v1", **run)
    finally:
        server.close()
    assert comparable(remote) == comparable(local)


def _closes_soon(server, wait_s=5.0):
    deadline = time.monotonic() + wait_s
    while server.open and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.open == 0


def test_the_payload_is_the_spec_s_dict_and_a_plain_array_travels_under_observation(
    openpi_server,
):
    server = openpi_server()
    model = OpenPIModel(server.address, max_connections=2)
    try:
        obs = np.arange(12, dtype=np.float32).reshape(3, 4)
        chunks = model.predict_chunk_batch(obs, 4)
        assert chunks.shape == (3, CHUNK, 1)
        for row in range(3):
            assert np.array_equal(chunks[row], chunk_policy(obs[row]))
        assert [sorted(sent) for sent in server.observations] == [[OBSERVATION_KEY]] * 3
        assert server.most_open == 2  # max_connections
        # A Dict payload (as a spec assembles it) goes as its keys, text leaves as strings.
        payload = {
            OBSERVATION_KEY: obs[:2],
            "images": {"wrist": np.zeros((2, 8, 8, 3), np.uint8)},
            "prompt": ["pick", "place"],
        }
        model.predict_chunk_batch(payload, 1)
        sent = server.observations[3:]
        assert [each["prompt"] for each in sent] == ["pick", "place"]
        assert sent[1]["images"]["wrist"].shape == (8, 8, 3)
    finally:
        model.close()


def test_lanes_are_sent_concurrently(openpi_server):
    server = openpi_server(delay_s=0.05)
    model = OpenPIModel(server.address)
    started = time.monotonic()
    result = rlmesh.run(
        model, "CartPole-v1", episodes=4, num_envs=4, max_episode_steps=5, execution_horizon=4
    )
    elapsed = time.monotonic() - started
    assert len(result.episodes) == 4
    assert server.most_open >= 4  # one connection per lane (and an ended episode's, closing)
    assert server.most_in_flight > 1  # the lanes' requests overlapped
    # Four lanes one after another would take 4 * 2 rounds * 50 ms at least.
    assert elapsed < 4 * 2 * server.delay_s + 5.0


def test_a_server_error_raises_remote_error_naming_the_address(openpi_server):
    server = openpi_server(fail=True)
    model = OpenPIModel(server.address, timeout_s=10)
    with pytest.raises(RemoteError) as caught:
        rlmesh.run(model, "CartPole-v1", episodes=2, num_envs=2, execution_horizon=2)
    assert caught.value.address == server.address
    assert server.address in str(caught.value)
    assert "ValueError: boom" in str(caught.value)


def test_close_code_1011_without_text_raises_remote_error(openpi_server):
    server = openpi_server(fail="close")
    model = OpenPIModel(server.address, timeout_s=10)
    try:
        with pytest.raises(RemoteError, match=r"1011.*out of memory") as caught:
            model.predict_chunk_batch(np.zeros((1, 4), np.float32), 1)
        assert caught.value.address == server.address
    finally:
        model.close()


def test_the_api_key_is_sent_and_a_wrong_one_refused(openpi_server):
    server = openpi_server(api_key="s3cret")
    model = OpenPIModel(server.address, api_key="s3cret")
    try:
        assert model.connect() == METADATA
        assert model.predict_chunk_batch(np.zeros((1, 4), np.float32), 1).shape == (1, CHUNK, 1)
    finally:
        model.close()
    for key in ("wrong", None):
        refused = OpenPIModel(server.address, api_key=key, timeout_s=10)
        try:
            with pytest.raises(RemoteError, match="401") as caught:
                refused.connect()
            assert caught.value.address == server.address
        finally:
            refused.close()


def test_no_server_and_no_answer_are_remote_errors(openpi_server):
    server = openpi_server(delay_s=2.0)
    slow = OpenPIModel(server.address, timeout_s=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteError, match=r"within 0\.3 s"):
            slow.predict_chunk_batch(np.zeros((2, 4), np.float32), 1)
        assert time.monotonic() - started < 5.0
    finally:
        slow.close()
    port = server.port
    server.stop()
    gone = OpenPIModel(f"127.0.0.1:{port}", timeout_s=5)
    try:
        with pytest.raises(RemoteError, match="could not reach"):
            gone.connect()
    finally:
        gone.close()


def test_addresses_and_arguments():
    assert OpenPIModel("ws://localhost:8000").address == "openpi://localhost:8000"
    assert OpenPIModel("localhost:8000").address == "openpi://localhost:8000"
    for bad in ("CartPole-v1", "openpi://host", "openpi://host:99999"):
        with pytest.raises(ValueError):
            OpenPIModel(bad)
    with pytest.raises(ValueError):
        OpenPIModel("openpi://h:1", max_connections=0)
    with pytest.raises(ValueError):
        OpenPIModel("openpi://h:1", timeout_s=0)
    with pytest.raises(TypeError):
        OpenPIModel("openpi://h:1", spec={"input": None})
    assert rlmesh.remote.OpenPIModel is OpenPIModel


def test_importing_rlmesh_imports_no_websockets():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, rlmesh, rlmesh.cli, rlmesh.remote; "
            "print(any(name in sys.modules for name in ('websockets', 'msgpack')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_rlmesh_eval_openpi_address(openpi_server, capsys):
    server = openpi_server(api_key="k")
    argv = [
        "eval",
        server.address,
        "--env",
        "CartPole-v1",
        "--episodes",
        "3",
        "--num-envs",
        "2",
        "--horizon",
        "4",
        "--max-episode-steps",
        "40",
        "--policy-token",
        "k",
        "--no-progress",
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3
    local = rlmesh.run(
        LocalChunkPolicy(),
        "CartPole-v1",
        episodes=3,
        num_envs=2,
        execution_horizon=4,
        max_episode_steps=40,
    )
    assert summary["mean_reward"] == pytest.approx(local.summary()["mean_reward"])
    # A wrong key: the run fails with the server's refusal, exit code 1.
    assert main([*argv[:-4], "--policy-token", "nope", "--no-progress"]) == 1
    assert "401" in capsys.readouterr().err
