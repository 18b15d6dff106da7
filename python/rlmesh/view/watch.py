"""Following a results file another process writes (``rlmesh watch FILE``): ``ResultsFollower``
reads it through the one reader (``rlmesh.results.reader``) whenever it grew, and feeds a
``LiveState`` the episodes it had not seen, so the page and the terminal table show a run in
another terminal, a Ray coordinator's file, or a complete file (then it is the report, and
it reloads when a resumption appends).

Each read parses only the lines the file gained since the last (``read_appended``). A file
still being written may end in a line cut off mid-write: the reader sets it aside
(``FileContents.dropped``) and the next read, once the line is whole, has it. A file that no
longer holds what was read (shorter, another header: rewritten) or another file under the
name (another inode: a rerun that replaced it) is read again from its start. The status
says ``running`` while the file grows, ``stalled`` when it has not changed for
``stalled_after`` seconds and is not complete, and ``finished`` when it holds every episode
it asks for.

The first read of a large file parses all of it, so after a read that took more than
``SLOW_READ_S`` the follower waits at least ``PARSE_SHARE`` times as long before the next:
reading never takes more than a fifth of one core.

Example:
    >>> import os, tempfile
    >>> from rlmesh.results import EpisodeResult, ResultsFile
    >>> from rlmesh.view.state import LiveState
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> with ResultsFile.open(path, {"env": "CartPole-v1", "episodes": 2}, resume=False) as out:
    ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
    >>> follower = ResultsFollower(path, LiveState())
    >>> follower.poll()  # the new episodes
    1
    >>> follower.state.snapshot()["done"], follower.state.snapshot()["requested"]
    (1, 2)
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ResultsFileError
from ..results import SUITE_KEY, FileContents
from ..results.lines import config, file_fields
from ..results.reader import read_appended
from .state import FINISHED, RUNNING, STALLED, WAITING, LiveState

POLL_EVERY_S = 0.5
"""Seconds between two looks at the file's size and time."""
STALLED_AFTER_S = 30.0
PARSE_SHARE = 4.0
"""After a read that took t seconds (more than ``SLOW_READ_S``), the next waits at least this
many times t."""
SLOW_READ_S = 0.05


class ResultsFollower:
    """Feeds ``state`` with what the results file at ``path`` holds, read again whenever it
    changed (``poll``, or ``start`` for a thread that polls until ``close``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        state: LiveState,
        *,
        poll_every: float = POLL_EVERY_S,
        stalled_after: float = STALLED_AFTER_S,
    ) -> None:
        self.path = Path(path)
        self.state = state
        if state.video_root is None:
            state.video_root = self.path.resolve().parent  # videos are linked from its directory
        self.poll_every = poll_every
        self.stalled_after = stalled_after
        self.reads = 0
        self._seen_stat: tuple[int, ...] | None = None
        self._contents: FileContents | None = None  # what the reader read so far
        self._header: dict[str, Any] | None = None  # the header fed to the state
        self._episodes = 0  # episodes of the file fed to the state
        self._runs = 0  # run segments of the file whose telemetry the state shows
        self._changed_at = time.monotonic()
        self._next_read = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def poll(self) -> int:
        """Read the file if it changed since the last look; the number of new episodes."""
        now = time.monotonic()
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            self.state.set_status(WAITING, f"{self.path}: {exc.strerror}; waiting for it")
            return 0
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key == self._seen_stat or now < self._next_read:
            self._say_status(now)
            return 0
        if self._seen_stat is not None and key[:2] != self._seen_stat[:2]:
            self._contents = None  # another file under that name: read it from its start
        started = time.perf_counter()
        try:
            contents = self._read()
        except ResultsFileError as exc:
            self.error = str(exc)
            self.state.set_status(WAITING, f"cannot read it: {exc}")
            self._seen_stat = key
            return 0
        self.reads += 1
        took = time.perf_counter() - started
        self._next_read = now + PARSE_SHARE * took if took > SLOW_READ_S else 0.0
        self._seen_stat = key
        self._changed_at = now
        self.error = None
        added = self._feed(contents)
        self._say_status(now)
        return added

    def _read(self) -> FileContents:
        """The file's contents: what was read before and the lines it gained. A read that
        starts afresh (the reader's new ``FileContents``) forgets what the state was fed."""
        previous = self._contents
        try:
            contents = read_appended(self.path, previous)
        except ResultsFileError:
            if previous is None:
                raise
            # A rewrite the reader's cheap look missed reads as a bad or repeated line after
            # what was read: the whole file decides (and its error is the one to show).
            contents = read_appended(self.path, None)
        if contents is not previous:
            self._contents = contents
            if self._header is not None:
                self.state.clear()  # rewritten or replaced: read from scratch
                self._header, self._episodes, self._runs = None, 0, 0
        return contents

    def _feed(self, contents: FileContents) -> int:
        if contents.header is None:
            self.state.set_status(WAITING, f"{self.path} holds no header yet")
            return 0
        first = self._header is None
        if first:
            self._header = contents.header
            self._begin(contents.header)
        new = contents.episodes[self._episodes :]
        for episode in new:
            self.state.add_episode(episode, live=not first)
        self._episodes = len(contents.episodes)
        if len(contents.runs) != self._runs:
            self._runs = len(contents.runs)
            self.state.set_telemetry(file_fields(contents.header, contents.runs)["telemetry"])
        return len(new)

    def _begin(self, header: dict[str, Any]) -> None:
        """The file's tasks (a suite's header lists them) and episodes asked for."""
        settings = config(header)
        tasks = settings.get(SUITE_KEY)
        if isinstance(tasks, list):
            for task in tasks:
                if isinstance(task, dict) and isinstance(task.get("name"), str):
                    episodes = task.get("episodes")
                    self.state.declare_task(
                        task["name"], episodes if isinstance(episodes, int) else None
                    )
            self.state.begin(self.path.name, None, task=_first_task(tasks))
        else:
            requested = settings.get("episodes")
            self.state.begin(
                str(settings.get("env", self.path.name)),
                requested if isinstance(requested, int) else None,
            )

    def _say_status(self, now: float) -> None:
        if self._header is None:
            return
        snapshot = self.state.snapshot()
        requested = snapshot["requested"]
        if requested is not None and snapshot["done"] >= requested:
            self.state.set_status(FINISHED)
        elif now - self._changed_at > self.stalled_after:
            self.state.set_status(
                STALLED, f"{self.path} has not changed for {now - self._changed_at:.0f} s"
            )
        else:
            self.state.set_status(RUNNING)

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Poll from a thread of its own until ``close``."""
        self.poll()
        self._thread = threading.Thread(target=self._run, name="rlmesh-view-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_every):
            self.poll()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _first_task(tasks: list[Any]) -> str | None:
    for task in tasks:
        if isinstance(task, dict) and isinstance(task.get("name"), str):
            return task["name"]
    return None
