"""An aspect change reconciled by ``fit``: ``crop`` (scale to cover, cut the centre), ``pad``
(scale to fit inside, centre on zeros) and a preference list, on both cores, against a
reference built here from Pillow (bilinear_aa) and OpenCV (bilinear) resizes."""

from __future__ import annotations

import math

import cv2
import gymnasium as gym
import numpy as np
import pytest
from helpers import CORES
from PIL import Image as PILImage
from rlmesh import adapters
from rlmesh.core import load_core
from rlmesh.errors import SpecError


def _space(height, width):
    return gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (height, width, 3), np.uint8)})


TAGS = adapters.EnvTags(observation={"camera": adapters.ImageTag(adapters.IMAGE_PRIMARY)})


def _plan(source, target, fit, **options):
    spec = adapters.ModelSpec(
        input={"image": adapters.Image(adapters.IMAGE_PRIMARY, height=target[0], width=target[1],
                                       fit=fit, **options)},
    )  # fmt: skip
    return adapters.resolve(TAGS, _space(*source), gym.spaces.Discrete(2), spec)


def _assemble(core, plan, image):
    module = load_core(core)
    return module.ObservationAssembler(plan.observation).assemble([{"camera": image}], [0])


def _resized(image, height, width, resample):
    """The reference resize: Pillow's antialiased bilinear, or OpenCV's INTER_LINEAR."""
    if resample == "bilinear_aa":
        return np.asarray(PILImage.fromarray(image).resize((width, height), PILImage.BILINEAR))
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


def _reference(image, target, fit, resample):
    """Scale uniformly (to cover for crop, to fit inside for pad, rounding half up), then cut
    or pad about the centre, rounding the offset down."""
    height, width = image.shape[:2]
    ratios = (target[0] / height, target[1] / width)
    scale = max(ratios) if fit == "crop" else min(ratios)
    size = [math.floor(side * scale + 0.5) for side in (height, width)]
    size = [max(s, t) if fit == "crop" else min(s, t) for s, t in zip(size, target, strict=True)]
    scaled = _resized(image, *size, resample)
    top, left = abs(size[0] - target[0]) // 2, abs(size[1] - target[1]) // 2
    if fit == "crop":
        return scaled[top : top + target[0], left : left + target[1]]
    canvas = np.zeros((*target, 3), np.uint8)
    canvas[top : top + size[0], left : left + size[1]] = scaled
    return canvas


CASES = [
    # source, target: wide and tall cameras into square, wide and tall model inputs
    ((96, 160), (64, 64)),
    ((160, 96), (64, 64)),
    ((120, 120), (48, 80)),
    ((75, 201), (50, 40)),
]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("fit", ["crop", "pad"])
@pytest.mark.parametrize("resample", ["bilinear", "bilinear_aa"])
@pytest.mark.parametrize(("source", "target"), CASES)
def test_crop_and_pad_match_the_reference(core, fit, resample, source, target):
    image = np.random.default_rng(sum(source) + sum(target)).integers(0, 256, (*source, 3))
    image = image.astype(np.uint8)
    plan = _plan(source, target, fit, resample=resample)
    frame = _assemble(core, plan, image)["image"][0]
    expected = _reference(image, target, fit, resample)
    assert frame.shape == (*target, 3)
    # Our resizes are within one uint8 step of Pillow's and OpenCV's (tests/core/test_resize.py).
    assert np.abs(frame.astype(int) - expected.astype(int)).max() <= 1
    if fit == "pad":  # the letterbox itself is exact: zeros wherever the reference has none
        border = _reference(np.full_like(image, 255), target, fit, resample) == 0
        assert border.any() and (frame[border] == 0).all()


@pytest.mark.parametrize("fit", ["crop", "pad"])
@pytest.mark.parametrize(("source", "target"), CASES)
def test_both_cores_agree_exactly(fit, source, target):
    image = np.random.default_rng(7).integers(0, 256, (*source, 3)).astype(np.uint8)
    plan = _plan(source, target, fit, layout="chw", dtype="float32", normalize=(-1, 1))
    rust, python = (_assemble(core, plan, image)["image"] for core in CORES)
    assert rust.shape == (1, 3, *target)
    assert np.array_equal(rust, python)
    if fit == "pad":  # a border pixel is a zero pixel, normalized like any other
        assert rust.min() == -1.0


def test_a_preference_list_crops_a_large_camera_and_pads_a_small_one():
    spec_fit = ("crop", "pad")
    large = _plan((200, 300), (100, 100), spec_fit)
    small = _plan((60, 100), (100, 100), spec_fit)  # cropping it would need an upscale
    assert large.advisories() == ['image "image": aspect crop drops edge pixels']
    assert small.advisories() == ['image "image": aspect pad adds letterbox borders']
    assert "resize 100x100 (bilinear)" in large.describe()


def test_a_fit_that_needs_an_upscale_is_refused_unless_allowed():
    with pytest.raises(SpecError, match=r"with fit crop; set allow_upscale=True"):
        _plan((60, 100), (100, 100), "crop")
    assert _plan((60, 100), (100, 100), "crop", allow_upscale=True).advisories()


def test_an_aspect_change_without_fit_names_the_modes():
    with pytest.raises(SpecError, match=r'set fit to "stretch", "crop" or "pad"'):
        _plan((96, 160), (64, 64), None)


def test_an_unknown_fit_is_refused_where_the_spec_is_written():
    with pytest.raises(SpecError, match=r"fit must be one of"):
        adapters.Image(adapters.IMAGE_PRIMARY, size=64, fit="zoom")


def test_a_preference_list_round_trips_through_v1_json():
    spec = adapters.ModelSpec(
        input={"image": adapters.Image(adapters.IMAGE_PRIMARY, size=64, fit=["crop", "pad"])}
    )
    again = adapters.ModelSpec.from_dict(spec.to_dict())
    assert again == spec
    assert again.input["image"].fit == ("crop", "pad")
