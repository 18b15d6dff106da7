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
Each connection has threads of its own and the model is never called by the thread that
reads the network, so pings, health checks and other connections' frames go on while it
infers (``rlmesh.remote.websocket.server``). A call of several requests that fails is retried
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

import contextlib
import http
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection

from ..address import parse_openpi_address
from ..batching import Batcher
from ..websocket import inputs as shared_inputs
from ..websocket.server import (
    DEFAULT_MAX_MESSAGE_MB,
    SocketServer,
    Stream,
    check_serving,
    load_model,
    one_row,
    same_secret,
    start_serving,
)
from .codec import OpenPIWireError, packb, unpackb

RESET_REPLY = "reset successful"
HEALTH_PATH = "/healthz"


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
    check_serving(max_batch, max_wait_ms, max_message_mb, execution_horizon)
    parsed = parse_openpi_address(address)  # openpi://, ws:// or host:port
    metadata_frame = packb(dict(metadata or {}))
    served = load_model(
        model,
        ObservationInputs,
        execution_horizon=execution_horizon,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
    )
    server = OpenPIServer(
        served.batcher,
        served.inputs,
        metadata_frame=metadata_frame,
        api_key=api_key,
        max_size=int(max_message_mb * 2**20),
    )
    return start_serving(server, parsed)


class ObservationInputs(shared_inputs.ObservationInputs):
    """How an openpi observation becomes one lane's model input
    (``rlmesh.remote.websocket.inputs``): a bad one raises ``OpenPIWireError``.

    Example:
        >>> from rlmesh.adapters import ModelSpec, State, Text
        >>> inputs = ObservationInputs(ModelSpec(input={"state": State("s"), "prompt": Text("p")}))
        >>> inputs.lane({"state": np.zeros(2)})
        Traceback (most recent call last):
        ...
        rlmesh.remote.openpi.codec.OpenPIWireError: the observation has no 'prompt', ...
    """

    protocol = "openpi"
    wire_error = OpenPIWireError


class OpenPIServer(SocketServer):
    """A model served over openpi's protocol (``serve_openpi``): a threaded WebSocket
    server, its model on one ``Batcher``."""

    protocol = "openpi"

    def __init__(
        self,
        batcher: Batcher,
        inputs: ObservationInputs,
        *,
        metadata_frame: bytes,
        api_key: str | None,
        max_size: int,
    ) -> None:
        super().__init__(batcher, inputs, max_size=max_size)
        self._metadata_frame = metadata_frame
        self._api_key = api_key

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """``/healthz`` answered; an upgrade without the API key refused (HTTP 401)."""
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._api_key is not None and not same_secret(
            request.headers.get("Authorization", ""), f"Api-Key {self._api_key}"
        ):
            return connection.respond(
                http.HTTPStatus.UNAUTHORIZED,
                "this openpi server needs the header Authorization: Api-Key <key>\n",
            )
        return None

    def _converse(self, ws: ServerConnection, stream: Stream) -> None:
        ws.send(self._metadata_frame)
        for message in ws:
            try:
                reply = self._answer(stream, message)
            except Exception as err:
                _fail(ws, err)
                return
            ws.send(reply)

    def _answer(self, stream: Stream, message: str | bytes) -> bytes:
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
            self.end_episode(stream)
            return packb(RESET_REPLY)
        if endpoint != "infer":
            raise OpenPIWireError(f"endpoint {endpoint!r}: expected 'infer' or 'reset'")
        started = time.perf_counter()
        result = one_row(self.predict(stream, observation, self._handler), "openpi")
        actions = np.asarray(result["actions"])
        if not self._handler.chunked:
            actions = actions[None]
        if actions.ndim == 1:
            actions = actions[:, None]
        result["actions"] = actions
        result["server_timing"] = {"infer_ms": (time.perf_counter() - started) * 1000}
        return packb(result)


def _fail(ws: ServerConnection, err: BaseException) -> None:
    """The error as a text frame, then close code 1011: how openpi's clients learn of it."""
    if isinstance(err, OpenPIWireError):
        text = f"rlmesh openpi server: malformed request: {err}"
    else:
        text = "rlmesh openpi server: the model failed:\n" + "".join(
            traceback.format_exception(err)
        )
    with contextlib.suppress(ConnectionClosed):
        ws.send(text)
        ws.close(CloseCode.INTERNAL_ERROR, "request failed; see the previous text frame")


__all__ = ["OpenPIServer", "serve_openpi"]
