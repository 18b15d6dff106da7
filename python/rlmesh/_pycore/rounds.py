"""The one owner of a run's episode lifecycle: episodes started, rounds run, episodes finished.

Mirrors ``rust/src/rounds.rs`` name for name. This file is the executable specification: the
Rust core must produce the same results and raise the same error types and messages.

``RoundRunner`` owns every per-lane piece of a run: the ``RouteLedger`` (slots, seeds, episode
ids, each lane's step count and clock), the ``ObservationAssembler`` (frame windows keyed by
episode), the ``ActionApplier`` and the ``ChunkQueues`` (per-lane replay queues). The driver
talks to the runner only:

- ``start(lanes)`` -> ``EpisodeStarts``: claim slots for vacant lanes (seeds, trials, ids);
  the driver then resets those lanes and hands their first observations to
  ``set_observations``. ``observe_rolls`` does the same for lanes an autoresetting vector
  restarted itself.
- a round (docs/semantics.md, "The loop"), in three phases the async driver calls around its awaits:
  ``begin_round()`` -> the running lanes, the lanes to predict for and their payload;
  ``take_actions(output, predict_ns)`` -> one env action per running lane;
  ``end_round(rewards, terminated, truncated, step_ns, now_ns)`` -> the lanes whose episode
  ended (after ``max_episode_steps`` / ``max_episode_seconds``).
- ``finish(lanes, successes)`` -> the ended episodes' summaries, ids and the ends owed to the
  model; their frame windows and queued actions go in the same call.

When nothing in a round needs awaiting (a synchronous model, lanes that step each env alone in
process, no timeouts, no per-step hooks), ``run_rounds`` chains the three phases itself,
calling the model and every lane's env ``step`` in the core, until an episode ends or a
deadline passes. That is the hot path: the driver's Python runs once per episode end, not once
per step.

One clock per lane: an episode's time runs from its ``start`` (just before its reset call) to
the return of its last ``step``; ``duration_s`` and ``max_episode_seconds`` both read it.

One running digest per lane (``digests.LaneDigests``): the first observation an episode's lane
is given (``set_observations`` after ``start``, or the one ``observe_rolls`` finds) is its
reset digest; every action the runner hands out, every observation a step returns and every
step ``end_round`` records fold into its trajectory digest, which ``finish`` and ``abandon``
put in the summary. It starts afresh with each episode, whichever path the step took.

Per-lane timings: an episode's ``step_ms`` and ``predict_ms`` are its own, whatever the number
of lanes. ``run_rounds`` times each lane's env step on its own and charges the lane that time;
one step or one model call that covers several lanes (``end_round``'s ``step_ns`` over the
``K`` running lanes, ``take_actions``' ``predict_ns`` over the ``P`` predicted lanes) is
charged in equal ``shares`` that add up to it, as telemetry records such a call.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh.adapters import compile_spec
    >>> from rlmesh._pycore import LatencyStats
    >>> envs = [gym.make("CartPole-v1") for _ in range(2)]
    >>> plan = compile_spec(None, envs[0].observation_space, envs[0].action_space)
    >>> runner = RoundRunner(2, 2, plan.observation, plan.action, max_episode_steps=5)
    >>> starts = runner.start(np.arange(2), now_ns=0)
    >>> runner.set_observations(starts.lanes, [env.reset(seed=s)[0] for env, s in
    ...                                        zip(envs, starts.seeds)])
    >>> import asyncio
    >>> from rlmesh.model import ModelHandler
    >>> model = ModelHandler(lambda obs: 0)  # obs [4] -> a push to the left
    >>> asyncio.run(model.load())
    >>> stats = [LatencyStats() for _ in range(3)]
    >>> ended, infos, rounds, lane_steps = runner.run_rounds(
    ...     model, [env.step for env in envs], "CartPole-v1", until_ns=2**62, stats=stats)
    >>> ended.tolist(), rounds, lane_steps, runner.rounds  # both truncated at 5 steps
    ([0, 1], 5, 10, 5)
    >>> summaries, episode_ids, owed = runner.finish(ended, [None, None])
    >>> [s.steps for s in summaries], runner.done
    ([5, 5], True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import LaneFailures, RlmeshError
from ..utils import env_failure, lane_actions, map_leaves, shares
from .actions import ActionApplier
from .args import i64_arg, vector
from .assembly import ObservationAssembler
from .chunks import ChunkQueues, split_chunk
from .digests import LaneDigests
from .ensembles import TemporalEnsembles
from .ledger import OVERFLOWS, RUNNING, EpisodeStarts, EpisodeSummary, RouteLedger

if TYPE_CHECKING:
    from ..core import RoundModel

NS_PER_S = 1e9
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def record_shared(stats: Any, ns: int, count: int) -> None:
    """``count`` calls that one timing of ``ns`` spans, into ``stats``: their ``shares``."""
    stats.record_many(shares(ns, count))


def duration_arg(value: Any, name: str) -> int:
    """``value`` as a duration in nanoseconds: an int64 that is not negative."""
    ns = i64_arg(value, name)
    if ns < 0:
        raise ValueError(f"{name} must be a duration in nanoseconds (>= 0), got {ns}")
    return ns


def lane_text(lane: int, index: int, step: int) -> str:
    """How an error names a lane's episode at a step: ``lane 2 (episode index 7, step 12)``, or
    ``lane 2 (surplus episode, step 12)`` for an episode that is never scored (index -1).
    ``step`` is the steps the episode took before the action in question (0: its first action).
    """
    if index < 0:
        return f"lane {lane} (surplus episode, step {step})"
    return f"lane {lane} (episode index {index}, step {step})"


def _first_actions(leaf: Any, kept: int) -> np.ndarray:
    """Each lane's first ``kept`` actions of a chunk leaf ``[K, H, ...]``: ``[K * kept, ...]``."""
    leaf = np.asarray(leaf)
    return leaf[:, :kept].reshape(leaf.shape[0] * kept, *leaf.shape[2:])


