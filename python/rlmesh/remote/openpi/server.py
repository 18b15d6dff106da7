"""Serving any rlmesh model to openpi's own clients: ``serve_openpi`` and ``OpenPIServer``.

openpi's clients (``openpi_client.websocket_client_policy.WebsocketClientPolicy``, RoboArena's)
dial ``ws://host:port``, read one binary frame of metadata, then send binary
``msgpack(observation)`` frames, one at a time, each answered by a binary
``msgpack({"actions": chunk, "server_timing": {...}})`` frame (``rlmesh.remote.openpi.codec``).

How an observation becomes the model's input:

- a model whose ``spec`` (a ``ModelSpec``) has a dict input gets a dict with the spec's slots:
  the observation must hold each slot under the slot's name (nested slots in nested dicts, or
  under the flat key ``"a/b"``); other keys of the observation are dropped. A spec of one leaf
  gets the observation's value under the leaf's key. The client sends what the model
  consumes (sizes, layouts and dtypes already as the spec says, as rlmesh's driver would
  assemble them); the server converts nothing.
- a model without a spec (or whose spec has no input) gets the observation dict as it is
  (minus RoboArena's ``"endpoint"``), as one lane: text stays ``str``, lists become arrays.

Arrays reach the model as decoded: read-only views of the message (as openpi's own server hands
them over). A batched corner gets each leaf with a leading lane axis, a text leaf as a list of
strings.

What goes back: a model with a chunk corner is served chunked (its chunk corner is told
``execution_horizon``, default 2: openpi's clients do not say how many actions they replay) and
its ``(H, D)`` chunk is sent as ``actions``; a model without one returns one action, sent as a
chunk of one, ``(1, D)`` (a scalar action as ``(1, 1)``). An action that is a dict is sent as the
result itself, and must hold ``"actions"``. Dtypes stay the model's.

Batching: every connection's requests go to one ``Batcher`` (``rlmesh.remote.batching``), which
fuses the requests of all connections whose inputs have one structure (keys, dtypes and shapes)
into one call of the model's batched corner, of at most ``max_batch`` rows, waiting at most
``max_wait_ms`` for others to join (not at all once every connection has a request queued).
The model runs on worker threads, never on the event loop, so pings, health checks and other
connections' frames go on while it infers. A call of several requests that fails is retried
request by request, so only the requests the model fails on fail (a corner's ``context`` then
counts the failed call in its ``predict_index``).

Episodes: openpi's protocol has none, so **one connection is one episode**: the episode starts
with the connection's first inference and ends when the connection closes (a client that
reconnects starts a new one), and RoboArena's ``{"endpoint": "reset"}`` request ends the
connection's episode (answered with the msgpack string ``"reset successful"``); the next
inference starts a new one. Per-episode contexts (a corner's ``context``) and
``Model.on_episode_end`` follow these episodes.

Failures: a frame that is not openpi's msgpack (or not a map, or missing a slot the spec names),
and a model that raises, are answered on that connection only by a text frame holding the
error (the traceback for a model error), then close code 1011; the other connections go on. A
frame over ``max_message_mb`` closes its connection with code 1009.

Access: loopback by default; with ``api_key``, the WebSocket upgrade needs the header
``Authorization: Api-Key <key>`` and is otherwise refused with HTTP 401 before it opens.
``GET /healthz`` answers 200 without a key.

Example:
    >>> import numpy as np
    >>> from websockets.sync.client import connect
    >>> from rlmesh.remote.openpi.codec import packb, unpackb
    >>> with serve_openpi(lambda obs: obs["state"] * 2, metadata={"name": "doubler"}) as server:
    ...     with connect(server.address, compression=None) as ws:
    ...         metadata = unpackb(ws.recv())
    ...         ws.send(packb({"state": np.array([1.0, 2.0])}))
    ...         result = unpackb(ws.recv())
    >>> metadata, result["actions"].tolist()
    ({'name': 'doubler'}, [[2.0, 4.0]])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import http
import itertools
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from ...adapters.inputs import input_leaves
from ...errors import RemoteError
from ...model import Model, ModelHandler
from ...model.base import CHUNKED_ORDER, defined_corners
from ...utils import leaves, map_leaves
from ..address import parse_openpi_address
from ..batching import Batcher, BatchStats, Work, check_batching
from .codec import OpenPIWireError, packb, unpackb

DEFAULT_MAX_MESSAGE_MB = 64.0
DEFAULT_CHUNK_HORIZON = 2
RESET_REPLY = "reset successful"
HEALTH_PATH = "/healthz"
# Threads that wait on the batcher, one per request in flight: enough for a batch of every
# connection that a served GPU policy usually sees.
MAX_WAITING_THREADS = 64
CLOSE_TIMEOUT_S = 30.0


def serve_openpi(
    model: Any,
    address: str = "127.0.0.1:0",
    *,
    max_batch: int | None = None,
    max_wait_ms: float = 2,
    api_key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
    execution_horizon: int | None = None,
) -> OpenPIServer:
    """Serve ``model`` over openpi's WebSocket protocol on ``address`` until closed.

    Args:
        model: a ``rlmesh.Model`` instance or a callable ``fn(obs) -> action``, as
            ``rlmesh.run`` takes it. It is loaded here, before the server listens.
        address: ``host:port`` or ``ws://host:port`` (port 0 picks a free one); loopback by
            default.
        max_batch: the most requests one model call takes (None: no limit).
        max_wait_ms: how long a request may wait for other connections' requests to join its
            batch (0: never).
        api_key: when set, a client needs ``Authorization: Api-Key <api_key>``.
        metadata: what the server sends each client on connect (default ``{}``).
        max_message_mb: the largest frame taken.
        execution_horizon: what a chunk corner is told the client replays of each chunk
            (default 2); ignored for a model without a chunk corner.

    Returns:
        The running ``OpenPIServer``: ``.address`` (``ws://host:port``), ``.stats()``,
        ``.close()``, ``.wait()``; a context manager.

    Raises:
        ValueError: a malformed address or argument, or a spec whose input cannot be read
            from an observation.
        RemoteError: the address cannot be bound.

    Example:
        >>> with serve_openpi(lambda obs: 0, "127.0.0.1:0", max_batch=8) as server:
        ...     server.address.startswith("ws://127.0.0.1:")
        True
    """
    check_batching(max_batch, max_wait_ms)
    if not max_message_mb > 0:
        raise ValueError(f"max_message_mb must be > 0, got {max_message_mb!r}")
    if execution_horizon is not None and int(execution_horizon) < 1:
        raise ValueError(f"execution_horizon must be >= 1, got {execution_horizon!r}")
    parsed = parse_openpi_address(address)  # openpi://, ws:// or host:port
    host, port = parsed.host.strip("[]"), parsed.port
    metadata_frame = packb(dict(metadata or {}))
    # A bare callable is a ``predict``; only a Model can define a chunk corner.
    chunked = isinstance(model, Model) and any(
        corner in defined_corners(model) for corner in CHUNKED_ORDER
    )
    horizon = (execution_horizon or DEFAULT_CHUNK_HORIZON) if chunked else 1
    handler = ModelHandler(model, execution_horizon=horizon)
    inputs = ObservationInputs(handler.spec)
    batcher = Batcher(
        handler, max_batch=max_batch, max_wait_s=max_wait_ms / 1000, isolate_failures=True
    )
    server = OpenPIServer(
        batcher,
        inputs,
        metadata_frame=metadata_frame,
        api_key=api_key,
        max_size=int(max_message_mb * 2**20),
    )
    try:
        server.start(host, port)
    except OSError as err:
        batcher.close()
        raise RemoteError(
            f"cannot serve openpi's protocol on {address!r}: {err}", address=address
        ) from None
    except BaseException:
        batcher.close()
        raise
    return server


# ---------------------------------------------------------------------------------- inputs


class ObservationInputs:
    """How an openpi observation becomes one lane's model input, and its batching key.

    Example:
        >>> from rlmesh.adapters import ModelSpec, State, Text
        >>> inputs = ObservationInputs(ModelSpec(input={"state": State("s"), "prompt": Text("p")}))
        >>> lane = inputs.lane({"state": np.zeros(2), "prompt": "go", "extra": 1})
        >>> lane["state"].shape, lane["prompt"], sorted(lane)
        ((1, 2), ['go'], ['prompt', 'state'])
    """

    def __init__(self, spec: Any) -> None:
        tree = None if spec is None else spec.input
        self.slots: list[tuple[str, ...]] | None = None
        self.single_key: str | None = None
        if tree is None:
            return
        found = list(input_leaves(tree))
        if len(found) == 1 and found[0][0] == ():
            key = found[0][1].key
            if not key:
                raise ValueError(
                    "the model's spec has one input leaf that names a role, not an observation "
                    "key: an openpi observation cannot say which value plays it; give the spec a "
                    "dict input whose slots name the observation's keys"
                )
            self.single_key = "/".join(key)
        else:
            self.slots = [slot for slot, _ in found]

    def lane(self, observation: dict[str, Any]) -> Any:
        """One lane of input (each leaf with a leading axis of 1), from ``observation``.

        Raises:
            OpenPIWireError: the observation lacks a key the spec names, or holds a value
                that is no array, number or text.
        """
        if self.single_key is not None:
            return _as_lane(_lookup(observation, (self.single_key,)), (self.single_key,))
        if self.slots is None:
            return _as_lane(observation, ())
        payload: dict[str, Any] = {}
        for slot in self.slots:
            target = payload
            for name in slot[:-1]:
                target = target.setdefault(name, {})
            target[slot[-1]] = _as_lane(_lookup(observation, slot), slot)
        return payload


def _lookup(observation: dict[str, Any], slot: tuple[str, ...]) -> Any:
    value: Any = observation
    for name in slot:
        if not isinstance(value, dict) or name not in value:
            break
        value = value[name]
    else:
        return value
    flat = "/".join(slot)
    if flat in observation:
        return observation[flat]
    raise OpenPIWireError(
        f"the observation has no {flat!r}, which the model's spec reads; it holds "
        f"{sorted(map(str, observation))}"
    )


def _as_lane(value: Any, path: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {key: _as_lane(item, (*path, str(key))) for key, item in value.items()}
    if isinstance(value, str):
        return [value]
    array = np.asarray(value)
    if array.dtype == object:
        raise OpenPIWireError(
            f"observation[{'/'.join(path)!r}] is a {type(value).__name__} that makes no array: "
            f"expected arrays, numbers or text"
        )
    return array[None]


def batching_key(payload: Any) -> tuple[Any, ...]:
    """Which requests may share a model call: one structure, dtype and shape per leaf."""
    return tuple(
        (path, "text") if isinstance(leaf, list) else (path, leaf.dtype.str, leaf.shape[1:])
        for path, leaf in leaves(payload)
    )


# ---------------------------------------------------------------------------------- the server


class _Connection:
    """One client: its episode (None between episodes) and the batching key it holds."""

    def __init__(self) -> None:
        self.episode: int | None = None
        self.key: Any = None


class OpenPIServer:
    """A model served over openpi's protocol (``serve_openpi``): a WebSocket server on a
    thread of its own, its model on one ``Batcher``."""

    def __init__(
        self,
        batcher: Batcher,
        inputs: ObservationInputs,
        *,
        metadata_frame: bytes,
        api_key: str | None,
        max_size: int,
    ) -> None:
        self.address = ""
        self._batcher = batcher
        self._handler: ModelHandler = batcher.handler
        self._inputs = inputs
        self._metadata_frame = metadata_frame
        self._api_key = api_key
        self._max_size = max_size
        self._episode_ids = itertools.count()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            MAX_WAITING_THREADS, thread_name_prefix="rlmesh-openpi-model"
        )
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._close_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (on a thread of its own); return once listening."""
        ready: concurrent.futures.Future[tuple[str, int]] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(self._main(host, port, ready),),
            name="rlmesh-openpi-server",
            daemon=True,
        )
        self._thread.start()
        try:
            bound_host, bound_port = ready.result(timeout=CLOSE_TIMEOUT_S)
        except BaseException:
            self._thread.join(CLOSE_TIMEOUT_S)
            self._pool.shutdown(wait=False)
            self._closed.set()
            raise
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.address = f"ws://{shown}:{bound_port}"

    async def _main(self, host: str, port: int, ready: concurrent.futures.Future[Any]) -> None:
        self._stop = asyncio.Event()
        try:
            server: Server = await serve(
                self._serve_connection,
                host,
                port,
                process_request=self._check_request,
                max_size=self._max_size,
                compression=None,
            )
        except BaseException as err:
            ready.set_exception(err)
            return
        ready.set_result(server.sockets[0].getsockname()[:2])
        await self._stop.wait()
        server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT_S)

    def stats(self) -> BatchStats:
        """What the model was asked so far: requests, rows, model calls, mean batch size."""
        return self._batcher.stats.snapshot()

    def close(self) -> None:
        """Close every connection (each ends its episode), stop listening, close the model."""
        with self._close_lock:
            if self._closed.is_set():
                return
            if self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            if self._thread is not None:
                self._thread.join(CLOSE_TIMEOUT_S)
            # The batcher first: it answers what is still queued, so no worker thread waits on.
            self._batcher.close()
            self._pool.shutdown(wait=True)
            if not self._loop.is_running():
                self._loop.close()
            self._closed.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server is closed (at most ``timeout`` seconds); whether it is."""
        return self._closed.wait(timeout)

    def __enter__(self) -> OpenPIServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ HTTP

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """``/healthz`` answered; an upgrade without the API key refused (HTTP 401)."""
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        expected = None if self._api_key is None else f"Api-Key {self._api_key}"
        given = request.headers.get("Authorization", "")
        if expected is not None and not hmac.compare_digest(given.encode(), expected.encode()):
            return connection.respond(
                http.HTTPStatus.UNAUTHORIZED,
                "this openpi server needs the header Authorization: Api-Key <key>\n",
            )
        return None

    # ------------------------------------------------------------------ a connection

    async def _serve_connection(self, ws: ServerConnection) -> None:
        connection = _Connection()
        try:
            await ws.send(self._metadata_frame)
            while True:
                message = await ws.recv()
                try:
                    reply = await self._answer(connection, message)
                except Exception as err:
                    await _fail(ws, err)
                    return
                await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            await self._end_episode(connection)
            if connection.key is not None:
                self._batcher.leave_key(connection.key)

    async def _answer(self, connection: _Connection, message: str | bytes) -> bytes:
        if isinstance(message, str):
            raise OpenPIWireError(
                "a text frame: openpi's requests are binary frames of msgpack (the observation)"
            )
        observation = unpackb(message)
        if not isinstance(observation, dict):
            raise OpenPIWireError(
                f"a msgpack {type(observation).__name__}: expected a map (the observation)"
            )
        endpoint = observation.pop("endpoint", "infer")
        if endpoint == "reset":
            await self._end_episode(connection)
            return packb(RESET_REPLY)
        if endpoint != "infer":
            raise OpenPIWireError(f"endpoint {endpoint!r}: expected 'infer' or 'reset'")
        payload = self._inputs.lane(observation)
        key = batching_key(payload)
        if key != connection.key:
            if connection.key is not None:
                self._batcher.leave_key(connection.key)
            self._batcher.join_key(key)
            connection.key = key
        new_episodes: list[tuple[int, int | None]] = []
        if connection.episode is None:
            connection.episode = next(self._episode_ids)
            new_episodes.append((connection.episode, None))
        work = Work(key, self._handler, payload, [connection.episode], new_episodes)
        started = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(self._pool, self._batcher.predict, [work])
        if work.error is not None:
            raise work.error
        result = self._result(work.output)
        result["server_timing"] = {"infer_ms": (time.perf_counter() - started) * 1000}
        return packb(result)

    def _result(self, output: Any) -> dict[str, Any]:
        """The model's output for the one row as openpi's result: ``actions`` as ``(H, D)``."""
        row = map_leaves(output, lambda leaf: np.asarray(leaf)[0])
        result = dict(row) if isinstance(row, dict) else {"actions": row}
        if "actions" not in result:
            raise ValueError(
                f"the model's action is a dict of {sorted(result)}: openpi's result needs "
                f"'actions' (an array, or a dict holding 'actions')"
            )
        actions = np.asarray(result["actions"])
        if not self._handler.chunked:
            actions = actions[None]
        if actions.ndim == 1:
            actions = actions[:, None]
        result["actions"] = actions
        return result

    async def _end_episode(self, connection: _Connection) -> None:
        """The connection's episode ends: its context goes, the model hears of it."""
        if connection.episode is None:
            return
        ended, connection.episode = [connection.episode], None
        with contextlib.suppress(Exception):  # the model's on_episode_end failing ends it too
            await asyncio.get_running_loop().run_in_executor(
                self._pool, self._batcher.end_episodes, self._handler, ended
            )


async def _fail(ws: ServerConnection, err: BaseException) -> None:
    """The error as a text frame, then close code 1011: how openpi's clients learn of it."""
    if isinstance(err, OpenPIWireError):
        text = f"rlmesh openpi server: malformed request: {err}"
    else:
        text = "rlmesh openpi server: the model failed:\n" + "".join(
            traceback.format_exception(err)
        )
    with contextlib.suppress(ConnectionClosed):
        await ws.send(text)
        await ws.close(CloseCode.INTERNAL_ERROR, "request failed; see the previous text frame")


__all__ = ["OpenPIServer", "serve_openpi"]
