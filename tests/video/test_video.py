"""Per-episode videos (``record_video``): which episodes, their frames and files, and that
recording changes no result, on both cores, in-process, in worker processes and on a vector.

The envs are module-level so worker processes can build them. Videos are decoded with
imageio (the ``video`` extra), the same library that wrote them.
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import sys
import tempfile
import threading

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import CORES, comparable
from rlmesh.cli import main
from rlmesh.errors import EnvError
from rlmesh.lanes import LaneVector
from rlmesh.results import read_columns, read_run
from rlmesh.video import DEFAULT_FPS, PARTIAL_SUFFIX, VideoEncoder, VideoError, video_name
from rlmesh.video.encoder import ENCODER_NICENESS, start_ffmpeg


@pytest.fixture(params=CORES)
def core(request):
    """The core's name, for ``rlmesh.run(..., core=)``: every run here runs on both."""
    return request.param


IMAGE = (32, 48, 3)  # the observation's image
FRAME = (40, 64, 3)  # what render() draws: another size, so the tests tell them apart
FPS = 20


class RenderedEnv(gym.Env):
    """A column that the action moves, seen as a Dict observation (an image and its position)
    and drawn by ``render()``; seeded episodes of 5 to 29 steps."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}  # noqa: RUF012

    def __init__(self, render_mode=None, resize_at=None):
        self.render_mode = render_mode
        self.resize_at = resize_at  # render() draws another size from this step on
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, IMAGE, np.uint8),
                "x": spaces.Box(0.0, 100.0, (1,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(2)

    def _image(self):
        image = np.zeros(IMAGE, np.uint8)
        image[..., 0] = (self.t * 9) % 256
        image[:, self.x % IMAGE[1], 1] = 255
        return image

    def _observation(self):
        return {"image": self._image(), "x": np.array([self.x], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(0, 40))
        self.t = 0
        self.length = int(self.np_random.integers(5, 30))
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        self.x += int(action)
        return self._observation(), float(action), self.t >= self.length, False, {}

    def render(self):
        height = FRAME[0] + (2 if self.resize_at is not None and self.t >= self.resize_at else 0)
        frame = np.zeros((height, *FRAME[1:]), np.uint8)
        frame[:, (2 * self.x) % FRAME[1], :] = 220
        frame[: 2 * self.t % height, 0:8, 2] = 255
        return frame


class ImageEnv(RenderedEnv):
    """The same, observed as the image alone (a Box)."""

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = spaces.Box(0, 255, IMAGE, np.uint8)

    def _observation(self):
        return self._image()


class FailingEnv(RenderedEnv):
    """Raises in the step ``fail_at`` of the episode with seed ``fail_seed``."""

    def __init__(self, render_mode=None, fail_seed=None, fail_at=3):
        super().__init__(render_mode)
        self.fail_seed, self.fail_at = fail_seed, fail_at

    def reset(self, *, seed=None, options=None):
        self.seed_now = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.seed_now == self.fail_seed and self.t + 1 == self.fail_at:
            raise RuntimeError("the simulator crashed")
        return super().step(action)


class ResetFailingEnv(RenderedEnv):
    """Raises in the reset seeded 22; cannot render before a reset has succeeded."""

    def reset(self, *, seed=None, options=None):
        if seed == 22:
            raise RuntimeError("the scene would not load")
        return super().reset(seed=seed, options=options)

    def render(self):
        if not hasattr(self, "t"):
            raise RuntimeError("render() before any reset")
        return super().render()


class ResizingEnv(RenderedEnv):
    """Draws a taller frame from step 3 of the episode seeded 12."""

    def reset(self, *, seed=None, options=None):
        self.resize_at = 3 if seed == 12 else None
        return super().reset(seed=seed, options=options)


def make_rendered(render_mode=None):
    """A module-level factory that takes ``render_mode``, as rlmesh passes it when recording."""
    return RenderedEnv(render_mode)


def make_image(render_mode=None):
    return ImageEnv(render_mode)


def policy(obs):
    """Depends on the observation only, so results are the same at any lane count."""
    image = obs["image"] if isinstance(obs, dict) else obs
    return int(image[0, 0, 0] // 9 + image[0, :, 1].argmax()) % 2


class NoRenderLanes:
    """Lanes written here, without ``render``: as a served env is to the recorder."""

    def __init__(self, envs):
        self._inner = LaneVector(envs)
        for name in ("num_lanes", "name", "single_observation_space", "single_action_space"):
            setattr(self, name, getattr(self._inner, name))
        self.lockstep, self.resets_itself, self.env_steps, self.spec = False, False, None, None
        self.metadata, self.rebuild = {}, None

    def reset(self, lanes, seeds, trials):
        return self._inner.reset(lanes, seeds, trials)

    def step(self, lanes, actions):
        return self._inner.step(lanes, actions)

    def env_episode_ids(self):
        return None

    def close(self):
        self._inner.close()


def scored(result):
    """Each episode's fields but timings, lane and video: what recording must not change."""
    return comparable(result, drop=("env_index", "video"))


