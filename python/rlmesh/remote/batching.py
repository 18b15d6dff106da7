"""Batching a served model's predicts: ``Batcher`` calls the model one call at a time for
every connection of a server, gathering their predicts into batches, and ``BatchStats``
counts its work. The rlmesh-wire server (``rlmesh.remote.model_server``), openpi's
(``rlmesh.remote.openpi.server``) and vla-eval's (``rlmesh.remote.vlaeval.server``) all host
their model on one.

A predict is a ``Work``: its payload (a batch of ``rows`` rows), its rows' episode ids, the
episodes that start with it, and a batching ``key``: only works of one key are fused (their
payloads concatenated along the row axis) into one call of the model's batched corner, of at
most ``max_batch`` rows, gathered for at most ``max_wait_s`` after the first arrived (at once
when every connection that joined the key already has a work queued).

Example:
    >>> import numpy as np
    >>> from rlmesh.model import ModelHandler
    >>> batcher = Batcher(ModelHandler(lambda obs: obs * 2), max_batch=None, max_wait_s=0)
    >>> work = Work("key", batcher.handler, np.ones((2, 1)), [0, 1], [])
    >>> batcher.predict([work])
    >>> work.output.tolist(), batcher.stats.snapshot().rows
    ([[2.0], [2.0]], 2)
    >>> batcher.close()
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import ModelHandler
from ..utils import leaves, map_leaves
from .protocol import RequestError
from .wire.model.v1 import interaction_pb2

Code = interaction_pb2.ModelErrorCode


def check_batching(max_batch: int | None, max_wait_ms: float) -> None:
    """A served model's batching arguments, whatever the protocol: ValueError naming a
    ``max_batch`` that is not a positive number of rows or None, or a negative ``max_wait_ms``.

    Example:
        >>> check_batching(64, 2)
        >>> check_batching(0, 2)
        Traceback (most recent call last):
        ...
        ValueError: max_batch must be a positive number of rows or None, got 0
    """
    if max_batch is not None and (isinstance(max_batch, bool) or int(max_batch) < 1):
        raise ValueError(f"max_batch must be a positive number of rows or None, got {max_batch!r}")
    if not max_wait_ms >= 0:
        raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")


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


class Work:
    """One predict waiting for its batch: its payload, its rows' episodes, and the outcome."""

    __slots__ = (
        "arrived",
        "episode_ids",
        "error",
        "handler",
        "key",
        "new_episodes",
        "output",
        "payload",
        "rows",
        "settled",
    )

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
        self.settled = False  # set before the batcher's condition is notified
        self.output: Any = None
        self.error: BaseException | None = None

    def settle(self, output: Any = None, error: BaseException | None = None) -> None:
        self.output, self.error = output, error
        self.settled = True


