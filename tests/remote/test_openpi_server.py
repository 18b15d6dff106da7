"""rlmesh models served over openpi's WebSocket protocol (``rlmesh.remote.openpi.server``),
driven by openpi's own client (``openpi-client``, in a venv of its own) and by a plain
``websockets`` client: metadata, arrays of several dtypes, chunks equal to the local model's,
errors that close only their connection, batching across connections, the Api-Key, /healthz,
and one episode per connection (RoboArena's reset ends it)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rlmesh
from rlmesh.remote.openpi.codec import packb, unpackb
from rlmesh.remote.openpi.server import serve_openpi
from servers import openpi_client_python, rlmesh_cli, served
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

TIMEOUT_S = 30.0

# openpi's client in its own venv: each client is a thread with its own WebsocketClientPolicy
# and its list of observations; all start inferring together. An error ends that client.
PEER = """
import sys, threading
from openpi_client import msgpack_numpy, websocket_client_policy

host, port, jobs_path, out_path, api_key = sys.argv[1:6]
jobs = msgpack_numpy.unpackb(open(jobs_path, "rb").read())
results = [None] * len(jobs)
start = threading.Barrier(len(jobs))

def client(i):
    out = {"metadata": None, "answers": [], "error": None}
    results[i] = out
    try:
        policy = websocket_client_policy.WebsocketClientPolicy(
            host=host, port=int(port), api_key=api_key or None
        )
        out["metadata"] = policy.get_server_metadata()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        start.abort()
        return
    try:
        start.wait(timeout=60)
        for obs in jobs[i]:
            out["answers"].append(policy.infer(obs))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"

threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(timeout=120)
open(out_path, "wb").write(msgpack_numpy.packb(results))
"""


def run_peer(
    address: str, jobs: list[list[dict[str, Any]]], tmp_path: Path, api_key: str = ""
) -> list[dict[str, Any]]:
    """openpi's client: one thread per list of observations; what each received."""
    python = openpi_client_python()
    host, port = address.removeprefix("ws://").rsplit(":", 1)
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    jobs_path, out_path = tmp_path / "jobs.msgpack", tmp_path / "out.msgpack"
    jobs_path.write_bytes(packb(jobs))
    done = subprocess.run(
        [python, str(script), host, port, str(jobs_path), str(out_path), api_key],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return unpackb(out_path.read_bytes())


class Chunker(rlmesh.Model):
    """A chunked model of every dtype openpi's wire carries; raises on a negative total."""

    def predict_chunk_batch(self, obs, execution_horizon=None):
        rows = len(obs["prompt"])
        total = (
            obs["image"].reshape(rows, -1).astype(np.float64).sum(axis=1)
            + obs["state"].astype(np.float64).sum(axis=1)
            + obs["f64"].sum(axis=1)
            + obs["i16"].astype(np.float64).sum(axis=1)
            + obs["flags"].sum(axis=1)
            + obs["count"]
            + np.array([len(text) for text in obs["prompt"]])
        )
        if np.any(total < 0):
            raise ValueError("a negative total: this model refuses it")
        steps = np.arange(1, 4, dtype=np.float64)[None, :, None]
        return (total[:, None, None] * steps * np.ones((1, 1, 7))).astype(np.float32)


def observation(seed: int, sign: float = 1.0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        "state": (sign * rng.random(8)).astype(np.float32),
        "f64": rng.random(2),
        "i16": rng.integers(-5, 50, 3).astype(np.int16),
        "flags": np.array([True, False, True]),
        "count": seed,
        "prompt": f"pick the block {seed}",
    }


def local_chunk(model: Chunker, obs: dict[str, Any]) -> np.ndarray:
    batched = {
        key: [value] if isinstance(value, str) else np.asarray(value)[None]
        for key, value in obs.items()
    }
    return model.predict_chunk_batch(batched)[0]


def health(address: str) -> int:
    url = address.replace("ws://", "http://") + "/healthz"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        return answer.status


# ---------------------------------------------------------------------------------- openpi's client


def test_openpi_client_gets_metadata_and_the_local_chunks(tmp_path: Path) -> None:
    model = Chunker()
    good = [observation(seed) for seed in range(3)]
    bad = observation(9, sign=-1e6)
    with serve_openpi(model, metadata={"policy": "chunker", "H": 3}, api_key="s3cret") as server:
        assert health(server.address) == 200
        clients = run_peer(server.address, [good, [good[0], bad, good[1]]], tmp_path, "s3cret")
        # The failed connection's end left the other and the server serving.
        assert health(server.address) == 200
    first, failing = clients
    assert first["error"] is None and failing["metadata"] == {"policy": "chunker", "H": 3}
    assert first["metadata"] == {"policy": "chunker", "H": 3}
    for obs, answer in zip(good, first["answers"], strict=True):
        assert answer["actions"].shape == (3, 7) and answer["actions"].dtype == np.float32
        np.testing.assert_array_equal(answer["actions"], local_chunk(model, obs))
        assert answer["server_timing"]["infer_ms"] >= 0
    # openpi's client raises on the error frame, with our message and the model's traceback.
    assert len(failing["answers"]) == 1
    assert failing["error"].startswith("RuntimeError: Error in inference server")
    assert "a negative total: this model refuses it" in failing["error"]
    assert "Traceback" in failing["error"]


class SlowBatched(rlmesh.Model):
    """A batched model costing a few ms per call, so concurrent requests pile up."""

    def predict_batch(self, obs):
        time.sleep(0.005)
        return obs["state"] * 2 + obs["count"][:, None]


def test_eight_openpi_clients_share_batches(tmp_path: Path) -> None:
    jobs = [
        [{"state": np.full(4, client + step / 10, np.float32), "count": step} for step in range(6)]
        for client in range(8)
    ]
    with serve_openpi(SlowBatched(), max_wait_ms=20, max_batch=4) as server:
        together = run_peer(server.address, jobs, tmp_path)
        stats = server.stats()
    assert stats.requests == 48 and stats.rows == 48
    assert 1 < stats.largest_batch <= 4 and stats.model_calls < 48
    with serve_openpi(SlowBatched()) as server:
        # One client asking for every observation in turn: each answered alone.
        (alone,) = run_peer(server.address, [[obs for job in jobs for obs in job]], tmp_path)
        assert server.stats().largest_batch == 1
    solo = [alone["answers"][i : i + 6] for i in range(0, 48, 6)]
    for client, job in zip(together, jobs, strict=True):
        assert client["error"] is None
        for obs, answer in zip(job, client["answers"], strict=True):
            alone = SlowBatched().predict_batch(
                {"state": obs["state"][None], "count": np.array([obs["count"]])}
            )
            np.testing.assert_array_equal(answer["actions"], alone)
    for client, answers in zip(together, solo, strict=True):
        for answer, solo_answer in zip(client["answers"], answers, strict=True):
            np.testing.assert_array_equal(answer["actions"], solo_answer["actions"])


def test_inference_does_not_block_other_connections() -> None:
    release = threading.Event()

    def model(obs):
        if obs["slow"]:
            release.wait(TIMEOUT_S)
        return 1

    with serve_openpi(model) as server, connect(server.address) as slow:
        slow.recv(timeout=TIMEOUT_S)
        slow.send(packb({"slow": True}))
        try:
            # While the model is busy: the health check and a new client's metadata come back.
            assert health(server.address) == 200
            with connect(server.address, open_timeout=5) as other:
                assert unpackb(other.recv(timeout=5)) == {}
        finally:
            release.set()
        assert unpackb(slow.recv(timeout=TIMEOUT_S))["actions"].tolist() == [[1]]


# ---------------------------------------------------------------------------------- access, frames


def test_api_key_is_checked_before_the_websocket_opens() -> None:
    with serve_openpi(lambda obs: 0, api_key="k1") as server:
        for headers in (None, {"Authorization": "Api-Key wrong"}, {"Authorization": "Bearer k1"}):
            with pytest.raises(InvalidStatus) as refused:
                connect(server.address, additional_headers=headers, open_timeout=TIMEOUT_S)
            assert refused.value.response.status_code == 401
        assert health(server.address) == 200  # the health check needs no key
        with connect(
            server.address, additional_headers={"Authorization": "Api-Key k1"}, open_timeout=5
        ) as ws:
            assert unpackb(ws.recv(timeout=TIMEOUT_S)) == {}
            ws.send(packb({"x": 1}))
            assert unpackb(ws.recv(timeout=TIMEOUT_S))["actions"].tolist() == [[0]]


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",  # never valid msgpack
        packb({"x": {b"__ndarray__": True, b"data": b"abc", b"dtype": "<f4", b"shape": [2]}}),
        packb([1, 2, 3]),
        "a text frame",
        packb({"x": 1, "endpoint": "train"}),
    ],
    ids=["not-msgpack", "bad-array", "not-a-map", "text", "unknown-endpoint"],
)
def test_a_malformed_frame_closes_only_its_connection(frame: Any) -> None:
    with (
        serve_openpi(lambda obs: obs["x"] + 1) as server,
        connect(server.address) as good,
        connect(server.address) as bad,
    ):
        good.recv(timeout=TIMEOUT_S)
        bad.recv(timeout=TIMEOUT_S)
        bad.send(frame)
        error = bad.recv(timeout=TIMEOUT_S)
        assert isinstance(error, str) and "malformed request" in error
        with pytest.raises(ConnectionClosed):
            bad.recv(timeout=TIMEOUT_S)
        assert bad.close_code == 1011
        for step in range(3):
            good.send(packb({"x": np.float32(step)}))
            assert unpackb(good.recv(timeout=TIMEOUT_S))["actions"].tolist() == [[step + 1]]


def test_a_frame_over_the_limit_closes_its_connection() -> None:
    with serve_openpi(lambda obs: 0, max_message_mb=0.01) as server:
        with connect(server.address) as ws:
            ws.recv(timeout=TIMEOUT_S)
            ws.send(packb({"x": np.zeros(10_000)}))
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=TIMEOUT_S)
            assert ws.close_code == 1009
        assert health(server.address) == 200


