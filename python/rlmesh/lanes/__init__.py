"""Lanes: everything that holds envs, behind the one seam the driver steps (``Lanes``).

The package: ``base.py`` the protocol (its required and optional members, and the accessors
that read the optional ones), ``build.py`` building envs, and one module per kind.
``make_lanes`` turns whatever was passed as ``env=`` into ``Lanes`` of one kind:

- an address (``"tcp://host:port"``, ``"host:port"``, ``"unix:///path"``): the lanes of the
  env served there, a ``rlmesh.RemoteEnv`` (``lanes/remote.py``);
- a Gymnasium id (``"CartPole-v1"``): ``num_envs`` lanes, each ``gymnasium.make(id,
  **env_kwargs)``, in ``InProcessLanes`` (``lanes/in_process.py``);
- a ``gymnasium.Env`` instance: ``InProcessLanes`` of that one lane;
- a zero-argument callable returning a ``gymnasium.Env``: ``InProcessLanes`` of ``num_envs``
  lanes, one call each;
- a ``gymnasium.vector.VectorEnv``: ``VectorEnvLanes`` over its lanes (``lanes/vector_env.py``);
- anything that implements ``Lanes`` itself, as it is;
- with ``workers=W > 1``, an id or a picklable factory: ``ProcessLanes``, ``num_envs`` lanes
  in ``W`` worker processes that build their envs themselves (``lanes/process``).

A new kind of lanes implements the same protocol; the driver needs no change for it. (The
former names ``LaneVector`` and ``VectorLanes`` stay importable as aliases.)

``InProcessLanes`` step any subset of their lanes and never reset a lane by themselves: the
driver resets every episode with its seed, and a lane left without an episode simply stops
being stepped, so it costs nothing. A ``VectorEnv`` steps all its lanes in lockstep;
``VectorEnvLanes`` follow its ``metadata["autoreset_mode"]``: with ``DISABLED`` the driver
resets ended lanes itself (masked, seeded resets); with ``NEXT_STEP`` and ``SAME_STEP`` the env
restarts ended lanes on its own, unseeded, and ``env_episode_ids`` counts those restarts for
``RoundRunner.observe_rolls``.

Trial indices: an env that sweeps a fixed list of initial states declares
``metadata["rlmesh.trial_index"] = True`` (exactly ``True``). Its resets then get
``options={"trial_index": t}``, ``t`` the episode's global index ``trial_index_base + slot``.
Envs that do not declare it never receive the option, since many envs refuse unknown options.
Restarts an autoresetting vector does on its own carry no options, so no trial index.

Example:
    >>> import numpy as np
    >>> lanes = make_lanes("CartPole-v1", num_envs=3)
    >>> lanes.num_lanes, lanes.lockstep, lanes.resets_itself, lanes.accepts_trial_index
    (3, False, False, False)
    >>> observations, infos = lanes.reset(np.arange(3), seeds=[0, 1, 2], trials=[0, 1, 2])
    >>> len(observations), observations[0].shape
    (3, (4,))
    >>> batch = lanes.step(np.array([2, 0]), np.array([1, 0]))  # lane 1 waits
    >>> batch.stepped, batch.rewards, batch.terminated, len(batch.observations)
    (array([2, 0]), array([1., 1.]), array([False, False]), 2)
    >>> lanes.close()
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
from gymnasium.vector import VectorEnv

from ..remote.address import is_address
from ..utils import positive_int
from .base import (
    TRIAL_INDEX_FLAG,
    TRIAL_INDEX_OPTION,
    Lanes,
    OptionalLaneMembers,
    PipelinedLanes,
    RenderingLanes,
    ResetBatch,
    StepBatch,
    core_steps,
    lanes_accepts_trial_index,
    lanes_autoreset,
    lanes_core_calls_step,
    lanes_pipelined,
    lanes_render_fps,
    lanes_rendering,
    lanes_round_step,
)
from .build import build_envs
from .in_process import InProcessLanes
from .vector_env import VectorEnvLanes

LaneVector = InProcessLanes
"""The former name of ``InProcessLanes``."""
VectorLanes = VectorEnvLanes
"""The former name of ``VectorEnvLanes``."""

ENV_FORMS = (
    "a Gymnasium id (str), a gymnasium.Env instance, a zero-argument callable returning a "
    "gymnasium.Env, or a gymnasium.vector.VectorEnv"
)


def make_lanes(
    env: Any,
    *,
    num_envs: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    workers: int = 1,
    restart_workers: int = 0,
    record_latency: Callable[[str, int], None] | None = None,
    render_mode: str | None = None,
    core: str | None = None,
) -> Lanes:
    """The lanes for ``env=``: see the module docstring for what each form becomes.

    Args:
        env: a served env's address, a Gymnasium id, a ``gymnasium.Env``, a zero-argument
            callable returning a ``gymnasium.Env``, a ``gymnasium.vector.VectorEnv``, or
            ``Lanes`` of any kind
            (returned as they are).
        num_envs: how many lanes to build from an id or a factory (default 1). With an env
            instance it may only be 1, with a vector only its ``num_envs``.
        env_kwargs: keyword arguments for ``gymnasium.make``; only with an id.
        workers: with more than 1, ``ProcessLanes``: the lanes run in this many worker
            processes (``lanes/process``), built there from an id or a picklable factory.
        restart_workers, record_latency: with ``workers > 1``, passed to ``ProcessLanes``.
        render_mode: build the envs with this ``render_mode`` (``"rgb_array"`` to record
            videos from ``render()``): passed to ``gymnasium.make`` with an id, and to a
            factory that takes a ``render_mode`` keyword; envs made elsewhere keep theirs.
        core: with a served env's address, whose transport dials it (``"rust"`` or
            ``"python"``; default the active core).

    Raises:
        EnvError: ``gymnasium.make`` or the factory raised (an unknown id, a bad keyword).
        RemoteError: no env server answered at the address, or it refused the session.
        TypeError: ``env`` is none of the forms above, or the factory returned something
            other than a ``gymnasium.Env``.
        ValueError: ``num_envs < 1``, a ``num_envs`` the env cannot have, ``env_kwargs``
            without an id, a factory that returned the same env twice, or ``workers > 1``
            with an env that cannot be rebuilt in a worker (an instance, a vector, lanes).

    Example:
        >>> lanes = make_lanes("Pendulum-v1", num_envs=2, env_kwargs={"g": 9.81})
        >>> lanes
        InProcessLanes(Pendulum-v1, num_lanes=2)
        >>> lanes.close()
    """
    if num_envs is not None:
        num_envs = positive_int("num_envs", num_envs)
    if env_kwargs is not None and not isinstance(env, str):
        raise ValueError(
            f"env_kwargs is passed to gymnasium.make, so it needs env= to be a Gymnasium id, "
            f"got {type(env).__name__}: build the env with its arguments yourself"
        )
    if render_mode is not None:
        env, env_kwargs = _rendering(env, env_kwargs, render_mode)
    if workers > 1:
        return _process_lanes(
            env, num_envs or 1, env_kwargs, workers, restart_workers, record_latency
        )
    if isinstance(env, Lanes):
        if num_envs not in (None, env.num_lanes):
            raise ValueError(
                f"env= is Lanes of {env.num_lanes} lanes, but num_envs={num_envs}: omit num_envs"
            )
        return env
    if isinstance(env, str) and is_address(env):
        if env_kwargs is not None:
            raise ValueError(
                f"env_kwargs is passed to gymnasium.make, but env={env!r} is a served env: "
                f"give the arguments to the server that builds it"
            )
        return _remote(env, num_envs, core)
    if isinstance(env, str):
        kwargs = dict(env_kwargs or {})

        def make() -> gymnasium.Env[Any, Any]:
            return gymnasium.make(env, **kwargs)

        return InProcessLanes(
            build_envs(
                make,
                num_envs or 1,
                f"gymnasium.make({env!r})",
                "env= as a str must be an id registered with Gymnasium, e.g. 'CartPole-v1' "
                "(import the package that registers it first)",
            ),
            factory=make,
        )
    if isinstance(env, VectorEnv):
        if num_envs not in (None, env.num_envs):
            raise ValueError(
                f"env= is a VectorEnv with num_envs={env.num_envs}, but num_envs={num_envs}: "
                f"omit num_envs or build the vector with the lanes you want"
            )
        return VectorEnvLanes(env)
    if isinstance(env, gymnasium.Env):
        if num_envs not in (None, 1):
            raise ValueError(
                f"env= is one gymnasium.Env instance, which is one lane, but num_envs="
                f"{num_envs}: pass a Gymnasium id or a zero-argument factory to build "
                f"{num_envs} lanes"
            )
        return InProcessLanes([env])
    if callable(env):
        name = getattr(env, "__qualname__", type(env).__name__)
        return InProcessLanes(
            build_envs(
                env,
                num_envs or 1,
                f"the env factory {name}()",
                "env= as a callable must build a gymnasium.Env when called with no arguments",
            ),
            factory=env,
        )
    missing = [name for name in _LANES_MEMBERS if not hasattr(env, name)]
    if hasattr(env, "num_lanes") and missing:  # meant as Lanes: say what it lacks
        raise TypeError(
            f"env= {type(env).__name__} has num_lanes but is not rlmesh.lanes.Lanes: it lacks "
            f"{', '.join(missing)} (see the Lanes protocol in rlmesh/lanes/base.py)"
        )
    raise TypeError(f"env= must be {ENV_FORMS}; got {type(env).__name__}")


# What the Lanes protocol asks of an object, in its order.
_LANES_MEMBERS = tuple(
    name for name in (*Lanes.__annotations__, *vars(Lanes)) if not name.startswith("_")
)


def _rendering(
    env: Any, env_kwargs: Mapping[str, Any] | None, render_mode: str
) -> tuple[Any, Mapping[str, Any] | None]:
    """``env`` and ``env_kwargs`` that build envs in ``render_mode``, where rlmesh builds them:
    an id gets ``render_mode`` among its ``gymnasium.make`` keywords, a factory that takes the
    keyword is called with it. Anything else is returned as it is."""
    if isinstance(env, str) and not is_address(env):
        return env, {**(env_kwargs or {}), "render_mode": render_mode}
    if isinstance(env, (Lanes, VectorEnv, gymnasium.Env, type)) or not callable(env):
        return env, env_kwargs
    try:
        parameters = inspect.signature(env).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable that does not say
        return env, env_kwargs
    if any(p.name == "render_mode" or p.kind is p.VAR_KEYWORD for p in parameters):
        return functools.partial(env, render_mode=render_mode), env_kwargs
    return env, env_kwargs


def _remote(address: str, num_envs: int | None, core: str | None) -> Lanes:
    """The lanes served at ``address`` (over ``core``'s transport); ``num_envs`` must be the
    server's width, or None."""
    from ..remote import require_grpc

    require_grpc("run on a served env")
    from .remote import RemoteEnv

    lanes = RemoteEnv(address, core=core)
    if num_envs not in (None, lanes.num_lanes):
        lanes.close()
        raise ValueError(
            f"the env served at {lanes.address} has {lanes.num_lanes} lane(s), but num_envs="
            f"{num_envs}: omit num_envs, or serve it with --num-envs {num_envs}"
        )
    return lanes


def _process_lanes(
    env: Any,
    num_envs: int,
    env_kwargs: Mapping[str, Any] | None,
    workers: int,
    restart_workers: int,
    record_latency: Callable[[str, int], None] | None,
) -> Lanes:
    if isinstance(env, str) and is_address(env):
        raise ValueError(
            f"workers={workers} builds the envs in local worker processes, but env={env!r} is "
            f"a served env: its server steps its lanes; omit workers"
        )
    for kind, what in ((Lanes, "Lanes"), (VectorEnv, "a VectorEnv"), (gymnasium.Env, "an env")):
        if isinstance(env, kind):
            raise ValueError(
                f"workers={workers} builds the envs inside worker processes, but env= is "
                f"{what} instance ({type(env).__name__}), which cannot be rebuilt there: pass "
                f"a Gymnasium id or a module-level zero-argument factory"
            )
    from .process import ProcessLanes

    return ProcessLanes(
        env,
        num_envs=num_envs,
        workers=workers,
        env_kwargs=env_kwargs,
        restart_workers=restart_workers,
        record_latency=record_latency,
    )


__all__ = [
    "ENV_FORMS",
    "TRIAL_INDEX_FLAG",
    "TRIAL_INDEX_OPTION",
    "InProcessLanes",
    "LaneVector",
    "Lanes",
    "OptionalLaneMembers",
    "PipelinedLanes",
    "ProcessLanes",
    "RenderingLanes",
    "ResetBatch",
    "StepBatch",
    "VectorEnvLanes",
    "VectorLanes",
    "build_envs",
    "core_steps",
    "lanes_accepts_trial_index",
    "lanes_autoreset",
    "lanes_core_calls_step",
    "lanes_pipelined",
    "lanes_render_fps",
    "lanes_rendering",
    "lanes_round_step",
    "make_lanes",
]


def __getattr__(name: str) -> Any:
    # ProcessLanes imports multiprocessing machinery: only on first use.
    if name == "ProcessLanes":
        from .process import ProcessLanes

        return ProcessLanes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
