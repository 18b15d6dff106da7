"""Which episodes succeeded: the one rule rlmesh uses everywhere.

For each episode, in this order:

1. **env info**: the env's final ``info`` holds ``is_success`` (else ``success``). This wins
   whenever it is there.
2. **a user rule**: ``rlmesh.run(..., success=fn)`` with ``fn(EpisodeResult) -> bool``, or
   ``success=R`` (CLI ``--success-reward R``): success iff the episode's total reward >= R.
3. **the env spec's** ``reward_threshold`` (CartPole-v1: 475), as Gymnasium and SB3 use it.
4. otherwise success is **not available**: ``EpisodeResult.success`` is None, the success rate
   is None, and tables show "n/a". It never falls back to ``terminated`` (which for CartPole
   means the pole fell, and for most envs says nothing of success).

A ``SuccessRule`` is steps 2-4 for one run, fixed before it starts (``rule_for``) and written
in the results file's header (``to_json`` / ``from_json``), so ``rlmesh report`` and a resumed
run judge and label episodes as the run did. Step 1 is per episode: ``EpisodeResult.
success_reported`` says the env reported it, and ``describe`` names what a run used.

Example:
    >>> rule = rule_for(None, "CartPole-v1")
    >>> rule.label
    'reward >= 475.0 (env spec reward_threshold)'
    >>> rule_for(200, "CartPole-v1").label
    'reward >= 200.0 (user rule)'
    >>> rule_for(None, "Pendulum-v1").label  # no reward_threshold
    'not available'
    >>> describe(rule, episodes=10, reported=10)
    'env info'
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from ..errors import HookError
from ..remote.address import is_address
from ..utils import vector_spec

ENV_INFO = "env info"
NOT_AVAILABLE = "not available"

# Rule kinds, as the results file header records them.
USER_RULE = "user rule"  # a callable
USER_REWARD = "user reward"  # success=R / --success-reward R
ENV_SPEC = "env spec"  # the env spec's reward_threshold
NONE = "none"
KINDS = (USER_RULE, USER_REWARD, ENV_SPEC, NONE)


class Judged(Protocol):
    """What a rule reads of an episode (an ``rlmesh.EpisodeResult``): its slot and return.

    A protocol, so this module needs neither the records nor the lanes it judges."""

    @property
    def index(self) -> int: ...

    @property
    def reward(self) -> float: ...


class Built(Protocol):
    """What ``SuccessRule.for_lanes`` reads of built lanes (``rlmesh.lanes.Lanes``)."""

    @property
    def spec(self) -> EnvSpec | None: ...


@dataclass(frozen=True)
class SuccessRule:
    """How a run judges an episode whose env did not report success (steps 2-4 above).

    ``kind`` is one of ``KINDS``; ``reward_threshold`` is R for ``"user reward"`` and
    ``"env spec"`` (None for an env spec still to be read from the lanes a factory builds);
    ``predicate`` is the user's callable and ``name`` its qualified name.

    Example:
        >>> SuccessRule(USER_REWARD, reward_threshold=1.5).label
        'reward >= 1.5 (user rule)'
    """

    kind: str
    reward_threshold: float | None = None
    name: str | None = None
    predicate: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)
    # Verdicts of a user rule by episode index: the driver builds an episode's result more than
    # once, and a user's function runs once per episode (a raise is remembered as None).
    _verdicts: dict[int, bool | None] = field(
        default_factory=dict, compare=False, repr=False, init=False
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"success rule kind {self.kind!r}: expected one of {KINDS}")

    @property
    def pending(self) -> bool:
        """An env spec's threshold to be read once the lanes exist (an env factory)."""
        return self.kind == ENV_SPEC and self.reward_threshold is None

    @property
    def calls_user_code(self) -> bool:
        return self.predicate is not None

    @property
    def label(self) -> str:
        """What the summary says of this rule."""
        if self.kind == USER_RULE:
            return f"user rule ({self.name})" if self.name else "user rule"
        if self.kind == USER_REWARD:
            return f"reward >= {self.reward_threshold!r} (user rule)"
        if self.kind == ENV_SPEC:
            if self.reward_threshold is None:
                return "reward >= the env spec reward_threshold (read from the lanes)"
            return f"reward >= {self.reward_threshold!r} (env spec reward_threshold)"
        return NOT_AVAILABLE

    def verdict(self, episode: Judged) -> bool | None:
        """This rule's verdict on ``episode`` (None when the rule has none to give).

        Raises:
            HookError: the user's rule raised or did not return a bool.
        """
        if self.kind in (USER_REWARD, ENV_SPEC) and self.reward_threshold is not None:
            return bool(episode.reward >= self.reward_threshold)
        if self.predicate is None:
            return None
        if episode.index in self._verdicts:
            return self._verdicts[episode.index]
        self._verdicts[episode.index] = None  # stays None if the rule raises
        try:
            outcome = self.predicate(episode)
        except Exception as exc:
            raise HookError(
                f"the success rule {self.name} raised {type(exc).__name__} on episode "
                f"{episode.index}: {exc}; it must take an EpisodeResult and return a bool"
            ) from exc
        if not isinstance(outcome, (bool, np.bool_)):
            raise HookError(
                f"the success rule {self.name} returned {type(outcome).__name__} "
                f"{outcome!r} for episode {episode.index}; expected a bool"
            )
        self._verdicts[episode.index] = bool(outcome)
        return bool(outcome)

    def for_lanes(self, lanes: Built) -> SuccessRule:
        """The rule with a pending env spec read from the built ``lanes`` (``Lanes.spec``):
        its ``reward_threshold``, else not available (no spec, or one without a threshold).
        """
        if not self.pending:
            return self
        return _from_threshold(_threshold_of(lanes.spec))

    def to_json(self) -> dict[str, Any]:
        """The rule as the results file header records it (no callable: its verdicts are in
        the episode lines)."""
        return {"kind": self.kind, "reward_threshold": self.reward_threshold, "name": self.name}

    @classmethod
    def from_json(cls, record: Any) -> SuccessRule:
        """The rule a header recorded (``to_json``); a file from before rules is ``none``."""
        if not isinstance(record, dict):
            return cls(NONE)
        threshold = record.get("reward_threshold")
        return cls(
            record.get("kind", NONE),
            reward_threshold=None if threshold is None else float(threshold),
            name=record.get("name"),
        )


