"""A served model's security and faults: tokens, malformed requests, a server that dies, a model
that hangs or raises. Real servers on loopback; every wait bounded."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import CORES, comparable
from rlmesh.errors import OperationTimeout, RemoteError
from rlmesh.remote.codec import space_spec
from rlmesh.remote.connection import token_metadata
from rlmesh.remote.wire.core.v1 import env_contract_pb2, handshake_pb2
from rlmesh.remote.wire.model.v1 import interaction_pb2, service_pb2, service_pb2_grpc
from rlmesh.remote.wire.spaces.v1 import value_pb2
from servers import rlmesh_cli, served

Code = interaction_pb2.ModelErrorCode


@pytest.fixture(params=["rust", "python"])
def serve_model(request):
    """``rlmesh.serve_model`` on each core's transport (tonic and grpcio)."""
    return functools.partial(rlmesh.serve_model, core=request.param)


class Counted(rlmesh.Model):
    """The pole-angle rule, counting its calls and rows; raises on a cart position > 100."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.rows = 0

    def predict_batch(self, obs):
        self.calls += 1
        self.rows += len(obs)
        if np.any(obs[:, 0] > 100):
            raise RuntimeError("cart out of this world")
        return (obs[:, 2] > 0).astype(np.int64)


def cartpole_obs(rows, value=0.1):
    return np.full((rows, 4), value, np.float32)


class RawStream:
    """A Join stream driven request by request, as a misbehaving client would."""

    def __init__(self, address, token=None):
        self.channel = grpc.insecure_channel(address.removeprefix("tcp://"))
        self.stub = service_pb2_grpc.ModelServiceStub(self.channel)
        self.metadata = token_metadata(token)
        self._requests = []
        self._cond = threading.Condition()
        self._call = self.stub.Join(self._outgoing(), metadata=self.metadata)
        self._count = 0

    def _outgoing(self):
        while True:
            with self._cond:
                while not self._requests:
                    self._cond.wait()
                request = self._requests.pop(0)
            if request is None:
                return
            yield request

    def ask(self, **kind):
        self._count += 1
        request = interaction_pb2.JoinRequest(request_id=f"q{self._count}", **kind)
        with self._cond:
            self._requests.append(request)
            self._cond.notify()
        response = next(self._call)
        assert response.request_id == f"q{self._count}"
        return response

    def resolve(self, env_id, observation_space, action_space=None):
        action_space = action_space or gym.spaces.Discrete(2)
        return self.ask(
            resolve_adapter=interaction_pb2.ResolveAdapterRequest(
                context=interaction_pb2.AdapterContext(env_id=env_id),
                env_spec=env_contract_pb2.EnvSpec(
                    id="CartPole-v1",
                    observation_space=observation_space
                    if not isinstance(observation_space, gym.Space)
                    else space_spec(observation_space),
                    action_space=space_spec(action_space),
                ),
                selected_workflow_edition="2026.06",
            )
        )

    def predict(self, env_id, leaves, episodes=("e1",)):
        return self.ask(
            predict=interaction_pb2.PredictRequest(
                context=interaction_pb2.AdapterContext(env_id=env_id),
                observation=value_pb2.SpaceValue(leaves=leaves),
                episode_info=[interaction_pb2.EpisodeInfo(episode_id=e, seed=1) for e in episodes],
            )
        )

    def close(self):
        with self._cond:
            self._requests.append(None)
            self._cond.notify()
        self._call.cancel()
        self.channel.close()


CARTPOLE_SPACE = gym.make("CartPole-v1").observation_space


def valid_predict_answers(stream, env_id="env-a"):
    """A well-formed predict still gets its action (pole leaning right: push right)."""
    response = stream.predict(env_id, [cartpole_obs(1).tobytes()])
    assert response.WhichOneof("kind") == "predict", response
    assert np.frombuffer(response.predict.actions[0].leaves[0], "<i8").tolist() == [1]


def test_a_wrong_or_missing_token_is_unauthenticated_and_the_model_never_runs(serve_model):
    model = Counted()
    with serve_model(model, token="right") as server:
        for token in (None, "wrong"):
            with pytest.raises(RemoteError) as caught:
                rlmesh.RemoteModel(server.address, token=token)
            assert caught.value.code == "UNAUTHENTICATED"
            assert server.address in str(caught.value)
        stream = RawStream(server.address)  # a Join straight away, without the token
        try:
            with pytest.raises(grpc.RpcError) as refused:
                stream.predict("env-a", [cartpole_obs(1).tobytes()])
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            stream.close()
        assert model.calls == 0
        # The health check needs no token.
        with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        result = rlmesh.run(rlmesh.RemoteModel(server.address, token="right"), "CartPole-v1")
        assert model.calls == result.total_steps


def test_malformed_requests_get_typed_errors_and_the_server_keeps_serving(serve_model):
    model = Counted()
    with serve_model(model) as server:
        stream = RawStream(server.address)
        try:
            not_resolved = stream.predict("env-a", [cartpole_obs(1).tobytes()])
            assert not_resolved.error.code == Code.MODEL_ERROR_CODE_NOT_CONFIGURED
            assert "ResolveAdapter" in not_resolved.error.message

            assert stream.resolve("env-a", CARTPOLE_SPACE).WhichOneof("kind") == "resolve_adapter"
            valid_predict_answers(stream)

            cases = {
                "two leaves for a one-leaf space": [cartpole_obs(1).tobytes()] * 2,
                "15 bytes for 1 row of float32[4]": [cartpole_obs(1).tobytes()[:15]],
                "2 rows of bytes for 1 row": [cartpole_obs(2).tobytes()],
            }
            for what, leaves in cases.items():
                response = stream.predict("env-a", leaves)
                assert response.error.code == Code.MODEL_ERROR_CODE_INVALID_REQUEST, what
                assert response.error.is_recoverable
                valid_predict_answers(stream)

            unknown_dtype = space_spec(CARTPOLE_SPACE)
            unknown_dtype.dtype = 99
            refused = stream.resolve("env-b", unknown_dtype)
            assert refused.error.code == Code.MODEL_ERROR_CODE_INVALID_REQUEST
            assert "99" in refused.error.message

            no_rows = stream.predict("env-a", [b""], episodes=())
            assert no_rows.error.code == Code.MODEL_ERROR_CODE_INVALID_REQUEST
            twice = stream.predict("env-a", [cartpole_obs(2).tobytes()], episodes=("x", "x"))
            assert twice.error.code == Code.MODEL_ERROR_CODE_INVALID_REQUEST
            empty = stream.ask()
            assert empty.error.code == Code.MODEL_ERROR_CODE_UNSUPPORTED

            raised = stream.predict("env-a", [cartpole_obs(1, value=1000.0).tobytes()])
            assert raised.error.code == Code.MODEL_ERROR_CODE_INTERNAL
            assert "cart out of this world" in raised.error.message
            valid_predict_answers(stream)

            ended = stream.ask(
                reset_adapter=interaction_pb2.ResetAdapterRequest(
                    context=interaction_pb2.AdapterContext(env_id="env-a"), episode_ids=["e1"]
                )
            )
            assert ended.WhichOneof("kind") == "reset_adapter"
            closed = stream.ask(close=interaction_pb2.CloseParticipantRequest())
            assert closed.WhichOneof("kind") == "close"
        finally:
            stream.close()
        # Well-formed predicts only: 5 answered, 1 that raised inside the model; none malformed.
        assert model.calls == 6
        refused_shutdown = service_pb2_grpc.ModelServiceStub(
            grpc.insecure_channel(server.address.removeprefix("tcp://"))
        ).Shutdown(service_pb2.ShutdownRequest(base=handshake_pb2.ShutdownRequest()), timeout=10)
        assert not refused_shutdown.base.accepted
        result = rlmesh.run(rlmesh.RemoteModel(server.address), "CartPole-v1", episodes=2)
        assert comparable(result) == comparable(rlmesh.run(Counted(), "CartPole-v1", episodes=2))


def test_a_model_that_raises_fails_the_run_with_the_episodes_before_kept(serve_model):
    class Fails(rlmesh.Model):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def predict_batch(self, obs):
            self.calls += 1
            if self.calls > 60:
                raise ValueError("weights went missing")
            return (obs[:, 2] > 0).astype(np.int64)

    with serve_model(Fails()) as server, pytest.raises(RemoteError) as caught:
        rlmesh.run(rlmesh.RemoteModel(server.address), "CartPole-v1", episodes=5)
    assert caught.value.code == "MODEL_ERROR_CODE_INTERNAL"
    assert "weights went missing" in str(caught.value)
    kept = caught.value.partial_result.episodes
    assert kept and comparable(caught.value.partial_result) == comparable(
        rlmesh.run(Fails(), "CartPole-v1", episodes=len(kept))
    )


DYING = """
import os
import signal
import numpy as np
import rlmesh


