"""openpi's msgpack encoding: arrays and numpy scalars of every dtype the wire allows travel
exactly, with bytes marker keys; refused dtypes and malformed frames say what was wrong."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from rlmesh.remote.openpi.codec import ARRAY, SCALAR, OpenPIWireError, packb, unpackb

DTYPES = ["|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_and_scalars_travel_exactly(dtype):
    rng = np.random.default_rng(len(dtype))
    array = (rng.random((2, 3, 4)) * 100).astype(dtype)
    decoded = unpackb(packb({"image": array, "scalar": array[1, 2, 3], "nested": [array[0]]}))
    assert decoded["image"].dtype == array.dtype and decoded["image"].shape == (2, 3, 4)
    np.testing.assert_array_equal(decoded["image"], array)
    np.testing.assert_array_equal(decoded["nested"][0], array[0])
    assert decoded["scalar"] == array[1, 2, 3]
    assert not decoded["image"].flags.writeable  # a view of the message's bytes


def test_the_marker_keys_are_msgpack_bytes():
    raw = msgpack.unpackb(packb({"a": np.zeros(2, np.float32), "b": np.int64(3)}))
    assert raw["a"][ARRAY] is True and raw["a"][b"dtype"] == "<f4" and raw["a"][b"shape"] == [2]
    assert raw["b"] == {SCALAR: True, b"data": 3, b"dtype": "<i8"}
    assert all(isinstance(key, bytes) for key in raw["a"])


def test_a_strided_view_travels_as_its_values():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(unpackb(packb(array)), array)


@pytest.mark.parametrize(
    "value", [np.zeros(2, np.complex64), np.array([object()]), np.zeros(1, "V4")]
)
def test_refused_dtypes_say_so(value):
    with pytest.raises(TypeError, match="cannot travel on openpi's wire"):
        packb({"x": value})


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\xc1", "not an openpi msgpack message"),
        (packb({"x": np.zeros(3)})[:-4], "not an openpi msgpack message"),
        (
            msgpack.packb({ARRAY: True, b"data": b"\x00" * 5, b"dtype": "<f4", b"shape": [2]}),
            r"dtype <f4 and shape \[2\] needs 8 bytes, got 5",
        ),
        (msgpack.packb({ARRAY: True, b"dtype": "<f4"}), "an array without its data"),
        (
            msgpack.packb({ARRAY: True, b"data": b"\x00" * 8, b"dtype": "<c8", b"shape": [1]}),
            "an array of dtype complex64",
        ),
    ],
)
def test_malformed_frames_are_refused_saying_what_was_wrong(frame, message):
    with pytest.raises(OpenPIWireError, match=message):
        unpackb(frame)
