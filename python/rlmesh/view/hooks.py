"""``LiveView``: the live view of a run, as a runtime hook (``rlmesh.RuntimeHooks``) that
feeds its ``LiveState``, with the page's server and the terminal table it opens.

The hook listens to the run's start and end, each episode's start and end, and the telemetry
windows: never to a step, so the driver keeps its fast path (the core runs whole rounds)
with the view on. What happens on each lane between an episode's start and end comes from
the lanes: ``LiveView.wrap(lanes)`` (``rlmesh.view.lanes.ViewLanes``) takes their frames,
and either counts each lane's steps and return itself (``LiveView.lanes(...)``, passed as
the run's ``env=``: hooks alone) or reads them from the run's core (a driver that wraps its
lanes with ``lane_figures=``; then the run pays nothing per step).

Use::

    view = rlmesh.view.LiveView("http")      # prints its URL; "http:PORT", "terminal", "both"
    result = rlmesh.run(model, view.lanes("CartPole-v1", num_envs=8), episodes=100,
                        hooks=[view])
    view.close()                             # the page stays up until then

Example:
    >>> import rlmesh
    >>> with LiveView("http", announce=False) as view:
    ...     result = rlmesh.run(lambda obs: int(obs[2] > 0), view.lanes("CartPole-v1",
    ...                         num_envs=2), episodes=4, hooks=[view])
    ...     snapshot = view.state.snapshot()
    >>> snapshot["status"], snapshot["done"], snapshot["tasks"][0]["name"]
    ('finished', 4, 'CartPole-v1')
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ..hooks import RuntimeHooks
from ..lanes import Lanes, make_lanes
from .frames import FRAME_BUDGET, FRAME_INTERVAL_S, MAX_SIDE, FrameSampler
from .lanes import ViewLanes
from .server import MAX_CLIENTS, PUSH_EVERY_S, WRITE_TIMEOUT_S, ViewServer
from .spec import ViewError, ViewSpec, parse_view
from .state import LiveState
from .terminal import TerminalView

FIGURES_EVERY_S = 0.25
"""The run's per-lane figures (``LiveView.wrap``'s ``lane_figures``) are read at most this
often at episode starts and ends (and at every telemetry window)."""


class LiveView(RuntimeHooks):
    """The live view: a hook of the run (``hooks=[view]``), its page and its terminal table.

    Args:
        view: what to show (``rlmesh.view.spec``): ``"http"`` (a free port on 127.0.0.1),
            ``"http:PORT"``, ``"http:HOST:PORT"``, ``"terminal"``, ``"both"``, or a
            ``ViewSpec``. The page's server starts at once, so a port in use fails here.
        title: the page's title.
        video_key: show lanes' frames from this image key of the observation
            (``"observation"``: the whole observation) instead of ``render()``.
        videos_from: the directory a recorded episode's ``video`` link is relative to (the
            results file's); default the working directory.
        frame_interval, frame_max_side, frame_budget: a lane's frame is taken at most once
            per ``frame_interval`` seconds, while a page is open, and shown at most
            ``frame_max_side`` pixels a side; taking frames costs the run at most
            ``frame_budget`` of its wall time (``rlmesh.view.frames``).
        max_clients, push_every, write_timeout: the server's bounds (``rlmesh.view.server``).
        stream: where the terminal view writes (default: its table on stdout when that is a
            terminal, else its plain lines on stderr).
        announce: print the page's URL to stderr.

    Raises:
        ViewError: ``view`` is no view, or its port is in use.
    """

    def __init__(
        self,
        view: str | ViewSpec = "http",
        *,
        title: str = "rlmesh",
        video_key: str | None = None,
        videos_from: str | os.PathLike[str] | None = None,
        frame_interval: float = FRAME_INTERVAL_S,
        frame_max_side: int = MAX_SIDE,
        frame_budget: float = FRAME_BUDGET,
        max_clients: int = MAX_CLIENTS,
        push_every: float = PUSH_EVERY_S,
        write_timeout: float = WRITE_TIMEOUT_S,
        stream: TextIO | None = None,
        announce: bool = True,
    ) -> None:
        spec = parse_view(view)
        if spec is None:
            raise ViewError("LiveView(view=None) shows nothing: pass 'http', 'terminal' or 'both'")
        self.spec = spec
        self.state = LiveState(title, video_root=videos_from)
        self.video_key = video_key
        self.frame_interval = frame_interval
        self.frame_max_side = frame_max_side
        self.frame_budget = frame_budget
        self.server = (
            ViewServer(
                self.state,
                spec.host,
                spec.port,
                max_clients=max_clients,
                push_every=push_every,
                write_timeout=write_timeout,
            )
            if spec.http
            else None
        )
        self.terminal = TerminalView(self.state, stream=stream) if spec.terminal else None
        self.sampler: FrameSampler | None = None
        self.watched: ViewLanes | None = None
        self._lane_figures: Callable[[], Sequence[tuple[int, float]]] | None = None
        self._figures: tuple[list[int], list[float]] = ([], [])
        self._figures_at = -math.inf
        # (lane, seed) of each lane a reset started, in order, for the announcements to come.
        self._resets: collections.deque[tuple[int, int | None]] = collections.deque()
        self._lock = threading.Lock()
        self.closed = False
        if announce and self.server is not None:
            print(f"rlmesh: live view at {self.server.url}", file=sys.stderr, flush=True)

    @property
    def render_mode(self) -> str | None:
        """The render mode the run's envs need for this view's frames: ``rgb_array`` when
        they come from ``render()``, None when from the observation (``video_key``)."""
        return "rgb_array" if self.video_key is None and self.server is not None else None

    @property
    def url(self) -> str | None:
        """The page's address, or None without the page."""
        return None if self.server is None else self.server.url

    # ------------------------------------------------------------------ the lanes

    def lanes(self, env: Any, **kwargs: Any) -> ViewLanes:
        """``env`` made into lanes (``rlmesh.lanes.make_lanes(env, **kwargs)``, built to
        render in ``rgb_array`` mode unless frames come from ``video_key``), watched."""
        if self.render_mode is not None:
            kwargs.setdefault("render_mode", self.render_mode)
        return self.wrap(make_lanes(env, **kwargs))

    def wrap(
        self,
        lanes: Lanes,
        *,
        lane_figures: Callable[[], Sequence[tuple[int, float]]] | None = None,
    ) -> ViewLanes:
        """``lanes``, watched: their frames, and each lane's steps and return, reach the view.
        A new wrap (a suite's next task) replaces the one before.

        ``lane_figures``: the run's own per-lane figures, each lane's ``(steps, return)`` in
        its episode (a driver's core keeps them), read on the run's thread at each telemetry
        window and, at most every ``FIGURES_EVERY_S``, at an episode's start or end; then
        the lanes count nothing per step. Without it the lanes count their steps."""
        with self._lock:
            if self.sampler is not None:
                self.sampler.close()
            self.sampler = (
                FrameSampler(
                    self.state,
                    lanes.num_lanes,
                    interval=self.frame_interval,
                    max_side=self.frame_max_side,
                    budget=self.frame_budget,
                )
                if self.server is not None
                else None
            )
            self._resets.clear()
        watched = ViewLanes(
            lanes,
            self.sampler,
            video_key=self.video_key,
            on_reset=self._on_reset,
            count_steps=lane_figures is None,
        )
        self.watched = watched
        self._lane_figures = lane_figures
        self._figures_at = -math.inf
        if lane_figures is None:
            self.state.set_lanes(lanes.num_lanes, lambda: (watched.steps, watched.returns))
        else:
            self._figures = ([0] * lanes.num_lanes, [0.0] * lanes.num_lanes)
            self.state.set_lanes(lanes.num_lanes, lambda: self._figures)
        return watched

    def _read_figures(self, *, now: bool = False) -> None:
        """The run's thread: take the run's per-lane figures (``wrap``'s ``lane_figures``),
        at most every ``FIGURES_EVERY_S`` unless ``now``."""
        source = self._lane_figures
        if source is None:
            return
        clock = time.monotonic()
        if not now and clock - self._figures_at < FIGURES_EVERY_S:
            return
        self._figures_at = clock
        figures = list(source())
        self._figures = ([int(steps) for steps, _ in figures], [float(r) for _, r in figures])

    def _on_reset(self, lanes: list[int], seeds: Sequence[int | None]) -> None:
        self._resets.extend(zip(lanes, seeds, strict=True))

    # ------------------------------------------------------------------ the hooks

    def session_started(self, context: dict[str, Any]) -> None:
        self.state.begin(
            str(context.get("env", "run")),
            context.get("episodes"),
            context.get("completed_episodes", ()),
            task=context.get("task"),
        )
        if self.terminal is not None:
            self.terminal.start()

    def episode_started(self, *, episode: int, seed: int | None) -> None:
        # The lanes of the last reset, in order; a lane whose seed differs was not announced
        # (a lockstep vector's surplus episode, after the scored ones).
        resets = self._resets
        while resets:
            lane, reset_seed = resets.popleft()
            if reset_seed == seed:
                self._read_figures()
                self.state.lane_started(lane, episode, seed)
                return

    def episode_completed(self, result: Any) -> None:
        self._read_figures()
        self.state.add_episode(result)

    def telemetry_snapshot(self, rows: Sequence[Any]) -> None:
        self._read_figures(now=True)
        self.state.set_telemetry(rows)

    def session_ended(self, result: Any) -> None:
        self.state.set_telemetry(result.telemetry)
        self._ended(None)

    def session_failed(self, error: BaseException, partial_result: Any) -> None:
        if partial_result is not None:
            self.state.set_telemetry(partial_result.telemetry)
        self._ended(error)

    def _ended(self, error: BaseException | None) -> None:
        self.state.end(error)
        if self.terminal is not None:
            self.terminal.stop()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop the page's server, the frames' thread and the terminal table."""
        if self.closed:
            return
        self.closed = True
        if self.terminal is not None:
            self.terminal.stop()
        if self.sampler is not None:
            self.sampler.close()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The views runs opened with view= in this process, by what they show: the next run that asks
# for the same one gets it back, so its page keeps its address from run to run and stays up
# after a run ends (until the process exits, or the view is closed).
_OPEN: dict[ViewSpec, LiveView] = {}
_OPEN_LOCK = threading.Lock()


def open_view(
    view: str | ViewSpec | None, *, fresh: bool = True, **options: Any
) -> LiveView | None:
    """The ``LiveView`` of a run given ``view=`` (None for no view): the one a previous run
    of this process opened for the same view (its figures cleared when ``fresh``: a new run,
    not a suite's next task), else a new one (``LiveView(spec, **options)``).

    Raises:
        ViewError: ``view`` is no view, or its port is in use.

    Example:
        >>> first = open_view("http", announce=False)
        >>> open_view("http") is first, open_view(None)
        (True, None)
        >>> first.close()
    """
    spec = parse_view(view)
    if spec is None:
        return None
    with _OPEN_LOCK:
        existing = _OPEN.get(spec)
        if existing is not None and not existing.closed:
            if fresh:
                existing.state.clear()
            return existing
        opened = _OPEN[spec] = LiveView(spec, **options)
        return opened


def hooks_with(view: LiveView | None, hooks: Any) -> Any:
    """``hooks`` (None, one hook or a list, as ``hooks=`` takes them) with ``view`` added.

    Example:
        >>> hooks_with(None, "unchanged")
        'unchanged'
    """
    if view is None:
        return hooks
    given = [] if hooks is None else list(hooks) if isinstance(hooks, (list, tuple)) else [hooks]
    return [*given, view] if view not in given else given