def rule_for(success: Any, env: Any) -> SuccessRule:
    """The run's rule from ``rlmesh.run``'s ``success=`` and ``env=`` arguments.

    Args:
        success: None (the env spec's ``reward_threshold``, else not available), a number R
            (reward >= R), a callable ``fn(EpisodeResult) -> bool``, or a ``SuccessRule``.
        env: the run's env argument: an id (``"CartPole-v1"``, ``"module:Id"``), a
            ``gymnasium.Env``, a ``VectorEnv``, or a factory or a served env's address (its spec
            is read from the lanes it builds: ``SuccessRule.for_lanes``).

    Raises:
        TypeError: ``success`` is none of these; ValueError: R is nan.

    Example:
        >>> rule_for(lambda episode: episode.steps > 100, "CartPole-v1").label
        'user rule (<lambda>)'
    """
    if isinstance(success, SuccessRule):
        return success
    if callable(success):
        name = getattr(success, "__qualname__", None) or type(success).__name__
        return SuccessRule(USER_RULE, name=name, predicate=success)
    if isinstance(success, (int, float, np.integer, np.floating)) and not isinstance(
        success, (bool, np.bool_)
    ):
        threshold = float(success)
        if math.isnan(threshold):
            raise ValueError("success=nan: a reward threshold must be a number (not nan)")
        return SuccessRule(USER_REWARD, reward_threshold=threshold)
    if success is not None:
        raise TypeError(
            f"success= must be None, a reward threshold (a number) or a callable "
            f"fn(EpisodeResult) -> bool, got {type(success).__name__}"
        )
    if isinstance(env, str) and not is_address(env):
        return _from_threshold(_id_threshold(env))
    if isinstance(env, (gym.Env, gym.vector.VectorEnv)):
        return _from_threshold(_spec_threshold(env))
    return SuccessRule(ENV_SPEC)  # a factory: pending until its lanes are built


def describe(rule: SuccessRule, *, episodes: int, reported: int) -> str:
    """What a run of ``episodes`` episodes used, ``reported`` of them judged by the env.

    Example:
        >>> describe(SuccessRule(NONE), episodes=10, reported=4)
        'env info (4 of 10 episodes), else not available'
    """
    if episodes and reported == episodes:
        return ENV_INFO
    if reported == 0:
        return rule.label
    return f"{ENV_INFO} ({reported} of {episodes} episodes), else {rule.label}"


def _from_threshold(threshold: float | None) -> SuccessRule:
    if threshold is None:
        return SuccessRule(NONE)
    return SuccessRule(ENV_SPEC, reward_threshold=float(threshold))


def _id_threshold(env_id: str) -> float | None:
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)  # as gymnasium.make does, for its registrations
        return gym.spec(name).reward_threshold
    except Exception:  # an unknown id: building the lanes says so, with the proper error
        return None


def _spec_threshold(env: gym.Env[Any, Any] | gym.vector.VectorEnv[Any, Any, Any]) -> float | None:
    spec = vector_spec(env) if isinstance(env, gym.vector.VectorEnv) else env.spec
    return _threshold_of(spec)


def _threshold_of(spec: EnvSpec | None) -> float | None:
    return None if spec is None else spec.reward_threshold
