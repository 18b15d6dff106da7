"""Stopping a run once its answer is known: ``Precision`` (what ``until=`` asks for), the
decision over the run's contiguous prefix of episodes (``PrefixStop``), and how a run ended
(``RunStop``).

``rlmesh.run(model, env, episodes=M, until=Precision(success=0.05))`` plays episodes until the
anytime-valid 95% confidence sequence of the success rate (``rlmesh.stats.sequential``) has a
half-width of at most 0.05, or until the cap M. A confidence sequence may be looked at after
every episode, which a fixed-n interval may not (docs/semantics.md, "Stopping on precision").

The decision reads only the prefix ``0..n-1`` of episode indices, in index order, never the
episodes that happened to finish first: short episodes finish first, and an estimate from them
would be biased. ``PrefixStop.offer`` takes episodes as they finish, in any order, holds back
those past a gap, and releases them in index order while the rule is not met; once it is, at
n, every other episode (finished past n, or still running) is left out, so a stopped run's
episodes are the first n of the unstopped run.

Example:
    >>> from rlmesh.results import EpisodeResult
    >>> def episode(index, success):
    ...     return EpisodeResult(index, index, index, 0, 10, 1.0, True, False, success, 0, 0, 0)
    >>> stop = PrefixStop(Precision(success=0.2), cap=100)
    >>> stop.offer(episode(1, True))  # held back: episode 0 has not finished
    []
    >>> [e.index for e in stop.offer(episode(0, True))]
    [0, 1]
    >>> for index in range(2, 100):
    ...     _ = stop.offer(episode(index, index % 4 != 0))
    >>> record = stop.record()
    >>> record.reason, record.episodes < 100, record.upper - record.lower <= 0.4
    ('precision reached', True, True)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, TypeVar

import gymnasium as gym

from ..errors import RlmeshError
from .sequential import DEFAULT_METHOD, METHODS, ConfidenceSequence, check_alpha

SUCCESS, REWARD = "success", "reward"
"""What a ``Precision`` is on: the success rate, or the mean return."""
PRECISION_REACHED = "precision reached"
CAP_REACHED = "cap reached"
UNFINISHED = "unfinished"
"""Why a run with ``until=`` ended (``RunStop.reason``): the confidence sequence was narrow
enough; every episode up to the cap was played first; the run failed or was interrupted
before either."""


class Finished(Protocol):
    """What the stopper reads of a finished episode (an ``rlmesh.EpisodeResult``; a protocol,
    so that the records' module, whose summary imports this package, is not imported)."""

    @property
    def index(self) -> int: ...

    @property
    def success(self) -> bool | None: ...

    @property
    def reward(self) -> float: ...

    @property
    def error(self) -> str | None: ...


Episode = TypeVar("Episode", bound=Finished)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Precision:
    """Stop a run once the anytime-valid confidence sequence of its success rate
    (``success=``) or mean return (``reward=``) has a half-width of at most this much.

    Args:
        success: the half-width for the success rate, in (0, 0.5): 0.05 stops at ±5 points.
        reward: the half-width for the mean return, in the return's units (``reward=10``:
            ±10); it needs the return's bounds.
        reward_bounds: ``(lo, hi)``, what an episode's return can be (CartPole-v1: (0, 500)).
            Without them, a run takes them from its env's per-step ``reward_range`` (when
            finite) times the step cap (``max_episode_steps``, the run's or the env spec's).
        alpha: 1 minus the coverage: 0.05 is a 95% confidence sequence.
        method: ``"betting"`` (the tighter for the first hundreds of episodes and near 0 or
            1) or ``"empirical_bernstein"`` (``rlmesh.stats.sequential``).

    Raises:
        ValueError: neither or both of ``success`` and ``reward``; a half-width that is not
            positive, or that [0, 1] (the bounds) already meets before any episode; bounds
            that are not finite with ``lo < hi``.

    Example:
        >>> Precision(success=0.05).describe()
        'success rate within +/-0.05 (95% confidence sequence)'
        >>> Precision(success=1.5)
        Traceback (most recent call last):
        ...
        ValueError: Precision(success=1.5): the half-width must be in (0, 0.5) ...
    """

    success: float | None = None
    reward: float | None = None
    reward_bounds: tuple[float, float] | None = None
    alpha: float = 0.05
    method: str = DEFAULT_METHOD

    def __post_init__(self) -> None:
        if (self.success is None) == (self.reward is None):
            raise ValueError(
                "Precision needs one of success= (the success rate's half-width, e.g. 0.05) "
                "or reward= (the mean return's, with reward_bounds=(lo, hi)), not "
                + ("neither" if self.success is None else "both")
            )
        set_ = object.__setattr__  # a frozen dataclass normalises its fields this way
        if self.success is not None:
            success = _number("Precision(success=)", self.success)
            if not 0 < success < 0.5:
                raise ValueError(
                    f"Precision(success={self.success}): the half-width must be in (0, 0.5) "
                    f"(0.05: stop at +/-5 points); a success rate is in [0, 1], so 0.5 is met "
                    f"before any episode"
                )
            if self.reward_bounds is not None:
                raise ValueError(
                    "Precision(success=...) takes no reward_bounds: they bound the return, "
                    "for Precision(reward=..., reward_bounds=(lo, hi))"
                )
            set_(self, "success", success)
        else:
            reward = _number("Precision(reward=)", self.reward)
            if not 0 < reward < math.inf:
                raise ValueError(
                    f"Precision(reward={self.reward}): the half-width must be a positive "
                    f"number, in the return's units"
                )
            set_(self, "reward", reward)
            if self.reward_bounds is not None:
                set_(self, "reward_bounds", _bounds(self.reward_bounds, "reward_bounds"))
                self._check_half_width()
        set_(self, "alpha", check_alpha(self.alpha))
        if self.method not in METHODS:
            raise ValueError(
                f"Precision(method=) must be one of {list(METHODS)}, got {self.method!r}"
            )

    def _check_half_width(self) -> None:
        low, high = self.reward_bounds
        if self.reward >= (high - low) / 2:
            raise ValueError(
                f"Precision(reward={self.reward:g}) is at least half the return's range "
                f"[{low:g}, {high:g}], which is met before any episode: pass a smaller one"
            )

    @property
    def target(self) -> str:
        """``SUCCESS`` or ``REWARD``."""
        return SUCCESS if self.success is not None else REWARD

    @property
    def half_width(self) -> float:
        """The half-width asked for, on [0, 1] (the return's rescaled by its bounds)."""
        if self.success is not None:
            return self.success
        if self.reward_bounds is None:
            raise ValueError("Precision(reward=...) has no reward_bounds yet: see bounded()")
        low, high = self.reward_bounds
        return self.reward / (high - low)

    def bounded(self, reward_range: Any = None, max_episode_steps: int | None = None) -> Precision:
        """This precision with the return's bounds a run will use: the declared ones, else
        an env's per-step ``reward_range`` ``(lo, hi)`` over at most ``max_episode_steps``
        steps: ``[min(lo, lo * T), max(hi, hi * T)]``. A success precision as it is.

        Raises:
            ValueError: a reward precision without declared bounds, and no finite
                ``reward_range`` with a step cap to take them from (the message names the fix).

        Example:
            >>> Precision(reward=5).bounded((0, 1), 200).reward_bounds
            (0.0, 200.0)
        """
        if self.success is not None or self.reward_bounds is not None:
            return self
        why = "the env declares no reward_range"
        if reward_range is not None:
            try:
                low, high = _bounds(reward_range, "reward_range")
            except ValueError:
                why = f"the env's reward_range {tuple(reward_range)} is not finite"
            else:
                if max_episode_steps is not None:
                    steps = int(max_episode_steps)
                    return Precision(
                        reward=self.reward,
                        reward_bounds=(min(low, low * steps), max(high, high * steps)),
                        alpha=self.alpha,
                        method=self.method,
                    )
                why = "episodes have no step cap (max_episode_steps) to bound the return by"
        raise ValueError(
            f"Precision(reward={self.reward:g}) needs bounds on an episode's return, and {why}: "
            f"pass Precision(reward={self.reward:g}, reward_bounds=(lo, hi)) (on the command "
            f"line, --reward-bounds LO HI), e.g. (0, 500) for CartPole-v1"
        )

    def to_json(self) -> dict[str, Any]:
        """The precision as plain data: a results file's header records it, and a resumed
        run must ask for the same one.

        Example:
            >>> Precision(reward=10, reward_bounds=(0, 500)).to_json()
            {'reward': 10.0, 'reward_bounds': [0.0, 500.0], 'alpha': 0.05, 'method': 'betting'}
        """
        record: dict[str, Any] = {}
        if self.success is not None:
            record["success"] = self.success
        else:
            record["reward"] = self.reward
            if self.reward_bounds is not None:
                record["reward_bounds"] = list(self.reward_bounds)
        return {**record, "alpha": self.alpha, "method": self.method}

    def describe(self) -> str:
        """What the rule asks, in words."""
        what = "success rate" if self.success is not None else "mean return"
        level = f"{round((1 - self.alpha) * 100, 6):g}%"
        return f"{what} within +/-{self.success or self.reward:g} ({level} confidence sequence)"


def _bounds(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = (float(bound) for bound in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lo, hi) of numbers, got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"{name} must be finite with lo < hi, got ({low:g}, {high:g})")
    return low, high


@dataclass(frozen=True)
class RunStop:
    """How a run with ``until=`` ended (``RunResult.stop``).

    ``rule``: the ``Precision`` as plain data (with the bounds the run used); ``reason``:
    ``PRECISION_REACHED``, ``CAP_REACHED`` or ``UNFINISHED``; ``episodes``: n, the run's
    episodes are indices ``0..n-1``; ``observations``: those the confidence sequence is over
    (failed episodes, ``on_error``, have no verdict and are left out); ``cap``: M;
    ``lower`` / ``upper``: the confidence sequence at n, in the target's units;
    ``cancelled``: the indices running when the run stopped, stopped unfinished;
    ``discarded``: the indices that finished past n, left out of the result and the file.
    """

    rule: dict[str, Any]
    reason: str
    episodes: int
    observations: int
    cap: int
    lower: float
    upper: float
    cancelled: tuple[int, ...] = ()
    discarded: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (a summary's ``"stop"``)."""
        record = asdict(self)
        record["cancelled"], record["discarded"] = list(self.cancelled), list(self.discarded)
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> RunStop:
        """The record ``to_dict`` wrote (a results file's run line keeps it)."""
        known = {field.name for field in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        values["cancelled"] = tuple(values.get("cancelled", ()))
        values["discarded"] = tuple(values.get("discarded", ()))
        return cls(**values)


class PrefixStop:
    """The stopping decision of one run, over its contiguous prefix of episode indices.

    ``offer(episode)`` takes each episode as it finishes and returns those it releases, in
    index order: the run writes and announces exactly these. ``stopped`` turns True at the
    first n where the confidence sequence is narrow enough, or at the cap; past that nothing
    is released. ``resume(episodes)`` takes the episodes a results file already holds (they
    are not released again). ``precision`` must have its bounds (``Precision.bounded``).

    Raises (from ``offer`` and ``resume``):
        RlmeshError: an episode that ran to its end has no success verdict (a success
            precision), or a return outside the bounds (a reward precision).
    """

    def __init__(self, precision: Precision, cap: int) -> None:
        self.precision = precision
        self.cap = int(cap)
        self.scale = (0.0, 1.0) if precision.success is not None else precision.reward_bounds
        if self.scale is None:
            raise ValueError("PrefixStop needs a bounded Precision (Precision.bounded)")
        self.half_width = precision.half_width
        self.sequence = ConfidenceSequence(alpha=precision.alpha, method=precision.method)
        self.counted = 0  # n: indices 0..n-1 are in
        self.reason: str | None = None
        self.discarded: list[int] = []
        self._pending: dict[int, tuple[Finished, bool]] = {}

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def resume(self, episodes: Iterable[Finished]) -> None:
        """Take the episodes a resumed results file holds, as counted before this run."""
        for episode in sorted(episodes, key=lambda episode: episode.index):
            self._take(episode, new=False)

    def offer(self, episode: Episode) -> list[Episode]:
        """Take a finished episode; return the new episodes now in the prefix, by index."""
        return self._take(episode, new=True)

    def _take(self, episode: Any, *, new: bool) -> list[Any]:
        if self.stopped or episode.index < self.counted:
            if new:
                self.discarded.append(episode.index)
            return []
        self._pending[episode.index] = (episode, new)
        released = []
        while not self.stopped and self.counted in self._pending:
            head, head_new = self._pending.pop(self.counted)
            self._observe(head)
            self.counted += 1
            if head_new:
                released.append(head)
            lower, upper = self.sequence.lower, self.sequence.upper
            if (upper - lower) / 2 <= self.half_width:
                self.reason = PRECISION_REACHED
            elif self.counted >= self.cap:
                self.reason = CAP_REACHED
        if self.stopped:
            self.discarded += [index for index, (_, new) in self._pending.items() if new]
            self._pending.clear()
        return released

    def _observe(self, episode: Finished) -> None:
        if episode.error is not None:  # a failed episode: counted, but it has no verdict
            return
        if self.precision.success is not None:
            if episode.success is None:
                raise RlmeshError(
                    f"until={self.precision!r} stops on the success rate, but episode "
                    f"{episode.index} ended with no success verdict (its env's final info "
                    f"reports no is_success / success, and the run has no success rule): pass "
                    f"success=R (success iff the return >= R; --success-reward R), or stop on "
                    f"the return with Precision(reward=..., reward_bounds=(lo, hi))"
                )
            value = float(episode.success)
        else:
            low, high = self.scale
            if not low <= episode.reward <= high:
                raise RlmeshError(
                    f"episode {episode.index}'s return {episode.reward:g} is outside the "
                    f"return's bounds [{low:g}, {high:g}] of until={self.precision!r}: the "
                    f"confidence sequence holds only for returns inside them; declare bounds "
                    f"that hold every return (reward_bounds=(lo, hi))"
                )
            value = (episode.reward - low) / (high - low)
        self.sequence.update(value)

    def record(self, cancelled: Iterable[int] = ()) -> RunStop:
        """How the run ended: ``UNFINISHED`` unless stopped; ``cancelled``: the indices the
        run stopped while they ran."""
        low, high = self.scale
        lower, upper = float(self.sequence.lower), float(self.sequence.upper)
        return RunStop(
            rule=self.precision.to_json(),
            reason=self.reason or UNFINISHED,
            episodes=self.counted,
            observations=self.sequence.n,
            cap=self.cap,
            lower=low + (high - low) * lower,
            upper=low + (high - low) * upper,
            cancelled=tuple(sorted(cancelled)),
            discarded=tuple(sorted(self.discarded)),
        )


def stopper_for(
    precision: Precision, env: Any, *, cap: int, max_episode_steps: int | None = None
) -> PrefixStop:
    """The stopper of a run of ``env`` (as ``rlmesh.run`` takes it) with ``until=precision``
    and ``cap`` episodes: a reward precision without declared bounds takes them from the
    env's per-step ``reward_range`` and the step cap (``max_episode_steps``, else the env
    spec's); ValueError naming the fix when there are none.

    Example:
        >>> stopper_for(Precision(reward=5), "CartPole-v1", cap=10)
        Traceback (most recent call last):
        ...
        ValueError: Precision(reward=5) needs bounds on an episode's return, and the env ...
    """
    steps = max_episode_steps
    if steps is None:
        spec = getattr(env, "spec", None)
        if spec is None and isinstance(env, str):
            try:
                spec = gym.spec(env)
            except gym.error.Error:  # not a registered id (a served env's address)
                spec = None
        steps = getattr(spec, "max_episode_steps", None)
    return PrefixStop(precision.bounded(getattr(env, "reward_range", None), steps), cap=cap)
