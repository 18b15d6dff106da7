"""Latency statistics in bounded memory: a log-linear histogram of nanosecond durations.

Mirrors ``rust/src/telemetry.rs`` name for name. This file is the executable specification:
the Rust core must give the same counts, quantiles and errors.

The histogram is laid out like an HDR histogram with 6 sub-bucket bits. Durations below
``EXACT_BELOW`` = 128 ns each have a bucket of their own. Above that, every power of two
``[2**e, 2**(e+1))`` is cut into ``SUB_BUCKETS`` = 64 buckets of width ``2**(e-6)``, so a
bucket is never wider than 1/64 of its start. ``quantile`` answers with the bucket's midpoint
(capped at ``max_ns``, which is kept exactly), so it is within ``RELATIVE_ERROR`` = 1/128
(0.78%) of the exact value it stands for, and exact below 128 ns:

    |quantile(q) - x_q| <= x_q / 128, where x_q is the exact nearest-rank q-quantile.

A duration up to ``2**63 - 1`` ns (292 years) lands in one of ``MAX_BUCKETS`` = 3712 buckets.
Buckets are allocated up to the largest duration seen, so memory grows with the range of the
durations (about 1800 buckets for durations up to 10 s), never with their number.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate
from typing import Any

from .args import i64_arg, vector

SUB_BUCKET_BITS = 6
SUB_BUCKETS = 1 << SUB_BUCKET_BITS
EXACT_BELOW = 2 * SUB_BUCKETS
# bucket_index(2**63 - 1) + 1: one row of SUB_BUCKETS per shift 0..57.
MAX_BUCKETS = (64 - SUB_BUCKET_BITS) * SUB_BUCKETS
RELATIVE_ERROR = 1 / (2 * SUB_BUCKETS)


def bucket_index(ns: int) -> int:
    """The bucket of a duration ``0 <= ns < 2**63``.

    ``ns`` is shifted right until it has 7 significant bits (values below 128 are not shifted
    at all); the shift picks the row and those 7 bits (64..127 once shifted) the bucket in it.
    """
    shift = max(ns.bit_length() - SUB_BUCKET_BITS - 1, 0)
    return shift * SUB_BUCKETS + (ns >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """``(start, width)`` of bucket ``index``: it holds durations ``start .. start+width-1``."""
    shift = max(index // SUB_BUCKETS - 1, 0)
    return (index - shift * SUB_BUCKETS) << shift, 1 << shift


def _duration(ns: int, name: str) -> int:
    """``ns`` checked as a duration: an integer in ``[0, 2**63)``, or a ValueError."""
    if ns < 0:
        raise ValueError(f"{name} must be a non-negative duration, got {ns}")
    return ns


def _quantile_arg(q: Any) -> float:
    """``q`` as a float in ``[0, 1]``, or a ValueError.

    Accepts what a Rust ``f64`` argument accepts: objects with ``__float__`` or ``__index__``
    (so ``"0.5"`` is refused, as the Rust core refuses it).
    """
    kind = type(q)
    try:
        if not (hasattr(kind, "__float__") or hasattr(kind, "__index__")):
            raise TypeError
        value = float(q)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"q must be a number in [0, 1], got {kind.__name__}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")
    return value


class LatencyStats:
    """Count, mean, max and quantiles of nanosecond durations, in bounded memory.

    ``record(ns)`` adds one duration, ``record_many(ns)`` a ``[K]`` integer array of them;
    ``merge(other)`` adds another LatencyStats of the same core; ``quantile(q)`` is within
    ``RELATIVE_ERROR`` (1/128) of the exact nearest-rank quantile and never above ``max_ns``.
    Durations must lie in ``[0, 2**63)``.

    Example:
        >>> import numpy as np
        >>> stats = LatencyStats()
        >>> stats.record_many(np.array([100, 200, 300, 400, 1_000_000]))
        >>> stats.count, stats.total_ns, stats.max_ns
        (5, 1001000, 1000000)
        >>> stats.quantile(0.5)  # the 3rd of 5 values, 300, lies in the bucket 300..303
        302
        >>> snapshot = stats.snapshot()
        >>> list(snapshot), snapshot["avg_ns"]
        (['count', 'avg_ns', 'p50_ns', 'p95_ns', 'p99_ns', 'max_ns'], 200200.0)
        >>> snapshot["p99_ns"]  # capped at max_ns
        1000000
    """

    def __init__(self) -> None:
        # Grown up to the bucket of the largest duration seen, never past MAX_BUCKETS.
        self._buckets: list[int] = []
        self._count = 0
        self._total_ns = 0
        self._max_ns = 0

    # ------------------------------------------------------------------ recording

    def _add(self, ns: int) -> None:
        index = bucket_index(ns)
        if index >= len(self._buckets):
            self._buckets.extend([0] * (index + 1 - len(self._buckets)))
        self._buckets[index] += 1
        self._count += 1
        self._total_ns += ns
        self._max_ns = max(self._max_ns, ns)

    def record(self, ns: int) -> None:
        """Add one duration ``ns`` (an integer number of nanoseconds, ``>= 0``)."""
        self._add(_duration(i64_arg(ns, "ns"), "ns"))

    def record_many(self, ns: Any) -> None:
        """Add every duration of ``ns``, a ``[K]`` integer array; all or none of them.

        Raises:
            ValueError: ``ns`` is not 1-D, holds non-integers, or holds a negative value (the
                message names its position and value); nothing is recorded then.
        """
        durations = vector(ns, "int64", "ns").tolist()
        for position, value in enumerate(durations):
            _duration(value, f"ns[{position}]")
        for value in durations:
            self._add(value)

    def merge(self, other: LatencyStats) -> None:
        """Add everything ``other`` recorded, as if it had been recorded here."""
        if not isinstance(other, LatencyStats):
            kind = type(other)
            raise TypeError(
                f"merge needs a LatencyStats from the same core, got "
                f"{kind.__module__}.{kind.__qualname__}"
            )
        theirs = list(other._buckets)  # a copy: other may be self
        if len(theirs) > len(self._buckets):
            self._buckets.extend([0] * (len(theirs) - len(self._buckets)))
        for index, count in enumerate(theirs):
            self._buckets[index] += count
        self._count += other._count
        self._total_ns += other._total_ns
        self._max_ns = max(self._max_ns, other._max_ns)

    def reset(self) -> None:
        """Forget everything recorded, and the buckets' memory with it."""
        self.__init__()

    # ------------------------------------------------------------------ reading

    @property
    def count(self) -> int:
        return self._count

    @property
    def total_ns(self) -> int:
        return self._total_ns

    @property
    def max_ns(self) -> int:
        """The largest duration recorded, exactly; 0 when empty."""
        return self._max_ns

    def _mean_ns(self) -> float:
        """The exact mean duration (the snapshot's ``avg_ns``); 0.0 when empty."""
        if self._count == 0:
            return 0.0
        # Both rounded to float first, as the Rust core divides them.
        return float(self._total_ns) / float(self._count)

    def quantile(self, q: float) -> int:
        """A value within 1/128 of the exact nearest-rank ``q``-quantile; 0 when empty.

        The nearest-rank quantile is the ``ceil(q * count)``-th smallest duration (the smallest
        for ``q = 0``), as numpy's ``quantile(..., method="inverted_cdf")``. The answer is the
        midpoint of the bucket holding it, capped at ``max_ns``; for the largest (``q = 1``, or
        any ``q`` whose rank is ``count``) it is ``max_ns``, known exactly.

        Raises:
            ValueError: ``q`` is not a number in ``[0, 1]``.
        """
        q = _quantile_arg(q)
        if self._count == 0:
            return 0
        rank = min(max(math.ceil(q * float(self._count)), 1), self._count)
        if rank == self._count:
            return self._max_ns  # the largest duration is known exactly
        index = bisect_left(list(accumulate(self._buckets)), rank)
        start, width = bucket_bounds(index)
        return min(start + width // 2, self._max_ns)

    def snapshot(self) -> dict[str, Any]:
        """``{count, avg_ns, p50_ns, p95_ns, p99_ns, max_ns}``: all ints but ``avg_ns``."""
        return {
            "count": self._count,
            "avg_ns": self._mean_ns(),
            "p50_ns": self.quantile(0.5),
            "p95_ns": self.quantile(0.95),
            "p99_ns": self.quantile(0.99),
            "max_ns": self._max_ns,
        }

    def __repr__(self) -> str:
        return (
            f"LatencyStats(count={self._count}, total_ns={self._total_ns}, max_ns={self._max_ns})"
        )
