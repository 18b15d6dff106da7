"""Building the envs of lanes from what builds one (an id's ``gymnasium.make``, a factory):
``build_envs``, shared by ``make_lanes``, in-process lanes rebuilding a failed lane, and the
worker processes of process lanes.

Example:
    >>> import gymnasium
    >>> envs = build_envs(lambda: gymnasium.make("CartPole-v1"), 2, "CartPole", "an env")
    >>> len(envs), envs[0] is envs[1]
    (2, False)
    >>> for env in envs:
    ...     env.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

from ..errors import EnvError


def build_envs(
    factory: Callable[[], Any], count: int, what: str, expected: str, *, first_lane: int = 0
) -> list[gymnasium.Env[Any, Any]]:
    """``count`` envs from ``factory``, for lanes ``first_lane..first_lane+count-1`` (how
    messages number them); the ones already built are closed if one fails.

    Args:
        factory: a zero-argument callable returning a new ``gymnasium.Env`` per call.
        count: how many envs to build.
        what: how messages name the factory (``"gymnasium.make('CartPole-v1')"``).
        expected: what messages say the factory must do, after what went wrong.
        first_lane: the lane of the first env, for messages.

    Raises:
        EnvError: the factory raised.
        TypeError: the factory returned something other than a ``gymnasium.Env``.
        ValueError: the factory returned the same env object twice.
    """
    envs: list[gymnasium.Env[Any, Any]] = []
    lane_of: dict[int, int] = {}  # id(env) -> its lane, to refuse an env returned twice
    try:
        for lane in range(first_lane, first_lane + count):
            try:
                env = factory()
            except Exception as err:
                raise EnvError(
                    f"{what} raised {type(err).__name__} building lane {lane}: {err}; {expected}"
                ) from err
            if not isinstance(env, gymnasium.Env):
                raise TypeError(f"{what} returned {type(env).__name__} for lane {lane}; {expected}")
            other = lane_of.setdefault(id(env), lane)
            if other != lane:
                raise ValueError(
                    f"{what} returned the same env object for lanes {other} and {lane}: "
                    f"a factory must build a new env on every call"
                )
            envs.append(env)
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


__all__ = ["build_envs"]
