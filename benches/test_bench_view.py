"""The live view (``rlmesh.view``): what watching a run costs it.

The workload: 8 CartPole lanes built to render (``render_mode="rgb_array"``), the balance
heuristic (``cartpole.policy``), seeded episodes of 500 steps. The same run with the view off
(the same lanes, unwatched) and with the view on (``LiveView`` as the run's hook, the lanes
wrapped by it, one page's event stream open and read the whole time, so frames are rendered,
encoded and served), interleaved, in lane-steps per second. Two ways to wrap the lanes:

- ``figures``: as a wired run does (``rlmesh.run(view=...)``: the driver hands the view its
  core's per-lane figures, ``LiveView.wrap(lanes, lane_figures=...)``), so the lanes count
  nothing per step; here a stand-in source of figures, read as often as the core's would be;
- ``counting``: the view's own lanes (``LiveView.lanes``, hooks alone), which count each
  lane's steps and return themselves.

Each side is timed in wall time and in the process's CPU time (``time.process_time``: every
thread of the process, the view's encoder and server included); on a machine other jobs
load, the CPU figure is the steadier one. Target: the view on keeps at least 0.9x of the view
off's lane-steps per second. Memory: the process's resident set across the watched runs of
one run (its lanes are built, reset and drawn once before: pygame makes an env's drawing
surfaces at its first ``render()``), and the frames waiting to be encoded (at most one a
lane).

Following a results file (``rlmesh watch FILE``): a file of 5,000 episodes another writer
appends to, one episode at a time; one follower poll after each (``ResultsFollower.poll``,
which reads what the file gained: ``read_appended``) against parsing the whole file
(``parse_file``, what each poll read before: the lower bound of such a poll), in seconds.

Run: ``pytest benches/test_bench_view.py --benchmark-enable`` (pytest-benchmark's medians per
side and core), or ``python benches/test_bench_view.py [PAIRS]`` for the side-by-side medians
and their ratios on each core (default 7 rounds of the three sides), ``python
benches/test_bench_view.py watch [ROUNDS]`` for the follower's (default 50 polls a side).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import rlmesh
from cartpole import ENV_ID, policy
from rlmesh.core import CORE_NAMES
from rlmesh.lanes import make_lanes
from rlmesh.results import EpisodeResult, ResultsFile
from rlmesh.results.reader import parse_file
from rlmesh.view import LiveState, LiveView, ResultsFollower

LANES = 8
EPISODES = 256  # 128,000 lane-steps a run: seconds, so the view takes and serves its frames
SMOKE_EPISODES = 16
TARGET = 0.9
SIDES = ("off", "figures", "counting")


def resident_mb() -> float:
    """This process's resident memory now, in MB (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PageReader:
    """One page's event stream, read on a thread the whole time (as a browser does)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"GET /events HTTP/1.1\r\nHost: view\r\n\r\n")
        self.events = 0
        self.bytes = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(1 << 16):
                self.bytes += len(chunk)
                self.events += chunk.count(b"\ndata: ") + chunk.startswith(b"data: ")
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)


@contextmanager
def watching() -> Iterator[tuple[LiveView, PageReader]]:
    """A view with one page open (its stream read the whole time), closed afterwards."""
    view = LiveView("http", announce=False)
    reader = PageReader(view.url)
    try:
        deadline = time.monotonic() + 10
        while view.state.watchers < 1:
            assert time.monotonic() < deadline, "the page's stream did not connect"
            time.sleep(0.01)
        yield view, reader
    finally:
        reader.close()
        view.close()


def standing_figures() -> list[tuple[int, float]]:
    """A stand-in for the core's per-lane figures (a driver reads ``runner.snapshot()``)."""
    return [(0, 0.0)] * LANES


def lanes_for(side: str, view: LiveView | None) -> Any:
    """The run's lanes: reset and drawn once, so every env's drawing surfaces exist before a
    run is measured (pygame makes them at an env's first ``render()``), then wrapped."""
    lanes = make_lanes(ENV_ID, num_envs=LANES, render_mode="rgb_array")
    lanes.reset(np.arange(LANES), list(range(LANES)), [None] * LANES)
    for lane in range(LANES):
        lanes.render(lane)
    if side == "figures":
        return view.wrap(lanes, lane_figures=standing_figures)
    if side == "counting":
        return view.wrap(lanes)
    return lanes


