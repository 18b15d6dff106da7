"""Per-episode seeds: a stable, platform-independent mix of a base seed and an episode index.

Mirrors ``rust/src/seeding.rs``.
"""

from __future__ import annotations

from .args import U64_MAX, u64_arg

_GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(x: int) -> int:
    """One SplitMix64 step: a bijective avalanche mix of a 64-bit word."""
    z = (x + _GOLDEN_GAMMA) & U64_MAX
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64_MAX
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64_MAX
    return z ^ (z >> 31)


def episode_seed(base: int, index: int) -> int:
    """The reset seed of episode ``index`` in a run whose base seed is ``base``.

    ``splitmix64(splitmix64(base) ^ index) >> 33``: every bit of both inputs reaches the
    result, neighbouring indices get unrelated seeds, and the value lies in ``[0, 2**31)`` so
    any environment accepts it. The function is part of the result format: it never changes.

    Args:
        base: the run's base seed, an integer in ``[0, 2**64)``.
        index: the episode's global index (``trial_index_base + slot``), in ``[0, 2**64)``.

    Example:
        >>> episode_seed(0, 0)
        1401122455
    """
    base = u64_arg(base, "base")
    index = u64_arg(index, "index")
    return splitmix64(splitmix64(base) ^ index) >> 33
