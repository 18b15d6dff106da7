"""rlmesh models served over vla-eval's WebSocket protocol (``rlmesh.remote.vlaeval.server``),
driven by vla-eval's own ``Connection`` (in a venv of its own) and by a plain ``websockets``
client: the hello, chunks replayed one action per observation as vla-eval's benchmarks take
them, model errors and malformed messages answered with ``error`` on a session that goes on,
batching across sessions, episodes keyed by episode_start / episode_end, the token, /health
and /config."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import rlmesh
from rlmesh.remote.vlaeval.codec import pack_message, unpack_message
from rlmesh.remote.vlaeval.server import serve_vlaeval
from servers import rlmesh_cli, served
from test_vlaeval_codec import run_peer
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

TIMEOUT_S = 30.0

# vla-eval's Connection in its own venv: each client connects (hello), then, all together,
# runs its episodes: episode_start, one act() per observation, episode_end. An act() that
# raises (the server's error) is recorded and the episode goes on.
PEER = """
import asyncio, sys
from vla_eval.connection import Connection
from vla_eval.protocol.messages import Message, MessageType, pack_message, unpack_message

url, jobs_path, out_path = sys.argv[1:4]
jobs = unpack_message(open(jobs_path, "rb").read()).payload["jobs"]

async def client(jobs, connected, go):
    out = {"server_info": None, "episodes": [], "error": None}
    conn = Connection(url, timeout=60, max_retries=1)
    try:
        await conn.connect()
        out["server_info"] = conn.server_info
        connected.append(True)
        await go.wait()
        for number, episode in enumerate(jobs):
            await conn.start_episode({"task": {"name": "t", "episode": number}})
            answers = []
            for obs in episode:
                try:
                    answers.append(await conn.act(obs))
                except RuntimeError as exc:
                    answers.append({"error": str(exc)})
            await conn.end_episode({"metrics": {"success": True}})
            out["episodes"].append(answers)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()
    return out

async def main():
    connected, go = [], asyncio.Event()
    tasks = [asyncio.ensure_future(client(job, connected, go)) for job in jobs]
    for _ in range(600):
        if len(connected) == len(jobs) or any(task.done() for task in tasks):
            break
        await asyncio.sleep(0.05)
    go.set()
    return await asyncio.gather(*tasks)

results = asyncio.run(main())
open(out_path, "wb").write(pack_message(Message(MessageType.ACTION, {"results": results})))
"""


def run_vlaeval_clients(
    url: str, jobs: list[list[list[dict[str, Any]]]], tmp_path: Path
) -> list[dict[str, Any]]:
    """vla-eval's clients: one per job, a job a list of episodes of observations."""
    jobs_path, out_path = tmp_path / "jobs.msgpack", tmp_path / "out.msgpack"
    jobs_path.write_bytes(pack_message("observation", {"jobs": jobs}, 0))
    run_peer(PEER, url, str(jobs_path), str(out_path))
    return unpack_message(out_path.read_bytes()).payload["results"]


class Chunker(rlmesh.Model):
    """A chunked model reading an image, a state and the task text; refuses a negative state."""

    def predict_chunk_batch(self, obs, execution_horizon=None):
        rows = len(obs["task_description"])
        total = (
            obs["images"]["main"].reshape(rows, -1).astype(np.float64).sum(axis=1) / 1000
            + obs["state"].astype(np.float64).sum(axis=1)
            + np.array([len(text) for text in obs["task_description"]])
        )
        if np.any(obs["state"] < 0):
            raise ValueError("a negative state: this model refuses it")
        steps = np.arange(1, 6, dtype=np.float64)[None, :, None]
        return (total[:, None, None] * steps * np.ones((1, 1, 7))).astype(np.float32)


def observation(seed: int, sign: float = 1.0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "images": {"main": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)},
        "state": (sign * rng.random(8)).astype(np.float32),
        "task_description": f"pick the block {seed}",
    }


def local_chunk(model: Chunker, obs: dict[str, Any]) -> np.ndarray:
    batched = {
        "images": {"main": obs["images"]["main"][None]},
        "state": obs["state"][None],
        "task_description": [obs["task_description"]],
    }
    return model.predict_chunk_batch(batched)[0]