class DiesMidRun(rlmesh.Model):
    calls = 0

    def predict_batch(self, obs):
        type(self).calls += 1
        if self.calls == 150:
            os.kill(os.getpid(), signal.SIGKILL)
        return (obs[:, 2] > 0).astype(np.int64)
"""


@pytest.mark.parametrize("core", CORES)
def test_a_server_killed_mid_run_is_a_remote_error_and_the_completed_episodes_stay(tmp_path, core):
    policy = tmp_path / "dying.py"
    policy.write_text(DYING)
    argv = rlmesh_cli("serve", "model", f"{policy}:DiesMidRun", "--address", "127.0.0.1:0")
    with served(argv) as address:
        out = tmp_path / "results.jsonl"
        with pytest.raises(RemoteError) as caught:
            rlmesh.run(
                rlmesh.RemoteModel(address),
                "CartPole-v1",
                episodes=20,
                core=core,
                results_path=out,
            )
    assert address in str(caught.value)
    partial = caught.value.partial_result
    assert 1 <= len(partial.episodes) < 20
    local = rlmesh.run(
        lambda obs: int(obs[2] > 0), "CartPole-v1", episodes=len(partial.episodes), core=core
    )
    assert comparable(partial) == comparable(local)
    assert len(rlmesh.read_results(out)[1]) == len(partial.episodes)


def test_a_hung_model_hits_the_predict_timeout(serve_model):
    release = threading.Event()

    class Hangs(rlmesh.Model):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def predict_batch(self, obs):
            self.calls += 1
            if self.calls == 120:
                release.wait(timeout=30)
            return (obs[:, 2] > 0).astype(np.int64)

    with serve_model(Hangs()) as server:
        started = time.monotonic()
        try:
            with pytest.raises(OperationTimeout) as caught:
                rlmesh.run(
                    rlmesh.RemoteModel(server.address),
                    "CartPole-v1",
                    episodes=10,
                    timeouts={"predict": 0.5},
                )
            elapsed = time.monotonic() - started
        finally:
            release.set()
    assert "timeouts['predict']" in str(caught.value)
    assert elapsed < 5, f"the run took {elapsed:.1f} s to give up"
    kept = caught.value.partial_result.episodes
    assert kept
    assert comparable(caught.value.partial_result) == comparable(
        rlmesh.run(lambda obs: int(obs[2] > 0), "CartPole-v1", episodes=len(kept))
    )


def test_no_server_is_a_remote_error_naming_the_address():
    with pytest.raises(RemoteError) as caught:
        rlmesh.RemoteModel("127.0.0.1:9", connect_timeout=0.5)
    assert "tcp://127.0.0.1:9" in str(caught.value)
    assert caught.value.code == "UNAVAILABLE"


def test_the_model_needs_a_run_to_know_its_spaces(serve_model):
    with serve_model(Counted()) as server:
        model = rlmesh.RemoteModel(server.address)
        with pytest.raises(RemoteError, match=r"rlmesh\.run"):
            model.predict_batch(cartpole_obs(1), context=[])
        model.close()


MARKED_MODULE = """
import os
from pathlib import Path