def timed_run(side: str, view: LiveView | None, core: str, episodes: int) -> dict[str, Any]:
    """One run of the workload: its lane-steps per wall and per CPU second, and its result."""
    lanes = lanes_for(side, view)
    hooks = None if side == "off" else [view]
    wall, cpu = time.perf_counter(), time.process_time()
    result = rlmesh.run(policy, lanes, episodes=episodes, core=core, hooks=hooks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall": result.total_steps / wall, "cpu": result.total_steps / cpu, "result": result}


def untimed(result: rlmesh.RunResult) -> list[dict[str, Any]]:
    """Each episode's fields but its timings."""
    return [
        {k: v for k, v in e.to_dict().items() if k not in ("duration_s", "predict_ms", "step_ms")}
        for e in result.episodes
    ]


def episodes_of(benchmark: Any) -> int:
    return SMOKE_EPISODES if benchmark.disabled else EPISODES


@pytest.mark.parametrize("core", CORE_NAMES)
def test_view_off(benchmark, core):
    benchmark.group = f"view: 8 CartPole lanes rendering, {core} core"
    run = benchmark.pedantic(timed_run, args=("off", None, core, episodes_of(benchmark)), rounds=3)
    benchmark.extra_info.update(lane_steps_per_s=run["wall"], lane_steps_per_cpu_s=run["cpu"])
    assert run["result"].num_episodes == episodes_of(benchmark)


@pytest.mark.parametrize("side", ["figures", "counting"])
@pytest.mark.parametrize("core", CORE_NAMES)
def test_view_on_with_a_page_open(benchmark, core, side):
    benchmark.group = f"view: 8 CartPole lanes rendering, {core} core"
    episodes = episodes_of(benchmark)
    with watching() as (view, reader):
        run = benchmark.pedantic(timed_run, args=(side, view, core, episodes), rounds=3)
        benchmark.extra_info.update(
            lane_steps_per_s=run["wall"],
            lane_steps_per_cpu_s=run["cpu"],
            frames_taken=view.sampler.taken,
            page_events=reader.events,
        )
        assert view.sampler.pending <= LANES
        assert reader.events > 0
    assert untimed(timed_run("off", None, core, episodes)["result"]) == untimed(run["result"])


def side_by_side(rounds: int, episodes: int = EPISODES) -> dict[str, Any]:
    """Per core, ``rounds`` runs of each side, interleaved: medians, ratios, what the view
    did, and the memory the watched runs held."""
    figures: dict[str, Any] = {}
    for core in CORE_NAMES:
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        with watching() as (view, reader):
            for side in SIDES:  # warm every side up (imports, pygame, Pillow)
                timed_run(side, view, core, SMOKE_EPISODES)
            frames, pending, growth = 0, 0, []
            for turn in range(rounds):
                for side in SIDES[turn % 3 :] + SIDES[: turn % 3]:  # no side always first
                    lanes = lanes_for(side, view)
                    before = resident_mb()
                    hooks = None if side == "off" else [view]
                    wall, cpu = time.perf_counter(), time.process_time()
                    result = rlmesh.run(policy, lanes, episodes=episodes, core=core, hooks=hooks)
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    runs[side].append(
                        {"wall": result.total_steps / wall, "cpu": result.total_steps / cpu}
                    )
                    if side != "off":
                        frames += view.sampler.taken
                        pending = max(pending, view.sampler.pending)
                        growth.append(resident_mb() - before)
            row: dict[str, Any] = {}
            for measure in ("wall", "cpu"):
                off = statistics.median(run[measure] for run in runs["off"])
                row[f"off_{measure}"] = off
                for side in SIDES[1:]:
                    on = statistics.median(run[measure] for run in runs[side])
                    row[f"{side}_{measure}"] = on
                    row[f"{side}_{measure}_ratio"] = on / off
            row.update(
                frames_per_watched_run=frames / (2 * rounds),
                page_events=reader.events,
                page_mb=reader.bytes / 2**20,
                largest_growth_in_a_watched_run_mb=max(growth),
                pending_frames_max=pending,
            )
            figures[core] = row
    return figures


# ---------------------------------------------------------------- following a results file

WATCHED_EPISODES = 5_000
SMOKE_WATCHED_EPISODES = 200
READS = ("read_appended", "parse_file")


def _episode(index: int) -> EpisodeResult:
    steps = 100 + index % 400
    won = index % 3 == 0
    return EpisodeResult(index, 1000 + index, index % 8, 0, steps, steps - 0.5, won, not won, won,
                         steps * 0.004, 0.31, 0.17)  # fmt: skip


class GrowingFile:
    """A results file of ``episodes`` episodes, its writer kept open to append one more
    (``append``), and a follower that has read it all."""

    def __init__(self, folder: str, episodes: int) -> None:
        self.path = os.path.join(folder, "r.jsonl")
        header = {"env": "CartPole-v1", "episodes": 10 * episodes, "seed": 0}
        self.out = ResultsFile.open(self.path, header, resume=False)
        for index in range(episodes):
            self.out.append(_episode(index))
        self.next = episodes
        self.follower = ResultsFollower(self.path, LiveState())
        assert self.follower.poll() == episodes
        # The first read of the whole file may hold the next back (PARSE_SHARE): wait it out.
        self.append()
        deadline = time.monotonic() + 30
        while self.follower.poll() != 1:
            assert time.monotonic() < deadline, "the follower read nothing new"
            time.sleep(0.01)

    def append(self) -> None:
        self.out.append(_episode(self.next))
        self.next += 1

    def close(self) -> None:
        self.out.close()


def read_after_one_episode(growing: GrowingFile, read: str) -> int:
    """What one side does once the file gained an episode: the episodes it then holds."""
    if read == "read_appended":
        return growing.follower.poll()
    return len(parse_file(growing.path).episodes)


@pytest.mark.parametrize("read", READS)
def test_watch_poll_after_one_episode(benchmark, tmp_path, read):
    episodes = SMOKE_WATCHED_EPISODES if benchmark.disabled else WATCHED_EPISODES
    benchmark.group = f"watch: a poll after one appended episode, {episodes:,} episodes"
    growing = GrowingFile(str(tmp_path), episodes)
    try:
        counts = []
        benchmark.pedantic(
            lambda: counts.append(read_after_one_episode(growing, read)),
            setup=growing.append,
            rounds=50,
        )
        if read == "read_appended":  # each poll read the one new episode
            assert counts == [1] * len(counts)
            assert growing.follower.state.snapshot()["done"] == growing.next
        else:  # each parse the whole file
            assert counts == list(range(growing.next - len(counts) + 1, growing.next + 1))
    finally:
        growing.close()


def watch_side_by_side(rounds: int, episodes: int = WATCHED_EPISODES) -> dict[str, Any]:
    """``rounds`` reads of each side after one appended episode, interleaved: medians in
    seconds and the ratio."""
    times: dict[str, list[float]] = {read: [] for read in READS}
    with tempfile.TemporaryDirectory() as folder:
        growing = GrowingFile(folder, episodes)
        try:
            for turn in range(rounds):
                for read in READS[turn % 2 :] + READS[: turn % 2]:
                    growing.append()
                    if read == "parse_file":  # the follower reads that episode untimed
                        growing.follower.poll()
                    started = time.perf_counter()
                    read_after_one_episode(growing, read)
                    times[read].append(time.perf_counter() - started)
        finally:
            growing.close()
    row: dict[str, Any] = {f"{read}_median_s": statistics.median(times[read]) for read in READS}
    row["parse_file_over_read_appended"] = (
        row["parse_file_median_s"] / row["read_appended_median_s"]
    )
    row["episodes"] = episodes
    return row


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "watch":
        row = watch_side_by_side(int(sys.argv[2]) if len(sys.argv) > 2 else 50)
        print(json.dumps(row, indent=2))
        return 0
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    figures = side_by_side(rounds)
    print(json.dumps(figures, indent=2))
    for core, row in figures.items():
        for side in SIDES[1:]:
            for measure, unit in (("wall", "lane-steps/s"), ("cpu", "lane-steps/CPU-s")):
                ratio = row[f"{side}_{measure}_ratio"]
                verdict = "ok" if ratio >= TARGET else "MISSED"
                print(
                    f"{core}, view on ({side}), {unit}: off {row[f'off_{measure}']:,.0f}, on "
                    f"{row[f'{side}_{measure}']:,.0f}: {ratio:.2f}x (target >= {TARGET}x) "
                    f"{verdict}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
