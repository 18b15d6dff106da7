"""The driver's handles on its worker processes: each worker's process, pipe and doorbell
(``Worker``), what must not outlive the lanes (``Resources``), and the watch on which workers
have answered or died (``Watch``). ``ProcessLanes`` (this package's ``__init__``) holds them.

Example:
    >>> from multiprocessing import shared_memory
    >>> resources = Resources(memory=shared_memory.SharedMemory(create=True, size=64))
    >>> name = resources.memory.name
    >>> resources.release()  # stops its processes (none here), then frees the buffer
    >>> shared_memory.SharedMemory(name=name)
    Traceback (most recent call last):
    FileNotFoundError: [Errno 2] No such file or directory: '/...'
    >>> span([4, 5, 6, 7]), span([1, 3])
    ('4..7', '1, 3')
"""

from __future__ import annotations

import contextlib
import select
import signal
import time
from dataclasses import dataclass, field
from multiprocessing import connection, shared_memory
from typing import Any

from .worker import POLL_S, yield_cpu

POLLERS_KEPT = 16
"""How many sets of workers ``Watch`` keeps a ``select.poll`` object for (all the workers, each
one alone, and a few more as episodes end and workers restart)."""


class WorkerTraceback(Exception):  # noqa: N818 - it carries a traceback, it is not raised alone
    """The traceback of an exception raised in a worker process (the ``__cause__`` of the
    ``EnvError`` the driver raises for it)."""


class WorkerDied(Exception):  # noqa: N818 - a signal inside this package, never raised out
    """A worker died or did not answer while starting; the message says which and how."""


@dataclass
class Worker:
    """One worker process, its pipe, and its doorbell: a semaphore released once per request
    sent after start-up, which the worker waits on before it reads the pipe.

    Why a doorbell: a pipe write wakes its reader as a "sync" wake-up, a hint that the writer
    is about to sleep, so the scheduler tends to run the woken worker on the driver's CPU,
    ahead of the driver, and the driver's next write (to the next worker) waits behind it.
    The semaphore's wake-up carries no such hint, so the driver sends every request of a
    round, then rings every bell, and the workers start stepping together. A worker polls its
    bell for a while after answering (``worker.POLL_S``), and a ring it finds that way wakes
    no one: the driver's rings cost it nothing then. The driver likewise polls for the rest of
    a round's answers once one has come (``Watch.answered``).
    """

    index: int
    lanes: list[int]
    process: Any = None
    conn: Any = None
    bell: Any = None
    restarts: int = 0

    def describe(self) -> str:
        pid = None if self.process is None else self.process.pid
        return f"worker {self.index} (pid {pid}, lanes {span(self.lanes)})"

    def request(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` and ring the bell (``OSError`` if the worker is gone)."""
        self.conn.send(message)
        self.bell.release()


@dataclass
class Resources:
    """What must not outlive the lanes: the worker processes and the shared buffer. Released
    by ``close``, or by a finalizer if the lanes are dropped (or the interpreter exits)
    without it."""

    processes: list[Any] = field(default_factory=list)
    memory: shared_memory.SharedMemory | None = None

    def release(self) -> None:
        for process in self.processes:
            stop_process(process, grace_s=0.0)
        self.processes.clear()
        memory, self.memory = self.memory, None
        if memory is not None:
            with contextlib.suppress(BufferError):  # a view is still referenced: it keeps the map
                memory.close()
            with contextlib.suppress(FileNotFoundError):
                memory.unlink()


class Watch:
    """Which workers have something for the driver: an answer in their pipe, or the end of a
    worker that died (its pipe closes, and its process sentinel is readable).

    A driver waits on the same sets of workers round after round, so each set's
    ``select.poll`` object is built once and kept: building a selector per wait, as
    ``multiprocessing.connection.wait`` does, cost a 16-lane CartPole round 60 to 80 µs in
    paired runs. Where ``select.poll`` is missing (Windows), every wait is
    ``multiprocessing.connection.wait``.
    """

    def __init__(self) -> None:
        self._pollers: dict[tuple[tuple[int, int, int], ...], tuple[Any, dict[int, Worker]]] = {}

    def ready(self, workers: list[Worker], timeout_s: float | None) -> list[Worker]:
        """The workers of ``workers`` with something to read, waiting up to ``timeout_s``
        (None: until one has; 0: not at all); empty if none by then."""
        if not hasattr(select, "poll"):
            waitables = [x for worker in workers for x in (worker.conn, worker.process.sentinel)]
            found = connection.wait(waitables, timeout_s)
            return [w for w in workers if w.conn in found or w.process.sentinel in found]
        poller, owners = self._poller(workers)
        timeout_ms = None if timeout_s is None else timeout_s * 1000.0
        return owners_of(poller.poll(timeout_ms), owners)

    def answered(self, workers: list[Worker]) -> list[Worker]:
        """``ready`` polled for up to ``POLL_S``, with the CPU yielded between polls."""
        poller, owners = self._poller(workers) if hasattr(select, "poll") else (None, {})
        until = time.perf_counter() + POLL_S
        while True:
            found = self.ready(workers, 0) if poller is None else owners_of(poller.poll(0), owners)
            if found or time.perf_counter() >= until:
                return found
            yield_cpu()

    def _poller(self, workers: list[Worker]) -> tuple[Any, dict[int, Worker]]:
        key = tuple((w.index, w.conn.fileno(), w.process.sentinel) for w in workers)
        kept = self._pollers.get(key)
        if kept is None:
            if len(self._pollers) >= POLLERS_KEPT:
                self._pollers.clear()
            poller = select.poll()
            owners = {}
            for worker in workers:
                for fd in (worker.conn.fileno(), worker.process.sentinel):
                    poller.register(fd, select.POLLIN)
                    owners[fd] = worker
            kept = self._pollers[key] = (poller, owners)
        return kept


def owners_of(events: list[tuple[int, int]], owners: dict[int, Worker]) -> list[Worker]:
    """The workers of ``poll``'s ``events`` (a worker whose pipe and sentinel are both
    readable, once)."""
    if len(events) == 1:
        return [owners[events[0][0]]]
    return list({owners[fd].index: owners[fd] for fd, _ in events}.values())


def stop_process(process: Any, grace_s: float) -> None:
    """Wait up to ``grace_s`` for ``process`` to exit, then terminate it, then kill it."""
    if process.pid is None:
        return
    process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(5.0)


def span(lanes: list[int]) -> str:
    if len(lanes) > 1 and lanes == list(range(lanes[0], lanes[-1] + 1)):
        return f"{lanes[0]}..{lanes[-1]}"
    return ", ".join(map(str, lanes))


def exit_cause(process: Any) -> str:
    process.join(1.0)
    code = process.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
