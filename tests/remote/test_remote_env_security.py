"""The env server's defenses, against real gRPC calls on loopback: the token, the message size
cap, malformed and invalid requests (typed errors, the server keeps serving), one session at a
time, the first-message deadline, Shutdown, health, and a malformed contract on the client."""

from __future__ import annotations

import functools
import os
import queue
import subprocess
import threading
import time
from concurrent import futures

import grpc
import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlmesh.remote.codec import SpaceCodec, space_spec
from rlmesh.remote.connection import handshake_response, message_bytes, token_metadata, uuid7
from rlmesh.remote.env_server import ValueChecks
from rlmesh.remote.wire.core.v1 import env_contract_pb2
from rlmesh.remote.wire.env.v1 import interaction_pb2 as wire
from rlmesh.remote.wire.env.v1 import service_pb2, service_pb2_grpc
from rlmesh.remote.wire.spaces.v1 import value_pb2
from servers import read_address, rlmesh_cli, stop
from test_remote_env_cases import CountingEnv


@pytest.fixture(params=["rust", "python"])
def serve_env(request):
    """``rlmesh.serve_env`` on each core's transport (tonic and grpcio)."""
    return functools.partial(rlmesh.serve_env, core=request.param)


DISCRETE = SpaceCodec(gym.spaces.Discrete(2))


class RawSession:
    """A Join stream driven request by request, as a foreign client would."""

    def __init__(self, address: str, token: str | None = None, max_message_mb: float = 64):
        target = address.removeprefix("tcp://")
        limit = message_bytes(max_message_mb)
        options = [("grpc.max_send_message_length", limit)]
        options.append(("grpc.max_receive_message_length", limit))
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = service_pb2_grpc.EnvServiceStub(self.channel)
        self.metadata = token_metadata(token)
        self.pending: queue.SimpleQueue = queue.SimpleQueue()
        self.responses = self.stub.Join(
            iter(self.pending.get, None), metadata=self.metadata, timeout=20
        )
        self.count = 0

    def ask(self, **kind) -> wire.JoinResponse:
        self.count += 1
        self.pending.put(wire.JoinRequest(request_id=f"r{self.count}", **kind))
        response = next(self.responses)
        assert response.request_id == f"r{self.count}"
        return response

    def close(self) -> None:
        self.pending.put(None)
        self.responses.cancel()
        self.channel.close()


def _step(action: value_pb2.SpaceValue, lanes=(0,)) -> dict:
    return {"step": wire.StepRequest(action=action, env_indices=list(lanes))}


def _reset(lanes=(0,), seeds=(1,)) -> dict:
    ids = [uuid7() for _ in lanes]
    return {"reset": wire.ResetRequest(env_indices=list(lanes), seeds=list(seeds), episode_ids=ids)}


@pytest.fixture
def counted(serve_env):
    calls = {"reset": 0, "step": 0}
    with serve_env(lambda: CountingEnv(calls), token="s3cret") as server:
        yield server, calls


def test_a_missing_or_wrong_token_is_unauthenticated_and_no_reset_or_step_runs(counted):
    server, calls = counted
    for token in (None, "wrong"):
        with pytest.raises(rlmesh.RemoteError) as caught:
            rlmesh.RemoteEnv(server.address, token=token)
        assert caught.value.code == "UNAUTHENTICATED"
        assert "token" in str(caught.value)
        session = RawSession(server.address, token=token)
        try:
            with pytest.raises(grpc.RpcError) as raw:
                session.ask(**_reset())
            assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            session.close()
    assert calls == {"reset": 0, "step": 0}
    with rlmesh.RemoteEnv(server.address, token="s3cret") as env:
        env.reset(np.array([0]), [3], [None])
        env.step(np.array([0]), np.array([1]))
    assert calls == {"reset": 1, "step": 1}


