"""vla-eval's messages (``rlmesh.remote.vlaeval.codec``) and PNG (``rlmesh.remote.png``): arrays
of every dtype the wire allows travel exactly with str marker keys, images as PNG that Pillow
and vla-eval itself read, PNGs of every row filter decode, and malformed frames say what was
wrong (with the envelope's seq when it is known).

``vlaeval_python()`` (the Python of a venv holding vla-eval, for this module and the server
and client tests) lives here.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from rlmesh.remote.png import PNGError, decode_png, encode_png, pillow
from rlmesh.remote.vlaeval.codec import (
    ARRAY,
    IMAGE,
    VlaEvalWireError,
    pack_message,
    unpack_message,
)
from servers import cached_venv

VLAEVAL_VERSION = "0.8.0"
DTYPES = ["|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"]


def vlaeval_venv_dir() -> Path:
    default = Path.home() / ".cache" / "rlmesh-tests" / f"peer-vla-eval-{VLAEVAL_VERSION}"
    return Path(os.environ.get("RLMESH_VLAEVAL_VENV", default))


def vlaeval_python() -> str:
    """The Python of a venv holding ``vla-eval`` (its ``Connection``, ``serve`` and codec),
    made on first use; ``pytest.skip`` if pip cannot install it."""
    return cached_venv(vlaeval_venv_dir(), [[f"vla-eval=={VLAEVAL_VERSION}"]], "vla-eval")


def run_peer(script: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``script`` run by the vla-eval venv's Python with ``args``; fails the test on a
    non-zero exit, showing its stderr."""
    done = subprocess.run(
        [vlaeval_python(), "-c", script, *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# ---------------------------------------------------------------------------------- arrays


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_travel_exactly_and_scalars_as_numbers(dtype):
    rng = np.random.default_rng(len(dtype))
    array = (rng.random((2, 3, 4)) * 100).astype(dtype)
    payload = {"x": array, "scalar": array[1, 2, 3], "nested": [array[0]], "text": "pick"}
    message = unpack_message(pack_message("observation", payload, seq=4))
    decoded = message.payload
    assert decoded["x"].dtype == array.dtype and decoded["x"].shape == (2, 3, 4)
    np.testing.assert_array_equal(decoded["x"], array)
    np.testing.assert_array_equal(decoded["nested"][0], array[0])
    assert decoded["x"].flags.writeable  # a copy, as vla-eval's decoder gives
    assert decoded["scalar"] == array[1, 2, 3] and not isinstance(decoded["scalar"], np.generic)
    assert (message.type, message.seq, decoded["text"]) == ("observation", 4, "pick")


def test_the_envelope_and_its_marker_keys_are_strings():
    frame = pack_message("action", {"actions": np.zeros(2, np.float32)}, seq=9, timestamp=1.5)
    raw = msgpack.unpackb(frame, raw=False)
    assert raw["type"] == "action" and raw["seq"] == 9 and raw["timestamp"] == 1.5
    array = raw["payload"]["actions"]
    assert array == {ARRAY: True, "data": b"\x00" * 8, "dtype": "<f4", "shape": [2]}


def test_a_strided_view_travels_as_its_values():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    decoded = unpack_message(pack_message("observation", {"x": array}, 1)).payload["x"]
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize(
    "value",
    [np.zeros(2, np.complex64), np.array([object()]), np.zeros(1, "V4"), np.array(["a"])],
)
def test_refused_dtypes_say_so(value):
    with pytest.raises(TypeError, match="cannot travel on vla-eval's wire"):
        pack_message("observation", {"x": value}, 1)


# ---------------------------------------------------------------------------------- images


@pytest.mark.parametrize("channels", [3, 4])
def test_rgb_and_rgba_images_travel_as_png_and_come_back_exactly(channels):
    image = np.random.default_rng(channels).integers(0, 256, (24, 32, channels), dtype=np.uint8)
    frame = pack_message("observation", {"images": {"main": image}}, 2)
    sent = msgpack.unpackb(frame, raw=False)["payload"]["images"]["main"]
    assert sent[IMAGE] is True and sent["format"] == "png" and sent["shape"] == [24, 32, channels]
    assert sent["data"].startswith(b"\x89PNG")
    np.testing.assert_array_equal(unpack_message(frame).payload["images"]["main"], image)
    raw = msgpack.unpackb(pack_message("observation", {"x": image}, 2, image_format="raw"))
    assert ARRAY in raw["payload"]["x"]  # "raw": an image is an array like any other


def test_a_grey_image_travels_as_an_array_and_keeps_its_shape():
    # vla-eval's own encoder cannot write (H, W, 1) images and its decoder drops the axis.
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4, 1)
    frame = pack_message("observation", {"x": grey}, 1)
    assert ARRAY in msgpack.unpackb(frame, raw=False)["payload"]["x"]
    assert unpack_message(frame).payload["x"].shape == (3, 4, 1)


def _png_with_filters(image: np.ndarray, filters: list[int]) -> bytes:
    """A PNG of ``image`` whose row r uses filter ``filters[r]``, filtered the slow, plain way
    (PNG's definition), so the decoder is checked against the format rather than itself."""
    height, width, channels = image.shape
    rows = image.reshape(height, width * channels).astype(np.int64)
    out = bytearray()
    for r, kind in enumerate(filters):
        above = rows[r - 1] if r else np.zeros_like(rows[r])
        out.append(kind)
        for i, value in enumerate(rows[r]):
            left = rows[r, i - channels] if i >= channels else 0
            corner = above[i - channels] if i >= channels else 0
            up = above[i]
            estimate = left + up - corner
            paeth = min((abs(estimate - left), 0, left), (abs(estimate - up), 1, up),
                        (abs(estimate - corner), 2, corner))[2]  # fmt: skip
            predictor = [0, left, up, (left + up) // 2, paeth][kind]
            out.append((value - predictor) % 256)
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(out)))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_every_row_filter_decodes_as_pillow_decodes_it(channels):
    image = np.random.default_rng(channels).integers(0, 256, (10, 7, channels), dtype=np.uint8)
    data = _png_with_filters(image, [0, 1, 2, 3, 4, 4, 3, 2, 1, 0])
    np.testing.assert_array_equal(decode_png(data, use_pillow=False), image)
    if pillow() is not None:  # Pillow reads the same pixels from the same bytes
        np.testing.assert_array_equal(decode_png(data, use_pillow=True), image)
        with pillow().open(io.BytesIO(encode_png(image))) as ours:
            np.testing.assert_array_equal(np.asarray(ours).reshape(image.shape), image)


