"""rlmesh-wire-v1 values: spaces, batches and infos survive the wire, and malformed ones are
refused with the leaf named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("grpc", reason="the remote extra (grpcio) is not installed")

from rlmesh.remote.codec import (
    SpaceCodec,
    WireFormatError,
    from_meta_map,
    meta_map,
    space_from_spec,
    space_spec,
)
from rlmesh.remote.wire.spaces.v1 import spaces_pb2, types_pb2, value_pb2

ROOT = Path(__file__).resolve().parents[2]

SPACES = {
    "box-elementwise": gym.spaces.Box(np.array([-1, -2, 0]), np.array([1, 2, 5]), dtype=np.float32),
    "box-uniform": gym.spaces.Box(0, 255, (4, 3, 2), np.uint8),
    "box-unbounded": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
    "box-half": gym.spaces.Box(0.0, np.inf, (3,), np.float32),
    "discrete": gym.spaces.Discrete(5, start=-2),
    "multi-binary": gym.spaces.MultiBinary(4),
    "multi-discrete": gym.spaces.MultiDiscrete([3, 4, 2]),
    "text": gym.spaces.Text(12, min_length=1),
    "dict": gym.spaces.Dict(
        {
            "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "state": gym.spaces.Dict(
                {"q": gym.spaces.Box(-1, 1, (7,)), "g": gym.spaces.Discrete(2)}
            ),
            "task": gym.spaces.Text(16),
        }
    ),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)))),
}


def _sample_batch(space, rows, seed):
    samples = []
    space.seed(seed)
    for _ in range(rows):
        samples.append(space.sample())
    return _stack(space, samples)


def _stack(space, samples):
    if isinstance(space, gym.spaces.Dict):
        return {
            key: _stack(child, [s[key] for s in samples]) for key, child in space.spaces.items()
        }
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stack(child, [s[i] for s in samples]) for i, child in enumerate(space.spaces))
    if isinstance(space, gym.spaces.Text):
        return list(samples)
    return np.stack([np.asarray(s, space.dtype) for s in samples])


def _assert_same(space, a, b):
    if isinstance(space, gym.spaces.Dict):
        assert list(a) == list(b) == list(space.spaces)
        for key, child in space.spaces.items():
            _assert_same(child, a[key], b[key])
    elif isinstance(space, gym.spaces.Tuple):
        for child, x, y in zip(space.spaces, a, b, strict=True):
            _assert_same(child, x, y)
    elif isinstance(space, gym.spaces.Text):
        assert a == b
    else:
        assert b.dtype == space.dtype and b.flags.writeable
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_a_space_survives_its_spec(name):
    space = SPACES[name]
    again = space_from_spec(spaces_pb2.SpaceSpec.FromString(space_spec(space).SerializeToString()))
    assert again == space
    assert type(again) is type(space)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("name", sorted(SPACES))
def test_a_batch_survives_the_wire(name, rows):
    space = SPACES[name]
    codec = SpaceCodec(space)
    batch = _sample_batch(space, rows, seed=rows)
    value = value_pb2.SpaceValue.FromString(codec.encode(batch, rows).SerializeToString())
    _assert_same(space, batch, codec.decode(value, rows))


def test_leaves_are_little_endian_at_the_declared_dtype_in_key_order():
    space = gym.spaces.Dict({"b": gym.spaces.Discrete(3), "a": gym.spaces.Box(-1, 1, (2,))})
    value = SpaceCodec(space).encode({"a": np.array([[0.5, -1.0]]), "b": np.array([2])}, rows=1)
    # Gymnasium orders a Dict's keys, so "a" is the first leaf.
    assert value.leaves[0] == np.array([0.5, -1.0], "<f4").tobytes()
    assert value.leaves[1] == np.array([2], "<i8").tobytes()


def test_a_one_leaf_batch_of_any_layout_is_sent_as_little_endian_rows():
    codec = SpaceCodec(gym.spaces.Box(-10, 10, (2, 3), np.float32))
    rows = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    expected = rows.astype("<f4").tobytes()
    big_endian = rows.astype(">f4")
    strided = np.asfortranarray(rows)  # same values, not C-contiguous
    for batch in (rows, big_endian, strided, rows.astype(np.float64), rows.tolist()):
        assert codec.encode(batch, rows=2).leaves[0] == expected
    decoded = codec.decode(codec.encode(rows, rows=2), rows=2)
    decoded[0, 0, 0] = 99.0  # a writable copy, not a view of the message's bytes
    np.testing.assert_array_equal(decoded[1], rows[1])


def test_a_cartpole_observation_spec_is_the_one_the_published_peer_advertises():
    # The bounds rlmesh 0.1.0 sends for CartPole-v1: elementwise float32, little-endian.
    spec = space_spec(gym.make("CartPole-v1").observation_space)
    assert spec.dtype == types_pb2.DATA_TYPE_FLOAT32 and list(spec.shape) == [4]
    assert spec.box.WhichOneof("bounds") == "elementwise"
    low = np.frombuffer(spec.box.elementwise.low, "<f4")
    assert low[0] == np.float32(-4.8) and np.isneginf(low[1])


def test_a_wrong_leaf_count_is_refused():
    codec = SpaceCodec(SPACES["dict"])
    with pytest.raises(WireFormatError, match=r"2 leaves, expected 4"):
        codec.decode(value_pb2.SpaceValue(leaves=[b"", b""]), rows=1)


def test_a_wrong_byte_length_is_refused_naming_the_leaf():
    codec = SpaceCodec(SPACES["dict"])
    value = codec.encode(_sample_batch(SPACES["dict"], 2, seed=0), rows=2)
    value.leaves[2] = value.leaves[2][:-4]
    with pytest.raises(WireFormatError, match=r"state/q has 52 bytes, expected 56"):
        codec.decode(value, rows=2)


def test_the_row_count_comes_from_the_message_not_the_bytes():
    codec = SpaceCodec(SPACES["box-uniform"])
    value = codec.encode(_sample_batch(SPACES["box-uniform"], 2, seed=0), rows=2)
    with pytest.raises(WireFormatError, match="expected 72"):
        codec.decode(value, rows=3)


def test_an_unknown_dtype_is_refused():
    spec = space_spec(SPACES["box-half"])
    spec.dtype = 99
    with pytest.raises(WireFormatError, match="DataType 99"):
        space_from_spec(spec)


def test_a_malformed_text_slab_is_refused():
    codec = SpaceCodec(SPACES["text"])
    value = codec.encode(["hello"], rows=1)
    value.leaves[0] = value.leaves[0] + b"x"
    with pytest.raises(WireFormatError, match="header announces"):
        codec.decode(value, rows=1)


def test_floats_for_an_integer_leaf_must_be_whole():
    codec = SpaceCodec(SPACES["discrete"])
    assert codec.decode(codec.encode(np.array([2.0, -1.0]), rows=2), rows=2).tolist() == [2, -1]
    with pytest.raises(WireFormatError, match=r"0\.5 is not a whole number"):
        codec.encode(np.array([0.5, 1.0]), rows=2)


def test_a_batch_of_the_wrong_shape_or_keys_is_refused():
    codec = SpaceCodec(SPACES["dict"])
    batch = _sample_batch(SPACES["dict"], 2, seed=0)
    with pytest.raises(WireFormatError, match=r"pixels has shape \(2, 8, 8, 3\), expected"):
        codec.encode(batch, rows=3)
    del batch["task"]
    with pytest.raises(WireFormatError, match="no key 'task'"):
        codec.encode(batch, rows=2)


def test_infos_travel_as_plain_values():
    info = {
        "is_success": np.bool_(True),
        "count": np.int64(3),
        "pos": np.array([0.5, 1.5]),
        "nested": {"name": "x", "raw": b"\x00\x01"},
        "odd": object,
    }
    back = from_meta_map(meta_map(info))
    assert back["is_success"] is True and back["count"] == 3
    assert back["pos"] == [0.5, 1.5] and back["nested"] == {"name": "x", "raw": b"\x00\x01"}
    assert back["odd"] == repr(object)


def test_the_committed_wire_modules_are_what_the_protos_generate():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) is not installed")
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_wire.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