def decoded(path):
    """Every frame of the mp4 at ``path``, as imageio decodes them."""
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        return [frame for frame in reader], reader.get_meta_data()
    finally:
        reader.close()


def check_videos(result, directory, links_from, recorded, prefix, frame_shape, fps=FPS):
    """Episodes below ``recorded`` link a complete video of ``steps + 1`` frames of
    ``frame_shape``, named by prefix, index and seed; the others link none."""
    for episode in result.episodes:
        if episode.index >= recorded:
            assert episode.video is None
            continue
        name = video_name(prefix, episode.index, episode.seed)
        assert name == f"{prefix}_ep{episode.index:05d}_seed{episode.seed}.mp4"
        assert (links_from / episode.video).resolve() == (directory / name).resolve()
        frames, meta = decoded(directory / name)
        assert len(frames) == episode.steps + 1
        assert {frame.shape for frame in frames} == {frame_shape}
        assert meta["fps"] == fps
    names = sorted(path.name for path in directory.iterdir())
    assert names == sorted(
        video_name(prefix, e.index, e.seed) for e in result.episodes if e.index < recorded
    )


@pytest.mark.parametrize(
    ("num_envs", "workers", "pipeline"),
    [(1, 1, False), (4, 1, False), (4, 2, False), (4, 2, True)],
)
def test_recording_changes_no_result_and_writes_each_video(
    core, tmp_path, num_envs, workers, pipeline
):
    plain = rlmesh.run(
        policy, make_rendered, episodes=10, num_envs=num_envs, workers=workers, core=core
    )
    out = tmp_path / "run.jsonl"
    recorded = rlmesh.run(
        policy,
        make_rendered,
        episodes=10,
        num_envs=num_envs,
        workers=workers,
        pipeline=pipeline,
        core=core,
        record_video=3,
        results_path=out,
    )
    assert scored(recorded) == scored(plain)
    check_videos(recorded, tmp_path / "run_videos", tmp_path, 3, "RenderedEnv", FRAME)
    # The results file links the videos, relative to its directory, and reads back with them.
    _, on_file, _ = read_run(out)
    assert [e.video for e in on_file.episodes] == [e.video for e in recorded.episodes]
    assert (
        on_file.episodes[0].video
        == f"run_videos/{video_name('RenderedEnv', 0, plain.episodes[0].seed)}"
    )
    _, columns = read_columns(out)
    assert columns.index.tolist() == list(range(10))
    assert columns.steps.tolist() == [e.steps for e in plain.episodes]


def test_recording_matches_without_it_when_rounds_are_awaited(core, tmp_path):
    """A hook that watches steps makes the driver await each round (the lanes' ``step``,
    not the core's fast path): the frames are taken there, and results stay the same."""

    class Watch(rlmesh.RunHooks):
        def on_step(self, event):
            pass

    kwargs = {"episodes": 6, "num_envs": 3, "core": core, "hooks": Watch()}
    plain = rlmesh.run(policy, make_rendered, **kwargs)
    recorded = rlmesh.run(policy, make_rendered, record_video=4, video_dir=tmp_path / "v", **kwargs)
    assert scored(recorded) == scored(plain)
    check_videos(recorded, tmp_path / "v", tmp_path / "v", 4, "RenderedEnv", FRAME)


