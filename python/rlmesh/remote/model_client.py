"""Driving a served model: ``RemoteModel``, a model whose predictions come over rlmesh-wire-v1.

``RemoteModel(address)`` handshakes with the server at construction and takes the served
model's ``ModelSpec`` from it, so the driver assembles exactly the payload the model asks
for: frame stacks and chunk queues stay on the driver, keyed by episode, and the wire carries
one payload per round. Per run it mints a UUIDv7 ``env_id``, resolves it with the payload's
space, the action space and the run's execution horizon, then sends one ``PredictRequest``
per round for every lane that needs an action (row ``i`` tagged with its episode's UUIDv7 id
and seed), a ``ResetAdapter`` when an episode it predicted for ends, and ``Close`` at the end.

It plugs into the run through the model-handler seam like any model: a ``Model`` whose
batched corners call the server (``predict_batch``, and ``predict_chunk_batch`` for chunked
runs), told the run's spaces by ``on_route``.

With ``replicas`` (more servers of the same model, for a model served on several GPUs) it
holds a channel and a Join stream per server, and each round's rows go, by episode, to the
server chosen at the episode's first predict (``rlmesh.remote.replicas``): one
``PredictRequest`` per server, sent to all before any answer is read. A server lost (it
cannot be reached, its stream breaks, it answers ``MODEL_ERROR_CODE_CLOSED``) has its
episodes moved to the others, which are first sent each moved episode's earlier rows again
(one-row predicts, answers dropped), so a server's per-episode contexts are rebuilt exactly.
Every server must send the same ``ModelSpec``.

Example:
    >>> import rlmesh
    >>> server = rlmesh.serve_model(lambda obs: int(obs[2] > 0))
    >>> result = rlmesh.run(RemoteModel(server.address), "CartPole-v1", episodes=2)
    >>> [episode.index for episode in result.episodes]
    [0, 1]
    >>> server.close()
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from ..adapters import ModelSpec
from ..contexts import PredictContext
from ..errors import ModelDefinitionError, ModelOutputError, RemoteError, SpecError
from ..model import Model, Route
from ..utils import map_leaves
from .address import parse_address
from .codec import WORKFLOW_EDITION, SpaceCodec, meta_map, space_spec
from .connection import (
    DEFAULT_MAX_MESSAGE_MB,
    check_handshake,
    handshake_request,
    open_channel,
    remote_failure,
    token_metadata,
    uuid7,
    wire_transport,
)
from .protocol import MODEL_SPEC_KEY
from .replicas import (
    Groups,
    ReplicaLostError,
    ReplicaSet,
    joined_rows,
    replica_addresses,
    take_rows,
)
from .wire.core.v1 import env_contract_pb2
from .wire.model.v1 import interaction_pb2, service_pb2

COMPONENT = "rlmesh-driver"
CLOSE_WAIT_S = 5.0
"""How long ``close`` waits for the server to answer ``Close`` before it hangs up."""
HANDSHAKE = "/rlmesh.model.v1.ModelService/Handshake"
JOIN = "/rlmesh.model.v1.ModelService/Join"
# The failures that lose a server rather than refuse a request: it cannot be reached or went
# away (a killed server's stream ends UNAVAILABLE on both transports; a server shutting down
# cancels it), or it answers that it is closing. UNKNOWN and INTERNAL are left out: they are
# what a server that failed on the request answers, and another replica would fail alike.
LOST_CODES = frozenset(
    {"UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "MODEL_ERROR_CODE_CLOSED"}
)


class RemoteModel(Model):
    """A model served elsewhere (``rlmesh.serve_model``, ``rlmesh serve model``, or rlmesh
    0.1.0's ``Model.serve``), used as ``rlmesh.run(RemoteModel(address), env, ...)``.

    Args:
        address: ``tcp://host:port``, ``host:port`` or ``unix:///path``.
        token: the server's bearer token, if it needs one (every replica's).
        connect_timeout: seconds to wait for the server to answer at construction.
        max_message_mb: the largest message sent or taken.
        core: whose transport carries the calls, ``"rust"`` or ``"python"`` (grpcio);
            default the active core.
        replicas: more servers of the same model (addresses as ``address``): the episodes
            are spread over all of them, and one lost moves its episodes to the others
            (``rlmesh.remote.replicas``).

    Attributes:
        spec: the served model's ``ModelSpec`` from the handshake (None: the raw observation).
        address: the server's address.
        addresses: every server's, ``address`` first, then the replicas'.
        server_info: the first server's handshake (its ``PeerInfo``).

    Raises:
        RemoteError: no server answered, the handshake was refused, or the token was wrong
            (code ``UNAUTHENTICATED``); with replicas, a server that cannot be reached is lost
            and only the loss of every one raises, naming each; replicas whose specs differ.
        ValueError: an address of none of the forms above, or one given twice.

    Example:
        >>> import rlmesh
        >>> with rlmesh.serve_model(lambda obs: 0, token="s3cret") as server:
        ...     model = RemoteModel(server.address, token="s3cret")
        ...     model.spec is None
        True
    """

    # The server keys what the model remembers by episode id: lanes share it safely.
    stateless = True

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        connect_timeout: float = 10.0,
        max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
        core: str | None = None,
        replicas: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self._core = core
        self._status_error = wire_transport(core).WireStatusError
        self._token = token
        self._connect_timeout = connect_timeout
        self._max_message_mb = max_message_mb
        self._metadata = token_metadata(token)
        self.addresses = [str(parse_address(each)) for each in replica_addresses(address, replicas)]
        self.address = self.addresses[0]
        self._servers = [_Server(each) for each in self.addresses]
        self._replicas = ReplicaSet(self.addresses)
        self._spec_json: str | None = None
        self._spec_from: str | None = None  # the server whose spec the others must match
        try:
            infos = self._replicas.each(self._dial)
        except BaseException:
            self._hang_up()
            raise
        self.server_info = next(iter(infos.values()))
        spec_json = self._spec_json
        self.spec = None if spec_json is None else _spec_from_json(spec_json, self._spec_from)
        self._route: _WireRoute | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Channels do not travel: a copy (a cluster's worker) dials every replica anew.
        arguments = {
            "token": self._token,
            "connect_timeout": self._connect_timeout,
            "max_message_mb": self._max_message_mb,
            "core": self._core,
            "replicas": self.addresses[1:] or None,
        }
        return (functools.partial(type(self), **arguments), (self.address,))

    def _dial(self, replica: int) -> Any:
        """Open server ``replica``'s channel if none is open, and handshake; its PeerInfo."""
        server = self._servers[replica]
        if server.channel is None:
            try:
                server.channel, _ = open_channel(
                    server.address,
                    connect_timeout=self._connect_timeout,
                    max_message_mb=self._max_message_mb,
                    core=self._core,
                )
            except RemoteError as err:
                raise _classified(err) from None
        try:
            info = self._handshake(server)
            self._check_spec(server, info.peer_info.extra.get(MODEL_SPEC_KEY))
        except BaseException:
            server.hang_up()
            raise
        return info

    def _handshake(self, server: _Server) -> Any:
        request = service_pb2.HandshakeRequest(base=handshake_request(COMPONENT))
        try:
            raw = server.channel.unary(
                HANDSHAKE,
                request.SerializeToString(),
                metadata=self._metadata,
                timeout=self._connect_timeout,
            )
        except self._status_error as err:
            raise _classified(remote_failure(err, server.address, "the model handshake")) from None
        response = service_pb2.HandshakeResponse.FromString(raw)
        check_handshake(response.base, server.address)
        return response.base

    def _check_spec(self, server: _Server, spec_json: str | None) -> None:
        """The first server's spec is the model's; every other must send the same."""
        if self._spec_from is None:
            self._spec_json, self._spec_from = spec_json, server.address
            return
        if spec_json != self._spec_json:
            raise RemoteError(
                f"the model at {server.address} has another ModelSpec ({MODEL_SPEC_KEY}) than "
                f"the model at {self._spec_from}: replicas must serve one model, the same spec "
                f"({spec_json or 'none'} against {self._spec_json or 'none'})",
                address=server.address,
            )

    def __repr__(self) -> str:
        if len(self.addresses) == 1:
            return f"RemoteModel({self.address!r})"
        return f"RemoteModel({self.address!r}, replicas={self.addresses[1:]!r})"

    # ------------------------------------------------------------------ the run's lifecycle

    def on_route(self, route: Route) -> None:
        """Work out the wire's spaces for this run: the payload the driver will assemble and
        the actions the model answers in; a new ``env_id`` for it.

        Raises:
            ModelDefinitionError: the run ensembles chunks: rlmesh-wire asks a server for
                ``execution_horizon`` actions, and has no way to ask for a whole chunk.
        """
        if route.ensemble:
            raise ModelDefinitionError(
                f"RemoteModel({self.address!r}) cannot serve a run with ensemble=: rlmesh-wire "
                f"asks the server for execution_horizon actions per prediction, not for the "
                f"model's whole chunk; ensemble on the server's side (serve a model whose "
                f"predict ensembles), or serve the model over openpi's protocol "
                f"(rlmesh serve --protocol openpi), whose answers are whole chunks"
            )
        self._route = _WireRoute(route, self.spec, self.address)

    def load(self) -> None:
        """Open each server's Join stream and resolve this run's ``env_id`` on it."""
        route = self._needs_route("load")
        self._replicas.each(lambda replica: self._join(replica, route))

    def _join(self, replica: int, route: _WireRoute) -> None:
        server = self._servers[replica]
        if server.stream is None or server.stream.broken is not None:
            if server.channel is None:
                self._dial(replica)
            server.stream = _JoinStream(
                server.channel.stream(JOIN, metadata=self._metadata),
                server.address,
                self._status_error,
            )
        server.stream.ask(
            "resolve_adapter",
            interaction_pb2.JoinRequest(
                resolve_adapter=interaction_pb2.ResolveAdapterRequest(
                    context=route.context(),
                    env_spec=route.env_spec,
                    selected_workflow_edition=WORKFLOW_EDITION,
                    execution_horizon=route.execution_horizon,
                )
            ),
        )

    def predict_batch(self, obs: Any, context: list[PredictContext]) -> Any:
        """One action per row: ``actions[0]`` of the server's answer."""
        return self._predict(obs, context)[0]

    def predict_chunk_batch(
        self, obs: Any, execution_horizon: int | None = None, context: list[PredictContext] = ()
    ) -> Any:
        """Chunks ``[K, H, ...]``: the answer's frames ``actions[0..H-1]`` along axis 1."""
        frames = self._predict(obs, context)
        return map_leaves(frames[0], lambda *steps: np.stack(steps, axis=1), *frames[1:])

    def on_episode_end(self, episode_id: int) -> None:
        """Tell the episode's server the episode ended (``ResetAdapter``), without waiting."""
        route = self._route
        if route is None:
            return
        replica = self._replicas.end(episode_id)
        wire_id = route.episodes.pop(episode_id, None)
        if wire_id is None or replica is None:
            return
        stream = self._servers[replica].stream
        if stream is None:
            return
        try:
            stream.send(
                interaction_pb2.JoinRequest(
                    reset_adapter=interaction_pb2.ResetAdapterRequest(
                        context=route.context(), episode_ids=[wire_id]
                    )
                )
            )
        except ReplicaLostError as err:
            self._replicas.lose(replica, err)

    def close(self) -> None:
        """``Close`` each stream (waiting at most ``CLOSE_WAIT_S`` for the answer), then the
        channels. Closing again does nothing; a later run opens new streams, to every
        server, those lost included."""
        self._hang_up()
        if self._route is not None:
            self._route.episodes.clear()
        self._replicas.reset()

    def _hang_up(self) -> None:
        for server in self._servers:
            server.hang_up()

    # ------------------------------------------------------------------ predictions

    def _needs_route(self, doing: str) -> _WireRoute:
        if self._route is None:
            raise RemoteError(
                f"RemoteModel({self.address!r}).{doing}: the model knows no route yet; use it "
                f"through rlmesh.run(model, env, ...), which tells it the env's spaces first",
                address=self.address,
            )
        return self._route

    def _predict(self, obs: Any, contexts: list[PredictContext]) -> list[Any]:
        route = self._needs_route("predict")
        if all(server.stream is None for server in self._servers):
            raise RemoteError(
                f"RemoteModel({self.address!r}): predict before load() (or after close())",
                address=self.address,
            )
        rows = len(contexts)
        infos = []
        for context in contexts:
            wire_id = route.episodes.get(context["episode_id"])
            if wire_id is None:
                wire_id = route.episodes[context["episode_id"]] = uuid7()
            info = interaction_pb2.EpisodeInfo(episode_id=wire_id)
            if context["episode_seed"] is not None:
                info.seed = int(context["episode_seed"])
            infos.append(info)

        def send(groups: Groups, replays: dict[int, list[Any]]) -> dict[int, Any]:
            return self._send(route, obs, rows, infos, groups, replays)

        # A row kept for a replay is a one-row payload of its own (a copy).
        answers = self._replicas.ask(
            [context["episode_id"] for context in contexts],
            send,
            keep=lambda row: take_rows(obs, [row]),
        )
        horizon = min(len(frames) for frames, _ in answers)
        return [
            joined_rows([(frames[step], position) for frames, position in answers])
            for step in range(horizon)
        ]

    def _send(
        self,
        route: _WireRoute,
        obs: Any,
        rows: int,
        infos: list[Any],
        groups: Groups,
        replays: dict[int, list[Any]],
    ) -> dict[int, Any]:
        """Each server's part of a round: its replays and its one predict sent to every server
        first, then each server's answers read; by server, its rows' answers (``(frames,
        position)``: the part's decoded frames and the row's place in them) or the error."""
        outcomes: dict[int, Any] = {}
        sent: dict[int, tuple[_JoinStream, list[str], str]] = {}
        for replica, group in groups.items():
            stream = self._servers[replica].stream
            try:
                assert stream is not None, "every live server has a stream from load()"
                replayed = [
                    stream.send(route.predict(earlier, 1, [infos[row]]))
                    for row in group
                    for earlier in replays.get(row, ())
                ]
                part = obs if len(group) == rows else take_rows(obs, group)
                request = route.predict(part, len(group), [infos[row] for row in group])
                sent[replica] = (stream, replayed, stream.send(request))
            except Exception as err:  # the part's outcome: a loss, or the call's failure
                outcomes[replica] = err
        for replica, (stream, replayed, request_id) in sent.items():
            group = groups[replica]
            try:
                for earlier_id in replayed:
                    stream.answer(earlier_id, "a replayed predict")
                answer = stream.answer(request_id, "predict").predict
                frames = self._decoded(route, answer, len(group), stream.address)
            except Exception as err:
                outcomes[replica] = err
                continue
            outcomes[replica] = [(frames, position) for position in range(len(group))]
        return outcomes

    @staticmethod
    def _decoded(route: _WireRoute, answer: Any, rows: int, address: str) -> list[Any]:
        if not answer.actions:
            raise ModelOutputError(
                f"the model at {address} answered a predict of {rows} rows with no action "
                f"frame: expected actions[0] (one row per episode)"
            )
        try:
            return [route.actions.decode(frame, rows) for frame in answer.actions]
        except ValueError as err:
            raise ModelOutputError(
                f"the model at {address} answered actions that do not match the action "
                f"space {route.actions.space}: {err}"
            ) from None


