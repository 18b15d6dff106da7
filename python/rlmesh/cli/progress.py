"""The live progress display of ``rlmesh eval``: a rich progress bar on stderr, fed by run
hooks (``EpisodeSink``, ``SuiteEpisodeSink``) with each completed episode and by a runtime
hook (``Throughput``) with the lane-steps per second of each telemetry window.

Example:
    >>> progress = Progress(10, enabled=False)  # no bar: the figures are still kept
    >>> progress.status()
    '- lane-steps/s  reward -  success n/a'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..hooks import RunHooks, RuntimeHooks
from ..results import EpisodeResult


class Progress:
    """The live progress bar (rich, on stderr), or nothing when disabled."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.bar = None
        self.total = total
        self.rewards: list[float] = []
        self.successes: list[bool] = []  # the episodes with a verdict (success available)
        self.enabled = enabled
        self.lane_steps_per_s: float | None = None

    def start(self, done: Sequence[EpisodeResult]) -> None:
        """Show the bar, counting the episodes a resumed results file already holds."""
        self.rewards = [episode.reward for episode in done]
        self.successes = [episode.success for episode in done if episode.success is not None]
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self.bar = Bar(
            TextColumn("episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("<"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("eval", total=self.total, completed=len(done), status="")
        self.bar.start()

    def add_done(self, done: Sequence[EpisodeResult]) -> None:
        """Count the episodes a resumed file already holds of a suite's next task."""
        self.rewards += [episode.reward for episode in done]
        self.successes += [episode.success for episode in done if episode.success is not None]
        self._update(advance=len(done))

    def episode(self, episode: EpisodeResult) -> None:
        """Count one completed episode."""
        self.rewards.append(episode.reward)
        if episode.success is not None:
            self.successes.append(episode.success)
        self._update(advance=1)

    def throughput(self, lane_steps_per_s: float) -> None:
        """Show the run's latest lane-steps per second."""
        self.lane_steps_per_s = lane_steps_per_s
        self._update(advance=0)

    def status(self) -> str:
        """The bar's text: throughput, mean reward, and the success rate (n/a when success is
        not available)."""
        rate = "-" if self.lane_steps_per_s is None else f"{self.lane_steps_per_s:,.0f}"
        reward = f"{np.mean(self.rewards):.2f}" if self.rewards else "-"
        success = f"{np.mean(self.successes):.1%}" if self.successes else "n/a"
        return f"{rate} lane-steps/s  reward {reward}  success {success}"

    def _update(self, advance: int) -> None:
        if self.bar is None:
            return
        self.bar.update(self.task, advance=advance, status=self.status())

    def stop(self) -> None:
        """Take the bar off the terminal (it is transient), if it was shown."""
        if self.bar is not None:
            self.bar.stop()


class EpisodeSink(RunHooks):
    """Shows each completed episode in the progress bar (the driver writes the results file)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def on_run_start(self, context: dict[str, Any]) -> None:
        self.progress.start(context["completed_episodes"])

    def on_episode_end(self, result: EpisodeResult) -> None:
        self.progress.episode(result)


class SuiteEpisodeSink(EpisodeSink):
    """One progress bar across a suite's tasks, each task's run starting where it stands."""

    started = False

    def on_run_start(self, context: dict[str, Any]) -> None:
        if self.started:
            self.progress.add_done(context["completed_episodes"])
        else:
            self.started = True
            super().on_run_start(context)


class Throughput(RuntimeHooks):
    """Lane-steps per second from each telemetry window, for the progress bar."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def telemetry_snapshot(self, rows: Sequence[Any]) -> None:
        for row in rows:
            if row.op == "driver" and row.metric == "lane-steps" and row.avg == row.avg:
                self.progress.throughput(row.avg)
