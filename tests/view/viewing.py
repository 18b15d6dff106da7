"""What the live view's tests share: a run in a thread, a paced CartPole policy, an image env,
bounded clients of the page's server (raw sockets and urllib, every loop bounded in count and
time), and the page's checks in a real browser, written once against ``Page`` (each browser's
test module adapts its driver to it and keeps only the driving)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import rlmesh
from gymnasium import spaces
from rlmesh.view import LiveView

REQUEST_TIMEOUT_S = 5.0
RUN_TIMEOUT_S = 60.0


def paced_policy(obs):
    """CartPole's balance heuristic with a wobble that depends on the cart's position, so
    episodes end at different steps (a pure function of the observation), and 1 ms of
    thinking per call, so a run lasts long enough to be watched."""
    time.sleep(0.001)
    return int(obs[2] + 0.3 * obs[3] + 0.02 * np.sin(40.0 * obs[0]) > 0)


def quick_policy(obs):
    """The same decisions, without the pause."""
    return int(obs[2] + 0.3 * obs[3] + 0.02 * np.sin(40.0 * obs[0]) > 0)


IMAGE = (24, 32, 3)


class ImageEnv(gym.Env):
    """A bright column that the action moves over a dark image, the Dict observation's
    ``image``; seeded episodes of 20 to 59 steps. Module-level: worker processes build it."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {"image": spaces.Box(0, 255, IMAGE, np.uint8), "x": spaces.Discrete(IMAGE[1])}
        )
        self.action_space = spaces.Discrete(2)

    def _observation(self):
        image = np.zeros(IMAGE, dtype=np.uint8)
        image[:, self.x] = (255, 200, 50)
        return {"image": image, "x": self.x}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(0, IMAGE[1]))
        self.length = int(self.np_random.integers(20, 60))
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        self.x = (self.x + (1 if action else -1)) % IMAGE[1]
        return self._observation(), float(self.x % 3 == 0), self.t >= self.length, False, {}

    def render(self):
        return self._observation()["image"]


def make_image_env(render_mode=None):
    """An ``ImageEnv``, from a factory that takes ``render_mode`` (rlmesh passes it)."""
    return ImageEnv(render_mode)


