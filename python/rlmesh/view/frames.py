"""The lanes' frames for the page: taken at most a few times a second per lane, within a
budget of the run's time, encoded off the hot path, dropped when the encoder (or the page)
cannot keep up.

``FrameSampler`` runs one thread. While a page watches (``LiveState.watchers``) it marks the
lanes as due, one at a time in turn (``due[lane] = True``), skipping a lane whose last frame
still waits to be encoded. The lanes' step (``rlmesh.view.lanes``) checks its lane's flag, a
list lookup, and only when it is set takes a frame (``render()`` or the observation's image)
and hands it over (``take``): shrunk by a whole stride to at most ``max_side`` pixels a side
and copied. That, with the ``render()``, is all the run pays, and the sampler keeps it within
``budget``, a share of the run's wall time: it times each take (``spent``) and spaces its
marks at least ``cost / budget`` apart, so an env whose ``render()`` takes 3 ms shows each
of 8 lanes about once a second at the default 2%, and a cheap one each lane every
``interval``. The thread encodes the frames (JPEG through Pillow when it is installed, else
PNG with ``zlib``, rlmesh's own encoder) and gives them to the state, which keeps one frame
per lane. A lane holds at most one frame waiting: a newer one replaces it (``dropped`` counts
those), so memory is bounded by lanes x one shrunk frame, whatever the page does.

Example:
    >>> import numpy as np
    >>> frame = np.zeros((400, 600, 3), dtype=np.uint8)
    >>> shrink(frame, 320).shape
    (200, 300, 3)
    >>> data, mime = encode_frame(np.full((8, 8, 3), 200, dtype=np.uint8))
    >>> mime in ("image/jpeg", "image/png"), len(data) > 0
    (True, True)
"""

from __future__ import annotations

import functools
import io
import logging
import threading
import time
from typing import Any

import numpy as np

from ..remote.png import encode_png
from .state import LiveState

logger = logging.getLogger("rlmesh")

FRAME_INTERVAL_S = 0.5
"""Seconds between two frames of one lane (2 a second) at most, while a page watches."""
FRAME_BUDGET = 0.02
"""The share of the run's wall time its thread may spend taking frames."""
_FIRST_COST_S = 0.002  # what a take is assumed to cost until one is timed
_COST_WEIGHT = 0.2  # the weight of the latest take in the running estimate of a take's cost
MAX_SIDE = 320
"""A frame is shrunk by a whole stride until no side is longer than this."""
JPEG_QUALITY = 75


def frame_problem(frame: Any) -> str | None:
    """Why ``frame`` cannot be shown (it is not ``[H, W]`` / ``[H, W, 3 or 4]`` uint8), or None.

    Example:
        >>> frame_problem(np.zeros((4, 4, 3), np.uint8)) is None, frame_problem(None)
        (True, 'got NoneType, expected an [H, W, 3] or [H, W] uint8 array')
    """
    if (
        isinstance(frame, np.ndarray)
        and frame.dtype == np.uint8
        and (frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] in (3, 4)))
        and frame.size
    ):
        return None
    shape = getattr(frame, "shape", None)
    described = type(frame).__name__ if shape is None else f"shape {shape} dtype {frame.dtype}"
    return f"got {described}, expected an [H, W, 3] or [H, W] uint8 array"


