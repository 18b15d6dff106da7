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

Cross-driver batching: the model gets one call at a time (``Batcher``). Predicts from all streams
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

import asyncio
import collections
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from ..model import ModelHandler
from ..spaces import batch_from_leaves, batch_leaves, leaf_shape, space_leaves
from ..utils import leaves, map_leaves
from .codec import WORKFLOW_EDITION, SpaceCodec, WireFormatError, space_from_spec
from .connection import DEFAULT_MAX_MESSAGE_MB, Server, handshake_response
from .protocol import MODEL_SPEC_KEY, RequestError
from .wire.model.v1 import interaction_pb2, service_pb2, service_pb2_grpc

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
) -> ModelServer:
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

    Returns:
        The running ``ModelServer``: ``.address``, ``.stats()``, ``.close()``, ``.wait()``.

    Example:
        >>> with serve_model(lambda obs: 0, "127.0.0.1:0", max_batch=64) as server:
        ...     server.address.startswith("tcp://")
        True
    """
    if max_batch is not None and (isinstance(max_batch, bool) or int(max_batch) < 1):
        raise ValueError(f"max_batch must be a positive number of rows or None, got {max_batch!r}")
    if not max_wait_ms >= 0:
        raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
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


class ModelServer(Server):
    """A served model (``serve_model``): a ``Server`` that also counts its predictions."""

    service: ModelService

    def stats(self) -> BatchStats:
        """What the model was asked so far: requests, rows, model calls, mean batch size."""
        return self.service.batcher.stats.snapshot()


@dataclass
class BatchStats:
    """Counts of a served model's work.

    Attributes:
        requests: predict requests answered (a grouped predict counts each group).
        rows: rows predicted for.
        model_calls: calls of the model's corner (per row for a per-lane corner).
        batches: dispatches: groups of requests answered together.
        largest_batch: the most rows one model call took.
    """

    requests: int = 0
    rows: int = 0
    model_calls: int = 0
    batches: int = 0
    largest_batch: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def mean_batch(self) -> float:
        """Rows per model call (0 before the first)."""
        return self.rows / self.model_calls if self.model_calls else 0.0

    def count(self, requests: int, rows: int, calls: int, largest: int) -> None:
        with self._lock:
            self.requests += requests
            self.rows += rows
            self.model_calls += calls
            self.batches += 1
            self.largest_batch = max(self.largest_batch, largest)

    def snapshot(self) -> BatchStats:
        with self._lock:
            return BatchStats(
                self.requests, self.rows, self.model_calls, self.batches, self.largest_batch
            )


# ---------------------------------------------------------------------------------- batching


class _Work:
    """One predict waiting for its batch: its payload, its rows' episodes, and the outcome."""

    def __init__(
        self,
        key: Any,
        handler: ModelHandler,
        payload: Any,
        episode_ids: list[int],
        new_episodes: list[tuple[int, int | None]],
    ) -> None:
        self.key = key
        self.handler = handler
        self.payload = payload
        self.rows = len(episode_ids)
        self.episode_ids = episode_ids
        self.new_episodes = new_episodes
        self.arrived = time.monotonic()
        self.done = threading.Event()
        self.output: Any = None
        self.error: BaseException | None = None

    def settle(self, output: Any = None, error: BaseException | None = None) -> None:
        self.output, self.error = output, error
        self.done.set()


