"""Serving any rlmesh model to vla-eval's own clients: ``serve_vlaeval`` and ``VlaEvalServer``.

vla-eval's clients (``vla_eval.connection.Connection``, its benchmarks' episode runners) dial
``ws://host:port``, send ``hello``, then per episode ``episode_start``, one ``observation`` per
env step (each answered by one ``action`` echoing its ``seq``), and ``episode_end``
(``rlmesh.remote.vlaeval.codec``).

An observation becomes the model's input as ``rlmesh.remote.vlaeval.inputs`` says: the slots
of the model's ``spec`` read from the observation's keys, or without a spec the observation
dict as it is, images decoded ``(H, W, C)``; sizes, layouts and dtypes are the client's.

What goes back: ``{"actions": ...}``, the action's dtype the model's. vla-eval's benchmarks
apply one action per observation, so for them a model with a chunk corner is **replayed
here**, as vla-eval's own ``PredictModelServer(chunk_size=...)`` does: its chunk corner is told
``execution_horizon`` (default 2), and the chunk's first ``execution_horizon`` actions answer
this and the next observations of the session, one each, before the model is asked again. A
model without a chunk corner answers each observation with its one action, ``(D,)`` (a scalar
as ``(1,)``). An action that is a dict is sent as the payload itself and must hold
``"actions"``.

Whole chunks, an rlmesh extension: a client whose ``hello`` payload holds ``"capabilities":
{"action_chunks": true}`` gets every answer as a chunk ``(H, D)`` (``(1, D)`` for a model
without a chunk corner), which it replays itself; its ``episode_start`` payload may hold
``"execution_horizon"`` (what the chunk corner is told for that episode) and ``"seed"`` (the
episode's seed, given to a corner's ``context``). rlmesh's ``VlaEvalModel`` does both. The
server's ``hello`` answer says ``"capabilities": {"action_chunks": true}``.

Episodes: ``episode_start`` ends the session's running episode (a corner's ``context`` goes,
``Model.on_episode_end`` runs) and the next observation starts a new one; ``episode_end`` and
the connection's close end it too. Observations before any ``episode_start`` belong to one
episode, as vla-eval's server lets them.

Batching: every session's observations go to one ``Batcher`` (``rlmesh.remote.batching``),
which fuses those whose inputs have one structure (keys, dtypes, shapes) and horizon into one
call of the model's batched corner, of at most ``max_batch`` rows, waiting at most
``max_wait_ms`` for others (not at all once every session has an observation queued). Each
session has threads of its own, which decode its frames (images) and wait for the model, and
the model is never called by a thread that reads the network, so other sessions, pings and
health checks go on while it works (``rlmesh.remote.websocket.server``).

Failures: a frame that is not a vla-eval message, and a model that raises, are answered on
that session by an ``error`` message, ``{"error": "<kind>: <text>"}`` echoing the request's
``seq`` (``"observation_failed"`` for the model, with its ``"traceback"``), and the session
goes on. vla-eval's own server answers a model's failure so, but closes the connection without
a word on a frame it cannot decode; this server answers that with ``"invalid_message"``
instead, as the protocol's description promises for errors. A frame over ``max_message_mb``
closes its connection with code 1009.

Access: loopback by default. With ``token``, the WebSocket upgrade needs ``Authorization:
Bearer <token>`` or the query ``?token=<token>`` (the only way vla-eval's ``Connection``, which
sends no headers, can give one: ``Connection("ws://host:port/?token=...")``), else HTTP 401.
``GET /health`` answers 200 ``{"status": "ok"}``; ``GET /config`` the batching settings as
JSON, and ``GET /config?max_batch_size=N&max_wait_time=S`` changes them (with the token, when
one is set), as vla-eval's server does.

Example:
    >>> import numpy as np
    >>> from websockets.sync.client import connect
    >>> from rlmesh.remote.vlaeval.codec import pack_message, unpack_message
    >>> with serve_vlaeval(lambda obs: obs["state"] * 2) as server:
    ...     with connect(server.address, compression=None) as ws:
    ...         ws.send(pack_message("hello", {"protocol_version": 1}, seq=1))
    ...         hello = unpack_message(ws.recv())
    ...         ws.send(pack_message("observation", {"state": np.array([1.0, 2.0])}, seq=2))
    ...         action = unpack_message(ws.recv())
    >>> hello.type, hello.payload["capabilities"], action.seq, action.payload["actions"].tolist()
    ('hello', {'action_chunks': True}, 2, [2.0, 4.0])
"""

