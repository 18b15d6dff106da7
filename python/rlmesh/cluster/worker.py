"""A window's run on a Ray worker: the ordinary local driver on ``indices=``, its episodes
streamed back as they start and complete.

``run_window`` is the body of the Ray task (a generator: Ray streams each value it yields to
the coordinator as soon as it is yielded). The local run goes on a thread of the worker, its
hooks feeding a queue the generator drains, so a window's episodes reach the coordinator (and
its results file) as they complete, not when the window ends. A worker process keeps the last
job's model, env and arguments, so consecutive windows of one run unpickle (or load) them
once; each window is still its own local run (``Model.load`` / ``close`` once per window).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from ..hooks import RunHooks
from .job import Landed, WindowDone, WindowFailed, WindowJob

_FINISHED = object()  # the local run's thread put its last event
_loaded: tuple[str, Any, Any, dict[str, Any]] | None = None  # (job_id, model, env, kwargs)


class _Relay(RunHooks):
    """Hands the local run's episode starts and ends to the generator."""

    def __init__(self, events: queue.SimpleQueue) -> None:
        self.events = events

    def on_episode_start(self, *, episode: int, seed: int | None) -> None:
        self.events.put(("started", (episode, seed)))

    def on_episode_end(self, result: Any) -> None:
        self.events.put(("completed", result))


def worker_name() -> str:
    """How results name a worker: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _load(job: WindowJob) -> tuple[Any, Any, dict[str, Any]]:
    """The job's model, env and local-run arguments, loaded once per worker process."""
    global _loaded
    if _loaded is not None and _loaded[0] == job.job_id:
        return _loaded[1:]
    for path in job.search_path:  # after the worker's own, so its packages win
        if path not in sys.path and os.path.isdir(path):
            sys.path.append(path)
    from ray import cloudpickle

    env = job.env if isinstance(job.env, str) else cloudpickle.loads(job.env)
    kwargs = cloudpickle.loads(job.run_kwargs)
    if isinstance(job.model, str):
        from ..cli import load_policy

        model = load_policy(job.model, lambda: _action_space(env))
    else:
        model = cloudpickle.loads(job.model)
    _loaded = (job.job_id, model, env, kwargs)
    return model, env, kwargs


def _action_space(env: Any) -> gym.Space:
    made = gym.make(env) if isinstance(env, str) else env()
    try:
        return made.action_space
    finally:
        made.close()


def _portable(error: BaseException) -> BaseException | None:
    """``error`` if it survives a pickle round trip (Ray sends it back so), else None."""
    try:
        copy = pickle.loads(pickle.dumps(error))
    except Exception:
        return None
    return copy if type(copy) is type(error) and str(copy) == str(error) else None


def run_window(job: WindowJob, indices: list[int]) -> Iterator[Landed | WindowDone | WindowFailed]:
    """Run episodes ``indices`` of the job's run here; yield ``Landed`` batches as episodes
    start and complete, then one ``WindowDone`` (or ``WindowFailed``, after the episodes that
    completed before the error)."""
    from ..driver import run

    worker = worker_name()
    started = time.perf_counter()
    try:
        model, env, kwargs = _load(job)
    except Exception as exc:
        yield WindowFailed(worker, _portable(exc), f"loading the job failed: {exc!r}")
        return
    events: queue.SimpleQueue = queue.SimpleQueue()
    outcome: dict[str, Any] = {}

    def evaluate() -> None:
        try:
            outcome["result"] = run(model, env, indices=indices, hooks=_Relay(events), **kwargs)
        except BaseException as exc:  # handed to the coordinator, whatever it is
            outcome["error"] = exc
        finally:
            events.put(_FINISHED)

    thread = threading.Thread(target=evaluate, name="rlmesh-window", daemon=True)
    thread.start()
    finished = False
    while not finished:
        batch = [events.get()]  # wait for the next event, then take all that are queued
        while True:
            try:
                batch.append(events.get_nowait())
            except queue.Empty:
                break
        finished = batch[-1] is _FINISHED
        landed = [event for event in batch if event is not _FINISHED]
        if landed:
            yield Landed(
                worker=worker,
                started=tuple(value for kind, value in landed if kind == "started"),
                episodes=tuple(value for kind, value in landed if kind == "completed"),
            )
    thread.join()
    if "error" in outcome:
        error = outcome["error"]
        where = f"window of episodes {indices[0]}..{indices[-1]} on {worker}"
        yield WindowFailed(worker, _portable(error), f"{where}: {type(error).__name__}: {error}")
        return
    result = outcome["result"]
    yield WindowDone(
        worker=worker,
        task_s=time.perf_counter() - started,
        wasted_steps=result.wasted_steps,
        observer_errors=result.observer_errors,
        telemetry=result.telemetry,
        success_rule=result.success_rule,
    )
