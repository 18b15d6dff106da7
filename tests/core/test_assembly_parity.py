"""Parity: both cores assemble the same payloads, keep the same windows and fail alike."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmesh.adapters import Concat, Image, ModelSpec, State, Text
from rlmesh.core import load_core

NUMERIC_DTYPES = [np.uint8, np.int32, np.int64, np.float32, np.float64]


@st.composite
def spaces(draw):
    """A Dict observation space with random image, depth, joint and discrete leaves."""
    # Small sides, and sides past the Rust core's 32-item transpose tiles (not multiples).
    side = st.one_of(st.integers(1, 5), st.integers(31, 37))
    height, width = draw(side), draw(side)
    joints_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    return gym.spaces.Dict(
        {
            "pixels": gym.spaces.Box(0, 255, (height, width, draw(st.integers(1, 4))), np.uint8),
            "depth": gym.spaces.Box(0, 10, (height, width, 1), np.float32),
            "joints": gym.spaces.Box(0, 100, joints_shape, draw(st.sampled_from(NUMERIC_DTYPES))),
            "grip": gym.spaces.Discrete(draw(st.integers(1, 4))),
            "lang": gym.spaces.Text(6),
        }
    )


LEAVES = {
    "image": st.builds(
        Image,
        st.just("pixels"),
        layout=st.sampled_from(["hwc", "chw"]),
        dtype=st.just("float32"),
        normalize=st.sampled_from([False, True, (-1.0, 1.0)]),
        stack=st.integers(1, 4),
    ),
    "raw_image": st.builds(Image, st.just("pixels"), stack=st.integers(1, 3)),
    "depth": st.builds(
        Image,
        st.just("depth"),
        layout=st.sampled_from(["hwc", "chw"]),
        dtype=st.just("float32"),
        stack=st.integers(1, 3),
    ),
    "state": st.builds(
        State,
        st.just("joints"),
        dtype=st.sampled_from(["float32", "float64", "int64"]),
        stack=st.integers(1, 3),
    ),
    "concat": st.builds(Concat, st.just("joints"), st.just("grip"), dtype=st.just("float64")),
    "text": st.builds(Text, st.just("lang")),
}


@st.composite
def specs(draw):
    names = draw(st.lists(st.sampled_from(sorted(LEAVES)), min_size=1, max_size=4, unique=True))
    return ModelSpec(input={name: draw(LEAVES[name]) for name in names})


def normalize(value):
    if isinstance(value, dict):
        return {key: normalize(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    return value


def outcome(call):
    try:
        return ("ok", normalize(call()))
    except Exception as exc:  # the cores must fail alike: same type, same message
        return ("raised", type(exc).__name__, str(exc))


def observation(draw, space, broken: bool):
    """One raw observation of ``space`` from a drawn seed; ``broken`` loses or warps a key."""
    space.seed(draw(st.integers(0, 2**16)))
    sample = dict(space.sample())
    if broken:
        key = draw(st.sampled_from(sorted(sample)))
        if draw(st.booleans()):
            del sample[key]
        else:
            sample[key] = np.zeros(7)
    return sample


@settings(max_examples=120, deadline=None)
@given(space=spaces(), spec=specs(), data=st.data())
def test_both_cores_assemble_alike(space, spec, data):
    plan = spec.compile(space, gym.spaces.Discrete(2)).observation
    rust, python = (load_core(name).ObservationAssembler(plan) for name in ("rust", "python"))
    for _ in range(data.draw(st.integers(1, 12))):
        episode_ids = data.draw(st.lists(st.integers(0, 6), max_size=4, unique=True))
        broken = data.draw(st.integers(0, 9)) == 0
        observations = [observation(data.draw, space, broken) for _ in episode_ids]
        operation = data.draw(st.sampled_from(["assemble", "assemble", "push", "evict"]))
        if operation == "evict":
            episode = data.draw(st.integers(0, 6))
            rust.evict(episode)
            python.evict(episode)
        else:
            results = [
                outcome(partial(getattr(core, operation), observations, episode_ids))
                for core in (rust, python)
            ]
            assert results[0] == results[1]
        assert rust.window_count == python.window_count
