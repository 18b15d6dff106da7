"""Our openpi client (``OpenPIModel``) and codec against openpi's reference server.

The reference server is ``openpi-server`` on PyPI (the same code as openpi's
``serving/websocket_policy_server.py``), run in a virtual environment of its own
(``openpi_server_python``) with a ``BasePolicy`` written here: the policies below are plain numpy
functions whose source is sent to the peer's script, so the peer serves exactly the functions
the local runs call. Covered: the metadata frame (arrays in it too), arrays and numpy scalars of
every dtype openpi's wire carries both ways (what the peer decoded, what it sends back, and
arrays it makes), read-only decoded arrays, a policy that raises (our client's error carries
the server's traceback; the server goes on serving), ``/healthz``, and CartPole evaluated
through the reference server equal to the same chunk policy run locally.

(openpi's own client against rlmesh's openpi server, eight at once sharing batches, is
``test_openpi_server.py``'s ``test_eight_openpi_clients_share_batches``.)
"""

from __future__ import annotations

import contextlib
import inspect
import os
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rlmesh
from helpers import CORES, comparable
from servers import OPENPI_CLIENT_REQUIREMENTS, cached_venv, served

pytest.importorskip("websockets", reason="the openpi extra (websockets) is not installed")
from rlmesh.errors import RemoteError
from rlmesh.remote.openpi.client import OBSERVATION_KEY, OpenPIModel
from rlmesh.remote.openpi.codec import packb, unpackb
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

TIMEOUT_S = 30.0
CHUNK = 4  # the CartPole policy's H, whatever the run's execution_horizon
RUN = {"episodes": 6, "seed": 5, "max_episode_steps": 80}
# The peer runs its own packages, never this checkout's.
PEER_ENVIRONMENT = {"PYTHONPATH": ""}


# ---------------------------------------------------------------------------------- the peer's venv

# openpi-server declares openpi-client (which pins numpy<2) and websockets; both install without
# their declared dependencies, beside what they import, as openpi's client alone does.
OPENPI_SERVER_INSTALLS = [
    ["--no-deps", "openpi-server", "openpi-client"],
    OPENPI_CLIENT_REQUIREMENTS,
]


def openpi_server_venv_dir() -> Path:
    default = Path.home() / ".cache" / "rlmesh-tests" / "peer-openpi-server"
    return Path(os.environ.get("RLMESH_OPENPI_SERVER_VENV", default))


def openpi_server_python() -> str:
    """The Python of a venv holding ``openpi-server`` (openpi's ``WebsocketPolicyServer``), made
    on first use and cached under ``$RLMESH_OPENPI_SERVER_VENV`` (default
    ``~/.cache/rlmesh-tests/peer-openpi-server``); ``pytest.skip`` if pip cannot install it."""
    return cached_venv(openpi_server_venv_dir(), OPENPI_SERVER_INSTALLS, "openpi's server")


# ---------------------------------------------------------------------------------- the policies
# Plain numpy, no rlmesh: each function's source also runs in the peer's venv.

# Every dtype openpi's wire carries (it refuses only structured, object and complex ones).
NUMERIC_DTYPES = [
    "|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8",
    "<f2", "<f4", "<f8", ">i4", ">f8",
]  # fmt: skip
TEXT_DTYPES = ["<U6", "|S3"]


def sample_array(dtype: str) -> np.ndarray:
    """A 2x3 array of ``dtype`` holding its edge values (a type's least and greatest integer,
    float16's largest finite value, -0.0, non-ASCII text)."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return np.array([[True, False, True], [False, False, True]], dtype)
    if kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, info.max - 1, 7]], dtype)
    if kind == "f":
        big = 65504.0 if np.dtype(dtype).itemsize == 2 else 1e30
        return np.array([[0.5, -1.25, big], [-0.0, 3.0, -big]], dtype)
    if kind == "U":
        return np.array([["pick", "", "blöck"], ["a", "place", "é"]], dtype)
    return np.array([[b"ab", b"", b"xyz"], [b"\x00", b"q", b"zz"]], dtype)


def sample_observation() -> dict:
    """An observation of every array dtype and numpy scalar the wire carries, with a 0-d, an
    empty and a strided array, and plain values beside them."""
    return {
        "arrays": {dtype: sample_array(dtype) for dtype in NUMERIC_DTYPES + TEXT_DTYPES},
        # A float64 scalar is a Python float: msgpack sends it as a plain float (see below).
        "scalars": {
            dtype: sample_array(dtype)[0, 1]
            for dtype in NUMERIC_DTYPES
            if not isinstance(sample_array(dtype)[0, 1], float)
        },
        "zero_d": np.array(-7, np.int16),
        "empty": np.zeros((0, 3), np.float32),
        "strided": np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],
        "image": (np.arange(8 * 8 * 3) % 256).astype(np.uint8).reshape(8, 8, 3),
        "prompt": "pick up the block",
        "count": 3,
        "ratio": 0.25,
        "flag": True,
        "nested": [np.arange(3, dtype=np.uint16), "text"],
    }


def numeric_total(value) -> float:
    """Every number of ``value`` (arrays, numpy scalars, plain numbers, nested), summed."""
    if isinstance(value, dict):
        return sum(numeric_total(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(numeric_total(item) for item in value)
    if isinstance(value, str | bytes):
        return 0.0
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        return 0.0
    return float(array.astype(np.float64).sum())


def total_chunk(observation) -> np.ndarray:
    """A (3, 7) float64 chunk from all of ``observation``'s numbers."""
    steps = np.arange(1, 4, dtype=np.float64)[:, None]
    return numeric_total(observation) * steps * np.ones((1, 7))


