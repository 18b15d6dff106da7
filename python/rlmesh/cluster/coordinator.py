"""The coordinator of a cluster run: deal windows to Ray workers, merge their episodes by index.

``run_on_cluster`` is where ``rlmesh.arun(..., cluster="ray")`` goes once its arguments are
checked. The coordinator

1. opens the results file as a local run would (the same header, so a run started on a
   cluster may be resumed on one process and back) and leaves out the episodes it holds;
2. connects to Ray (or starts a local instance), cuts the rest into windows in a seeded
   shuffle (``windows.deal_windows``) and keeps ``workers`` of them running, each running the
   local driver on its indices: as a Ray task (``worker.run_window``, ``ray_mode="tasks"``) or
   on one of ``workers`` long-lived actors that hold the model (``worker.WindowActor``,
   ``ray_mode="actors"``), which ``_Tasks`` and ``_Actors`` start and end;
3. merges each episode as it arrives: by index, so an episode delivered twice is kept once,
   appended to the results file (flushed) before any hook hears of it;
4. re-deals the missing indices of a window whose worker died, with the same seeds, at most
   ``max_retries`` times per window, then fails with ``WorkerLostError``;
5. writes one run segment (waste, merged telemetry, wall time) and returns the merged result,
   read back from the file when there is one; fewer episodes than asked for is a
   ``MergeIncompleteError``, never a short success.

The hooks run here, on the coordinator: ``on_run_start``, ``on_episode_start`` and
``on_episode_end`` as episodes start and land, ``on_run_end``, and the ``RuntimeHooks``
session, episode and telemetry events (the telemetry snapshots give the cluster's lane-steps
per second). Hooks that watch steps, observations or actions would need the envs, which stay
on the workers: they are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core import core_name
from ..hooks import HookDispatcher, RunHooks, RuntimeHooks
from ..results import EpisodeResult, ResultsFile, RunResult, TelemetryRow, merge_telemetry
from ..settings import RunSettings
from ..success import SuccessRule, rule_for
from ..utils import env_label
from . import require_ray
from .errors import ClusterError, MergeIncompleteError, WindowFailedError, WorkerLostError
from .job import Landed, WindowDone, WindowJob, make_job
from .report import ClusterReport, ClusterRunResult, WindowStats
from .windows import deal_windows, window_sizes
from .worker import WindowActor, run_window

# How Ray says a task's worker went away (the process died, its node or raylet was lost, the
# objects it held with it): the window is run again elsewhere. Anything else is the run's own
# error and ends it.
WORKER_LOST_ERRORS = (
    "WorkerCrashedError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "RaySystemError",
    "RayActorError",  # an actor's process died, or Ray ended it
)
# How long the coordinator waits for its actors to close their models at the end of a run,
# before it ends them anyway.
ACTOR_CLOSE_S = 60.0
# Hook methods that need the envs' steps, observations or actions: not on a cluster run.
BESIDE_THE_ENVS = (
    (RunHooks, ("on_step",)),
    (
        RuntimeHooks,
        (
            "step_completed",
            "observation_emitted",
            "transform_observation",
            "action_received",
            "transform_action",
        ),
    ),
)


async def run_on_cluster(
    model: Any, env: Any, settings: RunSettings, *, hooks: Any = None
) -> ClusterRunResult:
    """Run ``settings``' episodes of ``model`` on ``env`` across a Ray cluster (its
    ``placement``).

    Returns the merged ``ClusterRunResult``: every episode asked for, equal to a run on one
    process but for timings and lanes, with the ``ClusterReport`` in ``.cluster``.

    Raises:
        ImportError: Ray is not installed (the message says what to install).
        ValueError: an env the workers cannot build, or hooks that need the envs.
        NotPicklableError: the model, env factory or success rule does not pickle.
        WorkerLostError: a window lost its worker more than ``max_retries`` times.
        MergeIncompleteError: the merge holds fewer episodes than asked for.
        RlmeshError: a window's run failed (the worker's error, as a local run raises it).
    """
    assert settings.placement is not None
    ray = require_ray()
    dispatcher = HookDispatcher(hooks)
    _refuse_hooks_beside_the_envs(dispatcher)
    settings = replace(settings, core=settings.core or core_name())
    job = make_job(model, env, settings=settings.for_window())
    try:
        if job.env_lanes:
            # Lanes a worker holds across its windows (a sandbox): on actors, which close
            # them at the end; a task's worker would start them for each window.
            settings = replace(settings, placement=replace(settings.placement, ray_mode="actors"))
        success_rule = rule_for(settings.success, env)
        results = settings.open_results(env, model, success_rule)
    finally:
        if job.env_lanes:
            # The lanes given (a SandboxEnv, started here) are the run's, as a local run's
            # are: closed now, their facts (name, spec) kept; the workers start their own.
            env.close()
        _stop_sandboxed_model(model)
    coordinator = Coordinator(ray, job, env, settings, dispatcher, results, success_rule)
    return await coordinator.execute()


def _refuse_hooks_beside_the_envs(dispatcher: HookDispatcher) -> None:
    named = [
        f"{type(hook).__name__}.{name}"
        for base, names in BESIDE_THE_ENVS
        for hook in (dispatcher.run_hooks if base is RunHooks else dispatcher.runtime_hooks)
        for name in names
        if getattr(type(hook), name, None) is not getattr(base, name)
    ]
    if named:
        raise ValueError(
            f"hooks: {', '.join(named)} watch the envs' steps, observations or actions, which "
            "a cluster run keeps on its workers; on the coordinator it calls on_run_start, "
            "on_episode_start, on_episode_end, on_run_end and the RuntimeHooks session, "
            "episode and telemetry events"
        )


@dataclass
class _Window:
    """A window being dealt: its number, the indices it still has to run, its attempt."""

    number: int
    indices: tuple[int, ...]
    attempt: int = 0
    generator: Any = None  # the Ray task's stream of messages, while it runs
    submitted: float = 0.0  # when its task was submitted (perf_counter)
    actor: Any = None  # the actor running it (ray_mode="actors")


def _stop_sandboxed_model(model: Any) -> None:
    """Stop a ``SandboxModel``'s server, started here for its spec: each worker starts one of
    its own from the model's arguments (a later local run would start it again)."""
    from ..sandbox import SandboxModel

    if isinstance(model, SandboxModel):
        model.close()


