"""A built-in suite on a real local Ray cluster: each worker builds its own simulators from
the suite's tasks, and the episodes equal a local run's."""

from __future__ import annotations

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import rlmesh  # noqa: E402
from helpers import CORES, comparable  # noqa: E402
from rlmesh import benchmarks  # noqa: E402
from test_benchmarks_served import pusher  # noqa: E402


@pytest.mark.parametrize("core", CORES)
def test_a_builtin_suite_on_ray_equals_the_local_run(core, tmp_path):
    tasks = benchmarks.suite("pusht", episodes=6, max_episode_steps=10, seed=8)
    on_ray = rlmesh.run_suite(
        pusher, tasks, core=core, num_envs=2, cluster="ray", workers=2,
        results_path=tmp_path / "pusht.jsonl",
    )  # fmt: skip
    assert on_ray["pusht"].cluster is not None
    local = rlmesh.run_suite(pusher, tasks, core=core, num_envs=3)
    # pymunk gives one seed rewards that differ in their last bits from run to run.
    drop = ("env_index", "task")
    assert comparable(on_ray["pusht"], drop=drop, reward_digits=9) == comparable(
        local["pusht"], drop=drop, reward_digits=9
    )
