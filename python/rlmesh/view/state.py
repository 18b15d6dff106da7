"""The live figures of a run or a results file: ``LiveState``, fed by the view's hooks (or a
file's follower), read as thread-safe snapshots by the page and the terminal table.

Writers (the driver's thread, the frame encoder, a file's follower) hold the lock only to
update counters; the statistics (``rlmesh.stats``: a task's Wilson interval of its success
rate, the bootstrap interval of its mean return) are computed by whoever takes a snapshot,
outside the lock, and the bootstrap is recomputed at most once a second per task, so a
snapshot never stalls the run.

Memory: per task the episodes' returns (8 bytes an episode, for the interval) and counters;
the latest ``MAX_FAILURES`` failures and ``MAX_VIDEOS`` videos (their totals are kept); one
encoded frame per lane; ``RATE_SAMPLES`` completion times for the rate and the ETA.

Example:
    >>> from rlmesh.results import EpisodeResult
    >>> state = LiveState()
    >>> state.begin("CartPole-v1", requested=4)
    >>> for k in range(3):
    ...     state.add_episode(EpisodeResult(k, k, k, 0, 10, 10.0, True, False, k != 1,
    ...                                     0.1, 0.0, 0.0))
    >>> snapshot = state.snapshot()
    >>> snapshot["done"], snapshot["requested"], snapshot["tasks"][0]["succeeded"]
    (3, 4, 2)
    >>> [round(bound, 3) for bound in snapshot["tasks"][0]["success_interval"]]
    [0.208, 0.939]
"""

from __future__ import annotations

import array
import collections
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..stats.intervals import bootstrap_mean_ci, wilson_interval

MAX_FAILURES = 100
"""Failed episodes listed (the latest); their total is always counted."""
MAX_VIDEOS = 24
"""Recorded videos listed (the latest whose files exist)."""
RATE_SAMPLES = 512
"""Completion times kept for the episode rate and the ETA."""
RATE_WINDOW_S = 60.0
"""The episode rate is over the last minute (from the run's start, in its first minute)."""
INTERVAL_EVERY_S = 1.0
"""A task's bootstrap interval of its mean return is recomputed at most this often."""
BOOTSTRAP_RESAMPLES = 1_000
"""Resamples of the live bootstrap: its bounds move by well under their width between two
snapshots, and 1,000 keep it to a millisecond at a few hundred episodes."""

SNAPSHOT_REUSE_S = 0.2
"""While a run runs, one snapshot serves every reader that asks within this many seconds."""

WAITING, RUNNING, FINISHED, FAILED, STALLED = "waiting", "running", "finished", "failed", "stalled"


class TaskFigures:
    """One task's (or a plain run's) figures: counts, returns and the cached interval."""

    def __init__(self, name: str, requested: int | None) -> None:
        self.name = name
        self.requested = requested
        self.done = 0
        self.succeeded = 0
        self.judged = 0  # episodes with a success verdict
        self.failed = 0
        self.steps = 0
        self.return_sum = 0.0
        self.returns = array.array("d")  # the episodes that ran to their end
        # (episodes it covers, when computed, (lo, hi)): the bootstrap is not redone per snapshot.
        self.interval: tuple[int, float, tuple[float, float]] = (0, -math.inf, (math.nan,) * 2)

    def add(self, episode: Any) -> None:
        self.done += 1
        self.steps += episode.steps
        if episode.error is not None:
            self.failed += 1
            return
        self.returns.append(float(episode.reward))
        self.return_sum += float(episode.reward)
        if episode.success is not None:
            self.judged += 1
            self.succeeded += bool(episode.success)


