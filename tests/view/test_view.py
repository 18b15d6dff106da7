"""The live view on real runs, without a browser: results equal with it on and off (both
cores, in-process and in worker processes), the figures it keeps, its frames, its server's
bounds (a port in use, a client that never reads, many clients, too many), the terminal
table, and a view reused by the next run. Every server binds 127.0.0.1 and is closed."""

from __future__ import annotations

import io
import socket
import threading
import time
import urllib.request

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import CORES, comparable
from rlmesh.lanes import make_lanes
from rlmesh.results import EpisodeResult
from rlmesh.stats.intervals import wilson_interval
from rlmesh.view import LiveView, TerminalView, ViewError, open_view, parse_view
from rlmesh.view.frames import FrameSampler
from rlmesh.view.server import ViewServer
from rlmesh.view.state import LiveState
from viewing import (
    EventStream,
    RunThread,
    closing_all,
    get,
    image_policy,
    make_image_env,
    paced_policy,
    quick_policy,
    resident_mb,
    state,
    wait_for,
)


@pytest.fixture(params=CORES)
def core(request):
    """The core's name, for ``rlmesh.run(..., core=)``: every run here runs on both."""
    return request.param


@pytest.fixture
def view():
    """A view on a free port of 127.0.0.1, closed after the test (also when it fails)."""
    # Frames as often as the tests need them (the budget is the bench's business).
    live = LiveView("http", announce=False, frame_interval=0.1, frame_budget=0.5)
    try:
        yield live
    finally:
        live.close()


def watched_run(live, env, *, lanes_kwargs=None, policy=quick_policy, **kwargs):
    """``rlmesh.run`` of ``policy`` on ``env``'s lanes watched by ``live``, with a page's
    event stream open the whole time, so frames are taken."""
    lanes = live.lanes(env, **(lanes_kwargs or {}))
    with closing_all([EventStream(live.url)]):
        wait_for("the stream to count as a watcher", lambda: live.state.watchers == 1)
        return rlmesh.run(policy, lanes, hooks=[live], **kwargs)


# ---------------------------------------------------------------- results, on and off


def test_results_are_the_same_with_the_view_on_and_off(view, core):
    plain = rlmesh.run(quick_policy, "CartPole-v1", episodes=12, num_envs=4, core=core)
    watched = watched_run(view, "CartPole-v1", episodes=12, lanes_kwargs={"num_envs": 4}, core=core)
    assert comparable(watched, drop=()) == comparable(plain, drop=())
    assert view.sampler.taken > 0  # it did watch
    snapshot = view.state.snapshot()
    assert snapshot["done"] == 12 and snapshot["status"] == "finished"
    assert snapshot["tasks"][0]["steps"] == watched.total_steps


def test_results_are_the_same_with_the_view_on_worker_processes(view, core):
    caps = {"episodes": 6, "max_episode_steps": 120, "core": core}
    plain = rlmesh.run(paced_policy, "CartPole-v1", num_envs=4, workers=2, **caps)
    watched = watched_run(
        view, "CartPole-v1", lanes_kwargs={"num_envs": 4, "workers": 2}, policy=paced_policy,
        **caps,
    )  # fmt: skip
    assert comparable(watched, drop=()) == comparable(plain, drop=())
    assert view.sampler.taken > 0  # rendered in the workers, shown here
    assert view.state.snapshot()["done"] == 6


def test_results_are_the_same_with_the_view_on_pipelined_workers(view):
    caps = {"episodes": 6, "max_episode_steps": 100, "pipeline": True}
    plain = rlmesh.run(paced_policy, "CartPole-v1", num_envs=4, workers=2, **caps)
    watched = watched_run(
        view, "CartPole-v1", lanes_kwargs={"num_envs": 4, "workers": 2}, policy=paced_policy,
        **caps,
    )  # fmt: skip
    # Pipelined groups come back in whichever order they are ready: the lanes may differ.
    assert comparable(watched) == comparable(plain)
    assert view.sampler.taken > 0


@pytest.mark.parametrize("mode", [AutoresetMode.DISABLED, AutoresetMode.NEXT_STEP])
def test_results_are_the_same_with_the_view_on_a_lockstep_vector(view, mode):
    def vector():
        return SyncVectorEnv(
            [lambda: gym.make("CartPole-v1", render_mode="rgb_array")] * 3, autoreset_mode=mode
        )

    caps = {"episodes": 7}
    if mode == AutoresetMode.DISABLED:  # a vector that restarts its lanes itself takes no cap
        caps["max_episode_steps"] = 80
    plain = rlmesh.run(quick_policy, vector(), **caps)
    watched = watched_run(view, vector(), **caps)
    assert comparable(watched, drop=()) == comparable(plain, drop=())
    snapshot = view.state.snapshot()
    assert snapshot["done"] == 7 and all(lane["step"] >= 0 for lane in snapshot["lanes"])


