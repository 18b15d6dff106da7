"""Process lanes: lanes stepped in worker processes, one more kind of ``Lanes``.

``ProcessLanes`` splits ``num_lanes`` lanes into ``workers`` contiguous blocks, one per worker
process. Each worker builds its envs itself, from a Gymnasium id or a picklable zero-argument
factory (a module-level function, a ``functools.partial`` of one), so the envs never cross a
process boundary. Observations, actions, rewards and flags travel through one shared-memory
buffer laid out from the spaces, one slot per lane (``layout.py``); only small control messages
(which lanes, seeds, infos) go through the pipes. The driver steps any subset of lanes: each
worker steps its lanes of the subset while the others step theirs, and a worker with none of
them is not asked. Resets are the driver's, seeded per episode as with in-process lanes, so
every episode is what ``InProcessLanes`` would have played, whatever the number of workers.

Workers start with ``forkserver`` (a server process forked from a fresh interpreter, so no
thread of the driver is ever forked), or ``spawn`` where ``forkserver`` is not available. As
with any ``multiprocessing`` program, a script that runs process lanes keeps its top-level
code under ``if __name__ == "__main__":``.

Faults: a worker that dies (a segfault, ``os._exit``, an OOM kill) raises ``EnvError`` naming
the worker, its lanes and the episodes in flight, by trial (``EpisodeResult.trial``, that is
``trial_index_base + index``). With ``restart_workers=K`` a dead worker is restarted, up to K
times per worker: the new worker builds its envs, replays every episode in flight from its
seed and the actions it took (kept for this purpose only when K > 0), and the request the
dead worker left unanswered is sent again. For a deterministic env (the determinism contract)
the run then goes on exactly as if nothing happened. A worker that hangs is the driver's
``timeouts=`` to catch; closing the lanes then kills it.

Example:
    >>> import numpy as np
    >>> lanes = ProcessLanes("CartPole-v1", num_envs=4, workers=2)
    >>> lanes
    ProcessLanes(CartPole-v1, num_lanes=4, workers=2)
    >>> observations, _ = lanes.reset(np.arange(4), seeds=[0, 1, 2, 3], trials=[0, 1, 2, 3])
    >>> batch = lanes.step(np.array([0, 3]), np.array([1, 0]))  # lanes 1 and 2 wait
    >>> batch.stepped.tolist(), batch.rewards.tolist(), observations[0].dtype
    ([0, 3], [1.0, 1.0], dtype('float32'))
    >>> lanes.close()
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import connection, shared_memory
from typing import Any

import numpy as np

from ...errors import EnvError, LaneFailures
from ..base import ResetBatch, StepBatch, checked_reset, reset_options
from .handles import (
    Resources,
    Watch,
    Worker,
    WorkerDied,
    WorkerTraceback,
    exit_cause,
    stop_process,
)
from .layout import SharedLayout, SharedViews
from .worker import serve

START_TIMEOUT_S = 300.0
"""How long a worker may take to build its envs before the lanes give up on it."""
SPLITS_KEPT = 16
"""How many splits of lanes by worker ``_by_worker`` keeps (one per group pipelined, and a
few for the lanes still running as episodes end)."""
CLOSE_GRACE_S = 5.0
"""How long closing waits for a worker to close its envs and exit before killing it."""
SHARED_MEMORY_PREFIX = "rlmesh-lanes-"
"""Every buffer's name in ``/dev/shm`` starts with this, then the driver's pid."""

LatencyRecorder = Callable[[str, int], None]

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
"""The CPUs this process may run on: the driver polls for answers only while fewer workers
than this are still stepping, so that it never takes a CPU a stepping worker needs."""


def start_context() -> Any:
    """The ``multiprocessing`` context workers start in: ``forkserver`` with this package
    preloaded (a worker then starts in milliseconds), else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # Takes effect when the server starts (the first process lanes of this process).
        context.set_forkserver_preload(["__main__", "rlmesh.lanes.process.worker"])
        return context
    return multiprocessing.get_context("spawn")


