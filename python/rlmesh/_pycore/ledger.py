"""The episode ledger of one route: slot claims, seeds, episode identity and per-lane scores.

Mirrors ``rust/src/ledger.rs`` name for name. This file is the executable specification: the
Rust core must produce the same results, the same errors and the same warnings.

``RouteLedger`` is internal to the ``RoundRunner`` (``rounds.py``), which builds one per run
and is the only caller of its methods; neither core exports it. ``EpisodeStarts`` and
``EpisodeSummary``, what the runner returns, are exported.

A *route* is one set of lanes (env instances ``0..N-1``) driven against one model. Every lane
is in one of four states:

- ``vacant``: holds no episode and may start one (every lane at first, and after completion);
- ``running``: holds an episode that is being stepped, either *scored* (it claimed a slot) or
  *surplus* (a lockstep vector had to start it after the budget was spent);
- ``ended``: ``record_step`` saw its episode terminate or truncate; it awaits
  ``complete_episodes``;
- ``idle``: asked to start an episode when no slot was left, so it is never stepped again.

A run of ``M`` episodes is done when slots ``0..M-1`` have all completed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .args import I64_MAX, check_lanes, count_arg, i64_arg, same_length, u64_arg, vector
from .digests import hex_digest
from .seeding import episode_seed

VACANT = "vacant"
RUNNING = "running"
ENDED = "ended"
IDLE = "idle"

OVERFLOWS = ("idle", "surplus")
MAX_LANES = 1 << 24


def _items(values: Any, name: str) -> enumerate[Any]:
    """``enumerate(values)``, or a ValueError naming ``name`` when it is not iterable."""
    try:
        return enumerate(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a sequence of integers, got {type(values).__name__}"
        ) from None


def _checked_indices(indices: Any, episodes: int) -> list[int]:
    """The slots to run: strictly increasing, each in ``0..episodes-1``, at least one."""
    checked: list[int] = []
    for k, value in _items(indices, "indices"):
        index = u64_arg(value, f"indices[{k}]")
        if index >= episodes:
            raise ValueError(f"indices[{k}] is {index}, outside the slots 0..{episodes - 1}")
        if checked and index <= checked[-1]:
            raise ValueError(
                f"indices must be strictly increasing, but indices[{k}] is {index} after "
                f"{checked[-1]}"
            )
        checked.append(index)
    if not checked:
        raise ValueError("indices must name at least one slot")
    return checked


@dataclass(frozen=True)
class EpisodeSummary:
    """One completed, scored episode.

    ``seed`` is None when the environment chose the episode's start itself (an autoresetting
    vector); ``success`` is None when the final ``info`` said nothing about success. ``error``
    is None for an episode that ended, or the ``"<Type>: <message>"`` of the env failure it was
    abandoned with (``RoundRunner.abandon``); such an episode holds the steps and reward up to
    the failing call, and is neither terminated nor truncated. ``reset_digest`` and
    ``trajectory_digest`` are the episode's digests (``digests``: 16 hex digits), None when its
    first observation never arrived or the runner keeps no digests.
    """

    index: int
    episode_id: int
    seed: int | None
    trial: int
    env_index: int
    steps: int
    reward: float
    terminated: bool
    truncated: bool
    success: bool | None
    duration_s: float
    predict_ms: float
    step_ms: float
    error: str | None = None
    reset_digest: str | None = None
    trajectory_digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in declaration order."""
        return asdict(self)


@dataclass(frozen=True)
class EpisodeStarts:
    """What one ``RoundRunner.start`` or ``observe_rolls`` call started.

    Scored starts (all arrays of shape ``[S]``, int64, in the order the lanes were given):
    ``lanes``, ``episode_ids``, ``indices`` (slot numbers), ``trials``, and ``seeds``, a list of
    ``S`` ints or None where the environment chose the start itself. ``surplus_lanes`` and
    ``surplus_episode_ids`` (``[U]``) are started but never scored; a lane in neither went
    idle.
    """

    lanes: np.ndarray
    episode_ids: np.ndarray
    indices: np.ndarray
    seeds: list[int | None]
    trials: np.ndarray
    surplus_lanes: np.ndarray
    surplus_episode_ids: np.ndarray


