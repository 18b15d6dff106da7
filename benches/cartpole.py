"""The CartPole policy and seeds every end-to-end workload uses, rlmesh-free.

This module imports neither this package nor any rlmesh, so the published ``rlmesh==0.1.0``
(``peer.py``, run in its own virtual environment) drives exactly the same policy and seeds.
"""

from __future__ import annotations

import numpy as np

ENV_ID = "CartPole-v1"
SEEDS = list(range(20))  # one lane: episode k is reset with SEEDS[k]
VECTOR_LANES, VECTOR_EPISODES = 16, 64


def policy(obs):
    """A hand-tuned balance heuristic: push toward the side the pole falls to."""
    return int(obs[2] + 0.3 * obs[3] > 0)


def batched_policy(obs):
    """``policy`` over a ``[N, 4]`` batch of observations."""
    return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)