class _Tasks:
    """``ray_mode="tasks"``: each window a Ray task of ``cpus`` CPUs, its own local run."""

    def __init__(self, ray: ModuleType, job: Any, cpus: int, holds_lanes: bool = False) -> None:
        self.ray, self.job = ray, job
        self.task = ray.remote(run_window).options(num_cpus=cpus, max_retries=0)

    def submit(self, window: _Window) -> None:
        window.generator = self.task.remote(self.job, list(window.indices))

    def ended(self, window: _Window, lost: BaseException | None) -> None:
        """A task's worker is Ray's to reuse or replace."""

    async def close(self, running: Iterable[_Window]) -> BaseException | None:
        """Stop the tasks still ``running``; a task's run closed its model itself."""
        for window in running:
            # Forced: its local run is on a thread, which only its process's end stops. A
            # task that already ended, or lost its worker, has nothing left to stop.
            with contextlib.suppress(Exception):
                self.ray.cancel(window.generator, force=True)
        return None


class _Actors:
    """``ray_mode="actors"``: long-lived actors of ``cpus`` CPUs, each holding the model.

    A window goes to an idle actor, or to a new one (as many as windows run at once). An actor
    whose window lost it is ended; its window's re-run goes to another, or to a fresh actor,
    which loads the model anew. At the end, idle actors close their models; busy ones (a run
    that failed, or was interrupted) are ended where they are.
    """

    def __init__(self, ray: ModuleType, job: Any, cpus: int, holds_lanes: bool = False) -> None:
        self.ray, self.job = ray, job
        self.holds_lanes = holds_lanes  # the job's env_lanes (job is Ray's reference to it)
        self.actor_class = ray.remote(WindowActor).options(
            num_cpus=cpus,
            max_restarts=0,
            max_task_retries=0,
            # Lanes held across windows (a sandbox) are released by a second call while a
            # window may still run (close): the actor takes two at once.
            **({"max_concurrency": 2} if self.holds_lanes else {}),
        )
        self.live: list[Any] = []
        self.idle: list[Any] = []

    def submit(self, window: _Window) -> None:
        if self.idle:
            window.actor = self.idle.pop()
        else:
            window.actor = self.actor_class.remote(self.job)
            self.live.append(window.actor)
        window.generator = window.actor.run_window.remote(list(window.indices))

    def ended(self, window: _Window, lost: BaseException | None) -> None:
        if lost is None:
            self.idle.append(window.actor)
            return
        self.live = [actor for actor in self.live if actor is not window.actor]
        with contextlib.suppress(Exception):  # most likely dead already
            self.ray.kill(window.actor)

    async def close(self, running: Iterable[_Window]) -> BaseException | None:
        """Close the models of the actors not in ``running``, end every actor; the first
        error a model's close raised, if any."""
        busy = [window.actor for window in running]
        free = [actor for actor in self.live if not any(actor is other for other in busy)]
        closing = [asyncio.ensure_future(_awaited(actor.close.remote())) for actor in free]
        # Busy actors' held lanes first, so that ending them leaves no sandbox's files.
        releasing = [
            asyncio.ensure_future(_awaited(actor.release_lanes.remote()))
            for actor in (busy if self.holds_lanes else ())
        ]
        if closing or releasing:
            _, late = await asyncio.wait([*closing, *releasing], timeout=ACTOR_CLOSE_S)
            for future in late:
                future.cancel()  # its actor is ended below
            await asyncio.gather(*closing, *releasing, return_exceptions=True)
        for actor in self.live:
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        self.live, self.idle = [], []
        failed = [
            future.exception()
            for future in closing
            if not future.cancelled() and future.exception() is not None
        ]
        return failed[0] if failed else None


