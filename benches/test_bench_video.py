"""Recording videos (``record_video``): what it costs a run, against the encoding itself.

The workload: a pixel env (``PixelEnv``, a 120x160 RGB camera whose ``render()`` returns its
frame, so drawing costs next to nothing and the encoder is what is measured), 4 lanes, 50
episodes of 60 to 119 steps, the first 5 recorded.

- the recorded run's wall time minus the same run's without recording, against the time to
  encode those 5 episodes' frames alone (the same ``VideoEncoder``, frames made beforehand):
  recording costs the run no more than the encoding itself;
- the unrecorded episodes' wall time per step (``duration_s / steps``) in the recorded run
  against the same episodes without recording: the lanes that are not recorded do not slow
  down.

Run: ``pytest benches/test_bench_video.py --benchmark-enable``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import rlmesh
from gymnasium import spaces
from rlmesh.video import VideoEncoder

VIDEO_LANES, VIDEO_EPISODES, RECORDED_EPISODES = 4, 50, 5
FRAME = (120, 160, 3)
FPS = 30


class PixelEnv(gym.Env):
    """A square that drifts over a gradient, seen by a 120x160 RGB camera: the observation,
    and what ``render()`` returns."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}  # noqa: RUF012

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0, 255, FRAME, np.uint8)
        self.action_space = spaces.Discrete(3)
        self._background = np.broadcast_to(
            np.linspace(0, 200, FRAME[1], dtype=np.uint8)[None, :, None], FRAME
        )

    def _frame(self):
        frame = self._background.copy()
        y, x = self.position
        frame[y : y + 16, x : x + 16] = (255, 64, 0)
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = [int(v) for v in self.np_random.integers(0, 100, 2)]
        self.length = int(self.np_random.integers(60, 120))
        self.t = 0
        self.frame = self._frame()
        return self.frame, {}

    def step(self, action):
        self.t += 1
        self.position[1] = int(np.clip(self.position[1] + int(action) - 1, 0, FRAME[1] - 16))
        self.position[0] = (self.position[0] + 1) % (FRAME[0] - 16)
        self.frame = self._frame()
        return self.frame, float(action == 1), self.t >= self.length, False, {}

    def render(self):
        return self.frame


def make_pixel_env(render_mode=None):
    return PixelEnv(render_mode)


def pixel_policy(obs):
    """Toward the frame's brightest column (a pure function of the frame)."""
    return int(obs[FRAME[0] // 2, :, 0].argmax() * 3 // FRAME[1])


def run_pixel(video_dir: Path | None) -> tuple[rlmesh.RunResult, float]:
    """The workload, recording the first 5 episodes into ``video_dir`` (None: no recording),
    and its wall time (making the envs and waiting for the encoder included)."""
    started = time.perf_counter()
    result = rlmesh.run(
        pixel_policy,
        make_pixel_env,
        episodes=VIDEO_EPISODES,
        num_envs=VIDEO_LANES,
        record_video=0 if video_dir is None else RECORDED_EPISODES,
        video_dir=video_dir,
    )
    return result, time.perf_counter() - started


def recorded_frames(result: rlmesh.RunResult) -> list[list[np.ndarray]]:
    """The frames of the run's recorded episodes, replayed from their seeds."""
    env = PixelEnv("rgb_array")
    episodes = []
    for episode in result.episodes[:RECORDED_EPISODES]:
        observation, _ = env.reset(seed=episode.seed)
        frames = [env.render().copy()]
        for _ in range(episode.steps):
            observation, *_ = env.step(pixel_policy(observation))
            frames.append(env.render().copy())
        episodes.append(frames)
    return episodes


def encode_only(episodes: list[list[np.ndarray]], video_dir: Path) -> float:
    """Seconds to encode ``episodes`` (frames per episode) to mp4 files, alone."""
    started = time.perf_counter()
    encoder = VideoEncoder()
    for index, frames in enumerate(episodes):
        encoder.open(index, video_dir / f"episode{index}.mp4", fps=FPS)
        for frame in frames:
            encoder.frame(index, frame)
        encoder.finish(index)
    encoder.close()
    return time.perf_counter() - started


def unrecorded_s_per_step(result: rlmesh.RunResult) -> float:
    """The unrecorded episodes' wall time per step, over all of them."""
    episodes = result.episodes[RECORDED_EPISODES:]
    return sum(e.duration_s for e in episodes) / sum(e.steps for e in episodes)


def test_run_without_recording(benchmark):
    benchmark.group = "video: 5 of 50 pixel episodes, 4 lanes"
    benchmark(run_pixel, None)


def test_run_recording_5_of_50(benchmark):
    benchmark.group = "video: 5 of 50 pixel episodes, 4 lanes"
    with tempfile.TemporaryDirectory() as directory:
        result, _ = benchmark(run_pixel, Path(directory))
        assert len(list(Path(directory).iterdir())) == RECORDED_EPISODES
    assert [e.video is not None for e in result.episodes].count(True) == RECORDED_EPISODES


def test_encode_only(benchmark):
    benchmark.group = "video: 5 of 50 pixel episodes, 4 lanes"
    plain, _ = run_pixel(None)
    episodes = recorded_frames(plain)
    with tempfile.TemporaryDirectory() as directory:
        benchmark(encode_only, episodes, Path(directory))
