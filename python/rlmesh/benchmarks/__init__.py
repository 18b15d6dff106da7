"""The robot benchmarks built in: LIBERO, PushT, ALOHA and Meta-World, as suites.

Each benchmark is one module holding one Gymnasium env class, registered here under an id
(``rlmesh/LIBERO-v0``, ``rlmesh/PushT-v0``, ``rlmesh/ALOHA-v0``, ``rlmesh/MetaWorld-v0``), and
its suites' facts (``SuiteInfo``: tasks, episodes per task, step cap, the extra that installs
it, the protocol's source). ``suite(name)`` turns a suite into ``Task`` objects for
``run_suite``, which ``rlmesh eval POLICY --suite NAME`` runs; ``rlmesh benchmarks`` lists
them. Nothing here imports a simulator: each env builds its own at its first reset, in the
process that steps it, so worker processes, served envs and Ray workers build their own.

Every benchmark env takes the run's trial index (``metadata["rlmesh.trial_index"]``) where
the benchmark has fixed initial states, so episode k of a task is the same episode on any
number of lanes, workers or machines.

Example:
    >>> from rlmesh import benchmarks
    >>> "libero_spatial" in benchmarks.names()
    True
    >>> tasks = benchmarks.suite("libero_spatial", episodes=2, image_size=128)
    >>> len(tasks), tasks[0].episodes, tasks[0].max_episode_steps, tasks[0].env_kwargs["image_size"]
    (10, 2, 220, 128)
    >>> benchmarks.suite("libero_spacial")
    Traceback (most recent call last):
    ...
    ValueError: no built-in suite named 'libero_spacial'; the built-in suites are ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..suites import Task
from . import aloha, libero, metaworld, pusht
from .base import BenchmarkNotInstalledError, SuiteInfo, import_benchmark, simulator_stack

SUITES: Mapping[str, SuiteInfo] = {
    name: info
    for module in (libero, pusht, aloha, metaworld)
    for name, info in module.SUITES.items()
}
"""Every built-in suite by name, in the order ``rlmesh benchmarks`` lists them."""


def names() -> list[str]:
    """The built-in suites' names.

    Example:
        >>> names()[:2]
        ['libero_spatial', 'libero_object']
    """
    return list(SUITES)


def info(name: str) -> SuiteInfo:
    """The facts of built-in suite ``name``; a ``ValueError`` listing the names otherwise."""
    try:
        return SUITES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"no built-in suite named {name!r}; the built-in suites are {', '.join(SUITES)}"
        ) from None


def suite(
    name: str,
    *,
    episodes: int | None = None,
    max_episode_steps: int | None = None,
    seed: int = 0,
    **options: Any,
) -> list[Task]:
    """The tasks of built-in suite ``name``, ready for ``rlmesh.run_suite``.

    Args:
        name: a built-in suite (``names()``).
        episodes: episodes per task (default: the benchmark's standard protocol, as
            ``info(name).episodes``).
        max_episode_steps: the step cap (default: the protocol's, ``info(name).
            max_episode_steps``); a shorter one makes a quick check.
        seed: the base seed of every task's episodes.
        **options: the suite's options (``info(name).options``: LIBERO's ``image_size`` and
            ``cameras``, for example), given to every task's env.

    Raises:
        ValueError: an unknown suite or option; the message lists the valid ones.

    Example:
        >>> [task.name for task in suite("aloha", episodes=1)]
        ['insertion', 'transfer_cube']
    """
    facts = info(name)
    unknown = sorted(set(options) - set(facts.options))
    if unknown:
        known = ", ".join(facts.options) or "none"
        raise ValueError(f"suite {name!r} has no option {unknown[0]!r}; its options are {known}")
    chosen = {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in {**facts.options, **options}.items()
    }
    kwargs = facts.task_kwargs or tuple({} for _ in facts.tasks)
    return [
        Task(
            task,
            facts.env,
            env_kwargs={**own, **chosen},
            episodes=facts.episodes if episodes is None else episodes,
            seed=seed,
            max_episode_steps=(
                facts.max_episode_steps if max_episode_steps is None else max_episode_steps
            ),
        )
        for task, own in zip(facts.tasks, kwargs, strict=True)
    ]


__all__ = [
    "SUITES",
    "BenchmarkNotInstalledError",
    "SuiteInfo",
    "import_benchmark",
    "info",
    "names",
    "simulator_stack",
    "suite",
]