def test_pillows_own_pngs_decode_without_pillow():
    image_module = pytest.importorskip(
        "PIL.Image", reason="Pillow (the test extra) is not installed"
    )
    rng = np.random.default_rng(3)
    smooth = np.kron(rng.integers(0, 256, (12, 12, 3)), np.ones((8, 8, 1)))
    image = np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    image_module.fromarray(image).save(buffer, format="PNG")  # adaptive filters, level 6
    np.testing.assert_array_equal(decode_png(buffer.getvalue(), use_pillow=False), image)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a", "signature"),
        (encode_png(np.zeros((2, 2, 3), np.uint8))[:-20], "runs past|ends before"),
        (encode_png(np.zeros((2, 2, 3), np.uint8)).replace(b"IDAT", b"IDAX"), "CRC"),
    ],
)
def test_damaged_pngs_say_so(data, message):
    with pytest.raises(PNGError, match=message):
        decode_png(data, use_pillow=False)


# ---------------------------------------------------------------------------------- malformed


def _envelope(**fields):
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("frame", "message", "seq"),
    [
        (b"\xc1", "not a msgpack message", 0),
        ("a text frame", "a text frame", 0),
        (msgpack.packb([1, 2]), "expected a map", 0),
        (_envelope(type="observation", payload={}, seq=3), "without timestamp", 3),
        (_envelope(type="reset", payload={}, seq=4, timestamp=0.0), "message type 'reset'", 4),
        (_envelope(type="observation", payload={}, seq="5", timestamp=0.0), "seq '5'", 0),
        (
            _envelope(
                type="observation",
                payload={"x": {ARRAY: True, "data": b"abc", "dtype": "<f4", "shape": [2]}},
                seq=6,
                timestamp=0.0,
            ),
            r"dtype <f4 and shape \[2\] needs 8 bytes, got 3",
            6,
        ),
        (
            _envelope(
                type="observation",
                payload={"x": {ARRAY: True, "data": b"\x00" * 8, "dtype": "<c8", "shape": [1]}},
                seq=7,
                timestamp=0.0,
            ),
            "dtype complex64",
            7,
        ),
        (
            _envelope(
                type="observation",
                payload={"x": {IMAGE: True, "format": "png", "data": b"nope", "shape": [1]}},
                seq=8,
                timestamp=0.0,
            ),
            "PNG image that does not decode",
            8,
        ),
        (
            _envelope(
                type="observation",
                payload={"x": {IMAGE: True, "format": "webp", "data": b"", "shape": [1]}},
                seq=9,
                timestamp=0.0,
            ),
            "format 'webp'",
            9,
        ),
    ],
    ids=[
        "not-msgpack",
        "text",
        "not-a-map",
        "missing-field",
        "unknown-type",
        "bad-seq",
        "bad-array",
        "refused-dtype",
        "bad-png",
        "unknown-image-format",
    ],
)
def test_malformed_frames_are_refused_saying_what_and_which_seq(frame, message, seq):
    with pytest.raises(VlaEvalWireError, match=message) as refused:
        unpack_message(frame)
    assert refused.value.seq == seq