def shrink(frame: np.ndarray, max_side: int) -> np.ndarray:
    """``frame`` every k-th pixel (the least whole k that brings both sides to ``max_side`` or
    less), as a contiguous copy of its RGB (or grey) channels."""
    stride = max(1, -(-max(frame.shape[0], frame.shape[1]) // max_side))
    view = frame[::stride, ::stride]
    if view.ndim == 3 and view.shape[2] == 4:
        view = view[:, :, :3]
    return np.array(view, order="C", copy=True)


@functools.cache
def _pillow() -> Any:
    """Pillow's ``Image``, or None without Pillow (imported at the first frame, not with the
    package)."""
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def encode_frame(frame: np.ndarray, quality: int = JPEG_QUALITY) -> tuple[bytes, str]:
    """``frame`` (``[H, W(, 3)]`` uint8) as JPEG (with Pillow) or PNG bytes, and its MIME type."""
    image = _pillow()
    if image is not None:
        out = io.BytesIO()
        image.fromarray(frame).save(out, format="JPEG", quality=quality)
        return out.getvalue(), "image/jpeg"
    return encode_png(frame), "image/png"


class FrameSampler:
    """Says when each lane's frame is due, and encodes the frames taken, on one thread.

    Args:
        state: where the encoded frames go (``LiveState.set_frame``), and who watches.
        num_lanes: the run's lanes.
        interval: seconds between two frames of a lane, at least.
        max_side: the longest side of a frame as shown.
        budget: the share of the run's wall time spent taking frames, at most.

    Attributes:
        due: per lane, whether its next step should take a frame (the lanes read it).
        taken, dropped, encoded: frames handed over, replaced before they were encoded, and
            encoded.
        cost: the running estimate of one take's seconds on the run's thread.
    """

    def __init__(
        self,
        state: LiveState,
        num_lanes: int,
        *,
        interval: float = FRAME_INTERVAL_S,
        max_side: int = MAX_SIDE,
        budget: float = FRAME_BUDGET,
    ) -> None:
        self.state = state
        self.num_lanes = num_lanes
        self.interval = interval
        self.max_side = max_side
        self.budget = budget
        self.due = [False] * num_lanes
        self.taken = self.dropped = self.encoded = 0
        self.cost = _FIRST_COST_S
        self._pending: dict[int, np.ndarray] = {}  # lane -> its shrunk frame, to encode
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._failed = False
        self._next_lane = 0
        self._thread = threading.Thread(target=self._work, name="rlmesh-view-frames", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Frames waiting to be encoded (at most one per lane)."""
        return len(self._pending)

    @property
    def gap(self) -> float:
        """Seconds between two marks: a lane's turn comes every ``interval``, unless the
        takes' cost needs the marks further apart to keep within the budget."""
        return max(self.interval / self.num_lanes, self.cost / self.budget)

    def take(self, lane: int, frame: Any) -> None:
        """The run's thread: ``lane``'s frame, to show. A frame that cannot be shown stops
        the frames (the page says why); the run goes on."""
        self.due[lane] = False
        if self._failed:
            return
        problem = frame_problem(frame)
        if problem is not None:
            self.stop(f"lane {lane}: the frame {problem}")
            return
        small = shrink(frame, self.max_side)
        with self._lock:
            if lane in self._pending:
                self.dropped += 1
            self._pending[lane] = small
            self.taken += 1
        self._wake.set()

    def spent(self, seconds: float) -> None:
        """The run's thread: one take (its ``render()`` included) took ``seconds``."""
        self.cost += _COST_WEIGHT * (seconds - self.cost)

    def stop(self, note: str) -> None:
        """Take no more frames, and say why on the page."""
        self._failed = True
        for lane in range(self.num_lanes):  # in place: the lanes hold this list
            self.due[lane] = False
        self.state.set_frames_note(note)

    def close(self) -> None:
        """Stop the thread (frames waiting are dropped)."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _work(self) -> None:
        next_mark = time.monotonic()
        while not self._closed.is_set():
            self._wake.wait(max(0.0, next_mark - time.monotonic()))
            self._wake.clear()
            if self._closed.is_set():
                return
            self._encode_pending()
            now = time.monotonic()
            if now < next_mark:
                continue  # woken by a frame taken
            next_mark = now + self.gap
            if not self._failed and self.state.watchers:
                self._mark_next()

    def _mark_next(self) -> None:
        """Mark the next lane in turn that has no frame waiting (none if all have)."""
        with self._lock:
            waiting = set(self._pending)
        for offset in range(self.num_lanes):
            lane = (self._next_lane + offset) % self.num_lanes
            if lane not in waiting and not self.due[lane]:
                # A list of bools the run's thread reads: each store is atomic.
                self.due[lane] = True
                self._next_lane = lane + 1
                return

    def _encode_pending(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                lane = next(iter(self._pending))
                frame = self._pending.pop(lane)
            try:
                data, mime = encode_frame(frame)
            except Exception as exc:  # a frame the encoder refuses: say so, stop taking them
                logger.warning("rlmesh view: cannot encode lane %d's frame: %r", lane, exc)
                self.stop(f"lane {lane}: its frame could not be encoded ({exc!r})")
                return
            self.encoded += 1
            self.state.set_frame(lane, data, mime, int(frame.shape[1]), int(frame.shape[0]))
