"""Observation assembly: frame stacking against the copy floor, and the image layouts.

Frame stacking: N = 64 lanes of 84x84x3 uint8 frames, depth 4. One round = ``assemble`` for 64
lanes in steady state (every window already full), which ingests one new frame per lane and
writes the [64, 4, 84, 84, 3] stacked output. The floor is ``np.copyto`` of the same output
bytes: the output is new every step (the model may keep it), so writing it once is the least
any implementation must do.

Image layouts: 4 lanes of Atari-sized 210x160x3 uint8 frames, unstacked, as ``Image`` with
``layout="hwc"`` (a plain copy per lane) and ``layout="chw"`` (a transpose per lane).

Run: ``pytest benches/test_bench_assembly.py --benchmark-enable``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rlmesh.adapters import Image, ModelSpec

LANES, DEPTH, FRAME = 64, 4, (84, 84, 3)
GROUP = f"frame stack, N={LANES} 84x84x3 uint8 depth {DEPTH}"
IMAGE_LANES, IMAGE_FRAME = 4, (210, 160, 3)


def lane_frames(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(step)
    return [rng.integers(0, 256, FRAME, dtype=np.uint8) for _ in range(LANES)]


class FrameStackRound:
    """One assembler with every lane's window full; ``round()`` ingests a frame per lane."""

    def __init__(self, core) -> None:
        space = gym.spaces.Box(0, 255, FRAME, np.uint8)
        plan = ModelSpec(input=Image(stack=DEPTH)).compile(space, gym.spaces.Discrete(2))
        self.assembler = core.ObservationAssembler(plan.observation)
        self.episode_ids = np.arange(LANES)
        self.frames = [lane_frames(step) for step in range(DEPTH + 1)]
        for step in range(DEPTH):  # fill every window
            self.assembler.assemble(self.frames[step], self.episode_ids)

    def round(self) -> np.ndarray:
        return self.assembler.assemble(self.frames[DEPTH], self.episode_ids)


class CopyFloor:
    """``np.copyto`` of the stacked output's bytes: the least any implementation must write."""

    def __init__(self) -> None:
        shape = (LANES, DEPTH, *FRAME)
        self.source = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
        self.out = np.empty_like(self.source)

    def round(self) -> None:
        np.copyto(self.out, self.source)


def test_frame_stack(benchmark, core):
    stack = FrameStackRound(core)
    benchmark.group = GROUP
    payload = benchmark(stack.round)
    assert payload.shape == (LANES, DEPTH, *FRAME)
    # The newest frame of every lane is the one just assembled.
    np.testing.assert_array_equal(payload[:, -1], np.stack(stack.frames[DEPTH]))


def test_frame_stack_copy_floor(benchmark):
    floor = CopyFloor()
    benchmark.group = GROUP
    benchmark.extra_info["floor"] = "np.copyto of the output bytes"
    benchmark(floor.round)
    np.testing.assert_array_equal(floor.out, floor.source)


class ImageRound:
    """``Image(layout=layout)`` for 4 lanes of 210x160x3 uint8 frames; ``round()`` assembles."""

    def __init__(self, core, layout: str) -> None:
        space = gym.spaces.Box(0, 255, IMAGE_FRAME, np.uint8)
        spec = ModelSpec(input=Image(layout=layout))
        plan = spec.compile(space, gym.spaces.Discrete(2))
        self.assembler = core.ObservationAssembler(plan.observation)
        self.episode_ids = np.arange(IMAGE_LANES)
        rng = np.random.default_rng(0)
        self.frames = [
            rng.integers(0, 256, IMAGE_FRAME, dtype=np.uint8) for _ in range(IMAGE_LANES)
        ]

    def round(self) -> np.ndarray:
        return self.assembler.assemble(self.frames, self.episode_ids)


@pytest.mark.parametrize("layout", ["hwc", "chw"])
def test_image_layout(benchmark, core, layout):
    image = ImageRound(core, layout)
    benchmark.group = f"Image {layout}, N={IMAGE_LANES} 210x160x3 uint8"
    payload = benchmark(image.round)
    expected = np.stack(image.frames)
    if layout == "chw":
        expected = expected.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(payload, expected)