class Batcher:
    """Calls the model, one call at a time, for every stream: gathers their predicts into
    batches and runs episode ends between them.

    No thread of its own: a stream's thread that finds no call in progress leads, calling the
    model for the queued batches until its own predicts are answered, then hands over (a
    waiting stream leads next). So a lone driver's predict never changes threads on the server.
    """

    def __init__(
        self,
        handler: ModelHandler,
        *,
        max_batch: int | None,
        max_wait_s: float,
        isolate_failures: bool = False,
    ):
        self.handler = handler
        # A failed call of several requests is retried request by request, so only the
        # requests the model fails on fail (where a failure costs the client its connection).
        self.isolate_failures = isolate_failures
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.stats = BatchStats()
        self._handlers = {handler.execution_horizon: handler}
        self._queue: collections.deque[Work] = collections.deque()
        # One lock, two conditions: streams wait on ``_cond`` for their predicts to be settled
        # (or the lead to be free), a leader gathering a batch on ``_arrived`` for more work,
        # so a predict that arrives wakes the leader alone, not every waiting stream.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._arrived = threading.Condition(lock)
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
            self._arrived.notify()  # a batch waiting for this stream need wait no longer

    def predict(self, works: Sequence[Work]) -> None:
        """Queue ``works`` and return once each is settled (its output or its error)."""
        cond = self._cond
        with cond:
            self._refuse_if_closed()
            # A lone predict that no other stream could join, with nothing queued before it,
            # is its own batch: called at once, without the queue.
            lone = (
                len(works) == 1
                and not self._leading
                and not self._queue
                and self._streams_per_key.get(works[0].key, 0) <= 1
            )
            if lone:
                self._leading = True
            else:
                self._queue.extend(works)
                self._arrived.notify()
        if lone:
            try:
                self._run_alone(works[0])
            finally:
                self._hand_over()
            return
        while True:
            with cond:
                while self._leading and not _all_settled(works):
                    cond.wait()
                if _all_settled(works):
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
            self._arrived.notify_all()
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

    def _lead(self, works: Sequence[Work]) -> None:
        """Run queued batches, oldest first, until ``works`` are all settled."""
        while not _all_settled(works):
            with self._cond:
                if not self._queue:
                    return
                first = self._queue.popleft()
            self._run_batch(self._gather(first))
            with self._cond:
                self._cond.notify_all()

    def _gather(self, first: Work) -> list[Work]:
        """``first`` and the queued predicts of its key that join it, within ``max_batch`` rows
        and ``max_wait_s`` after it arrived (at once when every stream that could add to it
        already has)."""
        batch, rows = [first], first.rows
        limit = self.max_batch
        deadline = first.arrived + self.max_wait_s
        with self._cond:
            while limit is None or rows < limit:
                for work in list(self._queue):
                    if work.key != first.key:
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
                self._arrived.wait(remaining)
        return batch

    def _run_alone(self, work: Work) -> None:
        """``_run_batch([work])``, without what only a batch of several needs."""
        handler = work.handler
        try:
            if work.new_episodes:
                ids, seeds = zip(*work.new_episodes, strict=True)
                handler.start_episodes(list(ids), list(seeds))
            if handler.calls_per_lane:
                output = self._call(handler, work.payload, work.rows, work.episode_ids)
                calls, largest = work.rows, 1
            else:
                output, calls, largest = self._sliced_call(handler, work.payload, work.episode_ids)
        except BaseException as err:
            work.settle(error=err)
            return
        self.stats.count(1, work.rows, calls, largest)
        work.settle(output)

    def _run_batch(self, batch: list[Work]) -> None:
        handler = batch[0].handler
        rows = sum(work.rows for work in batch)
        try:
            for work in batch:
                if work.new_episodes:
                    ids, seeds = zip(*work.new_episodes, strict=True)
                    handler.start_episodes(list(ids), list(seeds))
            if handler.calls_per_lane and self.isolate_failures:
                for work in batch:
                    try:
                        output = self._call(handler, work.payload, work.rows, work.episode_ids)
                    except Exception as err:
                        work.settle(error=err)
                    else:
                        work.settle(output)
                self.stats.count(len(batch), rows, rows, 1)
                return
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
            payload = fused([work.payload for work in batch])
            episode_ids = [episode for work in batch for episode in work.episode_ids]
            output, calls, largest = self._sliced_call(handler, payload, episode_ids)
        except BaseException as err:
            if self.isolate_failures and len(batch) > 1 and isinstance(err, Exception):
                for work in batch:
                    work.new_episodes = []  # started above
                    self._run_batch([work])
                return
            for work in batch:
                work.settle(error=err)
            return
        self.stats.count(len(batch), rows, calls, largest)
        if len(batch) == 1:  # its rows are the whole output
            batch[0].settle(output)
            return
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
            shortest = min(first_leaf(out).shape[1] for out in outputs)
            outputs = [map_leaves(out, lambda leaf, h=shortest: leaf[:, :h]) for out in outputs]
        output = map_leaves(outputs[0], lambda *parts: np.concatenate(parts), *outputs[1:])
        return output, len(outputs), step

    def _call(self, handler: ModelHandler, payload: Any, rows: int, episode_ids: list[int]) -> Any:
        ids = episode_ids if handler.wants_episode_ids else None
        if handler.synchronous:
            return handler.predict_now(payload, rows, ids)
        return self._loop.run_until_complete(handler.predict(payload, rows, ids))


def _all_settled(works: Sequence[Work]) -> bool:
    return all(work.settled for work in works)


def first_leaf(tree: Any) -> np.ndarray:
    return next(leaves(tree))[1]


def fused(payloads: list[Any]) -> Any:
    """Requests' payloads as one: every array leaf concatenated along the row axis, text leaves
    (lists of strings) joined."""
    if len(payloads) == 1:
        return payloads[0]

    def join(*parts: Any) -> Any:
        if isinstance(parts[0], list):
            return [text for part in parts for text in part]
        return np.concatenate(parts)

    return map_leaves(payloads[0], join, *payloads[1:])


__all__ = ["BatchStats", "Batcher", "Work", "first_leaf", "fused"]
