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
answers as a local model's would for its computation: ``rlmesh.remote.websocket.client``);
each reads the server's metadata frame first (kept as ``metadata``), and ``close`` closes
them all and ends the thread.

Several servers of the model (``replicas``, for a model served on several GPUs): each
episode's messages go to one server, chosen at its first, and a lost server's episodes move to
the others, their earlier messages sent again first (``rlmesh.remote.replicas``), so the
per-episode results do not depend on the number of servers. ``max_connections`` bounds each
server's connections.

Where the peers' own description says nothing: keepalive pings are off (the reference server
blocks its event loop while it infers, so a long inference would fail a ping), and no
compression is offered; every wait is bounded by ``timeout_s`` instead.

Example:
    >>> model = OpenPIModel("openpi://127.0.0.1:8000", max_connections=4)
    >>> model, model.metadata  # nothing is dialled before the first prediction
    (OpenPIModel('openpi://127.0.0.1:8000'), None)
    >>> model.close()
    >>> OpenPIModel("openpi://127.0.0.1:8000", replicas=["openpi://127.0.0.1:8001"]).addresses
    ['openpi://127.0.0.1:8000', 'openpi://127.0.0.1:8001']
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection

from ...adapters import ModelSpec
from ...contexts import PredictContext
from ...errors import RemoteError
from ..address import parse_openpi_address
from ..replicas import replica_addresses
from ..websocket.client import (
    DEFAULT_TIMEOUT_S,
    INTERNAL_ERROR,
    NO_PROXY,
    OBSERVATION_KEY,
    Slot,
    SlotPool,
    SocketModel,
    all_done,
    episode_ids,
    lanes,
    rows_of,
)
from .codec import OpenPIWireError, packb, unpackb


class OpenPIModel(SocketModel):
    """A policy served by an openpi WebSocket server (openpi's ``serve_policy``, an
    ``openpi-server``, or ``rlmesh.serve_model(..., protocol="openpi")``), used as
    ``rlmesh.run(OpenPIModel(address), env, execution_horizon=H, ...)``.

    Args:
        address: ``openpi://host:port`` (also ``ws://host:port`` or ``host:port``).
        spec: the ``ModelSpec`` of the payload the policy expects (keys, image sizes, state,
            the instruction as ``prompt``) and of its actions; None sends the env's
            observation as it is.
        api_key: sent as ``Authorization: Api-Key <key>`` when set.
        max_connections: the most connections in use at once, per server; default no bound:
            one per running episode, so one per lane.
        timeout_s: the bound on every wait: connecting, the metadata frame, each answer.
        replicas: more servers of the same policy (addresses as ``address``): the episodes
            are spread over all of them, and one lost moves its episodes to the others
            (``rlmesh.remote.replicas``).

    Attributes:
        address: the server's address, ``openpi://host:port``.
        addresses: every server's, ``address`` first, then the replicas'.
        metadata: the server's metadata frame (a dict), once a connection has opened; None
            before.

    Raises:
        ValueError: an address of none of the forms above (or given twice), or a bad
            ``max_connections`` or ``timeout_s``.
        TypeError: ``spec`` is not a ``ModelSpec``, or ``replicas`` not a list of addresses.

    Predictions raise ``RemoteError`` (naming the address) when the server cannot be reached,
    refuses the connection (a wrong key), answers with an error (a text frame, or close code
    1011: the server's text is in the message) or not within ``timeout_s``; and
    ``ModelOutputError`` for an answer without an ``(H, ...)`` chunk under ``"actions"``.
    With replicas, a server that cannot be reached, drops the connection or sends nothing
    within ``timeout_s`` is lost instead, and only the loss of every one fails a prediction.
    """

    protocol = "openpi"

    def __init__(
        self,
        address: str,
        *,
        spec: ModelSpec | None = None,
        api_key: str | None = None,
        max_connections: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        replicas: Sequence[str] | None = None,
    ) -> None:
        headers = {} if api_key is None else {"Authorization": f"Api-Key {api_key}"}
        parsed = [parse_openpi_address(each) for each in replica_addresses(address, replicas)]
        super().__init__(
            parsed[0], spec=spec, headers=headers, timeout_s=timeout_s, replicas=parsed[1:]
        )
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(
                f"max_connections must be an int >= 1 or None, got {max_connections!r}"
            )
        self.max_connections = max_connections

    @property
    def metadata(self) -> dict[str, Any] | None:
        """The server's metadata frame, once a connection has opened; None before."""
        return self._info

    def predict_chunk_batch(
        self,
        obs: Any,
        execution_horizon: int | None = None,
        context: list[PredictContext] | None = None,
    ) -> np.ndarray:
        """Chunks ``[N, H, ...]``: each lane's payload sent as one message, concurrently over
        the connections, each answer's ``actions`` a lane's chunk (cut to the shortest H).

        ``context`` (the driver's, one per row) binds each row's episode to a connection (and,
        with replicas, to a server); without it, row ``i`` goes over connection ``i % C``."""
        messages = [packb(lane) for lane in lanes(obs)]
        episodes = episode_ids(context)

        async def asking(pool: _Pool, rows: list[int], replays: list[list[bytes]]) -> list[Any]:
            return await pool.ask_all(
                [messages[row] for row in rows],
                rows_of(episodes, rows),
                self.max_connections,
                replays,
            )

        # A packed message is bytes of its own: kept as it is for a replay.
        answers = self._ask(episodes, len(messages), asking, keep=messages.__getitem__)
        return self._chunks(answers)

    def _new_pool(self, replica: int) -> _Pool:
        return _Pool(
            self.protocol,
            self.addresses[replica],
            self._urls[replica],
            self._headers,
            self.timeout_s,
            self._keep_info,
        )


