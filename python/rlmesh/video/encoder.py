"""The mp4 encoder of a run: one background thread fed through a bounded queue.

The driver hands frames over (``frame``) and goes on; the thread writes them to ``ffmpeg``
through ``imageio`` (the ``video`` extra; ``imageio-ffmpeg`` ships the binary). The queue holds
at most ``queue_frames`` frames, so memory is bounded: when it is full the driver waits for
the encoder, and no frame is ever dropped. Each video is written under a temporary name
(``<name>.partial.mp4``) and renamed to its final name once ffmpeg has closed it, so a crash
never leaves a half-written file under the name a results file links to.

An error while encoding (ffmpeg missing or failing, a full disk, a frame of another size
than the video's first) fails that video only: its temporary file is removed, the thread
goes on with the other videos and keeps draining the queue, and ``close`` raises a
``VideoError`` naming every video that failed.

Example:
    >>> import numpy as np, tempfile
    >>> from pathlib import Path
    >>> out = Path(tempfile.mkdtemp())
    >>> encoder = VideoEncoder()
    >>> encoder.open("a", out / "a.mp4", fps=10)
    >>> for k in range(5):
    ...     encoder.frame("a", np.full((32, 48, 3), 50 * k, dtype=np.uint8))
    >>> encoder.finish("a")
    >>> encoder.close()
    >>> sorted(path.name for path in out.iterdir())
    ['a.mp4']
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RlmeshError

QUEUE_FRAMES = 32
"""Frames the queue holds before the driver waits for the encoder: memory stays at most
this many frames (a 600x400 frame is 720 kB)."""
PARTIAL_SUFFIX = ".partial.mp4"
"""What a video in progress is named with instead of ``.mp4``."""


class VideoError(RlmeshError):
    """A video could not be recorded or written.

    Raised by the run once it has closed (the episode results are complete and on file; the
    error carries them as ``err.partial_result``), naming each episode whose video failed and
    why. Episode lines in the results file still link these videos, which do not exist.
    """


def partial_path(path: Path) -> Path:
    """Where the video bound for ``path`` is written until it is complete."""
    return path.with_name(path.name.removesuffix(".mp4") + PARTIAL_SUFFIX)


class _Video:
    """One open video: its final path, its ffmpeg writer (started on the first frame) and the
    frame shape every later frame must have."""

    def __init__(self, path: Path, fps: float) -> None:
        self.path = path
        self.fps = fps
        self.writer: Any = None
        self.shape: tuple[Any, ...] | None = None
        self.frames = 0

    def write(self, frame: np.ndarray) -> None:
        if self.writer is None:
            import imageio.v2 as imageio

            # imageio-ffmpeg otherwise starts ffmpeg with preexec_fn=os.setpgrp, which is not
            # safe with threads running (gRPC's, this encoder's): the child can die or hang
            # before exec, and the run then writes into a dead or never-read pipe.
            os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")
            self.shape = (frame.shape, frame.dtype)
            self.writer = imageio.get_writer(
                partial_path(self.path),
                format="FFMPEG",
                mode="I",
                fps=self.fps,
                codec="libx264",
                pixelformat="yuv420p",
                macro_block_size=1,  # sizes are made even below, never rescaled
                ffmpeg_log_level="error",
                # A third of the default preset's CPU, for files no larger: the encoder
                # shares the machine with the run.
                ffmpeg_params=["-preset", "veryfast"],
            )
        elif (frame.shape, frame.dtype) != self.shape:
            raise ValueError(
                f"frame {self.frames} has shape {frame.shape} dtype {frame.dtype}, but the "
                f"video's first frame had shape {self.shape[0]} dtype {self.shape[1]}: every "
                f"frame of a video must have one size and dtype"
            )
        self.writer.append_data(_even_rgb(frame))
        self.frames += 1

    def finish(self) -> None:
        if self.writer is None:
            raise ValueError("the video has no frames")
        self.writer.close()
        os.replace(partial_path(self.path), self.path)

    def discard(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):  # it failed already: only cleaning up
                self.writer.close()
        with contextlib.suppress(FileNotFoundError):
            partial_path(self.path).unlink()


def _even_rgb(frame: np.ndarray) -> np.ndarray:
    """``frame`` as ``[H', W', 3]`` with even ``H'``, ``W'`` (what yuv420p needs): a grey
    frame repeated over three channels, an odd edge padded with one black row or column."""
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    height, width = frame.shape[:2]
    if height % 2 or width % 2:
        frame = np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)))
    return frame


class VideoEncoder:
    """Writes mp4 videos on a background thread, from frames queued by ``frame``.

    Videos are keyed by any hashable (the recorder uses the episode index); several may be
    open at once. Calls must come from one thread (the driver's).

    Args:
        queue_frames: frames queued at most before ``frame`` waits for the encoder.
    """

    def __init__(self, queue_frames: int = QUEUE_FRAMES) -> None:
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=queue_frames)
        self._videos: dict[Any, _Video] = {}  # the thread's own
        self._failures: dict[Any, str] = {}  # key -> what went wrong, first failure only
        self._paths: dict[Any, Path] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="rlmesh-video", daemon=True)
        self._thread.start()

    def open(self, key: Any, path: str | os.PathLike[str], *, fps: float) -> None:
        """Start the video ``key``, to be written to ``path`` (an ``.mp4``) at ``fps``."""
        path = Path(path)
        self._paths[key] = path
        self._put(("open", key, path, float(fps)))

    def frame(self, key: Any, frame: np.ndarray) -> None:
        """Queue one frame (``[H, W, 3]`` or ``[H, W]`` uint8) of the video ``key``; waits
        while the queue is full. The caller hands the array over: it must not change it."""
        self._put(("frame", key, frame))

    def finish(self, key: Any) -> None:
        """The video ``key`` is complete: close it and give it its final name."""
        self._put(("finish", key))

    def discard(self, key: Any) -> None:
        """Drop the video ``key`` (its episode did not complete): no file is left of it."""
        self._put(("discard", key))

    @property
    def failures(self) -> dict[Any, str]:
        """The videos that failed so far: key -> why."""
        with self._lock:
            return dict(self._failures)

    def close(self) -> None:
        """Write what is queued, drop the videos still open (their episodes did not
        complete), stop the thread and wait for it. Closing again does nothing.

        Raises:
            VideoError: some video failed; the message names each, with its path and why.
        """
        if not self._closed:
            self._closed = True
            self._put(("close", None))
            self._put(None)
            self._thread.join()
        failures = self.failures
        if failures:
            lines = "; ".join(
                f"{key} ({self._paths.get(key, '?')}): {why}" for key, why in failures.items()
            )
            raise VideoError(f"{len(failures)} video(s) could not be written: {lines}")

    def _put(self, item: tuple[Any, ...] | None) -> None:
        while True:
            try:
                self._queue.put(item, timeout=1.0)
                return
            except queue.Full:
                if not self._thread.is_alive():  # cannot happen: the thread catches everything
                    raise VideoError("the video encoder thread stopped") from None

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, key, *rest = item
            try:
                if kind == "close":
                    for open_key in list(self._videos):
                        self._videos.pop(open_key).discard()
                    continue
                if key in self._failures:
                    continue  # a failed video's later frames are dropped with it
                if kind == "open":
                    self._videos[key] = _Video(*rest)
                elif kind == "frame":
                    self._videos[key].write(rest[0])
                elif kind == "finish":
                    self._videos.pop(key).finish()
                elif kind == "discard":
                    self._videos.pop(key).discard()
            except Exception as err:
                with self._lock:
                    self._failures[key] = f"{type(err).__name__}: {err}"
                video = self._videos.pop(key, None)
                if video is not None:
                    video.discard()