def leaf_report(value, path="") -> dict:
    """Each array's and numpy scalar's dtype, shape and values, by path, as decoded."""
    if isinstance(value, dict):
        found = {}
        for key, item in value.items():
            found.update(leaf_report(item, f"{path}/{key}"))
        return found
    if isinstance(value, list):
        found = {}
        for index, item in enumerate(value):
            found.update(leaf_report(item, f"{path}/{index}"))
        return found
    if isinstance(value, np.ndarray | np.generic):
        return {path: [value.dtype.str, list(value.shape), value.tolist()]}
    return {}


def echo_policy(observation) -> dict:
    """What the peer decoded (``seen``), the observation itself (``echo``), the same
    observation built on the peer (``made``), and a chunk from its numbers."""
    return {
        "actions": total_chunk(observation),
        "seen": leaf_report(observation),
        "echo": observation,
        "made": sample_observation(),
    }


def cartpole_chunk(observation) -> np.ndarray:
    """A (CHUNK, 1) CartPole chunk: push toward the fall, each later action less sure of it,
    and flip about 40% of them by a hash of the observation's bits, so episodes end at varied
    steps and how much of a chunk is replayed changes them."""
    lean = float(observation[2]) + 0.3 * float(observation[3])
    noise = float(np.abs(observation).sum(dtype=np.float64)) * 1e4 % 1.0
    flips = [(noise * (k + 1)) % 1.0 < 0.4 for k in range(CHUNK)]
    return np.array([[float((lean + 0.04 * k > 0) != flips[k])] for k in range(CHUNK)], np.float32)


def cartpole_policy(observation) -> dict:
    return {"actions": cartpole_chunk(observation["observation"])}


def failing_policy(observation) -> dict:
    raise ValueError(f"this policy refuses every observation (got {sorted(observation)})")


POLICIES = {"echo": echo_policy, "cartpole": cartpole_policy, "failing": failing_policy}
SHIPPED: list[Callable[..., Any]] = [
    sample_array,
    sample_observation,
    numeric_total,
    total_chunk,
    leaf_report,
    echo_policy,
    cartpole_chunk,
    cartpole_policy,
    failing_policy,
]

PEER_SERVES = """
import sys

import numpy as np
from openpi_client import base_policy
from openpi_server import websocket_policy_server as reference

NUMERIC_DTYPES = {numeric!r}
TEXT_DTYPES = {text!r}
CHUNK = {chunk!r}

{functions}

POLICIES = {{"echo": echo_policy, "cartpole": cartpole_policy, "failing": failing_policy}}
METADATA = {{"policy": sys.argv[1], "chunk": CHUNK, "norm": np.array([0.5, 2.0], np.float32)}}


class Policy(base_policy.BasePolicy):
    def __init__(self, infer):
        self._infer = infer

    def infer(self, obs):
        return self._infer(obs)


class AnnouncedServe:
    # The reference server binds port 0 without saying which port it got; this prints it.
    serve = staticmethod(reference._server.serve)

    def __init__(self, *args, **kwargs):
        self._serving = self.serve(*args, **kwargs)

    async def __aenter__(self):
        server = await self._serving.__aenter__()
        host, port = server.sockets[0].getsockname()[:2]
        print(f"openpi-server at ws://{{host}}:{{port}}", flush=True)
        return server

    async def __aexit__(self, *exc_info):
        return await self._serving.__aexit__(*exc_info)


reference._server = type("Shim", (), {{"serve": AnnouncedServe}})
server = reference.WebsocketPolicyServer(
    Policy(POLICIES[sys.argv[1]]), host="127.0.0.1", port=0, metadata=METADATA
)
server.serve_forever()
"""


