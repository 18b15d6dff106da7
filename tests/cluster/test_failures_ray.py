"""Failure isolation through Ray (``cluster="ray"``): every window's run records or retries
its env failures as a run on one process does, on a real local Ray cluster of 2 CPUs."""

from __future__ import annotations

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import rlmesh  # noqa: E402 - after the skip: only with Ray
from test_failures import CORES, FAILURES, SEEDS, attempts, flaky, policy, rows  # noqa: E402


@pytest.mark.parametrize("core", CORES)
def test_on_error_reaches_the_windows_of_a_cluster_run(tmp_path, core):
    cluster = {"cluster": "ray", "workers": 2, "window_episodes": 3}
    local = rlmesh.run(policy, flaky(tmp_path / "a", FAILURES), seeds=SEEDS, on_error="record")
    recorded = rlmesh.run(
        policy,
        flaky(tmp_path / "b", FAILURES),
        seeds=SEEDS,
        on_error="record",
        core=core,
        **cluster,
    )
    assert recorded.failed_indices == [2, 5, 8]
    assert [e.error for e in recorded.episodes] == [e.error for e in local.episodes]
    assert rows(recorded) == rows(local)
    # Retried in the windows: one failure each, one retry each, nothing recorded.
    transient = {seed: (step, 1) for seed, (step, _) in FAILURES.items()}
    retried = rlmesh.run(
        policy,
        flaky(tmp_path / "c", transient),
        seeds=SEEDS,
        on_error="retry",
        max_retries=1,
        core=core,
        **cluster,
    )
    assert retried.failed_indices == []
    assert [attempts(tmp_path / "c", seed) for seed in transient] == [2, 2, 2]
    assert rows(retried) == rows(rlmesh.run(policy, flaky(tmp_path / "d"), seeds=SEEDS))
