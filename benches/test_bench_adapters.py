"""Role-based conversions in the core: resize against Pillow, and a LIBERO-like assembly.

Resize: 64 lanes of 256x256x3 uint8 resized to 224x224 with ``bilinear_aa``, one round =
``assemble`` of an ``Image(IMAGE_PRIMARY, size=224, resample="bilinear_aa")`` leaf; the
baseline is Pillow's ``Image.resize(..., BILINEAR)`` looping over the 64 lanes (one thread),
with the ``fromarray`` / ``asarray`` round trip a user's glue would pay.

LIBERO-like assembly: 64 lanes of a 128x128x3 upside-down camera resized to 224x224 (flip,
``bilinear_aa``, normalize, chw), stacked 2 deep, plus a state concatenating the eef position,
its quaternion re-encoded as rot6d and the gripper; one round = ``assemble`` for 64 lanes in
steady state. Rust core vs Python core.

Run: ``pytest benches/test_bench_adapters.py --benchmark-enable``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from PIL import Image as PILImage
from rlmesh import adapters

LANES = 64
RESIZE_SOURCE, RESIZE_TARGET = (256, 256, 3), 224
LIBERO_CAMERA = (128, 128, 3)

_GRIPPER_ONLY = adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1))


def _plan(observation_tags, observation_space, model_input):
    tags = adapters.EnvTags(observation=observation_tags, action=_GRIPPER_ONLY)
    spec = adapters.ModelSpec(input=model_input, output=_GRIPPER_ONLY)
    return adapters.resolve(tags, observation_space, gym.spaces.Box(-1, 1, (1,), np.float32), spec)


class ResizeRound:
    """64 lanes of 256x256x3 to 224x224 ``bilinear_aa``; ``round()`` assembles them."""

    def __init__(self, core) -> None:
        space = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, RESIZE_SOURCE, np.uint8)})
        plan = _plan(
            {"cam": adapters.ImageTag(adapters.IMAGE_PRIMARY)},
            space,
            adapters.Image(adapters.IMAGE_PRIMARY, size=RESIZE_TARGET, resample="bilinear_aa"),
        )
        self.assembler = core.ObservationAssembler(plan.observation)
        rng = np.random.default_rng(0)
        self.frames = [
            {"cam": rng.integers(0, 256, RESIZE_SOURCE, dtype=np.uint8)} for _ in range(LANES)
        ]
        self.episode_ids = np.arange(LANES)

    def round(self) -> np.ndarray:
        return self.assembler.assemble(self.frames, self.episode_ids)


class PillowResizeLoop:
    """The baseline: Pillow resizing each lane's frame in a Python loop, stacked."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.frames = [rng.integers(0, 256, RESIZE_SOURCE, dtype=np.uint8) for _ in range(LANES)]

    def round(self) -> np.ndarray:
        size = (RESIZE_TARGET, RESIZE_TARGET)
        return np.stack(
            [
                np.asarray(PILImage.fromarray(frame).resize(size, PILImage.Resampling.BILINEAR))
                for frame in self.frames
            ]
        )


class LiberoAssemblyRound:
    """The LIBERO-like assembly for 64 lanes, windows full; ``round()`` assembles them."""

    def __init__(self, core) -> None:
        space = gym.spaces.Dict(
            {
                "agentview_image": gym.spaces.Box(0, 255, LIBERO_CAMERA, np.uint8),
                "eef_pos": gym.spaces.Box(-2, 2, (3,), np.float32),
                "eef_quat": gym.spaces.Box(-1, 1, (4,), np.float32),
                "gripper": gym.spaces.Box(-1, 1, (2,), np.float32),
            }
        )
        tags = {
            "agentview_image": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True),
            "eef_pos": adapters.StateTag(adapters.EEF_POS),
            "eef_quat": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw"),
            "gripper": adapters.StateTag(adapters.GRIPPER_POS),
        }
        model_input = {
            "image": adapters.Image(
                adapters.IMAGE_PRIMARY,
                size=224,
                resample="bilinear_aa",
                allow_upscale=True,
                normalize=True,
                dtype="float32",
                layout="chw",
                stack=2,
            ),
            "state": adapters.Concat(
                adapters.EEF_POS,
                adapters.State(adapters.EEF_ROT, encoding="rot6d"),
                adapters.State(adapters.GRIPPER_POS, dim=1),
            ),
        }
        plan = _plan(tags, space, model_input)
        self.assembler = core.ObservationAssembler(plan.observation)
        rng = np.random.default_rng(1)
        quats = rng.normal(size=(LANES, 4))
        quats /= np.linalg.norm(quats, axis=1, keepdims=True)
        self.frames = [
            {
                "agentview_image": rng.integers(0, 256, LIBERO_CAMERA, dtype=np.uint8),
                "eef_pos": rng.uniform(-1, 1, 3).astype(np.float32),
                "eef_quat": quat.astype(np.float32),
                "gripper": np.array([0.04, -0.04], np.float32),
            }
            for quat in quats
        ]
        self.episode_ids = np.arange(LANES)
        self.round()  # every window full

    def round(self) -> dict:
        return self.assembler.assemble(self.frames, self.episode_ids)


def test_resize_bilinear_aa(benchmark, core):
    resize = ResizeRound(core)
    benchmark.group = f"resize, {LANES} x 256x256x3 -> 224x224 bilinear_aa"
    payload = benchmark(resize.round)
    assert payload.shape == (LANES, RESIZE_TARGET, RESIZE_TARGET, 3)


def test_resize_pillow_loop(benchmark):
    pillow = PillowResizeLoop()
    benchmark.group = f"resize, {LANES} x 256x256x3 -> 224x224 bilinear_aa"
    payload = benchmark(pillow.round)
    assert payload.shape == (LANES, RESIZE_TARGET, RESIZE_TARGET, 3)


def test_libero_assembly(benchmark, core):
    assembly = LiberoAssemblyRound(core)
    benchmark.group = f"LIBERO-like assembly, {LANES} lanes"
    payload = benchmark(assembly.round)
    assert payload["image"].shape == (LANES, 2, 3, 224, 224)
    assert payload["state"].shape == (LANES, 10)