def test_given_the_runs_own_figures_the_lanes_count_nothing_per_step(view, core):
    figures = [(7, 3.5), (11, 2.0)]  # what a driver's core would say of each lane
    base = make_lanes("CartPole-v1", num_envs=2, render_mode="rgb_array")
    lanes = view.wrap(base, lane_figures=lambda: figures)
    assert lanes.env_steps[0] is base.env_steps[0]  # the env's own step, nothing around it
    caps = {"episodes": 4, "max_episode_steps": 100, "core": core}
    plain = rlmesh.run(paced_policy, "CartPole-v1", num_envs=2, **caps)
    with closing_all([EventStream(view.url)]):
        wait_for("a watcher", lambda: view.state.watchers == 1)
        watched = rlmesh.run(paced_policy, lanes, hooks=[view], **caps)
    assert comparable(watched, drop=()) == comparable(plain, drop=())
    assert lanes.steps == [0, 0] and view.sampler.taken > 0  # frames, without counting
    shown = [(lane["step"], lane["return"]) for lane in view.state.snapshot()["lanes"]]
    assert shown == figures


def test_the_lanes_count_each_episodes_steps_and_return(view):
    lanes = view.lanes("CartPole-v1", num_envs=3)
    seen = []

    class Probe(rlmesh.RuntimeHooks):
        def episode_completed(self, result):
            # The view heard of the episode first: its lane still holds the counts.
            seen.append((result.steps, result.reward, lanes.steps[result.env_index],
                         lanes.returns[result.env_index]))  # fmt: skip

    result = rlmesh.run(quick_policy, lanes, episodes=6, hooks=[view, Probe()])
    assert [(steps, reward) for steps, reward, _, _ in seen] == [
        (steps, returned) for _, _, steps, returned in seen
    ]
    assert len(seen) == result.num_episodes == 6


def test_each_lane_shows_the_episode_it_runs(view):
    started = []

    class Probe(rlmesh.RuntimeHooks):
        def episode_started(self, *, episode, seed):
            lanes = view.state.snapshot()["lanes"]
            started.append((episode, [lane["episode"] for lane in lanes]))

    result = rlmesh.run(
        quick_policy, view.lanes("CartPole-v1", num_envs=3), episodes=7, hooks=[view, Probe()]
    )
    on_lane = {episode.index: episode.env_index for episode in result.episodes}
    for episode, shown in started:
        assert shown[on_lane[episode]] == episode


# ---------------------------------------------------------------- figures


def test_failures_are_listed_by_index_with_their_error(view):
    class Fragile(gym.Wrapper):
        def step(self, action):
            if self.unwrapped.state[0] > 0.05:
                raise RuntimeError("cart too far right")
            return super().step(action)

    def make():
        return Fragile(gym.make("CartPole-v1"))

    result = rlmesh.run(
        quick_policy, view.lanes(make, num_envs=2), episodes=6, on_error="record", hooks=[view]
    )
    failed = {episode.index: episode.error for episode in result.episodes if episode.error}
    assert failed, "the env never failed: the test proves nothing"
    snapshot = view.state.snapshot()
    assert snapshot["failed_total"] == len(failed)
    assert {f["index"]: f["error"] for f in snapshot["failures"]} == failed
    assert snapshot["tasks"][0]["failed"] == len(failed)


def test_the_success_interval_is_wilsons_and_the_return_interval_the_bootstrap(view):
    result = rlmesh.run(
        quick_policy, view.lanes("CartPole-v1", num_envs=2), episodes=10, success=200,
        max_episode_steps=300, hooks=[view],
    )  # fmt: skip
    task = view.state.snapshot()["tasks"][0]
    succeeded = sum(bool(episode.success) for episode in result.episodes)
    assert task["succeeded"] == succeeded and task["judged"] == 10
    lo, hi = wilson_interval(succeeded, 10)
    assert task["success_interval"] == pytest.approx([lo, hi])
    rewards = [episode.reward for episode in result.episodes]
    assert task["mean_return"] == pytest.approx(np.mean(rewards))
    lo, hi = task["return_interval"]
    assert min(rewards) <= lo <= np.mean(rewards) <= hi <= max(rewards)


def test_a_suite_shows_one_row_per_task(view):
    tasks = [
        rlmesh.Task("short", "CartPole-v1", episodes=3, max_episode_steps=20),
        rlmesh.Task("long", "CartPole-v1", episodes=2, max_episode_steps=60),
    ]
    rlmesh.run_suite(quick_policy, tasks, hooks=[view])
    rows = view.state.snapshot()["tasks"]
    assert [(row["done"], row["requested"], row["steps"]) for row in rows] == [
        (3, 3, 60),
        (2, 2, 120),
    ]


