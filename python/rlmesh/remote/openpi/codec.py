"""openpi's message encoding: msgpack, with numpy arrays and scalars as marker maps.

An array travels as ``{b"__ndarray__": True, b"data": <C-order bytes>, b"dtype": dtype.str,
b"shape": [...]}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>,
b"dtype": dtype.str}``; the marker keys are msgpack *bytes*, not strings (which is how this
wire differs from vla-eval's). Arrays of structured, object or complex dtypes are refused, as
openpi's own encoder refuses them. Decoded arrays are read-only views of the message's
bytes.

Example:
    >>> import numpy as np
    >>> message = packb({"state": np.arange(3, dtype=np.float32), "prompt": "pick"})
    >>> decoded = unpackb(message)
    >>> decoded["state"], decoded["state"].flags.writeable, decoded["prompt"]
    (array([0., 1., 2.], dtype=float32), False, 'pick')
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

ARRAY = b"__ndarray__"
SCALAR = b"__npgeneric__"
REFUSED_KINDS = "VOc"  # structured, object and complex dtypes


class OpenPIWireError(ValueError):
    """A message that is not openpi's msgpack: the text says what was wrong and where."""


def packb(message: Any) -> bytes:
    """``message`` (dicts, lists, str, numbers, bytes, numpy arrays and scalars) as one
    msgpack frame of openpi's wire.

    Raises:
        TypeError: a value msgpack cannot carry, or an array of a refused dtype.
    """
    return msgpack.packb(message, default=_encode, use_bin_type=True)


def unpackb(frame: bytes) -> Any:
    """One msgpack frame of openpi's wire, its arrays as read-only numpy views.

    Raises:
        OpenPIWireError: the frame is not msgpack, or an array's bytes do not match its dtype
            and shape.
    """
    try:
        return msgpack.unpackb(frame, object_hook=_decode, raw=False)
    except OpenPIWireError:
        raise
    except (ValueError, TypeError, msgpack.exceptions.ExtraData) as exc:
        raise OpenPIWireError(f"not an openpi msgpack message: {exc}") from None


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in REFUSED_KINDS:
            raise TypeError(
                f"an array of dtype {value.dtype} cannot travel on openpi's wire: expected "
                "booleans, integers, floats or strings"
            )
        return {
            ARRAY: True,
            b"data": np.ascontiguousarray(value).tobytes(),
            b"dtype": value.dtype.str,
            b"shape": list(value.shape),
        }
    if isinstance(value, np.generic):
        if value.dtype.kind in REFUSED_KINDS:
            raise TypeError(f"a numpy scalar of dtype {value.dtype} cannot travel on openpi's wire")
        return {SCALAR: True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"{type(value).__name__} cannot travel on openpi's wire")


def _decode(value: dict[Any, Any]) -> Any:
    if value.get(ARRAY) is True:
        return _array(value)
    if value.get(SCALAR) is True:
        try:
            return np.dtype(value[b"dtype"]).type(value[b"data"])
        except (KeyError, TypeError) as exc:
            raise OpenPIWireError(f"a numpy scalar without its data or dtype ({exc})") from None
    return value


def _array(value: dict[Any, Any]) -> np.ndarray:
    """The array a marker map holds: a read-only view of the message's bytes, no copy."""
    try:
        name = value[b"dtype"]
        dtype = _DTYPES.get(name) or _dtype(name)
        shape = tuple(map(int, value[b"shape"]))
        data = value[b"data"]
    except (KeyError, TypeError) as exc:
        raise OpenPIWireError(f"an array without its data, dtype or shape ({exc})") from None
    if dtype.kind in REFUSED_KINDS:
        raise OpenPIWireError(f"an array of dtype {dtype}: expected no {REFUSED_KINDS} kind")
    expected = math.prod(shape) * dtype.itemsize
    if type(data) is not bytes or len(data) != expected:
        raise OpenPIWireError(
            f"an array of dtype {dtype.str} and shape {list(shape)} needs {expected} bytes, "
            f"got {len(data) if isinstance(data, bytes) else type(data).__name__}"
        )
    return np.ndarray(shape, dtype, data)


_DTYPES: dict[str, np.dtype[Any]] = {}
_DTYPES_KEPT = 64  # distinct dtype names parsed once each; a peer cannot grow it beyond


def _dtype(name: Any) -> np.dtype[Any]:
    dtype = np.dtype(name)
    if isinstance(name, str) and len(_DTYPES) < _DTYPES_KEPT:
        _DTYPES[name] = dtype
    return dtype