def test_frames_are_the_episode_as_render_draws_it(core, tmp_path):
    result = rlmesh.run(
        policy, make_rendered, episodes=1, core=core, record_video=1, video_dir=tmp_path
    )
    episode = result.episodes[0]
    frames, _ = decoded(tmp_path / video_name("RenderedEnv", 0, episode.seed))
    # The same episode replayed by hand: its reset frame, then one per step.
    env = RenderedEnv("rgb_array")
    observation, _ = env.reset(seed=episode.seed)
    expected = [env.render()]
    for _ in range(episode.steps):
        observation, *_ = env.step(policy(observation))
        expected.append(env.render())
    assert len(frames) == len(expected)
    for got, want in zip(frames, expected, strict=True):
        # mp4 is lossy: close, not equal; a frame from another step differs by far more.
        assert np.abs(got.astype(int) - want.astype(int)).mean() < 6


@pytest.mark.parametrize(
    ("factory", "key"), [(make_rendered, "image"), (make_image, "observation")]
)
def test_video_key_records_the_image_observation(core, tmp_path, factory, key):
    kwargs = {"episodes": 5, "num_envs": 2, "core": core}
    plain = rlmesh.run(policy, factory, **kwargs)
    recorded = rlmesh.run(
        policy, factory, record_video=2, video_dir=tmp_path, video_key=key, **kwargs
    )
    assert scored(recorded) == scored(plain)
    prefix = type(factory()).__name__
    check_videos(recorded, tmp_path, tmp_path, 2, prefix, IMAGE)


def test_video_key_records_lanes_that_cannot_render(core, tmp_path):
    """Lanes without ``render`` (as a served env) are refused for render frames, and record
    their image observation with ``video_key``."""
    with pytest.raises(VideoError, match=r"cannot render a lane: pass video_key=KEY"):
        rlmesh.run(
            policy,
            NoRenderLanes([RenderedEnv("rgb_array")]),
            episodes=2,
            record_video=1,
            video_dir=tmp_path / "refused",
            core=core,
        )
    plain = rlmesh.run(policy, NoRenderLanes([RenderedEnv()]), episodes=3, core=core)
    recorded = rlmesh.run(
        policy,
        NoRenderLanes([RenderedEnv()]),
        episodes=3,
        record_video=2,
        video_dir=tmp_path / "v",
        video_key="image",
        core=core,
    )
    assert scored(recorded) == scored(plain)
    # Lanes whose envs' metadata is not theirs to give: the default frame rate.
    check_videos(recorded, tmp_path / "v", tmp_path / "v", 2, "RenderedEnv", IMAGE, DEFAULT_FPS)


def test_a_served_env_is_refused_for_render_frames_and_records_its_observation(core, tmp_path):
    pytest.importorskip("grpc")
    kwargs = {"episodes": 4, "core": core}
    with rlmesh.serve_env(RenderedEnv, num_envs=2) as server:
        with pytest.raises(VideoError, match=r"\(RemoteEnv\) cannot render a lane: pass video_key"):
            rlmesh.run(policy, server.address, record_video=1, video_dir=tmp_path, **kwargs)
        plain = rlmesh.run(policy, server.address, **kwargs)
        recorded = rlmesh.run(
            policy,
            server.address,
            record_video=2,
            video_dir=tmp_path,
            video_key="image",
            **kwargs,
        )
    assert scored(recorded) == scored(plain)
    check_videos(recorded, tmp_path, tmp_path, 2, "RenderedEnv", IMAGE, DEFAULT_FPS)


def test_a_vector_env_renders_each_lane(core, tmp_path):
    def vector(render_mode):
        return gym.vector.SyncVectorEnv(
            [lambda: RenderedEnv(render_mode)] * 3,
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,
        )

    kwargs = {"episodes": 6, "core": core, "close_env": True}
    plain = rlmesh.run(policy, vector(None), **kwargs)
    recorded = rlmesh.run(policy, vector("rgb_array"), record_video=3, video_dir=tmp_path, **kwargs)
    assert scored(recorded) == scored(plain)
    check_videos(recorded, tmp_path, tmp_path, 3, "SyncVectorEnv", FRAME)