class _Server:
    """One server of the model: its address, channel and Join stream."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel: Any = None
        self.stream: _JoinStream | None = None

    def hang_up(self) -> None:
        """Close the stream (``Close`` first, bounded) and the channel."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close(CLOSE_WAIT_S)
        if self.channel is not None:
            self.channel.close()
            self.channel = None


class _WireRoute:
    """One run's view of the wire: its env_id, the payload's and actions' codecs, the env spec
    ResolveAdapter sends, and the run's episodes (our ids -> UUIDv7 ids)."""

    def __init__(self, route: Route, spec: ModelSpec | None, address: str) -> None:
        self.env_id = uuid7()
        self.session_id = uuid7()
        self.execution_horizon = route.execution_horizon
        payload_space = _payload_space(route, spec, address)
        action_space = _action_space(route.action_space, spec)
        self.payload = SpaceCodec(payload_space)
        self.actions = SpaceCodec(action_space)
        self.env_spec = env_contract_pb2.EnvSpec(
            id=route.env,
            observation_space=space_spec(payload_space, "the payload"),
            action_space=space_spec(action_space, "the action space"),
            metadata=meta_map({"rlmesh.payload": "assembled" if spec is not None else "raw"}),
        )
        self.episodes: dict[int, str] = {}
        self._requests = itertools.count(1)

    def context(self) -> interaction_pb2.AdapterContext:
        return interaction_pb2.AdapterContext(
            session_id=self.session_id,
            env_id=self.env_id,
            request_id=f"{self.env_id}:{next(self._requests)}",
        )

    def predict(self, payload: Any, rows: int, infos: list[Any]) -> interaction_pb2.JoinRequest:
        """The predict of ``rows`` rows of ``payload``, row ``i`` of episode ``infos[i]``."""
        return interaction_pb2.JoinRequest(
            predict=interaction_pb2.PredictRequest(
                context=self.context(),
                observation=self.payload.encode(payload, rows),
                episode_info=infos,
            )
        )


