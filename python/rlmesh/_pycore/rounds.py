"""One round of the loop over a run's running lanes, and the synchronous loop of rounds.

Mirrors ``rust/src/rounds.rs`` name for name. This file is the executable specification: the
Rust core must produce the same results, raise the same error types and the same messages.

A round (DESIGN.md, "The loop") is: assemble the running lanes' model input, call the model
for the lanes whose replay queue is empty, turn its output into one env action per lane, step
the lanes, record the step. ``RoundRunner`` does every per-lane part of it on top of the other
core objects (ledger, assembler, applier, chunk queues), in three phases the async driver
calls around its awaits:

- ``begin_round()`` -> the running lanes, the lanes to predict for, their payload;
- ``take_actions(output, predict_ns)`` -> one env action per running lane;
- ``end_round(rewards, terminated, truncated, step_ns, now_ns)`` -> the lanes whose episode
  ended (after ``max_episode_steps`` / ``max_episode_seconds``).

When nothing in a round needs awaiting (a synchronous model, per-lane Gymnasium envs, no
timeouts, no per-step hooks), ``run_rounds`` chains the same phases itself, calling the model
and stepping every lane's env in the core, until an episode ends or a deadline passes. That is
the hot path: the driver's Python runs once per episode end, not once per step.

The runner keeps each lane's latest raw observation (``set_observations`` after a reset),
its episode's step count and start time, and counts the rounds it recorded.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh.adapters import compile_spec
    >>> from rlmesh._pycore import ActionApplier, LatencyStats, ObservationAssembler, RouteLedger
    >>> envs = [gym.make("CartPole-v1") for _ in range(2)]
    >>> plan = compile_spec(None, envs[0].observation_space, envs[0].action_space)
    >>> ledger = RouteLedger(2, episodes=2)
    >>> runner = RoundRunner(ledger, ObservationAssembler(plan.observation),
    ...                      ActionApplier(plan.action), max_episode_steps=5)
    >>> starts = ledger.start_episodes(np.arange(2), now_ns=0)
    >>> runner.start_lanes(starts.lanes, now_ns=0)
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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import EnvError
from .args import i64_arg, path_text, vector
from .chunks import split_chunk

NS_PER_S = 1e9


def lane_actions(actions: Any, count: int, path: tuple[str, ...] = ()) -> Sequence[Any]:
    """``actions`` batched along a leading lane axis, as something indexed by lane position.

    An array is returned as it is: indexing it yields a lane's row (a numpy scalar for a 1-D
    batch, as Gymnasium's own vectors pass them). A dict or tuple of batches becomes a list of
    ``count`` per-lane dicts or tuples.

    Raises:
        ValueError: a leaf without ``count`` rows along its leading axis.
    """
    if isinstance(actions, Mapping):
        columns = {
            key: lane_actions(leaf, count, (*path, str(key))) for key, leaf in actions.items()
        }
        return [{key: column[k] for key, column in columns.items()} for k in range(count)]
    if isinstance(actions, tuple):
        parts = [lane_actions(leaf, count, (*path, str(i))) for i, leaf in enumerate(actions)]
        return [tuple(part[k] for part in parts) for k in range(count)]
    try:
        rows = len(actions)
    except TypeError:
        rows = None
    if rows != count:
        raise ValueError(
            f"{path_text('actions', path)} must hold one action per lane stepped ({count}) "
            f"along its leading axis, got {'no lane axis' if rows is None else rows}"
        )
    return actions  # type: ignore[no-any-return]


def env_failure(env_name: str, method: str, err: Exception, lane: int | None = None) -> EnvError:
    """The ``EnvError`` for an env's ``method`` that raised ``err`` on ``lane``."""
    where = env_name if lane is None else f"lane {lane} ({env_name})"
    return EnvError(f"{where}: {method}() raised {type(err).__name__}: {err}")


def lane_text(lane: int, index: int, step: int) -> str:
    """How an error names a lane's episode at a step: ``lane 2 (episode index 7, step 12)``, or
    ``lane 2 (surplus episode, step 12)`` for an episode that is never scored (index -1).
    ``step`` is the steps the episode took before the action in question (0: its first action).
    """
    if index < 0:
        return f"lane {lane} (surplus episode, step {step})"
    return f"lane {lane} (episode index {index}, step {step})"