def test_suite_tasks_name_their_files_by_prefix(tmp_path):
    result = rlmesh.run(
        policy,
        make_rendered,
        episodes=2,
        record_video=2,
        video_dir=tmp_path,
        video_prefix="pick up/the cube",
    )
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(video_name("pick up/the cube", e.index, e.seed) for e in result.episodes)
    assert all(name.startswith("pick_up_the_cube_ep0000") for name in names)


def test_a_suite_records_the_first_k_indices_of_each_task_named_by_task(core, tmp_path):
    """Each task's first K indices are recorded, named by the task, index and seed, and
    linked from the suite's file; the suite's episodes are the same without recording."""
    if "RlmeshVideoSuite-v0" not in gym.registry:
        gym.register("RlmeshVideoSuite-v0", entry_point="test_video:RenderedEnv")
    tasks = [
        rlmesh.Task("near", "RlmeshVideoSuite-v0", episodes=4, seed=1),
        # env_kwargs: the task's env is a factory of gymnasium.make, given render_mode too.
        rlmesh.Task("far", "RlmeshVideoSuite-v0", env_kwargs={"resize_at": 99}, episodes=3),
    ]
    plain = rlmesh.run_suite(policy, tasks, num_envs=2, core=core)
    out = tmp_path / "suite.jsonl"
    recorded = rlmesh.run_suite(
        policy, tasks, num_envs=2, core=core, record_video=2, results_path=out
    )
    directory = tmp_path / "suite_videos"
    expected = []
    for task in tasks:
        assert scored(recorded[task.name]) == scored(plain[task.name])
        for episode in recorded[task.name].episodes:
            if episode.index >= 2:
                assert episode.video is None
                continue
            name = video_name(task.name, episode.index, episode.seed)
            expected.append(name)
            assert episode.video == f"suite_videos/{name}"
            assert len(decoded(directory / name)[0]) == episode.steps + 1
    assert sorted(path.name for path in directory.iterdir()) == sorted(expected)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    linked = sorted(r["video"] for r in records if r.get("video"))
    assert linked == sorted(f"suite_videos/{name}" for name in expected)

    # The command line: rlmesh eval --suite with --record-video.
    (tmp_path / "s.toml").write_text(
        '[[task]]\nname = "near"\nenv = "RlmeshVideoSuite-v0"\nepisodes = 3\n'
    )
    argv = ["eval", "random", "--suite", str(tmp_path / "s.toml"), "--record-video", "1"]
    assert main([*argv, "--out", str(tmp_path / "s.jsonl"), "--no-progress"]) == 0
    (video,) = (tmp_path / "s_videos").iterdir()
    assert video.name.startswith("near_ep00000_seed")


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"record_video": 2}, r"needs somewhere to write the videos: pass video_dir=DIR, or "),
        ({"record_video": -1, "video_dir": "v"}, r"record_video must be a non-negative integer"),
        ({"record_video": True, "video_dir": "v"}, r"record_video must be a non-negative"),
        ({"video_dir": "v"}, r"video_dir is for recording videos: pass record_video=K"),
        ({"video_key": "image"}, r"video_key is for recording videos"),
        ({"record_video": 1, "video_dir": "v", "video_key": ""}, r"video_key must be a non-emp"),
    ],
)
def test_bad_video_arguments_are_refused_before_any_env_is_made(kwargs, message):
    made = []

    def factory():
        made.append(1)
        return RenderedEnv()

    with pytest.raises(ValueError, match=message):
        rlmesh.run(policy, factory, episodes=1, **kwargs)
    assert made == []


@pytest.mark.parametrize(
    ("env", "key", "message"),
    [
        (make_rendered, "pixels", r"video_key='pixels' is not a key of RenderedEnv's observation: "
         r"it has \['image', 'x'\]"),
        (make_rendered, "x", r"video_key='x' names Box\(0.0, 100.0, \(1,\), float32\), which is "
         r"not an image: a video's frames must be a Box of shape \[H, W, 3\] or \[H, W\] and "
         r"dtype uint8"),
        (make_image, "image", r"video_key='image' names a key, but ImageEnv's observation is "
         r"Box.*not a Dict: pass video_key='observation'"),
        (lambda: gym.make("CartPole-v1"), "observation", r"names Box\(.*\(4,\), float32\), "
         r"which is not an image"),
        (RenderedEnv(), None, r"render\(\) in rgb_array mode, but the envs of RenderedEnv have "
         r"render_mode=None: build them with render_mode='rgb_array'"),
    ],
)  # fmt: skip
def test_frames_that_cannot_be_had_are_refused_naming_why(core, tmp_path, env, key, message):
    with pytest.raises(VideoError, match=message) as caught:
        rlmesh.run(
            policy,
            env,
            episodes=2,
            record_video=1,
            video_dir=tmp_path,
            video_key=key,
            core=core,
        )
    assert caught.value.partial_result.num_episodes == 0
    assert list(tmp_path.iterdir()) == []