async def _awaited(reference: Any) -> Any:
    return await reference


WORKER_POOLS = {"tasks": _Tasks, "actors": _Actors}  # by ray_mode (settings.RAY_MODES)


class _RayConnection:
    """This run's hold on Ray: a local instance it started (shut down at the end), a cluster
    it joined (left at the end), or the connection the process already had (kept)."""

    def __init__(self, ray: ModuleType, owned: bool) -> None:
        self.ray = ray
        self.owned = owned

    @classmethod
    def open(cls, ray: ModuleType, address: str | None) -> _RayConnection:
        if ray.is_initialized():
            return cls(ray, owned=False)
        options: dict[str, Any] = {"logging_level": logging.WARNING}
        if address is None:
            options["include_dashboard"] = False  # a local instance: no web UI to serve
        else:
            options["address"] = address
        try:
            ray.init(**options)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = "a local Ray instance" if address is None else f"the Ray cluster {address!r}"
            raise ClusterError(
                f"cannot start or reach {where}: {type(exc).__name__}: {exc}; expected a "
                "running cluster's address ('auto', 'host:6379', 'ray://host:10001'), or none "
                "for a local instance"
            ) from exc
        return cls(ray, owned=True)

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()


def _ray_error(ray: ModuleType, names: Iterable[str]) -> tuple[type[BaseException], ...]:
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


def cluster_telemetry(
    segments: Sequence[tuple[TelemetryRow, ...]], seconds: float
) -> tuple[TelemetryRow, ...]:
    """The windows' telemetry as the run's: latencies merged (``merge_telemetry``), and each
    throughput row the cluster's, its total count over ``seconds`` of the run.

    Example:
        >>> row = TelemetryRow("driver", "lane-steps", "1/s", 500, 1000.0, *[float("nan")] * 4)
        >>> merged, = cluster_telemetry([(row,), (row,)], seconds=0.5)
        >>> merged.count, merged.avg
        (1000, 2000.0)
    """
    if not segments:
        return ()
    merged = merge_telemetry(list(segments))
    return tuple(
        TelemetryRow(
            row.op,
            row.metric,
            row.unit,
            row.count,
            row.count / seconds if seconds > 0 else math.nan,
            *[math.nan] * 4,
        )
        if row.unit == "1/s"
        else row
        for row in merged
    )