# ---------------------------------------------------------------------------------- the peer

# vla-eval's own codec reads our frame and writes its own back: what each side decodes of the
# other's images, arrays and numbers.
PEER_CODEC = """
import sys
from vla_eval.protocol.messages import Message, MessageType, pack_message, unpack_message
theirs = unpack_message(open(sys.argv[1], "rb").read())
payload = theirs.payload
# A (H, W, 1) image it reads, but cannot send back (its PNG encoder refuses it): its shape
# and sum go back instead.
summary = {
    "seq": theirs.seq,
    "rgb": payload["rgb"], "rgba": payload["rgba"], "state": payload["state"],
    "count": payload["count"],
    "grey": [list(payload["grey"].shape), int(payload["grey"].sum()), payload["grey"].dtype.str],
}
open(sys.argv[2], "wb").write(pack_message(Message(MessageType.ACTION, summary, seq=theirs.seq)))
"""


def test_vla_evals_own_codec_reads_our_frames_and_we_read_its(tmp_path: Path):
    rng = np.random.default_rng(11)
    payload = {
        "rgb": rng.integers(0, 256, (16, 20, 3), dtype=np.uint8),
        "rgba": rng.integers(0, 256, (8, 8, 4), dtype=np.uint8),
        "grey": rng.integers(0, 256, (8, 8, 1), dtype=np.uint8),
        "state": rng.random(7).astype(np.float32),
        "count": np.int64(5),
    }
    ours, theirs = tmp_path / "ours.msgpack", tmp_path / "theirs.msgpack"
    ours.write_bytes(pack_message("observation", payload, seq=12))
    run_peer(PEER_CODEC, str(ours), str(theirs))
    back = unpack_message(theirs.read_bytes())
    assert back.type == "action" and back.seq == 12
    for key in ("rgb", "rgba", "state"):  # Pillow-made PNGs, raw arrays
        assert back.payload[key].dtype == payload[key].dtype
        np.testing.assert_array_equal(back.payload[key], payload[key])
    grey = payload["grey"]
    assert back.payload["grey"] == [[8, 8, 1], int(grey.sum()), "|u1"]
    assert back.payload["count"] == 5
