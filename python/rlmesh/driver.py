"""The async driver: reset -> predict -> step over the lanes until exactly M episodes are scored.

Per round (DESIGN.md, "The loop"):

1. lanes whose episode ended are completed, and restart on the next slot (or go idle);
2. the running lanes' raw observations are assembled into the model's input (frame stacks keyed
   by episode id);
3. the model is called once for the lanes whose replay queue is empty, through the most
   specific corner it has;
4. the action plan is applied, chunks are queued per lane, and one action per lane is popped;
5. the lanes are stepped, and the ledger records rewards, terminations and timings.

The per-lane bookkeeping is the core's (``rlmesh.core``): this file only moves numpy arrays
between the core, the model and the environments, and calls the hooks.

Example:
    >>> import rlmesh
    >>> result = rlmesh.run(lambda obs: int(obs[2] > 0), "CartPole-v1", episodes=4, num_envs=2)
    >>> [episode.index for episode in result.episodes]
    [0, 1, 2, 3]
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

from .adapters import compile_spec
from .core import active, core_name, load_core
from .envs import Lanes, LaneVector, make_lanes
from .errors import OperationTimeout, RlmeshError, call_failure
from .hooks import HookDispatcher, StepEvent
from .model import ModelHandler
from .results import EpisodeResult, ResultsFile, RunResult
from .success import SuccessRule, rule_for
from .telemetry import Telemetry

TIMEOUT_OPS = ("reset", "step", "predict")
YIELD_EVERY_NS = 50_000_000
# The ops whose latencies the core's run_rounds records, in the order it takes their stats.
ROUND_OPS = ("model.predict", "env.step", "driver.round")


@dataclass(frozen=True)
class RunSettings:
    """The checked arguments of one run."""

    seeds: list[int] | None
    episodes: int
    base_seed: int
    num_envs: int | None
    execution_horizon: int
    max_episode_steps: int | None
    max_episode_seconds: float | None
    trial_index_base: int
    telemetry_window: float
    timeouts: dict[str, float]
    close_env: bool
    indices: list[int] | None = None


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _positive_float(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_settings(
    *,
    seeds: Sequence[int] | None,
    episodes: int | None,
    seed: int | None,
    num_envs: int | None,
    execution_horizon: int,
    max_episode_steps: int | None,
    max_episode_seconds: float | None,
    trial_index_base: int,
    telemetry_window: float,
    timeouts: dict[str, float] | None,
    close_env: bool,
    indices: Sequence[int] | None = None,
) -> RunSettings:
    """The run's arguments checked, with the defaults DESIGN.md gives; ValueError otherwise."""
    if seeds is not None:
        seeds = list(seeds)
        if not seeds and episodes is None:
            raise ValueError("seeds is empty: give at least one seed, or episodes=")
    if episodes is None:
        episodes = len(seeds) if seeds is not None else 1
    unknown = sorted(set(timeouts or {}) - set(TIMEOUT_OPS))
    if unknown:
        raise ValueError(f"timeouts has unknown operations {unknown}; expected {list(TIMEOUT_OPS)}")
    if isinstance(trial_index_base, bool) or not isinstance(trial_index_base, int):
        raise ValueError(
            f"trial_index_base must be a non-negative integer, got {trial_index_base!r}"
        )
    if trial_index_base < 0:
        raise ValueError(f"trial_index_base must be a non-negative integer, got {trial_index_base}")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64
    ):
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return RunSettings(
        seeds=seeds,
        episodes=_positive_int("episodes", episodes),
        base_seed=0 if seed is None else seed,
        num_envs=_positive_int("num_envs", num_envs, allow_none=True),
        execution_horizon=_positive_int("execution_horizon", execution_horizon),
        max_episode_steps=_positive_int("max_episode_steps", max_episode_steps, allow_none=True),
        max_episode_seconds=_positive_float(
            "max_episode_seconds", max_episode_seconds, allow_none=True
        ),
        trial_index_base=trial_index_base,
        telemetry_window=_positive_float("telemetry_window", telemetry_window),
        timeouts={
            op: _positive_float(f"timeouts[{op!r}]", limit)
            for op, limit in (timeouts or {}).items()
        },
        close_env=bool(close_env),
        indices=None if indices is None else list(indices),
    )