def _step_cap(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"max_episode_steps must be None or a positive integer, got {value!r}")
    return int(value)


def _time_cap_ns(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"max_episode_seconds must be None or a positive number, got {value!r}")
    return float(value) * NS_PER_S


class RoundRunner:
    """Every per-lane part of one run: episode lifecycle, rounds, frame windows, chunk queues.

    Args:
        num_lanes: ``N >= 1`` lanes, numbered ``0..N-1``.
        episodes: the budget ``M >= 1``; slots ``0..M-1`` are scored (see ``RouteLedger``).
        observation_plan: ``Plan.observation``, the model input's leaves.
        action_plan: ``Plan.action``, the action leaves.
        execution_horizon: None when the model returns one action per lane per prediction;
            ``E >= 1`` when it returns chunks ``[K, H, ...]``, of which each lane replays at
            most ``E`` actions from its own queue.
        ensemble: None, or ``m >= 0`` for temporal ensembling (``ensembles``): the model
            returns chunks ``[K, H, ...]`` for every running lane at every step, and each
            lane executes the ``exp(-m * i)``-weighted average of its episode's chunks that
            cover the step. Not with ``execution_horizon``.
        seeds, base_seed, trial_index_base, indices: the slots' seeds and trials, as
            ``RouteLedger`` takes them.
        overflow: what a lane does when ``start`` finds no slot left: ``"idle"`` (lanes that
            step alone: it is never stepped again) or ``"surplus"`` (a lockstep vector: it
            runs an unscored episode).
        max_episode_steps: truncate an episode once it took this many steps.
        max_episode_seconds: truncate an episode once this many seconds passed on its clock.
        digests: keep each episode's ``reset_digest`` and ``trajectory_digest`` (``digests``).
            For measuring what they cost only: a run always keeps them.

    Raises:
        ValueError: what ``RouteLedger`` refuses, an unknown ``overflow``, a cap that is
            not a positive number, an ``ensemble`` rate that is not a finite number >= 0, or
            both ``ensemble`` and ``execution_horizon``.
        TypeError: ``digests`` is not a bool.
    """

    def __init__(
        self,
        num_lanes: int,
        episodes: int,
        observation_plan: Sequence[Any],
        action_plan: Sequence[Any],
        *,
        execution_horizon: int | None = None,
        ensemble: float | None = None,
        seeds: Sequence[int] | None = None,
        base_seed: int | None = 0,
        trial_index_base: int | None = 0,
        indices: Sequence[int] | None = None,
        overflow: str = "idle",
        max_episode_steps: int | None = None,
        max_episode_seconds: float | None = None,
        digests: bool = True,
    ) -> None:
        if overflow not in OVERFLOWS:
            raise ValueError(f"overflow must be 'idle' or 'surplus', got {overflow!r}")
        if ensemble is not None and execution_horizon is not None:
            raise ValueError(
                "ensemble and execution_horizon are two ways to execute chunks: a run "
                "averages every step's chunks (ensemble) or replays one chunk's actions "
                "(execution_horizon), not both"
            )
        self._ledger = RouteLedger(
            num_lanes,
            episodes,
            seeds=seeds,
            base_seed=base_seed,
            trial_index_base=trial_index_base,
            indices=indices,
        )
        self._assembler = ObservationAssembler(observation_plan)
        self._applier = ActionApplier(action_plan)
        self._queues = (
            None if execution_horizon is None else ChunkQueues(num_lanes, execution_horizon)
        )
        self._ensembles = None if ensemble is None else TemporalEnsembles(num_lanes, ensemble)
        self._overflow = overflow
        self._max_steps = _step_cap(max_episode_steps)
        self._max_ns = _time_cap_ns(max_episode_seconds)
        if not isinstance(digests, bool):
            raise TypeError(f"digests must be a bool, got {type(digests).__name__}")
        num_lanes = self._ledger.num_lanes
        self._observations: list[Any] = [None] * num_lanes
        # When each lane's episode took its last step: the end of its clock.
        self._ended_ns = [0] * num_lanes
        self._rounds = 0
        # The open round: its running lanes, the lanes predicted for, each running lane's
        # model time.
        self._running: list[int] = []
        self._predict_lanes: list[int] = []
        self._predict_ns: list[int] = []
        # Rounds set aside by park_round, by key, while their lanes' envs step; a parked lane
        # is in no other round until its round is resumed.
        self._parked: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self._in_parked_round: set[int] = set()
        self._digests = LaneDigests(num_lanes, digests)

    # ------------------------------------------------------------------ the run

    @property
    def num_lanes(self) -> int:
        return self._ledger.num_lanes

    @property
    def rounds(self) -> int:
        """Rounds recorded so far (``end_round`` calls, and the rounds of ``run_rounds``)."""
        return self._rounds

    @property
    def done(self) -> bool:
        """True once every slot the run plays has been finished."""
        return self._ledger.done

    @property
    def wasted_steps(self) -> int:
        """Lane-steps spent on surplus episodes."""
        return self._ledger.wasted_steps

    def summaries(self) -> list[EpisodeSummary]:
        """Every scored episode finished so far, in the order they finished."""
        return self._ledger.summaries()

    def snapshot(self) -> dict[str, Any]:
        """The run's observable state, for parity checks and debugging: the ledger's
        (``RouteLedger.snapshot``), plus ``frame_windows``, how many episodes hold frame
        windows, ``queued``, each lane's count of queued actions (None without queues), and
        ``ensembled``, each lane's count of chunks held for ensembling (None without)."""
        snapshot = self._ledger.snapshot()
        snapshot["frame_windows"] = self._assembler.window_count
        snapshot["queued"] = None if self._queues is None else self._queues.queued().tolist()
        snapshot["ensembled"] = None if self._ensembles is None else self._ensembles.held().tolist()
        return snapshot

    # ------------------------------------------------------------------ episodes

    def start(self, lanes: Any, *, now_ns: int) -> EpisodeStarts:
        """Start an episode on each vacant lane of ``lanes`` (``[K]``), claiming slots in order.

        Lanes past the last slot go idle or run surplus episodes (``overflow``). Each started
        episode's clock starts at ``now_ns``: take it just before resetting the lanes.

        Raises:
            ValueError: what ``RouteLedger.start_episodes`` refuses.
        """
        starts = self._ledger.start_episodes(lanes, now_ns=now_ns, overflow=self._overflow)
        # Their first observations come with set_observations, after the lanes' resets.
        self._digests.begin(starts.lanes.tolist() + starts.surplus_lanes.tolist())
        return starts

    def observe_rolls(self, lanes: Any, env_episode_ids: Any, *, now_ns: int) -> EpisodeStarts:
        """Start an episode on each lane an autoresetting vector restarted itself
        (``RouteLedger.observe_rolls``); ``set_observations`` has its first observation."""
        starts = self._ledger.observe_rolls(lanes, env_episode_ids, now_ns=now_ns)
        for lane in starts.lanes.tolist() + starts.surplus_lanes.tolist():
            self._digests.begin_with(lane, self._observations[lane])
        return starts

    def finish(
        self, lanes: Any, successes: Sequence[bool | None]
    ) -> tuple[list[EpisodeSummary], np.ndarray, np.ndarray]:
        """Finish the episodes that ended on ``lanes`` (``[E]``, as ``end_round`` returned them).

        ``successes[k]`` is what lane ``lanes[k]``'s final info said of success (None: nothing).
        The episodes' frame windows and queued actions go. A refused call changes nothing.

        Returns:
            ``(summaries, episode_ids, model_ends)``: the summaries of the scored episodes
            among them (surplus ones finish silently), the ``[E]`` ids of every episode
            finished, and the ``[F]`` ids among them whose end the model is owed (those it
            predicted on), each owed only once.

        Raises:
            ValueError: a lane out of range or given twice, a lane whose episode is still
                running, or not one success per lane.
        """
        ledger = self._ledger
        checked = self._checked(lanes)
        outcomes = [None if success is None else bool(success) for success in successes]
        if len(outcomes) != len(checked):
            raise ValueError(f"successes has {len(outcomes)} entries for {len(checked)} lanes")
        episode_ids = ledger.episode_ids(np.array(checked, dtype=np.int64))
        # Refused before any episode finishes, so a refused call leaves the run as it was.
        for lane, episode_id in zip(checked, episode_ids.tolist(), strict=True):
            if ledger._state[lane] == RUNNING:
                raise ValueError(
                    f"lane {lane} episode {episode_id} is still running: only lanes end_round "
                    f"returned as ended may be finished"
                )
        completed: list[EpisodeSummary] = []
        # Each lane at its own clock's end.
        for lane, episode_id, outcome in zip(checked, episode_ids.tolist(), outcomes, strict=True):
            completed += ledger.complete_episodes(
                [lane],
                [episode_id],
                [outcome],
                now_ns=self._ended_ns[lane],
                digests=[self._digests.episode(lane)],
            )
        return completed, episode_ids, self._release(episode_ids)

    def abandon(
        self, lanes: Any, errors: Sequence[str | None], *, now_ns: int
    ) -> tuple[list[EpisodeSummary], np.ndarray, np.ndarray]:
        """Abandon the running episodes of ``lanes`` (``[K]``) whose env failed: to play each
        slot again (``errors[k]`` None) or to record it failed with the error ``errors[k]``
        (``"<Type>: <message>"``), as ``RouteLedger.abandon_episodes`` does.

        Called between rounds, or inside an open round for lanes whose step raised: they leave
        the round, so ``end_round`` then takes the rows of the other running lanes only. The
        episodes' frame windows and queued actions go, so a slot played again starts afresh.
        A refused call changes nothing.

        Returns:
            ``(summaries, episode_ids, model_ends)`` as ``finish`` returns them: the summaries
            of the episodes recorded failed, the ``[K]`` ids of the episodes abandoned, and
            the ids among them whose end the model is owed.

        Raises:
            ValueError: what ``RouteLedger.abandon_episodes`` refuses.

        Example:
            >>> runner = RoundRunner(2, 2, [], [])
            >>> starts = runner.start(np.arange(2), now_ns=0)
            >>> summaries, ids, owed = runner.abandon([0, 1], [None, "OSError: gone"], now_ns=5)
            >>> [(s.index, s.steps, s.error) for s in summaries], ids.tolist()
            ([(1, 0, 'OSError: gone')], [0, 1])
            >>> runner.start(np.arange(2), now_ns=6).indices.tolist()  # slot 0 again
            [0]
        """
        ledger = self._ledger
        checked = self._checked(lanes)
        episode_ids = ledger.episode_ids(np.array(checked, dtype=np.int64))
        failed = ledger.abandon_episodes(
            np.array(checked, dtype=np.int64),
            errors,
            now_ns=now_ns,
            digests=[self._digests.episode(lane) for lane in checked],
        )
        gone = set(checked)
        kept = [k for k, lane in enumerate(self._running) if lane not in gone]
        if len(kept) < len(self._running):
            self._predict_ns = [self._predict_ns[k] for k in kept]
            self._running = [self._running[k] for k in kept]
            self._predict_lanes = [lane for lane in self._predict_lanes if lane not in gone]
        return failed, episode_ids, self._release(episode_ids)

    def _release(self, episode_ids: np.ndarray) -> np.ndarray:
        """Evict the frame windows and queued actions of episodes that are over; the model
        ends they owe."""
        for episode_id in episode_ids.tolist():
            self._assembler.evict(episode_id)
            if self._queues is not None:
                self._queues.drop(episode_id)
            if self._ensembles is not None:
                self._ensembles.drop(episode_id)
        return self._ledger.take_model_ends(episode_ids)

    def take_all_model_ends(self) -> np.ndarray:
        """At teardown: every episode the model predicted on and was not told the end of."""
        return self._ledger.take_all_model_ends()

    # ------------------------------------------------------------------ lanes

    def set_observations(self, lanes: Any, observations: Sequence[Any]) -> None:
        """Lane ``lanes[k]``'s latest raw observation is ``observations[k]``."""
        checked = self._checked(lanes)
        if len(observations) != len(checked):
            raise ValueError(
                f"observations has {len(observations)} entries for {len(checked)} lanes"
            )
        for lane, observation in zip(checked, observations, strict=True):
            self._observations[lane] = observation
        self._digests.observe(checked, observations, self._running_lane)

    def _running_lane(self, lane: int) -> bool:
        return self._ledger._state[lane] == RUNNING

    def observations(self, lanes: Any) -> list[Any]:
        """The latest raw observation of each of ``lanes`` (None before its first reset)."""
        return [self._observations[lane] for lane in self._checked(lanes)]

    def running_lanes(self) -> np.ndarray:
        """``[K]`` int64: the lanes whose episode (scored or surplus) is being stepped."""
        return self._ledger.running_lanes()

    def episode_ids(self, lanes: Any) -> np.ndarray:
        """``[K]`` int64: the episode each of ``lanes`` holds (-1 for none)."""
        return self._ledger.episode_ids(lanes)

    def lane_episodes(self, lanes: Any) -> tuple[np.ndarray, list[int | None], np.ndarray]:
        """What each of ``lanes`` (``[K]``) holds: ``(indices [K], seeds, steps [K])``, the
        episode's slot (-1 for a surplus episode or none), its seed and the steps it took."""
        checked = self._checked(lanes)
        ledger = self._ledger
        return (
            np.array([ledger._index[lane] for lane in checked], dtype=np.int64),
            [ledger._seed[lane] for lane in checked],
            np.array([ledger._steps[lane] for lane in checked], dtype=np.int64),
        )

    def _row_text(self, lanes: list[int], kept: int) -> Callable[[int], str]:
        """How the applier names row ``k`` of an output for ``lanes`` with ``kept`` rows per lane
        (its next ``kept`` actions): the lane, its episode's index and the step of that row's
        action; called only on the way to an error."""

        ledger = self._ledger

        def text(row: int) -> str:
            lane = lanes[row // kept]
            return lane_text(lane, ledger._index[lane], ledger._steps[lane] + row % kept)

        return text

    def _checked(self, lanes: Any) -> list[int]:
        checked = vector(lanes, "int64", "lanes").tolist()
        num_lanes = len(self._observations)
        for lane in checked:
            if not 0 <= lane < num_lanes:
                raise ValueError(f"lane {lane} is out of range for {num_lanes} lanes")
        return checked

    # ------------------------------------------------------------------ the phases of a round

    def begin_round(self, lanes: Any = None) -> tuple[np.ndarray, np.ndarray, Any]:
        """Open a round over the running lanes that are in no parked round (with ``lanes``,
        ``[L]`` int, only those among them).

        Returns:
            ``(running, predict_lanes, payload)``: the running lanes ``[K]``; those the model
            is called for ``[P]`` (all of them, or with chunk queues those whose queue is
            empty); and the model input of ``predict_lanes`` (None when ``P = 0``). Lanes
            that replay a queued action still push their frame into their stack windows.
        """
        only = None if lanes is None else set(self._checked(lanes))
        payload, _ = self._begin(rows=False, only=only)
        return (
            np.array(self._running, dtype=np.int64),
            np.array(self._predict_lanes, dtype=np.int64),
            payload,
        )

    def _begin(
        self, rows: bool, only: set[int] | None = None
    ) -> tuple[Any, list[np.ndarray] | None]:
        """Open a round: set its running and predicted lanes (those in no parked round and,
        with ``only``, among those). Returns the model's input when some lane predicts,
        ``(payload, None)``, or with ``rows`` when the plan allows it ``(None, rows)``, each
        lane's input as an array of its own (``ObservationAssembler._assemble_rows``);
        ``(None, None)`` when no lane predicts."""
        ledger = self._ledger
        running = ledger.running_lanes().tolist()
        if only is not None or self._parked:
            parked = self._in_parked_round
            running = [
                lane for lane in running if lane not in parked and (only is None or lane in only)
            ]
        predict_lanes = running
        if self._queues is not None and running:
            predict_lanes = self._queues.lanes_needing_predict(running).tolist()
            if len(predict_lanes) < len(running):
                needing = set(predict_lanes)
                replaying = [lane for lane in running if lane not in needing]
                self._assembler.push(
                    [self._observations[lane] for lane in replaying],
                    ledger.episode_ids(np.array(replaying, dtype=np.int64)),
                )
        payload = lane_rows = None
        if predict_lanes:
            raw = [self._observations[lane] for lane in predict_lanes]
            ids = ledger.episode_ids(np.array(predict_lanes, dtype=np.int64))
            if rows:
                # Each raw observation is held by its lane's slot and by `raw`.
                lane_rows = self._assembler._assemble_rows(raw, ids.tolist(), 2)
            if lane_rows is None:
                payload = self._assembler.assemble(raw, ids)
        self._running, self._predict_lanes = running, predict_lanes
        self._predict_ns = [0] * len(running)
        return payload, lane_rows

    def park_round(self, key: int) -> None:
        """Set the open round aside under ``key`` while its lanes' envs step, so that another
        round can open over other lanes; ``resume_round(key)`` makes it the open round again.

        Two groups of lanes stepping at once, as the pipelined driver runs them::

            running_a, _, payload_a = runner.begin_round([0, 1])
            actions_a = runner.take_actions(model(payload_a), predict_ns)
            runner.park_round(0)  # lanes 0 and 1 step in their worker meanwhile
            running_b, _, payload_b = runner.begin_round([2, 3])
            ...
            runner.resume_round(0)
            ended, truncated = runner.end_round(rewards_a, terminated_a, truncated_a, ...)

        Raises:
            ValueError: a round is already parked under ``key``.
        """
        if key in self._parked:
            raise ValueError(f"a round is already parked under key {key}")
        self._parked[key] = (self._running, self._predict_lanes, self._predict_ns)
        self._in_parked_round.update(self._running)
        self._running, self._predict_lanes, self._predict_ns = [], [], []

    def resume_round(self, key: int) -> None:
        """Make the round parked under ``key`` the open round again, in place of the last one.

        Raises:
            ValueError: no round is parked under ``key``.
        """
        if key not in self._parked:
            raise ValueError(f"no round is parked under key {key}")
        self._running, self._predict_lanes, self._predict_ns = self._parked.pop(key)
        self._in_parked_round.difference_update(self._running)

    def take_actions(self, output: Any, predict_ns: int) -> Any:
        """One env action per running lane of the open round.

        Args:
            output: what the model returned for the round's ``predict_lanes``: ``[P, ...]``,
                or chunks ``[P, H, ...]`` with queues (None when ``P = 0``).
            predict_ns: how long the model call for the ``P`` lanes took; each predicted
                lane is charged its share, ``predict_ns / P`` (``shares``: they add up to
                ``predict_ns``), and a lane that replays a queued action nothing.

        Returns:
            The env actions ``[K, ...]`` (or a dict of them) in the order of the running lanes.

        Raises:
            ModelOutputError: the output does not fit the action space or is not a chunk.
            ValueError: ``predict_ns`` is not an int64 duration (>= 0).
        """
        self._charge(duration_arg(predict_ns, "predict_ns"))
        return self._actions(output)

    def _charge(self, predict_ns: int) -> None:
        """The open round's predict lanes predicted, in ``predict_ns``: each is charged its
        share."""
        running, predict_lanes = self._running, self._predict_lanes
        if predict_lanes:
            self._ledger.mark_predicted(np.array(predict_lanes, dtype=np.int64))
        charged = dict(
            zip(predict_lanes, shares(predict_ns, len(predict_lanes)).tolist(), strict=True)
        )
        self._predict_ns = [charged.get(lane, 0) for lane in running]

    def _actions(self, output: Any) -> Any:
        """One env action per running lane of the open round, its predict lanes charged."""
        running, predict_lanes = self._running, self._predict_lanes
        ledger, queues = self._ledger, self._queues
        predict_array = np.array(predict_lanes, dtype=np.int64)
        running_array = np.array(running, dtype=np.int64)
        if self._ensembles is not None:
            return self._ensembled(output, running, running_array)
        if queues is None:
            actions = self._applier._apply(output, running, self._row_text(running, 1))
            self._digests.act(running, actions)
            return actions
        if predict_lanes:
            count = len(predict_lanes)
            kept = min(split_chunk(output, count), queues.execution_horizon)
            flat = map_leaves(output, lambda leaf: _first_actions(leaf, kept))
            repeated = np.repeat(predict_array, kept).tolist()
            applied = self._applier._apply(flat, repeated, self._row_text(predict_lanes, kept))
            chunks = map_leaves(applied, lambda leaf: leaf.reshape(count, kept, *leaf.shape[1:]))
            queues.push(predict_array, ledger.episode_ids(predict_array), chunks)
        actions = queues.pop(running_array, ledger.episode_ids(running_array))
        self._digests.act(running, actions)
        return actions

    def _ensembled(self, output: Any, running: list[int], running_array: np.ndarray) -> Any:
        """One env action per running lane (every one predicted): each chunk whole, as env
        actions, into its lane's buffer, and the lane's average for this step out."""
        assert self._ensembles is not None
        count = len(running)
        horizon = split_chunk(output, count)
        flat = map_leaves(output, lambda leaf: _first_actions(leaf, horizon))
        repeated = np.repeat(running_array, horizon).tolist()
        applied = self._applier._apply(flat, repeated, self._row_text(running, horizon))
        chunks = map_leaves(applied, lambda leaf: leaf.reshape(count, horizon, *leaf.shape[1:]))
        ids = self._ledger.episode_ids(running_array)
        self._ensembles.push(running_array, ids, chunks)
        actions = self._ensembles.pop(running_array, ids)
        self._digests.act(running, actions)
        return actions

    def end_round(
        self, rewards: Any, terminated: Any, truncated: Any, step_ns: int, now_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Record the env step of the open round's running lanes and close the round.

        Args:
            rewards: ``[K]`` float; terminated, truncated: ``[K]`` bool, as the env returned
                them, in the order of the running lanes.
            step_ns: how long the one step of the ``K`` lanes took; each lane is charged its
                share, ``step_ns / K`` (``shares``: they add up to ``step_ns``).
            now_ns: the clock when the step returned: for ``max_episode_seconds``, and the end
                of the clock of every episode that ended.

        Returns:
            ``(ended, truncated)``: the lanes whose episode ended ``[E]``, and the ``[K]``
            truncation flags as recorded (a cap reached truncates an episode that did not
            terminate).

        Raises:
            ValueError: ``step_ns`` not an int64 duration (>= 0), ``now_ns`` not an int64, a
                vector of the wrong kind or length, or what ``RouteLedger.record_step``
                refuses.
        """
        step_ns = duration_arg(step_ns, "step_ns")
        now_ns = i64_arg(now_ns, "now_ns")
        return self._end(
            rewards, terminated, truncated, shares(step_ns, len(self._running)).tolist(), now_ns
        )

    def _end(
        self, rewards: Any, terminated: Any, truncated: Any, step_ns: list[int], now_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``end_round`` with its clock readings checked, ``step_ns[k]`` the env time charged
        to running lane ``k``."""
        running = self._running
        count = len(running)
        rewards = vector(rewards, "float64", "rewards")
        terminated = vector(terminated, "bool", "terminated")
        env_truncated = vector(truncated, "bool", "truncated")  # the env's, before the caps
        truncated = env_truncated.copy()
        for name, values in (
            ("rewards", rewards),
            ("terminated", terminated),
            ("truncated", truncated),
        ):
            if len(values) != count:
                raise ValueError(f"{name} has {len(values)} entries for {count} running lanes")
        steps = self._ledger._steps
        for k, lane in enumerate(running):
            if not terminated[k] and self._over_cap(lane, steps[lane] + 1, now_ns):
                truncated[k] = True
        ended = self._ledger.record_step(
            np.array(running, dtype=np.int64),
            rewards,
            terminated,
            truncated,
            np.array(step_ns, dtype=np.int64),
            np.array(self._predict_ns, dtype=np.int64),
        )
        # Set once the ledger took the step: a refused round leaves the runner as it was.
        self._digests.step(running, rewards, terminated, env_truncated)
        for lane in ended.tolist():
            self._ended_ns[lane] = now_ns
        self._rounds += 1
        return ended, truncated

    def _over_cap(self, lane: int, steps: int, now_ns: int) -> bool:
        """Whether ``lane``'s episode, ``steps`` steps in at ``now_ns``, reached a cap."""
        if self._max_steps is not None and steps >= self._max_steps:
            return True
        started_ns = self._ledger._started_ns[lane]
        return self._max_ns is not None and now_ns - started_ns >= self._max_ns

    # ------------------------------------------------------------------ the synchronous loop

    def run_rounds(
        self,
        model: RoundModel,
        env_steps: Sequence[Callable[[Any], tuple]],
        env_name: str,
        *,
        until_ns: int,
        stats: Sequence[Any],
        failures: dict[int, str] | None = None,
    ) -> tuple[np.ndarray, list[dict[str, Any]], int, int]:
        """Run whole rounds until an episode ends, a lane's env fails, no lane is running, or
        ``until_ns`` passed.

        At least one round runs when a lane is running, whatever ``until_ns`` says.

        Args:
            model: the run's model, a ``rlmesh.core.RoundModel`` (``ModelHandler`` is one):
                ``predict_now(payload, P)`` gives its output for the ``P`` predict lanes; a
                ``lane_corner``, when given, is called on each lane's input in lane order (an
                array of its own when the plan is one array leaf, else each row of an array
                payload) and ``combine(outputs, P)`` makes the batch of anything but plain
                ints; with ``wants_episode_ids``,
                ``predict_now(payload, P, episode_ids)``; ``failure(error, rounds)`` is what to
                raise when any of these raised ``error``; with
                ``calls_per_lane`` (optional, default false), a prediction for P lanes is P
                calls of a per-lane corner, each recorded in ``stats`` with an equal share of
                the prediction's time.
            env_steps: per lane, its env's ``step``: ``step(action)`` -> ``(observation,
                reward, terminated, truncated, info)``. Or one callable that steps every
                running lane at once, a ``Lanes.step``: ``step(lanes, actions) ->
                StepBatch`` for ``lanes`` ``[K]`` int64 and ``actions`` batched along a
                leading lane axis, raising ``LaneFailures`` when some lanes' envs failed (with
                ``failures``, its errors go there and its outcome stands for the step). The
                step is timed as one, each lane charged its share.
            env_name: how errors name the env.
            until_ns: no further round starts once a round ends at or after this
                ``time.perf_counter_ns()`` reading (an integer).
            stats: the ``LatencyStats`` of ``model.predict``, ``env.step`` and
                ``driver.round``, in that order: each model call, each lane's env step (timed
                on its own) and each round is recorded there.
            failures: None: a lane's ``step`` that raises ends the call with ``EnvError``.
                A dict: such a lane's ``"<ExceptionType>: <message>"`` is put there under its
                lane, the lane leaves the round (its episode still running, to be
                ``abandon``-ed), the other lanes' steps are recorded, and the call returns
                after that round.

        Each lane's episode is charged its own env step's time, and each predicted lane its
        share of the model call, as ``take_actions`` shares it.

        Returns:
            ``(ended, infos, rounds, lane_steps)``: the lanes whose episode ended in the last
            round (``[E]``, empty if none did), their final infos, and the rounds and
            lane-steps run.

        Raises:
            EnvError: a lane's ``step`` raised (the lane and env named, the error chained),
                unless ``failures`` takes it.
            TypeError: ``until_ns`` is not an integer.
            What ``model.failure`` returns, when calling the model raised.
            Whatever the phases raise.
        """
        if isinstance(until_ns, bool) or not isinstance(until_ns, (int, np.integer)):
            raise TypeError(
                f"until_ns must be an integer time.perf_counter_ns() reading, got {until_ns!r}"
            )
        predict_stats, step_stats, round_stats = stats
        lane_corner = model.lane_corner
        wants_episode_ids = model.wants_episode_ids
        calls_per_lane = bool(getattr(model, "calls_per_lane", False))
        # A per-lane corner gets each lane's input as an array of its own, not a row of a
        # payload made only to be split again.
        rows = lane_corner is not None and not wants_episode_ids
        whole = callable(env_steps)  # one call steps every running lane
        rounds = lane_steps = 0
        ended = np.zeros(0, dtype=np.int64)
        infos: list[dict[str, Any]] = []
        # One reading ends a round and starts the next, as in the Rust core.
        round_start = time.perf_counter_ns()
        while True:
            payload, lane_rows = self._begin(rows)
            running, predict_lanes = self._running, self._predict_lanes
            count = len(running)
            if count == 0:
                break
            output, integers, predict_ns = None, None, 0
            if predict_lanes:
                predict_start = time.perf_counter_ns()
                output, integers = self._predict(
                    model, lane_corner, payload, lane_rows, wants_episode_ids
                )
                predict_ns = time.perf_counter_ns() - predict_start
                calls = len(predict_lanes) if calls_per_lane else 1
                record_shared(predict_stats, predict_ns, calls)
            self._charge(predict_ns)
            actions = None
            if integers is not None:
                if self._queues is None and self._ensembles is None and not whole:
                    actions = self._applier._discrete_scalars(integers)
                    if actions is not None:
                        self._digests.act_integers(running, integers)
                output = np.array(integers, dtype=np.int64)
            if whole:
                stepped = self._step_all(env_steps, self._actions(output), env_name, failures)
            else:
                if actions is None:
                    actions = lane_actions(self._actions(output), count)
                stepped = self._step_lanes(env_steps, actions, env_name, failures)
            rewards, terminated, truncated, step_infos, lane_ns, failed, now = stepped
            if failed:  # the failed lanes leave the round; the others' steps are recorded
                gone = set(failed)
                kept = [k for k in range(count) if k not in gone]
                self._running = [self._running[k] for k in kept]
                self._predict_ns = [self._predict_ns[k] for k in kept]
                running, count = self._running, len(kept)
            step_stats.record_many(np.array(lane_ns, dtype=np.int64))
            # Each lane is charged its own step's time, as telemetry records it.
            ended, _ = self._end(
                np.array(rewards, dtype=np.float64),
                np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_),
                lane_ns,
                now,
            )
            round_end = time.perf_counter_ns()
            round_stats.record(round_end - round_start)
            rounds += 1
            lane_steps += count
            if len(ended):
                position = {lane: k for k, lane in enumerate(self._running)}
                infos = [step_infos[position[lane]] for lane in ended.tolist()]
                break
            if failed or round_end >= until_ns:
                break
            round_start = round_end
        return ended, infos, rounds, lane_steps

    def _step_all(
        self,
        step: Callable[[np.ndarray, Any], Any],
        actions: Any,
        env_name: str,
        failures: dict[int, str] | None,
    ) -> tuple[Any, Any, Any, list[dict[str, Any]], list[int], list[int], int]:
        """Step every running lane in one ``step(lanes, actions) -> StepBatch`` call; the
        result is ``_step_lanes``'s, each stepped lane charged its share of the call's time.
        A ``LaneFailures`` it raises, with ``failures`` given, puts its errors there and its
        ``outcome`` (the other lanes' batch) stands for the step; an ``RlmeshError`` is raised
        as it is, any other exception as an ``EnvError`` naming the env."""
        running = self._running
        started = time.perf_counter_ns()
        errors: dict[int, str] | None = None
        try:
            batch = step(np.array(running, dtype=np.int64), actions)
        except LaneFailures as failure:
            if failures is None:
                raise
            errors = failure.errors
            failures.update(errors)
            batch = failure.outcome
        except RlmeshError:
            raise
        except Exception as err:
            raise env_failure(env_name, "step", err) from err
        now = time.perf_counter_ns()
        stepped = np.asarray(batch.stepped).tolist()
        failed: list[int] = []
        if stepped != running:
            kept = iter(stepped)
            expected = next(kept, None)
            for k, lane in enumerate(running):
                if lane == expected:
                    expected = next(kept, None)
                elif lane in (errors or {}):
                    failed.append(k)
                else:
                    raise ValueError(
                        f"the lanes' step moved lanes {stepped} when asked to step {running}: "
                        f"lane {lane} neither stepped nor failed"
                    )
            if expected is not None:
                raise ValueError(
                    f"the lanes' step moved lanes {stepped} when asked to step {running}"
                )
        observations = batch.observations
        if len(observations) != len(stepped):
            raise ValueError(
                f"the lanes' step gave {len(observations)} observations for {len(stepped)} lanes"
            )
        for lane, observation in zip(stepped, observations, strict=True):
            self._observations[lane] = observation
        self._digests.observe_steps(stepped, observations)  # the round's running lanes
        lane_ns = shares(now - started, len(stepped)).tolist()
        return (
            batch.rewards,
            batch.terminated,
            batch.truncated,
            list(batch.infos),
            lane_ns,
            failed,
            now,
        )

    def _step_lanes(
        self,
        env_steps: Sequence[Callable[[Any], tuple]],
        actions: Any,
        env_name: str,
        failures: dict[int, str] | None,
    ) -> tuple[list[Any], list[Any], list[Any], list[dict[str, Any]], list[int], list[int], int]:
        """Step each running lane's env with its action, timing each step on its own, and keep
        each stepped lane's observation as its latest.

        Returns ``(rewards, terminated, truncated, infos, lane_ns, failed, now)``: the stepped
        lanes' results in lane order, the positions of the lanes whose step raised (their
        errors put in ``failures``), and the clock when the last step returned. The
        observations are held by the runner alone once this returns, as in the Rust core.
        """
        rewards, terminated, truncated, infos, lane_ns, failed = [], [], [], [], [], []
        stepped = []
        lane_start = time.perf_counter_ns()
        for k, lane in enumerate(self._running):
            try:
                observation, reward, term, trunc, info = env_steps[lane](actions[k])
            except Exception as err:
                if failures is None:
                    raise env_failure(env_name, "step", err, lane) from err
                failures[lane] = f"{type(err).__name__}: {err}"
                failed.append(k)
                lane_start = time.perf_counter_ns()
                continue
            lane_end = time.perf_counter_ns()
            lane_ns.append(lane_end - lane_start)
            lane_start = lane_end
            stepped.append((lane, observation))
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            infos.append(info)
        for lane, observation in stepped:
            self._observations[lane] = observation
        if stepped:
            lanes = [lane for lane, _ in stepped]
            observations = [observation for _, observation in stepped]
            self._digests.observe_steps(lanes, observations)
        return rewards, terminated, truncated, infos, lane_ns, failed, lane_start

    def _predict(
        self,
        model: Any,
        lane_corner: Any,
        payload: Any,
        lane_rows: list[np.ndarray] | None,
        wants_episode_ids: bool,
    ) -> tuple[Any, list[int] | None]:
        """The model's output for the open round's predict lanes, from their ``payload`` or
        (for a per-lane corner) each lane's input ``lane_rows``.

        Returns ``(output, None)``, or ``(None, integers)`` when a per-lane corner returned
        a plain Python int (an int64) for every lane.
        """
        count = len(self._predict_lanes)
        try:
            if lane_rows is not None:
                return self._per_lane(model, lane_corner, lane_rows)
            if wants_episode_ids:
                episode_ids = self._ledger.episode_ids(
                    np.array(self._predict_lanes, dtype=np.int64)
                )
                return model.predict_now(payload, count, episode_ids), None
            if lane_corner is not None and isinstance(payload, np.ndarray):
                return self._per_lane(model, lane_corner, [payload[k] for k in range(count)])
            return model.predict_now(payload, count), None
        except Exception as err:
            failure = model.failure(err, self._rounds)
            if failure is err:
                raise
            raise failure from err

    @staticmethod
    def _per_lane(
        model: Any, lane_corner: Any, lane_inputs: list[Any]
    ) -> tuple[Any, list[int] | None]:
        """``lane_corner`` called on each lane's input in lane order: plain Python ints that
        an int64 holds are kept as integers, anything else made one batch by
        ``model.combine``."""
        outputs = [lane_corner(each) for each in lane_inputs]
        if all(type(output) is int and INT64_MIN <= output <= INT64_MAX for output in outputs):
            return None, outputs
        return model.combine(outputs, len(outputs)), None

    def __repr__(self) -> str:
        return f"RoundRunner(num_lanes={len(self._observations)}, rounds={self._rounds})"
