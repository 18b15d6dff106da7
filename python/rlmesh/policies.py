"""Policies named by a string: loading a ``POLICY``, the built-in policies, policy identity.

A ``POLICY`` string is a built-in (``random``, ``cartpole-heuristic``), ``package.module:Name``
or ``path/to/file.py:Name``. ``rlmesh eval``, ``rlmesh serve model`` and a cluster's workers
(which receive the model by its name) all load it here, with ``load_policy``; a results file
records it as ``policy_identity`` says. This module sits below the command line and the
cluster: it imports neither.

Example:
    >>> type(load_policy("cartpole-heuristic", lambda: None)).__name__
    'CartPoleHeuristic'
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .adapters import Action, Custom, ModelSpec
from .model import Model


class UsageError(Exception):
    """Bad input from the user (a ``POLICY`` that does not load, a bad command-line option):
    the ``rlmesh`` command prints it as one line and exits with code 2."""


# ---------------------------------------------------------------------------- built-in policies


def observation_digest(obs: Any, digest: int = 0) -> int:
    """A CRC-32 of every leaf of a raw observation, whatever its space: arrays and numbers by
    their bytes, strings by their UTF-8, dicts, tuples and lists walked in order.

    Example:
        >>> observation_digest((14, 10, 0)) == observation_digest((14, 10, 1))
        False
    """
    if isinstance(obs, dict):
        for value in obs.values():
            digest = observation_digest(value, digest)
        return digest
    if isinstance(obs, (tuple, list)):
        for value in obs:
            digest = observation_digest(value, digest)
        return digest
    if isinstance(obs, str):
        return zlib.crc32(obs.encode("utf-8"), digest)
    return zlib.crc32(np.ascontiguousarray(obs).tobytes(), digest)


class RandomPolicy(Model):
    """Samples the action space, for any observation space (Tuple, Text, ... included).

    The draw is seeded by a digest of the raw observation, which descends from the episode's
    seed: the policy is a pure function, so its results are reproducible and the same for any
    ``--num-envs`` (a per-lane RNG would depend on which lane ran what).
    """

    # The whole raw observation, reduced to its digest: no space needs a leaf the model reads.
    spec = ModelSpec(input=Custom(observation_digest), output=Action(clip=False))

    def __init__(self, action_space: gym.Space | None = None) -> None:
        super().__init__()
        self.action_space = action_space
        # Without a space given (a suite: one policy, several envs), each run's env's.
        self._space_from_route = action_space is None

    def on_route(self, route: Any) -> None:
        if self._space_from_route:
            self.action_space = route.action_space

    def predict(self, digest: int) -> Any:
        self.action_space.seed(int(digest))  # the lane's value may come back as a numpy int
        return self.action_space.sample()


class CartPoleHeuristic(Model):
    """Push toward where the pole is falling: balances CartPole-v1 for all 500 steps."""

    def predict_batch(self, obs: np.ndarray) -> np.ndarray:  # obs: [N, 4]
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


BUILTIN_POLICIES = ("random", "cartpole-heuristic")


# ---------------------------------------------------------------------------- loading by name


def load_object(spec: str, what: str, expected: str) -> Any:
    """The object ``package.module:Name`` or ``path/to/file.py:Name`` names (``what`` and
    ``expected`` phrase the ``UsageError`` when it does not load)."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise UsageError(f"{what} {spec!r}: {expected}")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"{what} {spec!r}: no file {target}; {expected}")
            module = _load_file(path)
        else:
            module = importlib.import_module(target)
    except UsageError:
        raise
    except Exception as exc:  # any error of the user's module is theirs to fix: one line
        raise UsageError(
            f"{what} {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not hasattr(module, name):
        raise UsageError(f"{what} {spec!r}: {target} has no attribute {name!r}")
    return getattr(module, name)


def _load_file(path: Path) -> Any:
    """The module ``path`` defines, registered as ``sys.modules[path.stem]`` as ``import``
    would, so worker processes receive its functions by reference (pickle imports them by
    module name). A module of that file already there is reused, as ``import`` does, and keeps
    the identity of what it defines; a name held by another module is left alone, and the
    file runs unregistered. The file's directory goes on sys.path, so it can import its
    neighbours."""
    resolved = path.resolve()
    name = path.stem
    held = sys.modules.get(name)
    held_file = getattr(held, "__file__", None)
    if held_file is not None and Path(held_file).resolve() == resolved:
        return held  # its directory went on sys.path when it was loaded
    sys.path.insert(0, str(resolved.parent))
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    register = held is None
    if register:
        sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        if register:
            sys.modules.pop(name, None)
        raise
    return module


def load_policy(spec: str, action_space: Callable[[], gym.Space]) -> Any:
    """The policy ``spec`` names: a built-in, ``package.module:Name`` or ``file.py:Name``.

    ``Name`` may be a ``Model`` subclass (instantiated without arguments), a ``Model`` instance
    or a callable ``fn(obs) -> action``. ``action_space()`` is called only for ``random``.
    Anything that does not load is a ``UsageError`` saying what was expected.
    """
    if spec == "random":
        return RandomPolicy(action_space())
    if spec == "cartpole-heuristic":
        return CartPoleHeuristic()
    expected = (
        "expected package.module:Name, path/to/file.py:Name, or a built-in "
        f"({', '.join(BUILTIN_POLICIES)})"
    )
    policy = load_object(spec, "policy", expected)
    name = spec.rpartition(":")[2]
    if isinstance(policy, type):
        if not issubclass(policy, Model):
            raise UsageError(
                f"policy {spec!r}: {name} is a class but not a rlmesh.Model subclass; expected "
                "a Model subclass, a Model instance or a function fn(obs) -> action"
            )
        try:
            return policy()
        except Exception as exc:
            raise UsageError(
                f"policy {spec!r}: {name}() failed: {type(exc).__name__}: {exc}; a Model "
                "subclass given by name must construct without arguments"
            ) from None
    if not callable(policy) and not isinstance(policy, Model):
        raise UsageError(
            f"policy {spec!r}: {name} is a {type(policy).__name__}; expected a Model subclass, "
            "a Model instance or a function fn(obs) -> action"
        )
    return policy


def policy_identity(spec: str) -> tuple[str, str | None]:
    """How a results file records the policy ``spec`` names: ``(name, sha256 of its source)``.

    A file path is resolved, so ``./pols.py:parity`` and ``pols.py:parity`` are one policy;
    ``module:Name`` stays as given and its hash is of the module's source file; a built-in has
    no source file (None). A resume refuses a file whose hash differs (the policy's code
    changed) unless ``--allow-changed-policy``. Call it after ``load_policy`` succeeded.

    Example:
        >>> policy_identity("random")
        ('random', None)
    """
    if spec in BUILTIN_POLICIES:
        return spec, None
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        source: str | None = str(Path(target).resolve())
        spec = f"{source}:{name}"
    else:
        source = getattr(importlib.import_module(target), "__file__", None)
    if source is None:  # a namespace package: no file holds its code
        return spec, None
    return spec, hashlib.sha256(Path(source).read_bytes()).hexdigest()


@contextlib.contextmanager
def current_directory_on_path() -> Iterator[None]:
    """Let ``POLICY`` and ``--env`` name modules in the current directory, as ``python -m``
    does (an installed ``rlmesh`` script starts with its own directory on ``sys.path``); the
    entry is taken off again afterwards, for callers of ``main`` in a longer-lived process."""
    here = os.getcwd()
    if any(entry in ("", ".", here) for entry in sys.path):
        yield
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        if here in sys.path:
            sys.path.remove(here)
