"""Resizing in the cores: bilinear_aa against Pillow, bilinear against a numpy reference and
OpenCV, random images up and down, both cores bit for bit."""

from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np
import pytest
from helpers import CORES
from PIL import Image as PILImage
from rlmesh import adapters
from rlmesh.core import load_core

SIZES = [
    ((256, 256), (224, 224)),
    ((64, 48), (16, 12)),
    ((37, 53), (91, 17)),
    ((8, 8), (3, 4)),
    ((5, 7), (40, 56)),
    ((100, 1), (7, 1)),
]


def _resized(core: str, image: np.ndarray, size: tuple[int, int], resample: str, **image_options):
    """``image`` through a core's assembler, for a role-based Image leaf of that size."""
    tags = adapters.EnvTags(
        observation={"cam": adapters.ImageTag(adapters.IMAGE_PRIMARY)},
        action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    )
    spec = adapters.ModelSpec(
        input=adapters.Image(
            adapters.IMAGE_PRIMARY,
            height=size[0],
            width=size[1],
            resample=resample,
            allow_upscale=True,
            fit="stretch",
            **image_options,
        ),
        output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    )
    space = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, image.shape, image.dtype)})
    plan = adapters.resolve(tags, space, gym.spaces.Box(-1, 1, (1,), np.float32), spec)
    assembler = load_core(core).ObservationAssembler(plan.observation)
    return assembler.assemble([{"cam": image}], [0])[0]


def _bilinear_reference(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Half-pixel-centre bilinear, pixel by pixel, in float64 (OpenCV's INTER_LINEAR rule)."""
    h, w, _ = image.shape
    out = np.empty((height, width, image.shape[2]))
    for y in range(height):
        sy = min(max((y + 0.5) * h / height - 0.5, 0.0), h - 1)
        y0 = int(np.floor(sy))
        y1, fy = min(y0 + 1, h - 1), sy - y0
        for x in range(width):
            sx = min(max((x + 0.5) * w / width - 0.5, 0.0), w - 1)
            x0 = int(np.floor(sx))
            x1, fx = min(x0 + 1, w - 1), sx - x0
            top = image[y0, x0] * (1 - fx) + image[y0, x1] * fx
            bottom = image[y1, x0] * (1 - fx) + image[y1, x1] * fx
            out[y, x] = top * (1 - fy) + bottom * fy
    return out


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("source", "target"), SIZES)
def test_bilinear_aa_is_within_one_step_of_pillow(core, source, target):
    rng = np.random.default_rng(sum(source) * 31 + sum(target))
    image = rng.integers(0, 256, (*source, 3), dtype=np.uint8)
    ours = _resized(core, image, target, "bilinear_aa")
    pillow = np.asarray(
        PILImage.fromarray(image).resize((target[1], target[0]), PILImage.Resampling.BILINEAR)
    )
    assert ours.shape == pillow.shape and ours.dtype == np.uint8
    assert np.abs(ours.astype(int) - pillow).max() <= 1
    # Pillow's fixed point is followed exactly: nearly every pixel is equal.
    assert np.mean(ours == pillow) > 0.99


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("source", "target"), SIZES)
def test_bilinear_matches_the_half_pixel_reference_and_opencv(core, source, target):
    rng = np.random.default_rng(sum(source) * 17 + sum(target))
    image = rng.integers(0, 256, (*source, 3), dtype=np.uint8)
    ours = _resized(core, image, target, "bilinear")
    reference = _bilinear_reference(image.astype(np.float64), *target)
    assert np.abs(ours - reference).max() <= 0.5 + 1e-9  # rounding only
    opencv = cv2.resize(image, (target[1], target[0]), interpolation=cv2.INTER_LINEAR)
    assert np.abs(ours.astype(int) - opencv).max() <= 1  # OpenCV's fixed point


@pytest.mark.parametrize("resample", ["bilinear", "bilinear_aa"])
@pytest.mark.parametrize(("source", "target"), SIZES)
def test_both_cores_resize_to_the_same_bits(resample, source, target):
    rng = np.random.default_rng(sum(source) + 7 * sum(target))
    image = rng.integers(0, 256, (*source, 3), dtype=np.uint8)
    python, rust = (_resized(core, image, target, resample) for core in CORES[::-1])
    assert python.dtype == rust.dtype and np.array_equal(python, rust)
    # A float image, flipped, normalized and channels-first: the same bits too.
    floats = rng.random((*source, 3)).astype(np.float32)
    options = {"dtype": "float32", "upside_down": True, "layout": "chw", "stack": 2}
    python, rust = (_resized(core, floats, target, resample, **options) for core in CORES[::-1])
    assert python.shape == (2, 3, *target)  # [stack, C, H, W]
    assert np.array_equal(python, rust)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("source", "target"), SIZES)
def test_a_float_image_resizes_as_the_references_do(core, source, target):
    rng = np.random.default_rng(sum(source) * 13 + sum(target))
    image = rng.random((*source, 3)).astype(np.float32)
    options = {"dtype": "float32"}
    ours = _resized(core, image, target, "bilinear", **options)
    assert ours.dtype == np.float32
    reference = _bilinear_reference(image.astype(np.float64), *target)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)
    # bilinear_aa against Pillow on float32 ("F") images, one channel at a time.
    ours = _resized(core, image, target, "bilinear_aa", **options)
    pillow = np.stack(
        [
            np.asarray(
                PILImage.fromarray(image[:, :, channel]).resize(
                    (target[1], target[0]), PILImage.Resampling.BILINEAR
                )
            )
            for channel in range(3)
        ],
        axis=-1,
    )
    np.testing.assert_allclose(ours, pillow, rtol=0, atol=1e-5)
