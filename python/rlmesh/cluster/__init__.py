"""Scale-out on Ray: the same episodes as one process, across a cluster.

``rlmesh.run(model, env, episodes=M, seed=S, cluster="ray", workers=K)`` (or ``rlmesh eval
... --ray [ADDRESS] --workers K``) cuts the episode indices into windows in a seeded shuffle
(``windows``), runs each window as a Ray task that drives the ordinary local driver with
``indices=`` (``worker``), or with ``ray_mode="actors"`` on one of ``workers`` long-lived Ray
actors that load the model once each, and merges the episodes by index as they arrive, into the one
results file when there is one (``coordinator``). The per-episode results equal a run on one
process, field for field but timings. A window whose worker dies runs again elsewhere with
the same seeds, at most ``max_retries`` times; then ``WorkerLostError``, keeping what completed.

Needs the ``ray`` extra: ``pip install "rlmesh[ray]"``. Importing this package does not import
Ray; a run does.

Example (a local Ray instance with this machine's CPUs)::

    result = rlmesh.run("my_policy.py:Policy", "CartPole-v1", episodes=400, cluster="ray",
                        workers=2, results_path="results.jsonl")
    print(result.cluster.format())  # per-worker throughput, Ray start-up, coordinator time
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .errors import (
    ClusterError,
    MergeIncompleteError,
    NotPicklableError,
    WindowFailedError,
    WorkerLostError,
)
from .report import ClusterReport, ClusterRunResult, WindowStats, WorkerStats
from .windows import deal_windows

RAY_MISSING = 'runs on Ray, which is not installed: pip install "rlmesh[ray]"'


def require_ray(what: str = 'cluster="ray"') -> ModuleType:
    """The ``ray`` module; ``ImportError`` saying what to install when it is not installed
    (``what`` names what asked for it)."""
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name != "ray":  # Ray is there but something it imports is not
            raise
        raise ImportError(f"{what} {RAY_MISSING}", name="ray") from None
    return ray


async def run_on_cluster(*args: Any, **kwargs: Any) -> ClusterRunResult:
    """The cluster run ``rlmesh.arun(..., cluster="ray")`` hands over to
    (``coordinator.run_on_cluster``)."""
    from .coordinator import run_on_cluster as run

    return await run(*args, **kwargs)


__all__ = [
    "ClusterError",
    "ClusterReport",
    "ClusterRunResult",
    "MergeIncompleteError",
    "NotPicklableError",
    "WindowFailedError",
    "WindowStats",
    "WorkerLostError",
    "WorkerStats",
    "deal_windows",
    "require_ray",
    "run_on_cluster",
]
