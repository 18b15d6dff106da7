"""Scale-out on Ray: one process beside ``cluster="ray", workers=2`` on a CPU-heavy env.

The workload is ``cpu_heavy``'s env (about 1 ms of CPU a step, episodes of 100 to 300 steps)
and its policy, ``CLUSTER_EPISODES`` seeded episodes. The cluster side starts its own local
Ray instance inside the timed call (no Ray running before it), so its time includes Ray's
start-up and shut-down, as a user's first run pays them; the run's ``ClusterReport`` gives the
start-up alone, the coordinator's time per window and Ray's dispatch per window.
``report.py`` times the full workload (one run a side: a sample lasts minutes) and prints the
extrapolation to more nodes; the suite here runs a short one.

Run: ``pytest benches/test_bench_cluster_ray.py --benchmark-enable``.
"""

from __future__ import annotations

import pytest
import rlmesh
from cpu_heavy import ENV_ID, LOAD_S, SlowToLoad, policy

CLUSTER_EPISODES = 400
SUITE_EPISODES = 8
CLUSTER_WORKERS = 2
SEED = 0
LOADING_WINDOW_EPISODES = 2  # short windows, so loading the model per window costs
LOADING_WINDOWS = 32


def run_single(episodes: int = CLUSTER_EPISODES) -> rlmesh.RunResult:
    """The episodes on this process alone: one lane, as a user would start."""
    return rlmesh.run(policy, ENV_ID, episodes=episodes, seed=SEED)


def run_cluster(
    episodes: int = CLUSTER_EPISODES, workers: int = CLUSTER_WORKERS
) -> rlmesh.RunResult:
    """The same episodes on a local Ray instance this call starts and shuts down."""
    return rlmesh.run(policy, ENV_ID, episodes=episodes, seed=SEED, cluster="ray", workers=workers)


def run_slow_to_load(
    ray_mode: str, windows: int = LOADING_WINDOWS, workers: int = CLUSTER_WORKERS
) -> rlmesh.RunResult:
    """``SlowToLoad`` on ``windows`` windows of ``LOADING_WINDOW_EPISODES`` episodes, on the
    Ray instance this process is connected to, its windows run as ``ray_mode`` says."""
    return rlmesh.run(
        SlowToLoad(), ENV_ID, episodes=windows * LOADING_WINDOW_EPISODES, seed=SEED,
        cluster="ray", workers=workers, ray_mode=ray_mode,
        window_episodes=LOADING_WINDOW_EPISODES,
    )  # fmt: skip


def per_episode(result: rlmesh.RunResult) -> list[tuple]:
    return [
        (e.index, e.seed, e.steps, e.reward, e.terminated, e.truncated) for e in result.episodes
    ]


def test_single_process(benchmark):
    benchmark.group = "CPU-heavy env, one process vs cluster='ray' (start-up included)"
    result = benchmark.pedantic(run_single, args=(SUITE_EPISODES,), rounds=1)
    assert result.num_episodes == SUITE_EPISODES


def test_cluster_two_workers(benchmark):
    pytest.importorskip("ray", reason='Ray is not installed: pip install "rlmesh[ray]"')
    benchmark.group = "CPU-heavy env, one process vs cluster='ray' (start-up included)"
    result = benchmark.pedantic(run_cluster, args=(SUITE_EPISODES,), rounds=1)
    assert per_episode(result) == per_episode(run_single(SUITE_EPISODES))
    benchmark.extra_info["startup_s"] = result.cluster.startup_s
    benchmark.extra_info["coordinator_s_per_window"] = result.cluster.coordinator_s_per_window


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for the actor-mode cases, shut down after them."""
    ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "rlmesh[ray]"')
    ray.init(num_cpus=CLUSTER_WORKERS, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.mark.parametrize("ray_mode", ["tasks", "actors"])
def test_a_model_slow_to_load(benchmark, local_ray, ray_mode):
    benchmark.group = f"a model whose load takes {LOAD_S} s, ray_mode tasks vs actors"
    result = benchmark.pedantic(run_slow_to_load, args=(ray_mode, 4), rounds=1)
    assert len(result.cluster.windows) == 4
