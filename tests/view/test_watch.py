"""``rlmesh watch``: following a results file another process writes, through the one reader.

A real writer (a subprocess running ``rlmesh.run`` with a results file) and a real watcher
(a subprocess running the command, its page on a free port of 127.0.0.1): the page's
snapshot shows the file's new episodes as they are written and the run's end. Then the
follower itself: a line cut off mid-write, a rewritten file, a suite's tasks, and the
command's bad input. Every process is ended, also when a test fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import rlmesh
from helpers import CORES
from rlmesh.cli.exits import UsageError
from rlmesh.cli.watch import add_watch_parser
from rlmesh.cli.watch import watch_command as run_watch
from rlmesh.results import EpisodeResult, ResultsFile
from rlmesh.view import LiveState, ResultsFollower
from viewing import RunThread, paced_policy, quick_policy, state, wait_for

PROCESS_TIMEOUT_S = 60.0

# Writes a results file slowly: 2 ms a model call, 2 lanes, episodes capped at 60 steps.
WRITER = textwrap.dedent(
    """
    import sys, time
    import rlmesh

    def policy(obs):
        time.sleep(0.002)
        return int(obs[2] + 0.3 * obs[3] > 0)

    if __name__ == "__main__":
        rlmesh.run(policy, "CartPole-v1", episodes=int(sys.argv[2]), num_envs=2,
                   max_episode_steps=60, results_path=sys.argv[1])
    """
)


def watch_command(*args: str) -> list[str]:
    """The command line of ``rlmesh watch ARGS``."""
    return [sys.executable, "-m", "rlmesh", "watch", *args]


@contextlib.contextmanager
def started(command: list[str], **kwargs):
    """A subprocess, ended on the way out (SIGINT, then kill), also when the test fails."""
    process = subprocess.Popen(command, text=True, **kwargs)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def lines_of(stream) -> queue.Queue:
    """A queue filled with ``stream``'s lines by a daemon thread (reads never block the test)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def url_from(lines: queue.Queue, timeout: float = 30.0) -> str:
    """The page's address the watcher prints on stderr."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if " at http://" in line:
            return line.rsplit(" at ", 1)[1].strip()
    raise AssertionError(f"the watcher printed no address within {timeout} s: {seen}")


def test_watch_follows_a_file_another_process_writes(tmp_path):
    path = tmp_path / "results.jsonl"
    episodes = 24
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with started([sys.executable, "-c", WRITER, str(path), str(episodes)], env=env) as writer:
        wait_for("the writer's header", lambda: path.exists() and path.stat().st_size > 0)
        command = watch_command(str(path), "--http", "--no-terminal", "--poll", "0.1")
        with started(command, stderr=subprocess.PIPE, env=env) as watcher:
            url = url_from(lines_of(watcher.stderr))
            assert url.startswith("http://127.0.0.1:")
            seen = []

            def more_episodes():
                seen.append(state(url)["done"])
                return len(set(seen)) >= 3 and seen[-1] > 0

            wait_for("the page to show new episodes as they are written", more_episodes)
            assert seen == sorted(seen)  # episodes only come
            assert writer.wait(PROCESS_TIMEOUT_S) == 0
            final = wait_for(
                "the run's end",
                lambda: (snapshot := state(url))["status"] == "finished" and snapshot,
            )
            written = rlmesh.results.read_results(path)[1]
            assert final["done"] == final["requested"] == len(written) == episodes
            (task,) = final["tasks"]
            assert task["steps"] == sum(episode.steps for episode in written)
            watcher.send_signal(signal.SIGINT)
            assert watcher.wait(PROCESS_TIMEOUT_S) == 130


def test_watch_until_complete_shows_a_complete_file_and_exits(tmp_path):
    path = tmp_path / "done.jsonl"
    rlmesh.run(quick_policy, "CartPole-v1", episodes=3, max_episode_steps=40, results_path=path)
    out = subprocess.run(
        watch_command(str(path), "--until-complete", "--poll", "0.05"),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr
    assert "rlmesh: finished: 3 / 3 episodes" in out.stderr.splitlines()[-1]
    assert out.stdout == ""  # nothing mixes into what a pipe reads


def test_watch_refuses_what_it_cannot_watch(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    results = tmp_path / "r.jsonl"
    rlmesh.run(quick_policy, "CartPole-v1", episodes=1, results_path=results)
    parser = argparse.ArgumentParser(prog="rlmesh")
    add_watch_parser(parser.add_subparsers(dest="command"))
    for args, wanted in (
        ([str(tmp_path / "missing.jsonl")], "no such file"),
        ([str(text)], "is not JSON"),
        ([str(results), "--host", "0.0.0.0"], "--host names where --http serves"),
    ):
        with pytest.raises(UsageError, match=re.escape(wanted)):
            run_watch(parser.parse_args(["watch", *args]))
    with socket.socket() as taken:  # the command's one line, and its exit code
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            watch_command(str(results), "--http", str(port)),
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
        )
    assert out.returncode == 2, out.stderr
    assert f"port {port} is in use" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- the follower


def _episode(index: int, *, steps: int = 10, task: str | None = None, error=None):
    return EpisodeResult(index, index, index, 0, steps, float(steps), True, False,
                         index % 2 == 0, 0.1, 0.0, 0.0, task=task, error=error)  # fmt: skip


def test_a_line_cut_off_mid_write_counts_once_it_is_whole(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, {"env": "CartPole-v1", "episodes": 3}, resume=False) as out:
        out.append(_episode(0))
    follower = ResultsFollower(path, LiveState())
    assert follower.poll() == 1
    line = json.dumps(_episode(1).to_dict()) + "\n"
    with open(path, "a") as handle:  # half a line, as a writer leaves it between two writes
        handle.write(line[:25])
    assert follower.poll() == 0 and follower.state.snapshot()["done"] == 1
    with open(path, "a") as handle:
        handle.write(line[25:])
    assert follower.poll() == 1 and follower.state.snapshot()["done"] == 2
    assert follower.state.snapshot()["status"] == "running"


def test_a_rewritten_file_is_read_afresh(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, {"env": "A-v0", "episodes": 4}, resume=False) as out:
        for index in range(3):
            out.append(_episode(index))
    follower = ResultsFollower(path, LiveState())
    assert follower.poll() == 3
    path.unlink()
    with ResultsFile.open(path, {"env": "B-v0", "episodes": 2}, resume=False) as out:
        out.append(_episode(0, steps=7))
        out.append(_episode(1, steps=7, error="RuntimeError: boom"))
    assert follower.poll() == 2
    snapshot = follower.state.snapshot()
    assert [(task["name"], task["done"], task["requested"]) for task in snapshot["tasks"]] == [
        ("B-v0", 2, 2)
    ]
    assert snapshot["status"] == "finished" and snapshot["failed_total"] == 1
    assert snapshot["failures"] == [{"index": 1, "task": "B-v0", "error": "RuntimeError: boom"}]


def test_a_suites_file_shows_every_task_it_lists(tmp_path):
    path = tmp_path / "suite.jsonl"
    tasks = [
        rlmesh.Task("short", "CartPole-v1", episodes=2, max_episode_steps=20),
        rlmesh.Task("later", "CartPole-v1", episodes=3, max_episode_steps=20),
    ]
    rlmesh.run_suite(quick_policy, tasks, results_path=path, only=["short"])
    follower = ResultsFollower(path, LiveState())
    follower.poll()
    snapshot = follower.state.snapshot()
    rows = [(task["name"], task["done"], task["requested"]) for task in snapshot["tasks"]]
    assert rows == [("short", 2, 2), ("later", 0, 3)]
    assert snapshot["requested"] == 5 and snapshot["status"] != "finished"


def test_a_follower_thread_stops_when_closed(tmp_path):
    path = Path(tmp_path / "r.jsonl")
    with ResultsFile.open(path, {"env": "CartPole-v1", "episodes": 1}, resume=False) as out:
        out.append(_episode(0))
    follower = ResultsFollower(path, LiveState(), poll_every=0.01)
    follower.start()
    wait_for("a read", lambda: follower.reads >= 1)
    follower.close()
    assert not follower._thread.is_alive()
    assert follower.state.snapshot()["status"] == "finished"


@pytest.mark.parametrize("core", CORES)
def test_a_follower_reads_what_a_real_run_appends(tmp_path, core):
    path = tmp_path / "r.jsonl"
    episodes = 12
    run = RunThread(
        lambda: rlmesh.run(paced_policy, "CartPole-v1", episodes=episodes, num_envs=2,
                           max_episode_steps=40, results_path=path, core=core)
    )  # fmt: skip
    wait_for("the run's header", lambda: path.exists() and path.stat().st_size > 0)
    follower = ResultsFollower(path, LiveState())
    added = []
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while run.alive and time.monotonic() < deadline:  # while the run writes
        added.append(follower.poll())
        time.sleep(0.01)
    result = run.join()
    added.append(follower.poll())
    assert sum(1 for count in added if count) >= 2  # read as it grew, in more than one read
    assert sum(added) == result.num_episodes == episodes  # each episode once
    written = rlmesh.results.read_results(path)[1]
    snapshot = follower.state.snapshot()
    assert snapshot["done"] == len(written) and snapshot["status"] == "finished"
    (task,) = snapshot["tasks"]
    assert task["steps"] == sum(episode.steps for episode in written) == result.total_steps


def test_another_file_under_the_name_is_read_from_its_start(tmp_path):
    # The same header, a longer file: only its inode says it is not the file that was read.
    path, other = tmp_path / "r.jsonl", tmp_path / "other.jsonl"
    header = {"env": "CartPole-v1", "episodes": 4}
    with ResultsFile.open(path, header, resume=False) as out:
        for index in range(2):
            out.append(_episode(index, steps=10))
    follower = ResultsFollower(path, LiveState())
    assert follower.poll() == 2
    with ResultsFile.open(other, header, resume=False) as out:
        for index in range(3):
            out.append(_episode(index, steps=7))
    os.replace(other, path)
    assert follower.poll() == 3
    (task,) = follower.state.snapshot()["tasks"]
    assert (task["done"], task["steps"]) == (3, 21)


def test_a_rewrite_in_place_the_reader_cannot_tell_is_read_from_its_start(tmp_path):
    # Rewritten in place with the same header and a line ending where the read lines ended:
    # what follows repeats an episode read before, so the whole file decides.
    path = tmp_path / "r.jsonl"
    header = {"env": "CartPole-v1", "episodes": 4}
    with ResultsFile.open(path, header, resume=False) as out:
        out.append(_episode(0))
        out.append(_episode(1))
    read = path.stat().st_size
    follower = ResultsFollower(path, LiveState())
    assert follower.poll() == 2
    lines = [json.dumps(_episode(index).to_dict()) + "\n" for index in (5, 6, 0)]
    with open(path, "r+") as handle:  # the same inode
        handle.seek(read - sum(map(len, lines[:2])))
        handle.write("".join(lines))
    assert path.read_bytes()[read - 1 : read] == b"\n"
    assert follower.poll() == 3 and follower.error is None
    snapshot = follower.state.snapshot()
    assert snapshot["done"] == 3
    assert sorted(e.index for e in rlmesh.results.read_results(path)[1]) == [0, 5, 6]


def test_eval_says_its_page_closes_with_it_and_how_watch_shows_it_again(tmp_path):
    """``rlmesh eval --view http`` serves its page while it runs; the page goes with the
    command, so the command ends by naming the ``rlmesh watch`` that serves it again."""
    out = tmp_path / "run.jsonl"
    command = [sys.executable, "-m", "rlmesh", "eval", "random", "--env", "CartPole-v1"]
    command += ["--episodes", "3", "--view", "http", "--no-progress"]
    finished = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
    )
    assert finished.returncode == 0, finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert re.fullmatch(r"rlmesh: live view at http://127\.0\.0\.1:\d+/", lines[0])
    assert lines[-1] == (
        f"rlmesh: the live view closes with this command; `rlmesh watch {out} --http` shows "
        "this run's page again"
    )
    without_file = subprocess.run(
        command, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
    )
    assert without_file.returncode == 0, without_file.stderr
    assert "pass --out FILE to keep the run" in without_file.stderr
