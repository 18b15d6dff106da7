"""The two cores' chunk queues agree on random sequences of calls, valid and invalid.

Each example builds a ``ChunkQueues`` in both cores, then plays the same random calls on both:
pushes of random batches (random leaf structures, step shapes, dtypes and horizons, sometimes
broken: an empty chunk, the wrong lane count, leaves that disagree on H, a changed layout),
pops, episode ends (``drop`` then a new episode on the lane), stray drops,
``lanes_needing_predict`` and ``queued``, with lane arguments that are sometimes out of range
or repeated. Every call must return the same value in both cores (arrays with equal
dtypes, shapes and bytes, dicts with the same keys in the same order) or raise the same error
type with the same message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlmesh.core import load_core

CORES = (load_core("python"), load_core("rust"))
DTYPES = ("float32", "float64", "int64", "int8", "uint8", "bool")
KEYS = ("arm", "grip", "base", "é")
# How a push departs from the layout: half the pushes are plain, "order" lists the same leaves
# in another order (valid), the rest are broken.
BREAKAGES = (
    ("none",) * 6
    + ("order",) * 2
    + (
        "empty",
        "wrong_n",
        "ragged_h",
        "dtype",
        "step_shape",
        "leaves",
    )
)


def outcome(call) -> tuple[Any, ...]:
    """What a call did: ("ok", normalized result) or ("raise", error type, message)."""
    try:
        return ("ok", normalized(call()))
    except Exception as err:  # every error must match across cores, whatever it is
        return ("raise", type(err), str(err))


def normalized(value: Any) -> Any:
    """A value compared exactly: arrays by dtype, shape and bytes; dict keys in order."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", [(key, normalized(item)) for key, item in value.items()])
    return value


@st.composite
def layouts(draw) -> list[tuple[tuple[str, ...], tuple[int, ...], str]]:
    """(path, per-step shape, dtype) per leaf: a lone array or a dict tree of 1..3 leaves."""
    leaf = st.tuples(st.lists(st.integers(1, 3), max_size=2).map(tuple), st.sampled_from(DTYPES))
    if draw(st.booleans()):
        shape, dtype = draw(leaf)
        return [((), shape, dtype)]
    paths = draw(
        st.lists(
            st.sampled_from([("arm",), ("grip",), ("hand", "grip"), ("hand", "é"), ("base",)]),
            min_size=1,
            max_size=3,
            unique_by=lambda path: path[0],
        )
    )
    return [(path, *draw(leaf)) for path in paths]


def build(layout, lanes: int, horizon: int, rng: np.random.Generator) -> Any:
    """A batch ``[lanes, horizon, *step]`` per leaf, nested as the layout's paths say."""
    arrays = []
    for _, shape, dtype in layout:
        values = rng.integers(-3, 10, size=(lanes, horizon, *shape))
        arrays.append(values.astype(dtype))
    if layout[0][0] == ():
        return arrays[0]
    root: dict[str, Any] = {}
    for (path, _, _), array in zip(layout, arrays, strict=True):
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array
    return root


def broken(layout, breakage: str, data) -> tuple[list, int]:
    """The layout a push uses under ``breakage``, and how far its lane count is off."""
    layout = list(layout)
    index = data.draw(st.integers(0, len(layout) - 1))
    path, shape, dtype = layout[index]
    if breakage == "dtype":
        layout[index] = (path, shape, data.draw(st.sampled_from(DTYPES)))
    elif breakage == "step_shape":
        layout[index] = (path, (*shape, data.draw(st.integers(1, 2))), dtype)
    elif breakage == "leaves" and path:
        layout[index] = ((*path[:-1], data.draw(st.sampled_from(KEYS))), shape, dtype)
    elif breakage == "order":
        layout = data.draw(st.permutations(layout))
    return layout, int(breakage == "wrong_n")


