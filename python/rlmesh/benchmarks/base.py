"""What every built-in benchmark shares: a suite's facts, the import of its package, and the
record of the simulator stack a score was measured on.

A benchmark module (``libero.py``, ``pusht.py``, ...) defines one Gymnasium env class that
builds its simulator lazily (in the process that steps it: a GL context must not cross a
fork) and a ``SUITES`` table of ``SuiteInfo``. Its package is imported through
``import_benchmark`` only, so a missing package is a one-line error naming the extra.

Example:
    >>> info = SuiteInfo(
    ...     name="demo", benchmark="Demo", extra="demo", module="gymnasium", env="CartPole-v1",
    ...     tasks=("balance",), episodes=10, max_episode_steps=500, source="Gymnasium's docs",
    ... )
    >>> info.installed()
    True
    >>> import_benchmark("no_such_simulator", extra="demo", benchmark="Demo")
    Traceback (most recent call last):
    ...
    rlmesh.benchmarks.base.BenchmarkNotInstalledError: Demo needs the 'demo' extra: pip ...
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


class BenchmarkNotInstalledError(ImportError):
    """A built-in benchmark's package is missing; the message names the extra to install."""


def import_benchmark(module: str, *, extra: str, benchmark: str) -> ModuleType:
    """``importlib.import_module(module)``, or ``BenchmarkNotInstalledError`` naming ``extra``.

    Only a missing ``module`` itself becomes that error: a package that is there but fails
    to import (a wrong mujoco, a missing GL library) raises its own error, which says more.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or module.split(".")[0] != exc.name.split(".")[0]:
            raise
        raise BenchmarkNotInstalledError(
            f"{benchmark} needs the {extra!r} extra: pip install 'rlmesh[{extra}]' "
            f"(cannot import {module})"
        ) from None


@dataclass(frozen=True)
class SuiteInfo:
    """One built-in suite, as ``rlmesh benchmarks`` lists it and ``suite(name)`` builds it.

    Args:
        name: the suite's name (``rlmesh eval --suite NAME``).
        benchmark: the benchmark's name in messages ("LIBERO").
        extra: the extra that installs it (``pip install 'rlmesh[EXTRA]'``).
        module: the module whose presence means it is installed.
        env: the Gymnasium id its tasks make (``"rlmesh.benchmarks:rlmesh/LIBERO-v0"``).
        tasks: the tasks' names, in order (``Task.name``).
        episodes: episodes per task by default (the benchmark's standard protocol).
        max_episode_steps: the step cap per episode (the benchmark's standard protocol).
        source: where the protocol's numbers come from (a paper or a repository file).
        task_kwargs: each task's ``env_kwargs`` (one per task, same order as ``tasks``);
            the suite's options are added to them.
        options: the options ``suite(name, **options)`` accepts, with their defaults.
        served_specs: ready-made ``ModelSpec`` factories by protocol (``"openpi"``,
            ``"vla-eval"``): the input a policy served over that protocol conventionally
            takes on this benchmark, so ``rlmesh eval openpi://HOST:PORT --suite NAME``
            needs no user code.
    """

    name: str
    benchmark: str
    extra: str
    module: str
    env: str
    tasks: tuple[str, ...]
    episodes: int
    max_episode_steps: int
    source: str
    task_kwargs: tuple[Mapping[str, Any], ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    served_specs: Mapping[str, Callable[[], Any]] = field(default_factory=dict)

    def installed(self) -> bool:
        """Whether the benchmark's package can be imported (found, not imported)."""
        return importlib.util.find_spec(self.module.split(".")[0]) is not None


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def simulator_stack(
    distributions: tuple[str, ...], *, extra: Callable[[], Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The simulator stack a benchmark's scores depend on: the first installed of
    ``distributions`` with its version, mujoco's version and the GL backend (``MUJOCO_GL``),
    since scores move between simulator stacks.

    Example:
        >>> stack = simulator_stack(("gymnasium",))
        >>> stack["distribution"], sorted(stack)
        ('gymnasium', ['MUJOCO_GL', 'distribution', 'mujoco', 'version'])
    """
    found = next(
        ((name, version) for name in distributions if (version := distribution_version(name))),
        (None, None),
    )
    record: dict[str, Any] = {
        "distribution": found[0],
        "version": found[1],
        "mujoco": distribution_version("mujoco"),
        "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
    }
    if extra is not None:
        record.update(extra())
    return record
