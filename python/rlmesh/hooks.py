"""Hooks: the user's callbacks (``RunHooks``) and the runtime event stream (``RuntimeHooks``).

``RunHooks`` are part of the run: a callback that raises stops it with a ``HookError``.
``RuntimeHooks`` observe it: an observer that raises is counted
(``HookDispatcher.observer_errors``, then ``RunResult.observer_errors``) and the run goes on,
except for the two transform hooks, which change what the model sees or does and so stop the
run when they fail. Each failing observer method is logged once, with the traceback of its
first raise, and at the end of the run with how many times it raised, so an observer that
fails on every step does not flood the log. Any hook method may be a coroutine function.

Example:
    >>> import rlmesh
    >>> class CountSteps(rlmesh.RunHooks):
    ...     steps = 0
    ...     def on_step(self, event):
    ...         self.steps += 1
    >>> hooks = CountSteps()
    >>> result = rlmesh.run(lambda obs: 0, "CartPole-v1", episodes=2, hooks=hooks)
    >>> hooks.steps == result.total_steps
    True
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import HookError
from .utils import map_leaves, shares

logger = logging.getLogger("rlmesh")


@dataclass(frozen=True)
class StepEvent:
    """One scored lane-step, as ``RunHooks.on_step`` and ``RuntimeHooks.step_completed`` see it.

    ``observation`` is what the env returned for this step (the next observation), ``action``
    what it received; ``step`` counts the episode's steps from 1.

    ``step_ms`` and ``predict_ms`` are this lane's own, whatever the number of lanes: one step
    of K lanes in one call (a vector, or lanes stepped together) is charged ``1/K`` of that
    call's time to each, and one model call for P lanes ``1/P`` of its time to each lane it
    predicted for; a lane replaying a queued action of a chunk has ``predict_ms == 0``.
    """

    episode: int
    seed: int | None
    step: int
    observation: Any
    action: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict
    predict_ms: float
    step_ms: float


class RunHooks:
    """The user's callbacks; override any. ``on_run_end`` fires exactly once, also on failure.

    Order: ``on_run_start`` first; ``on_episode_start`` / ``on_episode_end`` once per scored
    episode (never for surplus ones); ``on_step`` once per scored lane-step; ``on_run_end`` last.
    """

    def on_run_start(self, context: dict[str, Any]) -> Any:
        """The run is configured: ``context`` holds its settings (env, lanes, episodes, seed)."""

    def on_episode_start(self, *, episode: int, seed: int | None) -> Any:
        """Scored episode ``episode`` (its index) was reset with ``seed``."""

    def on_step(self, event: StepEvent) -> Any:
        """One scored lane-step happened."""

    def on_episode_end(self, result: Any) -> Any:
        """A scored episode completed; ``result`` is its ``EpisodeResult``."""

    def on_run_end(self, result: Any) -> Any:
        """The run ended (or failed); ``result`` is the (partial) ``RunResult``."""


class RuntimeHooks:
    """The runtime event stream; override any. Observers that raise never stop the run.

    Session: ``session_started`` first, then ``session_ended`` or ``session_failed`` last.
    Per scored episode: ``episode_started`` ... ``episode_completed``. Per scored lane-step:
    ``observation_emitted`` (what the model is given), ``action_received`` (what it returned
    after the action plan), ``step_completed``. ``telemetry_snapshot`` every telemetry window;
    ``log`` for the driver's messages. The transforms may replace the fused model input and the
    applied action; if one raises, the run stops.
    """

    def session_started(self, context: dict[str, Any]) -> Any: ...
    def session_ended(self, result: Any) -> Any: ...
    def session_failed(self, error: BaseException, partial_result: Any) -> Any: ...
    def episode_started(self, *, episode: int, seed: int | None) -> Any: ...
    def episode_completed(self, result: Any) -> Any: ...
    def observation_emitted(self, *, lanes: Any, observation: Any) -> Any: ...
    def action_received(self, *, lanes: Any, action: Any) -> Any: ...
    def step_completed(self, event: StepEvent) -> Any: ...
    def telemetry_snapshot(self, rows: Sequence[Any]) -> Any: ...
    def log(self, level: int, message: str) -> Any: ...

    def transform_observation(self, observation: Any) -> Any:
        """The fused model input for a group, possibly replaced; the default returns it."""
        return observation

    def transform_action(self, action: Any) -> Any:
        """The applied env action for a group, possibly replaced; the default returns it."""
        return action


def _overrides(hook: object, base: type, name: str) -> bool:
    return getattr(type(hook), name, None) is not getattr(base, name)


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class HookDispatcher:
    """Fans the driver's events out to every hook given as ``hooks=``.

    ``hooks`` may be None, a ``RunHooks``, a ``RuntimeHooks``, or a list of them. The
    dispatcher knows which events anyone listens to (``wants_steps``,
    ``wants_observations``), so the driver builds per-lane events only when they are used.
    """

    def __init__(self, hooks: Any = None) -> None:
        given = (
            [] if hooks is None else list(hooks) if isinstance(hooks, (list, tuple)) else [hooks]
        )
        for hook in given:
            if not isinstance(hook, (RunHooks, RuntimeHooks)):
                raise TypeError(
                    f"hooks= takes RunHooks, RuntimeHooks or a list of them, got "
                    f"{type(hook).__name__}"
                )
        # Called with the nanoseconds each dispatch to at least one hook took (the "hooks"
        # telemetry op); the driver sets it once its telemetry exists.
        self.record_latency: Callable[[int], None] | None = None
        self.run_hooks = [hook for hook in given if isinstance(hook, RunHooks)]
        self.runtime_hooks = [hook for hook in given if isinstance(hook, RuntimeHooks)]
        self.observer_errors = 0
        # Raises per observer method, keyed by (position in runtime_hooks, method name).
        self._observer_raises: dict[tuple[int, str], int] = {}
        self.listening = bool(self.run_hooks or self.runtime_hooks)
        self.wants_steps = any(_overrides(h, RunHooks, "on_step") for h in self.run_hooks) or any(
            _overrides(h, RuntimeHooks, "step_completed") for h in self.runtime_hooks
        )
        self.wants_observations = any(
            _overrides(h, RuntimeHooks, name)
            for h in self.runtime_hooks
            for name in ("observation_emitted", "transform_observation")
        )
        self.wants_actions = any(
            _overrides(h, RuntimeHooks, name)
            for h in self.runtime_hooks
            for name in ("action_received", "transform_action")
        )

    def _timed(self, started_ns: int) -> None:
        if self.record_latency is not None:
            self.record_latency(time.perf_counter_ns() - started_ns)

    async def _call_run_hooks(self, name: str, *args: Any, **kwargs: Any) -> None:
        if not self.run_hooks:
            return
        started = time.perf_counter_ns()
        try:
            for hook in self.run_hooks:
                try:
                    await _settle(getattr(hook, name)(*args, **kwargs))
                except Exception as exc:
                    raise HookError(f"{type(hook).__name__}.{name} raised {exc!r}") from exc
        finally:
            self._timed(started)

    async def _notify(self, name: str, *args: Any, **kwargs: Any) -> None:
        if not self.runtime_hooks:
            return
        started = time.perf_counter_ns()
        for position, hook in enumerate(self.runtime_hooks):
            try:
                await _settle(getattr(hook, name)(*args, **kwargs))
            except Exception:
                self._observer_raised(position, hook, name)
        self._timed(started)

    def _observer_raised(self, position: int, hook: RuntimeHooks, name: str) -> None:
        """Count an observer's raise; log the traceback of its first one only."""
        self.observer_errors += 1
        key = (position, name)
        raises = self._observer_raises.get(key, 0) + 1
        self._observer_raises[key] = raises
        if raises == 1:
            logger.exception(
                "rlmesh: observer %s.%s raised; the run goes on (further raises of it are "
                "counted, and their number logged at the end of the run)",
                type(hook).__name__,
                name,
            )

    def _log_observer_raises(self) -> None:
        """At the end of the run: how many times each observer that raised more than once
        raised (its first traceback was logged when it happened)."""
        for (position, name), raises in self._observer_raises.items():
            if raises > 1:
                logger.error(
                    "rlmesh: observer %s.%s raised %d times in this run (the traceback of the "
                    "first was logged)",
                    type(self.runtime_hooks[position]).__name__,
                    name,
                    raises,
                )

    async def _transform(self, name: str, value: Any) -> Any:
        if not self.runtime_hooks:
            return value
        started = time.perf_counter_ns()
        try:
            for hook in self.runtime_hooks:
                try:
                    value = await _settle(getattr(hook, name)(value))
                except Exception as exc:
                    raise HookError(f"{type(hook).__name__}.{name} raised {exc!r}") from exc
        finally:
            self._timed(started)
        return value

    async def run_start(self, context: dict[str, Any]) -> None:
        await self._notify("session_started", context)
        await self._call_run_hooks("on_run_start", context)

    async def episode_start(self, episode: int, seed: int | None) -> None:
        await self._call_run_hooks("on_episode_start", episode=episode, seed=seed)
        await self._notify("episode_started", episode=episode, seed=seed)

    async def step(self, event: StepEvent) -> None:
        await self._call_run_hooks("on_step", event)
        await self._notify("step_completed", event)

    async def steps(
        self,
        runner: Any,
        running: np.ndarray,
        predict_lanes: np.ndarray,
        batch: Any,
        actions: Any,
        truncated: np.ndarray,
        predict_ns: int,
        step_ns: int,
    ) -> None:
        """A ``StepEvent`` per scored lane of a round's step, to ``on_step`` and the event
        stream (the driver calls it only when a hook listens): each lane's episode, seed and
        step from the core's ``runner``, its observation, action, reward and flags from the
        step's ``batch`` (a ``StepBatch``) and ``actions`` (``[K, ...]`` for the ``running``
        lanes ``[K]``), and its shares of the step's and the model call's times, as the
        runner charged them."""
        if not len(running):
            return
        lane_step_ns = shares(step_ns, len(running))
        lane_predict_ns = np.zeros(len(running), dtype=np.int64)
        if len(predict_lanes):
            # predict_lanes keep the order of the running lanes.
            lane_predict_ns[np.isin(running, predict_lanes)] = shares(
                predict_ns, len(predict_lanes)
            )
        indices, seeds, steps = runner.lane_episodes(running)
        observations = runner.observations(running)
        finals = batch.final_observations
        for k, index in enumerate(indices.tolist()):
            if index < 0:
                continue  # surplus episodes are never announced
            final = None if finals is None else finals[k]
            await self.step(
                StepEvent(
                    episode=index,
                    seed=seeds[k],
                    step=int(steps[k]),
                    observation=observations[k] if final is None else final,
                    action=map_leaves(actions, lambda leaf, row=k: leaf[row]),
                    reward=float(batch.rewards[k]),
                    terminated=bool(batch.terminated[k]),
                    truncated=bool(truncated[k]),
                    info=batch.infos[k],
                    predict_ms=float(lane_predict_ns[k]) / 1e6,
                    step_ms=float(lane_step_ns[k]) / 1e6,
                )
            )

    async def episode_end(self, result: Any) -> None:
        await self._call_run_hooks("on_episode_end", result)
        await self._notify("episode_completed", result)

    async def observation(self, lanes: Any, observation: Any) -> Any:
        observation = await self._transform("transform_observation", observation)
        await self._notify("observation_emitted", lanes=lanes, observation=observation)
        return observation

    async def action(self, lanes: Any, action: Any) -> Any:
        action = await self._transform("transform_action", action)
        await self._notify("action_received", lanes=lanes, action=action)
        return action

    async def telemetry(self, rows: Sequence[Any]) -> None:
        await self._notify("telemetry_snapshot", rows)

    async def run_end(self, result: Any, error: BaseException | None) -> None:
        """``session_ended`` / ``session_failed``, then ``on_run_end`` (exactly once each)."""
        if error is None:
            await self._notify("session_ended", result)
        else:
            await self._notify("session_failed", error, result)
        self._log_observer_raises()
        await self._call_run_hooks("on_run_end", result)