class Batcher:
    """Calls the model, one call at a time, for every stream: gathers their predicts into
    batches and runs episode ends between them.

    No thread of its own: a stream's thread that finds no call in progress leads, calling the
    model for the queued batches until its own predicts are answered, then hands over (a
    waiting stream leads next). So a lone driver's predict never changes threads on the server.
    """

    def __init__(self, handler: ModelHandler, *, max_batch: int | None, max_wait_s: float):
        self.handler = handler
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.stats = BatchStats()
        self._handlers = {handler.execution_horizon: handler}
        self._queue: collections.deque[_Work] = collections.deque()
        self._cond = threading.Condition()
        self._leading = False  # a thread is calling the model (or gathering a batch for it)
        # Streams that hold an adapter of each batching key: how many predicts of that key can
        # be in flight at once (each stream answers its requests one at a time).
        self._streams_per_key: collections.Counter[Any] = collections.Counter()
        self._closed = False
        # The model's async corners and lifecycle run here, in the leading thread.
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(handler.load())

    def handler_for(self, execution_horizon: int) -> ModelHandler:
        """The model's handler for drivers of ``execution_horizon``."""
        with self._cond:
            handler = self._handlers.get(execution_horizon)
            if handler is None:
                handler = self.handler.with_horizon(execution_horizon)
                self._handlers[execution_horizon] = handler
            return handler

    def join_key(self, key: Any) -> None:
        with self._cond:
            self._streams_per_key[key] += 1

    def leave_key(self, key: Any) -> None:
        with self._cond:
            self._streams_per_key[key] -= 1
            if self._streams_per_key[key] <= 0:
                del self._streams_per_key[key]
            self._cond.notify_all()

    def predict(self, works: Sequence[_Work]) -> None:
        """Queue ``works`` and return once each is settled (its output or its error)."""
        with self._cond:
            self._refuse_if_closed()
            self._queue.extend(works)
            self._cond.notify_all()
        while True:
            with self._cond:
                while self._leading and not all(work.done.is_set() for work in works):
                    self._cond.wait()
                if all(work.done.is_set() for work in works):
                    return
                self._refuse_if_closed()
                self._leading = True
            try:
                self._lead(works)
            finally:
                self._hand_over()

    def end_episodes(self, handler: ModelHandler, episode_ids: list[int]) -> None:
        """Tell the model these episodes ended (``on_episode_end``), between its calls."""
        if not episode_ids:
            return
        with self._cond:
            while self._leading and not self._closed:
                self._cond.wait()
            if self._closed:
                return
            self._leading = True
        try:
            self._loop.run_until_complete(handler.end_episodes(episode_ids, episode_ids))
        finally:
            self._hand_over()

    def close(self) -> None:
        """Refuse new work, answer the queued predicts with CLOSED, and close the model."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._leading, timeout=30)
            pending, self._queue = list(self._queue), collections.deque()
        for work in pending:
            work.settle(
                error=RequestError(
                    Code.MODEL_ERROR_CODE_CLOSED,
                    "the model server closed before this predict ran",
                    False,
                )
            )
        with self._cond:
            self._cond.notify_all()
        try:
            self._loop.run_until_complete(self.handler.close())
        finally:
            self._loop.close()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise RequestError(Code.MODEL_ERROR_CODE_CLOSED, "the model server is closing", False)

    def _hand_over(self) -> None:
        with self._cond:
            self._leading = False
            self._cond.notify_all()

    # ------------------------------------------------------------------ the leading thread

    def _lead(self, works: Sequence[_Work]) -> None:
        """Run queued batches, oldest first, until ``works`` are all settled."""
        while not all(work.done.is_set() for work in works):
            with self._cond:
                if not self._queue:
                    return
                first = self._queue.popleft()
            self._run_batch(self._gather(first))
            with self._cond:
                self._cond.notify_all()

    def _gather(self, first: _Work) -> list[_Work]:
        """``first`` and the queued predicts of its key that join it, within ``max_batch`` rows
        and ``max_wait_s`` after it arrived (at once when every stream that could add to it
        already has)."""
        batch, rows = [first], first.rows
        limit = self.max_batch
        deadline = first.arrived + self.max_wait_s
        with self._cond:
            while limit is None or rows < limit:
                for work in list(self._queue):
                    if not isinstance(work, _Work) or work.key != first.key:
                        continue
                    if limit is not None and rows + work.rows > limit:
                        continue
                    self._queue.remove(work)
                    batch.append(work)
                    rows += work.rows
                # Every stream that could add to this batch already has: no use waiting.
                if len(batch) >= self._streams_per_key.get(first.key, 0) or self._closed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        return batch

    def _run_batch(self, batch: list[_Work]) -> None:
        handler = batch[0].handler
        rows = sum(work.rows for work in batch)
        try:
            for work in batch:
                if work.new_episodes:
                    ids, seeds = zip(*work.new_episodes, strict=True)
                    handler.start_episodes(list(ids), list(seeds))
            if handler.calls_per_lane:
                # A per-lane corner gains nothing from fusing, and each request's chunks are
                # cut to its own shortest, as its driver's local run would cut them.
                outputs = [
                    self._call(handler, work.payload, work.rows, work.episode_ids) for work in batch
                ]
                self.stats.count(len(batch), rows, rows, 1)
                for work, output in zip(batch, outputs, strict=True):
                    work.settle(output)
                return
            payload = _fused([work.payload for work in batch])
            episode_ids = [episode for work in batch for episode in work.episode_ids]
            output, calls, largest = self._sliced_call(handler, payload, episode_ids)
        except BaseException as err:
            for work in batch:
                work.settle(error=err)
            return
        self.stats.count(len(batch), rows, calls, largest)
        start = 0
        for work in batch:
            end = start + work.rows
            work.settle(map_leaves(output, lambda leaf, a=start, b=end: leaf[a:b]))
            start = end

    def _sliced_call(
        self, handler: ModelHandler, payload: Any, episode_ids: list[int]
    ) -> tuple[Any, int, int]:
        """The model's output for the fused ``payload``: one call, or one per ``max_batch``
        rows; with the number of calls and the most rows one took."""
        total = len(episode_ids)
        step = total if self.max_batch is None else min(total, self.max_batch)
        if step == total:
            return self._call(handler, payload, total, episode_ids), 1, total
        outputs = []
        for start in range(0, total, step):
            end = min(total, start + step)
            part = map_leaves(payload, lambda leaf, a=start, b=end: leaf[a:b])
            outputs.append(self._call(handler, part, end - start, episode_ids[start:end]))
        if handler.chunked:  # one chunk length for all: the shortest, as a single call gives
            shortest = min(_first_leaf(out).shape[1] for out in outputs)
            outputs = [map_leaves(out, lambda leaf, h=shortest: leaf[:, :h]) for out in outputs]
        output = map_leaves(outputs[0], lambda *parts: np.concatenate(parts), *outputs[1:])
        return output, len(outputs), step

    def _call(self, handler: ModelHandler, payload: Any, rows: int, episode_ids: list[int]) -> Any:
        ids = episode_ids if handler.wants_episode_ids else None
        if handler.synchronous:
            return handler.predict_now(payload, rows, ids)
        return self._loop.run_until_complete(handler.predict(payload, rows, ids))


def _first_leaf(tree: Any) -> np.ndarray:
    return next(leaves(tree))[1]


def _fused(payloads: list[Any]) -> Any:
    """Requests' payloads as one: every array leaf concatenated along the row axis, text leaves
    (lists of strings) joined."""
    if len(payloads) == 1:
        return payloads[0]

    def join(*parts: Any) -> Any:
        if isinstance(parts[0], list):
            return [text for part in parts for text in part]
        return np.concatenate(parts)

    return map_leaves(payloads[0], join, *payloads[1:])


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
        prepared: list[tuple[_Adapter, _Work] | Exception] = []
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

    def _prepare(self, request: interaction_pb2.PredictRequest) -> tuple[_Adapter, _Work]:
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
        return adapter, _Work(adapter.key, adapter.handler, payload, episode_ids, new_episodes)

    def _frames(self, adapter: _Adapter, work: _Work) -> list[Any]:
        """The model's output as ``actions[0..H-1]``, each frame batched over the rows."""
        output = work.output
        if not adapter.handler.chunked:
            return [_encode_action(adapter.action, output, work.rows, adapter.env_id, None)]
        horizon = min(_first_leaf(output).shape[1], adapter.horizon)
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
