"""The mp4 encoder of a run: one background thread, fed frames in batches, bounded in bytes.

The driver hands frames over (``frame``) and goes on: each is copied into its video's batch,
one array of up to ``batch_bytes``, which goes to the thread once full, so the thread wakes
(and takes the interpreter's lock) once a batch, not once a frame. The thread writes each
batch whole to an ``ffmpeg`` process (the binary ``imageio-ffmpeg`` ships, the ``video``
extra) that encodes it to H.264 on one thread, at a lower scheduling priority than the run (on
Linux): when the machine has no core to spare, the run's own work wins the CPU and the encoder
catches up later, at the latest while the run waits for it at its end.

Memory is bounded: the batches handed over and not yet written hold at most ``queue_bytes``
(plus one batch in progress per open video); when that is full the driver waits for the
encoder, and no frame is ever dropped. Each video is written under a temporary name
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

import collections
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RlmeshError

QUEUE_BYTES = 64 * 2**20
"""Bytes of frames handed to the encoder and not yet written before the driver waits for it:
about 1,100 frames of 120x160 RGB, 90 of 480x640. Enough that a run recording its first
episodes rarely waits, and the encoder catches up while the run goes on."""
BATCH_BYTES = 2**20
"""Bytes of frames a video gathers before they go to the encoder's thread together (18
frames of 120x160 RGB; a frame larger than that goes alone)."""
ENCODER_NICENESS = 10
"""How much lower than the run's the ffmpeg processes' scheduling priority is (Linux)."""
PARTIAL_SUFFIX = ".partial.mp4"
"""What a video in progress is named with instead of ``.mp4``."""
# H.264 at the quality imageio's writers default to (crf 25), a third of the default preset's
# CPU for files no larger, on one thread: frame threads buy a small frame nothing, and the
# encoder shares the machine with the run.
_X264 = ("-vcodec", "libx264", "-preset", "veryfast", "-crf", "25", "-threads", "1")


class VideoError(RlmeshError):
    """A video could not be recorded or written.

    Raised by the run once it has closed (the episode results are complete and on file; the
    error carries them as ``err.partial_result``), naming each episode whose video failed and
    why. Episode lines in the results file still link these videos, which do not exist.
    """


def partial_path(path: Path) -> Path:
    """Where the video bound for ``path`` is written until it is complete."""
    return path.with_name(path.name.removesuffix(".mp4") + PARTIAL_SUFFIX)


def ffmpeg_command(path: Path, shape: tuple[int, ...], fps: float) -> list[str]:
    """The ffmpeg command that encodes raw ``shape`` frames (``[H, W, 3]`` RGB or ``[H, W]``
    grey, uint8) read from its stdin into the mp4 ``path`` at ``fps``: yuv420p (what players
    take), an odd side padded with one black row or column (yuv420p needs even sides)."""
    import imageio_ffmpeg

    height, width = shape[:2]
    return [
        imageio_ffmpeg.get_ffmpeg_exe(),
        "-hide_banner",
        "-loglevel",
        "error",
        "-y",
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24" if len(shape) == 3 else "gray",
        "-s",
        f"{width}x{height}",
        "-r",
        str(Fraction(fps).limit_denominator()),
        "-i",
        "-",
        "-an",
        "-vf",
        "pad=ceil(iw/2)*2:ceil(ih/2)*2",
        *_X264,
        "-pix_fmt",
        "yuv420p",
        str(path),
    ]


def _lower_priority() -> None:
    """Lower the calling thread's scheduling priority by ``ENCODER_NICENESS`` (Linux, where a
    thread has its own and a process it starts inherits it); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):  # a sandbox may refuse: the encoding is the same
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + ENCODER_NICENESS))


def start_ffmpeg(command: list[str], stderr: Any) -> subprocess.Popen[bytes]:
    """``command`` started with its stdin a pipe, at a lower priority than the run: from a
    short-lived thread whose own priority is lowered first (the encoder's thread, which the
    run's thread waits on when the queue is full, keeps the run's priority)."""
    started: dict[str, Any] = {}

    def start() -> None:
        _lower_priority()
        try:
            started["process"] = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr
            )
        except BaseException as err:  # handed to the caller's thread
            started["error"] = err

    thread = threading.Thread(target=start, name="rlmesh-video-start", daemon=True)
    thread.start()
    thread.join()
    if "error" in started:
        raise started["error"]
    return started["process"]


class _Video:
    """One open video: its final path, its ffmpeg process (started on the first frame) and
    the frame shape every later frame must have."""

    def __init__(self, path: Path, fps: float) -> None:
        self.path = path
        self.fps = fps
        self.process: subprocess.Popen[bytes] | None = None
        self.errors: Any = None  # ffmpeg's stderr, a temporary file (no pipe to fill)
        self.shape: tuple[Any, ...] | None = None
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        """Write ``frames`` (``[n, *frame]``, C-contiguous: a batch) in one call."""
        shape = (frames.shape[1:], frames.dtype)
        if self.process is None:
            frame = frames.shape[1:]
            if frames.dtype != np.uint8 or not (
                len(frame) == 2 or (len(frame) == 3 and frame[2] == 3)
            ):
                raise ValueError(
                    f"the first frame has shape {frame} dtype {frames.dtype}: a video's frames "
                    f"are [H, W, 3] or [H, W] uint8 arrays"
                )
            self.shape = shape
            self.errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by finish or discard)
            command = ffmpeg_command(partial_path(self.path), frames.shape[1:], self.fps)
            self.process = start_ffmpeg(command, self.errors)
        elif shape != self.shape:
            raise ValueError(
                f"frame {self.frames} has shape {shape[0]} dtype {shape[1]}, but the video's "
                f"first frame had shape {self.shape[0]} dtype {self.shape[1]}: every frame of "
                f"a video must have one size and dtype"
            )
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(frames)
        except OSError:  # ffmpeg stopped: what it said is the error
            self._raise_if_failed(self.process.wait())
            raise
        self.frames += len(frames)

    def finish(self) -> None:
        if self.process is None:
            raise ValueError("the video has no frames")
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # ffmpeg stopped: its status says why, below
            self.process.stdin.close()
        self._raise_if_failed(self.process.wait())
        self.errors.close()
        os.replace(partial_path(self.path), self.path)

    def _raise_if_failed(self, status: int) -> None:
        if status != 0:
            self.errors.seek(0)
            said = self.errors.read().decode(errors="replace").strip()
            raise RuntimeError(f"ffmpeg exited with status {status}: {said or 'no message'}")

    def discard(self) -> None:
        if self.process is not None:
            with contextlib.suppress(Exception):  # it failed already: only cleaning up
                self.process.kill()
                self.process.wait()
                self.process.stdin.close()
            with contextlib.suppress(Exception):
                self.errors.close()
        with contextlib.suppress(FileNotFoundError):
            partial_path(self.path).unlink()


