"""Policies the sandbox tests serve from a sandbox, by ``path/to/sandbox_policies.py:Name``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import rlmesh

HERE = Path(__file__).resolve()


def heuristic(obs):
    """The tests' CartPole heuristic (``helpers.cartpole_policy``)."""
    return int(obs[2] + 0.3 * obs[3] > 0)


class Numpy2Heuristic(rlmesh.Model):
    """The tests' CartPole heuristic, refusing to load on any numpy but 2.x."""

    def load(self):
        if not np.__version__.startswith("2."):
            raise RuntimeError(f"expected numpy 2.x for the policy, got {np.__version__}")

    def predict(self, obs):
        return int(obs[2] + 0.3 * obs[3] > 0)


class CrashingHeuristic(rlmesh.Model):
    """The heuristic, whose process exits (status 4, a line on stderr) at its 30th call."""

    calls = 0

    def predict(self, obs):
        CrashingHeuristic.calls += 1
        if CrashingHeuristic.calls == 30:
            print("boom: the policy crashes on purpose", file=sys.stderr)
            sys.stderr.flush()
            os._exit(4)
        return int(obs[2] + 0.3 * obs[3] > 0)