class _Pool(SlotPool):
    """The connections, by slot: one per running episode (``bind``), or for a call without
    episodes row ``i`` over slot ``i % C``. A connection whose episodes all ended is closed:
    to an openpi server, as to rlmesh's, a connection's end is its episode's end."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
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
            held = self._slots.pop(slot, None)
            if held is not None:
                await self.discard(held.connection)

    async def ask_all(
        self,
        messages: list[bytes],
        episodes: list[Any] | None,
        cap: int | None,
        replays: list[list[bytes]] | None = None,
    ) -> list[Any]:
        """Each message's answer, in order: message ``i`` over its episode's slot (``bind``),
        or without episodes over slot ``i % C`` (C: ``cap``, default one per message); each
        slot's messages in order, the slots concurrently. ``replays[i]``: the messages sent
        before message ``i`` on its slot, their answers dropped (an episode moved here from a
        lost server)."""
        if episodes is None:
            connections = min(len(messages), cap or len(messages))
            slots = [row % connections for row in range(len(messages))]
        else:
            slots = self.bind(episodes, cap)
        answers: list[Any] = [None] * len(messages)
        slot_rows: dict[int, list[int]] = {}
        for row, slot in enumerate(slots):
            slot_rows.setdefault(slot, []).append(row)
        await all_done(
            self._ask_rows(slot, rows, messages, answers, replays)
            for slot, rows in sorted(slot_rows.items())
        )
        return answers

    async def _ask_rows(
        self,
        slot: int,
        rows: list[int],
        messages: list[bytes],
        answers: list[Any],
        replays: list[list[bytes]] | None,
    ) -> None:
        async with self.using(slot) as held:
            assert held is not None  # dialled
            for row in rows:
                for earlier in replays[row] if replays else ():
                    await self.send(held.connection, earlier)
                    await self._answer(held.connection, "answer to a replayed request")
                await self.send(held.connection, messages[row])
                answers[row] = await self._answer(held.connection, "answer to a request")

    async def _handshake(self, connection: ClientConnection) -> tuple[Slot, Any]:
        return Slot(connection), await self._answer(connection, "metadata frame")

    async def _answer(self, connection: ClientConnection, what: str) -> Any:
        frame = await self.receive(connection, what)
        if isinstance(frame, str):  # the protocol's error: the server's traceback
            raise RemoteError(
                f"the openpi server at {self.address} failed: {frame.strip()}",
                address=self.address,
                code=str(INTERNAL_ERROR),
            )
        try:
            return unpackb(frame)
        except OpenPIWireError as exc:
            raise RemoteError(
                f"the openpi server at {self.address} sent a frame that is not openpi's "
                f"msgpack: {exc}",
                address=self.address,
            ) from None


__all__ = ["NO_PROXY", "OBSERVATION_KEY", "OpenPIModel"]
