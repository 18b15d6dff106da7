"""Calls with a deadline: the error reaches the caller at the deadline, even if the call hangs.

``asyncio.wait_for(asyncio.to_thread(...))`` raises at the deadline, but ``asyncio.run`` then
joins its executor's threads on the way out, so ``rlmesh.run`` would still return only when
the stuck call does. ``DeadlineCaller`` runs each call on a daemon thread it never joins: a
call past its deadline is abandoned with its thread, and the next call gets a fresh thread.

An in-process env stuck in C code cannot be stopped from Python: its thread stays behind
(doing nothing to the run's results) until the call returns or the process exits. Process
lanes, which can kill their worker, are the remedy for envs that truly hang.

Example:
    >>> import asyncio, time
    >>> caller = DeadlineCaller()
    >>> asyncio.run(caller.call(0.5, sum, [1, 2]))
    3
    >>> caller.close()
    >>> asyncio.run(caller.call(0.05, time.sleep, 1))
    Traceback (most recent call last):
    ...
    rlmesh.deadlines.DeadlinePassed: the call did not return within 0.05 s
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any


class DeadlinePassed(TimeoutError):  # noqa: N818 - a TimeoutError, named for what happened
    """A call outlived its deadline (and was abandoned)."""


class _Worker:
    """One daemon thread running calls one after another, until it is told to stop."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], Callable[..., None]] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._serve, name="rlmesh-deadline-call", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """The thread ends once its current call (if any) returns."""
        self.calls.put(None)

    def _serve(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            work, settle = call
            try:
                outcome = work()
                if asyncio.iscoroutine(outcome):
                    outcome = asyncio.run(outcome)
            except BaseException as err:  # handed to the waiting caller, never lost
                settle(None, err)
            else:
                settle(outcome, None)


class DeadlineCaller:
    """Runs blocking calls off the event loop, each abandoned if it outlives its deadline.

    ``close()`` ends its thread; a thread stuck in an abandoned call ends when the call returns.
    """

    def __init__(self) -> None:
        self._worker: _Worker | None = None

    def close(self) -> None:
        """Let the worker thread end (it may be used again: a new one starts)."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    async def call(self, limit_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (driven to completion if it returns a coroutine), or ``DeadlinePassed``
        after ``limit_s`` seconds, whether or not the call has returned by then. What the call
        raises is raised as it is."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(outcome: Any, error: BaseException | None) -> None:
            def resolve() -> None:
                if future.done():  # the caller gave up at the deadline
                    return
                if error is None:
                    future.set_result(outcome)
                else:
                    future.set_exception(error)

            # The loop may have closed while the call was stuck: then no one is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve)

        if self._worker is None:
            self._worker = _Worker()
        worker = self._worker
        worker.calls.put((lambda: fn(*args), settle))
        done, _ = await asyncio.wait({future}, timeout=limit_s)
        if not done:
            # The worker may be stuck in this call for good: later calls get a new one, and
            # this one ends if the call ever returns. Its outcome, if one comes, has no taker:
            # the cancelled future drops it (a set but unread exception would be logged).
            future.cancel()
            self.close()
            raise DeadlinePassed(f"the call did not return within {limit_s:g} s")
        return future.result()
