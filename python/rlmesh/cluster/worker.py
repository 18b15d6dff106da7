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
(``HeldModel``): loaded by its first window's run, closed once when the actor is done. An env
that travels as a factory of ``Lanes`` (a sandboxed env: ``job.WindowJob.env_lanes``) is held
by the actor likewise (``HeldLanes``): built by its first window, kept open across the others,
closed when the actor is done; a window whose run failed closes them, and the next builds
them anew. (On a task, each window's run builds them and closes them.)
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

LIFECYCLE = ("on_route", "load", "close")  # what HeldModel takes over from each local run
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


def _load(job: WindowJob, lanes: HeldLanes | None = None) -> tuple[Any, Any, RunSettings]:
    """The job's model, env (an id, or a factory of envs or of lanes) and local-run
    arguments, loaded once per worker process; ``lanes`` holds a lanes factory's lanes."""
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

        model = load_policy(job.model, lambda: _action_space(job, env, lanes))
    else:
        model = cloudpickle.loads(job.model)
    _loaded = (job.job_id, model, env, settings)
    return model, env, settings


def _action_space(job: WindowJob, env: Any, lanes: HeldLanes | None) -> gym.Space:
    """The action space of one lane of the job's env, for a model loaded by name."""
    if job.env_lanes:
        if lanes is not None:
            return lanes.get(env).single_action_space
        built = env()
        try:
            return built.single_action_space
        finally:
            built.close()
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
    job: WindowJob,
    indices: list[int],
    hold: Callable[[Any], None] | None = None,
    lanes: HeldLanes | None = None,
) -> Iterator[Landed | WindowDone | WindowFailed]:
    """Run episodes ``indices`` of the job's run here; yield ``Landed`` batches as episodes
    start and complete, then one ``WindowDone`` (or ``WindowFailed``, after the episodes that
    completed before the error). ``hold`` is handed the model before the run (an actor's
    ``WindowActor.hold``); ``lanes`` holds the lanes of a lanes factory across windows (an
    actor's), else each window's run builds its own."""
    worker = worker_name()
    started = time.perf_counter()
    try:
        model, env, settings = _load(job, lanes)
        if job.env_lanes:  # the run takes the lanes themselves
            env = lanes.get(env) if lanes is not None else env()
    except Exception as exc:
        if lanes is not None:
            lanes.release()
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
        if lanes is not None:  # they may be broken (a dead server): the next window's are new
            lanes.release()
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

    Each run calls the model's ``on_route``, ``load`` and ``close`` as always; the instance
    attributes set here shadow the class's methods, so the runs need not know. The route is
    taken once too: every window of a job has the same, and a model that sets itself up for
    its route (a served model resolves it on its stream) does so when it loads. A plain
    callable has nothing to hold: each run wraps it in a ``Model`` whose lifecycle does
    nothing.

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
        self.loaded = self.routed = False
        if self.model is not None:
            self._load, self._close = self.model.load, self.model.close
            self._route = getattr(self.model, "on_route", None)
            self._own = {name: vars(model)[name] for name in LIFECYCLE if name in vars(model)}
            self.model.on_route = self._route_once
            self.model.load = self._load_once
            self.model.close = _nothing

    def _route_once(self, route: Any) -> None:
        if not self.routed and self._route is not None:
            self.routed = True
            self._route(route)

    def _load_once(self) -> Any:
        if self.loaded:
            return None
        self.loaded = True
        return self._load()  # an async load's coroutine, which the run awaits

    def release(self) -> None:
        """Close the model (``Model.close``, awaited if ``async``), once, and give it back
        its own ``on_route``, ``load`` and ``close``."""
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


class HeldLanes:
    """Lanes held across the local runs of one process: built from their factory by the
    first run that asks (``get``), left open by every run's ``close()``, closed by
    ``release()``; the next ``get`` then builds them anew.

    As ``HeldModel`` does with a model, an instance attribute shadows the lanes' ``close``
    while they are held, so the runs need not know.

    Example:
        >>> import rlmesh
        >>> from rlmesh.lanes import make_lanes
        >>> held = HeldLanes()
        >>> lanes = held.get(lambda: make_lanes("CartPole-v1", num_envs=2))
        >>> for _ in range(2):  # two runs: each closes its lanes, which stay open
        ...     _ = rlmesh.run(lambda obs: 0, lanes, episodes=2)
        >>> held.get(None) is lanes
        True
        >>> held.release()
    """

    def __init__(self) -> None:
        self.lanes: Any = None
        self._own_close: Any = None
        self._lock = threading.Lock()  # the coordinator may release them mid-window
        self._closed = False

    def get(self, factory: Callable[[], Any] | None) -> Any:
        """The held lanes, built with ``factory()`` if none are held.

        Raises:
            RuntimeError: ``close`` was called: the process is being ended, and lanes built
                now (a sandbox's server and its run directory) would outlive their cleanup.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("this worker is closing: it builds no more lanes")
            if self.lanes is None:
                assert factory is not None
                lanes = factory()
                self._own_close = vars(lanes).get("close")
                lanes.close = _nothing
                self.lanes = lanes
            return self.lanes

    def close(self) -> None:
        """``release`` for good: a later ``get`` raises rather than build lanes (a window
        that starts while the actor is being ended)."""
        with self._lock:
            self._closed = True
        self.release()

    def release(self) -> None:
        """Close the held lanes (their own ``close``), if any; closing again does nothing.

        The lanes close under the lock: a ``release`` or ``close`` from another thread returns
        only once they are closed. Else the coordinator, told by ``close`` that the actor let
        go of its lanes, could end the actor while a window's own ``release`` was still
        stopping a sandbox, and leave its run directory behind."""
        with self._lock:
            lanes, self.lanes = self.lanes, None
            if lanes is None:
                return
            del lanes.close
            if self._own_close is not None:
                lanes.close = self._own_close
            lanes.close()


class WindowActor:
    """A long-lived worker of ``ray_mode="actors"``: runs every window of one job dealt to it,
    holding the job's model (``HeldModel``) from its first window to ``close``."""

    def __init__(self, job: WindowJob) -> None:
        self.job = job
        self.held: HeldModel | None = None
        self.lanes = HeldLanes()  # a lanes factory's, across the windows (job.env_lanes)

    def run_window(self, indices: list[int]) -> Iterator[Landed | WindowDone | WindowFailed]:
        """The task's ``run_window``, on the model (and lanes) this actor holds."""
        yield from run_window(self.job, indices, hold=self.hold, lanes=self.lanes)

    def hold(self, model: Any) -> None:
        """Hold the model of the first window dealt here (the job's, for every window)."""
        if self.held is None:
            self.held = HeldModel(model)

    def release_lanes(self) -> None:
        """Close the held lanes now, even while a window runs (on the actor's second thread:
        a job with lanes gets two): a run that failed or was interrupted elsewhere ends
        this actor mid-window, and its sandbox goes first, cleanly (its run directory
        removed), not with the actor's process; a window that starts after it builds none."""
        self.lanes.close()

    def close(self) -> None:
        """Close the held model (``Model.close``) if a window ran, and the held lanes (a
        sandboxed env's server stopped); the coordinator then ends the actor."""
        try:
            if self.held is not None:
                self.held.release()
        finally:
            self.lanes.close()