def env_source(env: Any, env_kwargs: Mapping[str, Any] | None) -> tuple[str, Any, Any]:
    """What a worker builds its envs from: ``("id", env_id, kwargs)`` or ``("factory", the
    pickled factory, None)``.

    Raises:
        TypeError: ``env`` is neither an id nor a callable, or it (or ``env_kwargs``) cannot be
            pickled, which workers need: the message says what to pass instead.
    """
    if isinstance(env, str):
        kwargs = dict(env_kwargs or {})
        try:
            pickle.dumps(kwargs)
        except Exception as err:
            raise TypeError(
                f"env_kwargs for {env!r} cannot be sent to worker processes ({type(err).__name__}"
                f": {err}): pass values that pickle, or a module-level factory that builds the "
                f"env with them"
            ) from err
        return ("id", env, kwargs)
    if callable(env):  # a function, a functools.partial, an env class
        name = getattr(env, "__qualname__", type(env).__name__)
        try:
            blob = pickle.dumps(env)
        except Exception as err:
            raise TypeError(
                f"the env factory {name} cannot be sent to worker processes, which build their "
                f"envs themselves ({type(err).__name__}: {err}): pass a module-level function "
                f"(or a functools.partial of one) that the workers can import, or a Gymnasium "
                f"id; a lambda or a function defined inside another cannot be pickled"
            ) from err
        return ("factory", blob, None)
    raise TypeError(
        f"with workers > 1, env= must be a Gymnasium id or a picklable zero-argument factory "
        f"(each worker builds its own envs), got {type(env).__name__}"
    )


