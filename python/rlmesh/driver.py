"""The async driver: reset -> predict -> step over the lanes until exactly M episodes are scored.

``rlmesh.api`` checks a run's arguments into ``RunSettings`` and hands them to an
``EvaluationRun``. A run is three objects and the hooks (ARCHITECTURE.md): the ``Lanes``
that hold the envs (``rlmesh.lanes``), the ``ModelHandler`` that answers predicts
(``rlmesh.model``), and the core's ``RoundRunner``, the one owner of every lane's episode
(``rlmesh.core``). This file moves arrays between them and calls the hooks; it never asks what
kind of lanes or model it has. One round (docs/semantics.md, "The loop"):

1. the runner assembles the running lanes' model input (frame stacks keyed by episode);
2. the model is called once for the lanes whose replay queue is empty;
3. the runner turns its output into one env action per running lane (chunks queued per lane);
4. the lanes step, and the runner records rewards, terminations and caps;
5. the ended episodes are finished (summaries, evictions, the model's and hooks' ends), and
   the next ones start: the driver resets the lanes with the next slots' seeds, or observes
   the lanes an autoresetting vector restarted itself.

When nothing in a round needs awaiting, the runner runs whole rounds itself (``run_rounds``),
and this file's Python runs once per episode end.

Example:
    >>> import rlmesh
    >>> result = rlmesh.run(lambda obs: int(obs[2] > 0), "CartPole-v1", episodes=4, num_envs=2)
    >>> [episode.index for episode in result.episodes]
    [0, 1, 2, 3]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

from .adapters import compile_spec, env_tags_of
from .core import active, load_core
from .deadlines import DeadlineCaller, DeadlinePassed
from .errors import LaneFailures, OperationTimeout, RlmeshError, call_failure
from .hooks import HookDispatcher
from .lanes import Lanes, StepBatch, core_steps, lanes_pipelined, make_lanes
from .model import ModelHandler
from .results import EpisodeResult, ResultsFile, RunResult
from .settings import RunSettings
from .stats.stopping import stopper_for
from .success import SuccessRule, rule_for
from .telemetry import Telemetry
from .utils import env_label, map_leaves
from .video import NoVideos, VideoRecorder

YIELD_EVERY_NS = 50_000_000
# The ops whose latencies the core's run_rounds records, in the order it takes their stats.
ROUND_OPS = ("model.predict", "env.step", "driver.round")


def _success(info: dict) -> bool | None:
    """What the final ``info`` says of success: ``is_success``, else ``success``, else None."""
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return None


NO_LANES = np.zeros(0, dtype=np.int64)


@dataclass
class OpenRound:
    """A round between the model's actions and its step's outcome: its running lanes
    ``[K]``, predicted lanes ``[P]``, actions ``[K, ...]`` (None when no lane runs), the
    model's time, and when the round and its step began (``perf_counter_ns``)."""

    running: np.ndarray
    predict_lanes: np.ndarray
    actions: Any
    predict_ns: int
    started_ns: int
    step_started_ns: int = 0


@dataclass
class PendingReset:
    """Episodes started on a group's lanes whose reset (sent with ``pipeline=True``) is on
    its way: the runner's ``starts``, the lanes reset ``[R]`` (scored, then surplus), and
    when it was sent (``perf_counter_ns``)."""

    starts: Any
    lanes: np.ndarray
    sent_ns: int


