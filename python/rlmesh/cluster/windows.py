"""Windows: the units of work a cluster run deals to its workers.

The episode indices to run are put in a seeded shuffle and cut into windows, each run by the
ordinary local driver with ``indices=``. The shuffle spreads a contiguous range of hard
episodes (one task's trials, say) over many windows instead of one; it changes only *where*
an episode runs, never its seed or trial, which ``indices=`` keeps as in the full run.

Example:
    >>> deal_windows(range(10), [4, 4, 2], seed=0)
    [(0, 4, 7, 8), (1, 2, 3, 9), (5, 6)]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..core import load_core

# Keys the shuffle apart from the episode seeds of the same base seed (the golden ratio's
# 64-bit fraction, as SplitMix64 uses it).
SHUFFLE_SALT = 0x9E3779B97F4A7C15
# The shortest window the guided sizes deal, as a fraction of a worker's share of the
# episodes: short enough that the workers finish close together, long enough that a window's
# set-up (its envs, the model's load) stays small beside its episodes.
SMALLEST_SHARE = 1 / 16


def shuffled(indices: Iterable[int], seed: int) -> list[int]:
    """``indices`` in the seeded shuffle: ordered by ``episode_seed(seed ^ SHUFFLE_SALT, i)``
    (ties by index), the documented, platform-independent mixing function, so every machine
    and core deals the same windows."""
    mix = load_core("python").episode_seed
    key = (seed ^ SHUFFLE_SALT) % 2**64
    return sorted(indices, key=lambda index: (mix(key, index), index))


def window_sizes(
    episodes: int, workers: int, num_envs: int | None, window_episodes: int | None = None
) -> list[int]:
    """How many episodes each window gets, in dealing order (they add up to ``episodes``).

    ``window_episodes`` given: that many each, the last window the rest. Otherwise guided
    self-scheduling: each window takes ``1 / (2 workers)`` of the episodes not yet dealt, and
    never fewer than ``SMALLEST_SHARE`` of a worker's share or one per lane. Early windows are
    long (set-up is paid rarely), the last ones short, so the workers finish together even
    when episodes differ in length.

    Example:
        >>> window_sizes(400, 2, None)
        [100, 75, 57, 42, 32, 24, 18, 13, 13, 13, 13]
        >>> window_sizes(10, 2, None, window_episodes=4)
        [4, 4, 2]
    """
    if window_episodes is not None:
        return [
            min(window_episodes, episodes - start) for start in range(0, episodes, window_episodes)
        ]
    smallest = max(num_envs or 1, math.ceil(episodes / workers * SMALLEST_SHARE))
    sizes, left = [], episodes
    while left:
        size = min(left, max(smallest, math.ceil(left / (2 * workers))))
        sizes.append(size)
        left -= size
    return sizes


def deal_windows(indices: Iterable[int], sizes: Sequence[int], seed: int) -> list[tuple[int, ...]]:
    """``indices`` shuffled (``shuffled``) and cut into windows of ``sizes`` episodes, each
    window ascending, as ``indices=`` takes them."""
    order = shuffled(indices, seed)
    windows, start = [], 0
    for size in sizes:
        windows.append(tuple(sorted(order[start : start + size])))
        start += size
    return windows