def test_the_health_check_needs_no_token_and_says_serving(counted):
    server, _ = counted
    with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_message_over_the_cap_is_refused_and_the_server_keeps_serving(serve_env):
    with serve_env("CartPole-v1", max_message_mb=1) as server:
        session = RawSession(server.address, max_message_mb=8)
        try:
            session.ask(**_reset())
            huge = value_pb2.SpaceValue(leaves=[b"\0" * (2 * 1024 * 1024)])
            with pytest.raises(grpc.RpcError) as caught:
                session.ask(**_step(huge))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            session.close()
        with rlmesh.RemoteEnv(server.address) as env:
            env.reset(np.array([0]), [0], [None])
            assert env.step(np.array([0]), np.array([1])).rewards.tolist() == [1.0]


def test_malformed_and_invalid_actions_get_typed_errors_and_are_never_delivered(serve_env):
    calls = {"reset": 0, "step": 0}
    with serve_env(lambda: CountingEnv(calls), num_envs=2) as server:
        session = RawSession(server.address)
        try:
            not_ready = session.ask(**_step(DISCRETE.encode(np.array([1]), 1))).error
            assert not_ready.code == wire.ENV_ERROR_CODE_NOT_READY and not_ready.is_recoverable
            session.ask(**_reset(lanes=(0, 1), seeds=(4, 5)))
            bad = {
                "two leaves for one": value_pb2.SpaceValue(leaves=[b"\0" * 8, b"\0" * 8]),
                "a byte short": value_pb2.SpaceValue(leaves=[b"\0" * 7]),
                "out of Discrete(2)": DISCRETE.encode(np.array([2]), 1),
            }
            for _ in range(50):  # again and again: the server neither dies nor stops answering
                for what, action in bad.items():
                    error = session.ask(**_step(action)).error
                    assert error.code == wire.ENV_ERROR_CODE_INVALID_ACTION, what
                    assert error.is_recoverable, what
            assert (
                "leaves, expected 1"
                in session.ask(**_step(bad["two leaves for one"])).error.message
            )
            assert "7 bytes, expected 8" in session.ask(**_step(bad["a byte short"])).error.message
            out_of_domain = session.ask(**_step(bad["out of Discrete(2)"])).error.message
            assert "lane 0" in out_of_domain and "[0, 2)" in out_of_domain
            out_of_range = session.ask(**_step(DISCRETE.encode(np.array([0]), 1), lanes=(2,)))
            assert "out of range" in out_of_range.error.message
            twice = session.ask(**_step(DISCRETE.encode(np.array([0, 1]), 2), lanes=(1, 1)))
            assert "twice" in twice.error.message
            assert calls["step"] == 0
            answer = session.ask(**_step(DISCRETE.encode(np.array([1]), 1), lanes=(1,))).step
            assert list(answer.rewards) == [1.0] and list(answer.env_indices) == [1]
            assert calls["step"] == 1
        finally:
            session.close()


FLOOD_ROUNDS = 400  # malformed steps of 256 kB each: 100 MB on the wire in all
FLOOD_BYTES = 256 * 1024