class ProcessLanes:
    """``num_envs`` lanes stepped in ``workers`` processes, any subset at a time.

    Args:
        env: a Gymnasium id, or a picklable zero-argument callable returning a
            ``gymnasium.Env`` (called in the workers, once per lane).
        num_envs: ``N``, the lanes.
        workers: ``W``, the worker processes (at most ``N`` are started: a worker owns at
            least one lane). Worker ``w`` owns lanes ``w*N//W .. (w+1)*N//W - 1``.
        env_kwargs: keyword arguments for ``gymnasium.make``, with an id only.
        restart_workers: how many times each worker may be restarted after dying (0: a dead
            worker ends the run with ``EnvError``).
        record_latency: ``fn(op, ns)`` receiving, per step, each worker's time inside its
            envs' ``step`` calls (``op`` ``"worker{w}.step"``) and the time the driver waited
            for the workers (``"driver.wait"``); the run's telemetry.

    Raises:
        TypeError: an env the workers cannot get (see ``env_source``), or a factory that
            returned something other than a ``gymnasium.Env`` (in a worker).
        ValueError: a factory that returned the same env twice.
        EnvError: a worker could not build its envs, died or did not start within
            ``START_TIMEOUT_S``, or lanes whose spaces differ.

    An env that raises in a worker does not stop the other lanes of the call: they go on, and
    the call raises ``LaneFailures`` with their results; ``rebuild`` has the workers that own
    the failed lanes build their envs anew.
    """

    lockstep = False
    resets_itself = False
    env_steps = None
    core_calls_step = True

    def __init__(
        self,
        env: Any,
        *,
        num_envs: int,
        workers: int,
        env_kwargs: Mapping[str, Any] | None = None,
        restart_workers: int = 0,
        record_latency: LatencyRecorder | None = None,
    ) -> None:
        self._source = env_source(env, env_kwargs)
        self.num_lanes = num_envs
        count = min(workers, num_envs)
        bounds = [w * num_envs // count for w in range(count + 1)]
        self._workers = [Worker(w, list(range(bounds[w], bounds[w + 1]))) for w in range(count)]
        self._owner = np.repeat(np.arange(count), np.diff(bounds))
        self._restart_workers = restart_workers
        self._record = record_latency
        self._context = start_context()
        self._resources = Resources()
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._closed = False
        self.rebuild = self._rebuild
        self._broken: str | None = None
        self._in_flight: set[int] = set()  # workers with a request not yet answered
        self._watch = Watch()
        self._splits: dict[bytes, list[tuple[int, np.ndarray, list[int]]]] = {}  # _by_worker
        # Per worker with a request sent by send_step or send_reset and not yet received: its
        # rows, ("step", loose actions) or ("reset", what _reset_outcome reads), and request.
        self._sent: dict[int, tuple[np.ndarray, tuple[Any, ...], tuple[Any, ...]]] = {}
        # Per lane: the trial of its episode in flight (None between episodes), and with
        # restarts, [seed, options, actions taken] of that episode, to replay it.
        self._trials: list[int | None] = [None] * num_envs
        self._episodes: list[list[Any] | None] = [None] * num_envs
        try:
            self._start()
        except BaseException:
            self._finalizer()
            self._release_bells()
            raise

    # ---------------------------------------------------------------- start and stop

    def _start(self) -> None:
        for worker in self._workers:
            self._launch(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            ready = {w.index: self._started(w, deadline) for w in self._workers}
        except WorkerDied as died:
            raise EnvError(str(died)) from None
        first = ready[0]
        self.name: str = first["name"]
        self.spec = first["spec"]
        self.accepts_trial_index: bool = first["accepts_trial_index"]
        self.metadata: dict[str, Any] = first["metadata"]  # the env's tags, which pickle
        self.render_mode: str | None = first["render_mode"]
        self.render_fps: float | None = first["render_fps"]
        _, self.single_observation_space, self.single_action_space = first["spaces"][0]
        self._check_spaces([lane for info in ready.values() for lane in info["spaces"]])
        self._layout = SharedLayout.of(
            self.single_observation_space, self.single_action_space, self.num_lanes
        )
        memory = shared_memory.SharedMemory(
            name=f"{SHARED_MEMORY_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}",
            create=True,
            size=self._layout.size,
        )
        self._resources.memory = memory
        self._views: SharedViews | None = self._layout.views(memory.buf)
        try:
            for worker in self._workers:
                self._attach(worker, deadline)
        except WorkerDied as died:
            raise EnvError(str(died)) from None

    def _launch(self, worker: Worker) -> None:
        ours, theirs = self._context.Pipe()
        bell = self._context.Semaphore(0)
        process = self._context.Process(
            target=serve,
            args=(theirs, bell, self._source, worker.lanes, worker.index),
            name=f"rlmesh-lanes-worker{worker.index}",
            daemon=True,  # multiprocessing ends it if the driver exits without closing
        )
        process.start()
        theirs.close()  # only the worker holds its end: its death closes the pipe
        worker.process, worker.conn, worker.bell = process, ours, bell
        self._resources.processes.append(process)

    def _started(self, worker: Worker, deadline: float) -> dict[str, Any]:
        """Wait for ``worker``'s envs; raise what building them raised, as in-process."""
        reply = self._startup_reply(worker, deadline, "build its envs")
        if reply[0] == "failed":
            _, description, remote_traceback = reply
            kind, _, message = description.partition(": ")
            error_type = {"TypeError": TypeError, "ValueError": ValueError}.get(kind, EnvError)
            text = description if error_type is EnvError else message
            raise error_type(f"{text} (in {worker.describe()})") from WorkerTraceback(
                remote_traceback
            )
        return reply[1]

    def _attach(self, worker: Worker, deadline: float) -> None:
        assert self._resources.memory is not None
        worker.conn.send(("attach", self._resources.memory.name, self._layout))
        self._startup_reply(worker, deadline, "map the shared buffer")

    def _startup_reply(self, worker: Worker, deadline: float, what: str) -> Any:
        remaining = deadline - time.monotonic()
        ready = connection.wait([worker.conn, worker.process.sentinel], max(remaining, 0))
        if worker.conn in ready:
            try:
                return worker.conn.recv()
            except EOFError:
                pass
        elif not ready:
            raise WorkerDied(
                f"{worker.describe()} did not {what} within {START_TIMEOUT_S:g} s (START_TIMEOUT_S)"
            )
        raise WorkerDied(
            f"{worker.describe()} {exit_cause(worker.process)} before it could {what}; its "
            f"error is on stderr above. A worker starts by importing the script that started "
            f"the run: a script that runs rlmesh at its top level must do so under "
            f'`if __name__ == "__main__":`'
        )

    def _check_spaces(self, spaces: list[tuple[int, Any, Any]]) -> None:
        observation, action = self.single_observation_space, self.single_action_space
        for lane, lane_observation, lane_action in spaces:
            if (lane_observation, lane_action) != (observation, action):
                raise EnvError(
                    f"lane {lane} ({self.name}) has observation space {lane_observation} and "
                    f"action space {lane_action}, but lane 0 has {observation} and {action}: "
                    f"every lane must share lane 0's spaces"
                )

    def close(self) -> None:
        """Close every worker's envs and stop the workers; the shared buffer is unlinked. A
        worker still busy with a request (one the driver gave up on) is killed. Closing again
        does nothing.

        Raises:
            EnvError: an env's ``close`` raised in a worker (after everything was stopped).
        """
        if self._closed:
            return
        self._closed = True
        failure = None
        asked = []
        for worker in self._workers:
            if worker.process is None or worker.index in self._in_flight:
                continue
            try:
                worker.request(("close",))
                asked.append(worker)
            except OSError:  # it is gone already
                pass
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in asked:
            try:
                if worker.conn.poll(max(deadline - time.monotonic(), 0)):
                    reply = worker.conn.recv()
                    if reply[0] == "closed" and reply[1] and failure is None:
                        failure = EnvError(f"{self.name} {reply[1]} (in {worker.describe()})")
            except (EOFError, OSError):
                pass
            stop_process(worker.process, max(deadline - time.monotonic(), 0))
        self._views = None  # the buffer can only be closed once no view of it is left
        self._finalizer()
        for worker in self._workers:
            if worker.conn is not None:
                worker.conn.close()
        self._release_bells()
        if failure is not None:
            raise failure

    def _release_bells(self) -> None:
        """Drop every worker's bell, once its worker is stopped. A bell is a named POSIX
        semaphore (``/dev/shm/sem.mp-*``) that ``multiprocessing`` unlinks when its last
        reference goes; the lanes refer to themselves (``rebuild`` is their own method), so
        left to them it would go only when the garbage collector frees them."""
        for worker in self._workers:
            worker.bell = None

    # ---------------------------------------------------------------- the Lanes protocol

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        rows, requests, sent = self._reset_requests(lanes, seeds, trials)
        infos, loose, failed = self._exchange(requests, rows)
        outcome = self._reset_outcome(rows, sent, infos, loose, failed)
        return outcome.observations, outcome.infos

    def _reset_requests(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[np.ndarray, dict[int, tuple[Any, ...]], tuple[Any, ...]]:
        """The rows of a reset of ``lanes``, each worker's request, and what reading its
        replies needs (``_reset_outcome``)."""
        checked = checked_reset(lanes, seeds, trials, self.num_lanes)
        options = [reset_options(self.accepts_trial_index, trial) for trial in trials]
        rows = np.asarray(checked, dtype=np.int64)
        requests = {}
        for worker, positions, _ in self._by_worker(rows):
            requests[worker] = (
                "reset",
                [checked[p] for p in positions],
                [seeds[p] for p in positions],
                [options[p] for p in positions],
            )
        return rows, requests, (checked, list(seeds), options, list(trials))

    def _reset_outcome(
        self,
        rows: np.ndarray,
        sent: tuple[Any, ...],
        infos: list[Any],
        loose: list[Any],
        failed: dict[int, tuple[str, str, Worker]],
    ) -> ResetBatch:
        """The ``ResetBatch`` of a reset of ``rows`` from the buffer and the replies; the
        lanes in ``failed`` leave it, raised as ``LaneFailures`` carrying ``(lanes,
        observations, infos)`` of the others."""
        checked, seeds, options, trials = sent
        for lane, seed, option, trial in zip(checked, seeds, options, trials, strict=True):
            if lane in failed:
                continue
            self._trials[lane] = trial
            if self._restart_workers:
                self._episodes[lane] = [seed, option, []]
        if failed:
            kept = self._without(rows, failed)
            observations = self._views_now().take_observations(rows[kept], [loose[k] for k in kept])
            outcome = (rows[kept], observations, [infos[k] for k in kept])
            raise self._lane_failures("reset", failed, outcome)
        return ResetBatch(rows, self._views_now().take_observations(rows, loose), infos)

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        return self._step(lanes, actions, every_info=True)

    def round_step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        """``step`` for the core's rounds, which read only final infos: a lane whose episode
        goes on has an empty info, so the workers do not pickle every step's info."""
        return self._step(lanes, actions, every_info=False)

    def _step(self, lanes: np.ndarray, actions: Any, every_info: bool) -> StepBatch:
        rows = np.asarray(lanes, dtype=np.int64)
        if not len(rows):
            empty = np.zeros(0, dtype=np.bool_)
            return StepBatch(rows, [], np.zeros(0), empty, empty.copy(), [])
        requests, loose_actions = self._step_requests(rows, actions, every_info)
        infos, loose, failed = self._exchange(requests, rows)
        return self._step_batch(rows, loose_actions, infos, loose, failed)

    # ---------------------------------------------------------------- pipelined steps

    @property
    def step_groups(self) -> list[np.ndarray]:
        """The lanes of each worker, ``[G]`` arrays: each group steps on its own, so the
        driver may send one group's step while another's is still on its way back."""
        return [np.array(worker.lanes, dtype=np.int64) for worker in self._workers]

    def send_step(self, lanes: np.ndarray, actions: Any, *, every_info: bool = True) -> None:
        """Start a step of ``lanes`` (``[K]``, ascending, all of one group of
        ``step_groups``, whose last request was received) with ``actions`` ``[K, ...]``;
        ``receive`` returns it. ``step`` is ``send_step`` then ``receive`` for every group at
        once. Without ``every_info``, as in ``round_step``, a lane whose episode goes on comes
        back with an empty info."""
        rows = np.asarray(lanes, dtype=np.int64)
        requests, loose_actions = self._step_requests(rows, actions, every_info)
        self._send(rows, requests, ("step", loose_actions))

    def send_reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> None:
        """Start a reset of ``lanes`` (all of one group, whose last request was received)
        with ``seeds`` and ``trials`` as ``reset`` takes them; ``receive`` returns it, while
        the other groups step."""
        rows, requests, sent = self._reset_requests(lanes, seeds, trials)
        self._send(rows, requests, ("reset", sent))

    def _send(
        self, rows: np.ndarray, requests: dict[int, tuple[Any, ...]], reading: tuple[Any, ...]
    ) -> None:
        if len(requests) != 1:
            raise ValueError(f"lanes {rows.tolist()} are not of one group")
        (w,) = requests  # one group is one worker
        if w in self._sent:
            raise EnvError(f"{self._workers[w].describe()} has a request not yet received")
        self._sent[w] = (rows, reading, requests[w])
        self._post(requests)

    def receive(self) -> StepBatch | ResetBatch:
        """The outcome of one request sent by ``send_step`` or ``send_reset``: the first group
        whose worker has answered (the lowest of those ready); ``LaneFailures`` as ``step`` or
        ``reset`` raises it, for that group's lanes.

        Raises:
            EnvError: nothing was sent, or as ``step`` and ``reset`` raise it.
        """
        if not self._sent:
            raise EnvError(f"{self!r}: receive() with nothing sent")
        waited = time.perf_counter_ns()
        waiting = [self._workers[w] for w in sorted(self._sent)]
        worker = min(self._watch.ready(waiting, None), key=lambda w: w.index)
        rows, (kind, reading), message = self._sent.pop(worker.index)
        replies = self._collect({worker.index: message})
        waited = time.perf_counter_ns() - waited
        infos, loose, failed = self._read(replies, rows, kind, waited)
        if kind == "reset":
            return self._reset_outcome(rows, reading, infos, loose, failed)
        return self._step_batch(rows, reading, infos, loose, failed)

    def _step_requests(
        self, rows: np.ndarray, actions: Any, every_info: bool
    ) -> tuple[dict[int, tuple[Any, ...]], list[Any] | None]:
        """Each worker's step request for ``rows`` (every lane's info, or only final ones),
        the actions put in their slots, and the per-lane actions that travel through the pipes
        instead (None when all fit)."""
        views = self._views_now()
        loose_actions = views.put_actions(rows, actions)
        requests = {}
        for worker, positions, _ in self._by_worker(rows):
            requests[worker] = (
                "step",
                rows[positions].tolist(),
                None if loose_actions is None else [loose_actions[p] for p in positions],
                every_info,
            )
        return requests, loose_actions

    def _step_batch(
        self,
        rows: np.ndarray,
        loose_actions: list[Any] | None,
        infos: list[Any],
        loose: list[Any],
        failed: dict[int, tuple[str, str, Worker]],
    ) -> StepBatch:
        """The ``StepBatch`` of stepped ``rows`` from the buffer and the replies; the lanes in
        ``failed`` leave it, raised as ``LaneFailures`` carrying it."""
        views = self._views_now()
        if failed:
            kept = self._without(rows, failed)
            for lane in failed:  # their episodes are over: nothing of them is replayed
                self._trials[lane] = None
                self._episodes[lane] = None
            rows, infos, loose = rows[kept], [infos[k] for k in kept], [loose[k] for k in kept]
            if loose_actions is not None:
                loose_actions = [loose_actions[k] for k in kept]
        rewards = views.rewards[rows]
        terminated = views.terminated[rows]
        truncated = views.truncated[rows]
        self._note_steps(rows, loose_actions, terminated | truncated)
        batch = StepBatch(
            rows, views.take_observations(rows, loose), rewards, terminated, truncated, infos
        )
        if failed:
            raise self._lane_failures("step", failed, batch)
        return batch

    def _rebuild(self, lanes: np.ndarray) -> None:
        rows = np.asarray(lanes, dtype=np.int64)
        requests = {
            worker: ("rebuild", rows[positions].tolist())
            for worker, positions, _ in self._by_worker(rows)
        }
        self._exchange(requests, rows)

    @staticmethod
    def _without(rows: np.ndarray, failed: dict[int, Any]) -> np.ndarray:
        """The positions in ``rows`` of the lanes that did not fail."""
        return np.flatnonzero(~np.isin(rows, list(failed)))

    def _lane_failures(
        self, method: str, failed: dict[int, tuple[str, str, Worker]], outcome: Any
    ) -> LaneFailures:
        """The ``LaneFailures`` of the lanes whose envs raised in their workers, worded and
        chained as the first one's ``EnvError``."""
        lane, (description, remote_traceback, worker) = next(iter(failed.items()))
        failure = LaneFailures(
            f"lane {lane} ({self.name}): {method}() raised {description} (in {worker.describe()})",
            errors={lane: description for lane, (description, _, _) in failed.items()},
            outcome=outcome,
        )
        failure.__cause__ = WorkerTraceback(remote_traceback)
        return failure

    def env_episode_ids(self) -> np.ndarray | None:
        return None

    def render(self, lane: int) -> Any:
        """Lane ``lane``'s frame, rendered by the worker that owns it."""
        rows = np.array([lane], dtype=np.int64)
        self._views_now()  # refuses closed or broken lanes, as a step would
        frames, _, _ = self._exchange({int(self._owner[lane]): ("render", [lane])}, rows)
        return frames[0]

    def __repr__(self) -> str:
        return (
            f"ProcessLanes({self.name}, num_lanes={self.num_lanes}, workers={len(self._workers)})"
        )

    @property
    def worker_pids(self) -> list[int]:
        """The pid of each worker process, in worker order (a restarted worker's new pid)."""
        return [worker.process.pid for worker in self._workers]

    # ---------------------------------------------------------------- requests

    def _views_now(self) -> SharedViews:
        if self._closed or self._views is None:
            raise EnvError(f"{self!r} is closed")
        if self._broken is not None:
            raise EnvError(f"{self!r} cannot go on after an earlier failure: {self._broken}")
        return self._views

    def _by_worker(self, rows: np.ndarray) -> list[tuple[int, np.ndarray, list[int]]]:
        """The positions in ``rows`` of each worker's lanes (an array and a list), for the
        workers that have any. A driver steps the same lanes (or groups of them) round after
        round, so the splits of the last few ``rows`` are kept."""
        key = rows.tobytes()
        split = self._splits.get(key)
        if split is None:
            if len(self._splits) >= SPLITS_KEPT:
                self._splits.clear()
            owners = self._owner[rows]
            split = self._splits[key] = [
                (int(w), positions, positions.tolist())
                for w in np.unique(owners).tolist()
                for positions in [np.flatnonzero(owners == w)]
            ]
        return split

    def _exchange(
        self, requests: dict[int, tuple[Any, ...]], rows: np.ndarray
    ) -> tuple[list[Any], list[Any], dict[int, tuple[str, str, Worker]]]:
        """Send each worker its request, wait for every reply (restarting a dead worker where
        allowed), and return the infos and loose observations in the order of ``rows``, and
        the lanes whose env raised: ``{lane: (message, traceback, worker)}``.

        Raises:
            EnvError: a worker died (beyond its restarts), or a worker failed a request as a
                whole (the first such, once every other worker has answered).
        """
        self._post(requests)
        waited = time.perf_counter_ns()
        replies = self._collect(requests)
        waited = time.perf_counter_ns() - waited
        return self._read(replies, rows, next(iter(requests.values()))[0], waited)

    def _post(self, requests: dict[int, tuple[Any, ...]]) -> None:
        """Send each worker its request, then ring their bells (see ``Worker``)."""
        posted = []
        for w, message in requests.items():
            self._in_flight.add(w)
            try:
                self._workers[w].conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
                posted.append(self._workers[w])
            except OSError:  # it died since its last answer
                self._recover(self._workers[w], message)
        for worker in posted:
            worker.bell.release()

    def _collect(self, requests: dict[int, tuple[Any, ...]]) -> dict[int, Any]:
        """Every requested worker's reply, restarting a dead worker where allowed."""
        replies: dict[int, Any] = {}
        while len(replies) < len(requests):
            pending = [self._workers[w] for w in requests if w not in replies]
            # Once a worker has answered, its CPU is free and the others' answers usually
            # follow within a millisecond: found by polling, the last one wakes no one (see
            # worker.POLL_S), and it is the one the round waits for.
            ready = self._watch.answered(pending) if replies and len(pending) < CPUS else []
            for worker in ready or self._watch.ready(pending, None):
                try:
                    replies[worker.index] = worker.conn.recv()
                    self._in_flight.discard(worker.index)
                except (EOFError, OSError):
                    self._recover(worker, requests[worker.index])
        return replies

    def _read(
        self, replies: dict[int, Any], rows: np.ndarray, kind: str, waited: int
    ) -> tuple[list[Any], list[Any], dict[int, tuple[str, str, Worker]]]:
        """The infos and loose observations of ``replies`` in the order of ``rows``, and the
        lanes whose env raised; ``waited`` ns the driver waited, recorded for a step."""
        infos: list[Any] = [None] * len(rows)
        loose: list[Any] = [None] * len(rows)
        failure = None
        failed: dict[int, tuple[str, str, Worker]] = {}
        positions_of = {w: positions for w, _, positions in self._by_worker(rows)}
        for w, reply in sorted(replies.items()):
            if reply[0] == "error":
                failure = failure or self._env_error(self._workers[w], reply)
                continue
            if len(reply) == 1:  # a rebuild: nothing to read
                continue
            _, worker_infos, worker_loose, spent_ns, worker_failed = reply
            for lane, (description, remote_traceback) in worker_failed.items():
                failed[lane] = (description, remote_traceback, self._workers[w])
            for position, info, extra in zip(
                positions_of[w], worker_infos, worker_loose, strict=True
            ):
                infos[position] = info
                loose[position] = extra
            if kind == "step" and self._record is not None:
                self._record(f"worker{w}.step", spent_ns)
        if failure is not None:
            raise failure
        if kind == "step" and self._record is not None:
            self._record("driver.wait", waited)
        return infos, loose, dict(sorted(failed.items()))

    def _env_error(self, worker: Worker, reply: tuple[Any, ...]) -> EnvError:
        _, lane, method, description, remote_traceback = reply
        where = self.name if lane is None else f"lane {lane} ({self.name})"
        error = EnvError(f"{where}: {method}() raised {description} (in {worker.describe()})")
        error.__cause__ = WorkerTraceback(remote_traceback)
        return error

    def _note_steps(self, rows: np.ndarray, loose_actions: list[Any] | None, ended: Any) -> None:
        """Keep each stepped lane's episode up to date: ended episodes are no longer in
        flight; with restarts, the others keep the action just taken, for a replay."""
        keep = self._restart_workers > 0
        if not keep:  # only the ended lanes change
            for lane in rows[ended].tolist():
                self._trials[lane] = None
                self._episodes[lane] = None
            return
        views = self._views
        for k, (lane, done) in enumerate(zip(rows.tolist(), ended.tolist(), strict=True)):
            if done:
                self._trials[lane] = None
                self._episodes[lane] = None
            elif keep:
                episode = self._episodes[lane]
                if episode is not None:
                    action = views.take_action(lane) if loose_actions is None else loose_actions[k]
                    episode[2].append(action)

    # ---------------------------------------------------------------- faults

    def _recover(self, worker: Worker, message: tuple[Any, ...]) -> None:
        """``worker`` died with ``message`` unanswered: restart it, replay its episodes in
        flight and send ``message`` again, or raise the ``EnvError`` that names it."""
        while True:
            cause = exit_cause(worker.process)
            if self._closed or worker.restarts >= self._restart_workers:
                self._in_flight.discard(worker.index)
                raise self._death_error(worker, message[0], cause)
            worker.restarts += 1
            try:
                worker.conn.close()
                self._launch(worker)
                deadline = time.monotonic() + START_TIMEOUT_S
                self._started(worker, deadline)
                self._attach(worker, deadline)
                resetting = set(message[1]) if message[0] == "reset" else set()
                episodes = [
                    (lane, *self._episodes[lane])
                    for lane in worker.lanes
                    if self._episodes[lane] is not None and lane not in resetting
                ]
                if episodes:
                    worker.request(("replay", episodes))
                    reply = worker.conn.recv()
                    if reply[0] == "error":
                        self._broken = f"replaying its episodes in {worker.describe()} failed"
                        raise self._env_error(worker, reply)
                worker.request(message)
                return
            except (EOFError, OSError, WorkerDied):
                continue  # it died again: another restart, if any is left

    def _death_error(self, worker: Worker, request: str, cause: str) -> EnvError:
        in_flight = [
            (lane, self._trials[lane]) for lane in worker.lanes if self._trials[lane] is not None
        ]
        episodes = ", ".join(f"trial {trial} on lane {lane}" for lane, trial in in_flight) or "none"
        restarts = (
            f"it was restarted {worker.restarts} times already (restart_workers="
            f"{self._restart_workers})"
            if self._restart_workers
            else "pass restart_workers=K to restart a dead worker and re-run its episodes from "
            "their seeds"
        )
        self._broken = f"{worker.describe()} died"
        error = EnvError(
            f"{self.name}: {worker.describe()} {cause} during {request}; episodes in flight: "
            f"{episodes}. The episodes completed before it are kept (err.partial_result); "
            f"{restarts}"
        )
        error.worker = worker.index  # type: ignore[attr-defined]
        error.lanes = list(worker.lanes)  # type: ignore[attr-defined]
        error.trials = [trial for _, trial in in_flight]  # type: ignore[attr-defined]
        return error