class EvaluationRun:
    """One evaluation: the lanes, the model handler, the core's runner and the hooks."""

    def __init__(
        self,
        model: Any,
        env: Any,
        settings: RunSettings,
        *,
        hooks: Any = None,
        results: ResultsFile | None = None,
        success_rule: SuccessRule | None = None,
        view: Any = None,
    ) -> None:
        self.settings = settings
        self.success_rule = (
            rule_for(settings.success, env) if success_rule is None else success_rule
        )
        self.hooks_argument = hooks
        self.view = view  # the live view (rlmesh.view.LiveView) or None; among the hooks
        self.results = results
        self.core = active if settings.core is None else load_core(settings.core)
        self.core_name = "python" if self.core is load_core("python") else "rust"
        self.env = env
        self.model = model
        self.hooks: HookDispatcher | None = None
        self.lanes: Lanes | None = None
        self.handler: ModelHandler | None = None
        self.runner: Any = None
        self.telemetry: Telemetry | None = None
        self.videos: VideoRecorder | NoVideos | None = None  # once the lanes are made
        self.deadlines = DeadlineCaller()
        # Per episode index, the times its env failed: what on_error="retry" counts.
        self._failures: dict[int, int] = {}
        # With pipeline=True: each group of lanes with a step (its open round) or a reset on
        # its way, by group; and the group of each lane.
        self._groups_in_flight: dict[int, OpenRound | PendingReset] = {}
        self._group_of: dict[int, int] = {}
        # With until=: the stopping decision over the prefix of indices (docs/semantics.md,
        # "Stopping on precision"); it releases the episodes the file and hooks get.
        self.stopper = (
            None
            if settings.until is None
            else stopper_for(
                settings.until,
                env,
                cap=settings.episodes.count,
                max_episode_steps=settings.limits.max_episode_steps,
            )
        )

    # -------------------------------------------------------------------- set-up and teardown

    async def execute(self) -> RunResult:
        started = time.perf_counter()
        to_run = self._indices_to_run()
        if to_run == []:  # the results file already holds every episode asked for
            return await self._nothing_to_run()
        error: BaseException | None = None
        try:
            self._configure(to_run)
            await self._evaluate()
        except BaseException as exc:  # every failure closes the run the same way
            error = exc
        elapsed_s = time.perf_counter() - started
        result = replace(self._result(), elapsed_s=elapsed_s)
        error = await self._teardown(result, error)
        result = self._close_results(result, elapsed_s)
        if error is not None:
            if isinstance(error, Exception):
                error.partial_result = result  # type: ignore[attr-defined]
            raise error
        return result

    async def _nothing_to_run(self) -> RunResult:
        """A resumed file that is already complete: no env is made, the hooks still hear of
        the run's start and end (once each), and the result is the file's."""
        settings = self.settings
        try:
            hooks = HookDispatcher(self.hooks_argument)
            await hooks.run_start(
                {
                    "env": env_label(self.env),
                    "episodes": settings.episodes.count,
                    "base_seed": settings.episodes.base_seed,
                    "seeds": settings.episodes.seeds,
                    "completed_episodes": self.results.episodes,
                }
            )
        except BaseException:
            self.results.close()  # and with it the file's lock
            raise
        result = self._close_results(None, None)
        await hooks.run_end(result, None)
        return result

    def _indices_to_run(self) -> list[int] | None:
        """The slots this run plays: all (None), the ones asked for, less those on file."""
        episodes, results = self.settings.episodes, self.results
        if results is None:
            return episodes.indices
        if self.stopper is not None:
            self.stopper.resume(results.episodes)
            if self.stopper.stopped:  # the file's run stopped already
                return []
        return [index for index in episodes.slots if index not in results.indices]

    def _close_results(self, segment: RunResult | None, elapsed_s: float | None) -> RunResult:
        """Record this run's segment in the results file and return every episode it holds."""
        if self.results is None:
            assert segment is not None
            return segment
        if segment is not None:
            self.results.append_run(segment, elapsed_s=elapsed_s)
        result, _ = self.results.run_result()
        self.results.close()
        return self._stopped_result(result, None if segment is None else segment.stop)

    def _configure(self, indices: list[int] | None) -> None:
        settings = self.settings
        self.hooks = HookDispatcher(self.hooks_argument)
        self.handler = handler = ModelHandler(
            self.model,
            execution_horizon=settings.execution_horizon,
            ensemble=settings.ensemble is not None,
        )
        self.lanes = lanes = make_lanes(
            self.env,
            num_envs=settings.parallel.num_envs,
            workers=settings.parallel.process_workers,
            restart_workers=settings.parallel.restart_workers,
            record_latency=self._record_lanes_latency,
            render_mode=self._render_mode(),
            core=self.core_name,
        )
        self.lanes = lanes  # closed by the teardown if the recorder refuses them
        self.videos = (
            NoVideos(lanes)
            if settings.video is None
            else VideoRecorder(settings.video, lanes, lambda lanes: self.runner.observations(lanes))
        )
        self.lanes = lanes = self.videos.lanes  # with recording: takes the recorded lanes' frames
        if self.view is not None:  # the live view takes frames; its lanes' figures are ours
            self.lanes = lanes = self.view.wrap(lanes, lane_figures=self._lane_figures)
        handler.fit_lanes(lanes.num_lanes)
        if settings.parallel.pipeline:
            if lanes_pipelined(lanes) is None:
                raise ValueError(
                    f"pipeline=True overlaps the model with groups of lanes that step on their "
                    f"own, but env= gives {lanes.name} as {type(lanes).__name__}, which has no "
                    f"such groups: pass workers=2 or more (worker processes, a group each)"
                )
            self._group_of = {
                lane: group
                for group, group_lanes in enumerate(lanes.step_groups)
                for lane in group_lanes.tolist()
            }
        on_error = settings.failures.on_error
        if on_error != "raise" and lanes.rebuild is None:
            raise ValueError(
                f"on_error={on_error!r} rebuilds a lane's env after it fails, but "
                f"env= is {type(self.env).__name__} ({lanes.name}), whose envs rlmesh cannot "
                f"rebuild: pass a Gymnasium id or a zero-argument env factory (or a served "
                f"env's address), or on_error='raise'"
            )
        self.success_rule = self.success_rule.for_lanes(lanes)  # an env factory's spec
        if lanes.resets_itself and settings.limits.caps:
            raise ValueError(
                "max_episode_steps and max_episode_seconds need lanes rlmesh resets itself; "
                f"{lanes.name} restarts its lanes on its own: wrap its envs in "
                "gymnasium.wrappers.TimeLimit instead"
            )
        self.plan = plan = compile_spec(
            handler.spec,
            lanes.single_observation_space,
            lanes.single_action_space,
            env_tags=settings.env_tags or env_tags_of(lanes.metadata),
        )
        if settings.ensemble is not None:
            settings.ensemble.check_actions(plan, lanes.name)
        handler.fit_route(
            lanes.name, lanes.single_observation_space, lanes.single_action_space, plan
        )
        self.runner = self.core.RoundRunner(
            lanes.num_lanes,
            settings.episodes.count,
            plan.observation,
            plan.action,
            execution_horizon=(
                settings.execution_horizon
                if handler.chunked and settings.ensemble is None
                else None
            ),
            ensemble=None if settings.ensemble is None else settings.ensemble.m,
            seeds=settings.episodes.seeds,
            base_seed=settings.episodes.base_seed,
            trial_index_base=settings.episodes.trial_index_base,
            indices=indices,
            overflow="surplus" if lanes.lockstep else "idle",
            max_episode_steps=settings.limits.max_episode_steps,
            max_episode_seconds=settings.limits.max_episode_seconds,
        )
        self.all_lanes = np.arange(lanes.num_lanes, dtype=np.int64)
        self.telemetry = telemetry = Telemetry(
            settings.telemetry_window, time.perf_counter_ns(), core=self.core
        )
        self.hooks.record_latency = lambda ns: telemetry.record("hooks", ns)
        self._yielded_ns = time.perf_counter_ns()

    def _lane_figures(self) -> list[tuple[int, float]]:
        """Each lane's steps and return so far in its episode, from the core (the live
        view reads them in its hooks, on this thread)."""
        return [(lane["steps"], lane["reward"]) for lane in self.runner.snapshot()["lanes"]]

    def _render_mode(self) -> str | None:
        """The render mode the envs are built with: ``rgb_array`` when recorded videos or the
        live view's frames come from ``render()``."""
        video = self.settings.video
        if video is not None and video.render_mode is not None:
            return video.render_mode
        return None if self.view is None else self.view.render_mode

    def _record_lanes_latency(self, op: str, ns: int) -> None:
        """Where lanes that time work of their own (worker processes) report it."""
        self.telemetry.record(op, ns)

    async def _teardown(
        self, result: RunResult, error: BaseException | None
    ) -> BaseException | None:
        """Tell the model every owed episode end, close model and env, fire the end hooks.

        Returns the error the run ends with: the first one, or one raised here.
        """
        steps: list[Callable[[], Any]] = []
        if self.videos is not None:
            steps.append(self.videos.close)
        if self.handler is not None:
            handler = self.handler
            if self.runner is not None and handler.wants_episode_ends:
                owed = self.runner.take_all_model_ends().tolist()
                steps += [
                    lambda episode_id=episode_id: handler.episode_end(episode_id)
                    for episode_id in owed
                ]
            steps.append(handler.close)
        if self.lanes is not None and (self.settings.close_env or self._owns_env):
            steps.append(self.lanes.close)
        steps.append(self.deadlines.close)
        if self.hooks is not None:
            hooks = self.hooks
            steps.append(lambda: hooks.run_end(result, error))
        for step in steps:
            try:
                outcome = step()
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception as exc:  # teardown goes on; the first error wins
                error = error or exc
        return error

    @property
    def _owns_env(self) -> bool:
        """rlmesh made the envs (from an id or a factory), so rlmesh closes them."""
        return not isinstance(self.env, (gym.Env, gym.vector.VectorEnv))

    def _result(self) -> RunResult:
        runner = self.runner
        summaries = [] if runner is None else runner.summaries()
        telemetry = (
            () if self.telemetry is None else self.telemetry.cumulative_rows(time.perf_counter_ns())
        )
        rule, settings = self.success_rule, self.settings
        episodes = (EpisodeResult.from_summary(summary, rule) for summary in summaries)
        if self.videos is not None:  # None: the run failed before its lanes were made
            episodes = (self.videos.linked(episode) for episode in episodes)
        if self.stopper is not None:
            # Only what the stopper released: the prefix, never an episode past it.
            counted = self.stopper.counted
            episodes = (episode for episode in episodes if episode.index < counted)
        return RunResult(
            episodes=tuple(episodes),
            base_seed=settings.episodes.base_seed,
            wasted_steps=0 if runner is None else runner.wasted_steps,
            telemetry=telemetry,
            observer_errors=0 if self.hooks is None else self.hooks.observer_errors,
            core=self.core_name,
            success_rule=rule,
            episodes_requested=(settings.episodes.requested),
            stop=None if self.stopper is None else self.stopper.record(self._in_flight()),
        )

    def _in_flight(self) -> list[int]:
        """The indices of the scored episodes running now (a stopped run cancels them)."""
        if self.runner is None:
            return []
        indices, _, _ = self.runner.lane_episodes(self.runner.running_lanes())
        return [index for index in indices.tolist() if index >= 0]

    def _stopped_result(self, result: RunResult, stop: Any) -> RunResult:
        """A results file's ``result`` as a run with ``until=`` returns it: the prefix its
        stopper counted, and how it stopped (``stop``, this segment's record, else the
        stopper's now)."""
        if self.stopper is None:
            return result
        counted = self.stopper.counted
        kept = tuple(episode for episode in result.episodes if episode.index < counted)
        return replace(result, episodes=kept, stop=stop or self.stopper.record())

    @property
    def _stopped(self) -> bool:
        """The stopping rule has decided (``until=``): no episode starts any more."""
        return self.stopper is not None and self.stopper.stopped

    # -------------------------------------------------------------------- the loop

    async def _evaluate(self) -> None:
        hooks, runner = self.hooks, self.runner
        await hooks.run_start(self._context())
        await self._guard("load", self.handler.load, where="model.load")
        await self._start(self.all_lanes)  # every lane's first episode, seeded
        await self._next_episodes(NO_LANES)  # lanes that restart themselves: the baseline
        await self._probe_statefulness()
        core_runs_rounds = self._core_runs_rounds()
        while not runner.done and not self._stopped:
            if core_runs_rounds:
                await self._run_rounds()
            elif self.settings.parallel.pipeline:
                await self._pipelined_round()
            else:
                await self._round()
            now = time.perf_counter_ns()
            if self.telemetry.window_due(now):
                await hooks.telemetry(self.telemetry.take_window(now))
            if now - self._yielded_ns > YIELD_EVERY_NS:
                # Rounds whose awaits never suspend would starve the event loop: let it run,
                # so a Ctrl-C (a cancellation under asyncio.run) stops the run promptly.
                await asyncio.sleep(0)
                self._yielded_ns = now
        await self._drain_groups()

    def _core_runs_rounds(self) -> bool:
        """Whether nothing in a round needs awaiting, so the core can run whole rounds itself:
        lanes the core may step (``lanes.core_steps``), rounds that are not pipelined, a
        plain-function corner, no timeouts and no per-step hooks."""
        hooks = self.hooks
        return (
            core_steps(self.lanes) is not None
            and not self.settings.parallel.pipeline
            and self.handler.synchronous
            and not self.settings.limits.timeouts
            and not (hooks.wants_steps or hooks.wants_observations or hooks.wants_actions)
        )

    async def _run_rounds(self) -> None:
        """Rounds run by the core until an episode ends, the telemetry window closes or it is
        time to yield to the event loop; then the ended episodes finish and the next start."""
        telemetry, settings = self.telemetry, self.settings
        until_ns = min(self._yielded_ns + YIELD_EVERY_NS, telemetry.window_ends_ns)
        failures: dict[int, str] | None = None if settings.failures.on_error == "raise" else {}
        ended, infos, rounds, lane_steps = self.runner.run_rounds(
            self.handler,
            core_steps(self.lanes, every_info=self._reads_every_info()),
            self.lanes.name,
            until_ns=int(until_ns),
            stats=[telemetry.window_stats(op) for op in ROUND_OPS],
            failures=failures,
        )
        telemetry.count_steps(rounds, lane_steps)
        failed = await self._abandon(failures) if failures else NO_LANES
        await self._finish(ended, infos)
        await self._next_episodes(np.union1d(ended, failed) if len(failed) else ended)

    async def _round(self) -> None:
        """One round the driver awaits step by step (async models, lanes the core cannot step,
        timeouts, per-step hooks), through the same core phases as ``run_rounds``."""
        opened = await self._open_round()
        opened.step_started_ns = time.perf_counter_ns()
        batch, failures = await self._stepped(self.lanes.step, opened.running, opened.actions)
        await self._close_round(opened, batch, failures)

    async def _pipelined_round(self) -> None:
        """One group's turn with ``pipeline=True``: whichever group's step or reset comes back
        first is taken. A step closes its group's round; the lanes whose episodes ended get
        their resets sent, and while those envs reset the other groups step. Once a group has
        nothing on its way, its next round goes out. The first call sends every group's
        first round."""
        lanes, runner = self.lanes, self.runner
        if not self._groups_in_flight:
            for group, group_lanes in enumerate(lanes.step_groups):
                await self._send_round(group, group_lanes)
            if not self._groups_in_flight:  # no lane runs: a plain round says what happens
                await self._round()
                return
        group, outcome, failures = await self._received()
        sent = self._groups_in_flight.pop(group)
        if isinstance(sent, PendingReset):
            to_start = await self._reset_received(sent, outcome, failures)
        else:
            runner.resume_round(group)
            to_start = await self._close_round(sent, outcome, failures, start_next=False)
        if self._stopped:
            return
        if len(to_start) and await self._send_start(group, to_start):
            return
        await self._send_round(group, lanes.step_groups[group])

    async def _received(self) -> tuple[int, Any, LaneFailures | None]:
        """The group whose step or reset came back first, its outcome (a ``StepBatch`` or a
        ``ResetBatch``) and, with ``on_error`` other than ``"raise"``, the ``LaneFailures``
        of its lanes whose envs failed (the outcome then the others')."""
        kinds = {
            "reset" if isinstance(sent, PendingReset) else "step"
            for sent in self._groups_in_flight.values()
        }
        timeouts = self.settings.limits.timeouts
        # Waiting for whichever comes first, the more lenient limit of those on their way
        # holds (an op without a limit is unlimited).
        op = max(kinds, key=lambda kind: timeouts.get(kind, float("inf")))
        try:
            outcome = await self._guard(op, self.lanes.receive, where=f"env.{op}")
            failures = None
        except LaneFailures as caught:
            if self.settings.failures.on_error == "raise":
                raise
            outcome, failures = caught.outcome, caught
        if failures is not None:
            lane = next(iter(failures.errors))
        elif isinstance(outcome, StepBatch):
            lane = outcome.stepped[0]
        else:
            lane = outcome.lanes[0]
        return self._group_of[int(lane)], outcome, failures

    async def _send_start(self, group: int, lanes_to_start: np.ndarray) -> bool:
        """Start episodes on ``group``'s vacant lanes as ``_start`` does, but send their reset
        (``pipeline=True``) and return True; False when no lane resets (the slots are all
        taken: the new episodes, if any, are announced)."""
        starts = self.runner.start(lanes_to_start, now_ns=time.perf_counter_ns())
        reset = np.concatenate([starts.lanes, starts.surplus_lanes])
        if not len(reset):
            await self._announce(starts)
            return False
        seeds = list(starts.seeds) + [None] * len(starts.surplus_lanes)
        trials = starts.trials.tolist() + [None] * len(starts.surplus_lanes)
        sent_ns = time.perf_counter_ns()
        await self._guard("reset", self.lanes.send_reset, reset, seeds, trials, where="env.reset")
        self._groups_in_flight[group] = PendingReset(starts, reset, sent_ns)
        return True

    async def _reset_received(
        self, pending: PendingReset, outcome: Any, failures: LaneFailures | None
    ) -> np.ndarray:
        """Take a group's reset that came back (``pipeline=True``) as ``_start`` takes one;
        returns the lanes whose reset failed, to start again."""
        errors: dict[int, str] = {}
        if failures is not None:
            reset, observations, _ = failures.outcome
            errors = failures.errors
        else:
            reset, observations = outcome.lanes, outcome.observations
        self.telemetry.record("env.reset", time.perf_counter_ns() - pending.sent_ns)
        self.runner.set_observations(reset, observations)
        await self._announce(pending.starts, failed=errors)
        return await self._abandon(errors)

    async def _drain_groups(self) -> None:
        """Once a run stopped (``until=``), take the steps and resets still on their way to
        groups of lanes (``pipeline=True``), so every worker is idle when the lanes close;
        those steps' episodes are cancelled, their outcomes unread; a reset's episodes start,
        as they would have without the pipeline, and are cancelled with the others."""
        while self._groups_in_flight:
            try:
                group, outcome, failures = await self._received()
            except RlmeshError:
                return  # closing the lanes stops a worker still busy
            sent = self._groups_in_flight.pop(group)
            if isinstance(sent, PendingReset):
                await self._reset_received(sent, outcome, failures)

    async def _send_round(self, group: int, group_lanes: np.ndarray) -> None:
        """Open a round over ``group``'s running lanes and send its step; the round is set
        aside (``park_round``) until the step comes back."""
        opened = await self._open_round(group_lanes)
        if not len(opened.running):
            return
        self.runner.park_round(group)
        opened.step_started_ns = time.perf_counter_ns()
        self.lanes.send_step(opened.running, opened.actions, every_info=self._reads_every_info())
        self._groups_in_flight[group] = opened

    def _reads_every_info(self) -> bool:
        """Whether the run reads the info of a step that did not end its episode: step hooks
        hear every info, and a cap ends an episode on a step its env did not end, whose info
        is then final. Otherwise the lanes need send only final infos."""
        settings = self.settings
        return bool(self.hooks.wants_steps or settings.limits.caps)

    async def _open_round(self, lanes: np.ndarray | None = None) -> OpenRound:
        """Open a round over the running lanes (with ``lanes``, those among them) and take
        the model's actions for it."""
        runner = self.runner
        started_ns = time.perf_counter_ns()
        running, predict_lanes, payload = runner.begin_round(lanes)
        output, predict_ns = await self._predict(predict_lanes, payload)
        # No lane runs while a vector restarts every lane at once: it steps with no actions.
        actions = None if not len(running) else runner.take_actions(output, predict_ns)
        if actions is not None and self.hooks.wants_actions:
            actions = await self.hooks.action(running, actions)
        return OpenRound(running, predict_lanes, actions, predict_ns, started_ns)

    async def _stepped(self, step: Callable[..., Any], *args: Any) -> tuple[StepBatch, Any]:
        """``(batch, None)`` from ``step(*args)``; with ``on_error`` other than ``"raise"``,
        ``(the other lanes' batch, the LaneFailures)`` when some lanes' envs failed."""
        try:
            return await self._guard("step", step, *args, where="env.step"), None
        except LaneFailures as failures:
            if self.settings.failures.on_error == "raise":
                raise
            return failures.outcome, failures

    async def _close_round(
        self,
        opened: OpenRound,
        batch: StepBatch,
        failures: LaneFailures | None,
        *,
        start_next: bool = True,
    ) -> np.ndarray:
        """Record the step of the open round, finish the episodes that ended and start the
        next ones on their lanes (and on the lanes whose env failed); without ``start_next``,
        return those lanes, ascending, for the caller to start."""
        runner, telemetry = self.runner, self.telemetry
        running, predict_lanes, actions = opened.running, opened.predict_lanes, opened.actions
        failed = NO_LANES
        if failures is not None:
            # The failed lanes leave the round before it is recorded: the batch holds the rest.
            failed = await self._abandon(failures.errors)
            kept = ~np.isin(running, failed)
            running, predict_lanes = running[kept], predict_lanes[~np.isin(predict_lanes, failed)]
            if actions is not None:
                actions = map_leaves(actions, lambda leaf: np.asarray(leaf)[kept])
        now = time.perf_counter_ns()
        step_ns = now - opened.step_started_ns
        telemetry.record_shared("env.step", step_ns, len(batch.stepped))
        runner.set_observations(batch.stepped, batch.observations)
        ended, truncated = runner.end_round(
            batch.rewards, batch.terminated, batch.truncated, step_ns, now
        )
        if self.hooks.wants_steps:
            await self.hooks.steps(
                runner, running, predict_lanes, batch, actions, truncated, opened.predict_ns,
                step_ns,
            )  # fmt: skip
        if len(ended):  # their rows in the batch: the running lanes are ascending
            rows = np.searchsorted(running, ended).tolist()
            await self._finish(ended, [batch.infos[row] for row in rows])
        to_start = np.union1d(ended, failed) if len(failed) else ended
        if start_next:
            await self._next_episodes(to_start)
        telemetry.record("driver.round", time.perf_counter_ns() - opened.started_ns)
        telemetry.count_steps(1, len(batch.stepped))
        return to_start

    async def _predict(self, predict_lanes: np.ndarray, payload: Any) -> tuple[Any, int]:
        """The model's output for ``predict_lanes`` (None when there are none), and its time."""
        if not len(predict_lanes):
            return None, 0
        if self.hooks.wants_observations:
            payload = await self.hooks.observation(predict_lanes, payload)
        handler = self.handler
        episode_ids = None
        if handler.wants_episode_ids:
            episode_ids = self.runner.episode_ids(predict_lanes).tolist()
        started = time.perf_counter_ns()
        output = await self._guard(
            "predict",
            handler.predict,
            payload,
            len(predict_lanes),
            episode_ids,
            where=f"model.{handler.corner}",
        )
        predict_ns = time.perf_counter_ns() - started
        calls = len(predict_lanes) if handler.calls_per_lane else 1
        self.telemetry.record_shared("model.predict", predict_ns, calls)
        return output, predict_ns

    def _context(self) -> dict[str, Any]:
        lanes, settings = self.lanes, self.settings
        return {
            "env": env_label(self.env),
            "num_lanes": lanes.num_lanes,
            "lockstep": lanes.lockstep,
            "resets_itself": lanes.resets_itself,
            "episodes": settings.episodes.count,
            "base_seed": settings.episodes.base_seed,
            "seeds": settings.episodes.seeds,
            "trial_index_base": settings.episodes.trial_index_base,
            "execution_horizon": settings.execution_horizon,
            "chunked": self.handler.chunked,
            "corner": self.handler.corner,
            "core": self.core_name,
            "plan": self.plan.describe(),
            # A suite's task (its run_info names it): the live view's row for it.
            "task": (settings.output.run_info or {}).get("task"),
            # Episodes a resumed results file already holds (they are not run again).
            "completed_episodes": () if self.results is None else self.results.episodes,
        }

    async def _start(self, lanes_to_start: np.ndarray) -> None:
        """Start episodes on vacant lanes: the runner claims their slots, the lanes reset with
        the slots' seeds (surplus episodes unseeded), and the new episodes are announced.
        Lanes whose reset failed (with ``on_error`` other than ``"raise"``) start again, on
        the same slot or the next: each round of this loop finishes a slot or spends one of
        its retries, so it ends."""
        while len(lanes_to_start) and not self._stopped:
            starts = self.runner.start(lanes_to_start, now_ns=time.perf_counter_ns())
            reset = np.concatenate([starts.lanes, starts.surplus_lanes])
            errors: dict[int, str] = {}
            if len(reset):
                seeds = list(starts.seeds) + [None] * len(starts.surplus_lanes)
                trials = starts.trials.tolist() + [None] * len(starts.surplus_lanes)
                reset_start = time.perf_counter_ns()
                try:
                    observations, _ = await self._guard(
                        "reset", self.lanes.reset, reset, seeds, trials, where="env.reset"
                    )
                except LaneFailures as failures:
                    if self.settings.failures.on_error == "raise":
                        raise
                    reset, observations, _ = failures.outcome
                    errors = failures.errors
                self.telemetry.record("env.reset", time.perf_counter_ns() - reset_start)
                self.runner.set_observations(reset, observations)
            await self._announce(starts, failed=errors)
            lanes_to_start = await self._abandon(errors)

    async def _abandon(self, errors: dict[int, str]) -> np.ndarray:
        """Abandon the episodes of the lanes whose env failed (``errors``: lane -> the env's
        ``"<ExceptionType>: <message>"``): each plays its index again while ``on_error=
        "retry"`` has retries left for it, else is recorded failed; then the lanes' envs are
        rebuilt. Returns the lanes, ascending, to start episodes on again."""
        if not errors:
            return NO_LANES
        running = set(self.runner.running_lanes().tolist())
        # A served env's error ends its session: it names every lane, running or not.
        lanes = np.array(sorted(lane for lane in errors if lane in running), dtype=np.int64)
        if not len(lanes):
            return NO_LANES
        settings = self.settings
        indices, _, _ = self.runner.lane_episodes(lanes)
        outcomes: list[str | None] = []
        for lane, index in zip(lanes.tolist(), indices.tolist(), strict=True):
            failures = self._failures[index] = self._failures.get(index, 0) + 1
            retry = (
                settings.failures.on_error == "retry"
                and failures <= settings.failures.episode_retries
            )
            outcomes.append(None if retry else errors[lane])
        summaries, episode_ids, model_ends = self.runner.abandon(
            lanes, outcomes, now_ns=time.perf_counter_ns()
        )
        self.videos.abandoned(lanes)
        await self._guard(
            "episode_end",
            self.handler.end_episodes,
            episode_ids.tolist(),
            model_ends.tolist(),
            where="model.on_episode_end",
        )
        for summary in summaries:
            await self._record(EpisodeResult.from_summary(summary, self.success_rule))
        await self._guard("rebuild", self.lanes.rebuild, lanes, where="env.rebuild")
        return lanes

    async def _next_episodes(self, ended: np.ndarray) -> None:
        """Start what follows the ended episodes: the driver resets the ended lanes on the
        next slots, or, where the lanes restart themselves, the runner observes which lanes
        the env restarted (their first observations arrived with the step). Nothing, once
        the run stopped."""
        if self._stopped:
            return
        if self.lanes.resets_itself:
            starts = self.runner.observe_rolls(
                self.all_lanes, self.lanes.env_episode_ids(), now_ns=time.perf_counter_ns()
            )
            await self._announce(starts)
        elif len(ended):
            await self._start(ended)

    async def _announce(self, starts: Any, failed: Collection[int] = ()) -> None:
        """Tell the model handler of every new episode, and the hooks of the scored ones; the
        recorder of those but on the ``failed`` lanes, whose reset failed."""
        self.videos.started(starts.lanes, starts.indices, starts.seeds, failed)
        surplus = len(starts.surplus_lanes)
        self.handler.start_episodes(
            [*starts.episode_ids.tolist(), *starts.surplus_episode_ids.tolist()],
            [*starts.seeds, *[None] * surplus],
        )
        if not self.hooks.listening:
            return
        for index, seed in zip(starts.indices.tolist(), starts.seeds, strict=True):
            await self.hooks.episode_start(index, seed)

    async def _probe_statefulness(self) -> None:
        """With several lanes sharing the model, refuse one that keeps state across calls."""
        started = self.runner.running_lanes()[:2]
        if len(started) < 2:
            return
        probe = self.core.ObservationAssembler(self.plan.observation)
        first, second = self.runner.observations(started)
        sample_a = probe.assemble([first], [0])
        sample_b = probe.assemble([second], [1])
        await self._guard(
            "probe", self.handler.check_stateless, sample_a, sample_b, where="model probe"
        )

    async def _finish(self, ended: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Finish the ended episodes (``infos``: their final infos): the runner's summaries and
        evictions, then the model's, the results file's and the hooks' ends."""
        if not len(ended):
            return
        summaries, episode_ids, model_ends = self.runner.finish(
            ended, [_success(info) for info in infos]
        )
        self.videos.finished(ended)
        await self._guard(
            "episode_end",
            self.handler.end_episodes,
            episode_ids.tolist(),
            model_ends.tolist(),
            where="model.on_episode_end",
        )
        rule = self.success_rule
        if (
            self.results is None
            and not self.hooks.listening
            and not rule.calls_user_code
            and self.stopper is None
        ):
            return
        for summary in summaries:
            # A user's success rule runs here, once per episode, so its errors stop the run.
            episode = EpisodeResult.from_summary(summary, rule)
            await self._record(self.videos.linked(episode))

    async def _record(self, episode: EpisodeResult) -> None:
        """A finished episode to the results file, then to the hooks. With ``until=``, the
        stopper holds it until every lower index is in, and drops it once the run stopped:
        the file and the hooks get the prefix, in index order."""
        released = [episode] if self.stopper is None else self.stopper.offer(episode)
        for episode in released:
            if self.results is not None:
                self.results.append(episode)  # on disk before anyone hears of it
            await self.hooks.episode_end(episode)

    # -------------------------------------------------------------------- guarded calls

    async def _guard(self, op: str, fn: Callable[..., Any], *args: Any, where: str) -> Any:
        """Call an env or model operation: time-limited when ``timeouts`` names ``op`` (only
        ``reset``, ``step`` and ``predict`` can be limited; loading the model, its episode ends
        and the statefulness probe never are), with a foreign exception wrapped in the typed
        error that says where it came from. A limited call that overruns raises at its
        deadline; the call itself is abandoned (``rlmesh.deadlines``)."""
        limit = self.settings.limits.timeouts.get(op)
        try:
            if limit is None:
                outcome = fn(*args)
                return await outcome if asyncio.iscoroutine(outcome) else outcome
            return await self.deadlines.call(limit, fn, *args)
        except DeadlinePassed:
            raise OperationTimeout(
                f"{where} took longer than its {limit:g} s limit (timeouts[{op!r}]) at round "
                f"{self.runner.rounds}"
            ) from None
        except RlmeshError:
            raise
        except Exception as exc:
            raise call_failure(where, exc, self.runner.rounds) from exc