from __future__ import annotations

import http
import json
import math
import threading
import traceback
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection

from ...model import ModelHandler
from ...utils import map_leaves
from ...version import __version__
from ..address import parse_vlaeval_address
from ..batching import Batcher
from ..websocket.server import (
    DEFAULT_MAX_MESSAGE_MB,
    SocketServer,
    Stream,
    as_horizon,
    check_serving,
    load_model,
    one_row,
    same_secret,
    start_serving,
)
from .codec import (
    IMAGE_FORMATS,
    PROTOCOL_VERSION,
    Message,
    VlaEvalWireError,
    pack_message,
    unpack_message,
)
from .inputs import ObservationInputs

HEALTH_PATH = "/health"
CONFIG_PATH = "/config"
CHUNKS = "action_chunks"


def serve_vlaeval(
    model: Any,
    address: str = "127.0.0.1:0",
    *,
    max_batch: int | None = None,
    max_wait_ms: float = 2,
    token: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
    execution_horizon: int | None = None,
    image_format: str = "png",
) -> VlaEvalServer:
    """Serve ``model`` over vla-eval's WebSocket protocol on ``address`` until closed.

    Args:
        model: a ``rlmesh.Model`` instance or a callable ``fn(obs) -> action``, as
            ``rlmesh.run`` takes it. It is loaded here, before the server listens.
        address: ``host:port``, ``vlaeval://host:port`` or ``ws://host:port`` (port 0 picks a
            free one); loopback by default.
        max_batch: the most observations one model call takes (None: no limit).
        max_wait_ms: how long an observation may wait for other sessions' to join its batch.
        token: when set, a client needs ``Authorization: Bearer <token>`` or ``?token=``.
        metadata: more fields of the ``hello`` answer (vla-eval's servers send e.g.
            ``observation_params``); the protocol's own fields win.
        max_message_mb: the largest frame taken.
        execution_horizon: what a chunk corner is told, and how many of each chunk's actions
            are replayed, for sessions that do not say (default 2); ignored for a model
            without a chunk corner.
        image_format: ``"png"`` or ``"raw"``: how ``(H, W, 3|4)`` uint8 arrays in answers
            travel.

    Returns:
        The running ``VlaEvalServer``: ``.address`` (``ws://host:port``), ``.stats()``,
        ``.sessions``, ``.close()``, ``.wait()``; a context manager.

    Raises:
        ValueError: a malformed address or argument, or a spec whose input cannot be read
            from an observation.
        RemoteError: the address cannot be bound.

    Example:
        >>> with serve_vlaeval(lambda obs: 0, "127.0.0.1:0", max_batch=8) as server:
        ...     server.address.startswith("ws://127.0.0.1:")
        True
    """
    check_serving(max_batch, max_wait_ms, max_message_mb, execution_horizon)
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be 'png' or 'raw', got {image_format!r}")
    parsed = parse_vlaeval_address(address)
    served = load_model(
        model,
        ObservationInputs,
        execution_horizon=execution_horizon,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
    )
    hello = {
        **dict(metadata or {}),
        "harness_version": f"rlmesh {__version__}",
        "protocol_version": PROTOCOL_VERSION,
        "model_server": type(served.batcher.handler.model).__name__,
        "capabilities": {CHUNKS: True},
    }
    server = VlaEvalServer(
        served.batcher,
        served.inputs,
        hello=hello,
        token=token,
        max_size=int(max_message_mb * 2**20),
        chunk_capable=served.chunk_capable,
        image_format=image_format,
    )
    return start_serving(server, parsed)


# ---------------------------------------------------------------------------------- sessions


class _Session(Stream):
    """One connection: its episode (``Stream``), what it asked for, and the actions of a
    chunk still to be replayed to it."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon
        self.chunks = False
        self.replay: list[Any] = []


class _ModelFailedError(Exception):
    """The model (or its output) failed on an observation: ``error`` is what it raised."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
        self.seq = 0  # the observation's, set where it is known