def replayed(model: Chunker, episode: list[dict[str, Any]], horizon: int) -> list[Any]:
    """What a server replaying each chunk's first ``horizon`` actions answers, step by step;
    "error" where the model fails (nothing is then replayed)."""
    answers, queue = [], []
    for obs in episode:
        if not queue:
            if np.any(obs["state"] < 0):
                answers.append("error")
                continue
            queue = list(local_chunk(model, obs)[:horizon])
        answers.append(queue.pop(0))
    return answers


def http_get(url: str) -> tuple[int, str, Any]:
    """Status, content type and JSON body of a GET (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.headers["Content-Type"], json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read())


def http_url(address: str, path: str) -> str:
    return address.replace("ws://", "http://") + path


# ------------------------------------------------------------------------------ vla-eval's client


def test_vlaeval_clients_get_one_replayed_action_per_observation(tmp_path: Path) -> None:
    model = Chunker()
    first = [[observation(seed) for seed in range(7)], [observation(seed) for seed in (7, 8)]]
    # A failing observation at a chunk's start: an error answer, and the session goes on.
    failing = [[observation(10), observation(11), observation(12), observation(13, -1.0)]]
    failing[0] += [observation(14), observation(15)]
    with serve_vlaeval(model, execution_horizon=3, metadata={"policy": "chunker"}) as server:
        clients = run_vlaeval_clients(server.address, [first, failing], tmp_path)
        stats = server.stats()
    for client in clients:
        assert client["error"] is None
        info = client["server_info"]
        assert info["protocol_version"] == 1 and info["policy"] == "chunker"
        assert info["capabilities"] == {"action_chunks": True}
        assert info["harness_version"].startswith("rlmesh ")
    for client, job in zip(clients, [first, failing], strict=True):
        for answers, episode in zip(client["episodes"], job, strict=True):
            for answer, expected in zip(answers, replayed(model, episode, 3), strict=True):
                if isinstance(expected, str):
                    assert "observation_failed: ValueError: a negative state" in answer["error"]
                    continue
                assert answer["actions"].shape == (7,) and answer["actions"].dtype == np.float32
                np.testing.assert_array_equal(answer["actions"], expected)
    # The model's answered predictions: 7 steps of the first client's first episode took 3
    # chunks, its 2 steps after episode_start 1 (the rest of the chunk was dropped); the
    # failing client's took 2 (its failure answers nothing).
    assert stats.requests == 3 + 1 + 2


class SlowBatched(rlmesh.Model):
    """A batched model costing a few ms per call, so concurrent observations pile up."""

    def predict_batch(self, obs):
        time.sleep(0.005)
        return obs["state"] * 2 + obs["count"][:, None]


def test_eight_vlaeval_clients_share_batches(tmp_path: Path) -> None:
    jobs = [
        [
            [
                {"state": np.full(4, client + step / 10, np.float32), "count": step}
                for step in range(6)
            ]
        ]
        for client in range(8)
    ]
    with serve_vlaeval(SlowBatched(), max_wait_ms=20, max_batch=4) as server:
        clients = run_vlaeval_clients(server.address, jobs, tmp_path)
        stats = server.stats()
    assert stats.requests == 48 and stats.rows == 48
    assert 1 < stats.largest_batch <= 4 and stats.model_calls < 48
    for client, job in zip(clients, jobs, strict=True):
        assert client["error"] is None
        for obs, answer in zip(job[0], client["episodes"][0], strict=True):
            alone = SlowBatched().predict_batch(
                {"state": obs["state"][None], "count": np.array([obs["count"]])}
            )[0]
            np.testing.assert_array_equal(answer["actions"], alone)


def test_the_token_in_the_url_lets_vlaevals_connection_in(tmp_path: Path) -> None:
    job = [[[{"state": np.ones(2, np.float32), "count": 1}]]]
    with serve_vlaeval(SlowBatched(), token="s3cret") as server:
        (allowed,) = run_vlaeval_clients(f"{server.address}/?token=s3cret", job, tmp_path)
        (refused,) = run_vlaeval_clients(f"{server.address}/?token=wrong", job, tmp_path)
    assert allowed["error"] is None
    np.testing.assert_array_equal(allowed["episodes"][0][0]["actions"], [3.0, 3.0])
    assert refused["error"].startswith("ConnectionError") and refused["episodes"] == []


# ------------------------------------------------------------------------------ sessions by hand


def say(ws: Any, kind: str, payload: Any, seq: int) -> None:
    ws.send(pack_message(kind, payload, seq))


def hear(ws: Any) -> Any:
    return unpack_message(ws.recv(timeout=TIMEOUT_S))


def act(ws: Any, obs: dict[str, Any], seq: int) -> Any:
    say(ws, "observation", obs, seq)
    answer = hear(ws)
    assert (answer.type, answer.seq) == ("action", seq), answer
    return answer.payload["actions"]


def test_whole_chunks_for_a_client_that_asks_with_its_horizon_and_seed() -> None:
    class Horizon(rlmesh.Model):
        def predict_chunk(self, obs, execution_horizon=None, context=None):
            # Six actions, whatever the horizon: the horizon and seed in every one.
            return np.array(
                [[execution_horizon, context["episode_seed"] or -1, k] for k in range(6)]
            )

    with serve_vlaeval(Horizon()) as server, connect(server.address) as ws:
        say(ws, "hello", {"capabilities": {"action_chunks": True}}, 1)
        assert hear(ws).payload["capabilities"] == {"action_chunks": True}
        say(ws, "episode_start", {"task": {}, "execution_horizon": 4, "seed": 17}, 2)
        chunk = act(ws, {"x": 0}, 3)
        assert chunk.shape == (6, 3) and chunk[:, :2].tolist() == [[4, 17]] * 6
        say(ws, "episode_start", {"execution_horizon": 1}, 4)  # un-chunked: (1, D)
        assert act(ws, {"x": 0}, 5).tolist() == [[1, -1, 0]]
        say(ws, "episode_start", {}, 6)  # the server's default horizon, 2
        assert act(ws, {"x": 0}, 7)[:, 0].tolist() == [2] * 6


class Counting(rlmesh.Model):
    """Answers its episode's prediction count and id; records the episodes' ends."""

    def __init__(self) -> None:
        self.ended: list[int] = []
        self.lock = threading.Lock()

    def predict(self, obs, context):
        return np.array([context["predict_index"], context["episode_id"]], np.int64)

    def on_episode_end(self, episode_id):
        with self.lock:
            self.ended.append(episode_id)


def _ended(model: Counting, count: int) -> list[int]:
    deadline = time.monotonic() + TIMEOUT_S
    while len(model.ended) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return sorted(model.ended)


def test_episode_messages_key_each_sessions_episodes() -> None:
    model = Counting()
    with serve_vlaeval(model) as server:
        with connect(server.address) as first, connect(server.address) as second:
            # Before any episode_start: one episode, as vla-eval's server allows.
            a = [act(first, {"x": 0}, seq).tolist() for seq in range(1, 4)]
            say(second, "episode_start", {"task": {}}, 1)
            b = [act(second, {"x": 0}, seq).tolist() for seq in range(2, 4)]
            assert [index for index, _ in a] == [0, 1, 2] and [index for index, _ in b] == [0, 1]
            assert a[0][1] != b[0][1]
            say(first, "episode_start", {"task": {}}, 4)  # ends the first episode
            again = act(first, {"x": 0}, 5).tolist()
            assert again[0] == 0 and again[1] not in (a[0][1], b[0][1])
            assert _ended(model, 1) == [a[0][1]]
            say(second, "episode_end", {"metrics": {}}, 4)
            assert _ended(model, 2) == sorted([a[0][1], b[0][1]])
            assert act(second, {"x": 0}, 5)[0] == 0  # a new episode without episode_start
        # Closing the connections ended their running episodes.
        assert len(_ended(model, 4)) == 4


def test_inference_does_not_block_other_sessions() -> None:
    release = threading.Event()

    def model(obs):
        if obs["slow"]:
            release.wait(TIMEOUT_S)
        return 1

    with serve_vlaeval(model) as server, connect(server.address) as slow:
        say(slow, "observation", {"slow": True}, 1)
        try:
            # While the model is busy: the health check and another session's hello answer.
            assert http_get(http_url(server.address, "/health"))[0] == 200
            with connect(server.address, open_timeout=5) as other:
                say(other, "hello", {}, 1)
                assert unpack_message(other.recv(timeout=5)).type == "hello"
        finally:
            release.set()
        assert hear(slow).payload["actions"].tolist() == [1]


def _frame(**fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("frame", "seq", "says"),
    [
        (b"\xc1", 0, "not a msgpack message"),
        ("a text frame", 0, "a text frame"),
        (_frame(type="observation", payload={}, seq=3), 3, "without timestamp"),
        (_frame(type="reset", payload={}, seq=4, timestamp=0.0), 4, "message type 'reset'"),
        (
            _frame(
                type="observation",
                payload={"x": {"__ndarray__": True, "data": b"ab", "dtype": "<f4", "shape": [1]}},
                seq=5,
                timestamp=0.0,
            ),
            5,
            "needs 4 bytes",
        ),
        (pack_message("observation", [1, 2], 6), 6, "payload is a list"),
        (pack_message("observation", {"x": ["a", 1]}, 7), 7, "makes no numeric array"),
        (pack_message("action", {"actions": np.zeros(2)}, 8), 8, "of type 'action' from a client"),
        (pack_message("episode_start", {"execution_horizon": 0}, 9), 9, "execution_horizon 0"),
    ],
    ids=[
        "not-msgpack",
        "text",
        "missing-field",
        "unknown-type",
        "bad-array",
        "payload-not-a-map",
        "not-numeric",
        "action-from-client",
        "bad-horizon",
    ],
)
def test_an_invalid_message_is_answered_with_an_error_and_the_session_goes_on(
    frame: Any, seq: int, says: str
) -> None:
    with serve_vlaeval(lambda obs: obs["x"] + 1) as server, connect(server.address) as ws:
        ws.send(frame)
        error = hear(ws)
        assert (error.type, error.seq) == ("error", seq)
        assert (
            error.payload["error"].startswith("invalid_message: ")
            and says in error.payload["error"]
        )
        for step in range(2):  # the same connection still answers
            assert act(ws, {"x": np.float32(step)}, 10 + step).tolist() == [step + 1]


def test_a_model_error_is_answered_with_its_traceback_and_the_session_goes_on() -> None:
    def model(obs):
        if obs["x"] < 0:
            raise ValueError("negative x")
        return obs["x"] * (1j if obs["x"] == 3 else 1)

    with serve_vlaeval(model) as server, connect(server.address) as ws:
        say(ws, "observation", {"x": -1}, 1)
        error = hear(ws)
        assert (error.type, error.seq) == ("error", 1)
        assert error.payload["error"] == "observation_failed: ValueError: negative x"
        assert "Traceback" in error.payload["traceback"]
        assert act(ws, {"x": 2}, 2).tolist() == [2]
        say(ws, "observation", {"x": 3}, 3)  # a complex action cannot travel
        error = hear(ws)
        assert (error.type, error.seq) == ("error", 3)
        assert (
            "observation_failed: TypeError: an array of dtype complex128" in error.payload["error"]
        )
        assert act(ws, {"x": 4}, 4).tolist() == [4]


def test_a_frame_over_the_limit_closes_its_connection() -> None:
    with serve_vlaeval(lambda obs: 0, max_message_mb=0.01) as server:
        with connect(server.address) as ws:
            say(ws, "observation", {"x": np.zeros(10_000)}, 1)
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=TIMEOUT_S)
            assert ws.close_code == 1009
        assert http_get(http_url(server.address, "/health"))[0] == 200


# ---------------------------------------------------------------------------------- HTTP, access


def test_health_and_config_answer_json_and_config_changes_the_batching() -> None:
    with serve_vlaeval(lambda obs: 0, max_batch=8, max_wait_ms=2, token="k") as server:
        status, kind, body = http_get(http_url(server.address, "/health"))
        assert (status, kind, body) == (200, "application/json", {"status": "ok"})
        status, kind, body = http_get(http_url(server.address, "/config"))
        assert (status, kind, body["applied"]) == (200, "application/json", {})
        assert body["config"]["max_batch_size"] == 8 and body["config"]["max_wait_time"] == 0.002
        # Changes need the token (given in the query, as vla-eval's tools can).
        assert http_get(http_url(server.address, "/config?max_batch_size=2"))[0] == 401
        change = "/config?max_batch_size=2&max_wait_time=0.5&token=k"
        status, _, body = http_get(http_url(server.address, change))
        assert status == 200 and body["applied"] == {"max_batch_size": 2, "max_wait_time": 0.5}
        assert server._batcher.max_batch == 2 and server._batcher.max_wait_s == 0.5
        status, _, body = http_get(http_url(server.address, "/config?max_batch_size=0&token=k"))
        assert status == 422 and "bad value for max_batch_size" in body["errors"][0]
        status, _, body = http_get(http_url(server.address, "/config?colour=red&token=k"))
        assert status == 422 and "unknown key: colour" in body["errors"][0]


def test_the_token_is_checked_before_the_websocket_opens() -> None:
    with serve_vlaeval(lambda obs: 0, token="k1") as server:
        for headers, path in [
            (None, ""),
            ({"Authorization": "Bearer wrong"}, ""),
            ({"Authorization": "Api-Key k1"}, ""),
            (None, "/?token=k2"),
        ]:
            with pytest.raises(InvalidStatus) as refused:
                connect(server.address + path, additional_headers=headers, open_timeout=5)
            assert refused.value.response.status_code == 401
        for headers, path in [({"Authorization": "Bearer k1"}, ""), (None, "/?token=k1")]:
            with connect(server.address + path, additional_headers=headers, open_timeout=5) as ws:
                assert act(ws, {"x": 1}, 1).tolist() == [0]


def test_loopback_by_default_and_bad_arguments_are_refused() -> None:
    with serve_vlaeval(lambda obs: 0) as server:
        assert server.address.startswith("ws://127.0.0.1:")
    with pytest.raises(ValueError, match="is not vlaeval://host:port"):
        serve_vlaeval(lambda obs: 0, "tcp://127.0.0.1:0")
    for bad in ({"execution_horizon": 0}, {"image_format": "jpeg"}, {"max_message_mb": 0}):
        with pytest.raises(ValueError):
            serve_vlaeval(lambda obs: 0, **bad)
    server.close()  # a second close does nothing
    assert server.wait(0)


# ---------------------------------------------------------------------------------- the CLI

SPEC_POLICY = """
import numpy as np
import rlmesh
from rlmesh.adapters import ModelSpec, State, Text