def _payload_space(route: Route, spec: ModelSpec | None, address: str) -> spaces.Space:
    """The space of the payload the driver assembles: the raw observation space without a
    spec; else one Box per array leaf (its stacked frame shape, its dtype) and a Text per text
    leaf, nested as the spec's slots."""
    if spec is None or spec.input is None:
        return route.observation_space
    root: dict[str, Any] = collections.OrderedDict()
    for leaf in route.plan.observation:
        if leaf.kind == "custom":
            raise SpecError(
                f"{leaf.leaf}: a Custom leaf's output has no declared space, so the model at "
                f"{address} cannot be sent it; use Image, State, Concat or Text leaves for a "
                f"served model"
            )
        if leaf.kind == "text":
            space: spaces.Space = spaces.Text(max_length=1 << 20)
        else:
            shape = leaf.frame_shape if leaf.stack == 1 else (leaf.stack, *leaf.frame_shape)
            space = _unbounded_box(shape, np.dtype(leaf.dtype))
        if not leaf.slot:
            return space  # the payload is this one leaf
        node = root
        for key in leaf.slot[:-1]:
            node = node.setdefault(key, collections.OrderedDict())
        node[leaf.slot[-1]] = space
    return _as_dict_space(root)


def _as_dict_space(tree: dict[str, Any]) -> spaces.Dict:
    return spaces.Dict(
        collections.OrderedDict(
            (key, _as_dict_space(value) if isinstance(value, dict) else value)
            for key, value in tree.items()
        )
    )


