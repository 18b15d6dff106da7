"""The two cores' LatencyStats agree on random sequences of calls, valid and invalid.

Each example builds two LatencyStats per core (so merges have a partner), then plays the same
random calls on both cores: ``record`` and ``record_many`` of durations across the whole range
(exact small values, typical latencies, values near ``2**63``, sometimes negative or of the
wrong type), ``merge`` (also of a stats with itself), ``reset``, ``quantile`` (sometimes out of
range) and every property. Every call must return the same value (same type) or raise the same
error type with the same message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmesh.core import load_core

CORES = (load_core("python"), load_core("rust"))
I64_MAX = 2**63 - 1
READS = ("count", "total_ns", "max_ns")

durations = st.one_of(
    st.integers(0, 127),
    st.integers(0, 10**10),
    st.integers(2**62, I64_MAX),
)
odd_durations = st.sampled_from([-1, -(2**63), 2**63, 1.5, "3", None, True, np.int64(5)])
quantiles = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0, 1, 0.5, -0.0, True, np.float64(0.99)]),
    st.sampled_from([-1e-9, 1.0000001, float("nan"), float("inf"), 2, "0.5", None, 10**400]),
)


def outcome(call) -> tuple[Any, ...]:
    """What a call did: ("ok", value and its type) or ("raise", error type, message)."""
    try:
        value = call()
    except Exception as err:  # every error must match across cores, whatever it is
        return ("raise", type(err), str(err))
    return ("ok", type(value), value)


@st.composite
def many(draw) -> Any:
    """A ``record_many`` argument: usually an int64 array, sometimes another form or broken."""
    values = draw(st.lists(durations, max_size=40))
    form = draw(st.sampled_from(["int64"] * 4 + ["list", "uint64", "int32", "negative", "odd"]))
    if form == "list":
        return values
    if form == "uint64":
        return np.array(values, dtype=np.uint64)
    if form == "int32":
        return np.array([value % 2**31 for value in values], dtype=np.int32)
    if form == "negative" and values:
        values[draw(st.integers(0, len(values) - 1))] = -draw(st.integers(1, 10**6))
    if form == "odd":
        return draw(st.sampled_from([np.zeros((2, 2), dtype=np.int64), [0.5], 7, ["1"]]))
    return np.array(values, dtype=np.int64)


calls = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 1), durations | odd_durations),
    st.tuples(st.just("record_many"), st.integers(0, 1), many()),
    st.tuples(st.just("merge"), st.integers(0, 1), st.integers(0, 1)),
    st.tuples(st.just("reset"), st.integers(0, 1), st.none()),
    st.tuples(st.just("quantile"), st.integers(0, 1), quantiles),
    st.tuples(st.just("snapshot"), st.integers(0, 1), st.none()),
)


def play(stats: list[Any], call: tuple[str, int, Any]) -> Any:
    name, which, argument = call
    method = getattr(stats[which], name)
    if name == "merge":
        return method(stats[argument])
    if argument is None and name in ("reset", "snapshot"):
        return method()
    return method(argument)


@settings(max_examples=300, deadline=None)
@given(st.lists(calls, max_size=30))
def test_rust_latency_stats_match_python(script):
    pairs = [[core.LatencyStats(), core.LatencyStats()] for core in CORES]
    for call in script:
        reference, under_test = (
            outcome(lambda stats=stats, call=call: play(stats, call)) for stats in pairs
        )
        assert under_test == reference, call
        for python_stats, rust_stats in zip(*pairs, strict=True):
            for name in READS:
                assert outcome(lambda s=rust_stats, n=name: getattr(s, n)) == outcome(
                    lambda s=python_stats, n=name: getattr(s, n)
                ), name
            assert repr(rust_stats) == repr(python_stats)
            assert rust_stats.snapshot() == python_stats.snapshot()