class _Batch:
    """Frames of one video gathered on the driver's thread: an array of ``[capacity, *frame]``
    filled from the front."""

    __slots__ = ("count", "frames")

    def __init__(self, first: np.ndarray, batch_bytes: int) -> None:
        capacity = max(1, batch_bytes // max(1, first.nbytes))
        self.frames = np.empty((capacity, *first.shape), first.dtype)
        self.count = 0

    def takes(self, frame: np.ndarray) -> bool:
        return frame.shape == self.frames.shape[1:] and frame.dtype == self.frames.dtype


class _ByteQueue:
    """A FIFO between one producer and one consumer: at most ``limit`` bytes of items put and
    not yet ``done`` (one item of any size when there are none)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes put and not yet done
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._changed = threading.Condition()

    def put(self, item: Any, size: int, alive: Any) -> None:
        with self._changed:
            while self.held and self.held + size > self.limit:
                if not self._changed.wait(timeout=1.0) and not alive():
                    # cannot happen: the thread catches everything
                    raise VideoError("the video encoder thread stopped")
            self._items.append((item, size))
            self.held += size
            self._changed.notify()

    def get(self) -> tuple[Any, int]:
        with self._changed:
            while not self._items:
                self._changed.wait()
            return self._items.popleft()

    def done(self, size: int) -> None:
        with self._changed:
            self.held -= size
            self._changed.notify()


class VideoEncoder:
    """Writes mp4 videos on a background thread, from frames queued by ``frame``.

    Videos are keyed by any hashable (the recorder uses the episode index); several may be
    open at once. Calls must come from one thread (the driver's).

    Args:
        queue_bytes: bytes of frames handed over and not yet written at most before
            ``frame`` waits for the encoder (a batch larger than that is still taken, alone).
        batch_bytes: bytes of frames a video gathers before they are handed over together
            (at least one frame).
    """

    def __init__(self, queue_bytes: int = QUEUE_BYTES, batch_bytes: int = BATCH_BYTES) -> None:
        self._queue = _ByteQueue(queue_bytes)
        self._batch_bytes = batch_bytes
        self._batches: dict[Any, _Batch | None] = {}  # the driver's: frames not yet sent
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
        self._batches[key] = None
        self._put(("open", key, path, float(fps)))

    def frame(self, key: Any, frame: np.ndarray) -> None:
        """Queue a copy of one frame (``[H, W, 3]`` or ``[H, W]`` uint8) of the video ``key``;
        waits while the queue is full. The caller may change or reuse ``frame`` afterwards."""
        frame = np.asarray(frame)
        batch = self._batches[key]
        if batch is not None and not batch.takes(frame):
            self._send(key)  # the thread fails the video: its frames change size
            batch = None
        if batch is None:
            batch = self._batches[key] = _Batch(frame, self._batch_bytes)
        batch.frames[batch.count] = frame
        batch.count += 1
        if batch.count == len(batch.frames):
            self._send(key)

    def finish(self, key: Any) -> None:
        """The video ``key`` is complete: close it and give it its final name."""
        self._send(key)
        del self._batches[key]
        self._put(("finish", key))

    def discard(self, key: Any) -> None:
        """Drop the video ``key`` (its episode did not complete): no file is left of it."""
        self._batches.pop(key, None)
        self._put(("discard", key))

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames handed to the thread and not yet written."""
        return self._queue.held

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
            self._batches.clear()
            self._put(("close", None))
            self._put(None)
            self._thread.join()
        failures = self.failures
        if failures:
            lines = "; ".join(
                f"{key} ({self._paths.get(key, '?')}): {why}" for key, why in failures.items()
            )
            raise VideoError(f"{len(failures)} video(s) could not be written: {lines}")

    def _send(self, key: Any) -> None:
        batch = self._batches[key]
        if batch is not None:
            self._batches[key] = None
            frames = batch.frames[: batch.count]
            self._put(("frames", key, frames), frames.nbytes)

    def _put(self, item: tuple[Any, ...] | None, size: int = 0) -> None:
        self._queue.put(item, size, self._thread.is_alive)

    def _serve(self) -> None:
        while True:
            item, size = self._queue.get()
            try:
                if item is None:
                    return
                self._handle(*item)
            finally:
                self._queue.done(size)

    def _handle(self, kind: str, key: Any, *rest: Any) -> None:
        try:
            if kind == "close":
                for open_key in list(self._videos):
                    self._videos.pop(open_key).discard()
                return
            if key in self._failures:
                return  # a failed video's later frames are dropped with it
            if kind == "open":
                self._videos[key] = _Video(*rest)
            elif kind == "frames":
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