def _unbounded_box(shape: tuple[int, ...], dtype: np.dtype[Any]) -> spaces.Box:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return spaces.Box(int(info.min), int(info.max), shape, dtype)
    return spaces.Box(-np.inf, np.inf, shape, dtype)


def _action_space(action_space: spaces.Space, spec: ModelSpec | None) -> spaces.Space:
    """The space the model answers in: the action space, but for a spec that rescales, each
    Box in float64 over the model's range (rescaling happens on the driver, unrounded)."""
    if spec is None or spec.output.rescale is None:
        return action_space
    low, high = spec.output.rescale

    def model_side(space: spaces.Space) -> spaces.Space:
        if isinstance(space, spaces.Dict):
            return spaces.Dict(
                collections.OrderedDict((k, model_side(v)) for k, v in space.spaces.items())
            )
        if isinstance(space, spaces.Box):
            return spaces.Box(low, high, space.shape, np.float64)
        return space

    return model_side(action_space)


def _spec_from_json(text: str, address: str) -> ModelSpec:
    try:
        return ModelSpec.from_dict(json.loads(text))
    except (ValueError, SpecError) as err:
        raise RemoteError(
            f"the model at {address} sent a ModelSpec this rlmesh cannot read "
            f"({MODEL_SPEC_KEY}): {err}",
            address=address,
        ) from None


