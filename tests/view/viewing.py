"""What the live view's tests share: a run in a thread, a paced CartPole policy, an image env,
and bounded clients of the page's server (raw sockets and urllib, every loop bounded in
count and time)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

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