class LiveState:
    """The figures the view shows, thread-safe; ``snapshot()`` is what the page receives.

    Args:
        title: the page's and the table's title.
        video_root: where a recorded episode's ``video`` link is relative to (the results
            file's directory); None: as linked (relative to the working directory).
        clock: seconds, monotonic (for the rate, the ETA and the elapsed time).
    """

    def __init__(
        self,
        title: str = "rlmesh",
        *,
        video_root: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.title = title
        self.video_root = None if video_root is None else Path(video_root)
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.version = 0
        self._watchers = 0
        self._next_video = 0  # ids never reused, so a page never mistakes one video for another
        self._reset()

    def _reset(self) -> None:
        """Every figure as before the first run (the lock, the version and the watchers
        stay)."""
        self.status = WAITING
        self.note: str | None = None
        self._started: float | None = None
        self._ended: float | None = None
        self._tasks: dict[str, TaskFigures] = {}
        self._current: str | None = None
        self._failures: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_FAILURES)
        self._failed_total = 0
        self._completions: collections.deque[tuple[float, int, int]] = collections.deque(
            maxlen=RATE_SAMPLES
        )
        self._live_done = 0
        self._live_steps = 0
        self._lane_steps_per_s: float | None = None
        self._latency: list[dict[str, Any]] = []
        # Lanes: what runs on each (episode, seed), the last episode each completed, its frame.
        self._lanes: list[dict[str, Any]] = []
        self._lane_progress: Callable[[], tuple[Sequence[int], Sequence[float]]] | None = None
        self._frames: dict[int, tuple[bytes, str]] = {}
        self._frame_versions: dict[int, tuple[int, int, int]] = {}  # lane -> (version, w, h)
        self.frames_note: str | None = None
        # Videos: waiting for their file (the encoder renames it when done), then listed.
        self._pending_videos: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=MAX_VIDEOS
        )
        self._videos: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_VIDEOS)
        self._video_paths: dict[int, Path] = {}
        self._memo: tuple[int, bytes] | None = None  # (version, snapshot_json's bytes)
        self._memo_at = -math.inf

    # ------------------------------------------------------------------ writing

    def _touch(self) -> None:
        """Under the lock: a new version, and every waiting reader woken."""
        self.version += 1
        self._changed.notify_all()

    def begin(
        self,
        label: str,
        requested: int | None,
        completed: Iterable[Any] = (),
        *,
        task: str | None = None,
    ) -> None:
        """A run (or a suite's task) starts: ``requested`` episodes of ``label`` (a task of
        that name, made unique if a finished one has it), ``completed`` already done (a
        resumed file's); the run is ``running`` from now on."""
        with self._lock:
            name = task or label
            if name in self._tasks and task is None:
                name = self._unique(name)
            figures = self._tasks.get(name)
            if figures is None:
                figures = self._tasks[name] = TaskFigures(name, requested)
            elif requested is not None:
                figures.requested = requested
            self._current = name
            for episode in completed:
                self._add(episode, name, live=False)
            if self._started is None:
                self._started = self._clock()
                # The rate's first sample: the run's start, before any episode completed.
                self._completions.append((self._started, self._live_done, self._live_steps))
            self._ended = None
            self.status, self.note = RUNNING, None
            self._touch()

    def _unique(self, name: str) -> str:
        number = 2
        while f"{name} ({number})" in self._tasks:
            number += 1
        return f"{name} ({number})"

    def declare_task(self, name: str, requested: int | None) -> None:
        """A task known ahead (a suite file's header lists them), shown before it starts."""
        with self._lock:
            if name not in self._tasks:
                self._tasks[name] = TaskFigures(name, requested)
                self._touch()

    def add_episode(self, episode: Any, *, live: bool = True) -> None:
        """A completed ``EpisodeResult``: counted under its ``task`` (else the current
        run's); ``live`` ones (not read back from a file at first) make the rate."""
        with self._lock:
            self._add(episode, episode.task or self._current or "run", live=live)
            if 0 <= episode.env_index < len(self._lanes):
                self._lanes[episode.env_index]["last"] = {
                    "index": episode.index,
                    "reward": _number(episode.reward),
                    "success": episode.success,
                    "error": episode.error,
                }
            self._touch()

    def _add(self, episode: Any, task: str, *, live: bool) -> None:
        figures = self._tasks.get(task)
        if figures is None:
            figures = self._tasks[task] = TaskFigures(task, None)
        figures.add(episode)
        if episode.error is not None:
            self._failed_total += 1
            self._failures.append({"index": episode.index, "task": task, "error": episode.error})
        if episode.video:
            path = Path(episode.video)
            if self.video_root is not None and not path.is_absolute():
                path = self.video_root / path
            self._pending_videos.append(
                {
                    "index": episode.index,
                    "task": task,
                    "success": episode.success,
                    "reward": _number(episode.reward),
                    "path": path,
                }
            )
        if live:
            self._live_done += 1
            self._live_steps += episode.steps
            self._completions.append((self._clock(), self._live_done, self._live_steps))

    def set_lanes(
        self,
        num_lanes: int,
        progress: Callable[[], tuple[Sequence[int], Sequence[float]]] | None = None,
    ) -> None:
        """The run has ``num_lanes`` lanes; ``progress()`` gives each lane's steps and return
        so far in its episode (read at each snapshot)."""
        with self._lock:
            self._lanes = [{"episode": None, "seed": None, "last": None} for _ in range(num_lanes)]
            self._lane_progress = progress
            # A lane's last frame stays until its next one (a page may be asking for it).
            for lane in [lane for lane in self._frames if lane >= num_lanes]:
                del self._frames[lane], self._frame_versions[lane]
            self._touch()

    def lane_started(self, lane: int, episode: int, seed: int | None) -> None:
        """Episode ``episode`` (seeded ``seed``) started on ``lane``."""
        with self._lock:
            if 0 <= lane < len(self._lanes):
                self._lanes[lane].update(episode=episode, seed=seed)
                self._touch()

    def set_frame(self, lane: int, data: bytes, mime: str, width: int, height: int) -> None:
        """``lane``'s latest frame, encoded (``mime``): it replaces the one before."""
        with self._lock:
            self._frames[lane] = (data, mime)
            self._frame_versions[lane] = (self.version + 1, width, height)
            self._touch()

    def set_frames_note(self, note: str) -> None:
        """Why the lanes show no frames (a lane cannot render, ...), shown on the page."""
        with self._lock:
            self.frames_note = note
            self._touch()

    def set_telemetry(self, rows: Iterable[Any]) -> None:
        """A telemetry window's (or the run's cumulative) ``TelemetryRow``s: the lane-steps
        per second and each op's latency percentiles."""
        latency = []
        rate = None
        for row in rows:
            if row.op == "driver" and row.metric == "lane-steps":
                rate = _number(row.avg)
            elif row.metric == "latency":
                latency.append(
                    {
                        "op": row.op,
                        "count": row.count,
                        **{q: _number(getattr(row, q)) for q in ("p50", "p95", "p99", "max")},
                    }
                )
        with self._lock:
            if rate is not None:
                self._lane_steps_per_s = rate
            if latency:
                self._latency = latency
            self._touch()

    def end(self, error: BaseException | str | None = None) -> None:
        """The run (or task) ended: ``finished``, or ``failed`` with ``error``."""
        with self._lock:
            self._ended = self._clock()
            if error is None:
                self.status, self.note = FINISHED, None
            else:
                self.status = FAILED
                self.note = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            self._touch()

    def set_status(self, status: str, note: str | None = None) -> None:
        """Say what the source is doing (a file's follower: ``running``, ``stalled``, ...)."""
        with self._lock:
            if (self.status, self.note) != (status, note):
                self.status, self.note = status, note
                if status in (FINISHED, FAILED, STALLED) and self._ended is None:
                    self._ended = self._clock()
                elif status == RUNNING:
                    self._ended = None
                    if self._started is None:
                        self._started = self._clock()
                        self._completions.append((self._started, self._live_done, self._live_steps))
                self._touch()

    def clear(self) -> None:
        """Forget every figure (a results file rewritten, a view reused by a new run)."""
        with self._lock:
            self._reset()
            self._touch()

    # ------------------------------------------------------------------ readers

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Count a page that follows the updates while inside (frames are taken only while
        someone watches)."""
        with self._lock:
            self._watchers += 1
            self._touch()
        try:
            yield
        finally:
            with self._lock:
                self._watchers -= 1
                self._touch()

    @property
    def watchers(self) -> int:
        """Pages following the updates now."""
        return self._watchers

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def wait(self, seen: int, timeout: float) -> int:
        """The version, once it is past ``seen`` or ``timeout`` seconds passed."""
        with self._changed:
            if self.version == seen:
                self._changed.wait(timeout)
            return self.version

    def wake(self) -> None:
        """Wake every reader waiting for a change (the view is closing)."""
        with self._lock:
            self._changed.notify_all()

    def frame(self, lane: int) -> tuple[bytes, str] | None:
        """``lane``'s latest encoded frame and its MIME type, or None."""
        with self._lock:
            return self._frames.get(lane)

    def video_path(self, video_id: int) -> Path | None:
        """The file of a listed video (only those: nothing else is ever served)."""
        with self._lock:
            return self._video_paths.get(video_id)

    def snapshot(self) -> dict[str, Any]:
        """Every figure as of now, JSON-ready (no nan: a figure that does not exist is None)."""
        with self._lock:
            raw = self._gather()
        return self._build(raw)

    def snapshot_json(self) -> bytes:
        """A snapshot as strict JSON bytes, shared by every reader (the page's server): built
        once per version, and while a run runs at most once every ``SNAPSHOT_REUSE_S``."""
        return self._memoized()

    def _memoized(self) -> bytes:
        with self._lock:
            memo, now = self._memo, self._clock()
            # While a run runs, its figures move all the time (the lanes' steps without a new
            # version): one snapshot serves every reader for SNAPSHOT_REUSE_S, however many
            # read. Otherwise a snapshot is good until the next version (the run's end, say).
            live = self._lane_progress_live()
            if memo is not None and (
                (live and now - self._memo_at < SNAPSHOT_REUSE_S)
                or (not live and memo[0] == self.version)
            ):
                return memo[1]
            version = self.version
            raw = self._gather()
        data = json.dumps(self._build(raw), allow_nan=False, separators=(",", ":")).encode()
        with self._lock:
            self._memo, self._memo_at = (version, data), now
        return data

    def _lane_progress_live(self) -> bool:
        return self.status == RUNNING

    def _gather(self) -> dict[str, Any]:
        """Under the lock: copies of what a snapshot needs (the statistics come after)."""
        now = self._clock()
        self._list_written_videos()
        tasks = []
        for figures in self._tasks.values():
            stale = figures.interval[0] != len(figures.returns) and (
                now - figures.interval[1] >= INTERVAL_EVERY_S or len(figures.returns) <= 2
            )
            tasks.append(
                (
                    figures,
                    np.frombuffer(figures.returns, dtype=np.float64).copy() if stale else None,
                )
            )
        steps: Sequence[int] = ()
        returns: Sequence[float] = ()
        if self._lane_progress is not None:
            steps, returns = self._lane_progress()
        lanes = []
        for lane, figures in enumerate(self._lanes):
            version, width, height = self._frame_versions.get(lane, (None, None, None))
            lanes.append(
                {
                    "lane": lane,
                    "episode": figures["episode"],
                    "seed": figures["seed"],
                    "step": int(steps[lane]) if lane < len(steps) else None,
                    "return": _number(returns[lane]) if lane < len(returns) else None,
                    "frame": version,
                    "width": width,
                    "height": height,
                    "last": figures["last"],
                }
            )
        return {
            "now": now,
            "tasks": tasks,
            "lanes": lanes,
            "failures": list(self._failures),
            "videos": [
                {key: value for key, value in video.items() if key != "path"}
                for video in self._videos
            ],
            "completions": list(self._completions),
            "head": {
                "title": self.title,
                "status": self.status,
                "note": self.note,
                "version": self.version,
                "watchers": self._watchers,
                "failed_total": self._failed_total,
                "frames_note": self.frames_note,
                "lane_steps_per_s": self._lane_steps_per_s,
                "latency": list(self._latency),
                "elapsed_s": None
                if self._started is None
                else (self._ended if self._ended is not None else now) - self._started,
            },
        }

    def _list_written_videos(self) -> None:
        """Under the lock: list the pending videos whose files now exist (a file is renamed
        into place once written whole, so one that exists is complete)."""
        while self._pending_videos and self._pending_videos[0]["path"].exists():
            video = self._pending_videos.popleft()
            video_id = self._next_video
            self._next_video += 1
            if len(self._videos) == self._videos.maxlen:
                self._video_paths.pop(self._videos[0]["id"], None)
            self._videos.append({"id": video_id, "name": video["path"].name, **video})
            self._video_paths[video_id] = video["path"]

    def _build(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Outside the lock: the statistics, and the snapshot."""
        now = raw["now"]
        tasks = []
        for figures, returns in raw["tasks"]:
            if returns is not None:  # its bootstrap is stale: redo it (it may take ms)
                interval = bootstrap_mean_ci(returns, resamples=BOOTSTRAP_RESAMPLES)
                figures.interval = (len(returns), now, interval)
            count = len(figures.returns)
            tasks.append(
                {
                    "name": figures.name,
                    "done": figures.done,
                    "requested": figures.requested,
                    "failed": figures.failed,
                    "steps": figures.steps,
                    "succeeded": figures.succeeded,
                    "judged": figures.judged,
                    "success_rate": figures.succeeded / figures.judged if figures.judged else None,
                    "success_interval": _pair(wilson_interval(figures.succeeded, figures.judged)),
                    "mean_return": _number(figures.return_sum / count) if count else None,
                    "return_interval": _pair(figures.interval[2]),
                }
            )
        done = sum(task["done"] for task in tasks)
        known = [task["requested"] for task in tasks if task["requested"] is not None]
        requested = sum(known) if known and len(known) == len(tasks) else None
        episodes_per_s, steps_per_s = _rates(raw["completions"], now)
        head = raw["head"]
        # A run's telemetry says its lane-steps per second; a file's follower has only the
        # steps of the episodes it saw complete.
        lane_steps_per_s = head.pop("lane_steps_per_s")
        if lane_steps_per_s is None:
            lane_steps_per_s = steps_per_s
        eta = None
        if requested is not None and episodes_per_s and head["status"] == RUNNING:
            eta = max(0.0, requested - done) / episodes_per_s
        return {
            **head,
            "done": done,
            "requested": requested,
            "episodes_per_s": episodes_per_s,
            "lane_steps_per_s": lane_steps_per_s,
            "eta_s": eta,
            "tasks": tasks,
            "lanes": raw["lanes"],
            "failures": raw["failures"],
            "videos": raw["videos"],
        }


def _rates(completions: list[tuple[float, int, int]], now: float) -> tuple[float | None, ...]:
    """Episodes and episode steps per second, from the sample at the start of the last minute
    (or the first, taken when the run began) to now: a run that stalls slows down."""
    if len(completions) < 2 or completions[-1][1] == completions[0][1]:
        return None, None
    start = completions[0]
    for sample in completions:
        if now - sample[0] < RATE_WINDOW_S:
            break
        start = sample
    last = completions[-1]
    span = now - start[0]
    if span <= 0 or last[1] == start[1]:
        return None, None
    return (last[1] - start[1]) / span, (last[2] - start[2]) / span


def _number(value: Any) -> float | None:
    """A JSON-ready float: None for nan, inf and None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _pair(interval: tuple[float, float]) -> list[float | None] | None:
    lo, hi = (_number(bound) for bound in interval)
    return None if lo is None or hi is None else [lo, hi]