def test_a_render_that_is_not_an_image_is_refused(core, tmp_path):
    class FloatFrames(RenderedEnv):
        def render(self):
            return super().render().astype(np.float32)

    with pytest.raises(VideoError, match=r"lane 0 \(FloatFrames\), episode 0: render\(\) got "
                       r"shape \(40, 64, 3\) dtype float32, expected an \[H, W, 3\] or \[H, W\] "
                       r"uint8 array"):  # fmt: skip
        rlmesh.run(
            policy,
            lambda: FloatFrames("rgb_array"),
            episodes=1,
            record_video=1,
            video_dir=tmp_path,
            core=core,
        )


# ---------------------------------------------------------------------------- failures


def test_a_failing_encoder_loses_no_result(core, tmp_path):
    """Episode 1's frames change size mid-episode, which ffmpeg cannot take: its video fails,
    the run ends with a VideoError naming it, and every episode is kept (the results file and
    ``err.partial_result``), as are the other videos."""
    seeds = [11, 12, 13, 14]
    plain = rlmesh.run(policy, make_rendered, seeds=seeds, num_envs=2, core=core)

    def factory(render_mode=None):
        return ResizingEnv(render_mode)

    out = tmp_path / "run.jsonl"
    with pytest.raises(
        VideoError, match=r"the videos of episodes \[1\] could not be written"
    ) as caught:
        rlmesh.run(
            policy,
            factory,
            seeds=seeds,
            num_envs=2,
            record_video=3,
            results_path=out,
            core=core,
        )
    assert "every frame of a video must have one size" in str(caught.value)
    assert scored(caught.value.partial_result) == scored(plain)
    _, on_file, _ = read_run(out)
    assert scored(on_file) == scored(plain)
    names = sorted(path.name for path in (tmp_path / "run_videos").iterdir())
    assert names == sorted(video_name("ResizingEnv", k, seeds[k]) for k in (0, 2))


def test_a_crash_leaves_no_half_written_video(core, tmp_path):
    """The env fails in episode 2 (recorded): the run fails, the videos of the completed
    episodes are complete, and nothing is left of the one in flight."""
    seeds = [21, 22, 23]

    def factory(render_mode=None):
        return FailingEnv(render_mode, fail_seed=23)

    with pytest.raises(EnvError, match="the simulator crashed") as caught:
        rlmesh.run(
            policy,
            factory,
            seeds=seeds,
            record_video=3,
            video_dir=tmp_path,
            core=core,
        )
    completed = caught.value.partial_result.episodes
    assert [e.index for e in completed] == [0, 1]
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(video_name("FailingEnv", e.index, e.seed) for e in completed)
    assert not any(name.endswith(PARTIAL_SUFFIX) for name in names)
    for episode in completed:
        assert len(
            decoded(tmp_path / video_name("FailingEnv", episode.index, episode.seed))[0]
        ) == (episode.steps + 1)


def make_failing(render_mode=None):
    """Lanes whose episode seeded 22 fails at its third step, on every attempt."""
    return FailingEnv(render_mode, fail_seed=22)


