"""The env factory a sandboxed env server builds its envs with when ``SandboxEnv`` was given
keyword arguments for them: ``rlmesh serve env`` takes an id or a factory, not arguments, so
the server is told ``rlmesh.sandbox.factory:make_env`` and finds the source and its
arguments, as JSON, in its environment (``MAKE_VARIABLE``). Worker processes inherit the
variable, so ``workers=W`` builds the same envs.

Example:
    >>> import os
    >>> os.environ[MAKE_VARIABLE] = make_variable("Pendulum-v1", {"g": 3.0})
    >>> env = make_env()
    >>> env.unwrapped.g, env.spec.id
    (3.0, 'Pendulum-v1')
    >>> env.close(); del os.environ[MAKE_VARIABLE]
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

import gymnasium

from ..policies import load_object

MAKE_VARIABLE = "RLMESH_SANDBOX_MAKE"
"""The variable holding ``{"source": ..., "kwargs": {...}}`` as JSON."""
FACTORY = "rlmesh.sandbox.factory:make_env"
"""What the server is told to serve."""
RENDER_MODE = "render_mode"


def make_variable(source: str, kwargs: Mapping[str, Any]) -> str:
    """The value of ``MAKE_VARIABLE`` for ``source`` built with ``kwargs``.

    Raises:
        TypeError: an argument JSON cannot carry (it must cross into another interpreter);
            the message names it.
    """
    for key, value in kwargs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"SandboxEnv({source!r}, {key}=...): a {type(value).__name__} cannot cross into "
                f"the sandbox; its env's arguments must be JSON values (str, numbers, bools, "
                f"lists, dicts)"
            ) from None
    return json.dumps({"source": source, "kwargs": dict(kwargs)})


def make_env() -> Any:
    """One env of the source named in ``MAKE_VARIABLE``, built with its arguments:
    ``gymnasium.make(id, **kwargs)``, or ``factory(**kwargs)`` for ``module:fn`` /
    ``file.py:fn`` (``render_mode`` left out for a factory that does not take it)."""
    told = json.loads(os.environ[MAKE_VARIABLE])
    source, kwargs = told["source"], told["kwargs"]
    if is_factory(source):
        factory = load_object(
            source, "env", "expected a Gymnasium id, package.module:make_env or file.py:make_env"
        )
        if RENDER_MODE in kwargs and not _takes_render_mode(factory):
            # As rlmesh builds envs in-process: a factory gets render_mode only if it takes it
            # (its envs then report their own, and a run asking for frames says what is wrong).
            del kwargs[RENDER_MODE]
        return factory(**kwargs)
    return gymnasium.make(source, **kwargs)


def _takes_render_mode(factory: Any) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable that does not say: give it the keyword
        return True
    return any(p.name == RENDER_MODE or p.kind is p.VAR_KEYWORD for p in parameters)


def is_factory(source: str) -> bool:
    """Whether ``source`` names a function (``file.py:fn``, or ``module:fn`` of a module that
    has ``fn``) rather than a Gymnasium id (``CartPole-v1``, ``module:Id``)."""
    target, _, name = source.rpartition(":")
    if target.endswith(".py"):
        return True
    if not target:
        return False
    try:
        return hasattr(importlib.import_module(target), name)
    except Exception:  # an id's module that fails to import: gymnasium.make says why
        return False


__all__ = ["FACTORY", "MAKE_VARIABLE", "is_factory", "make_env", "make_variable"]