Path(os.environ["RLMESH_TEST_MARKS"], f"imported-{os.getpid()}").touch()


def pole(observation):
    return observation[2:3]
"""


def test_a_served_spec_naming_code_is_refused_before_anything_is_imported(tmp_path, monkeypatch):
    name = f"rlmesh_marked_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MARKED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLMESH_TEST_MARKS", str(tmp_path))
    mark = tmp_path / f"imported-{os.getpid()}"
    module = importlib.import_module(name)
    model = Counted()
    model.spec = rlmesh.ModelSpec(input={"pole": rlmesh.Custom(module.pole)})
    try:
        with rlmesh.serve_model(model) as server:
            # The server has sent its spec's "module:function"; the client must not import it.
            sys.modules.pop(name)
            mark.unlink()
            with pytest.raises(RemoteError, match=r'input\["pole"\]: a Custom leaf names code'):
                rlmesh.RemoteModel(server.address)
            assert not mark.exists() and name not in sys.modules
    finally:
        sys.modules.pop(name, None)


def test_shutdown_is_accepted_only_when_enabled(serve_model):
    server = serve_model(Counted(), allow_shutdown=True)
    try:
        with grpc.insecure_channel(server.address.removeprefix("tcp://")) as channel:
            answer = service_pb2_grpc.ModelServiceStub(channel).Shutdown(
                service_pb2.ShutdownRequest(base=handshake_pb2.ShutdownRequest(reason="test")),
                timeout=10,
            )
        assert answer.base.accepted
        assert server.wait(timeout=10)
    finally:
        server.close()


def test_a_grouped_predict_answers_each_group_and_fails_a_bad_one_alone(serve_model):
    model = Counted()
    with serve_model(model) as server:
        stream = RawStream(server.address)
        try:
            for env_id in ("env-a", "env-b"):
                assert (
                    stream.resolve(env_id, CARTPOLE_SPACE).WhichOneof("kind") == "resolve_adapter"
                )

            def group(env_id, leaves, episodes):
                return interaction_pb2.PredictRequest(
                    context=interaction_pb2.AdapterContext(env_id=env_id, request_id=env_id),
                    observation=value_pb2.SpaceValue(leaves=leaves),
                    episode_info=[interaction_pb2.EpisodeInfo(episode_id=e) for e in episodes],
                )

            leaning = np.array([[0, 0, 0.1, 0], [0, 0, -0.1, 0]], np.float32)
            answer = stream.ask(
                grouped_predict=interaction_pb2.GroupedPredictRequest(
                    groups=[
                        group("env-a", [leaning.tobytes()], ["a1", "a2"]),
                        group("env-b", [leaning[:1].tobytes()[:7]], ["b1"]),
                        group("env-b", [leaning[1:].tobytes()], ["b1"]),
                        group("env-c", [leaning[:1].tobytes()], ["c1"]),
                    ]
                )
            ).grouped_predict
        finally:
            stream.close()
    outcomes = [result.WhichOneof("outcome") for result in answer.results]
    assert outcomes == ["response", "error", "response", "error"]
    actions = [
        np.frombuffer(answer.results[i].response.actions[0].leaves[0], "<i8").tolist()
        for i in (0, 2)
    ]
    assert actions == [[1, 0], [0]]
    assert answer.results[1].error.code == Code.MODEL_ERROR_CODE_INVALID_REQUEST
    assert answer.results[3].error.code == Code.MODEL_ERROR_CODE_NOT_CONFIGURED
    # The two good groups share one observation space: one model call for both.
    assert model.calls == 1 and model.rows == 3