# ---------------------------------------------------------------------------------- the stream


class _JoinStream:
    """One Join call (the transport's ``WireStream``). The caller waiting for an answer reads
    the stream itself, one caller at a time, until its ``request_id`` comes, passing over the
    answers of requests nobody waits for (``ResetAdapter``). A broken stream fails that
    caller, and every later one, with the ``RemoteError`` that broke it."""

    def __init__(self, call: Any, address: str, status_error: type[Exception]) -> None:
        self.address = address
        self.broken: RemoteError | None = None
        self._call = call
        self._status_error = status_error
        # Held while a caller reads: still held at close, it is a predict abandoned at its
        # deadline, so the server is stuck and would not answer Close either.
        self._reading = threading.Lock()
        self._ids = itertools.count(1)
        self._closing = False

    def send(self, request: Any) -> str:
        """Send ``request`` (its ``request_id`` set here) without waiting; its id."""
        if self.broken is not None:
            raise self.broken
        request.request_id = f"r{next(self._ids)}"
        try:
            self._call.send(request.SerializeToString())
        except self._status_error as err:
            self.broken = _classified(remote_failure(err, self.address, "the model stream"))
            raise self.broken from None
        return request.request_id

    def ask(self, doing: str, request: Any, timeout: float | None = None) -> Any:
        """Send ``request`` and wait for its answer (``answer``)."""
        return self.answer(self.send(request), doing, timeout)

    def answer(self, request_id: str, doing: str, timeout: float | None = None) -> Any:
        """Wait for the answer to the request ``request_id`` (``TimeoutError`` past
        ``timeout`` s); an in-band ``ModelError`` is raised as a ``RemoteError`` with the
        error's code (a ``ReplicaLostError`` for a server that is closing)."""
        with self._reading:
            response = self._answer_to(request_id, timeout)
        if response.WhichOneof("kind") == "error":
            error = response.error
            code = interaction_pb2.ModelErrorCode.Name(error.code)
            raise _classified(
                RemoteError(
                    f"the model at {self.address} refused {doing} with {code}: {error.message}",
                    address=self.address,
                    code=code,
                    detail=error.message,
                )
            )
        return response

    def _answer_to(self, request_id: str, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                raw = self._call.receive(wait)
            except self._status_error as err:
                doing = "closing the model stream" if self._closing else "the model stream"
                self.broken = _classified(remote_failure(err, self.address, doing))
                raise self.broken from None
            if raw is None:
                self.broken = ReplicaLostError(
                    f"the model at {self.address} ended the Join stream", address=self.address
                )
                raise self.broken
            response = interaction_pb2.JoinResponse.FromString(raw)
            if response.request_id == request_id:
                return response

    def close(self, wait_s: float) -> None:
        """Send ``Close``, wait up to ``wait_s`` for its answer, then hang up."""
        self._closing = True
        try:
            if self.broken is None and self._reading.acquire(blocking=False):
                self._reading.release()
                # A dead or hung server: hang up all the same.
                with contextlib.suppress(Exception):
                    self.ask(
                        "close",
                        interaction_pb2.JoinRequest(
                            close=interaction_pb2.CloseParticipantRequest(reason="the run ended")
                        ),
                        timeout=wait_s,
                    )
        finally:
            self._call.cancel()


def _classified(error: RemoteError) -> RemoteError:
    """``error`` as a ``ReplicaLostError`` when it loses the server (``LOST_CODES``), else as
    it is."""
    return ReplicaLostError.from_error(error) if error.code in LOST_CODES else error


__all__ = ["RemoteModel"]
