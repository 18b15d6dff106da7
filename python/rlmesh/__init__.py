"""rlmesh: exact, reproducible, fast evaluation of RL agents and robot policies.

Episodes are numbered in the order they start, each is seeded by its index, and a run scores
exactly the episodes asked for, whatever the number of parallel environments.
"""

from importlib.metadata import PackageNotFoundError, version

from .core import core, core_name

try:
    __version__ = version("rlmesh")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

episode_seed = core.episode_seed

__all__ = ["__version__", "core_name", "episode_seed"]
