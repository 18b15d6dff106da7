"""The client of an openpi policy server: ``OpenPIModel``, a ``Model`` whose chunks come over
openpi's WebSocket protocol (``rlmesh.remote.openpi``).

The driver does what it does for a local chunked model: it assembles each lane's payload as
the model's ``spec`` says (frame stacks and per-episode state stay on the driver), calls the
one corner, ``predict_chunk_batch``, and replays each lane's chunk with the run's
``execution_horizon``. The corner sends one message per lane: the lane's payload as a dict (a
Dict payload's keys, nested as they are; a payload that is one array, such as a raw Box
observation without a spec, under the key ``"observation"``, ``OBSERVATION_KEY``), and takes
``result["actions"]``, an ``(H, D)`` chunk, from the answer. The lanes' chunks, cut to the
shortest H, make the ``[N, H, D]`` batch. openpi has no horizon field: the server's H is
what it is, and the driver drops what it does not replay.

A chunk reaches the action space through the spec's ``Action`` (by default a cast), as a
local model's does: a ``Discrete`` space takes a one-element row ``[a]`` as the action ``a``,
so a CartPole policy answers ``(H, 1)`` chunks.

The protocol is lockstep per connection and has no episodes, so **a connection is an
episode**, as rlmesh's openpi server takes it: each running episode is bound to a connection
of its own at its first prediction (the corner takes the driver's ``context`` for the rows'
episode ids), and the episode's end closes it; the next episode dials anew. The rows of a call
go concurrently over their connections, each connection's in lane order. ``max_connections``
(default: no bound, which is one per lane) caps them: past it, new episodes share the
connection with the fewest, and a server that keeps state per connection can no longer tell
them apart (fine for the usual stateless policy). The connections live on an event loop of
the model's own, on a thread of its own, not on the driver's (the sync corner waits for the
answers as a local model's would for its computation); each reads the server's metadata
frame first (kept as ``metadata``), and ``close`` closes them all and ends the thread.

Where the peers' own description says nothing: keepalive pings are off (the reference server
blocks its event loop while it infers, so a long inference would fail a ping), and no
compression is offered; every wait is bounded by ``timeout_s`` instead.

Example:
    >>> model = OpenPIModel("openpi://127.0.0.1:8000", max_connections=4)
    >>> model, model.metadata  # nothing is dialled before the first prediction
    (OpenPIModel('openpi://127.0.0.1:8000'), None)
    >>> model.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import math
import threading
from collections.abc import Coroutine
from typing import Any

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection, connect

from ...adapters import ModelSpec
from ...contexts import PredictContext
from ...errors import ModelOutputError, RemoteError
from ...model import Model
from ...utils import map_leaves
from ..address import parse_openpi_address
from .codec import OpenPIWireError, packb, unpackb

OBSERVATION_KEY = "observation"
"""The key a payload that is not a dict travels under."""
DEFAULT_TIMEOUT_S = 60.0
CLOSE_WAIT_S = 5.0
"""The longest ``close`` waits for a connection's closing handshake, or the loop's end."""
INTERNAL_ERROR = 1011
# websockets >= 15 dials through the environment's HTTP proxy by default; a policy server is
# dialled directly (older versions never use a proxy and take no such argument).
NO_PROXY = {"proxy": None} if "proxy" in inspect.signature(connect).parameters else {}


class OpenPIModel(Model):
    """A policy served by an openpi WebSocket server (openpi's ``serve_policy``, an
    ``openpi-server``, or ``rlmesh.serve_model(..., protocol="openpi")``), used as
    ``rlmesh.run(OpenPIModel(address), env, execution_horizon=H, ...)``.

    Args:
        address: ``openpi://host:port`` (also ``ws://host:port`` or ``host:port``).
        spec: the ``ModelSpec`` of the payload the policy expects (keys, image sizes, state,
            the instruction as ``prompt``) and of its actions; None sends the env's
            observation as it is.
        api_key: sent as ``Authorization: Api-Key <key>`` when set.
        max_connections: the most connections in use at once; default no bound: one per
            running episode, so one per lane.
        timeout_s: the bound on every wait: connecting, the metadata frame, each answer.

    Attributes:
        address: the server's address, ``openpi://host:port``.
        metadata: the server's metadata frame (a dict), once a connection has opened; None
            before.

    Raises:
        ValueError: an address of none of the forms above, or a bad ``max_connections`` or
            ``timeout_s``.
        TypeError: ``spec`` is not a ``ModelSpec``.

    Predictions raise ``RemoteError`` (naming the address) when the server cannot be reached,
    refuses the connection (a wrong key), answers with an error (a text frame, or close code
    1011: the server's text is in the message) or not within ``timeout_s``; and
    ``ModelOutputError`` for an answer without an ``(H, ...)`` chunk under ``"actions"``.
    """

    def __init__(
        self,
        address: str,
        *,
        spec: ModelSpec | None = None,
        api_key: str | None = None,
        max_connections: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__()
        parsed = parse_openpi_address(address)
        self.address = str(parsed)
        self._url = f"ws://{parsed.host}:{parsed.port}"
        if spec is not None and not isinstance(spec, ModelSpec):
            raise TypeError(f"OpenPIModel: spec must be a rlmesh.adapters.ModelSpec, got {spec!r}")
        if spec is not None:
            self.spec = spec
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(
                f"max_connections must be an int >= 1 or None, got {max_connections!r}"
            )
        if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        self.max_connections = max_connections
        self.timeout_s = float(timeout_s)
        self._headers = {} if api_key is None else {"Authorization": f"Api-Key {api_key}"}
        self.metadata: dict[str, Any] | None = None
        self._runtime: _Runtime | None = None
        self._runtime_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenPIModel({self.address!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Connections and their thread do not travel: a copy (a cluster's worker) dials anew.
        state = self.__dict__.copy()
        state["_runtime"] = None
        state.pop("_runtime_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runtime_lock = threading.Lock()

    # ------------------------------------------------------------------ the corner

    def predict_chunk_batch(
        self,
        obs: Any,
        execution_horizon: int | None = None,
        context: list[PredictContext] | None = None,
    ) -> np.ndarray:
        """Chunks ``[N, H, ...]``: each lane's payload sent as one message, concurrently over
        the connections, each answer's ``actions`` a lane's chunk (cut to the shortest H).

        ``context`` (the driver's, one per row) binds each row's episode to a connection;
        without it, row ``i`` goes over connection ``i % C``."""
        rows = _rows(obs)
        messages = [_message(obs, row) for row in range(rows)]
        episodes = None if context is None else [each["episode_id"] for each in context]
        runtime = self._running()
        # Every wait inside is bounded; this one, covering the dial and a slot's share of the
        # rows at worst all of them, only ends a call whose loop is stuck.
        bound = self.timeout_s * (2 + rows) + CLOSE_WAIT_S
        answers = runtime.call(
            runtime.pool.ask_all(messages, episodes, self.max_connections), bound
        )
        return self._chunks(answers)

    def on_episode_end(self, episode_id: int) -> None:
        """Close the episode's connection (once no other episode shares it), without waiting:
        to an openpi server, as to rlmesh's, a connection's end is its episode's end."""
        runtime = self._runtime
        if runtime is not None:
            runtime.post(runtime.pool.end_episode(episode_id))

    def connect(self) -> dict[str, Any]:
        """Open one connection now (rather than at the first prediction) and return the
        server's metadata: a check that the server answers and takes the key."""
        runtime = self._running()
        return runtime.call(runtime.pool.warm_up(), 2 * self.timeout_s + CLOSE_WAIT_S)

    def close(self) -> None:
        """Close every connection and end the model's thread; a later prediction opens new
        ones. Closing again does nothing."""
        with self._runtime_lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.stop()

    # ------------------------------------------------------------------ helpers

    def _running(self) -> _Runtime:
        with self._runtime_lock:
            if self._runtime is None:
                self._runtime = _Runtime(
                    _Pool(
                        self.address, self._url, self._headers, self.timeout_s, self._keep_metadata
                    )
                )
            return self._runtime

    def _keep_metadata(self, metadata: Any) -> None:
        if self.metadata is None:
            self.metadata = metadata

    def _chunks(self, answers: list[Any]) -> np.ndarray:
        chunks = []
        for row, answer in enumerate(answers):
            actions = answer.get("actions") if isinstance(answer, dict) else None
            if actions is None:
                raise ModelOutputError(
                    f"the openpi server at {self.address} answered row {row} without "
                    f"'actions': expected a dict holding an (H, D) chunk, got "
                    f"{list(answer) if isinstance(answer, dict) else type(answer).__name__}"
                )
            chunk = np.asarray(actions)
            if chunk.ndim == 0 or chunk.shape[0] == 0:
                raise ModelOutputError(
                    f"the openpi server at {self.address} answered row {row} with actions of "
                    f"shape {chunk.shape}: expected an (H, D) chunk of H >= 1 actions"
                )
            chunks.append(chunk)
        shortest = min(chunk.shape[0] for chunk in chunks)
        try:
            return np.stack([chunk[:shortest] for chunk in chunks])
        except ValueError:
            shapes = sorted({chunk.shape[1:] for chunk in chunks})
            raise ModelOutputError(
                f"the openpi server at {self.address} answered chunks whose actions differ in "
                f"shape across lanes ({shapes}): every lane's action must have one shape"
            ) from None


def _rows(obs: Any) -> int:
    """N, the lanes of a fused payload: its first leaf's length."""
    while isinstance(obs, dict):
        obs = next(iter(obs.values()))
    return len(obs)


def _message(obs: Any, row: int) -> bytes:
    """Row ``row`` of a fused payload as one openpi request frame."""
    lane = map_leaves(obs, lambda leaf: leaf[row])
    return packb(lane if isinstance(lane, dict) else {OBSERVATION_KEY: lane})


class _Runtime:
    """The model's event loop, on a daemon thread of its own, and the connections on it."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name=f"rlmesh-openpi {pool.address}", daemon=True
        )
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any], bound: float) -> Any:
        """Run ``coroutine`` on the loop and wait at most ``bound`` seconds for its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(bound)
        except concurrent.futures.TimeoutError:
            raise RemoteError(
                f"the openpi server at {self.pool.address} did not answer within {bound:g} s",
                address=self.pool.address,
            ) from None
        finally:
            future.cancel()  # an interrupted or timed-out call stops using its connections

    def post(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` on the loop without waiting for it; what it raises is dropped."""
        if self.loop.is_closed():
            coroutine.close()
            return
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        future.add_done_callback(lambda done: done.cancelled() or done.exception())

    def stop(self) -> None:
        """Let posted work end, close the connections, end the loop and its thread; each
        step bounded, and what is left then cancelled."""
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            future.result(2 * CLOSE_WAIT_S + 1.0)
        except Exception:  # a connection that does not close in time is abandoned
            future.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CLOSE_WAIT_S)
        if self._thread.is_alive():
            return  # a stuck loop stays with its daemon thread
        leftovers = asyncio.all_tasks(self.loop)
        for task in leftovers:
            task.cancel()
        if leftovers:  # cancelled, they abort their connections at once
            self.loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        self.loop.close()

    async def _shutdown(self) -> None:
        posted = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if posted:
            await asyncio.wait(posted, timeout=CLOSE_WAIT_S)
        await self.pool.close()


class _Pool:
    """The connections, by slot: one per running episode (``bind``), or for a call without
    episodes row ``i`` over slot ``i % C``. Used only on the model's loop. A connection that
    failed, or was abandoned mid-request (a lockstep connection cannot tell a late answer from
    the next one), is closed and its slot emptied; the slot dials again on its next use."""

    def __init__(
        self,
        address: str,
        url: str,
        headers: dict[str, str],
        timeout_s: float,
        on_metadata: Any,
    ) -> None:
        self.address = address
        self._url = url
        self._headers = headers
        self._timeout_s = timeout_s
        self._on_metadata = on_metadata
        self._metadata: Any = None
        self._slots: dict[int, ClientConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._episode_slots: dict[Any, int] = {}  # a running episode's slot
        self._users: dict[int, int] = {}  # a slot's running episodes

    def bind(self, episodes: list[Any], cap: int | None) -> list[int]:
        """The slot of each row's episode: the one it was bound to, else a free slot (the
        lowest without an episode, under ``cap``), else, ``cap`` reached, the slot with the
        fewest episodes, which they then share."""
        slots = []
        for episode in episodes:
            slot = self._episode_slots.get(episode)
            if slot is None:
                slot = next(free for free in itertools.count() if not self._users.get(free))
                if cap is not None and slot >= cap:
                    slot = min(range(cap), key=lambda each: self._users.get(each, 0))
                self._episode_slots[episode] = slot
                self._users[slot] = self._users.get(slot, 0) + 1
            slots.append(slot)
        return slots

    async def end_episode(self, episode: Any) -> None:
        slot = self._episode_slots.pop(episode, None)
        if slot is None:
            return
        self._users[slot] -= 1
        if self._users[slot] == 0:
            del self._users[slot]
            # Taken off its slot at once, so the slot's next episode dials a new connection.
            connection = self._slots.pop(slot, None)
            if connection is not None:
                await self._discard(connection)

    async def ask_all(
        self, messages: list[bytes], episodes: list[Any] | None, cap: int | None
    ) -> list[Any]:
        """Each message's answer, in order: message ``i`` over its episode's slot (``bind``),
        or without episodes over slot ``i % C`` (C: ``cap``, default one per message); each
        slot's messages in order, the slots concurrently."""
        if episodes is None:
            connections = min(len(messages), cap or len(messages))
            slots = [row % connections for row in range(len(messages))]
        else:
            slots = self.bind(episodes, cap)
        answers: list[Any] = [None] * len(messages)
        rows_of: dict[int, list[int]] = {}
        for row, slot in enumerate(slots):
            rows_of.setdefault(slot, []).append(row)
        tasks = [
            asyncio.ensure_future(self._ask_rows(slot, rows, messages, answers))
            for slot, rows in sorted(rows_of.items())
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            # Cancelled tasks close their connections before they end.
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:  # in slot order, so the error raised does not depend on timing
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return answers

    async def warm_up(self) -> Any:
        async with self._lock(0):
            await self._connection(0)
        return self._metadata

    async def _ask_rows(
        self, slot: int, rows: list[int], messages: list[bytes], answers: list[Any]
    ) -> None:
        async with self._lock(slot):  # lockstep: one caller at a time on a connection
            connection = await self._connection(slot)
            try:
                for row in rows:
                    answers[row] = await self._ask(connection, messages[row])
            except BaseException:
                self._slots.pop(slot, None)
                await self._discard(connection)
                raise

    def _lock(self, slot: int) -> asyncio.Lock:
        lock = self._locks.get(slot)
        if lock is None:
            lock = self._locks[slot] = asyncio.Lock()
        return lock

    async def _connection(self, slot: int) -> ClientConnection:
        connection = self._slots.get(slot)
        if connection is not None:
            return connection
        try:
            connection = await connect(
                self._url,
                additional_headers=self._headers,
                compression=None,
                max_size=None,
                **NO_PROXY,
                open_timeout=self._timeout_s,
                ping_interval=None,
                close_timeout=min(self._timeout_s, CLOSE_WAIT_S),
            )
        except websockets.InvalidStatus as exc:
            response = exc.response
            body = response.body.decode("utf-8", "replace").strip() if response.body else ""
            raise RemoteError(
                f"the openpi server at {self.address} refused the connection with HTTP "
                f"{response.status_code}{': ' + body if body else ''}"
                f"{' (is the api_key right?)' if response.status_code in (401, 403) else ''}",
                address=self.address,
                code=str(response.status_code),
            ) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise RemoteError(
                f"could not reach the openpi server at {self.address}: {type(exc).__name__}: {exc}",
                address=self.address,
            ) from None
        try:
            metadata = self._decoded(await self._receive(connection, "its metadata frame"))
        except BaseException:
            await self._discard(connection)
            raise
        self._metadata = metadata
        self._on_metadata(metadata)
        self._slots[slot] = connection
        return connection

    async def _ask(self, connection: ClientConnection, message: bytes) -> Any:
        try:
            await connection.send(message)
        except websockets.ConnectionClosed as exc:
            raise self._closed(exc) from None
        return self._decoded(await self._receive(connection, "a request"))

    async def _receive(self, connection: ClientConnection, waiting_for: str) -> bytes:
        try:
            frame = await asyncio.wait_for(connection.recv(), self._timeout_s)
        except asyncio.TimeoutError:
            raise RemoteError(
                f"the openpi server at {self.address} did not answer {waiting_for} within "
                f"{self._timeout_s:g} s (timeout_s)",
                address=self.address,
            ) from None
        except websockets.ConnectionClosed as exc:
            raise self._closed(exc) from None
        if isinstance(frame, str):  # the protocol's error: the server's traceback
            raise RemoteError(
                f"the openpi server at {self.address} failed: {frame.strip()}",
                address=self.address,
                code=str(INTERNAL_ERROR),
            )
        return frame

    def _decoded(self, frame: bytes) -> Any:
        try:
            return unpackb(frame)
        except OpenPIWireError as exc:
            raise RemoteError(
                f"the openpi server at {self.address} sent a frame that is not openpi's "
                f"msgpack: {exc}",
                address=self.address,
            ) from None

    def _closed(self, exc: websockets.ConnectionClosed) -> RemoteError:
        received = exc.rcvd
        if received is None:
            return RemoteError(
                f"the openpi server at {self.address} dropped the connection",
                address=self.address,
            )
        reason = f": {received.reason}" if received.reason else ""
        what = "failed" if received.code == INTERNAL_ERROR else "closed the connection"
        return RemoteError(
            f"the openpi server at {self.address} {what} (close code {received.code}{reason})",
            address=self.address,
            code=str(received.code),
        )

    async def _discard(self, connection: ClientConnection) -> None:
        try:
            await asyncio.shield(connection.close())
        except BaseException:  # closing is a courtesy; the connection is gone either way
            connection.transport.abort()

    async def close(self) -> None:
        connections, self._slots = list(self._slots.values()), {}
        await asyncio.gather(
            *(self._discard(connection) for connection in connections), return_exceptions=True
        )


__all__ = ["OBSERVATION_KEY", "OpenPIModel"]
