"""A ``Model`` whose chunks come from a WebSocket policy server: what rlmesh's openpi client
(``rlmesh.remote.openpi.client.OpenPIModel``) and vla-eval client
(``rlmesh.remote.vlaeval.client.VlaEvalModel``) share. A protocol's client subclasses
``SocketModel`` (its corner and its pool) and ``SlotPool`` (its handshake and messages).

- ``SocketModel``: the address, spec, key and ``timeout_s`` checks; the connections on an
  event loop of the model's own, on a thread of its own (``Runtime``), started at the first
  prediction and ended by ``close``; the server's handshake kept (``_info``); the answers'
  chunks stacked into the ``[N, H, ...]`` batch the driver replays; no connection travels
  with a pickled copy (a cluster's worker dials anew). With ``replicas``, one pool per server,
  every call's rows spread over them by ``rlmesh.remote.replicas.ReplicaSet`` (``_ask``),
  which also moves a lost server's episodes to the others.
- ``SlotPool``: one server's connections, by slot, used only on that loop: one caller at a
  time per slot (the protocols are lockstep), a slot dialled on first use, and a connection
  that failed or was abandoned mid-request closed and its slot emptied. Every wait is bounded
  by ``timeout_s``; keepalive pings are off (a server inferring may not answer them) and no
  compression is offered. Errors are ``RemoteError``s naming the protocol and the address;
  those that lose the server (it cannot be reached, drops the connection, closes it going
  away, or sends nothing within ``timeout_s``) are ``ReplicaLostError``.

Example:
    >>> import numpy as np
    >>> lanes({"state": np.zeros((2, 3)), "prompt": ["a", "b"]})[1]["prompt"]
    'b'
    >>> lanes(np.arange(4).reshape(2, 2))[0]
    {'observation': array([0, 1])}
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import math
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection, connect

from ...adapters import ModelSpec
from ...contexts import PredictContext
from ...errors import ModelOutputError, RemoteError
from ...model import Model
from ...utils import map_leaves
from ..address import Address
from ..replicas import Groups, ReplicaLostError, ReplicaSet

OBSERVATION_KEY = "observation"
"""The key a payload that is not a dict travels under."""
DEFAULT_TIMEOUT_S = 60.0
CLOSE_WAIT_S = 5.0
"""The longest ``close`` waits for a connection's closing handshake, or the loop's end."""
INTERNAL_ERROR = 1011
# Close codes of a server that is going, not of a request it refused: going away (a server
# shutting down), abnormal closure, service restart, try again later.
LOST_CLOSE_CODES = frozenset({1001, 1006, 1012, 1013})
# HTTP answers to the upgrade from a proxy or balancer whose server is gone.
LOST_HTTP_STATUSES = frozenset({502, 503, 504})
# websockets >= 15 dials through the environment's HTTP proxy by default; a policy server is
# dialled directly (older versions never use a proxy and take no such argument).
NO_PROXY = {"proxy": None} if "proxy" in inspect.signature(connect).parameters else {}


def lanes(obs: Any) -> list[dict[str, Any]]:
    """Each row of a fused payload as one lane's message payload: a dict payload's keys,
    nested as they are; a payload that is one array under ``OBSERVATION_KEY``."""
    rows = obs
    while isinstance(rows, dict):
        rows = next(iter(rows.values()))
    split = [map_leaves(obs, lambda leaf, row=row: leaf[row]) for row in range(len(rows))]
    return [lane if isinstance(lane, dict) else {OBSERVATION_KEY: lane} for lane in split]


def episode_ids(context: list[PredictContext] | None) -> list[Any] | None:
    """The rows' episode ids from the driver's ``context`` (None without one)."""
    return None if context is None else [each["episode_id"] for each in context]


def owned(tree: Any) -> Any:
    """``tree`` with each array leaf copied: a request kept for a replay must not change when
    the driver reuses its buffers."""
    return map_leaves(tree, lambda leaf: leaf.copy() if isinstance(leaf, np.ndarray) else leaf)


def rows_of(values: list[Any] | None, rows: list[int]) -> list[Any] | None:
    """``values`` at ``rows`` (None stays None)."""
    return None if values is None else [values[row] for row in rows]


Asking = Callable[["SlotPool", list[int], list[list[Any]]], Coroutine[Any, Any, list[Any]]]
"""A protocol's part of a call: ``asking(pool, rows, replays)`` answers ``rows`` (indices into
the call's rows) over one server's ``pool``, in order, each after its ``replays`` (the
episode's earlier requests, answers dropped)."""


class SocketModel(Model):
    """The part of a WebSocket policy client that is not its protocol's.

    Subclasses set ``protocol`` (named in errors), ``expected`` (what an answer's
    ``"actions"`` should be, for errors) and ``one_action`` (whether an answer of one action
    ``(D,)`` is a chunk of one), and make their pool (``_new_pool``).

    Raises:
        ValueError: a ``timeout_s`` that is not a number of seconds > 0.
        TypeError: ``spec`` is not a ``ModelSpec``.
    """

    protocol: ClassVar[str] = "WebSocket policy"
    expected: ClassVar[str] = "an (H, D) chunk"
    one_action: ClassVar[bool] = False

    def __init__(
        self,
        address: Address,
        *,
        spec: ModelSpec | None,
        headers: dict[str, str],
        timeout_s: float,
        replicas: Sequence[Address] = (),
    ) -> None:
        super().__init__()
        self.address = str(address)
        servers = [address, *replicas]
        self.addresses = [str(server) for server in servers]
        """Every server of the model, the primary (``address``) first."""
        self._urls = [f"ws://{server.host}:{server.port}" for server in servers]
        self._replicas = ReplicaSet(self.addresses)
        if spec is not None and not isinstance(spec, ModelSpec):
            raise TypeError(
                f"{type(self).__name__}: spec must be a rlmesh.adapters.ModelSpec, got {spec!r}"
            )
        if spec is not None:
            self.spec = spec
        if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._headers = headers
        self._info: dict[str, Any] | None = None  # the first connection's handshake
        self._runtime: Runtime | None = None
        self._runtime_lock = threading.Lock()

    def __repr__(self) -> str:
        if len(self.addresses) == 1:
            return f"{type(self).__name__}({self.address!r})"
        return f"{type(self).__name__}({self.address!r}, replicas={self.addresses[1:]!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Connections and their thread do not travel: a copy (a cluster's worker) dials anew,
        # every replica alive.
        state = self.__dict__.copy()
        state["_runtime"] = None
        state["_replicas"] = ReplicaSet(self.addresses)
        state.pop("_runtime_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runtime_lock = threading.Lock()

    def on_episode_end(self, episode_id: int) -> None:
        """End the episode on its connection, without waiting: close the connection or tell
        the server, as the protocol has it."""
        replica = self._replicas.end(episode_id)
        runtime = self._runtime
        if runtime is not None and replica is not None:
            runtime.post(runtime.pools[replica].end_episode(episode_id))

    def connect(self) -> dict[str, Any]:
        """Open one connection to each server now (rather than at the first prediction) and
        return the first one's handshake: a check that the servers answer and take the key.

        Raises:
            RemoteError: a server refused the connection or failed; with replicas, one that
                cannot be reached is lost, and every one lost fails it, naming each.
        """
        runtime = self._running()
        bound = 2 * self.timeout_s + CLOSE_WAIT_S
        infos = self._replicas.each(
            lambda replica: runtime.call(runtime.pools[replica].warm_up(), bound)
        )
        return next(iter(infos.values()))

    def close(self) -> None:
        """Close every connection and end the model's thread; a later prediction opens new
        ones (to every replica, those lost included). Closing again does nothing."""
        with self._runtime_lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.stop()
        self._replicas.reset()

    # ------------------------------------------------------------------ for the protocols

    def _new_pool(self, replica: int) -> SlotPool:
        """The pool of server ``replica`` (``addresses[replica]``, ``_urls[replica]``)."""
        raise NotImplementedError

    def _running(self) -> Runtime:
        with self._runtime_lock:
            if self._runtime is None:
                self._runtime = Runtime(
                    [self._new_pool(replica) for replica in range(len(self.addresses))]
                )
            return self._runtime

    def _ask(
        self,
        episodes: list[Any] | None,
        rows: int,
        asking: Asking,
        keep: Callable[[int], Any] | None = None,
    ) -> list[Any]:
        """The answers of a call of ``rows`` rows (of ``episodes``, or of none), each replica's
        part asked by ``asking`` on its pool, the parts at once, on the model's loop; a lost
        replica's part asked again of the others (``ReplicaSet.ask``; ``keep(row)``: what a
        row's request is kept as for a replay). Every wait inside is bounded; this one,
        covering a dial, a handshake and one answer per message at worst, only ends a call
        whose loop is stuck."""
        runtime = self._running()

        def send(groups: Groups, replays: dict[int, list[Any]]) -> dict[int, Any]:
            messages = rows + sum(len(each) for each in replays.values())
            bound = self.timeout_s * (3 + messages) + CLOSE_WAIT_S
            return runtime.call(_parts(runtime.pools, groups, replays, asking), bound)

        keys = episodes if episodes is not None else [None] * rows
        return self._replicas.ask(keys, send, keep)

    def _keep_info(self, info: Any) -> None:
        if self._info is None:
            self._info = info

    def _chunks(self, answers: list[Any]) -> np.ndarray:
        """The answers' ``"actions"`` as ``[N, H, ...]`` chunks, cut to the shortest H.

        Raises:
            ModelOutputError: an answer without actions, an empty chunk, or lanes whose
                actions differ in shape.
        """
        where = f"the {self.protocol} server at {self.address}"
        chunks = []
        for row, answer in enumerate(answers):
            actions = answer.get("actions") if isinstance(answer, dict) else None
            if actions is None:
                raise ModelOutputError(
                    f"{where} answered row {row} without 'actions': expected a dict holding "
                    f"{self.expected}, got "
                    f"{list(answer) if isinstance(answer, dict) else type(answer).__name__}"
                )
            chunk = np.asarray(actions)
            if self.one_action and chunk.ndim < 2:  # one action (D,), or a bare number
                chunk = chunk.reshape(1, -1)
            if chunk.ndim == 0 or chunk.shape[0] == 0:
                raise ModelOutputError(
                    f"{where} answered row {row} with actions of shape {chunk.shape}: "
                    f"expected {self.expected} of H >= 1 actions"
                )
            chunks.append(chunk)
        shortest = min(chunk.shape[0] for chunk in chunks)
        try:
            return np.stack([chunk[:shortest] for chunk in chunks])
        except ValueError:
            shapes = sorted({chunk.shape[1:] for chunk in chunks})
            raise ModelOutputError(
                f"{where} answered chunks whose actions differ in shape across lanes "
                f"({shapes}): every lane's action must have one shape"
            ) from None


async def _parts(
    pools: list[SlotPool], groups: Groups, replays: dict[int, list[Any]], asking: Asking
) -> dict[int, Any]:
    """Each replica's part of a call, at once: its rows' answers, or what ended it (a lost
    replica does not cancel the others, whose connections hold their episodes)."""
    parts = [
        asking(pools[replica], rows, [replays.get(row, []) for row in rows])
        for replica, rows in groups.items()
    ]
    outcomes = await asyncio.gather(*parts, return_exceptions=True)
    return dict(zip(groups, outcomes, strict=True))


class Runtime:
    """The model's event loop, on a daemon thread of its own, and the connections on it: one
    pool per server."""

    def __init__(self, pools: list[SlotPool]) -> None:
        self.pools = pools
        self.loop = asyncio.new_event_loop()
        self._where = ", ".join(pool.address for pool in pools)
        self._thread = threading.Thread(
            target=self.loop.run_forever,
            name=f"rlmesh-{pools[0].protocol} {self._where}",
            daemon=True,
        )
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any], bound: float) -> Any:
        """Run ``coroutine`` on the loop and wait at most ``bound`` seconds for its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(bound)
        except concurrent.futures.TimeoutError:
            raise RemoteError(
                f"the {self.pools[0].protocol} server at {self._where} did not answer "
                f"within {bound:g} s",
                address=self._where,
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
        await asyncio.gather(*(pool.close() for pool in self.pools), return_exceptions=True)


class Slot:
    """One open connection of a pool."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection


class SlotPool:
    """A client's connections, by slot, on its model's loop. A protocol's pool says how a
    connection opens (``_handshake``) and what an episode's end does (``end_episode``)."""

    def __init__(
        self,
        protocol: str,
        address: str,
        url: str,
        headers: dict[str, str],
        timeout_s: float,
        on_info: Any,
    ) -> None:
        self.protocol = protocol
        self.address = address
        self._url = url
        self._headers = headers
        self._timeout_s = timeout_s
        self._on_info = on_info
        self._info: Any = None
        self._slots: dict[int, Slot] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def _handshake(self, connection: ClientConnection) -> tuple[Slot, Any]:
        """A new connection's opening messages: its slot and the server's handshake."""
        raise NotImplementedError

    async def end_episode(self, episode: Any) -> None:
        raise NotImplementedError

    async def warm_up(self) -> Any:
        async with self.using(0):
            pass
        return self._info

    @contextlib.asynccontextmanager
    async def using(self, slot: int, *, dial: bool = True) -> AsyncIterator[Slot | None]:
        """The slot's connection, for this caller alone (lockstep: one request at a time on
        a connection): dialled if ``dial`` and none is open (else None). What raises inside
        closes the connection and empties the slot: a late answer would pair with the next
        request."""
        async with self._lock(slot):
            held = self._slots.get(slot)
            if held is None and dial:
                held = await self._open(slot)
            try:
                yield held
            except BaseException:
                if held is not None:
                    self._slots.pop(slot, None)
                    await self.discard(held.connection)
                raise

    async def send(self, connection: ClientConnection, frame: bytes) -> None:
        try:
            await connection.send(frame)
        except websockets.ConnectionClosed as exc:
            raise self.closed_error(exc) from None

    async def receive(self, connection: ClientConnection, what: str) -> str | bytes:
        """The next frame, within ``timeout_s``.

        Raises:
            RemoteError: no frame within ``timeout_s``, or the connection closed.
        """
        try:
            return await asyncio.wait_for(connection.recv(), self._timeout_s)
        except asyncio.TimeoutError:
            raise ReplicaLostError(
                f"the {self.protocol} server at {self.address} sent no {what} within "
                f"{self._timeout_s:g} s (timeout_s)",
                address=self.address,
            ) from None
        except websockets.ConnectionClosed as exc:
            raise self.closed_error(exc) from None

    def closed_error(self, exc: websockets.ConnectionClosed) -> RemoteError:
        received = exc.rcvd
        if received is None:
            return ReplicaLostError(
                f"the {self.protocol} server at {self.address} dropped the connection",
                address=self.address,
            )
        reason = f": {received.reason}" if received.reason else ""
        what = "failed" if received.code == INTERNAL_ERROR else "closed the connection"
        kind = ReplicaLostError if received.code in LOST_CLOSE_CODES else RemoteError
        return kind(
            f"the {self.protocol} server at {self.address} {what} (close code "
            f"{received.code}{reason})",
            address=self.address,
            code=str(received.code),
        )

    async def discard(self, connection: ClientConnection) -> None:
        try:
            await asyncio.shield(connection.close())
        except BaseException:  # closing is a courtesy; the connection is gone either way
            connection.transport.abort()

    async def close(self) -> None:
        held, self._slots = list(self._slots.values()), {}
        await asyncio.gather(
            *(self.discard(slot.connection) for slot in held), return_exceptions=True
        )

    def _lock(self, slot: int) -> asyncio.Lock:
        lock = self._locks.get(slot)
        if lock is None:
            lock = self._locks[slot] = asyncio.Lock()
        return lock

    async def _open(self, slot: int) -> Slot:
        connection = await self._dial()
        try:
            held, info = await self._handshake(connection)
        except BaseException:
            await self.discard(connection)
            raise
        self._info = info
        self._on_info(info)
        self._slots[slot] = held
        return held

    async def _dial(self) -> ClientConnection:
        try:
            return await connect(
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
            kind = ReplicaLostError if response.status_code in LOST_HTTP_STATUSES else RemoteError
            raise kind(
                f"the {self.protocol} server at {self.address} refused the connection with "
                f"HTTP {response.status_code}{': ' + body if body else ''}"
                f"{' (is the api_key right?)' if response.status_code in (401, 403) else ''}",
                address=self.address,
                code=str(response.status_code),
            ) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise ReplicaLostError(
                f"could not reach the {self.protocol} server at {self.address}: "
                f"{type(exc).__name__}: {exc}",
                address=self.address,
            ) from None


async def all_done(coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``coroutines`` concurrently until all end or one raises; then the others are
    cancelled (closing their connections) and the first error in their order is raised, so
    which one does not depend on timing."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()


__all__ = [
    "CLOSE_WAIT_S",
    "DEFAULT_TIMEOUT_S",
    "NO_PROXY",
    "OBSERVATION_KEY",
    "Asking",
    "Runtime",
    "Slot",
    "SlotPool",
    "SocketModel",
    "all_done",
    "episode_ids",
    "lanes",
    "owned",
    "rows_of",
]
