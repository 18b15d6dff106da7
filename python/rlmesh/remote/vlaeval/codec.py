"""vla-eval's messages: msgpack envelopes ``{"type", "payload", "seq", "timestamp"}`` whose
payloads carry numpy arrays as marker maps with **str** keys, and HWC uint8 images as PNG.

- An array travels as ``{"__ndarray__": True, "data": <C-order bytes>, "dtype": dtype.str,
  "shape": [...]}``; only boolean, integer and float dtypes (kinds ``b i u f``) are taken or
  sent. A numpy scalar travels as the Python number it holds (its dtype is not kept).
- An image, an ``(H, W, 3)`` or ``(H, W, 4)`` uint8 array, travels with ``image_format="png"``
  (vla-eval's default) as ``{"__image__": True, "format": "png", "data": <PNG bytes>,
  "shape": [...]}`` (``rlmesh.remote.png``); with ``"raw"`` as any array. Received,
  ``"png"`` and ``"raw"`` images are read without Pillow, ``"jpeg"`` ones need Pillow.
- Decoded arrays are writable copies, as vla-eval's own decoder hands them over.

Where the peer (``vla-eval`` 0.8.0) departs from its own description, and what this codec does:

- Its RFC says images travel raw by default; its codec PNG-encodes them by default. Both
  forms are read here.
- Its image heuristic claims ``(H, W, 1)`` uint8 arrays as images, but its encoder (Pillow)
  cannot write them (a TypeError), and a grey PNG decodes to ``(H, W)``, its ``shape`` field
  ignored. So one-channel images travel here as plain arrays, which every peer reads exactly,
  and a received image is reshaped to its ``shape`` when the pixels fit it.
- Its RFC gives ``dtype`` as a name such as ``"float32"`` and ``shape`` as a tuple; it sends
  ``dtype.str`` (``"<f4"``) and a list. Both dtype spellings are read.
- Its RFC says Void, Object and Complex dtypes are refused; it refuses every kind but
  ``b i u f``, and only when decoding (its encoder sends what its decoder refuses). This codec
  refuses them both ways.

Example:
    >>> import numpy as np
    >>> frame = pack_message("observation", {"state": np.arange(3, dtype=np.float32)}, seq=7)
    >>> message = unpack_message(frame)
    >>> state = message.payload["state"]
    >>> message.type, message.seq, state, state.flags.writeable
    ('observation', 7, array([0., 1., 2.], dtype=float32), True)
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..png import PNGError, decode_png, encode_png, pillow

MESSAGE_TYPES = ("hello", "observation", "action", "episode_start", "episode_end", "error")
PROTOCOL_VERSION = 1
ARRAY = "__ndarray__"
IMAGE = "__image__"
ALLOWED_KINDS = "biuf"
IMAGE_FORMATS = ("png", "raw")
REQUIRED_FIELDS = ("type", "payload", "seq", "timestamp")


class VlaEvalWireError(ValueError):
    """A frame that is not a vla-eval message: the text says what was wrong and where.

    Attributes:
        seq: the message's ``seq`` when the envelope could be read, else 0 (what an error
            reply echoes).
    """

    def __init__(self, message: str, seq: int = 0) -> None:
        super().__init__(message)
        self.seq = seq


@dataclass(frozen=True)
class Message:
    """One vla-eval message: its ``type`` (one of ``MESSAGE_TYPES``), ``payload``, ``seq``
    and ``timestamp`` (seconds since the epoch, when it was made)."""

    type: str
    payload: Any
    seq: int
    timestamp: float


def pack_message(
    kind: str,
    payload: Any,
    seq: int,
    *,
    image_format: str = "png",
    timestamp: float | None = None,
) -> bytes:
    """One binary frame: the message of type ``kind`` carrying ``payload``.

    Args:
        kind: one of ``MESSAGE_TYPES``.
        payload: dicts, lists, str, numbers, bytes, numpy arrays and scalars.
        seq: the message's sequence number (an answer echoes its request's).
        image_format: ``"png"`` (vla-eval's default) or ``"raw"``: how ``(H, W, 3|4)`` uint8
            arrays travel.
        timestamp: the message's time (default now).

    Raises:
        ValueError: an unknown ``kind`` or ``image_format``.
        TypeError: a value msgpack cannot carry, or an array of a refused dtype.
    """
    if kind not in MESSAGE_TYPES:
        raise ValueError(f"message type {kind!r}: expected one of {', '.join(MESSAGE_TYPES)}")
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format {image_format!r}: expected 'png' or 'raw'")
    envelope = {
        "type": kind,
        "payload": payload,
        "seq": seq,
        "timestamp": time.time() if timestamp is None else timestamp,
    }
    encode = _encode_with_png if image_format == "png" else _encode
    return msgpack.packb(envelope, default=encode, use_bin_type=True)


def unpack_message(frame: bytes | str) -> Message:
    """The message one frame holds, its arrays and images decoded.

    Raises:
        VlaEvalWireError: a text frame, bytes that are not msgpack, an envelope without its
            fields or of an unknown type, or an array or image that does not decode.
    """
    if isinstance(frame, str):
        raise VlaEvalWireError("a text frame: vla-eval's messages are binary frames of msgpack")
    try:
        raw = msgpack.unpackb(frame, object_hook=_decode, raw=False)
    except VlaEvalWireError as exc:
        raise VlaEvalWireError(str(exc), _seq_of(frame)) from None
    except (ValueError, TypeError, msgpack.exceptions.ExtraData) as exc:
        raise VlaEvalWireError(f"not a msgpack message ({len(frame)} bytes): {exc}") from None
    if not isinstance(raw, dict):
        raise VlaEvalWireError(f"a msgpack {type(raw).__name__}: expected a map (the envelope)")
    seq = raw.get("seq")
    seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
    missing = [field for field in REQUIRED_FIELDS if field not in raw]
    if missing:
        raise VlaEvalWireError(
            f"an envelope without {', '.join(missing)}: expected the fields "
            f"{', '.join(REQUIRED_FIELDS)}",
            seq,
        )
    if raw["type"] not in MESSAGE_TYPES:
        raise VlaEvalWireError(
            f"message type {raw['type']!r}: expected one of {', '.join(MESSAGE_TYPES)}", seq
        )
    if isinstance(raw["seq"], bool) or not isinstance(raw["seq"], int):
        raise VlaEvalWireError(f"seq {raw['seq']!r}: expected an integer")
    timestamp = raw["timestamp"]
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise VlaEvalWireError(f"timestamp {timestamp!r}: expected a number of seconds", seq)
    return Message(raw["type"], raw["payload"], seq, float(timestamp))


def is_image(value: np.ndarray) -> bool:
    """Whether ``value`` travels as an image under ``image_format="png"``: ``(H, W, 3)`` or
    ``(H, W, 4)`` uint8 with at least one pixel."""
    return (
        value.ndim == 3
        and value.dtype == np.uint8
        and value.shape[2] in (3, 4)
        and value.shape[0] > 0
        and value.shape[1] > 0
    )


def _encode_with_png(value: Any) -> Any:
    if isinstance(value, np.ndarray) and is_image(value):
        return {IMAGE: True, "format": "png", "data": encode_png(value), "shape": list(value.shape)}
    return _encode(value)


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in ALLOWED_KINDS:
            raise TypeError(
                f"an array of dtype {value.dtype} cannot travel on vla-eval's wire: expected "
                "booleans, integers or floats"
            )
        return {
            ARRAY: True,
            "data": np.ascontiguousarray(value).tobytes(),
            "dtype": value.dtype.str,
            "shape": list(value.shape),
        }
    if isinstance(value, np.generic):
        if value.dtype.kind not in ALLOWED_KINDS:
            raise TypeError(
                f"a numpy scalar of dtype {value.dtype} cannot travel on vla-eval's wire"
            )
        return value.item()
    raise TypeError(f"{type(value).__name__} cannot travel on vla-eval's wire")


def _decode(value: dict[Any, Any]) -> Any:
    # The peer tells markers by the key's presence, whatever its value; so does this.
    if IMAGE in value:
        return _image(value)
    if ARRAY in value:
        return _array(value, "an array")
    return value


def _array(value: dict[Any, Any], what: str) -> np.ndarray:
    try:
        dtype = np.dtype(value["dtype"])
        shape = tuple(int(size) for size in value["shape"])
        data = value["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise VlaEvalWireError(f"{what} without a valid data, dtype or shape ({exc})") from None
    if dtype.kind not in ALLOWED_KINDS:
        raise VlaEvalWireError(
            f"{what} of dtype {dtype}: expected booleans, integers or floats (kinds "
            f"{ALLOWED_KINDS})"
        )
    if min(shape, default=0) < 0:
        raise VlaEvalWireError(f"{what} of shape {list(shape)}: sizes must be >= 0")
    expected = math.prod(shape) * dtype.itemsize
    if not isinstance(data, bytes) or len(data) != expected:
        raise VlaEvalWireError(
            f"{what} of dtype {dtype.str} and shape {list(shape)} needs {expected} bytes, "
            f"got {len(data) if isinstance(data, bytes) else type(data).__name__}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _image(value: dict[Any, Any]) -> np.ndarray:
    kind = value.get("format")
    if kind == "raw":
        return _array(value, "a raw image")
    data = value.get("data")
    if not isinstance(data, bytes):
        raise VlaEvalWireError(f"a {kind!r} image without its bytes")
    if kind == "png":
        try:
            image = decode_png(data)
        except PNGError as exc:
            raise VlaEvalWireError(f"a PNG image that does not decode: {exc}") from None
    elif kind == "jpeg":
        image = _jpeg(data)
    else:
        raise VlaEvalWireError(f"an image of format {kind!r}: expected 'png', 'jpeg' or 'raw'")
    shape = value.get("shape")
    fits = isinstance(shape, list) and all(isinstance(size, int) for size in shape)
    if fits and math.prod(shape) == image.size:
        image = image.reshape(shape)
    return image


def _jpeg(data: bytes) -> np.ndarray:
    image_module = pillow()
    if image_module is None:
        raise VlaEvalWireError(
            "a JPEG image, which needs Pillow to decode: pip install pillow (or have the peer "
            "send PNG, vla-eval's default)"
        )
    try:
        with image_module.open(io.BytesIO(data)) as image:
            return np.array(image)
    except Exception as exc:  # Pillow raises many kinds; all mean the bytes are bad
        raise VlaEvalWireError(f"a JPEG image that does not decode: {exc}") from None


def _seq_of(frame: bytes) -> int:
    """The envelope's ``seq`` of a frame whose payload did not decode (0 if none is found)."""
    try:
        raw = msgpack.unpackb(frame, raw=False)
    except Exception:  # the frame is no msgpack at all: no seq to echo
        return 0
    seq = raw.get("seq") if isinstance(raw, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0


__all__ = [
    "ARRAY",
    "IMAGE",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "Message",
    "VlaEvalWireError",
    "is_image",
    "pack_message",
    "unpack_message",
]
