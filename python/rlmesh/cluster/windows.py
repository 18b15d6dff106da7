"""Windows: the units of work a cluster run deals to its workers.

The episode indices to run are put in a seeded shuffle and cut into windows, each run by the
ordinary local driver with ``indices=``. The shuffle spreads a contiguous range of hard
episodes (one task's trials, say) over many windows instead of one; it changes only *where*
an episode runs, never its seed or trial, which ``indices=`` keeps as in the full run.

Example:
    >>> deal_windows(range(10), 4, seed=0)
    [(0, 4, 7, 8), (1, 2, 3, 9), (5, 6)]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..core import load_core

# Keys the shuffle apart from the episode seeds of the same base seed (the golden ratio's
# 64-bit fraction, as SplitMix64 uses it).
SHUFFLE_SALT = 0x9E3779B97F4A7C15
WINDOWS_PER_WORKER = 4  # enough to even out uneven windows, few enough that set-up stays small


def shuffled(indices: Iterable[int], seed: int) -> list[int]:
    """``indices`` in the seeded shuffle: ordered by ``episode_seed(seed ^ SHUFFLE_SALT, i)``
    (ties by index), the documented, platform-independent mixing function, so every machine
    and core deals the same windows."""
    mix = load_core("python").episode_seed
    key = (seed ^ SHUFFLE_SALT) % 2**64
    return sorted(indices, key=lambda index: (mix(key, index), index))


def deal_windows(indices: Iterable[int], window_episodes: int, seed: int) -> list[tuple[int, ...]]:
    """``indices`` shuffled (``shuffled``) and cut into windows of ``window_episodes`` (the last
    may be shorter), each window ascending, as ``indices=`` takes them."""
    order = shuffled(indices, seed)
    return [
        tuple(sorted(order[start : start + window_episodes]))
        for start in range(0, len(order), window_episodes)
    ]


def default_window_episodes(episodes: int, workers: int, num_envs: int | None) -> int:
    """Episodes per window when the run does not say: about ``WINDOWS_PER_WORKER`` windows a
    worker, and at least one episode per lane, so every lane of a window has work.

    Example:
        >>> default_window_episodes(400, 2, None), default_window_episodes(37, 3, 8)
        (50, 8)
    """
    return max(num_envs or 1, math.ceil(episodes / (WINDOWS_PER_WORKER * workers)), 1)
