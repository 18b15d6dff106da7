"""Benchmarks compare the two cores side by side, in one run, on the same workload."""

from __future__ import annotations

import os

import pytest
from rlmesh.core import CORE_NAMES, load_core

# The robot benchmarks' simulators render without a display (Mesa's EGL).
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(params=CORE_NAMES)
def core(request):
    """Each benchmark runs once per core; the group puts the two rows next to each other."""
    return load_core(request.param)