class Policy(rlmesh.Model):
    spec = ModelSpec(input={"state": State("joints"), "task_description": Text("instruction")})

    def predict_batch(self, obs):
        assert sorted(obs) == ["state", "task_description"], sorted(obs)
        lengths = np.array([len(text) for text in obs["task_description"]], np.float32)
        return obs["state"] + lengths[:, None]
"""


def test_rlmesh_serve_model_speaks_vlaeval(tmp_path: Path) -> None:
    policy = tmp_path / "policy.py"
    policy.write_text(SPEC_POLICY)
    obs = {"state": np.ones(3, np.float32), "task_description": "abcd", "extra": np.zeros(2)}
    cli = rlmesh_cli("serve", "model", f"{policy}:Policy", "--protocol", "vla-eval")
    with served(cli) as address:
        assert address.startswith("ws://127.0.0.1:")
        with connect(address, open_timeout=TIMEOUT_S) as ws:
            say(ws, "hello", {"protocol_version": 1}, 1)
            assert hear(ws).payload["model_server"] == "Policy"
            assert act(ws, obs, 2).tolist() == [5.0, 5.0, 5.0]
            say(ws, "observation", {"state": np.ones(3, np.float32)}, 3)  # no text
            error = hear(ws)
            assert error.type == "error" and "'task_description'" in error.payload["error"]
