"""Serving any rlmesh model over a WebSocket policy protocol: what rlmesh's openpi server
(``rlmesh.remote.openpi.server``) and vla-eval server (``rlmesh.remote.vlaeval.server``)
share. A protocol's server subclasses ``SocketServer`` and says only what is its own: how a
connection converses (``_converse``), its HTTP endpoints and access check (``_http``), its
name (``protocol``, in errors and thread names) and its keepalive pings.

- Each connection has threads of its own (websockets' threaded server): one reads its frames
  and answers pings, one runs ``_converse``, which decodes a request, waits for the model's
  output and sends the answer. A model that infers holds up only the connections waiting for
  it: pings, health checks and other connections' frames go on, and large frames (images)
  are decoded beside it. No connection's request waits for an event loop to be free.
- The model is called one call at a time, by one ``Batcher`` (``rlmesh.remote.batching``):
  the connections' threads wait for it in ``predict``, the first one leading (calling the
  model for every queued request, fused by batching key). A lone request so reaches the
  model on the thread that decoded it: one thread hand-over per request (the frame's reader
  to the connection's thread), where an event loop handing requests to a model thread takes
  two (there and back), each a wake-up of a sleeping thread.
- Frames over ``max_size`` bytes close their connection (1009); no compression is offered.
- Each connection is a ``Stream``: its running episode (the first ``predict`` starts one;
  ``end_episode`` and the connection's close end it, the model hearing of it between its
  calls), the episode's handler and seed, and the batching key it holds.

Example (a protocol of one binary frame of float64 in, the model's doubled row out):
    >>> import numpy as np
    >>> from websockets.sync.client import connect
    >>> from rlmesh.remote.address import parse_address
    >>> class Doubling(SocketServer):
    ...     protocol = "doubling"
    ...     def _converse(self, ws, stream):
    ...         for frame in ws:
    ...             observation = {"x": np.frombuffer(frame)}
    ...             output = self.predict(stream, observation, self._handler)
    ...             ws.send(output[0].tobytes())
    >>> served = load_model(lambda obs: obs["x"] * 2, ObservationInputs)
    >>> loopback = parse_address("127.0.0.1:0")
    >>> with start_serving(Doubling(served.batcher, served.inputs), loopback) as server:
    ...     with connect(server.address) as ws:
    ...         ws.send(np.array([1.0, 2.5]).tobytes())
    ...         answer = np.frombuffer(ws.recv())
    >>> answer.tolist(), server.stats().requests
    ([2.0, 5.0], 1)
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import threading
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from ...errors import RemoteError
from ...model import Model, ModelHandler
from ...model.base import CHUNKED_ORDER, defined_corners
from ...utils import map_leaves
from ..address import Address
from ..batching import Batcher, BatchStats, Work, check_batching
from .inputs import ObservationInputs

DEFAULT_MAX_MESSAGE_MB = 64.0
DEFAULT_CHUNK_HORIZON = 2
CLOSE_TIMEOUT_S = 30.0

_Served = TypeVar("_Served", bound="SocketServer")


# ---------------------------------------------------------------------------------- set-up


def as_horizon(value: Any) -> int | None:
    """``value`` as an execution horizon, or None when it is not an int >= 1.

    Example:
        >>> as_horizon(4), as_horizon(0), as_horizon(True), as_horizon(2.0)
        (4, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        return None
    return int(value)


def check_serving(
    max_batch: int | None, max_wait_ms: float, max_message_mb: float, execution_horizon: Any
) -> None:
    """A WebSocket server's arguments: ValueError naming the first that is wrong.

    Example:
        >>> check_serving(8, 2, 64, None)
        >>> check_serving(8, 2, 0, None)
        Traceback (most recent call last):
        ...
        ValueError: max_message_mb must be > 0, got 0
    """
    check_batching(max_batch, max_wait_ms)
    if not max_message_mb > 0:
        raise ValueError(f"max_message_mb must be > 0, got {max_message_mb!r}")
    if execution_horizon is not None and as_horizon(execution_horizon) is None:
        raise ValueError(f"execution_horizon must be an int >= 1, got {execution_horizon!r}")


class ServedModel(NamedTuple):
    """A model made ready to serve: its ``batcher`` (whose ``handler`` is the model's),
    the ``inputs`` its observations become, and whether it has a chunk corner."""

    batcher: Batcher
    inputs: ObservationInputs
    chunk_capable: bool


def load_model(
    model: Any,
    inputs: Callable[[Any], ObservationInputs],
    *,
    execution_horizon: int | None = None,
    max_batch: int | None = None,
    max_wait_ms: float = 2,
) -> ServedModel:
    """``model`` (a ``Model`` or a callable ``fn(obs) -> action``) loaded on a ``Batcher``,
    its observations read by ``inputs(spec)``. A model with a chunk corner is
    told ``execution_horizon`` (default 2; the protocols' clients do not say what they replay).

    Raises:
        ValueError: the spec's input cannot be read from an observation (the model is then
            not loaded).

    Example:
        >>> served = load_model(lambda obs: 0, ObservationInputs)
        >>> served.chunk_capable, served.batcher.handler.execution_horizon
        (False, 1)
        >>> served.batcher.close()
    """
    # A bare callable is a ``predict``; only a Model can define a chunk corner.
    chunked = isinstance(model, Model) and any(
        corner in defined_corners(model) for corner in CHUNKED_ORDER
    )
    horizon = (execution_horizon or DEFAULT_CHUNK_HORIZON) if chunked else 1
    handler = ModelHandler(model, execution_horizon=horizon)
    reader = inputs(handler.spec)
    batcher = Batcher(
        handler, max_batch=max_batch, max_wait_s=max_wait_ms / 1000, isolate_failures=True
    )
    return ServedModel(batcher, reader, chunked)


def start_serving(server: _Served, address: Address) -> _Served:
    """``server`` listening on ``address`` (its host and port; port 0 picks a free one), or
    its model closed and the failure raised.

    Raises:
        RemoteError: the address cannot be bound.
    """
    try:
        server.start(address.host.strip("[]"), address.port)
    except OSError as err:
        server._batcher.close()
        raise RemoteError(
            f"cannot serve {server.protocol}'s protocol on {str(address)!r}: {err}",
            address=str(address),
        ) from None
    except BaseException:
        server._batcher.close()
        raise
    return server


def same_secret(given: str, expected: str) -> bool:
    """Whether a client's secret is the server's, compared in constant time.

    Example:
        >>> same_secret("Api-Key k1", "Api-Key k1"), same_secret("", "Api-Key k1")
        (True, False)
    """
    return hmac.compare_digest(given.encode(), expected.encode())


def one_row(output: Any, protocol: str) -> dict[str, Any]:
    """A model's output for the one row of a request, as a protocol's answer: a dict that
    holds ``"actions"`` (an action that is a dict is the answer itself).

    Raises:
        ValueError: a dict action without ``"actions"``.

    Example:
        >>> one_row(np.array([[1, 2]]), "openpi")
        {'actions': array([1, 2])}
    """
    if isinstance(output, np.ndarray):  # the usual output: no tree to walk
        return {"actions": output[0]}
    row = map_leaves(output, lambda leaf: np.asarray(leaf)[0])
    result = dict(row) if isinstance(row, dict) else {"actions": row}
    if "actions" not in result:
        raise ValueError(
            f"the model's action is a dict of {sorted(result)}: {protocol}'s answer needs "
            f"'actions' (an array, or a dict holding 'actions')"
        )
    return result


# ---------------------------------------------------------------------------------- the server


class Stream:
    """One connection's part in the batching: its running episode (None between episodes),
    that episode's handler and seed, and the batching key it holds."""

    def __init__(self) -> None:
        self.episode: int | None = None
        self.handler: ModelHandler | None = None
        self.seed: int | None = None
        self.key: Any = None


class SocketServer:
    """A model served over a WebSocket protocol: a threaded WebSocket server, its model on
    one ``Batcher``. Subclasses speak the protocol."""

    protocol: ClassVar[str] = "a WebSocket policy"
    """The protocol's name, as errors and thread names give it."""
    ping_interval: ClassVar[float | None] = 20.0
    """websockets' keepalive pings (None: none)."""

    def __init__(
        self,
        batcher: Batcher,
        inputs: ObservationInputs,
        *,
        max_size: int = int(DEFAULT_MAX_MESSAGE_MB * 2**20),
    ) -> None:
        self.address = ""
        self._batcher = batcher
        self._handler: ModelHandler = batcher.handler
        self._inputs = inputs
        self._max_size = max_size
        self._episode_ids = itertools.count()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._close_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (accepting on a thread of its own).

        Raises:
            OSError: the address cannot be bound.
        """
        self._server = serve(
            self._connection,
            host,
            port,
            process_request=self._http,
            max_size=self._max_size,
            compression=None,
            ping_interval=self.ping_interval,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"rlmesh-{self.protocol}-server", daemon=True
        )
        self._thread.start()
        bound_host, bound_port = self._server.socket.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.address = f"ws://{shown}:{bound_port}"

    def stats(self) -> BatchStats:
        """What the model was asked so far: requests, rows, model calls, mean batch size."""
        return self._batcher.stats.snapshot()

    def close(self) -> None:
        """Close every connection (each ends its episode), stop listening, close the model;
        each wait bounded."""
        with self._close_lock:
            if self._closed.is_set():
                return
            if self._server is not None:
                # websockets' shutdown waits for every connection's thread, however long a
                # model holds one up: it gets a thread of its own and a bound.
                closing = threading.Thread(
                    target=self._server.shutdown, name=f"rlmesh-{self.protocol}-close", daemon=True
                )
                closing.start()
                closing.join(CLOSE_TIMEOUT_S)
            if self._thread is not None:
                self._thread.join(CLOSE_TIMEOUT_S)
            self._batcher.close()  # it answers what is still queued with CLOSED
            self._closed.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server is closed (at most ``timeout`` seconds); whether it is."""
        return self._closed.wait(timeout)

    def __enter__(self: _Served) -> _Served:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ what a protocol says

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """The answer to an HTTP request (the protocol's endpoints, a refused upgrade), or
        None to open the WebSocket."""
        return None

    def _new_stream(self) -> Stream:
        return Stream()

    def _converse(self, ws: ServerConnection, stream: Stream) -> None:
        """The protocol's messages on one connection, until it closes (on the connection's
        own thread)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ a connection

    def _connection(self, ws: ServerConnection) -> None:
        stream = self._new_stream()
        try:
            self._converse(ws, stream)
        except ConnectionClosed:
            pass
        finally:
            self.end_episode(stream)
            if stream.key is not None:
                self._batcher.leave_key(stream.key)

    def predict(self, stream: Stream, observation: dict[str, Any], handler: ModelHandler) -> Any:
        """The model's output (a batch of one row) for ``observation`` from ``stream``, read
        as one lane of input (``inputs``), maybe in one call with other connections' requests;
        the stream's episode starts here if none runs, with ``handler`` (the model's, told the
        episode's horizon).

        Raises:
            Exception: the protocol's wire error for an observation the inputs cannot read,
                what the model raised, or a closed batcher's ``RequestError``.
        """
        lane, shapes = self._inputs.read(observation)
        key = (handler.execution_horizon, shapes)
        if key != stream.key:
            if stream.key is not None:
                self._batcher.leave_key(stream.key)
            self._batcher.join_key(key)
            stream.key = key
        started: list[tuple[int, int | None]] = []
        if stream.episode is None:
            stream.episode, stream.handler = next(self._episode_ids), handler
            started.append((stream.episode, stream.seed))
        work = Work(key, handler, lane, [stream.episode], started)
        self._batcher.predict([work])
        if work.error is not None:
            raise work.error
        return work.output

    def end_episode(self, stream: Stream) -> None:
        """The stream's episode ends: its context goes, the model hears of it (between its
        calls; a model failing in ``on_episode_end`` ends it too)."""
        if stream.episode is None:
            return
        ended, handler = [stream.episode], stream.handler or self._handler
        stream.episode = stream.handler = None
        with contextlib.suppress(Exception):
            self._batcher.end_episodes(handler, ended)


__all__ = [
    "DEFAULT_CHUNK_HORIZON",
    "DEFAULT_MAX_MESSAGE_MB",
    "ServedModel",
    "SocketServer",
    "Stream",
    "as_horizon",
    "check_serving",
    "load_model",
    "one_row",
    "same_secret",
    "start_serving",
]