def test_frames_come_from_the_observation_with_video_key():
    with LiveView(
        "http", announce=False, video_key="image", frame_interval=0.05, frame_budget=0.5
    ) as live:
        lanes = live.lanes(make_image_env, num_envs=2)
        with closing_all([EventStream(live.url)]):
            wait_for("a watcher", lambda: live.state.watchers == 1)
            rlmesh.run(image_policy, lanes, episodes=10, hooks=[live])
            status, headers, body = get(live.url + "frame/0")
        assert status == 200 and headers["Content-Type"] in ("image/jpeg", "image/png")
        assert len(body) > 100
        lanes_shown = live.state.snapshot()["lanes"]
        assert [(lane["width"], lane["height"]) for lane in lanes_shown] == [(32, 24)] * 2


def test_frames_are_taken_within_their_budget_of_the_runs_time():
    state_ = LiveState()
    sampler = FrameSampler(state_, 4, interval=0.01, budget=0.1)
    try:
        for _ in range(50):  # takes that cost 20 ms each: 5 a second at most, one lane a time
            sampler.spent(0.02)
        assert sampler.gap == pytest.approx(0.2, rel=0.01)
        marks = 0
        with state_.watching():
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # bounded: one second
                for lane, due in enumerate(sampler.due):
                    if due:
                        marks += 1
                        sampler.take(lane, np.zeros((8, 8, 3), np.uint8))
                time.sleep(0.005)
        assert 1 <= marks <= 1.0 / 0.2 + 1
    finally:
        sampler.close()


def test_no_frame_is_taken_while_no_page_watches(view):
    rlmesh.run(quick_policy, view.lanes("CartPole-v1", num_envs=2), episodes=4, hooks=[view])
    assert view.sampler.taken == 0
    assert get(view.url + "frame/0")[0] == 404


def test_lanes_that_cannot_render_say_so_and_the_run_goes_on(view):
    lanes = view.wrap(make_lanes("CartPole-v1", num_envs=2))  # not built to render
    result = rlmesh.run(quick_policy, lanes, episodes=2, hooks=[view])
    assert result.num_episodes == 2
    assert "render_mode='rgb_array'" in view.state.snapshot()["frames_note"]


# ---------------------------------------------------------------- the server's bounds


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ViewError, match=rf"port {port} is in use.*view='http'"):
            LiveView(f"http:{port}", announce=False)
        with pytest.raises(ViewError, match=f"port {port} is in use"):
            open_view(f"http:{port}")


@pytest.mark.parametrize(
    ("value", "wanted"),
    [("htp", "is not a view"), ("http:99999", "not a port"), ("http:x", "not a port"),
     ("terminal:3", "is not a view"), (":8000", "is not a view")],
)  # fmt: skip
def test_a_bad_view_value_names_the_forms(value, wanted):
    with pytest.raises(ViewError, match=wanted):
        parse_view(value)


def test_a_client_that_never_reads_is_dropped_and_costs_the_run_nothing():
    live = LiveView("http", announce=False, push_every=0.02, write_timeout=0.5,
                    frame_interval=0.05, frame_budget=0.5)  # fmt: skip
    try:
        lanes = live.lanes("CartPole-v1", num_envs=4)
        before = resident_mb()
        # A tiny receive window: the server's writes to it stall within a second or two.
        stuck = EventStream(live.url, receive_buffer=4096)
        reader = EventStream(live.url)
        with closing_all([stuck, reader]):
            wait_for("both streams", lambda: live.server.stats()["streams"] == 2)

            def evaluate():
                return rlmesh.run(
                    paced_policy, lanes, episodes=12, max_episode_steps=150, hooks=[live]
                )

            run = RunThread(evaluate)
            pending, last = [], None
            while run.alive:  # bounded: the run ends (or join fails after its timeout)
                pending.append(live.sampler.pending)
                (last,) = reader.read(1)
            result = run.join()
            assert result.num_episodes == 12
            assert max(pending) <= lanes.num_lanes  # one frame per lane waits, at most
            assert live.sampler.taken > 0
            wait_for("the stuck client dropped", lambda: live.server.stats()["dropped"] >= 1)
            assert live.server.stats()["streams"] == 1  # the reader is still served
            if last is None or last["status"] != "finished":
                reader.read_until("the run's end", lambda event: event["status"] == "finished")
        assert resident_mb() - before < 64
    finally:
        live.close()


