"""The terminal view: a rich live table of the view's figures (progress, tasks, lanes,
failures, latency) when stdout is a terminal, else a plain progress line on stderr every few
seconds (a log, a pipe, CI), which never mixes into a summary piped from stdout.

The table is drawn from ``LiveState.snapshot()`` on rich's own refresh thread, twice a
second; the run's thread never draws. ``format_progress`` is the one-line form, also what
the plain fallback prints.

Example:
    >>> import io
    >>> from rlmesh.view.state import LiveState
    >>> state = LiveState()
    >>> state.begin("CartPole-v1", requested=10)
    >>> print(format_progress(state.snapshot()))
    running: 0 / 10 episodes
    >>> out = io.StringIO()
    >>> view = TerminalView(state, stream=out, terminal=True)
    >>> view.start(); view.stop()
    >>> "CartPole-v1" in out.getvalue()
    True
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from .state import RUNNING, LiveState

REFRESH_PER_SECOND = 2.0
PLAIN_EVERY_S = 10.0
"""Seconds between two plain progress lines (a stream that is not a terminal)."""
SHOWN_LANES = 16
SHOWN_FAILURES = 5


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _interval(pair: list[float] | None, form: str) -> str:
    return "" if pair is None else f" [{format(pair[0], form)}, {format(pair[1], form)}]"


def format_progress(snapshot: dict[str, Any]) -> str:
    """One line: status, episodes done of requested, lane-steps/s, ETA, and each task's
    success rate with its interval (the first few)."""
    requested = snapshot["requested"]
    parts = [
        f"{snapshot['status']}: {snapshot['done']}"
        + ("" if requested is None else f" / {requested}")
        + " episodes"
    ]
    if snapshot["lane_steps_per_s"] is not None:
        parts.append(f"{snapshot['lane_steps_per_s']:,.0f} lane-steps/s")
    if snapshot["eta_s"] is not None and snapshot["status"] == RUNNING:
        parts.append(f"ETA {_duration(snapshot['eta_s'])}")
    for task in snapshot["tasks"][:3]:
        if task["success_rate"] is not None:
            parts.append(
                f"{task['name']} success {_rate(task['success_rate'])}"
                + _interval(task["success_interval"], ".0%")
            )
    if snapshot["failed_total"]:
        parts.append(f"{snapshot['failed_total']} failed")
    return ", ".join(parts)


def render_table(snapshot: dict[str, Any]) -> Any:
    """The figures as one rich renderable: the progress line, then tables of the tasks, the
    lanes, the latest failures and the latencies."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"{snapshot['title']}  " + format_progress(snapshot), style="bold")]
    tasks = Table(box=None, pad_edge=False, header_style="dim")
    for column, justify in (
        ("task", "left"),
        ("episodes", "right"),
        ("success [95%]", "right"),
        ("mean return [95%]", "right"),
        ("failed", "right"),
    ):
        tasks.add_column(column, justify=justify)  # type: ignore[arg-type]
    for task in snapshot["tasks"]:
        requested = "" if task["requested"] is None else f" / {task['requested']}"
        mean = task["mean_return"]
        tasks.add_row(
            task["name"],
            f"{task['done']}{requested}",
            "n/a"
            if task["success_rate"] is None
            else _rate(task["success_rate"]) + _interval(task["success_interval"], ".1%"),
            "-" if mean is None else f"{mean:.2f}" + _interval(task["return_interval"], ".2f"),
            str(task["failed"]),
        )
    parts.append(tasks)
    lanes = [lane for lane in snapshot["lanes"] if lane["episode"] is not None]
    if lanes:
        table = Table(box=None, pad_edge=False, header_style="dim")
        for column in ("lane", "episode", "step", "return"):
            table.add_column(column, justify="right")
        for lane in lanes[:SHOWN_LANES]:
            table.add_row(
                str(lane["lane"]),
                str(lane["episode"]),
                "-" if lane["step"] is None else str(lane["step"]),
                "-" if lane["return"] is None else f"{lane['return']:.1f}",
            )
        parts.append(table)
    for failure in snapshot["failures"][-SHOWN_FAILURES:]:
        parts.append(Text(f"failed #{failure['index']} ({failure['task']}): {failure['error']}",
                          style="red"))  # fmt: skip
    if snapshot["latency"]:
        parts.append(
            Text(
                "latency p50/p95 ms: "
                + "  ".join(
                    f"{row['op']} {_ms(row['p50'])}/{_ms(row['p95'])}"
                    for row in snapshot["latency"]
                ),
                style="dim",
            )
        )
    return Group(*parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


class TerminalView:
    """Shows ``state`` from ``start`` to ``stop``: a rich live table when the stream is a
    terminal (default stdout; or with ``terminal=True``), else a plain line every
    ``plain_every`` seconds and one at the end (default on stderr)."""

    def __init__(
        self,
        state: LiveState,
        *,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        plain_every: float = PLAIN_EVERY_S,
    ) -> None:
        self.state = state
        self.stream = stream
        self.terminal = terminal
        self.plain_every = plain_every
        self._live: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _out(self) -> TextIO:
        """Where to write: the stream given, else stdout for the table and stderr for the
        plain lines (beside the progress bar and the logs, never into a piped summary)."""
        if self.stream is not None:
            return self.stream
        return sys.stdout if self._table() else sys.stderr

    def _table(self) -> bool:
        if self.terminal is not None:
            return self.terminal
        out = self.stream if self.stream is not None else sys.stdout
        return bool(getattr(out, "isatty", lambda: False)())

    def start(self) -> None:
        """Show the figures (again, after a ``stop``)."""
        if self._live is not None or self._thread is not None:
            return
        out = self._out()
        self._stop.clear()
        if self._table():
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                console=Console(file=out, force_terminal=True),
                get_renderable=lambda: render_table(self.state.snapshot()),
                refresh_per_second=REFRESH_PER_SECOND,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start(refresh=True)
            return
        self._thread = threading.Thread(
            target=self._plain, name="rlmesh-view-terminal", daemon=True
        )
        self._thread.start()

    def _plain(self) -> None:
        while not self._stop.wait(self.plain_every):
            self._line()

    def _line(self) -> None:
        try:
            print("rlmesh: " + format_progress(self.state.snapshot()), file=self._out(), flush=True)
        except (OSError, ValueError):  # the stream was closed: nothing more to show
            self._stop.set()

    def stop(self) -> None:
        """Stop showing: the table is drawn a last time (or the last plain line printed)."""
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._line()
