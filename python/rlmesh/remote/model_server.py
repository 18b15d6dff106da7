"""Serving a model over rlmesh-wire-v1: ``serve_model`` and the ``rlmesh.model.v1.ModelService``.

A driver dials the served model (``rlmesh.RemoteModel``), handshakes, and opens one ``Join``
stream. On it, ``ResolveAdapter`` fixes an ``env_id``'s spaces and execution horizon,
``Predict`` asks for the actions of a batch of rows (row ``i`` belongs to
``episode_info[i]``), ``ResetAdapter`` ends episodes, ``ReleaseAdapter`` forgets an env and
``Close`` ends the stream. Every request gets one answer, in order, with its ``request_id``;
failures are in-band ``ModelError``s and the server keeps serving.

Frame stacks and chunk queues live on the driver: a predict carries the payload the model's
spec asks for (the driver assembled it), described by the resolved env spec's observation
space, and the answer is ``actions[0..H-1]``, one frame per step of the chunk.

Cross-driver batching: the model gets one call at a time (``Batcher``, in
``rlmesh.remote.batching``). Predicts from all streams
whose adapters share an observation space and horizon are queued and answered by one call of
the model's batched corner (``predict_batch`` / ``predict_chunk_batch``), of at most
``max_batch`` rows, gathered for at most ``max_wait_ms`` after the first arrived (at once when
every stream that could add to the batch already has), and the answers are split back per
request. A model with only per-lane corners is called per row, as in a local run.
``ModelServer.stats()`` counts requests, rows and model calls.

Example:
    >>> import numpy as np
    >>> server = serve_model(lambda obs: int(obs[2] > 0))
    >>> server.address.startswith("tcp://127.0.0.1:")
    True
    >>> server.stats().requests
    0
    >>> server.close()
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from ..model import ModelHandler
from ..spaces import batch_from_leaves, batch_leaves, leaf_shape, space_leaves
from ..utils import map_leaves
from .batching import Batcher, BatchStats, Work, check_batching, first_leaf
from .codec import WORKFLOW_EDITION, SpaceCodec, WireFormatError, space_from_spec
from .connection import DEFAULT_MAX_MESSAGE_MB, Server, handshake_response
from .protocol import MODEL_SPEC_KEY, RequestError
from .wire.model.v1 import interaction_pb2, service_pb2, service_pb2_grpc

if TYPE_CHECKING:
    from .openpi.server import OpenPIServer
    from .vlaeval.server import VlaEvalServer

COMPONENT = "rlmesh-model"

Code = interaction_pb2.ModelErrorCode


def serve_model(
    model: Any,
    address: str = "127.0.0.1:0",
    *,
    max_batch: int | None = None,
    max_wait_ms: float = 2,
    token: str | None = None,
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB,
    allow_shutdown: bool = False,
    core: str | None = None,
    protocol: str = "rlmesh",
) -> ModelServer | OpenPIServer | VlaEvalServer:
    """Serve ``model`` on ``address`` until the returned server is closed.

    Args:
        model: a ``rlmesh.Model`` instance or a callable ``fn(obs) -> action`` (a ``predict``),
            as ``rlmesh.run`` takes it. It is loaded here, before the server listens.
        address: ``host:port`` (port 0 picks a free one), ``tcp://host:port`` or
            ``unix:///path``; loopback by default.
        max_batch: the most rows one model call takes (None: no limit). A request with more
            rows is answered by several calls.
        max_wait_ms: how long a predict may wait for predicts of other drivers to join its
            batch (0: never).
        token: when set, every call but the health check needs ``authorization: Bearer
            <token>``; others get ``UNAUTHENTICATED`` before reaching the model.
        max_message_mb: the largest message taken or sent.
        allow_shutdown: accept the ``Shutdown`` call (refused by default).
        core: whose transport serves it: ``"rust"`` (the Rust core's, tonic) or ``"python"``
            (grpcio); default the active core.
        protocol: ``"rlmesh"`` (rlmesh-wire-v1) or ``"openpi"``: openpi's WebSocket policy
            protocol, served to openpi's own clients by ``rlmesh.remote.openpi.server``
            (``token`` is then the ``Api-Key``; ``allow_shutdown`` and ``core`` do not apply),
            or ``"vla-eval"``: vla-eval's WebSocket protocol, served to vla-eval's clients by
            ``rlmesh.remote.vlaeval.server`` (``token`` as a Bearer header or ``?token=``).

    Returns:
        The running ``ModelServer`` (an ``OpenPIServer`` for openpi): ``.address``,
        ``.stats()``, ``.close()``, ``.wait()``.

    Example:
        >>> with serve_model(lambda obs: 0, "127.0.0.1:0", max_batch=64) as server:
        ...     server.address.startswith("tcp://")
        True
    """
    if protocol == "openpi":
        return _serve_openpi(
            model, address, max_batch, max_wait_ms, token, max_message_mb, allow_shutdown
        )
    if protocol == "vla-eval":
        if allow_shutdown:
            raise ValueError("allow_shutdown: vla-eval's protocol has no Shutdown call")
        from .vlaeval.server import serve_vlaeval

        return serve_vlaeval(
            model,
            address,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            token=token,
            max_message_mb=max_message_mb,
        )
    if protocol != "rlmesh":
        raise ValueError(f"protocol must be 'rlmesh', 'openpi' or 'vla-eval', got {protocol!r}")
    check_batching(max_batch, max_wait_ms)
    handler = ModelHandler(model)
    spec_json = None if handler.spec is None else json.dumps(handler.spec.to_dict())
    batcher = Batcher(handler, max_batch=max_batch, max_wait_s=max_wait_ms / 1000)
    service = ModelService(batcher, spec_json=spec_json, allow_shutdown=allow_shutdown)
    try:
        server = ModelServer.start(
            address,
            services=[
                lambda host: service_pb2_grpc.add_ModelServiceServicer_to_server(service, host)
            ],
            component=COMPONENT,
            token=token,
            max_message_mb=max_message_mb,
            on_close=batcher.close,
            core=core,
        )
    except BaseException:
        batcher.close()
        raise
    server.service = service
    service.server = server
    return server


def _serve_openpi(
    model: Any,
    address: str,
    max_batch: int | None,
    max_wait_ms: float,
    token: str | None,
    max_message_mb: float,
    allow_shutdown: bool,
) -> OpenPIServer:
    if allow_shutdown:
        raise ValueError("allow_shutdown: openpi's protocol has no Shutdown call")
    from .openpi.server import serve_openpi

    return serve_openpi(
        model,
        address,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        api_key=token,
        max_message_mb=max_message_mb,
    )


class ModelServer(Server):
    """A served model (``serve_model``): a ``Server`` that also counts its predictions."""

    service: ModelService

    def stats(self) -> BatchStats:
        """What the model was asked so far: requests, rows, model calls, mean batch size."""
        return self.service.batcher.stats.snapshot()


# ---------------------------------------------------------------------------------- the service


@dataclass
class _Adapter:
    """One resolved ``env_id``: its spaces, horizon and episodes (wire id -> the model's id)."""

    env_id: str
    observation: SpaceCodec
    action: SpaceCodec
    horizon: int
    key: Any
    handler: ModelHandler
    episodes: dict[str, int] = field(default_factory=dict)


class ModelService(service_pb2_grpc.ModelServiceServicer):
    """``rlmesh.model.v1.ModelService`` over one ``Batcher``."""

    def __init__(self, batcher: Batcher, *, spec_json: str | None, allow_shutdown: bool) -> None:
        self.batcher = batcher
        self.spec_json = spec_json
        self.allow_shutdown = allow_shutdown
        self.server: Server | None = None
        # The model's episode ids: one counter for every stream, so contexts never collide.
        self._episode_ids = itertools.count()
        self._id_lock = threading.Lock()

    def Handshake(  # noqa: N802 - the gRPC method's name
        self, request: service_pb2.HandshakeRequest, context: grpc.ServicerContext
    ) -> service_pb2.HandshakeResponse:
        response = handshake_response(request.base, COMPONENT)
        if self.spec_json is not None:
            response.peer_info.extra[MODEL_SPEC_KEY] = self.spec_json
        return service_pb2.HandshakeResponse(base=response)

    def Shutdown(  # noqa: N802
        self, request: service_pb2.ShutdownRequest, context: grpc.ServicerContext
    ) -> service_pb2.ShutdownResponse:
        response = service_pb2.ShutdownResponse()
        if not self.allow_shutdown or self.server is None:
            response.base.accepted = False
            response.base.message = (
                "remote shutdown is disabled for this model server (serve_model(..., "
                "allow_shutdown=True) enables it)"
            )
            return response
        response.base.accepted = True
        response.base.message = "shutting down"
        # Not from this handler's thread: stopping waits for running calls, this one included.
        threading.Thread(target=self.server.close, daemon=True).start()
        return response

    def Join(  # noqa: N802
        self, request_iterator: Iterator[interaction_pb2.JoinRequest], context: grpc.ServicerContext
    ) -> Iterator[interaction_pb2.JoinResponse]:
        # Headers go out at once: a client may wait for them before it sends its first request
        # (rlmesh 0.1.0's does), and gRPC would otherwise hold them until the first answer.
        context.send_initial_metadata(())
        session = _Session(self)
        try:
            for request in request_iterator:
                started = time.perf_counter_ns()
                response = session.answer(request)
                response.request_id = request.request_id
                response.endpoint_total_ns = time.perf_counter_ns() - started
                yield response
                if request.WhichOneof("kind") == "close":
                    return
        finally:
            session.release_all("the Join stream ended")

    def mint_episode_id(self) -> int:
        with self._id_lock:
            return next(self._episode_ids)


class _Session:
    """One Join stream: its adapters, answered one request at a time, in order."""

    def __init__(self, service: ModelService) -> None:
        self.service = service
        self.batcher = service.batcher
        self.adapters: dict[str, _Adapter] = {}
        self._keys: collections.Counter[Any] = collections.Counter()

    def answer(self, request: interaction_pb2.JoinRequest) -> interaction_pb2.JoinResponse:
        kind = request.WhichOneof("kind")
        try:
            if kind == "resolve_adapter":
                self.resolve(request.resolve_adapter)
                return interaction_pb2.JoinResponse(
                    resolve_adapter=interaction_pb2.ResolveAdapterResponse()
                )
            if kind == "predict":
                return interaction_pb2.JoinResponse(predict=self.predict([request.predict])[0])
            if kind == "grouped_predict":
                return interaction_pb2.JoinResponse(
                    grouped_predict=self.grouped_predict(request.grouped_predict)
                )
            if kind == "reset_adapter":
                self.reset(request.reset_adapter)
                return interaction_pb2.JoinResponse(
                    reset_adapter=interaction_pb2.ResetAdapterResponse()
                )
            if kind == "release_adapter":
                self.release(self.adapter(request.release_adapter.context, "release_adapter"))
                return interaction_pb2.JoinResponse(
                    release_adapter=interaction_pb2.ReleaseAdapterResponse()
                )
            if kind == "close":
                self.release_all(request.close.reason or "closed by the client")
                return interaction_pb2.JoinResponse(
                    close=interaction_pb2.CloseParticipantResponse()
                )
            raise RequestError(
                Code.MODEL_ERROR_CODE_UNSUPPORTED,
                f"request {request.request_id!r} holds no request this server knows (a newer "
                f"edition's?): expected resolve_adapter, predict, grouped_predict, "
                f"reset_adapter, release_adapter or close",
            )
        except Exception as err:  # every failure is an answer; the stream goes on
            return interaction_pb2.JoinResponse(error=_model_error(err, kind, request.request_id))

    # ------------------------------------------------------------------ adapters

    def resolve(self, request: interaction_pb2.ResolveAdapterRequest) -> None:
        env_id = request.context.env_id
        if not env_id:
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST, "resolve_adapter: the context has no env_id"
            )
        edition = request.selected_workflow_edition
        if edition and edition != WORKFLOW_EDITION:
            raise RequestError(
                Code.MODEL_ERROR_CODE_UNSUPPORTED,
                f"resolve_adapter for env {env_id}: workflow edition {edition!r} is not one "
                f"this server follows ({WORKFLOW_EDITION!r})",
                recoverable=False,
            )
        spec = request.env_spec
        if not spec.HasField("observation_space") or not spec.HasField("action_space"):
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST,
                f"resolve_adapter for env {env_id}: the env spec needs an observation_space "
                f"(the payload's space) and an action_space",
            )
        try:
            observation = space_from_spec(spec.observation_space, "observation_space")
            action = space_from_spec(spec.action_space, "action_space")
            codecs = SpaceCodec(observation), SpaceCodec(action)
        except (WireFormatError, TypeError, ValueError) as err:
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST, f"resolve_adapter for env {env_id}: {err}"
            ) from None
        horizon = max(1, int(request.execution_horizon))
        key = (spec.observation_space.SerializeToString(deterministic=True), horizon)
        if env_id in self.adapters:  # an upsert: the env's episodes go with its old spec
            self.release(self.adapters[env_id])
        self.adapters[env_id] = _Adapter(
            env_id, *codecs, horizon, key, self.batcher.handler_for(horizon)
        )
        if self._keys[key] == 0:
            self.batcher.join_key(key)
        self._keys[key] += 1

    def adapter(self, context: interaction_pb2.AdapterContext, doing: str) -> _Adapter:
        adapter = self.adapters.get(context.env_id)
        if adapter is None:
            raise RequestError(
                Code.MODEL_ERROR_CODE_NOT_CONFIGURED,
                f"{doing} for env {context.env_id or '(no env_id)'}: that env was never "
                f"resolved on this stream; send ResolveAdapter first",
            )
        return adapter

    def release(self, adapter: _Adapter) -> None:
        self.adapters.pop(adapter.env_id, None)
        try:
            self.batcher.end_episodes(adapter.handler, list(adapter.episodes.values()))
        finally:
            adapter.episodes.clear()
            self._keys[adapter.key] -= 1
            if self._keys[adapter.key] == 0:
                del self._keys[adapter.key]
                self.batcher.leave_key(adapter.key)

    def release_all(self, reason: str) -> None:
        for adapter in list(self.adapters.values()):
            # The model's on_episode_end may fail; the stream ends anyway.
            with contextlib.suppress(Exception):
                self.release(adapter)

    def reset(self, request: interaction_pb2.ResetAdapterRequest) -> None:
        adapter = self.adapter(request.context, "reset_adapter")
        wire_ids = list(request.episode_ids) or list(adapter.episodes)
        ended = [
            adapter.episodes.pop(wire_id) for wire_id in wire_ids if wire_id in adapter.episodes
        ]
        self.batcher.end_episodes(adapter.handler, ended)

    # ------------------------------------------------------------------ predictions

    def predict(
        self, requests: Sequence[interaction_pb2.PredictRequest]
    ) -> list[interaction_pb2.PredictResponse]:
        prepared = [self._prepare(request) for request in requests]
        self.batcher.predict([work for _, work in prepared])
        responses = []
        for (adapter, work), request in zip(prepared, requests, strict=True):
            if work.error is not None:
                raise work.error
            responses.append(
                interaction_pb2.PredictResponse(
                    context=request.context, actions=self._frames(adapter, work)
                )
            )
        return responses

    def grouped_predict(
        self, request: interaction_pb2.GroupedPredictRequest
    ) -> interaction_pb2.GroupedPredictResponse:
        """Each group answered on its own (a failed group fails alone), all queued at once so
        groups of one observation space share a batch."""
        prepared: list[tuple[_Adapter, Work] | Exception] = []
        for group in request.groups:
            try:
                prepared.append(self._prepare(group))
            except Exception as err:
                prepared.append(err)
        self.batcher.predict([item[1] for item in prepared if not isinstance(item, Exception)])
        results = []
        for group, item in zip(request.groups, prepared, strict=True):
            try:
                if isinstance(item, Exception):
                    raise item
                adapter, work = item
                if work.error is not None:
                    raise work.error
                results.append(
                    interaction_pb2.GroupedPredictResult(
                        response=interaction_pb2.PredictResponse(
                            context=group.context, actions=self._frames(adapter, work)
                        )
                    )
                )
            except Exception as err:
                results.append(
                    interaction_pb2.GroupedPredictResult(
                        error=_model_error(err, "predict", group.context.request_id)
                    )
                )
        return interaction_pb2.GroupedPredictResponse(results=results)

    def _prepare(self, request: interaction_pb2.PredictRequest) -> tuple[_Adapter, Work]:
        """The request checked and decoded, as work for the batcher."""
        adapter = self.adapter(request.context, "predict")
        rows = len(request.episode_info)
        if rows == 0:
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST,
                f"predict for env {adapter.env_id}: no episode_info, so no rows: "
                f"row i of the observation belongs to episode_info[i]",
            )
        try:
            payload = adapter.observation.decode(request.observation, rows)
        except WireFormatError as err:
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST,
                f"predict for env {adapter.env_id}: the observation does not match the "
                f"resolved observation space: {err}",
            ) from None
        episode_ids, new_episodes = [], []
        for info in request.episode_info:
            episode = adapter.episodes.get(info.episode_id)
            if episode is None:  # first seen: the episode starts here
                if not info.episode_id:
                    raise RequestError(
                        Code.MODEL_ERROR_CODE_INVALID_REQUEST,
                        f"predict for env {adapter.env_id}: an episode_info has no episode_id",
                    )
                episode = self.service.mint_episode_id()
                adapter.episodes[info.episode_id] = episode
                new_episodes.append((episode, info.seed if info.HasField("seed") else None))
            episode_ids.append(episode)
        if len(set(episode_ids)) != rows:
            raise RequestError(
                Code.MODEL_ERROR_CODE_INVALID_REQUEST,
                f"predict for env {adapter.env_id}: an episode id appears twice in "
                f"episode_info; each row is one episode",
            )
        return adapter, Work(adapter.key, adapter.handler, payload, episode_ids, new_episodes)

    def _frames(self, adapter: _Adapter, work: Work) -> list[Any]:
        """The model's output as ``actions[0..H-1]``, each frame batched over the rows."""
        output = work.output
        if not adapter.handler.chunked:
            return [_encode_action(adapter.action, output, work.rows, adapter.env_id, None)]
        horizon = min(first_leaf(output).shape[1], adapter.horizon)
        return [
            _encode_action(
                adapter.action,
                map_leaves(output, lambda leaf, h=step: leaf[:, h]),
                work.rows,
                adapter.env_id,
                step,
            )
            for step in range(horizon)
        ]