def test_many_clients_are_served_and_more_than_the_bound_refused():
    with LiveView("http", announce=False, max_clients=24, push_every=0.05) as live:
        with closing_all([EventStream(live.url) for _ in range(20)]) as streams:
            wait_for("20 streams", lambda: live.server.stats()["streams"] == 20)
            lanes = live.lanes("CartPole-v1", num_envs=2)
            result = RunThread(
                lambda: rlmesh.run(quick_policy, lanes, episodes=4, hooks=[live])
            ).join()
            for stream in streams:  # every stream sees the run to its end
                final = stream.read_until("the end", lambda event: event["status"] == "finished")
                assert final["done"] == result.num_episodes == 4
            extra = [EventStream(live.url) for _ in range(4)]
            with closing_all(extra):
                wait_for("24 connections", lambda: live.server.stats()["connections"] == 24)
                status, _, body = get(live.url + "state")
                assert status == 503 and b"too many clients" in body
                assert live.server.stats()["refused"] == 1
        wait_for("every stream closed", lambda: live.server.stats()["connections"] == 0)
        assert get(live.url + "state")[0] == 200


def test_the_server_serves_only_what_the_view_lists():
    state_ = LiveState()
    server = ViewServer(state_)
    try:
        assert server.host == "127.0.0.1"
        for path in ("video/0", "frame/0", "../etc/passwd", "video/..%2F..%2Fetc%2Fpasswd"):
            assert get(server.url + path)[0] == 404, path
        status, headers, page = get(server.url)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"EventSource" in page and b"http://" not in page and b"https://" not in page
    finally:
        server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_recorded_videos_are_served_once_written(tmp_path):
    with LiveView("http", announce=False, videos_from=tmp_path) as live:
        rlmesh.run(
            image_policy, live.lanes(make_image_env, num_envs=2), episodes=3, record_video=2,
            results_path=tmp_path / "r.jsonl", hooks=[live],
        )  # fmt: skip
        videos = wait_for("two videos", lambda: live.state.snapshot()["videos"])
        assert sorted(video["index"] for video in videos) == [0, 1]
        status, headers, body = get(live.url + f"video/{videos[0]['id']}")
        assert status == 200 and headers["Content-Type"] == "video/mp4" and body[4:8] == b"ftyp"
        request = urllib.request.Request(
            live.url + f"video/{videos[0]['id']}", headers={"Range": "bytes=4-7"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 206 and response.read() == b"ftyp"


# ---------------------------------------------------------------- terminal, reuse


def test_the_terminal_view_prints_plain_lines_off_a_terminal():
    out = io.StringIO()
    with LiveView("terminal", stream=out, announce=False) as live:
        live.terminal.plain_every = 0.05
        rlmesh.run(paced_policy, "CartPole-v1", episodes=2, max_episode_steps=100, hooks=[live])
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("rlmesh: ") for line in lines)
    assert lines[-1].startswith("rlmesh: finished: 2 / 2 episodes")


def test_the_terminal_table_shows_tasks_lanes_and_failures():
    state_ = LiveState("table")
    state_.begin("CartPole-v1", requested=3)
    episode = EpisodeResult(0, 1, 0, 0, 7, 7.0, False, False, None, 0.1, 0.0, 0.0,
                                   error="RuntimeError: boom")  # fmt: skip
    state_.add_episode(episode)
    out = io.StringIO()
    table = TerminalView(state_, stream=out, terminal=True)
    table.start()
    table.stop()
    text = out.getvalue()
    assert "CartPole-v1" in text and "1 / 3" in text and "RuntimeError: boom" in text


def test_a_view_opened_again_keeps_its_page_and_clears_its_figures():
    first = open_view("http", announce=False)
    try:
        rlmesh.run(quick_policy, "CartPole-v1", episodes=2, hooks=[first])
        assert first.state.snapshot()["done"] == 2
        next_task = open_view("http", fresh=False)  # a suite's next task: figures kept
        assert next_task is first and next_task.state.snapshot()["done"] == 2
        again = open_view("http", announce=False)  # a new run: figures cleared
        assert again is first and again.state.snapshot()["done"] == 0
        assert state(again.url)["status"] == "waiting"
    finally:
        first.close()
    fresh = open_view("http", announce=False)
    try:
        assert fresh is not first
    finally:
        fresh.close()


def test_observer_errors_stay_zero_with_the_view(view):
    threads = threading.active_count()  # other tests' threads may still be winding down
    result = rlmesh.run(
        quick_policy, view.lanes("CartPole-v1", num_envs=2), episodes=4, hooks=[view]
    )
    assert result.observer_errors == 0
    assert threading.active_count() <= threads + 4  # the view's own few, not one per step