@pytest.mark.parametrize(
    ("on_error", "workers", "pipeline", "record_video"),
    [
        ("record", 1, False, 2),
        ("record", 1, False, 4),
        ("retry", 1, False, 2),
        ("retry", 1, False, 4),
        ("retry", 2, False, 4),
        ("record", 2, True, 4),
    ],
)
def test_an_isolated_failure_of_a_recorded_episode_leaves_no_video_and_changes_no_result(
    core, tmp_path, on_error, workers, pipeline, record_video
):
    """The env fails in recorded episode 1 (every attempt): its videos are dropped with each
    attempt, the rebuilt lane's steps are the new env's (whether or not its next episode is
    recorded), and every other recorded episode's video is its own, whole."""
    seeds = [21, 22, 23, 24, 25, 26]
    kwargs = {"seeds": seeds, "num_envs": 2 * workers, "workers": workers, "pipeline": pipeline}
    kwargs["core"] = core
    kwargs |= {"on_error": on_error} | ({"max_retries": 1} if on_error == "retry" else {})
    plain = rlmesh.run(policy, make_failing, **kwargs)
    assert plain.failed_indices == [1]
    recorded = rlmesh.run(
        policy, make_failing, record_video=record_video, video_dir=tmp_path, **kwargs
    )
    assert scored(recorded) == scored(plain)
    assert recorded.episodes[1].video is None
    whole = [k for k in range(record_video) if k != 1]
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(video_name("FailingEnv", k, seeds[k]) for k in whole)
    for k in whole:
        episode = recorded.episodes[k]
        frames, _ = decoded(tmp_path / video_name("FailingEnv", k, seeds[k]))
        assert len(frames) == episode.steps + 1