# An episode's (reset, trajectory) digests, as the runner's ``LaneDigests.episode`` gives them.
Digests = tuple[int | None, int | None]


def _digests_of(digests: Sequence[Digests] | None, count: int) -> list[Digests]:
    """Each of ``count`` lanes' digests: none when ``digests`` is None."""
    if digests is None:
        return [(None, None)] * count
    listed = list(digests)
    same_length("digests", listed, range(count))
    return listed


def _int64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class RouteLedger:
    """The per-route bookkeeping a ``RoundRunner`` advances every step (internal to it).

    Args:
        num_lanes: ``N >= 1`` lanes, numbered ``0..N-1``.
        episodes: the budget ``M >= 1``; slots ``0..M-1`` are scored, in the order episodes
            start.
        seeds: slot ``k`` resets with ``seeds[k]``. A list shorter than ``M`` warns, and the
            later slots use the derived seed.
        base_seed: slot ``k`` without a listed seed resets with
            ``episode_seed(base_seed, trial_index_base + k)``; None means 0.
        trial_index_base: the global index of slot 0 (a shard of a larger evaluation starts
            past 0); slot ``k``'s trial is ``trial_index_base + k``; None means 0.
        indices: run only these slots (strictly increasing, each in ``0..M-1``), e.g. the ones
            a resumed results file is missing; they are claimed in this order and keep their
            seeds and trials. Default: all of ``0..M-1``.

    Example (what ``RoundRunner.start``, ``end_round`` and ``finish`` do with it):
        >>> ledger = RouteLedger(2, 3)
        >>> starts = ledger.start_episodes([0, 1], now_ns=0, overflow="idle")
        >>> starts.indices.tolist(), starts.seeds == [episode_seed(0, 0), episode_seed(0, 1)]
        ([0, 1], True)
        >>> ledger.record_step([0, 1], [1.0, 1.0], [True, False], [False, False],
        ...                    [10, 10], [5, 5]).tolist()
        [0]
        >>> [s.index for s in ledger.complete_episodes([0], [0], [None], now_ns=100)]
        [0]
    """

    def __init__(
        self,
        num_lanes: int,
        episodes: int,
        *,
        seeds: Sequence[int] | None = None,
        base_seed: int | None = 0,
        trial_index_base: int | None = 0,
        indices: Sequence[int] | None = None,
    ) -> None:
        num_lanes = count_arg(num_lanes, "num_lanes")
        if num_lanes > MAX_LANES:
            raise ValueError(f"num_lanes must be at most {MAX_LANES}, got {num_lanes}")
        episodes = count_arg(episodes, "episodes")
        base_seed = 0 if base_seed is None else u64_arg(base_seed, "base_seed")
        trial_index_base = (
            0 if trial_index_base is None else u64_arg(trial_index_base, "trial_index_base")
        )
        # Indices and trials travel as int64 arrays.
        if trial_index_base + episodes - 1 > I64_MAX:
            raise ValueError(
                f"trial_index_base + episodes must not exceed 2**63, got "
                f"{trial_index_base} + {episodes}"
            )
        listed = (
            [] if seeds is None else [u64_arg(s, f"seeds[{k}]") for k, s in _items(seeds, "seeds")]
        )
        if seeds is not None and len(listed) < episodes:
            warnings.warn(
                f"seeds has {len(listed)} entries for {episodes} episodes: slots "
                f"{len(listed)}..{episodes - 1} reset with "
                f"episode_seed(base_seed={base_seed}, trial_index_base + slot)",
                UserWarning,
                stacklevel=3,  # the RoundRunner's caller, as the Rust core warns
            )

        # The slots this ledger runs, in claim order: all of 0..M-1, or the given subset.
        self._slots: Sequence[int] = (
            range(episodes) if indices is None else _checked_indices(indices, episodes)
        )
        # Counted once: len() of a range past 2**63 overflows.
        self._slot_count = episodes if indices is None else len(self._slots)
        self._num_lanes = num_lanes
        self._episodes = episodes
        self._seeds = listed
        self._base_seed = base_seed
        self._trial_index_base = trial_index_base
        self._slots_claimed = 0
        # Slots whose episode was abandoned to be played again: claimed before any new slot,
        # lowest first.
        self._returned: list[int] = []
        self._completed = 0
        self._wasted_steps = 0
        self._ignored_completions = 0
        self._next_episode_id = 0
        self._summaries: list[EpisodeSummary] = []
        # Episodes that ended after the model predicted on them and whose end the model has
        # not been told yet.
        self._untold_model_ends: set[int] = set()

        self._state = [VACANT] * num_lanes
        self._episode_id = [-1] * num_lanes
        self._surplus = [False] * num_lanes
        self._index = [-1] * num_lanes
        self._seed: list[int | None] = [None] * num_lanes
        self._trial = [0] * num_lanes
        self._steps = [0] * num_lanes
        self._reward = [0.0] * num_lanes
        self._step_ns = [0] * num_lanes
        self._predict_ns = [0] * num_lanes
        self._terminated = [False] * num_lanes
        self._truncated = [False] * num_lanes
        self._started_ns = [0] * num_lanes
        self._predicted = [False] * num_lanes
        self._env_episode_id: list[int | None] = [None] * num_lanes

    # ------------------------------------------------------------------ properties

    @property
    def num_lanes(self) -> int:
        return self._num_lanes

    @property
    def done(self) -> bool:
        """True once every slot this ledger runs (all ``M``, or ``indices``) has completed."""
        return self._completed == self._slot_count

    @property
    def wasted_steps(self) -> int:
        """Lane-steps spent on surplus episodes."""
        return self._wasted_steps

    # ------------------------------------------------------------------ slots and seeds

    def _seed_for(self, slot: int) -> int:
        """The reset seed of slot ``slot`` (``0..M-1``): ``seeds[slot]`` if listed, else derived."""
        if slot < len(self._seeds):
            return self._seeds[slot]
        return episode_seed(self._base_seed, self._trial_index_base + slot)

    def _claim_slots(self, count: int) -> Sequence[int]:
        """Claim the next ``count`` slots, or as many as remain: the returned ones first."""
        again = self._returned[:count]
        del self._returned[:count]
        count -= len(again)
        remaining = self._slot_count - self._slots_claimed
        granted = min(count, remaining)
        first = self._slots_claimed
        self._slots_claimed += granted
        return [*again, *self._slots[first : first + granted]]

    def _begin(self, lane: int, slot: int | None, seeded: bool, now_ns: int) -> int:
        """Put a new episode on ``lane``: scored on ``slot``, or surplus when it is None."""
        episode_id = self._next_episode_id
        self._next_episode_id += 1
        self._state[lane] = RUNNING
        self._episode_id[lane] = episode_id
        self._surplus[lane] = slot is None
        self._index[lane] = -1 if slot is None else slot
        self._seed[lane] = self._seed_for(slot) if slot is not None and seeded else None
        self._trial[lane] = 0 if slot is None else self._trial_index_base + slot
        self._steps[lane] = 0
        self._reward[lane] = 0.0
        self._step_ns[lane] = 0
        self._predict_ns[lane] = 0
        self._terminated[lane] = False
        self._truncated[lane] = False
        self._started_ns[lane] = now_ns
        self._predicted[lane] = False
        return episode_id

    def _start(self, lanes: list[int], overflow: str, seeded: bool, now_ns: int) -> EpisodeStarts:
        slots = self._claim_slots(len(lanes))
        started, ids, indices, seeds, trials = [], [], [], [], []
        surplus, surplus_ids = [], []
        for position, lane in enumerate(lanes):
            if position < len(slots):
                slot = slots[position]
                started.append(lane)
                ids.append(self._begin(lane, slot, seeded, now_ns))
                indices.append(slot)
                seeds.append(self._seed[lane])
                trials.append(self._trial[lane])
            elif overflow == "surplus":
                surplus.append(lane)
                surplus_ids.append(self._begin(lane, None, seeded, now_ns))
            else:
                self._state[lane] = IDLE
        return EpisodeStarts(
            lanes=_int64(started),
            episode_ids=_int64(ids),
            indices=_int64(indices),
            seeds=seeds,
            trials=_int64(trials),
            surplus_lanes=_int64(surplus),
            surplus_episode_ids=_int64(surplus_ids),
        )

    def start_episodes(self, lanes: Any, *, now_ns: int, overflow: str) -> EpisodeStarts:
        """Start a seeded episode on each of ``lanes`` (shape ``[K]``), claiming slots in order.

        The first lanes get the next free slots. The lanes left without a slot go ``idle``
        (``overflow="idle"``, lanes that step alone) or run unscored surplus episodes
        (``overflow="surplus"``, a lockstep vector that must step every lane); the runner
        checked ``overflow``.

        Raises:
            ValueError: a bad clock reading, a lane out of range or given twice, or a lane
                that is not vacant.
        """
        now_ns = i64_arg(now_ns, "now_ns")
        checked = check_lanes(vector(lanes, "int64", "lanes"), self._num_lanes)
        for lane in checked:
            self._require_vacant(lane)
        return self._start(checked, overflow, True, now_ns)

    def observe_rolls(self, lanes: Any, env_episode_ids: Any, *, now_ns: int) -> EpisodeStarts:
        """Start a fresh, env-seeded episode on each lane whose env-side episode id changed.

        For vectors that reset lanes themselves (Gymnasium's NEXT_STEP and SAME_STEP
        autoreset). ``env_episode_ids`` (shape ``[K]``) are any per-lane ids the env side
        gives its episodes, e.g. a counter of the lane's autoresets. The first id observed on a
        lane is its baseline and starts nothing. A lane whose id changed must hold no episode
        (complete the old one first); it claims the next slot, or runs a surplus episode when
        none is left. Its seed is None: the environment chose the start.

        Raises:
            ValueError: mismatched lengths, a bad lane, or a lane that rolled while its episode
                was still running.
        """
        now_ns = i64_arg(now_ns, "now_ns")
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(env_episode_ids, "int64", "env_episode_ids")
        same_length("env_episode_ids", ids_array, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        env_ids = ids_array.tolist()
        rolled = []
        for lane, env_id in zip(checked, env_ids, strict=True):
            previous = self._env_episode_id[lane]
            if previous is not None and previous != env_id:
                self._require_vacant(lane, f"rolled to env episode {env_id} but ")
                rolled.append(lane)
        for lane, env_id in zip(checked, env_ids, strict=True):
            self._env_episode_id[lane] = env_id
        return self._start(rolled, "surplus", False, now_ns)

    def _require_vacant(self, lane: int, context: str = "") -> None:
        state = self._state[lane]
        if state in (RUNNING, ENDED):
            raise ValueError(
                f"lane {lane} {context}still holds {state} episode {self._episode_id[lane]}: "
                f"complete it before starting another"
            )
        if state == IDLE:
            raise ValueError(
                f"lane {lane} {context}is idle: no slot was left for it, so it starts no other "
                f"episode"
            )

    # ------------------------------------------------------------------ steps

    def record_step(
        self,
        lanes: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        step_ns: Any,
        predict_ns: Any,
    ) -> np.ndarray:
        """Account one env step for a group of running lanes; return the lanes that ended.

        Args:
            lanes: ``[K]`` int, the running lanes that were stepped.
            rewards: ``[K]`` float, this step's reward per lane.
            terminated, truncated: ``[K]`` bool, as the env returned them.
            step_ns: ``[K]`` int, the env step's wall time charged to each lane.
            predict_ns: ``[K]`` int, the model time charged to each lane for this step.

        Returns:
            ``[E]`` int64: the lanes (in the order given) whose episode terminated or
            truncated. They are ``ended`` until ``complete_episodes`` is called for them.

        Raises:
            ValueError: mismatched lengths, a bad lane, a lane that is not running, or a
                negative timing.
        """
        lanes_array = vector(lanes, "int64", "lanes")
        columns = {
            "rewards": vector(rewards, "float64", "rewards"),
            "terminated": vector(terminated, "bool", "terminated"),
            "truncated": vector(truncated, "bool", "truncated"),
            "step_ns": vector(step_ns, "int64", "step_ns"),
            "predict_ns": vector(predict_ns, "int64", "predict_ns"),
        }
        for name, column in columns.items():
            same_length(name, column, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        rows = list(zip(checked, *(column.tolist() for column in columns.values()), strict=True))
        for lane, _, _, _, step, predict in rows:
            if self._state[lane] != RUNNING:
                raise ValueError(
                    f"lane {lane} is {self._state[lane]}, not running: only running lanes "
                    f"may be stepped"
                )
            if step < 0 or predict < 0:
                raise ValueError(
                    f"lane {lane} has step_ns={step}, predict_ns={predict}: timings must be "
                    f"non-negative"
                )

        ended = []
        for lane, reward, term, trunc, step, predict in rows:
            self._steps[lane] += 1
            self._reward[lane] += reward
            self._step_ns[lane] += step
            self._predict_ns[lane] += predict
            if self._surplus[lane]:
                self._wasted_steps += 1
            if term or trunc:
                self._state[lane] = ENDED
                self._terminated[lane] = term
                self._truncated[lane] = trunc
                ended.append(lane)
        return _int64(ended)

    def complete_episodes(
        self,
        lanes: Any,
        episode_ids: Any,
        success: Sequence[bool | None] | None = None,
        *,
        now_ns: int,
        digests: Sequence[Digests] | None = None,
    ) -> list[EpisodeSummary]:
        """Close the ended episodes ``episode_ids`` (``[K]``) on ``lanes`` (``[K]``).

        ``success`` holds, per lane, what the final ``info`` said (``is_success``, else
        ``success``, else None); None for all lanes when omitted. ``digests`` holds, per
        lane, the episode's ``(reset, trajectory)`` digests (ints or None); none when omitted.
        A completion for an episode the lane no longer holds, or one reported twice, is
        ignored and counted in ``ignored_completions``. Each completed lane becomes
        ``vacant``.

        Returns:
            The summaries of the scored episodes completed, in the order given (surplus
            episodes complete silently).

        Raises:
            ValueError: mismatched lengths, a bad lane, or an episode that is still running.
        """
        now_ns = i64_arg(now_ns, "now_ns")
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids_array, lanes_array)
        outcomes = (
            [None] * len(lanes_array)
            if success is None
            else [None if outcome is None else bool(outcome) for outcome in success]
        )
        same_length("success", outcomes, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        ids = ids_array.tolist()
        for lane, episode_id in zip(checked, ids, strict=True):
            if self._state[lane] == RUNNING and self._episode_id[lane] == episode_id:
                raise ValueError(
                    f"lane {lane} episode {episode_id} is still running: record_step has not "
                    f"seen it terminate or truncate"
                )

        completed = []
        lane_digests = _digests_of(digests, len(checked))
        for lane, episode_id, outcome, digest in zip(
            checked, ids, outcomes, lane_digests, strict=True
        ):
            if self._state[lane] != ENDED or self._episode_id[lane] != episode_id:
                self._ignored_completions += 1
                continue
            if not self._surplus[lane]:
                summary = self._summarize(lane, outcome, now_ns, digests=digest)
                self._summaries.append(summary)
                self._completed += 1
                completed.append(summary)
            if self._predicted[lane]:
                self._untold_model_ends.add(episode_id)
            self._state[lane] = VACANT
            self._episode_id[lane] = -1
            self._surplus[lane] = False
            self._index[lane] = -1
            self._seed[lane] = None
            self._predicted[lane] = False
        return completed

    def abandon_episodes(
        self,
        lanes: Any,
        errors: Sequence[str | None],
        *,
        now_ns: int,
        digests: Sequence[Digests] | None = None,
    ) -> list[EpisodeSummary]:
        """Abandon the running episodes of ``lanes`` (``[K]``), whose env failed.

        ``errors[k]`` None gives lane ``lanes[k]``'s slot back: the next ``start_episodes``
        claims it again (returned slots first, lowest first), with its seed and trial. A text
        records the episode as failed with that error: its summary holds the steps and reward
        recorded so far (and ``digests[k]``, the digests of those steps), its clock ends at
        ``now_ns``, and it counts as completed. A surplus
        episode is abandoned silently. Either way the lane becomes ``vacant`` and the model is
        owed the episode's end if it predicted on it.

        Returns:
            The summaries of the episodes recorded as failed, in the order given.

        Raises:
            ValueError: mismatched lengths, a bad clock reading, a lane out of range or given
                twice, or a lane that is not running.
            TypeError: an error that is neither None nor a str.
        """
        now_ns = i64_arg(now_ns, "now_ns")
        errors = list(errors)
        for k, error in enumerate(errors):
            if error is not None and not isinstance(error, str):
                raise TypeError(
                    f"errors[{k}] must be None (play the slot again) or a str (the error the "
                    f"episode failed with), got {type(error).__name__}"
                )
        lanes_array = vector(lanes, "int64", "lanes")
        same_length("errors", errors, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        for lane in checked:
            if self._state[lane] != RUNNING:
                raise ValueError(
                    f"lane {lane} is {self._state[lane]}, not running: only a running episode "
                    f"can be abandoned"
                )
        failed = []
        lane_digests = _digests_of(digests, len(checked))
        for lane, error, digest in zip(checked, errors, lane_digests, strict=True):
            if not self._surplus[lane]:
                if error is None:
                    self._returned.append(self._index[lane])
                else:
                    summary = self._summarize(lane, None, now_ns, error, digest)
                    self._summaries.append(summary)
                    self._completed += 1
                    failed.append(summary)
            if self._predicted[lane]:
                self._untold_model_ends.add(self._episode_id[lane])
            self._state[lane] = VACANT
            self._episode_id[lane] = -1
            self._surplus[lane] = False
            self._index[lane] = -1
            self._seed[lane] = None
            self._predicted[lane] = False
        self._returned.sort()
        return failed

    def _summarize(
        self,
        lane: int,
        success: bool | None,
        now_ns: int,
        error: str | None = None,
        digests: Digests = (None, None),
    ) -> EpisodeSummary:
        steps = self._steps[lane]
        # An episode that failed before its first step has no per-step means: 0.
        per_step_ms = 1e6 * steps or float("inf")
        return EpisodeSummary(
            index=self._index[lane],
            episode_id=self._episode_id[lane],
            seed=self._seed[lane],
            trial=self._trial[lane],
            env_index=lane,
            steps=steps,
            reward=self._reward[lane],
            terminated=self._terminated[lane],
            truncated=self._truncated[lane],
            success=success,
            duration_s=float(now_ns - self._started_ns[lane]) / 1e9,
            predict_ms=float(self._predict_ns[lane]) / per_step_ms,
            step_ms=float(self._step_ns[lane]) / per_step_ms,
            error=error,
            reset_digest=None if digests[0] is None else hex_digest(digests[0]),
            trajectory_digest=None if digests[1] is None else hex_digest(digests[1]),
        )

    # ------------------------------------------------------------------ model lifecycle

    def mark_predicted(self, lanes: Any) -> None:
        """Note that the model predicted for the running episodes of ``lanes`` (``[K]``).

        Each such episode's end is then owed to the model exactly once, through
        ``take_model_ends`` or ``take_all_model_ends``.
        """
        checked = check_lanes(vector(lanes, "int64", "lanes"), self._num_lanes)
        for lane in checked:
            if self._state[lane] != RUNNING:
                raise ValueError(
                    f"lane {lane} is {self._state[lane]}, not running: the model cannot have "
                    f"predicted for it"
                )
        for lane in checked:
            self._predicted[lane] = True

    def take_model_ends(self, episode_ids: Any) -> np.ndarray:
        """Of ``episode_ids`` (``[K]``), those whose end the model is owed; each only once.

        Returns ``[E]`` int64 ids in the order given: completed episodes the model predicted
        on and has not been told about. Taking them marks them told.
        """
        ids = vector(episode_ids, "int64", "episode_ids").tolist()
        owed = []
        for episode_id in ids:
            if episode_id in self._untold_model_ends:
                self._untold_model_ends.remove(episode_id)
                owed.append(episode_id)
        return _int64(owed)

    def take_all_model_ends(self) -> np.ndarray:
        """At teardown: every episode the model predicted on and was not told the end of.

        Returns ``[E]`` int64 ids in ascending order: completed ones not yet taken, and the
        running or ended ones the model predicted on. Taking them marks them told.
        """
        owed = set(self._untold_model_ends)
        self._untold_model_ends.clear()
        for lane in range(self._num_lanes):
            if self._predicted[lane]:
                owed.add(self._episode_id[lane])
                self._predicted[lane] = False
        return _int64(sorted(owed))

    # ------------------------------------------------------------------ queries

    def episode_ids(self, lanes: Any) -> np.ndarray:
        """The episode each of ``lanes`` holds (``[K]`` int64, -1 for none)."""
        checked = check_lanes(vector(lanes, "int64", "lanes"), self._num_lanes)
        return _int64([self._episode_id[lane] for lane in checked])

    def _lanes_in(self, state: str) -> np.ndarray:
        return _int64([lane for lane in range(self._num_lanes) if self._state[lane] == state])

    def running_lanes(self) -> np.ndarray:
        """Lanes whose episode (scored or surplus) is being stepped, ascending."""
        return self._lanes_in(RUNNING)

    def summaries(self) -> list[EpisodeSummary]:
        """Every scored episode completed so far, in completion order."""
        return list(self._summaries)

    def snapshot(self) -> dict[str, Any]:
        """All observable state as plain Python values, for parity checks and debugging."""
        lanes = [
            {
                "state": self._state[lane],
                "episode_id": self._episode_id[lane],
                "surplus": self._surplus[lane],
                "index": self._index[lane],
                "seed": self._seed[lane],
                "trial": self._trial[lane],
                "steps": self._steps[lane],
                "reward": self._reward[lane],
                "terminated": self._terminated[lane],
                "truncated": self._truncated[lane],
                "predicted": self._predicted[lane],
                "env_episode_id": self._env_episode_id[lane],
            }
            for lane in range(self._num_lanes)
        ]
        return {
            "num_lanes": self._num_lanes,
            "episodes": self._episodes,
            "indices": None if isinstance(self._slots, range) else list(self._slots),
            "base_seed": self._base_seed,
            "trial_index_base": self._trial_index_base,
            "slots_claimed": self._slots_claimed,
            "returned_slots": list(self._returned),
            "completed": self._completed,
            "wasted_steps": self._wasted_steps,
            "ignored_completions": self._ignored_completions,
            "next_episode_id": self._next_episode_id,
            "untold_model_ends": sorted(self._untold_model_ends),
            "lanes": lanes,
            "summaries": [summary.to_dict() for summary in self._summaries],
        }