def test_loopback_by_default_and_a_bad_address_is_refused() -> None:
    with serve_openpi(lambda obs: 0) as server:
        assert server.address.startswith("ws://127.0.0.1:")
    with pytest.raises(ValueError, match="is not openpi://host:port, ws://host:port or host:port"):
        serve_openpi(lambda obs: 0, "tcp://127.0.0.1:0")
    server.close()  # a second close does nothing
    assert server.wait(0)


# ---------------------------------------------------------------------------------- episodes


class Counting(rlmesh.Model):
    """Answers how many times its episode was predicted for; records the episodes' ends."""

    def __init__(self) -> None:
        self.ended: list[int] = []
        self.lock = threading.Lock()

    def predict(self, obs, context):
        return np.array([context["predict_index"], context["episode_id"]], np.int64)

    def on_episode_end(self, episode_id):
        with self.lock:
            self.ended.append(episode_id)


def infer(ws: Any, obs: dict[str, Any]) -> list[int]:
    ws.send(packb(obs))
    return unpackb(ws.recv(timeout=TIMEOUT_S))["actions"][0].tolist()


def test_one_episode_per_connection_and_reset_starts_the_next() -> None:
    model = Counting()
    with serve_openpi(model) as server:
        with connect(server.address) as first, connect(server.address) as second:
            first.recv(timeout=TIMEOUT_S)
            second.recv(timeout=TIMEOUT_S)
            a = [infer(first, {"x": 0}) for _ in range(3)]
            b = [infer(second, {"x": 0}) for _ in range(2)]
            assert [index for index, _ in a] == [0, 1, 2]
            assert [index for index, _ in b] == [0, 1]
            assert len({episode for _, episode in a}) == 1 and a[0][1] != b[0][1]
            first.send(packb({"endpoint": "reset"}))
            assert unpackb(first.recv(timeout=TIMEOUT_S)) == "reset successful"
            assert model.ended == [a[0][1]]
            again = infer(first, {"x": 0, "endpoint": "infer"})
            assert again[0] == 0 and again[1] not in (a[0][1], b[0][1])
            assert infer(second, {"x": 0})[0] == 2  # the other connection's episode goes on
        deadline = time.monotonic() + TIMEOUT_S
        while len(model.ended) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(model.ended) == sorted([a[0][1], b[0][1], again[1]])
        with connect(server.address) as reconnected:  # a new connection: a new episode
            reconnected.recv(timeout=TIMEOUT_S)
            assert infer(reconnected, {"x": 0})[0] == 0


def test_closing_the_server_ends_open_connections_and_their_episodes() -> None:
    model = Counting()
    server = serve_openpi(model)
    try:
        with connect(server.address) as ws:
            ws.recv(timeout=TIMEOUT_S)
            (_, episode) = infer(ws, {"x": 0})
            server.close()
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=TIMEOUT_S)
        assert server.wait(TIMEOUT_S) and model.ended == [episode]
    finally:
        server.close()


# ---------------------------------------------------------------------------------- entry points


SPEC_POLICY = """
import numpy as np
import rlmesh
from rlmesh.adapters import ModelSpec, State, Text


class Policy(rlmesh.Model):
    spec = ModelSpec(input={"state": State("joints"), "prompt": Text("instruction")})

    def predict_batch(self, obs):
        assert sorted(obs) == ["prompt", "state"], sorted(obs)
        lengths = np.array([len(text) for text in obs["prompt"]], np.float32)
        return obs["state"] + lengths[:, None]
"""


def test_serve_model_and_the_cli_speak_openpi(tmp_path: Path) -> None:
    policy = tmp_path / "policy.py"
    policy.write_text(SPEC_POLICY)
    sys.path.insert(0, str(tmp_path))
    try:
        from policy import Policy  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    obs = {"state": np.ones(3, np.float32), "prompt": "abcd", "extra": np.zeros(2)}
    key = {"Authorization": "Api-Key t"}
    with (
        rlmesh.serve_model(Policy(), "127.0.0.1:0", protocol="openpi", token="t") as server,
        connect(server.address, additional_headers=key) as ws,
    ):
        ws.recv(timeout=TIMEOUT_S)
        assert infer(ws, obs) == [5.0, 5.0, 5.0]
    cli = rlmesh_cli("serve", "model", f"{policy}:Policy", "--protocol", "openpi")
    with served(cli) as address:
        assert address.startswith("ws://127.0.0.1:")
        with connect(address, open_timeout=TIMEOUT_S) as ws:
            assert unpackb(ws.recv(timeout=TIMEOUT_S)) == {}
            assert infer(ws, obs) == [5.0, 5.0, 5.0]
            ws.send(packb({"state": np.ones(3, np.float32)}))  # no prompt: the spec reads one
            error = ws.recv(timeout=TIMEOUT_S)
            assert isinstance(error, str) and "'prompt'" in error
