"""Episode digests on a real local Ray cluster (``ray.init(num_cpus=2)``, once for the module):
windows run by two Ray workers give every episode the digests of the same episodes run in this
process, on both cores, for CartPole, Pendulum and a Dict observation."""

from __future__ import annotations

import pytest

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (the ray extra): pip install "rlmesh[ray]"'
)
pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")  # conftest.py

import rlmesh  # noqa: E402
from envs_for_digests import CAPS, ENVS  # noqa: E402


def digests_of(result):
    return [(e.index, e.seed, e.reset_digest, e.trajectory_digest) for e in result.episodes]


@pytest.mark.parametrize("env_key", sorted(ENVS))
def test_ray_windows_give_the_digests_of_a_run_in_this_process(env_key):
    env, _, policy = ENVS[env_key]
    options = {"episodes": 9, "seed": 7, "max_episode_steps": CAPS[env_key]}
    reference = digests_of(rlmesh.run(policy, env, **options))
    core = "python" if env_key == "dict" else "rust"  # each core on a cluster at least once
    result = rlmesh.run(policy, env, cluster="ray", workers=2, core=core, **options)
    assert result.cluster.workers == 2
    assert digests_of(result) == reference