def lanes_arg(data, num_lanes: int) -> list[int]:
    """Usually distinct lanes in range, in any order; sometimes out of range or repeated."""
    lanes = data.draw(st.permutations(range(num_lanes)))
    lanes = lanes[: data.draw(st.integers(0, num_lanes))]
    if data.draw(st.integers(0, 9)) == 0:
        lanes.append(data.draw(st.sampled_from([-1, num_lanes, *lanes[:1]])))
    return lanes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_both_cores_agree_on_random_call_sequences(data):
    num_lanes = data.draw(st.integers(1, 4), label="num_lanes")
    horizon = data.draw(st.integers(1, 4), label="execution_horizon")
    layout = data.draw(layouts(), label="layout")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    queues = [core.ChunkQueues(num_lanes, horizon) for core in CORES]
    episode = list(range(num_lanes))  # the episode each lane is running
    next_episode = num_lanes

    def same(call) -> tuple[Any, ...]:
        results = [outcome(lambda q=q: call(q)) for q in queues]
        assert results[0] == results[1]
        return results[0]

    for _ in range(data.draw(st.integers(1, 30), label="calls")):
        kind = data.draw(
            st.sampled_from(["push", "push", "pop", "pop", "end", "drop", "lanes", "queued"])
        )
        if kind == "push":
            lanes = lanes_arg(data, num_lanes)
            ids = [episode[lane] if 0 <= lane < num_lanes else 0 for lane in lanes]
            if data.draw(st.integers(0, 9)) == 0:  # ids that may be repeated or live elsewhere
                ids = [data.draw(st.sampled_from(episode)) for _ in lanes]
            breakage = data.draw(st.sampled_from(BREAKAGES))
            pushed, extra = broken(layout, breakage, data)
            chunk_horizon = 0 if breakage == "empty" else data.draw(st.integers(1, 6))
            chunk = build(pushed, len(lanes) + extra, chunk_horizon, np.random.default_rng(seed))
            if breakage == "ragged_h" and isinstance(chunk, dict):
                first = next(iter(chunk))
                if isinstance(chunk[first], np.ndarray):
                    chunk[first] = np.concatenate([chunk[first], chunk[first][:, :1]], axis=1)
            if data.draw(st.booleans()) and not isinstance(chunk, dict) and chunk.ndim >= 2:
                chunk = np.asfortranarray(chunk)  # strided input reads the same
            count = len(lanes)
            checks = [
                outcome(lambda c=c, chunk=chunk, count=count: c.split_chunk(chunk, count))
                for c in CORES
            ]
            assert checks[0] == checks[1]
            same(lambda q, lanes=lanes, ids=ids, chunk=chunk: q.push(lanes, ids, chunk))
            seed += 1
        elif kind == "pop":
            lanes = lanes_arg(data, num_lanes)
            stale = data.draw(st.integers(0, 9)) == 0  # an id the lane is not running
            ids = [(episode[lane] + stale if 0 <= lane < num_lanes else 0) for lane in lanes]
            same(lambda q, lanes=lanes, ids=ids: q.pop(lanes, ids))
        elif kind == "end":  # a lane's episode ends: drop its queue, start the next one
            lane = data.draw(st.integers(0, num_lanes - 1))
            same(lambda q, old=episode[lane]: q.drop(old))
            episode[lane], next_episode = next_episode, next_episode + 1
        elif kind == "drop":
            stray = data.draw(st.integers(-1, next_episode + 1))
            same(lambda q, stray=stray: q.drop(stray))
        elif kind == "lanes":
            lanes = lanes_arg(data, num_lanes) if data.draw(st.booleans()) else None
            same(lambda q, lanes=lanes: q.lanes_needing_predict(lanes))
        else:
            lanes = lanes_arg(data, num_lanes)
            same(lambda q, lanes=lanes: q.queued(lanes))
        status = same(lambda q: q.queued())
        assert status[0] == "ok"
        assert same(repr)[0] == "ok"