def missing_from_merge(wanted: Iterable[int], merged: RunResult) -> MergeIncompleteError | None:
    """The error for a merge that lacks episodes asked for, or None when it holds them all.

    Example:
        >>> episode = EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2)
        >>> print(missing_from_merge(range(3), RunResult([episode], base_seed=0)))
        the merged results hold 1 of the 3 episodes asked for; missing indices [1, 2]
    """
    held = {episode.index for episode in merged.episodes}
    wanted = list(wanted)
    missing = [index for index in wanted if index not in held]
    if not missing:
        return None
    shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
    return MergeIncompleteError(
        f"the merged results hold {len(wanted) - len(missing)} of the {len(wanted)} episodes "
        f"asked for; missing indices [{shown}]",
        missing=missing,
    )


class Coordinator:
    """One cluster run: the windows, the merge, the results file and the hooks."""

    def __init__(
        self,
        ray: ModuleType,
        job: WindowJob,
        env: Any,
        settings: RunSettings,
        hooks: HookDispatcher,
        results: ResultsFile | None,
        success_rule: SuccessRule,
    ) -> None:
        assert settings.placement is not None and settings.core is not None
        self.ray, self.job, self.env = ray, job, env
        self.settings, self.placement = settings, settings.placement
        self.hooks, self.results = hooks, results
        self.success_rule, self.core = success_rule, settings.core
        on_file = () if results is None else results.episodes
        self.merged: dict[int, EpisodeResult] = {episode.index: episode for episode in on_file}
        self.on_file = frozenset(self.merged)
        self.announced: set[int] = set(self.merged)
        self.windows: list[WindowStats] = []
        self.done: list[WindowDone] = []
        self.workers = 0
        self.startup_s = 0.0
        self.coordinator_ns = 0
        self.dealing_started: float | None = None
        self.landed_steps = 0
        self.next_snapshot = 0.0
        self.worker_lost = _ray_error(ray, WORKER_LOST_ERRORS)

    # -------------------------------------------------------------------- the run

    async def execute(self) -> ClusterRunResult:
        started = time.perf_counter()
        settings = self.settings
        wanted = settings.episodes.slots
        to_run = [index for index in wanted if index not in self.merged]
        error: BaseException | None = None
        connection: _RayConnection | None = None
        try:
            await self.hooks.run_start(self._context())
            if to_run:
                connection = _RayConnection.open(self.ray, self.placement.ray_address)
                await self._deal(to_run, started)
        except BaseException as exc:  # every failure closes the run the same way
            error = exc
        elapsed = time.perf_counter() - started
        try:
            merged = self._close_results(elapsed if to_run else None)
        finally:
            if connection is not None:
                connection.close()
        if error is None:
            error = missing_from_merge(wanted, merged)
        result = ClusterRunResult.of(merged, self._report() if to_run else None)
        try:
            await self.hooks.run_end(result, error)
        except Exception as exc:
            error = error or exc
        if error is not None:
            if isinstance(error, Exception):
                error.partial_result = result  # type: ignore[attr-defined]
            raise error
        return result

    def _context(self) -> dict[str, Any]:
        settings, placement = self.settings, self.placement
        return {
            "env": env_label(self.env),
            "episodes": settings.episodes.count,
            "base_seed": settings.episodes.base_seed,
            "seeds": settings.episodes.seeds,
            "trial_index_base": settings.episodes.trial_index_base,
            "execution_horizon": settings.execution_horizon,
            "core": self.core,
            "cluster": placement.cluster,
            "workers": placement.ray_workers,
            "ray_address": placement.ray_address,
            "ray_mode": placement.ray_mode,
            "completed_episodes": () if self.results is None else self.results.episodes,
        }

    async def _deal(self, to_run: list[int], started: float) -> None:
        """Keep ``workers`` windows running until every one has completed."""
        ray, placement = self.ray, self.placement
        cpus = placement.processes_per_worker or 1
        workers = placement.ray_workers or max(
            1, int(ray.cluster_resources().get("CPU", 1)) // cpus
        )
        sizes = window_sizes(
            len(to_run), workers, self.settings.parallel.num_envs, placement.window_episodes
        )
        pending = deque(
            _Window(number, indices)
            for number, indices in enumerate(
                deal_windows(to_run, sizes, self.settings.episodes.base_seed)
            )
        )
        self.workers = min(workers, len(pending))
        pool = WORKER_POOLS[placement.ray_mode](
            ray, ray.put(self.job), cpus, holds_lanes=self.job.env_lanes
        )
        self.dealing_started = time.perf_counter()
        self.startup_s = self.dealing_started - started
        running: dict[asyncio.Future, _Window] = {}
        try:
            while pending or running:
                while pending and len(running) < self.workers:
                    began = time.perf_counter_ns()
                    window = pending.popleft()
                    pool.submit(window)
                    window.submitted = time.perf_counter()
                    running[asyncio.ensure_future(self._follow(window))] = window
                    self.coordinator_ns += time.perf_counter_ns() - began
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in finished:
                    window = running.pop(future)
                    lost = future.result()  # a window whose run failed raises here
                    pool.ended(window, lost)
                    if lost is not None:
                        pending.extendleft(self._again(window, lost))
        finally:
            failed_close = await pool.close(running.values())
            for future in running:
                future.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if failed_close is not None:  # every episode landed, but a model did not close well
            if hasattr(failed_close, "add_note"):
                failed_close.add_note("(raised on a Ray actor, closing its model: Model.close)")
            raise failed_close

    def _again(self, window: _Window, lost: BaseException) -> list[_Window]:
        """The rest of a window whose worker was lost, to run again (none if every episode
        landed), or ``WorkerLostError`` once it has had its ``max_retries``."""
        missing = tuple(index for index in window.indices if index not in self.merged)
        if not missing:
            return []
        retries = self.placement.window_retries
        if window.attempt >= retries:
            kept = len(self.merged) - len(self.on_file)
            where = "" if self.results is None else f" in {self.results.path}"
            raise WorkerLostError(
                f"window {window.number} (episodes {_shown(missing)}) lost its worker "
                f"{window.attempt + 1} times, more than max_retries={retries} allows; the last "
                f"time: {type(lost).__name__}: {str(lost).splitlines()[0] if str(lost) else ''}."
                f" The {kept} episodes that completed are kept{where}",
                window=window.number,
                indices=missing,
                attempts=window.attempt + 1,
            )
        return [_Window(window.number, missing, window.attempt + 1)]

    async def _follow(self, window: _Window) -> BaseException | None:
        """Merge a window's messages as they arrive; the error if its worker was lost."""
        worker, episodes, steps = "unknown", 0, 0

        def ended(task_s: float, lost: bool = False) -> None:
            self.windows.append(
                WindowStats(
                    window=window.number,
                    attempt=window.attempt,
                    worker=worker,
                    episodes=episodes,
                    steps=steps,
                    task_s=task_s,
                    wall_s=time.perf_counter() - window.submitted,
                    lost=lost,
                )
            )

        try:
            async for reference in window.generator:
                message = await reference
                began = time.perf_counter_ns()
                worker = message.worker
                if isinstance(message, Landed):
                    landed, landed_steps = await self._land(message)
                    episodes, steps = episodes + landed, steps + landed_steps
                elif isinstance(message, WindowDone):
                    self.done.append(message)
                    ended(message.task_s)
                else:
                    raise _window_error(window, message)
                self.coordinator_ns += time.perf_counter_ns() - began
        except self.worker_lost as lost:
            ended(0.0, lost=True)
            return lost
        except self.ray.exceptions.RayTaskError as exc:  # the task itself broke, not its run
            raise WindowFailedError(
                f"window {window.number} (episodes {_shown(window.indices)}) failed on its "
                f"worker: {exc}"
            ) from None
        return None

    async def _land(self, message: Landed) -> tuple[int, int]:
        """Merge a batch of a window's episodes: each index once, on disk before the hooks
        hear of it. Returns the episodes and steps it added."""
        for index, seed in message.started:
            if index not in self.announced:  # a re-run window's episode starts once
                self.announced.add(index)
                await self.hooks.episode_start(index, seed)
        added = steps = 0
        for episode in message.episodes:
            if episode.index in self.merged:  # delivered again by a re-run: merged by index
                continue
            episode = self._linked(episode)
            self.merged[episode.index] = episode
            if self.results is not None:
                self.results.append(episode)
            added, steps = added + 1, steps + episode.steps
            await self.hooks.episode_end(episode)
        self.landed_steps += steps
        now = time.perf_counter()
        if steps and now >= self.next_snapshot:  # a batch of starts alone has no rate yet
            self.next_snapshot = now + self.settings.telemetry_window
            await self.hooks.telemetry(self._throughput(now))
        return added, steps

    def _linked(self, episode: EpisodeResult) -> EpisodeResult:
        """``episode`` with its video (which a window links by its absolute path) relative to
        the results file's directory, as a local run links it."""
        video = self.settings.video
        if episode.video is None or video is None or video.links_from is None:
            return episode
        return replace(
            episode, video=Path(os.path.relpath(episode.video, video.links_from)).as_posix()
        )

    def _throughput(self, now: float) -> list[TelemetryRow]:
        """The cluster's lane-steps per second so far, as a local run's snapshot gives them."""
        seconds = now - (self.dealing_started or now)
        rate = self.landed_steps / seconds if seconds > 0 else math.nan
        return [
            TelemetryRow("driver", metric, "1/s", self.landed_steps, rate, *[math.nan] * 4)
            for metric in ("steps", "lane-steps")
        ]

    # -------------------------------------------------------------------- the result

    def _segment(self, elapsed_s: float) -> RunResult:
        """What this run added: its episodes, waste, telemetry and wall time."""
        settings, done = self.settings, self.done
        dealing_s = time.perf_counter() - (self.dealing_started or time.perf_counter())
        rule = done[-1].success_rule if done else self.success_rule  # a factory's, resolved
        return RunResult(
            episodes=tuple(e for i, e in self.merged.items() if i not in self.on_file),
            base_seed=settings.episodes.base_seed,
            wasted_steps=sum(window.wasted_steps for window in done),
            telemetry=cluster_telemetry([window.telemetry for window in done], dealing_s),
            observer_errors=sum(window.observer_errors for window in done)
            + self.hooks.observer_errors,
            core=self.core,
            success_rule=rule,
            episodes_requested=(settings.episodes.requested),
            elapsed_s=elapsed_s,
        )

    def _close_results(self, elapsed_s: float | None) -> RunResult:
        """Record this run's segment (when it ran anything) and return the merged result: the
        results file's every episode, read back, or this run's."""
        if self.results is None:
            return self._segment(elapsed_s or 0.0)
        segment = None if elapsed_s is None else self._segment(elapsed_s)
        try:
            if segment is not None:
                self.results.append_run(segment, elapsed_s=elapsed_s)
            result, _ = self.results.run_result()
        finally:
            self.results.close()  # and with it the file's writer lock
        return result

    def _report(self) -> ClusterReport:
        return ClusterReport(
            workers=self.workers,
            windows=tuple(self.windows),
            startup_s=self.startup_s,
            coordinator_s=self.coordinator_ns / 1e9,
            ray_address=self.placement.ray_address,
            ray_mode=self.placement.ray_mode,
        )


def _window_error(window: _Window, failed: Any) -> BaseException:
    """The error a window's run raised on its worker, saying where, as the run's error."""
    error = failed.error
    if error is None:
        return WindowFailedError(f"window {window.number}: {failed.description}")
    if hasattr(error, "add_note"):
        error.add_note(
            f"(raised on Ray worker {failed.worker}, running window {window.number}: episodes "
            f"{_shown(window.indices)})"
        )
    return error


def _shown(indices: Sequence[int], most: int = 8) -> str:
    """A window's indices for a message: ``[3, 9, 14]``, or the first few and how many."""
    if len(indices) <= most:
        return str(list(indices))
    return f"[{', '.join(map(str, indices[:most]))}, ... ({len(indices)} in all)]"
