"""PNG with ``zlib`` alone: ``encode_png`` and ``decode_png`` for 8-bit images of 1 to 4
channels, ``(H, W, C)`` uint8; every frame that crosses a wire as an image uses it (vla-eval's
images, a served env's ``render()`` frames, the live view's lane frames).

vla-eval sends HWC uint8 images as PNG by default, encoded by Pillow; this module lets rlmesh
read and write them without Pillow. The encoder writes every row with the "Up" filter at
zlib level 1 (the fastest setting that still shrinks rendered frames several times over).
The decoder reads what any encoder writes for such images: bit depth 8, colour types grey,
grey with alpha, RGB and RGBA, no interlacing, and all five row filters. Rows filtered with
"Average" or "Paeth" (which Pillow picks for some rows of noisy images) are undone in plain
Python, about 0.15 ms per row of a 224-pixel-wide RGB frame, so ``decode_png`` hands the data
to Pillow when Pillow is installed (``use_pillow``).

Example:
    >>> import numpy as np
    >>> image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    >>> data = encode_png(image)
    >>> data[:8], np.array_equal(decode_png(data, use_pillow=False), image)
    (b'\\x89PNG\\r\\n\\x1a\\n', True)
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Colour type by channel count, and back.
COLOUR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}
CHANNELS = {colour: channels for channels, colour in COLOUR_TYPES.items()}
UP = 2
DEFAULT_LEVEL = 1


class PNGError(ValueError):
    """Bytes that are no PNG this module reads: the text says what was wrong."""


def encode_png(image: np.ndarray, level: int = DEFAULT_LEVEL) -> bytes:
    """``image``, ``(H, W, C)`` uint8 with C in 1..4 (or ``(H, W)``: grey), as PNG bytes.

    Raises:
        ValueError: another dtype or shape.
    """
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(
            f"a PNG holds (H, W, C) uint8 images, got an array of dtype {image.dtype} and "
            f"shape {image.shape}"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    height, width, channels = image.shape
    if channels not in COLOUR_TYPES or height == 0 or width == 0:
        raise ValueError(
            f"a PNG holds images of 1 to 4 channels and at least one pixel, got shape {image.shape}"
        )
    rows = np.ascontiguousarray(image).reshape(height, width * channels)
    filtered = np.empty((height, width * channels + 1), np.uint8)
    filtered[:, 0] = UP
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # wraps modulo 256, as PNG's does
    header = struct.pack(">IIBBBBB", width, height, 8, COLOUR_TYPES[channels], 0, 0, 0)
    return b"".join(
        (
            SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(filtered.tobytes(), level)),
            _chunk(b"IEND", b""),
        )
    )


def decode_png(data: bytes, *, use_pillow: bool | None = None) -> np.ndarray:
    """The image of PNG ``data`` as ``(H, W, C)`` uint8 (C = 1 for grey, 2 for grey with
    alpha, 3, 4).

    Args:
        data: the PNG file's bytes.
        use_pillow: decode with Pillow (True), with this module's decoder (False), or with
            Pillow when it is installed (None, the default).

    Raises:
        PNGError: not a PNG, a damaged one, or one of another bit depth, a palette or
            interlacing (this module's decoder; Pillow's errors are reported as PNGError too).
    """
    if use_pillow is None:
        use_pillow = pillow() is not None
    if use_pillow:
        return _decode_with_pillow(data)
    width, height, channels, compressed = _read_chunks(data)
    try:
        raw = zlib.decompress(compressed)
    except zlib.error as exc:
        raise PNGError(f"a PNG whose image data does not inflate: {exc}") from None
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise PNGError(
            f"a {width}x{height} PNG of {channels} channels needs {height * (stride + 1)} "
            f"bytes of image data, got {len(raw)}"
        )
    rows = np.frombuffer(raw, np.uint8).reshape(height, stride + 1)
    image = np.empty((height, stride), np.uint8)
    previous = np.zeros(stride, np.uint8)
    for index in range(height):
        image[index] = _unfilter(int(rows[index, 0]), rows[index, 1:], previous, channels, index)
        previous = image[index]
    return image.reshape(height, width, channels)


def pillow() -> Any:
    """Pillow's ``PIL.Image`` module, or None when Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def _decode_with_pillow(data: bytes) -> np.ndarray:
    image_module = pillow()
    if image_module is None:
        raise PNGError("decoding with Pillow was asked for, but Pillow is not installed")
    try:
        with image_module.open(io.BytesIO(data)) as image:
            array = np.array(image)
    except Exception as exc:  # Pillow raises many kinds; all mean the bytes are bad
        raise PNGError(f"an image Pillow cannot decode: {type(exc).__name__}: {exc}") from None
    if array.dtype != np.uint8:
        raise PNGError(f"a PNG of {array.dtype} samples: expected 8-bit images")
    return array[:, :, None] if array.ndim == 2 else array


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _read_chunks(data: bytes) -> tuple[int, int, int, bytes]:
    """Width, height, channels and the joined IDAT data of a PNG this decoder reads."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:8]) != SIGNATURE:
        raise PNGError("not a PNG: the data does not start with PNG's signature")
    view = memoryview(data)
    position, header, idat = 8, None, []
    while True:
        if position + 8 > len(view):
            raise PNGError("a PNG that ends before its IEND chunk")
        (length,) = struct.unpack_from(">I", view, position)
        kind = bytes(view[position + 4 : position + 8])
        end = position + 8 + length
        if end + 4 > len(view):
            raise PNGError(f"a PNG whose {kind!r} chunk runs past the data's end")
        (crc,) = struct.unpack_from(">I", view, end)
        if zlib.crc32(view[position + 4 : end]) != crc:
            raise PNGError(f"a PNG whose {kind!r} chunk fails its CRC")
        body = view[position + 8 : end]
        position = end + 4
        if kind == b"IHDR":
            header = _header(bytes(body))
        elif kind == b"IDAT":
            idat.append(bytes(body))
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise PNGError("a PNG without its IHDR or IDAT chunk")
    return (*header, b"".join(idat))


def _header(body: bytes) -> tuple[int, int, int]:
    if len(body) != 13:
        raise PNGError(f"a PNG whose IHDR chunk holds {len(body)} bytes, expected 13")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
    if depth != 8 or colour not in CHANNELS:
        raise PNGError(
            f"a PNG of bit depth {depth} and colour type {colour}: expected 8-bit grey, grey "
            f"with alpha, RGB or RGBA (Pillow, when installed, decodes the others)"
        )
    if interlace:
        raise PNGError("an interlaced PNG: expected none (Pillow, when installed, decodes it)")
    if width == 0 or height == 0:
        raise PNGError(f"a PNG of {width}x{height} pixels")
    return width, height, CHANNELS[colour]


def _unfilter(kind: int, row: np.ndarray, previous: np.ndarray, bpp: int, index: int) -> np.ndarray:
    """One row's bytes with its filter undone, from the row above (already undone)."""
    if kind == 0:
        return row
    if kind == 1:  # Sub: a running sum per channel, modulo 256
        width = len(row) // bpp
        return np.cumsum(row.reshape(width, bpp), axis=0, dtype=np.uint8).reshape(-1)
    if kind == UP:
        return row + previous
    if kind in (3, 4):
        return np.frombuffer(_sequential(kind, row.tobytes(), previous.tobytes(), bpp), np.uint8)
    raise PNGError(f"row {index} of the PNG has filter type {kind}: expected 0 to 4")


def _sequential(kind: int, row: bytes, above: bytes, bpp: int) -> bytearray:
    """Average (3) and Paeth (4): each byte depends on the one left of it, so byte by byte."""
    out = bytearray(len(row))
    for i in range(len(row)):
        left = out[i - bpp] if i >= bpp else 0
        up = above[i]
        if kind == 3:
            out[i] = (row[i] + ((left + up) >> 1)) & 0xFF
            continue
        corner = above[i - bpp] if i >= bpp else 0
        estimate = left + up - corner
        to_left, to_up, to_corner = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
        if to_left <= to_up and to_left <= to_corner:
            predictor = left
        elif to_up <= to_corner:
            predictor = up
        else:
            predictor = corner
        out[i] = (row[i] + predictor) & 0xFF
    return out


__all__ = ["PNGError", "decode_png", "encode_png", "pillow"]