def image_policy(obs):
    """Right in the left half, left in the right half, with 1 ms of thinking per call."""
    time.sleep(0.001)
    return int(obs["x"] < IMAGE[1] // 2)


class RunThread:
    """``fn()`` on a thread; ``join()`` returns its result or raises its error, and fails
    after ``RUN_TIMEOUT_S``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = RUN_TIMEOUT_S) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    """One GET: status, headers and body (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def state(url: str) -> dict[str, Any]:
    """The view's snapshot, from ``/state``."""
    status, _, body = get(url + "state")
    assert status == 200
    return json.loads(body)


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.05
) -> Any:
    """``check()`` once it is truthy, polled at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s (last: {value!r})")
        time.sleep(every)


class EventStream:
    """A raw connection that asked for ``/events``; it reads nothing unless told to."""

    def __init__(self, url: str, *, receive_buffer: int | None = None) -> None:
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before connecting, so the window starts that small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(REQUEST_TIMEOUT_S)
        self.sock.connect((host, int(port)))
        self.sock.sendall(b"GET /events HTTP/1.1\r\nHost: view\r\n\r\n")
        self.buffer = b""

    def read(self, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The next ``count`` snapshots the stream sends, read within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        events: list[dict[str, Any]] = []
        while len(events) < count:
            while b"\n\n" in self.buffer and len(events) < count:
                message, self.buffer = self.buffer.split(b"\n\n", 1)
                for line in message.split(b"\n"):
                    if line.startswith(b"data: "):
                        events.append(json.loads(line[6:]))
            if len(events) >= count:
                break
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(events)} of {count} events within {timeout} s"
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            assert chunk, "the stream ended"
            self.buffer += chunk
        return events

    def read_until(self, what: str, check: Callable[[dict[str, Any]], bool],
                   timeout: float = 20.0) -> dict[str, Any]:  # fmt: skip
        """The first snapshot for which ``check`` holds, read within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{what} within {timeout} s"
            (event,) = self.read(1, remaining)
            if check(event):
                return event

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def closing_all(streams: list[Any]) -> Iterator[list[Any]]:
    """``streams`` (anything with ``close``), closed on the way out, also on a failure."""
    try:
        yield streams
    finally:
        for stream in streams:
            stream.close()


def resident_mb() -> float:
    """This process's resident memory now, in MB (Linux)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---------------------------------------------------------------------- the page in a browser


class Page(Protocol):
    """A browser tab, as the page checks below drive it; every call bounded in time."""

    def navigate(self, url: str) -> None:
        """Load ``url``, returning once its ``load`` event fired."""

    def reload(self) -> None:
        """Reload the page, returning once its ``load`` event fired."""

    def evaluate(self, expression: str) -> Any:
        """The value of the JavaScript ``expression`` in the page (JSON's types)."""

    def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""

    def console_errors(self) -> list[str]:
        """Each console error and uncaught exception the page logged so far, described."""


BROWSER_LANES, BROWSER_EPISODES = 4, 24

PAGE = (
    "(() => {"
    "  const lanes = [...document.querySelectorAll('figure.lane')];"
    "  return {"
    "    updates: Number(document.body.dataset.updates),"
    "    status: document.getElementById('status').textContent,"
    "    done: Number(document.getElementById('progress').value),"
    "    steps: lanes.map(f => Number(f.dataset.step || 0)),"
    "    frames: lanes.map(f => f.querySelector('img').dataset.v || null),"
    "    decoded: lanes.map(f => f.querySelector('img').naturalWidth),"
    "    tasks: [...document.querySelectorAll('#tasks tbody tr')].map(r =>"
    "      [r.dataset.task, r.querySelector('.success').textContent,"
    "       r.querySelector('.return').textContent])"
    "  };"
    "})()"
)
"""What the page shows now: progress, each lane's frame and caption, the task rows."""

FINISHED = (
    "document.getElementById('status').textContent === 'finished' && "
    f"Number(document.getElementById('progress').value) === {BROWSER_EPISODES}"
)
"""The page shows the end of the run: finished, every episode counted."""

VIDEOS = (
    "[...document.querySelectorAll('#videos figure')].map(f => {"
    "  const v = f.querySelector('video');"
    "  return {caption: f.querySelector('figcaption').textContent, ready: v.readyState,"
    "          width: v.videoWidth, height: v.videoHeight, duration: v.duration,"
    "          error: v.error && (v.error.code + ': ' + v.error.message)};"
    "})"
)
"""Each recorded video on the page: its caption, how far the browser got with it, its error."""


def wait_on(page: Page, expression: str, what: str, timeout: float = 30.0) -> Any:
    """``expression``'s value in ``page`` once it is truthy, polled at most ``timeout`` s."""
    return wait_for(what, lambda: page.evaluate(expression), timeout, every=0.1)


def check_progress(first: dict, second: dict, shots: list[bytes]) -> None:
    """Between two readings of ``PAGE`` (and the screenshots taken with them) while the run
    went on: progress advanced, every lane's frame was decoded, and new frames came."""
    assert first["status"] == "running"
    assert second["updates"] > first["updates"]
    assert (second["done"], sum(second["steps"])) != (first["done"], sum(first["steps"]))
    assert all(width > 0 for width in first["decoded"])
    assert first["frames"] != second["frames"]  # new frames came
    assert all(shot.startswith(b"\x89PNG\r\n\x1a\n") for shot in shots)
    assert shots[0] != shots[1] and all(len(shot) > 10_000 for shot in shots)


def check_success(page: Page, result: rlmesh.RunResult) -> None:
    """The finished page's one task row: ``result``'s success rate with its interval, and the
    mean return with its interval."""
    (task,) = page.evaluate(PAGE)["tasks"]
    succeeded = sum(bool(episode.success) for episode in result.episodes)
    assert task[0] == "CartPole-v1"
    rate = re.fullmatch(r"([\d.]+)% \[([\d.]+)%, ([\d.]+)%\]", task[1])
    assert rate, task[1]
    low, mid, high = (float(rate.group(k)) for k in (2, 1, 3))
    assert low <= mid <= high and abs(mid - 100 * succeeded / BROWSER_EPISODES) < 0.06
    assert re.fullmatch(r"[\d.,]+ \[[\d.,]+, [\d.,]+\]", task[2]), task[2]


def check_no_console_errors(page: Page) -> None:
    """The page logged no console error and threw no uncaught exception."""
    assert page.console_errors() == []


def check_the_page_follows_a_run(page: Page, tmp_path: Path) -> None:
    """A paced CartPole run on 4 lanes on a thread while ``page`` shows it: progress advances
    between two screenshots (kept in ``tmp_path``), every lane's frame is there, decoded, and
    changes; at the end the task's success rate shows its interval; the page still loads
    after the run; nothing was logged as an error."""
    # Frames as often as the page can show them (the budget is the bench's business).
    with LiveView("http", announce=False, title="cartpole", frame_budget=0.5) as view:
        lanes = view.lanes("CartPole-v1", num_envs=BROWSER_LANES)

        def evaluate():
            return rlmesh.run(
                paced_policy,
                lanes,
                episodes=BROWSER_EPISODES,
                max_episode_steps=150,
                success=100,
                hooks=[view],
            )

        run = RunThread(evaluate)
        try:
            page.navigate(view.url)
            wait_on(
                page,
                "[...document.querySelectorAll('figure.lane img')]"
                f".filter(i => i.complete && i.naturalWidth > 0).length === {BROWSER_LANES}",
                "every lane's frame did not show",
            )
            shots = []
            first = page.evaluate(PAGE)
            shots.append(page.screenshot())
            time.sleep(1.5)  # the run goes on: steps, frames and episodes move
            second = page.evaluate(PAGE)
            shots.append(page.screenshot())
            for name, shot in zip(("first.png", "second.png"), shots, strict=True):
                (tmp_path / name).write_bytes(shot)
            assert run.alive or second["status"] == "finished"
        finally:
            result = run.join()
        check_progress(first, second, shots)

        wait_on(page, FINISHED, "the page did not show the run's end")
        check_success(page, result)

        page.reload()  # after the run, the page still loads, with the final figures
        wait_on(page, FINISHED, "the page did not load after the run")
        check_no_console_errors(page)


def check_recorded_videos_appear_and_play(page: Page, tmp_path: Path) -> None:
    """A recording run's two videos appear on ``page``, opened before the run, as they
    complete, and decode to their first frame at the env's size: the browser plays them."""
    with LiveView("http", announce=False, videos_from=tmp_path) as view:
        lanes = view.lanes(make_image_env, num_envs=2)
        page.navigate(view.url)  # open before the run: the videos come while it runs

        def evaluate():
            return rlmesh.run(
                image_policy,
                lanes,
                episodes=3,
                record_video=2,
                results_path=tmp_path / "r.jsonl",
                hooks=[view],
            )

        run = RunThread(evaluate)
        try:
            # Each video decoded up to its first frame (readyState 2) or failed.
            videos = wait_on(
                page,
                f"(() => {{ const v = {VIDEOS};"
                "  return v.length === 2 && v.every(x => x.ready >= 2 || x.error) && v; })()",
                "two videos did not load",
            )
        finally:
            result = run.join()
        assert [video["error"] for video in videos] == [None, None]
        assert all((video["width"], video["height"]) == IMAGE[1::-1] for video in videos)
        assert all(video["duration"] > 0 for video in videos)
        recorded = {episode.index for episode in result.episodes if episode.video}
        shown = {int(re.search(r"#(\d+)", video["caption"]).group(1)) for video in videos}
        assert shown == recorded and len(shown) == 2
        check_no_console_errors(page)