def peer_script() -> str:
    return PEER_SERVES.format(
        numeric=NUMERIC_DTYPES,
        text=TEXT_DTYPES,
        chunk=CHUNK,
        functions="\n\n".join(inspect.getsource(function) for function in SHIPPED),
    )


@pytest.fixture(scope="module")
def reference_server(tmp_path_factory) -> Iterator[Callable[[str], str]]:
    """``reference_server(kind)``: the address of openpi-server serving ``POLICIES[kind]`` in
    its own process, started on first use; every one stops after the module."""
    python = openpi_server_python()
    script = tmp_path_factory.mktemp("openpi-server") / "serves.py"
    script.write_text(peer_script())
    with contextlib.ExitStack() as stack:
        started: dict[str, str] = {}

        def start(kind: str) -> str:
            if kind not in started:
                argv = [python, str(script), kind]
                started[kind] = stack.enter_context(served(argv, env=PEER_ENVIRONMENT))
            return started[kind]

        yield start


def health(address: str) -> int:
    url = address.replace("ws://", "http://") + "/healthz"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        return answer.status


def dial(address: str) -> Any:
    return connect(address, compression=None, max_size=None, open_timeout=TIMEOUT_S)


def assert_same(got: Any, sent: Any, where: str = "") -> None:
    """``got`` (decoded) is ``sent``: equal values, arrays of the same dtype and shape."""
    if isinstance(sent, dict):
        assert isinstance(got, dict) and list(got) == list(sent), where
        for key in sent:
            assert_same(got[key], sent[key], f"{where}/{key}")
    elif isinstance(sent, list | tuple):
        assert isinstance(got, list) and len(got) == len(sent), where
        for index, (item, expected) in enumerate(zip(got, sent, strict=True)):
            assert_same(item, expected, f"{where}/{index}")
    elif isinstance(sent, np.ndarray | np.generic):
        assert type(got) is type(sent), (where, type(got), type(sent))
        assert (got.dtype.str, got.shape) == (sent.dtype.str, sent.shape), where
        np.testing.assert_array_equal(got, sent, err_msg=where)
    else:
        assert type(got) is type(sent) and got == sent, (where, got, sent)


def decoded_arrays(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, dict):
        for item in value.values():
            yield from decoded_arrays(item)
    elif isinstance(value, list):
        for item in value:
            yield from decoded_arrays(item)
    elif isinstance(value, np.ndarray):
        yield value


# ---------------------------------------------------------------------------------- the codec


def test_every_dtype_travels_both_ways_through_the_reference_server(reference_server) -> None:
    address = reference_server("echo")
    sent = sample_observation()
    with dial(address) as ws:
        metadata = unpackb(ws.recv(timeout=TIMEOUT_S))
        ws.send(packb({**sent, "float64": np.float64(-1.25)}))
        answer = unpackb(ws.recv(timeout=TIMEOUT_S))
    # np.float64 subclasses float, so openpi's encoder and ours both send it as a msgpack float.
    float64 = answer["echo"].pop("float64")
    assert type(float64) is float and float64 == -1.25 and "/float64" not in answer["seen"]
    assert metadata["policy"] == "echo" and metadata["chunk"] == CHUNK
    assert_same(metadata["norm"], np.array([0.5, 2.0], np.float32))
    # What openpi's decoder made of our frame: every dtype, shape and value as sent.
    assert answer["seen"] == leaf_report(sent)
    # What its encoder sent back of it, and of the same observation built on its side.
    assert_same(answer["echo"], sent)
    assert_same(answer["made"], sent)
    np.testing.assert_allclose(answer["actions"], total_chunk(sent), rtol=1e-12)
    assert answer["server_timing"]["infer_ms"] >= 0
    arrays = list(decoded_arrays(answer))
    assert len(arrays) > 2 * len(NUMERIC_DTYPES)
    assert not any(array.flags.writeable for array in arrays)  # read-only views of the frame


def test_a_raising_policy_sends_its_traceback_then_1011(reference_server) -> None:
    address = reference_server("failing")
    with dial(address) as ws:
        unpackb(ws.recv(timeout=TIMEOUT_S))
        ws.send(packb({"state": np.zeros(2, np.float32)}))
        error = ws.recv(timeout=TIMEOUT_S)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT_S)
    assert isinstance(error, str) and "Traceback" in error
    assert "ValueError: this policy refuses every observation (got ['state'])" in error
    assert ws.close_code == 1011
    assert health(address) == 200