def _map_leaves(tree: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    if isinstance(tree, dict):
        return {key: _map_leaves(value, fn) for key, value in tree.items()}
    return fn(tree)


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
    """The per-lane work of every round of one run.

    Args:
        ledger: the run's ``RouteLedger`` (slots, episode ids, step records).
        assembler: the ``ObservationAssembler`` of the model's observation plan.
        applier: the ``ActionApplier`` of the model's action plan.
        queues: the ``ChunkQueues`` when the model returns chunks ``[K, H, ...]``, else None
            (one action per lane per prediction).
        max_episode_steps: truncate an episode once it took this many steps.
        max_episode_seconds: truncate an episode once this many seconds passed since its
            lane's ``start_lanes``.

    Raises:
        ValueError: a cap that is not a positive number.
    """

    def __init__(
        self,
        ledger: Any,
        assembler: Any,
        applier: Any,
        queues: Any = None,
        *,
        max_episode_steps: int | None = None,
        max_episode_seconds: float | None = None,
    ) -> None:
        self._ledger = ledger
        self._assembler = assembler
        self._applier = applier
        self._queues = queues
        self._max_steps = _step_cap(max_episode_steps)
        self._max_ns = _time_cap_ns(max_episode_seconds)
        num_lanes = ledger.num_lanes
        self._observations: list[Any] = [None] * num_lanes
        self._episode_steps = [0] * num_lanes
        self._started_ns = [0] * num_lanes
        self._rounds = 0
        # The open round: its running lanes, the lanes predicted for, each running lane's
        # model time.
        self._running: list[int] = []
        self._predict_lanes: list[int] = []
        self._predict_ns: list[int] = []

    # ------------------------------------------------------------------ lanes

    @property
    def rounds(self) -> int:
        """Rounds recorded so far (``end_round`` calls, and the rounds of ``run_rounds``)."""
        return self._rounds

    def start_lanes(self, lanes: Any, *, now_ns: int) -> None:
        """``lanes`` (``[K]`` int) start a new episode at ``now_ns``: step counts restart.

        Raises:
            ValueError: a lane out of range, or ``now_ns`` not an int64 clock reading.
        """
        now_ns = i64_arg(now_ns, "now_ns")
        for lane in self._checked(lanes):
            self._episode_steps[lane] = 0
            self._started_ns[lane] = now_ns

    def set_observations(self, lanes: Any, observations: Sequence[Any]) -> None:
        """Lane ``lanes[k]``'s latest raw observation is ``observations[k]``."""
        checked = self._checked(lanes)
        if len(observations) != len(checked):
            raise ValueError(
                f"observations has {len(observations)} entries for {len(checked)} lanes"
            )
        for lane, observation in zip(checked, observations, strict=True):
            self._observations[lane] = observation

    def observations(self, lanes: Any) -> list[Any]:
        """The latest raw observation of each of ``lanes`` (None before its first reset)."""
        return [self._observations[lane] for lane in self._checked(lanes)]

    def episode_steps(self, lanes: Any) -> np.ndarray:
        """``[K]`` int64: the steps each of ``lanes``' current episode has taken."""
        return np.array([self._episode_steps[lane] for lane in self._checked(lanes)], np.int64)

    def _row_text(self, lanes: list[int], kept: int) -> Callable[[int], str]:
        """How the applier names row ``k`` of an output for ``lanes`` with ``kept`` rows per lane
        (its next ``kept`` actions): the lane, its episode's index and the step of that row's
        action. The index is read from the ledger's snapshot only on the way to an error."""

        def text(row: int) -> str:
            lane = lanes[row // kept]
            index = self._ledger.snapshot()["lanes"][lane]["index"]
            return lane_text(lane, index, self._episode_steps[lane] + row % kept)

        return text

    def _checked(self, lanes: Any) -> list[int]:
        checked = vector(lanes, "int64", "lanes").tolist()
        num_lanes = len(self._observations)
        for lane in checked:
            if not 0 <= lane < num_lanes:
                raise ValueError(f"lane {lane} is out of range for {num_lanes} lanes")
        return checked

    # ------------------------------------------------------------------ the phases of a round

    def begin_round(self) -> tuple[np.ndarray, np.ndarray, Any]:
        """Open a round over the running lanes.

        Returns:
            ``(running, predict_lanes, payload)``: the running lanes ``[K]``; those the model
            is called for ``[P]`` (all of them, or with chunk queues those whose queue is
            empty); and the model input of ``predict_lanes`` (None when ``P = 0``). Lanes
            that replay a queued action still push their frame into their stack windows.
        """
        ledger = self._ledger
        running = ledger.running_lanes().tolist()
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
        payload = None
        if predict_lanes:
            payload = self._assembler.assemble(
                [self._observations[lane] for lane in predict_lanes],
                ledger.episode_ids(np.array(predict_lanes, dtype=np.int64)),
            )
        self._running, self._predict_lanes = running, predict_lanes
        self._predict_ns = [0] * len(running)
        return np.array(running, dtype=np.int64), np.array(predict_lanes, dtype=np.int64), payload

    def take_actions(self, output: Any, predict_ns: int) -> Any:
        """One env action per running lane of the open round.

        Args:
            output: what the model returned for the round's ``predict_lanes``: ``[P, ...]``,
                or chunks ``[P, H, ...]`` with queues (None when ``P = 0``).
            predict_ns: how long the model call took; charged to each predicted lane.

        Returns:
            The env actions ``[K, ...]`` (or a dict of them) in the order of the running lanes.

        Raises:
            ModelOutputError: the output does not fit the action space or is not a chunk.
            ValueError: ``predict_ns`` is not an int64 duration.
        """
        predict_ns = i64_arg(predict_ns, "predict_ns")
        running, predict_lanes = self._running, self._predict_lanes
        ledger, queues = self._ledger, self._queues
        predict_array = np.array(predict_lanes, dtype=np.int64)
        if predict_lanes:
            ledger.mark_predicted(predict_array)
        predicted = set(predict_lanes)
        self._predict_ns = [predict_ns if lane in predicted else 0 for lane in running]
        running_array = np.array(running, dtype=np.int64)
        if queues is None:
            return self._applier._apply(output, running, self._row_text(running, 1))
        if predict_lanes:
            count = len(predict_lanes)
            kept = min(split_chunk(output, count), queues.execution_horizon)
            flat = _map_leaves(output, lambda leaf: _first_actions(leaf, kept))
            repeated = np.repeat(predict_array, kept).tolist()
            applied = self._applier._apply(flat, repeated, self._row_text(predict_lanes, kept))
            chunks = _map_leaves(applied, lambda leaf: leaf.reshape(count, kept, *leaf.shape[1:]))
            queues.push(predict_array, ledger.episode_ids(predict_array), chunks)
        return queues.pop(running_array, ledger.episode_ids(running_array))

    def end_round(
        self, rewards: Any, terminated: Any, truncated: Any, step_ns: int, now_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Record the env step of the open round's running lanes and close the round.

        Args:
            rewards: ``[K]`` float; terminated, truncated: ``[K]`` bool, as the env returned
                them, in the order of the running lanes.
            step_ns: how long the env step took; charged to each lane.
            now_ns: the clock after the step, for ``max_episode_seconds``.

        Returns:
            ``(ended, truncated)``: the lanes whose episode ended ``[E]``, and the ``[K]``
            truncation flags as recorded (a cap reached truncates an episode that did not
            terminate).

        Raises:
            ValueError: ``step_ns`` or ``now_ns`` not an int64, a vector of the wrong kind or
                length, or what ``RouteLedger.record_step`` refuses.
        """
        step_ns = i64_arg(step_ns, "step_ns")
        now_ns = i64_arg(now_ns, "now_ns")
        running = self._running
        count = len(running)
        rewards = vector(rewards, "float64", "rewards")
        terminated = vector(terminated, "bool", "terminated")
        truncated = vector(truncated, "bool", "truncated").copy()
        for name, values in (
            ("rewards", rewards),
            ("terminated", terminated),
            ("truncated", truncated),
        ):
            if len(values) != count:
                raise ValueError(f"{name} has {len(values)} entries for {count} running lanes")
        for k, lane in enumerate(running):
            if not terminated[k] and self._over_cap(lane, self._episode_steps[lane] + 1, now_ns):
                truncated[k] = True
        ended = self._ledger.record_step(
            np.array(running, dtype=np.int64),
            rewards,
            terminated,
            truncated,
            np.full(count, step_ns, dtype=np.int64),
            np.array(self._predict_ns, dtype=np.int64),
        )
        # Counted once the ledger took the step: a refused round leaves the runner as it was.
        for lane in running:
            self._episode_steps[lane] += 1
        self._rounds += 1
        return ended, truncated

    def _over_cap(self, lane: int, steps: int, now_ns: int) -> bool:
        """Whether ``lane``'s episode, ``steps`` steps in at ``now_ns``, reached a cap."""
        if self._max_steps is not None and steps >= self._max_steps:
            return True
        return self._max_ns is not None and now_ns - self._started_ns[lane] >= self._max_ns

    def forget_episodes(self, episode_ids: Any) -> None:
        """Episodes that ended (``[E]`` int): their frame windows and queued actions go.

        Call it once the ledger completed them, before their lanes' next round.
        """
        for episode_id in vector(episode_ids, "int64", "episode_ids").tolist():
            self._assembler.evict(episode_id)
            if self._queues is not None:
                self._queues.drop(episode_id)

    # ------------------------------------------------------------------ the synchronous loop

    def run_rounds(
        self,
        model: Any,
        env_steps: Sequence[Callable[[Any], tuple]],
        env_name: str,
        *,
        until_ns: int,
        stats: Sequence[Any],
    ) -> tuple[np.ndarray, list[dict[str, Any]], int, int]:
        """Run whole rounds until an episode ends, no lane is running, or ``until_ns`` passed.

        At least one round runs when a lane is running, whatever ``until_ns`` says.

        Args:
            model: the run's model as ``rlmesh.model.ModelHandler`` presents it:
                ``predict_now(payload, P)`` -> its output for the ``P`` lanes of ``payload``
                (as ``take_actions`` takes it); ``lane_corner``, a per-lane function or None:
                when given and the payload is an array, it is called on each lane's row in
                lane order and ``combine(outputs, P)`` makes the batch; ``wants_episode_ids``:
                when true, ``predict_now(payload, P, episode_ids)`` gets the predict lanes'
                episode ids ``[P]`` (and ``lane_corner`` is not used); ``failure(error,
                rounds)`` -> what to raise (``from error``) when any of these raised
                ``error``.
            env_steps: per lane, its env's ``step``: ``step(action)`` -> ``(observation,
                reward, terminated, truncated, info)``.
            env_name: how errors name the env.
            until_ns: no further round starts once a round ends at or after this
                ``time.perf_counter_ns()`` reading (an integer).
            stats: the ``LatencyStats`` of ``model.predict``, ``env.step`` and
                ``driver.round``, in that order; each call and round is recorded there.

        Returns:
            ``(ended, infos, rounds, lane_steps)``: the lanes whose episode ended in the last
            round (``[E]``, empty if none did), their final infos, and the rounds and
            lane-steps run.

        Raises:
            EnvError: a lane's ``step`` raised (the lane and env named, the error chained).
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
        rounds = lane_steps = 0
        ended = np.zeros(0, dtype=np.int64)
        infos: list[dict[str, Any]] = []
        while True:
            round_start = time.perf_counter_ns()
            running, predict_lanes, payload = self.begin_round()
            count = len(running)
            if count == 0:
                break
            output, predict_ns = None, 0
            if len(predict_lanes):
                predict_start = time.perf_counter_ns()
                output = self._predict(
                    model, lane_corner, payload, predict_lanes if wants_episode_ids else None
                )
                predict_ns = time.perf_counter_ns() - predict_start
                predict_stats.record(predict_ns)
            actions = lane_actions(self.take_actions(output, predict_ns), count)
            step_start = time.perf_counter_ns()
            observations, rewards, terminated, truncated, step_infos = [], [], [], [], []
            for k, lane in enumerate(self._running):
                try:
                    observation, reward, term, trunc, info = env_steps[lane](actions[k])
                except Exception as err:
                    raise env_failure(env_name, "step", err, lane) from err
                observations.append(observation)
                rewards.append(reward)
                terminated.append(term)
                truncated.append(trunc)
                step_infos.append(info)
            now = time.perf_counter_ns()
            step_stats.record(now - step_start)
            self.set_observations(running, observations)
            ended, _ = self.end_round(
                np.array(rewards, dtype=np.float64),
                np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_),
                now - step_start,
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
            if round_end >= until_ns:
                break
        return ended, infos, rounds, lane_steps

    def _predict(
        self, model: Any, lane_corner: Any, payload: Any, predict_lanes: np.ndarray | None
    ) -> Any:
        """The model's output for the open round's predict lanes; ``predict_lanes`` given
        when the model wants their episode ids."""
        count = len(self._predict_lanes)
        try:
            if predict_lanes is not None:
                episode_ids = self._ledger.episode_ids(predict_lanes)
                return model.predict_now(payload, count, episode_ids)
            if lane_corner is not None and isinstance(payload, np.ndarray):
                return model.combine([lane_corner(payload[k]) for k in range(count)], count)
            return model.predict_now(payload, count)
        except Exception as err:
            failure = model.failure(err, self._rounds)
            if failure is err:
                raise
            raise failure from err

    def __repr__(self) -> str:
        return f"RoundRunner(num_lanes={len(self._observations)}, rounds={self._rounds})"