def _encode_action(codec: SpaceCodec, batch: Any, rows: int, env_id: str, step: int | None) -> Any:
    """One frame of actions, a leaf of one value taking ``[rows]`` or ``[rows, 1]`` alike (as a
    local run's action plan takes it)."""
    try:
        parts = batch_leaves(codec.space, batch)
        fitted = []
        for (_, space), part in zip(space_leaves(codec.space), parts, strict=True):
            shape = leaf_shape(space)
            array = np.asarray(part)
            if array.shape != (rows, *shape) and array.size == rows and int(np.prod(shape)) == 1:
                array = array.reshape((rows, *shape))
            fitted.append(array)
        return codec.encode(batch_from_leaves(codec.space, fitted), rows)
    except (WireFormatError, KeyError, ValueError, TypeError) as err:
        where = "" if step is None else f" (chunk step {step})"
        raise RequestError(
            Code.MODEL_ERROR_CODE_INTERNAL,
            f"the model's action for env {env_id}{where} does not fit the resolved action "
            f"space {codec.space}: {err}",
        ) from None


def _model_error(err: BaseException, kind: str | None, request_id: str) -> Any:
    """The in-band ``ModelError`` that answers a failed request."""
    if isinstance(err, RequestError):
        return interaction_pb2.ModelError(
            code=err.code, message=str(err), is_recoverable=err.recoverable
        )
    # The model raised (or returned what its handler refused): the model's fault, the
    # session stays usable.
    return interaction_pb2.ModelError(
        code=Code.MODEL_ERROR_CODE_INTERNAL,
        message=f"{kind or 'request'} {request_id!r}: the model raised {type(err).__name__}: {err}",
        is_recoverable=True,
        debug_info=repr(err),
    )


__all__ = ["MODEL_SPEC_KEY", "BatchStats", "ModelServer", "RequestError", "serve_model"]
