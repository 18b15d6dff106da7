"""A window's run on a Ray worker: the ordinary local driver on ``indices=``, its episodes
streamed back as they start and complete.

``run_window`` is the body of a window's Ray task (``ray_mode="tasks"``), and
``WindowActor.run_window`` of a window dealt to a long-lived actor (``ray_mode="actors"``);
both are generators (Ray streams each value they yield to the coordinator as soon as it is
yielded). The local run goes on a thread of the worker, its hooks feeding a queue the
generator drains, so a window's episodes reach the coordinator (and its results file) as they
complete, not when the window ends. A worker process keeps the last job's model, env and
arguments, so consecutive windows of one run unpickle (or load) them once. A task's window is
its own local run (``Model.load`` / ``close`` once per window); an actor holds the model
(``HeldModel``): loaded by its first window's run, closed once when the actor is done.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import gymnasium as gym

from ..driver import EvaluationRun
from ..hooks import RunHooks
from ..model import Model, resolved
from ..settings import RunSettings
from .job import Landed, WindowDone, WindowFailed, WindowJob

LIFECYCLE = ("load", "close")  # what HeldModel takes over from each local run
_FINISHED = object()  # the local run's thread put its last event
_loaded: tuple[str, Any, Any, RunSettings] | None = None  # (job_id, model, env, settings)


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


def _load(job: WindowJob) -> tuple[Any, Any, RunSettings]:
    """The job's model, env and local-run arguments, loaded once per worker process."""
    global _loaded
    if _loaded is not None and _loaded[0] == job.job_id:
        return _loaded[1:]
    for path in job.search_path:  # after the worker's own, so its packages win
        if path not in sys.path and os.path.isdir(path):
            sys.path.append(path)
    from ray import cloudpickle

    env = job.env if isinstance(job.env, str) else cloudpickle.loads(job.env)
    settings = cloudpickle.loads(job.settings)
    if isinstance(job.model, str):
        from ..policies import load_policy

        model = load_policy(job.model, lambda: _action_space(env))
    else:
        model = cloudpickle.loads(job.model)
    _loaded = (job.job_id, model, env, settings)
    return model, env, settings


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


def run_window(
    job: WindowJob, indices: list[int], hold: Callable[[Any], None] | None = None
) -> Iterator[Landed | WindowDone | WindowFailed]:
    """Run episodes ``indices`` of the job's run here; yield ``Landed`` batches as episodes
    start and complete, then one ``WindowDone`` (or ``WindowFailed``, after the episodes that
    completed before the error). ``hold`` is handed the model before the run (an actor's
    ``WindowActor.hold``)."""
    worker = worker_name()
    started = time.perf_counter()
    try:
        model, env, settings = _load(job)
    except Exception as exc:
        yield WindowFailed(worker, _portable(exc), f"loading the job failed: {exc!r}")
        return
    if hold is not None:
        hold(model)
    events: queue.SimpleQueue = queue.SimpleQueue()
    outcome: dict[str, Any] = {}

    def evaluate() -> None:
        try:
            window = replace(settings, episodes=replace(settings.episodes, indices=indices))
            run = EvaluationRun(model, env, window, hooks=_Relay(events))

            async def execute() -> None:  # the result stays out of the task's repr
                outcome["result"] = await run.execute()

            asyncio.run(execute())
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


class HeldModel:
    """A model held across the local runs of one process: the first run's ``load()`` loads
    it, later runs' find it loaded, no run's ``close()`` closes it; ``release()`` does, once.

    Each run calls the model's ``load`` and ``close`` as always; the instance attributes set
    here shadow the class's methods, so the runs need not know. A plain callable has nothing
    to hold: each run wraps it in a ``Model`` whose lifecycle does nothing.

    Example:
        >>> class Weights(Model):
        ...     calls = []
        ...     def load(self): self.calls.append("load")
        ...     def close(self): self.calls.append("close")
        ...     def predict(self, obs): return 0
        >>> model = Weights()
        >>> held = HeldModel(model)
        >>> for _ in range(3):  # three runs' lifecycles
        ...     model.load(); model.close()
        >>> held.release(); model.calls
        ['load', 'close']
    """

    def __init__(self, model: Any) -> None:
        self.model = model if isinstance(model, Model) else None
        self.loaded = False
        if self.model is not None:
            self._load, self._close = self.model.load, self.model.close
            self._own = {name: vars(model)[name] for name in LIFECYCLE if name in vars(model)}
            self.model.load = self._load_once
            self.model.close = _nothing

    def _load_once(self) -> Any:
        if self.loaded:
            return None
        self.loaded = True
        return self._load()  # an async load's coroutine, which the run awaits

    def release(self) -> None:
        """Close the model (``Model.close``, awaited if ``async``), once, and give it back
        its own ``load`` and ``close``."""
        model, self.model = self.model, None
        if model is None:
            return
        for name in LIFECYCLE:
            delattr(model, name)
            if name in self._own:
                setattr(model, name, self._own[name])
        closed = self._close()
        if inspect.isawaitable(closed):
            asyncio.run(resolved(closed))


def _nothing() -> None:
    return None


class WindowActor:
    """A long-lived worker of ``ray_mode="actors"``: runs every window of one job dealt to it,
    holding the job's model (``HeldModel``) from its first window to ``close``."""

    def __init__(self, job: WindowJob) -> None:
        self.job = job
        self.held: HeldModel | None = None

    def run_window(self, indices: list[int]) -> Iterator[Landed | WindowDone | WindowFailed]:
        """The task's ``run_window``, on the model this actor holds."""
        yield from run_window(self.job, indices, hold=self.hold)

    def hold(self, model: Any) -> None:
        """Hold the model of the first window dealt here (the job's, for every window)."""
        if self.held is None:
            self.held = HeldModel(model)

    def close(self) -> None:
        """Close the held model (``Model.close``) if a window ran; the coordinator then ends
        the actor."""
        if self.held is not None:
            self.held.release()