# ---------------------------------------------------------------------------------- OpenPIModel


def test_openpi_model_reads_metadata_and_sends_every_dtype(reference_server) -> None:
    address = reference_server("echo")
    assert health(address) == 200
    # The reference server ignores the Api-Key header openpi's clients may send.
    model = OpenPIModel(address, api_key="unchecked", timeout_s=TIMEOUT_S)
    try:
        metadata = model.connect()
        assert metadata is model.metadata and metadata["policy"] == "echo"
        assert_same(metadata["norm"], np.array([0.5, 2.0], np.float32))
        rows = 3
        payload = {
            "arrays": {
                dtype: (np.arange(rows * 6).reshape(rows, 2, 3) % 50).astype(dtype)
                for dtype in NUMERIC_DTYPES
            },
            "image": np.stack([sample_observation()["image"] // (row + 1) for row in range(rows)]),
            "prompt": ["pick", "place", "push"],
        }
        chunks = model.predict_chunk_batch(payload, execution_horizon=2)
        assert chunks.shape == (rows, 3, 7) and chunks.dtype == np.float64
        for row in range(rows):
            lane = {
                "arrays": {dtype: array[row] for dtype, array in payload["arrays"].items()},
                "image": payload["image"][row],
            }
            np.testing.assert_allclose(chunks[row], total_chunk(lane), rtol=1e-12)
        assert len({float(chunk[0, 0]) for chunk in chunks}) == rows  # each lane its own answer
    finally:
        model.close()


def test_openpi_model_raises_the_servers_traceback_and_the_server_goes_on(
    reference_server,
) -> None:
    address = reference_server("failing")
    model = OpenPIModel(address, timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(RemoteError) as caught:
            model.predict_chunk_batch(np.zeros((2, 4), np.float32), 1)
    finally:
        model.close()
    message = str(caught.value)
    assert caught.value.address == "openpi://" + address.removeprefix("ws://")
    assert caught.value.address in message
    assert "failed: Traceback (most recent call last)" in message
    assert "websocket_policy_server.py" in message  # the reference server's own frame
    refusal = f"ValueError: this policy refuses every observation (got ['{OBSERVATION_KEY}'])"
    assert refusal in message
    # The failed connection was closed; the server still answers health checks and connects.
    assert health(address) == 200
    again = OpenPIModel(address, timeout_s=TIMEOUT_S)
    try:
        assert again.connect()["policy"] == "failing"
    finally:
        again.close()


@pytest.mark.parametrize("core", CORES)
def test_a_run_through_a_failing_reference_server_raises_remote_error(reference_server, core):
    address = reference_server("failing")
    with pytest.raises(RemoteError, match="this policy refuses every observation"):
        rlmesh.run(
            OpenPIModel(address, timeout_s=TIMEOUT_S),
            "CartPole-v1",
            episodes=2,
            num_envs=2,
            execution_horizon=2,
            core=core,
        )


class LocalCartPoleChunk(rlmesh.Model):
    """``cartpole_chunk`` as a local chunked model."""

    stateless = True

    def predict_chunk(self, obs, execution_horizon=None):
        return cartpole_chunk(obs)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("horizon", [1, CHUNK])
def test_a_run_through_the_reference_server_equals_the_local_run(
    reference_server, core, num_envs, horizon
) -> None:
    address = reference_server("cartpole")
    run = {**RUN, "num_envs": num_envs, "execution_horizon": horizon, "core": core}
    local = rlmesh.run(LocalCartPoleChunk(), "CartPole-v1", **run)
    model = OpenPIModel(address, timeout_s=TIMEOUT_S)
    remote = rlmesh.run(model, "CartPole-v1", **run)
    assert comparable(remote) == comparable(local)
    assert len(remote.episodes) == RUN["episodes"]
    assert model.metadata["policy"] == "cartpole" and model.metadata["chunk"] == CHUNK


def test_the_local_runs_compare_something() -> None:
    """The runs above compare episodes that end at varied steps, and replaying more of a chunk
    changes them."""
    runs = [
        rlmesh.run(LocalCartPoleChunk(), "CartPole-v1", execution_horizon=horizon, **RUN)
        for horizon in (1, CHUNK)
    ]
    assert len({episode.steps for episode in runs[0].episodes}) > 2
    assert comparable(runs[0]) != comparable(runs[1])