class VlaEvalServer(SocketServer):
    """A model served over vla-eval's protocol (``serve_vlaeval``): a threaded WebSocket
    server, its model on one ``Batcher``."""

    protocol = "vla-eval"
    # A session waits on the model as long as it infers, and vla-eval's client pings not.
    ping_interval = None

    def __init__(
        self,
        batcher: Batcher,
        inputs: ObservationInputs,
        *,
        hello: dict[str, Any],
        token: str | None,
        max_size: int,
        chunk_capable: bool,
        image_format: str,
    ) -> None:
        super().__init__(batcher, inputs, max_size=max_size)
        self._hello = hello
        self._token = token
        self._chunk_capable = chunk_capable
        self._image_format = image_format
        self.sessions = 0
        """How many sessions (WebSocket connections) have opened so far."""
        self._sessions_lock = threading.Lock()  # each session opens on a thread of its own

    # ------------------------------------------------------------------ HTTP

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """``/health`` and ``/config`` answered; an upgrade without the token refused."""
        url = urlsplit(request.path)
        query = parse_qs(url.query)
        if url.path == HEALTH_PATH:
            return _json(connection, http.HTTPStatus.OK, {"status": "ok"})
        allowed = self._authorized(request, query)
        if url.path == CONFIG_PATH:
            return self._config(connection, query, allowed)
        if not allowed:
            return connection.respond(
                http.HTTPStatus.UNAUTHORIZED,
                "this vla-eval server needs its token: the header Authorization: Bearer "
                "<token>, or ?token=<token> in the URL\n",
            )
        return None

    def _authorized(self, request: Request, query: dict[str, list[str]]) -> bool:
        if self._token is None:
            return True
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        in_query = query.get("token", [""])[-1]
        return same_secret(given, self._token) or same_secret(in_query, self._token)

    def _config(
        self, connection: ServerConnection, query: dict[str, list[str]], allowed: bool
    ) -> Response:
        """The batching settings; with a query, those it names set first (as vla-eval's
        ``/config`` does: unknown keys or bad values listed as errors, 422 if none applied)."""
        changes = {key: values[-1] for key, values in query.items() if key != "token"}
        if changes and not allowed:
            return _json(
                connection,
                http.HTTPStatus.UNAUTHORIZED,
                {"errors": ["changing the configuration needs the server's token"]},
            )
        applied: dict[str, Any] = {}
        errors: list[str] = []
        for key, text in changes.items():
            try:
                if key == "max_batch_size":
                    value = int(text)
                    if value < 1:
                        raise ValueError("must be >= 1")
                    self._batcher.max_batch = value
                elif key == "max_wait_time":
                    value = float(text)
                    if not 0 <= value < math.inf:
                        raise ValueError("must be a number of seconds >= 0")
                    self._batcher.max_wait_s = value
                else:
                    errors.append(f"unknown key: {key} (expected max_batch_size, max_wait_time)")
                    continue
            except ValueError as exc:
                errors.append(f"bad value for {key}: {text!r} ({exc})")
                continue
            applied[key] = value
        body: dict[str, Any] = {"applied": applied, "config": self._settings()}
        if errors:
            body["errors"] = errors
        status = http.HTTPStatus.UNPROCESSABLE_ENTITY if errors and not applied else None
        return _json(connection, status or http.HTTPStatus.OK, body)

    def _settings(self) -> dict[str, Any]:
        return {
            "max_batch_size": self._batcher.max_batch,
            "max_wait_time": self._batcher.max_wait_s,
            "execution_horizon": self._handler.execution_horizon,
            "image_format": self._image_format,
        }

    # ------------------------------------------------------------------ a session

    def _new_stream(self) -> _Session:
        with self._sessions_lock:
            self.sessions += 1
        return _Session(self._handler.execution_horizon)

    def _converse(self, ws: ServerConnection, stream: Stream) -> None:
        session = cast(_Session, stream)  # made by _new_stream
        for frame in ws:
            try:
                reply = self._answer(session, unpack_message(frame))
            except VlaEvalWireError as err:
                reply = self._error(err.seq, f"invalid_message: {err}")
            except _ModelFailedError as failed:
                reply = self._error(
                    failed.seq,
                    f"observation_failed: {type(failed.error).__name__}: {failed.error}",
                    "".join(traceback.format_exception(failed.error)),
                )
            if reply is not None:
                ws.send(reply)

    def _answer(self, session: _Session, message: Message) -> bytes | None:
        payload = message.payload
        kind = message.type
        if kind == "hello":
            asked = payload.get("capabilities") if isinstance(payload, dict) else None
            session.chunks = isinstance(asked, dict) and asked.get(CHUNKS) is True
            return pack_message("hello", self._hello, message.seq)
        if kind == "episode_start":
            self._start_episode(session, payload, message.seq)
            return None
        if kind == "episode_end":
            self.end_episode(session)
            return None
        if kind == "observation":
            if not isinstance(payload, dict):
                raise VlaEvalWireError(
                    f"an observation whose payload is a {type(payload).__name__}: expected a "
                    f"map of the observation's keys",
                    message.seq,
                )
            try:
                action = self._observe(session, payload)
                try:
                    return pack_message(
                        "action", action, message.seq, image_format=self._image_format
                    )
                except (TypeError, ValueError) as err:  # an action that cannot travel
                    raise _ModelFailedError(err) from None
            except (VlaEvalWireError, _ModelFailedError) as err:
                err.seq = message.seq  # the answer echoes the observation's
                raise
        if kind == "error":  # a client's report of its own failure asks for no answer
            return None
        raise VlaEvalWireError(
            f"a message of type {kind!r} from a client: expected hello, episode_start, "
            "observation, episode_end or error",
            message.seq,
        )

    def _start_episode(self, session: _Session, payload: Any, seq: int) -> None:
        """The session's running episode ends; the next observation starts one, told what
        this message's (rlmesh) fields say: its horizon and seed."""
        self.end_episode(session)
        session.horizon, session.seed = self._handler.execution_horizon, None
        fields = payload if isinstance(payload, dict) else {}
        if fields.get("execution_horizon") is not None:
            horizon = as_horizon(fields["execution_horizon"])
            if horizon is None:
                raise VlaEvalWireError(
                    f"episode_start's execution_horizon {fields['execution_horizon']!r}: "
                    f"expected an int >= 1",
                    seq,
                )
            session.horizon = horizon if self._chunk_capable else 1
        seed = fields.get("seed")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise VlaEvalWireError(f"episode_start's seed {seed!r}: expected an int", seq)
            session.seed = seed

    def _observe(self, session: _Session, observation: dict[str, Any]) -> Any:
        """The answer to one observation: the next replayed action, or the model's."""
        if session.replay:
            return session.replay.pop(0)
        handler = session.handler or self._batcher.handler_for(session.horizon)
        try:
            output = self.predict(session, observation, handler)
        except VlaEvalWireError:
            raise
        except Exception as err:
            raise _ModelFailedError(err) from None
        try:
            return self._actions(session, handler, output)
        except Exception as err:
            raise _ModelFailedError(err) from None

    def _actions(self, session: _Session, handler: ModelHandler, output: Any) -> Any:
        """The model's output for the one row as the answer; a chunk to replay is kept."""
        result = one_row(output, "vla-eval")
        if session.chunks:
            chunk = result if handler.chunked else map_leaves(result, lambda leaf: leaf[None])
            actions = np.asarray(chunk["actions"])
            chunk["actions"] = actions[:, None] if actions.ndim == 1 else actions
            return chunk
        if handler.chunked:
            steps = min(len(result["actions"]), handler.execution_horizon)
            session.replay = [
                _one_action(map_leaves(result, lambda leaf, i=i: leaf[i])) for i in range(steps)
            ]
            return session.replay.pop(0)
        return _one_action(result)

    def end_episode(self, stream: Stream) -> None:
        """The session's episode ends (``SocketServer.end_episode``); no action of its
        chunk is replayed after."""
        if isinstance(stream, _Session):
            stream.replay = []
        super().end_episode(stream)

    def _error(self, seq: int, text: str, trace: str | None = None) -> bytes:
        payload = {"error": text} if trace is None else {"error": text, "traceback": trace}
        return pack_message("error", payload, seq)


def _one_action(result: dict[str, Any]) -> dict[str, Any]:
    """vla-eval's one action is ``(D,)``: a scalar action becomes ``(1,)``."""
    actions = np.asarray(result["actions"])
    return {**result, "actions": actions[None] if actions.ndim == 0 else actions}


def _json(connection: ServerConnection, status: http.HTTPStatus, body: Any) -> Response:
    response = connection.respond(status, json.dumps(body) + "\n")
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


__all__ = ["VlaEvalServer", "serve_vlaeval"]
