"""Image resizing: ``bilinear`` (OpenCV's ``INTER_LINEAR``) and ``bilinear_aa`` (Pillow's).

Mirrors ``rust/src/resize.rs`` name for name. Images are ``[H, W, C]``, uint8 or float.

- ``bilinear``: half-pixel centres (source ``x = (i + 0.5) * in / out - 0.5``, clamped at the
  edges), the two nearest source pixels per axis, computed in float64; uint8 results are
  rounded half to even (as the adapters-v1 vectors pin; OpenCV's fixed point can differ by
  one step). No antialiasing: a downscale samples, as OpenCV does.
- ``bilinear_aa``: Pillow's ``Image.resize(..., BILINEAR)``: a triangle filter widened by the
  downscale factor (so a downscale averages every source pixel under it), horizontal pass
  first, then vertical; for uint8 each pass uses Pillow's 22-bit fixed-point weights and
  rounds and clips to uint8, so results equal Pillow's.

Example:
    >>> import numpy as np
    >>> image = np.arange(16, dtype=np.uint8).reshape(4, 4, 1) * 10
    >>> resize(image, 2, 2, "bilinear_aa")[..., 0].tolist()
    [[36, 52], [98, 114]]
"""

from __future__ import annotations

import math

import numpy as np

PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed point for 8-bit images


def resize(image: np.ndarray, height: int, width: int, resample: str) -> np.ndarray:
    """``image`` ``[H, W, C]`` resized to ``[height, width, C]``, in its own dtype."""
    if resample == "bilinear":
        return _bilinear(image, height, width)
    if resample == "bilinear_aa":
        out = _aa_pass(image, width, axis=1)
        return _finish(_aa_pass(out, height, axis=0), image.dtype)
    raise ValueError(f"unknown resample {resample!r}; expected bilinear or bilinear_aa")


def bilinear_taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: the two source indices and the weight of the second."""
    scale = size_in / size_out
    lows, highs, fracs = [], [], []
    for index in range(size_out):
        source = max((index + 0.5) * scale - 0.5, 0.0)
        low = min(math.floor(source), size_in - 1)
        lows.append(low)
        highs.append(min(low + 1, size_in - 1))
        fracs.append(source - low if low < size_in - 1 else 0.0)
    return np.array(lows), np.array(highs), np.array(fracs)


def _bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    y0, y1, fy = bilinear_taps(image.shape[0], height)
    x0, x1, fx = bilinear_taps(image.shape[1], width)
    data = image.astype(np.float64)
    rows = data[y0] * (1 - fy)[:, None, None] + data[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return _finish(out, image.dtype)


def _finish(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.dtype(dtype) == np.uint8 and values.dtype != np.uint8:
        return np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return values.astype(dtype)


def aa_taps(size_in: int, size_out: int) -> list[tuple[int, np.ndarray]]:
    """Per output index: the first source index and the normalized triangle weights."""
    scale = size_in / size_out
    filter_scale = max(scale, 1.0)
    support = filter_scale
    taps = []
    for index in range(size_out):
        center = (index + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), size_in)
        weights = np.array(
            [
                max(0.0, 1.0 - abs((source - center + 0.5) / filter_scale))
                for source in range(low, high)
            ]
        )
        total = weights.sum()
        taps.append((low, weights / total if total else weights))
    return taps


def _aa_pass(image: np.ndarray, size_out: int, axis: int) -> np.ndarray:
    """One axis of ``bilinear_aa``: uint8 in and out (Pillow's fixed point, rounded and clipped),
    or float64 out for a float image. Sums run tap by tap, as in the Rust core."""
    size_in = image.shape[axis]
    fixed = image.dtype == np.uint8
    if size_in == size_out:
        return image if fixed else image.astype(np.float64)
    moved = np.moveaxis(image, axis, 0)
    data = moved.astype(np.int64 if fixed else np.float64)
    out = np.empty((size_out, *moved.shape[1:]), np.int64 if fixed else np.float64)
    for index, (low, weights) in enumerate(aa_taps(size_in, size_out)):
        if fixed:
            # Pillow's rounding of each weight: to nearest, half away from zero.
            kernel = np.floor(weights * (1 << PRECISION_BITS) + 0.5).astype(np.int64)
            total = np.full(moved.shape[1:], 1 << (PRECISION_BITS - 1), np.int64)
            for tap, weight in enumerate(kernel):
                total += weight * data[low + tap]
            out[index] = np.clip(total >> PRECISION_BITS, 0, 255)
        else:
            total = np.zeros(moved.shape[1:])
            for tap, weight in enumerate(weights):
                total = total + weight * data[low + tap]
            out[index] = total
    return np.moveaxis(out, 0, axis).astype(np.uint8 if fixed else np.float64)
