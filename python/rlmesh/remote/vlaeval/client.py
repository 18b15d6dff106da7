"""The client of a vla-eval model server: ``VlaEvalModel``, a ``Model`` whose chunks come over
vla-eval's WebSocket protocol (``rlmesh.remote.vlaeval``).

The driver does what it does for a local chunked model: it assembles each lane's payload as
the model's ``spec`` says (frame stacks and per-episode state stay on the driver), calls the
one corner, ``predict_chunk_batch``, and replays each lane's chunk with the run's
``execution_horizon``. The corner sends one ``observation`` per lane: the lane's payload as a
dict (a Dict payload's keys, nested as they are; a payload that is one array, such as a raw
Box observation without a spec, under the key ``"observation"``, ``OBSERVATION_KEY``), and
takes the answer's ``"actions"``: a chunk ``(H, D)``, or one action ``(D,)`` taken as a chunk of
one (vla-eval's servers that replay chunks themselves answer so). The lanes' chunks, cut to
the shortest H, make the ``[N, H, D]`` batch.

A chunk reaches the action space through the spec's ``Action`` (by default a cast), as a
local model's does: a ``Discrete`` space takes a one-element row ``[a]`` as the action ``a``.

Sessions and episodes: each running episode is bound at its first prediction to a connection
of its own (the corner takes the driver's ``context`` for the rows' episode ids), which says
``hello`` when it opens (asking for whole chunks: ``"capabilities": {"action_chunks": true}``)
and sends ``episode_start`` before the episode's first observation, with the rlmesh fields
``execution_horizon`` and ``seed`` (the episode's) beside vla-eval's ``task``. The episode's
end sends ``episode_end`` and frees the connection for the lane's next episode, so a run holds
one connection per lane, as vla-eval's own runners hold one per shard. The rows of a call go
concurrently over their connections. The connections live on an event loop of the model's
own, on a thread of its own (``rlmesh.remote.websocket.client``); ``close`` closes them all
and ends the thread.

Several servers of the model (``replicas``, for a model served on several GPUs): each
episode goes to one server, chosen at its first observation, and a lost server's episodes move
to the others, which are sent ``episode_start`` and the episode's earlier observations again
first (``rlmesh.remote.replicas``), so the per-episode results do not depend on the number of
servers, a server that keeps per-episode state included.

Where the peer departs from its own description: its RFC says an action is matched to its
observation by ``seq``, but its ``Connection`` takes whatever message comes next and only logs
a mismatch, and an ``error`` answering an ``episode_start`` (its server sends one when the
model's ``on_episode_start`` fails) then stands in for the next observation's action, every
later answer one behind. This client checks that each answer is an ``action`` echoing the
observation's ``seq``, and ends the connection (a ``RemoteError``) otherwise. Keepalive pings
are off, as vla-eval's client has them (a server inferring may not answer them); every wait is
bounded by ``timeout_s`` instead.

Example:
    >>> model = VlaEvalModel("vlaeval://127.0.0.1:8000")
    >>> model, model.server_info  # nothing is dialled before the first prediction
    (VlaEvalModel('vlaeval://127.0.0.1:8000'), None)
    >>> model.close()
    >>> VlaEvalModel("vlaeval://127.0.0.1:8000", replicas=["vlaeval://127.0.0.1:8001"])
    VlaEvalModel('vlaeval://127.0.0.1:8000', replicas=['vlaeval://127.0.0.1:8001'])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection

from ...adapters import ModelSpec
from ...contexts import PredictContext
from ...errors import ModelDefinitionError, RemoteError
from ...model import Route
from ...version import __version__
from ..address import parse_vlaeval_address
from ..replicas import replica_addresses
from ..websocket.client import (
    DEFAULT_TIMEOUT_S,
    OBSERVATION_KEY,
    Slot,
    SlotPool,
    SocketModel,
    all_done,
    episode_ids,
    lanes,
    owned,
    rows_of,
)
from .codec import (
    IMAGE_FORMATS,
    PROTOCOL_VERSION,
    Message,
    VlaEvalWireError,
    pack_message,
    unpack_message,
)


class VlaEvalModel(SocketModel):
    """A policy served by a vla-eval model server (vla-eval's ``serve``, a ``vla-eval serve``
    model server, or ``rlmesh.serve_model(..., protocol="vla-eval")``), used as
    ``rlmesh.run(VlaEvalModel(address), env, execution_horizon=H, ...)``.

    Args:
        address: ``vlaeval://host:port`` (also ``ws://host:port`` or ``host:port``).
        spec: the ``ModelSpec`` of the payload the server expects (keys such as ``images``,
            ``state`` and ``task_description``, image sizes) and of its actions; None sends
            the env's observation as it is.
        api_key: sent as ``Authorization: Bearer <key>`` when set (vla-eval's own servers
            take no key; rlmesh's take its ``token`` so).
        timeout_s: the bound on every wait: connecting, the ``hello`` answer, each action.
        image_format: ``"png"`` (vla-eval's default) or ``"raw"``: how ``(H, W, 3|4)`` uint8
            images travel.
        replicas: more servers of the same model (addresses as ``address``): the episodes are
            spread over all of them, and one lost moves its episodes to the others
            (``rlmesh.remote.replicas``).

    Attributes:
        address: the server's address, ``vlaeval://host:port``.
        addresses: every server's, ``address`` first, then the replicas'.
        server_info: the server's ``hello`` payload (its versions, ``capabilities``, and
            what else it declares), once a connection has opened; None before.

    Raises:
        ValueError: an address of none of the forms above (or given twice), or a bad
            ``timeout_s`` or ``image_format``.
        TypeError: ``spec`` is not a ``ModelSpec``, or ``replicas`` not a list of addresses.

    Predictions raise ``RemoteError`` (naming the address) when the server cannot be reached,
    refuses the connection (a wrong key), answers with an ``error`` (its text is in the
    message), out of step, or not within ``timeout_s``; and ``ModelOutputError`` for an
    answer without ``"actions"``. With replicas, a server that cannot be reached, drops the
    connection or sends nothing within ``timeout_s`` is lost instead, and only the loss of
    every one fails a prediction.
    """

    protocol = "vla-eval"
    expected = "an action (D,) or a chunk (H, D)"
    one_action = True  # vla-eval's servers that replay chunks themselves answer one action

    def __init__(
        self,
        address: str,
        *,
        spec: ModelSpec | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        image_format: str = "png",
        replicas: Sequence[str] | None = None,
    ) -> None:
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        parsed = [parse_vlaeval_address(each) for each in replica_addresses(address, replicas)]
        super().__init__(
            parsed[0], spec=spec, headers=headers, timeout_s=timeout_s, replicas=parsed[1:]
        )
        if image_format not in IMAGE_FORMATS:
            raise ValueError(f"image_format must be 'png' or 'raw', got {image_format!r}")
        self.image_format = image_format

    def on_route(self, route: Route) -> None:
        """Refuse a run that ensembles chunks (``ensemble=``): vla-eval's episode start asks
        the server for ``execution_horizon`` actions per observation, and a server that
        replays chunks answers one, so the run would average one-action chunks.

        Raises:
            ModelDefinitionError: the run ensembles chunks.
        """
        if route.ensemble:
            raise ModelDefinitionError(
                f"VlaEvalModel({self.address!r}) cannot serve a run with ensemble=: vla-eval's "
                f"episode start asks the server for execution_horizon actions, not the model's "
                f"whole chunk; serve the model over openpi's protocol (rlmesh serve --protocol "
                f"openpi), whose answers are whole chunks, or ensemble on the server's side"
            )
        super().on_route(route)

    @property
    def server_info(self) -> dict[str, Any] | None:
        """The server's ``hello`` payload, once a connection has opened; None before."""
        return self._info

    def predict_chunk_batch(
        self,
        obs: Any,
        execution_horizon: int | None = None,
        context: list[PredictContext] | None = None,
    ) -> np.ndarray:
        """Chunks ``[N, H, ...]``: each lane's payload sent as one observation, concurrently
        over the lanes' connections, each answer's ``actions`` a lane's chunk (cut to the
        shortest H).

        ``context`` (the driver's, one per row) binds each row's episode to a connection (and,
        with replicas, to a server) and gives its seed; without it, row ``i`` goes over
        connection ``i``, outside any episode."""
        observations = lanes(obs)
        episodes = episode_ids(context)
        seeds = None if context is None else [each.get("episode_seed") for each in context]
        horizon = execution_horizon or 1

        async def asking(
            pool: _Pool, rows: list[int], replays: list[list[dict[str, Any]]]
        ) -> list[Any]:
            return await pool.ask_all(
                [observations[row] for row in rows],
                rows_of(episodes, rows),
                rows_of(seeds, rows),
                horizon,
                replays,
            )

        # An observation's arrays may be views of the driver's buffers: kept as copies.
        answers = self._ask(
            episodes, len(observations), asking, keep=lambda row: owned(observations[row])
        )
        return self._chunks(answers)

    def _new_pool(self, replica: int) -> _Pool:
        return _Pool(
            self.protocol,
            self.addresses[replica],
            self._urls[replica],
            self._headers,
            self.timeout_s,
            self._keep_info,
            image_format=self.image_format,
        )


class _Session(Slot):
    """One open connection: its next ``seq`` and the episode its server was told of."""

    def __init__(self, connection: ClientConnection) -> None:
        super().__init__(connection)
        self.seq = itertools.count(1)
        self.episode: Any = None


class _Pool(SlotPool):
    """The sessions, by slot: one per running episode (``bind``), or for a call without
    episodes row ``i`` over slot ``i``. An episode's end sends ``episode_end`` and frees its
    slot, whose connection the lane's next episode reuses."""

    def __init__(self, *args: Any, image_format: str) -> None:
        super().__init__(*args)
        self._image_format = image_format
        self._episode_slots: dict[Any, int] = {}  # a running episode's slot

    def bind(self, episodes: list[Any]) -> list[int]:
        """The slot of each row's episode: the one it was bound to, else the lowest free."""
        slots = []
        for episode in episodes:
            slot = self._episode_slots.get(episode)
            if slot is None:
                taken = set(self._episode_slots.values())
                slot = next(free for free in itertools.count() if free not in taken)
                self._episode_slots[episode] = slot
            slots.append(slot)
        return slots

    async def end_episode(self, episode: Any) -> None:
        # Freed at once, before any wait, so the lane's next episode may take the slot.
        slot = self._episode_slots.pop(episode, None)
        if slot is None:
            return
        async with self.using(slot, dial=False) as session:
            if isinstance(session, _Session) and session.episode == episode:
                session.episode = None
                await self._send(session, "episode_end", {"episode_id": episode})

    async def ask_all(
        self,
        observations: list[dict[str, Any]],
        episodes: list[Any] | None,
        seeds: list[Any] | None,
        horizon: int,
        replays: list[list[dict[str, Any]]] | None = None,
    ) -> list[Any]:
        """Each observation's answer, in order, each over its episode's slot (``bind``), or
        without episodes observation ``i`` over slot ``i``; the slots concurrently.
        ``replays[i]``: the observations sent before observation ``i`` (after its
        ``episode_start``), their actions dropped (an episode moved here from a lost
        server)."""
        slots = list(range(len(observations))) if episodes is None else self.bind(episodes)
        answers: list[Any] = [None] * len(observations)
        await all_done(
            self._ask(
                slot,
                observations[row],
                None if episodes is None else episodes[row],
                None if seeds is None else seeds[row],
                horizon,
                answers,
                row,
                replays[row] if replays else (),
            )
            for row, slot in enumerate(slots)
        )
        return answers

    async def _ask(
        self,
        slot: int,
        observation: dict[str, Any],
        episode: Any,
        seed: Any,
        horizon: int,
        answers: list[Any],
        row: int,
        replay: Sequence[dict[str, Any]],
    ) -> None:
        async with self.using(slot) as session:
            assert isinstance(session, _Session)  # dialled
            if episode is not None and session.episode != episode:
                session.episode = episode
                start = {"task": {}, "episode_id": episode, "execution_horizon": horizon}
                await self._send(session, "episode_start", {**start, "seed": seed})
            for earlier in replay:
                seq = await self._send(session, "observation", earlier)
                await self._receive(session, seq, "action")
            seq = await self._send(session, "observation", observation)
            answers[row] = await self._receive(session, seq, "action")

    async def _handshake(self, connection: ClientConnection) -> tuple[Slot, Any]:
        session = _Session(connection)
        hello = {
            "harness_version": f"rlmesh {__version__}",
            "protocol_version": PROTOCOL_VERSION,
            "capabilities": {"action_chunks": True},
        }
        info = await self._receive(session, await self._send(session, "hello", hello), "hello")
        return session, info

    async def _send(self, session: _Session, kind: str, payload: dict[str, Any]) -> int:
        seq = next(session.seq)
        frame = pack_message(kind, payload, seq, image_format=self._image_format)
        await self.send(session.connection, frame)
        return seq

    async def _receive(self, session: _Session, seq: int, kind: str) -> Any:
        """The payload of the answer to message ``seq``, which must be a ``kind``."""
        frame = await self.receive(session.connection, kind)
        try:
            message = unpack_message(frame)
        except VlaEvalWireError as exc:
            raise RemoteError(
                f"the vla-eval server at {self.address} sent a frame that is not a vla-eval "
                f"message: {exc}",
                address=self.address,
            ) from None
        if message.type == "error":
            raise self._failed(message, seq)
        if message.type != kind or message.seq != seq:
            raise RemoteError(
                f"the vla-eval server at {self.address} answered message {seq} with a "
                f"{message.type!r} of seq {message.seq}: expected its {kind!r}, echoing {seq}",
                address=self.address,
            )
        return message.payload

    def _failed(self, message: Message, seq: int) -> RemoteError:
        payload = message.payload if isinstance(message.payload, dict) else {}
        text = str(payload.get("error", message.payload)).strip()
        trace = payload.get("traceback")
        about = "" if message.seq == seq else f" (about its message {message.seq})"
        return RemoteError(
            f"the vla-eval server at {self.address} failed{about}: {text}"
            + (f"\n{str(trace).strip()}" if trace else ""),
            address=self.address,
        )


__all__ = ["OBSERVATION_KEY", "VlaEvalModel"]
