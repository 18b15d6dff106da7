"""A sandboxed env's frames and suites: videos recorded from ``render()`` in the sandbox (each
frame crossing its socket) equal those of the same env run in this process, frame for frame;
a suite run with ``env_sandbox=SandboxOptions(...)`` plays the local suite's episodes; and
``rlmesh eval --sandbox --record-video`` records them too."""

from __future__ import annotations

import imageio.v2 as imageio
import pytest
import rlmesh
from helpers import CORES, comparable
from rlmesh.sandbox import SandboxEnv, SandboxOptions
from rlmesh.sandbox.bwrap import find_bwrap
from rlmesh.video import VideoError, video_name
from sandbox_envs import HERE as ENVS
from sandbox_envs import make_drawn_cartpole

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

RUN = {"episodes": 4, "max_episode_steps": 40}
DRAWN = f"{ENVS}:make_drawn_cartpole"


def wobbly(obs):
    """A weak CartPole heuristic: episodes of different lengths, so lanes end apart."""
    return int(obs[2] > 0)


def decoded(path):
    """Every frame of the mp4 at ``path`` and its frame rate, as imageio decodes them."""
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        return [frame for frame in reader], reader.get_meta_data()["fps"]
    finally:
        reader.close()


def videos(result, directory, recorded):
    """The decoded videos of the episodes below ``recorded`` (each checked to hold its
    episode's ``steps + 1`` frames), by index; the others link none."""
    found = {}
    for episode in result.episodes:
        if episode.index >= recorded:
            assert episode.video is None
            continue
        path = directory / video_name("make_drawn_cartpole", episode.index, episode.seed)
        frames, fps = decoded(path)
        assert len(frames) == episode.steps + 1
        found[episode.index] = (frames, fps)
    assert sorted(found) == list(range(recorded))
    return found


@pytest.mark.parametrize("core", CORES)
def test_a_sandboxed_envs_frames_cross_its_socket_into_the_local_runs_videos(core, tmp_path):
    options = {"num_envs": 2, "record_video": 2, "video_prefix": "make_drawn_cartpole"}
    local = rlmesh.run(
        wobbly, make_drawn_cartpole, video_dir=tmp_path / "local", core=core, **options, **RUN
    )
    env = SandboxEnv(DRAWN, num_envs=2, render_mode="rgb_array", core=core)
    assert env.render_mode == "rgb_array" and env.render_fps == 50  # CartPole's
    sandboxed = rlmesh.run(
        wobbly, env, video_dir=tmp_path / "sandboxed", core=core, **options, **RUN
    )
    assert comparable(sandboxed, drop=("env_index", "video")) == comparable(
        local, drop=("env_index", "video")
    )
    here = videos(local, tmp_path / "local", 2)
    there = videos(sandboxed, tmp_path / "sandboxed", 2)
    for index, (frames, fps) in here.items():
        assert there[index][1] == fps == 50
        assert all((a == b).all() for a, b in zip(there[index][0], frames, strict=True))


def test_a_sandboxed_env_built_without_render_mode_says_how_to_record_it(tmp_path):
    env = SandboxEnv("CartPole-v1")
    assert env.render_mode is None
    with pytest.raises(VideoError, match="render_mode=None: build them with render_mode="):
        rlmesh.run(wobbly, env, episodes=1, record_video=1, video_dir=tmp_path)
    assert not env.running
    # A factory that does not take render_mode is built without it, as in-process.
    with SandboxEnv(f"{ENVS}:make_sleeping", seconds=0, render_mode="rgb_array") as env:
        assert env.running and env.render_mode is None


TASKS = (
    rlmesh.Task("short", "CartPole-v1", episodes=3, seed=4, max_episode_steps=30),
    rlmesh.Task("heavy", "Pendulum-v1", env_kwargs={"g": 3.0}, episodes=2, max_episode_steps=20),
)


def pendulum_or_cartpole(obs):
    return [0.5] if len(obs) == 3 else int(obs[2] > 0)


@pytest.mark.parametrize("core", CORES)
def test_a_suite_with_env_sandbox_plays_the_local_suites_episodes(core, tmp_path):
    out = tmp_path / "suite.jsonl"
    sandboxed = rlmesh.run_suite(
        pendulum_or_cartpole,
        list(TASKS),
        env_sandbox=SandboxOptions(),
        num_envs=2,
        results_path=out,
        core=core,
    )
    local = rlmesh.run_suite(pendulum_or_cartpole, list(TASKS), num_envs=2, core=core)
    for task in TASKS:
        assert comparable(sandboxed[task.name]) == comparable(local[task.name])
        assert comparable(sandboxed[task.name]) != []
    _, episodes = rlmesh.read_results(out)
    assert sorted({episode.task for episode in episodes}) == ["heavy", "short"]
    assert len(episodes) == sum(task.episodes for task in TASKS)


def test_a_sandboxed_suite_records_videos_from_its_frames(tmp_path):
    task = rlmesh.Task("drawn", DRAWN, episodes=2, seed=9, max_episode_steps=25)
    result = rlmesh.run_suite(
        wobbly,
        [task],
        env_sandbox={"workers": 2},
        num_envs=2,
        record_video=1,
        video_dir=tmp_path,
    )
    (episode, other) = result["drawn"].episodes
    frames, fps = decoded(tmp_path / video_name("drawn", episode.index, episode.seed))
    assert len(frames) == episode.steps + 1 and fps == 50 and other.video is None


def test_a_suites_worker_processes_go_into_the_sandbox_options():
    with pytest.raises(ValueError, match=r"pass SandboxOptions\(workers=2\) instead"):
        rlmesh.run_suite(wobbly, list(TASKS), env_sandbox=SandboxOptions(), workers=2)
    with pytest.raises(TypeError, match=r"env_sandbox: expected rlmesh\.sandbox\.SandboxOptions"):
        rlmesh.run_suite(wobbly, list(TASKS), env_sandbox="bwrap")


def _wired():
    """Whether ``rlmesh eval`` has the sandbox options (cli/main.py adds their group)."""
    from rlmesh.cli.exits import UsageError
    from rlmesh.cli.main import build_parser

    try:
        build_parser().parse_args(["eval", "random", "--env", "CartPole-v1", "--sandbox"])
    except UsageError:
        return False
    return True


@pytest.mark.skipif(not _wired(), reason="rlmesh eval does not have the sandbox options")
def test_rlmesh_eval_records_videos_of_a_sandboxed_env(tmp_path):
    from rlmesh.cli import main

    out = tmp_path / "results.jsonl"
    argv = ["eval", "cartpole-heuristic", "--env", DRAWN, "--episodes", "2", "--sandbox"]
    argv += ["--max-episode-steps", "30", "--record-video", "1", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    _, episodes = rlmesh.read_results(out)
    first = next(episode for episode in episodes if episode.index == 0)
    frames, _ = decoded(out.parent / first.video)
    assert len(frames) == first.steps + 1
