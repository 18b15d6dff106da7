"""Where the lanes of a user's ``VectorEnv`` lived: the code is now in
``rlmesh/lanes/vector_env.py`` (``VectorEnvLanes``, formerly ``VectorLanes``); the old names
stay importable from here.

Example:
    >>> from rlmesh.lanes.vector_env import VectorEnvLanes
    >>> VectorLanes is VectorEnvLanes
    True
"""

from __future__ import annotations

from .vector_env import DRIVER, NEXT_STEP, SAME_STEP, VectorEnvLanes

VectorLanes = VectorEnvLanes
"""The former name of ``VectorEnvLanes``."""

__all__ = ["DRIVER", "NEXT_STEP", "SAME_STEP", "VectorLanes"]