def make_reset_failing(render_mode=None):
    return ResetFailingEnv(render_mode)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_recorded_episode_whose_reset_fails_opens_no_video(core, tmp_path, workers):
    """Episode 1's reset fails (on_error="record"): no frame is asked of its lane's failed
    env, it has no video, and the other recorded episodes' videos are whole."""
    seeds = [21, 22, 23, 24]
    kwargs = {"seeds": seeds, "num_envs": 2 * workers, "workers": workers, "core": core}
    plain = rlmesh.run(policy, make_reset_failing, on_error="record", **kwargs)
    assert plain.failed_indices == [1]
    recorded = rlmesh.run(
        policy, make_reset_failing, on_error="record", record_video=3, video_dir=tmp_path, **kwargs
    )
    assert scored(recorded) == scored(plain)
    assert [e.video is not None for e in recorded.episodes] == [True, False, True, False]
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [video_name("ResetFailingEnv", k, seeds[k]) for k in (0, 2)]
    for k in (0, 2):
        frames, _ = decoded(tmp_path / names[k // 2])
        assert len(frames) == recorded.episodes[k].steps + 1


def test_the_encoder_waits_rather_than_drop_frames(tmp_path):
    """A queue of one frame: every frame still reaches the file, each as it was queued."""
    encoder = VideoEncoder(queue_bytes=1, batch_bytes=1)
    frames = [np.full((16, 24), 6 * k, dtype=np.uint8) for k in range(40)]
    encoder.open("grey", tmp_path / "grey.mp4", fps=10)
    for frame in frames:
        encoder.frame("grey", frame)
    encoder.finish("grey")
    encoder.open("dropped", tmp_path / "dropped.mp4", fps=10)
    encoder.frame("dropped", frames[0])
    encoder.close()  # "dropped" was still open: its episode did not complete
    got, _ = decoded(tmp_path / "grey.mp4")
    assert len(got) == len(frames)
    # Each frame's grey level is its own (mp4 is lossy: within a level or two).
    assert all(abs(frame.mean() - 6 * k) < 2.5 for k, frame in enumerate(got))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["grey.mp4"]


def test_the_frames_queued_stay_within_the_byte_bound(tmp_path):
    """Frames handed over faster than ffmpeg encodes them fill the queue up to its bound in
    bytes and no further (the driver waits); batches, the last one short, keep their order,
    and each frame is copied as it was handed over (the caller draws the next into it)."""
    levels = [5 * k for k in range(45)]
    drawn = np.zeros((48, 64, 3), dtype=np.uint8)
    batch_bytes = 4 * drawn.nbytes
    encoder = VideoEncoder(queue_bytes=3 * batch_bytes, batch_bytes=batch_bytes)
    encoder.open(0, tmp_path / "levels.mp4", fps=10)
    queued = []
    for level in levels:
        drawn[:] = level
        encoder.frame(0, drawn)
        queued.append(encoder.queued_bytes)
    encoder.finish(0)
    encoder.close()
    assert max(queued) <= 3 * batch_bytes
    assert max(queued) >= 2 * batch_bytes  # it filled: the bound, not the pace, held it
    assert encoder.queued_bytes == 0
    got, _ = decoded(tmp_path / "levels.mp4")
    assert len(got) == len(levels)
    assert all(abs(frame.mean() - level) < 2.5 for level, frame in zip(levels, got, strict=True))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness")
def test_ffmpeg_starts_at_a_lower_priority_than_the_run():
    """The encoder's processes yield the CPU to the run's lanes; the run's threads keep their
    priority."""
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    report = "import os, sys; sys.stderr.write(str(os.getpriority(os.PRIO_PROCESS, 0)))"
    with tempfile.TemporaryFile() as said:
        process = start_ffmpeg([sys.executable, "-c", report], said)
        assert process.wait(timeout=60) == 0
        said.seek(0)
        assert int(said.read()) == min(19, ours + ENCODER_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ours


def test_frames_that_are_not_images_fail_their_video_only(tmp_path):
    encoder = VideoEncoder()
    encoder.open("floats", tmp_path / "floats.mp4", fps=10)
    encoder.frame("floats", np.zeros((16, 16, 3), dtype=np.float32))
    encoder.finish("floats")
    encoder.open("grey", tmp_path / "grey.mp4", fps=10)
    encoder.frame("grey", np.zeros((16, 16), dtype=np.uint8))
    encoder.finish("grey")
    with pytest.raises(VideoError, match=r"floats .*dtype float32: a video's frames are"):
        encoder.close()
    assert [path.name for path in tmp_path.iterdir()] == ["grey.mp4"]


def test_an_ffmpeg_that_fails_fails_its_video_saying_what_it_said(tmp_path):
    encoder = VideoEncoder()
    encoder.open("lost", tmp_path / "no-such-dir" / "lost.mp4", fps=10)
    encoder.frame("lost", np.zeros((16, 16, 3), dtype=np.uint8))
    encoder.finish("lost")
    encoder.open("kept", tmp_path / "kept.mp4", fps=10)
    encoder.frame("kept", np.zeros((16, 16, 3), dtype=np.uint8))
    encoder.finish("kept")
    with pytest.raises(
        VideoError, match=r"lost .*ffmpeg exited with status [1-9]\d*: .*no-such-dir"
    ):
        encoder.close()
    assert [path.name for path in tmp_path.iterdir()] == ["kept.mp4"]


def test_odd_sized_frames_are_padded_to_even(tmp_path):
    encoder = VideoEncoder()
    encoder.open(0, tmp_path / "odd.mp4", fps=10)
    for _ in range(3):
        encoder.frame(0, np.full((15, 21, 3), 128, dtype=np.uint8))
    encoder.finish(0)
    encoder.close()
    got, _ = decoded(tmp_path / "odd.mp4")
    assert [frame.shape for frame in got] == [(16, 22, 3)] * 3


# ---------------------------------------------------------------------------- the command line


def test_the_command_line_records_and_links_videos(tmp_path, monkeypatch, capsys):
    gym.register("RlmeshVideoRendered-v0", entry_point="test_video:RenderedEnv")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run.jsonl"
    argv = ["eval", "random", "--env", "RlmeshVideoRendered-v0", "--episodes", "4"]
    assert main([*argv, "--video-dir", "v"]) == 2
    assert "--video-dir and --video-key need --record-video K" in capsys.readouterr().err
    assert main([*argv, "--record-video", "2"]) == 2
    assert "--record-video needs --out FILE" in capsys.readouterr().err
    assert main([*argv, "--record-video", "2", "--out", str(out), "--no-progress"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:5]]
    linked = {line["index"]: line.get("video") for line in lines}
    assert sorted(linked.items())[2:] == [(2, None), (3, None)]
    for index in (0, 1):
        assert (tmp_path / linked[index]).is_file()
        assert linked[index].startswith("run_videos/RlmeshVideoRendered-v0_ep0000")
    assert main([*argv, "--record-video", "1", "--video-dir", "v", "--video-key", "image"]) == 0
    assert len(list((tmp_path / "v").iterdir())) == 1


def test_module_examples_hold():
    for name in ("rlmesh.video.encoder", "rlmesh.video.recorder", "rlmesh.settings"):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, name