def _resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_flood_of_malformed_steps_leaves_the_servers_memory_flat(core):
    """Each refused message is freed: 400 of 256 kB (100 MB in all) grow the server's
    resident set by less than a tenth of that, and it still serves."""
    process = subprocess.Popen(
        rlmesh_cli("serve", "env", "CartPole-v1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "RLMESH_CORE": core},
    )
    try:
        address = read_address(process, 60)
        session = RawSession(address)
        try:
            session.ask(**_reset())
            malformed = _step(value_pb2.SpaceValue(leaves=[b"\1" * FLOOD_BYTES]))
            before = None
            for round_index in range(FLOOD_ROUNDS):
                error = session.ask(**malformed).error
                assert error.code == wire.ENV_ERROR_CODE_INVALID_ACTION
                if round_index == FLOOD_ROUNDS // 4:  # allocator pools warm by now
                    before = _resident_mb(process.pid)
            grown = _resident_mb(process.pid) - before
            assert grown < FLOOD_ROUNDS * FLOOD_BYTES / 2**20 / 10, f"grew {grown:.1f} MB"
            answer = session.ask(**_step(DISCRETE.encode(np.array([1]), 1))).step
            assert list(answer.rewards) == [1.0]
        finally:
            session.close()
    finally:
        stop(process)


def test_a_nan_action_is_invalid_and_not_delivered(serve_env):
    with serve_env("Pendulum-v1") as server:
        codec = SpaceCodec(gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
        session = RawSession(server.address)
        try:
            session.ask(**_reset())
            error = session.ask(**_step(codec.encode(np.array([[np.nan]]), 1))).error
            assert error.code == wire.ENV_ERROR_CODE_INVALID_ACTION and error.is_recoverable
            assert "NaN" in error.message
            assert len(session.ask(**_step(codec.encode(np.array([[0.5]]), 1))).step.rewards) == 1
        finally:
            session.close()


@pytest.mark.parametrize("rows", [3, 200])  # a short batch is checked in Python, a long one not
def test_value_checks_name_the_first_row_that_breaks_its_space(rows):
    observations = ValueChecks(gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), "observation")
    batch = np.zeros((rows, 2), np.float32)
    assert observations.first_failure(batch) is None
    batch[1] = [np.inf, -np.inf]  # their sum is NaN, yet no element is
    assert observations.first_failure(batch) is None
    batch[rows - 1, 1] = np.nan
    row, message = observations.first_failure(batch)
    assert row == rows - 1 and "NaN" in message and message.startswith("observation leaf")
    actions_checks = ValueChecks(gym.spaces.Discrete(3, start=1), "action")
    actions = np.ones(rows, np.int64)
    assert actions_checks.first_failure(actions) is None
    for bad in (0, 4):
        actions[rows - 2] = bad
        row, message = actions_checks.first_failure(actions)
        assert row == rows - 2 and f"is {bad}" in message and "[1, 4)" in message


def test_one_session_at_a_time_a_second_gets_busy(serve_env):
    with serve_env("CartPole-v1") as server:
        first = rlmesh.RemoteEnv(server.address)
        with pytest.raises(rlmesh.RemoteError) as caught:
            rlmesh.RemoteEnv(server.address)
        assert caught.value.code == "ENV_ERROR_CODE_BUSY"
        detail = caught.value.detail  # the server's own words, without the client's frame
        assert detail and str(caught.value).endswith(detail) and "ENV_ERROR_CODE" not in detail
        first.close()
        rlmesh.RemoteEnv(server.address).close()


def test_a_join_that_sends_nothing_is_ended_at_the_first_message_deadline(serve_env):
    with serve_env("CartPole-v1", first_message_timeout=0.5) as server:
        with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
            stub = service_pb2_grpc.EnvServiceStub(channel)
            quiet = threading.Event()

            def nothing():
                quiet.wait(10)
                yield from ()

            started = time.monotonic()
            silent = stub.Join(nothing(), timeout=20)
            try:
                with pytest.raises(grpc.RpcError) as caught:
                    next(silent)
                assert caught.value.code() == grpc.StatusCode.CANCELLED
                assert time.monotonic() - started < 5
            finally:
                quiet.set()
                silent.cancel()
        with rlmesh.RemoteEnv(server.address) as env:  # and the session slot is free again
            env.reset(np.array([0]), [0], [None])


def test_shutdown_is_refused_unless_allowed(serve_env):
    request = service_pb2.ShutdownRequest()
    with serve_env("CartPole-v1") as server:
        with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
            answer = service_pb2_grpc.EnvServiceStub(channel).Shutdown(request)
        assert not answer.base.accepted and "allow_shutdown" in answer.base.message
        assert not server.wait(0.2)
    server = serve_env("CartPole-v1", allow_shutdown=True)
    try:
        with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
            answer = service_pb2_grpc.EnvServiceStub(channel).Shutdown(request)
        assert answer.base.accepted
        assert server.wait(10)
    finally:
        server.close()


def test_the_server_binds_loopback_by_default(serve_env):
    with serve_env("CartPole-v1") as server:
        assert server.address.startswith("tcp://127.0.0.1:")


class _UnknownDtypeEnv(service_pb2_grpc.EnvServiceServicer):
    """A foreign server whose contract declares a DataType the wire does not define."""

    def Handshake(self, request, context):  # noqa: N802
        observation = space_spec(gym.spaces.Box(-1, 1, (3,), np.float32))
        observation.dtype = 99
        contract = env_contract_pb2.EnvContract(
            spec=env_contract_pb2.EnvSpec(
                id="Odd-v0",
                observation_space=observation,
                action_space=space_spec(gym.spaces.Discrete(2)),
            ),
            num_envs=1,
        )
        return service_pb2.HandshakeResponse(
            base=handshake_response(request.base, "odd"), env_contract=contract
        )


def test_a_contract_with_an_unknown_dtype_is_a_remote_error_naming_the_leaf():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    service_pb2_grpc.add_EnvServiceServicer_to_server(_UnknownDtypeEnv(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(rlmesh.RemoteError) as caught:
            rlmesh.RemoteEnv(f"127.0.0.1:{port}")
        message = str(caught.value)
        assert f"127.0.0.1:{port}" in message and "DataType 99" in message
        assert "observation_space" in message
    finally:
        server.stop(None)


class _MaskEnv(service_pb2_grpc.EnvServiceServicer):
    """A foreign two-lane server that answers every step with the masks it is given."""

    def __init__(self, terminated: bytes, truncated: bytes) -> None:
        self.masks = terminated, truncated

    def Handshake(self, request, context):  # noqa: N802
        contract = env_contract_pb2.EnvContract(
            spec=env_contract_pb2.EnvSpec(
                id="Masks-v0",
                observation_space=space_spec(gym.spaces.Box(-1, 1, (1,), np.float32)),
                action_space=space_spec(gym.spaces.Discrete(2)),
            ),
            num_envs=2,
        )
        base = handshake_response(request.base, "masks", {"subset_step": "true"})
        return service_pb2.HandshakeResponse(base=base, env_contract=contract)

    def Join(self, request_iterator, context):  # noqa: N802
        observation = value_pb2.SpaceValue(leaves=[np.zeros(2, "<f4").tobytes()])
        for request in request_iterator:
            kind = request.WhichOneof("kind")
            response = wire.JoinResponse(request_id=request.request_id)
            if kind == "step":
                response.step.observation.CopyFrom(observation)
                response.step.rewards.extend([1.0, 1.0])
                response.step.terminated_mask, response.step.truncated_mask = self.masks
            else:
                getattr(response, kind).SetInParent()
                if kind == "reset":
                    response.reset.observation.CopyFrom(observation)
            yield response


@pytest.mark.parametrize(
    ("terminated", "truncated", "expected"),
    [
        (b"", b"", ([False, False], [False, False])),  # empty masks: no lane set
        (b"\0\0", b"\0\0", ([False, False], [False, False])),
        (b"\0\2", b"\1\0", ([False, True], [True, False])),  # any non-zero byte is set
        (b"\0", b"\0\0", "terminated_mask has 1 bytes for 2 lanes"),
    ],
)
def test_a_step_answer_masks_are_read_per_lane_and_a_wrong_length_is_malformed(
    terminated, truncated, expected
):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    service_pb2_grpc.add_EnvServiceServicer_to_server(_MaskEnv(terminated, truncated), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with rlmesh.RemoteEnv(f"127.0.0.1:{port}") as env:
            env.reset(np.array([0, 1]), [0, 1], [None, None])
            if isinstance(expected, str):
                with pytest.raises(rlmesh.RemoteError, match=expected) as caught:
                    env.step(np.array([0, 1]), np.array([0, 1]))
                assert caught.value.code == "MALFORMED"
            else:
                batch = env.step(np.array([0, 1]), np.array([0, 1]))
                assert (batch.terminated.tolist(), batch.truncated.tolist()) == expected
    finally:
        server.stop(None)
