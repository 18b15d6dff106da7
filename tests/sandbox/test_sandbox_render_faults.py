"""A sandboxed env whose ``render()`` raises in its server: that frame alone fails (the error
names the lane, the env and the exception, as an env in this process says it), the session
and the other lanes' episodes go on; the live view stops its frames and never the run; a
run recording videos says which lane's render failed and keeps what completed. Nothing is
left running (the autouse check of conftest.py)."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import rlmesh
from faulty_envs import HERE as FAULTY
from faulty_envs import make_faulty
from helpers import CORES, comparable
from rlmesh.errors import EnvError
from rlmesh.lanes import make_lanes
from rlmesh.sandbox import SandboxEnv
from rlmesh.sandbox.bwrap import find_bwrap
from rlmesh.view import LiveView
from viewing import EventStream, closing_all, paced_policy, wait_for

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

SOURCE = f"{FAULTY}:make_faulty"
RUN = {"episodes": 6, "seed": 3, "max_episode_steps": 30}


def stepped(lanes, seeds, steps):
    """``lanes`` (two) reset with ``seeds`` and stepped ``steps`` times, pushing left."""
    both = np.array([0, 1], dtype=np.int64)
    lanes.reset(both, seeds, [None, None])
    batch = None
    for _ in range(steps):
        batch = lanes.step(both, np.zeros(2, dtype=np.int64))
    return batch


@pytest.mark.parametrize("core", CORES)
def test_a_render_that_raises_fails_that_frame_alone_and_the_session_goes_on(core):
    faults = {"fails": "render", "at_step": 3, "modulo": 3}
    local = make_lanes(functools.partial(make_faulty, "rgb_array", **faults), num_envs=2)
    with SandboxEnv(SOURCE, num_envs=2, render_mode="rgb_array", core=core, **faults) as env:
        for lanes in (local, env):  # lane 0's seed is doomed, lane 1's is not
            stepped(lanes, [6, 7], 3)
        with pytest.raises(EnvError) as here:
            local.render(0)
        with pytest.raises(EnvError) as there:
            env.render(0)
        assert str(there.value) == str(here.value)  # the same words as in this process
        assert "lane 0 (CartPole-v1): render() raised RuntimeError: the renderer lost" in str(
            there.value
        )
        np.testing.assert_array_equal(env.render(1), local.render(1))
        # The session goes on: both lanes step, as the same envs in this process do.
        ours, theirs = (stepped_on(lanes) for lanes in (env, local))
        assert ours.stepped.tolist() == [0, 1]
        np.testing.assert_array_equal(np.stack(ours.observations), np.stack(theirs.observations))
        assert env.running
    local.close()
    assert not env.running


def stepped_on(lanes):
    """Two more steps of both lanes, without a reset."""
    both = np.array([0, 1], dtype=np.int64)
    lanes.step(both, np.ones(2, dtype=np.int64))
    return lanes.step(both, np.ones(2, dtype=np.int64))


@pytest.mark.parametrize("core", CORES)
def test_with_the_live_view_a_render_that_raises_stops_the_frames_not_the_run(core):
    # Every episode's render fails from its first step: the view's first frame after a step.
    faults = {"fails": "render", "at_step": 1, "modulo": 1}
    options = {"num_envs": 2, "episodes": 4, "seed": 3, "max_episode_steps": 120}
    local = rlmesh.run(paced_policy, "CartPole-v1", on_error="record", core=core, **options)
    live = LiveView("http", announce=False, frame_interval=0.05, frame_budget=0.5)
    env = SandboxEnv(SOURCE, num_envs=2, render_mode="rgb_array", core=core, **faults)
    try:
        lanes = live.lanes(env)
        with closing_all([EventStream(live.url)]):
            wait_for("the stream to count as a watcher", lambda: live.state.watchers == 1)
            watched = rlmesh.run(
                paced_policy, lanes, hooks=[live], on_error="record", core=core,
                **{key: value for key, value in options.items() if key != "num_envs"},
            )  # fmt: skip
        note = live.state.snapshot()["frames_note"]
    finally:
        live.close()
        env.close()
    # Before, the failed render ended the session, failing every episode in flight.
    assert comparable(watched) == comparable(local)
    assert not any(episode.error for episode in watched.episodes)
    assert note is not None and "render() raised RuntimeError: the renderer lost" in note


@pytest.mark.parametrize("core", CORES)
def test_recording_a_render_that_raises_fails_that_episode_naming_the_lane(core, tmp_path):
    """A frame that cannot be taken for a recorded episode (its env's render() raised in a
    worker or in the sandbox's server) fails that episode as a failed step would, naming the
    lane and the env's error; the other lanes go on, and the episodes are the same whether
    the env runs in worker processes or in a sandbox."""
    faults = {"fails": "render", "at_step": 5, "modulo": 3}
    record = {"record_video": 6, "on_error": "record", "core": core, **RUN}
    in_workers = rlmesh.run(
        paced_policy, functools.partial(make_faulty, **faults), num_envs=2, workers=2,
        video_dir=tmp_path / "workers", **record,
    )  # fmt: skip
    env = SandboxEnv(SOURCE, num_envs=2, render_mode="rgb_array", core=core, **faults)
    try:
        sandboxed = rlmesh.run(paced_policy, env, video_dir=tmp_path / "sandbox", **record)
    finally:
        env.close()
    # The error's wording says where the env ran (a worker, a server): compared apart.
    drop = ("env_index", "video", "error")
    assert comparable(sandboxed, drop=drop) == comparable(in_workers, drop=drop)
    failed = [episode for episode in sandboxed.episodes if episode.error]
    assert [e.index for e in failed] == [e.index for e in in_workers.episodes if e.error]
    assert failed and len(failed) < len(sandboxed.episodes)
    for episode in failed + [e for e in in_workers.episodes if e.error]:
        assert re.search(r"lane \d", episode.error)
        assert "render() raised RuntimeError: the renderer lost its context at step 5" in (
            episode.error
        )
        assert episode.video is None  # a failed episode's video is dropped, never linked
    assert not env.running


def test_recording_a_render_that_raises_records_that_episode_failed_as_a_local_run_does(
    tmp_path,
):
    faults = {"fails": "render", "at_step": 5, "modulo": 3}
    record = {"record_video": 6, "on_error": "record", **RUN}
    local = rlmesh.run(
        paced_policy, functools.partial(make_faulty, **faults), num_envs=2,
        video_dir=tmp_path / "local", **record,
    )  # fmt: skip
    assert any(e.error for e in local.episodes)
    env = SandboxEnv(SOURCE, num_envs=2, render_mode="rgb_array", **faults)
    try:
        result = rlmesh.run(paced_policy, env, video_dir=tmp_path / "sandbox", **record)
    finally:
        env.close()
    assert comparable(result, drop=("env_index", "video")) == comparable(
        local, drop=("env_index", "video")
    )
