"""The CartPole workloads on the published ``rlmesh==0.1.0``, run inside its own virtual env.

``report.py --peer`` runs this script with the peer venv's Python (the two packages share the
import name ``rlmesh``, so they cannot share a process). It prints one JSON object: for each
workload the median steps/s over ``--repeats`` runs and the per-episode results.

0.1.0's API: ``rlmesh.run(rlmesh.numpy.Model(fn), env, seeds=...)``. On a vector env it needs
NEXT_STEP autoreset and refuses per-episode seeds (the env seeds its own episodes then), so the
16-lane workload runs ``episodes=64`` unseeded and its episodes cannot be compared with ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import gymnasium as gym
import rlmesh
from cartpole import ENV_ID, SEEDS, VECTOR_EPISODES, VECTOR_LANES, batched_policy, policy
from rlmesh.numpy import Model


class BatchedPolicy(Model):
    workflow_edition = "2026.06"  # pinned, so 0.1.0 does not warn on every run

    def predict(self, obs):
        return policy(obs)

    def predict_batch(self, obs):
        return batched_policy(obs)


def one_lane(seeds):
    return rlmesh.run(Model(policy), gym.make(ENV_ID), seeds=seeds)


def sixteen_lanes(episodes):
    vector = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(VECTOR_LANES)])
    return rlmesh.run(BatchedPolicy(), vector, episodes=episodes)


def measure(workload, repeats: int) -> dict:
    samples, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = workload()
        samples.append(time.perf_counter() - start)
    episodes = [
        [e.index, e.seed, e.steps, float(e.reward), bool(e.terminated), bool(e.truncated)]
        for e in result.episodes
    ]
    return {"steps_per_s": result.total_steps / statistics.median(samples), "episodes": episodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one-lane-episodes", type=int, default=len(SEEDS))
    parser.add_argument("--vector-episodes", type=int, default=VECTOR_EPISODES)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # 0.1.0's advisories would only clutter the JSON's stderr
    print(
        json.dumps(
            {
                "version": rlmesh.__version__,
                "one_lane": measure(
                    lambda: one_lane(SEEDS[: args.one_lane_episodes]), args.repeats
                ),
                "sixteen_lanes": measure(lambda: sixteen_lanes(args.vector_episodes), args.repeats),
            }
        )
    )


if __name__ == "__main__":
    main()