def run(model: Any, env: Any, **kwargs: Any) -> RunResult:
    """Evaluate ``model`` on ``env`` and return exactly the episodes asked for.

    Takes the arguments of ``arun``. Inside a running event loop, ``await arun(...)`` instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "rlmesh.run() was called inside a running event loop; use `await rlmesh.arun(...)` "
            "there"
        )
    returned: list[RunResult] = []

    async def evaluate() -> None:
        returned.append(await arun(model, env, **kwargs))

    # The result is handed out of the task rather than returned by it: closing asyncio.run's
    # runner can format its task's repr, result included, which for a long run means a repr
    # of every episode.
    asyncio.run(evaluate())
    return returned[0]


async def arun(
    model: Any,
    env: Any,
    *,
    seeds: Sequence[int] | None = None,
    episodes: int | None = None,
    seed: int | None = None,
    num_envs: int | None = None,
    execution_horizon: int = 1,
    max_episode_steps: int | None = None,
    max_episode_seconds: float | None = None,
    hooks: Any = None,
    trial_index_base: int = 0,
    telemetry_window: float = 1.0,
    timeouts: dict[str, float] | None = None,
    close_env: bool = False,
    core: str | None = None,
    indices: Sequence[int] | None = None,
    results_path: str | os.PathLike[str] | None = None,
    resume: bool = False,
    run_info: dict[str, Any] | None = None,
    success: Any = None,
) -> RunResult:
    """Evaluate ``model`` on ``env``: the coroutine behind ``rlmesh.run``.

    Args:
        model: a ``rlmesh.Model`` (corners ``predict``, ``predict_batch``, ``predict_chunk``,
            ``predict_chunk_batch``), a ``Model(callable)``, or a bare callable (a ``predict``).
        env: a Gymnasium id, a ``gymnasium.Env`` (one lane), a zero-argument factory of envs,
            or a ``gymnasium.vector.VectorEnv`` (its lanes, in lockstep).
        seeds: slot k resets with ``seeds[k]``; ``episodes`` defaults to ``len(seeds)``.
        episodes: how many episodes to score, M (default: ``len(seeds)``, else 1).
        seed: the base seed (default 0): slot k without a listed seed resets with
            ``episode_seed(seed, trial_index_base + k)``.
        num_envs: lanes to build from an id or a factory (default 1).
        execution_horizon: actions replayed per chunk (needs a chunk corner).
        max_episode_steps, max_episode_seconds: truncate an episode at this many steps or
            seconds of wall clock.
        hooks: ``RunHooks``, ``RuntimeHooks`` or a list of them.
        trial_index_base: the global index of slot 0 (a shard of a larger evaluation).
        telemetry_window: seconds between telemetry snapshots.
        timeouts: per-operation limits in seconds: ``{"reset": .., "step": .., "predict": ..}``.
        close_env: also close an env instance or vector the caller passed in (rlmesh always
            closes the envs it made).
        core: ``"rust"`` or ``"python"``; default the active core (``RLMESH_CORE``).
        indices: run only these episode indices (strictly increasing, in ``0..M-1``), with the
            seeds and trials they have in the full run: a shard, or the rest of a run.
        results_path: write a JSONL results file: a header line with the run's configuration
            (and ``run_info``), then one line per episode as it completes, flushed.
        resume: with ``results_path``, continue that file: its header must match this run;
            the episodes it holds are skipped, the missing ones run and are appended.
        run_info: extra header fields (e.g. the policy's name), checked on resume too.
        success: how an episode whose env's final info reports no ``is_success`` /
            ``success`` is judged (``rlmesh.success``): a callable ``fn(EpisodeResult) ->
            bool``, or a number R (success iff the episode's reward >= R). Default: reward
            >= the env spec's ``reward_threshold``, else success is not available (None).
            Recorded in the results file header, checked on resume.

    Returns:
        The ``RunResult``: M episodes sorted by index (with ``results_path``, every episode in
        the file), wasted steps and telemetry.

    Raises:
        RlmeshError: a typed error (model output, env, hook, timeout, spec); it carries the
            episodes completed before it as ``err.partial_result``.
    """
    settings = check_settings(
        seeds=seeds,
        episodes=episodes,
        seed=seed,
        num_envs=num_envs,
        execution_horizon=execution_horizon,
        max_episode_steps=max_episode_steps,
        max_episode_seconds=max_episode_seconds,
        trial_index_base=trial_index_base,
        telemetry_window=telemetry_window,
        timeouts=timeouts,
        close_env=close_env,
        indices=indices,
    )
    success_rule = rule_for(success, env)
    results = None
    if results_path is not None:
        header = _results_header(env, settings, core, run_info)
        header["success_rule"] = success_rule.to_json()
        results = ResultsFile.open(results_path, header, resume=resume)
    run = EvaluationRun(
        model, env, settings, hooks=hooks, core=core, results=results, success_rule=success_rule
    )
    return await run.execute()


def _results_header(
    env: Any, settings: RunSettings, core: str | None, run_info: dict[str, Any] | None
) -> dict[str, Any]:
    """What a results file records of the run, and what a resumed run must match."""
    return {
        "env": env if isinstance(env, str) else type(env).__name__,
        "episodes": settings.episodes,
        "seed": settings.base_seed,
        "seeds": settings.seeds,
        "horizon": settings.execution_horizon,
        "max_episode_steps": settings.max_episode_steps,
        "max_episode_seconds": settings.max_episode_seconds,
        "trial_index_base": settings.trial_index_base,
        "rlmesh_version": _version(),
        "core": core or core_name(),
        **(run_info or {}),
    }


def _version() -> str:
    from . import __version__

    return __version__


def _success(info: dict) -> bool | None:
    """What the final ``info`` says of success: ``is_success``, else ``success``, else None."""
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return None


def _map_leaves(tree: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """``fn`` applied to every array of a (nested) dict of arrays, or to the array itself."""
    if isinstance(tree, dict):
        return {key: _map_leaves(value, fn) for key, value in tree.items()}
    return fn(tree)


def _scatter(target: Any, rows: np.ndarray, values: Any) -> None:
    """``target[rows] = values`` leaf by leaf (a dict action fills each of its arrays)."""
    if isinstance(target, dict):
        for key in target:
            _scatter(target[key], rows, values[key])
    else:
        target[rows] = values


class EvaluationRun:
    """One evaluation: the lanes, the model, the core's state and the hooks, from start to end."""

    def __init__(
        self,
        model: Any,
        env: Any,
        settings: RunSettings,
        *,
        hooks: Any,
        core: str | None,
        results: ResultsFile | None = None,
        success_rule: SuccessRule | None = None,
    ) -> None:
        self.settings = settings
        self.success_rule = rule_for(None, env) if success_rule is None else success_rule
        self.hooks_argument = hooks
        self.results = results
        self.core = active if core is None else load_core(core)
        self.env = env
        self.model = model
        self.hooks: HookDispatcher | None = None
        self.lanes: Lanes | None = None
        self.handler: ModelHandler | None = None
        self.ledger: Any = None
        self.telemetry: Telemetry | None = None
        self.runner: Any = None

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
        hooks = HookDispatcher(self.hooks_argument)
        settings = self.settings
        await hooks.run_start(
            {
                "env": self.env if isinstance(self.env, str) else type(self.env).__name__,
                "episodes": settings.episodes,
                "base_seed": settings.base_seed,
                "seeds": settings.seeds,
                "completed_episodes": self.results.episodes,
            }
        )
        result = self._close_results(None, None)
        await hooks.run_end(result, None)
        return result

    def _indices_to_run(self) -> list[int] | None:
        """The slots this run plays: all (None), the ones asked for, less those on file."""
        indices = self.settings.indices
        if self.results is None:
            return indices
        wanted = range(self.settings.episodes) if indices is None else indices
        return [index for index in wanted if index not in self.results.indices]

    def _close_results(self, segment: RunResult | None, elapsed_s: float | None) -> RunResult:
        """Record this run's segment in the results file and return every episode it holds."""
        if self.results is None:
            assert segment is not None
            return segment
        if segment is not None:
            self.results.append_run(segment, elapsed_s=elapsed_s)
        result, _ = self.results.run_result()
        self.results.close()
        return result

    def _configure(self, indices: list[int] | None) -> None:
        settings = self.settings
        self.hooks = HookDispatcher(self.hooks_argument)
        self.handler = ModelHandler(self.model, execution_horizon=settings.execution_horizon)
        self.lanes = make_lanes(self.env, num_envs=settings.num_envs)
        lanes = self.lanes
        self.success_rule = self.success_rule.for_lanes(lanes)  # an env factory's spec
        if lanes.autoreset != "driver" and (
            settings.max_episode_steps or settings.max_episode_seconds
        ):
            raise ValueError(
                "max_episode_steps and max_episode_seconds need a vector rlmesh resets itself; "
                f"this VectorEnv autoresets ({lanes.autoreset}): wrap its envs in "
                "gymnasium.wrappers.TimeLimit instead"
            )
        plan = compile_spec(
            self.handler.spec, lanes.single_observation_space, lanes.single_action_space
        )
        self.plan = plan
        core = self.core
        self.ledger = core.RouteLedger(
            lanes.num_lanes,
            settings.episodes,
            seeds=settings.seeds,
            base_seed=settings.base_seed,
            trial_index_base=settings.trial_index_base,
            indices=indices,
        )
        self.runner = core.RoundRunner(
            self.ledger,
            core.ObservationAssembler(plan.observation),
            core.ActionApplier(plan.action),
            (
                core.ChunkQueues(lanes.num_lanes, settings.execution_horizon)
                if self.handler.chunked
                else None
            ),
            max_episode_steps=settings.max_episode_steps,
            max_episode_seconds=settings.max_episode_seconds,
        )
        self.all_lanes = np.arange(lanes.num_lanes, dtype=np.int64)
        # Per lane: the scored episode's index (-1 for surplus or none) and seed, for hooks.
        self.lane_index = np.full(lanes.num_lanes, -1, dtype=np.int64)
        self.lane_seed: list[int | None] = [None] * lanes.num_lanes
        self.telemetry = Telemetry(settings.telemetry_window, time.perf_counter_ns(), core=core)
        telemetry = self.telemetry
        self.hooks.record_latency = lambda ns: telemetry.record("hooks", ns)
        self._yielded_ns = time.perf_counter_ns()

    async def _teardown(
        self, result: RunResult, error: BaseException | None
    ) -> BaseException | None:
        """Tell the model every owed episode end, close model and env, fire the end hooks.

        Returns the error the run ends with: the first one, or one raised here.
        """
        steps: list[Callable[[], Any]] = []
        if self.handler is not None:
            handler = self.handler
            if self.ledger is not None and handler.wants_episode_ends:
                owed = self.ledger.take_all_model_ends().tolist()
                steps += [
                    lambda episode_id=episode_id: handler.episode_end(episode_id)
                    for episode_id in owed
                ]
            steps.append(handler.close)
        if self.lanes is not None and (self.settings.close_env or self._owns_env):
            steps.append(self.lanes.close)
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
        ledger = self.ledger
        summaries = [] if ledger is None else ledger.summaries()
        telemetry = (
            () if self.telemetry is None else self.telemetry.cumulative_rows(time.perf_counter_ns())
        )
        rule, settings = self.success_rule, self.settings
        return RunResult(
            episodes=tuple(EpisodeResult.from_summary(summary, rule) for summary in summaries),
            base_seed=settings.base_seed,
            wasted_steps=0 if ledger is None else ledger.wasted_steps,
            telemetry=telemetry,
            observer_errors=0 if self.hooks is None else self.hooks.observer_errors,
            core="python" if self.core is load_core("python") else "rust",
            success_rule=rule,
            episodes_requested=(
                settings.episodes if settings.indices is None else len(settings.indices)
            ),
        )

    # -------------------------------------------------------------------- the loop

    async def _evaluate(self) -> None:
        lanes, hooks = self.lanes, self.hooks
        await hooks.run_start(self._context())
        await self._guard("load", self.handler.load, where="model.load")
        await self._start(self.all_lanes)
        if lanes.autoreset != "driver":
            self.ledger.observe_rolls(
                self.all_lanes, lanes.env_episode_ids(), now_ns=time.perf_counter_ns()
            )
        await self._probe_statefulness()
        synchronous = self._synchronous_rounds()
        while not self.ledger.done:
            if synchronous:
                await self._run_rounds()
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

    def _synchronous_rounds(self) -> bool:
        """Whether nothing in a round needs awaiting, so the core can run whole rounds itself:
        per-lane Gymnasium envs, a plain-function corner, no timeouts, no per-step hooks."""
        hooks = self.hooks
        return (
            isinstance(self.lanes, LaneVector)
            and self.handler.synchronous
            and not self.settings.timeouts
            and not (hooks.wants_steps or hooks.wants_observations or hooks.wants_actions)
        )

    async def _run_rounds(self) -> None:
        """Rounds run by the core until an episode ends, the telemetry window closes or it is
        time to yield to the event loop; then the ended episodes are completed and restarted."""
        telemetry = self.telemetry
        until_ns = min(self._yielded_ns + YIELD_EVERY_NS, telemetry.window_ends_ns)
        ended, infos, rounds, lane_steps = self.runner.run_rounds(
            self.handler,
            self.lanes.env_steps,
            self.lanes.name,
            until_ns=int(until_ns),
            stats=[telemetry.window_stats(op) for op in ROUND_OPS],
        )
        telemetry.count_steps(rounds, lane_steps)
        if len(ended):
            await self._finish(ended, infos)
            await self._start(ended)

    async def _round(self) -> None:
        """One round the driver awaits step by step (async models, a lockstep vector,
        timeouts, per-step hooks), through the same core phases as ``run_rounds``."""
        lanes, hooks, runner, telemetry = self.lanes, self.hooks, self.runner, self.telemetry
        round_start = time.perf_counter_ns()
        running, predict_lanes, payload = runner.begin_round()
        output, predict_ns = None, 0
        if len(predict_lanes):
            if hooks.wants_observations:
                payload = await hooks.observation(predict_lanes, payload)
            predict_start = time.perf_counter_ns()
            episode_ids = None
            if self.handler.wants_episode_ids:
                episode_ids = self.ledger.episode_ids(predict_lanes).tolist()
            output = await self._guard(
                "predict",
                self.handler.predict,
                payload,
                len(predict_lanes),
                episode_ids,
                where=f"model.{self.handler.corner}",
            )
            predict_ns = time.perf_counter_ns() - predict_start
            telemetry.record("model.predict", predict_ns)
        actions = None  # every lane of an autoresetting vector is between episodes this step
        if len(running):
            actions = runner.take_actions(output, predict_ns)
            if hooks.wants_actions:
                actions = await hooks.action(running, actions)
        stepped = self.all_lanes if lanes.lockstep else running
        if lanes.lockstep and len(running) < lanes.num_lanes:
            actions = self._fill_idle_lanes(running, actions)
        step_start = time.perf_counter_ns()
        batch = await self._guard("step", lanes.step, stepped, actions, where="env.step")
        now = time.perf_counter_ns()
        step_ns = now - step_start
        telemetry.record("env.step", step_ns)
        runner.set_observations(stepped, batch.observations)
        rows = running if lanes.lockstep else slice(None)
        rewards, terminated = batch.rewards[rows], batch.terminated[rows]
        ended, truncated = runner.end_round(
            rewards, terminated, batch.truncated[rows], step_ns, now
        )
        if hooks.wants_steps:
            positions = running if lanes.lockstep else np.arange(len(running))
            lane_predict_ns = np.where(np.isin(running, predict_lanes), predict_ns, 0)
            flags = (rewards, terminated, truncated, lane_predict_ns, step_ns)
            await self._step_events(running, positions, batch, actions, flags)
        if len(ended):
            position_of = {lane: k for k, lane in enumerate(stepped.tolist())}
            await self._finish(ended, [batch.infos[position_of[lane]] for lane in ended.tolist()])
        if lanes.autoreset == "driver":
            if len(ended):
                await self._start(ended)
        else:
            starts = self.ledger.observe_rolls(self.all_lanes, lanes.env_episode_ids(), now_ns=now)
            await self._announce(starts)
        telemetry.record("driver.round", time.perf_counter_ns() - round_start)
        telemetry.count_steps(1, len(stepped))

    def _context(self) -> dict[str, Any]:
        lanes, settings = self.lanes, self.settings
        return {
            "env": self.env if isinstance(self.env, str) else type(self.env).__name__,
            "num_lanes": lanes.num_lanes,
            "lockstep": lanes.lockstep,
            "autoreset": lanes.autoreset,
            "episodes": settings.episodes,
            "base_seed": settings.base_seed,
            "seeds": settings.seeds,
            "trial_index_base": settings.trial_index_base,
            "execution_horizon": settings.execution_horizon,
            "chunked": self.handler.chunked,
            "corner": self.handler.corner,
            "core": "python" if self.core is load_core("python") else "rust",
            "plan": self.plan.describe(),
            # Episodes a resumed results file already holds (they are not run again).
            "completed_episodes": () if self.results is None else self.results.episodes,
        }

    async def _start(self, lanes_to_start: np.ndarray) -> None:
        """Claim slots for vacant lanes, reset them with their seeds, announce scored starts."""
        overflow = "surplus" if self.lanes.lockstep else "idle"
        starts = self.ledger.start_episodes(
            lanes_to_start, now_ns=time.perf_counter_ns(), overflow=overflow
        )
        reset = np.concatenate([starts.lanes, starts.surplus_lanes])
        if len(reset):
            seeds = list(starts.seeds) + [None] * len(starts.surplus_lanes)
            trials = starts.trials.tolist() + [None] * len(starts.surplus_lanes)
            reset_start = time.perf_counter_ns()
            observations, _ = await self._guard(
                "reset", self.lanes.reset, reset, seeds, trials, where="env.reset"
            )
            self.telemetry.record("env.reset", time.perf_counter_ns() - reset_start)
            self.runner.set_observations(reset, observations)
        await self._announce(starts)

    async def _announce(self, starts: Any) -> None:
        """Note the new episodes' lanes, and tell the hooks of the scored ones."""
        now = time.perf_counter_ns()
        new_lanes = np.concatenate([starts.lanes, starts.surplus_lanes])
        self.runner.start_lanes(new_lanes, now_ns=now)
        self.lane_index[starts.surplus_lanes] = -1
        self.lane_index[starts.lanes] = starts.indices
        contexts = self.handler.contexts
        if contexts is not None:
            seeds = [*starts.seeds, *[None] * len(starts.surplus_lanes)]
            contexts.start(self.ledger.episode_ids(new_lanes).tolist(), seeds)
        if not self.hooks.listening:
            return
        for lane, index, seed in zip(
            starts.lanes.tolist(), starts.indices.tolist(), starts.seeds, strict=True
        ):
            self.lane_seed[lane] = seed
            await self.hooks.episode_start(index, seed)

    async def _probe_statefulness(self) -> None:
        """With several lanes sharing the model, refuse one that keeps state across calls."""
        started = self.ledger.running_lanes()[:2]
        if len(started) < 2:
            return
        probe = self.core.ObservationAssembler(self.plan.observation)
        first, second = self.runner.observations(started)
        sample_a = probe.assemble([first], [0])
        sample_b = probe.assemble([second], [1])
        await self._guard(
            "probe", self.handler.check_stateless, sample_a, sample_b, where="model probe"
        )

    def _fill_idle_lanes(self, running: np.ndarray, actions: Any) -> Any:
        """A lockstep vector steps every lane: lanes without an episode (autoresetting on
        this step) get a placeholder action the env ignores."""
        full = create_empty_array(
            self.lanes.single_action_space, n=self.lanes.num_lanes, fn=np.zeros
        )
        if len(running):
            _scatter(full, running, actions)
        return full

    async def _step_events(
        self, running: np.ndarray, positions: np.ndarray, batch: Any, actions: Any, flags: tuple
    ) -> None:
        """A ``StepEvent`` per scored lane of this step (only built when a hook listens)."""
        rewards, terminated, truncated, predict_ns, step_ns = flags
        steps = self.runner.episode_steps(running)
        for k, lane in enumerate(running.tolist()):
            index = int(self.lane_index[lane])
            if index < 0:
                continue  # surplus episodes are never announced
            position = int(positions[k])
            final = batch.final_observations[position] if batch.final_observations else None
            await self.hooks.step(
                StepEvent(
                    episode=index,
                    seed=self.lane_seed[lane],
                    step=int(steps[k]),
                    observation=batch.observations[position] if final is None else final,
                    action=_map_leaves(actions, lambda leaf, row=position: leaf[row]),
                    reward=float(rewards[k]),
                    terminated=bool(terminated[k]),
                    truncated=bool(truncated[k]),
                    info=batch.infos[position],
                    predict_ms=predict_ns[k] / 1e6,
                    step_ms=step_ns / 1e6,
                )
            )

    async def _finish(self, ended: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Complete the ended episodes (``infos``: their final infos): summaries, evictions,
        the model's and hooks' ends."""
        ledger = self.ledger
        ended_ids = ledger.episode_ids(ended)
        successes = [_success(info) for info in infos]
        summaries = ledger.complete_episodes(
            ended, ended_ids, successes, now_ns=time.perf_counter_ns()
        )
        self.runner.forget_episodes(ended_ids)
        if self.handler.contexts is not None:
            self.handler.contexts.end(ended_ids.tolist())
        model_ends = ledger.take_model_ends(ended_ids)
        if self.handler.wants_episode_ends:
            for episode_id in model_ends.tolist():
                await self._guard(
                    "episode_end",
                    self.handler.episode_end,
                    episode_id,
                    where="model.on_episode_end",
                )
        rule = self.success_rule
        if self.results is None and not self.hooks.listening and not rule.calls_user_code:
            return
        for summary in summaries:
            # A user's success rule runs here, once per episode, so its errors stop the run.
            episode = EpisodeResult.from_summary(summary, rule)
            if self.results is not None:
                self.results.append(episode)  # on disk before anyone hears of it
            await self.hooks.episode_end(episode)

    # -------------------------------------------------------------------- guarded calls

    async def _guard(self, op: str, fn: Callable[..., Any], *args: Any, where: str) -> Any:
        """Call an env or model operation: time-limited when ``timeouts`` names ``op`` (only
        ``reset``, ``step`` and ``predict`` can be limited; loading the model, its episode ends
        and the statefulness probe never are), with a foreign exception wrapped in the typed
        error that says where it came from."""
        limit = self.settings.timeouts.get(op)
        try:
            if limit is None:
                outcome = fn(*args)
                return await outcome if asyncio.iscoroutine(outcome) else outcome
            return await asyncio.wait_for(asyncio.to_thread(_call_blocking, fn, *args), limit)
        except (TimeoutError, asyncio.TimeoutError):
            raise OperationTimeout(
                f"{where} took longer than its {limit:g} s limit (timeouts[{op!r}]) at round "
                f"{self.runner.rounds}"
            ) from None
        except RlmeshError:
            raise
        except Exception as exc:
            raise call_failure(where, exc, self.runner.rounds) from exc


def _call_blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a worker thread, driving it to completion if it is a coroutine."""
    outcome = fn(*args)
    return asyncio.run(outcome) if asyncio.iscoroutine(outcome) else outcome
