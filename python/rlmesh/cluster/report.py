"""What a cluster run reports beside its episodes: per-window and per-worker figures, Ray's
start-up and the coordinator's own time (``ClusterReport``, in ``ClusterRunResult.cluster``).

Example:
    >>> windows = (
    ...     WindowStats(0, 0, "a:1", episodes=4, steps=400, task_s=2.0, wall_s=2.1),
    ...     WindowStats(1, 0, "a:2", episodes=4, steps=200, task_s=1.0, wall_s=1.1),
    ... )
    >>> report = ClusterReport(workers=2, windows=windows, startup_s=3.0, coordinator_s=0.02)
    >>> [(w.worker, w.steps_per_s) for w in report.per_worker]
    [('a:1', 200.0), ('a:2', 200.0)]
    >>> round(report.coordinator_s_per_window, 3), round(report.dispatch_s_per_window, 3)
    (0.01, 0.1)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields

from ..results import RunResult


@dataclass(frozen=True)
class WindowStats:
    """One window's run: its number, the attempt (0 first, 1 its first re-run ...), the worker
    (``host:pid``), the episodes and steps it completed, its task's time on the worker
    (``task_s``: loading the job, the local run) and the coordinator's view of it (``wall_s``:
    from submitting the task to its last message). A lost attempt has ``wall_s`` only."""

    window: int
    attempt: int
    worker: str
    episodes: int
    steps: int
    task_s: float
    wall_s: float
    lost: bool = False

    @property
    def dispatch_s(self) -> float:
        """What running the window on Ray added to its task: scheduling and transport."""
        return max(self.wall_s - self.task_s, 0.0)


@dataclass(frozen=True)
class WorkerStats:
    """One worker's share: windows, episodes and steps completed, and its tasks' time."""

    worker: str
    windows: int
    episodes: int
    steps: int
    busy_s: float

    @property
    def steps_per_s(self) -> float:
        """Its throughput while busy (nan before it completed a window)."""
        return self.steps / self.busy_s if self.busy_s > 0 else math.nan


@dataclass(frozen=True)
class ClusterReport:
    """The cluster side of a run.

    ``workers``: windows run at once; ``windows``: every attempt of every window, in the order
    they ended; ``startup_s``: connecting to (or starting) Ray until the first window was sent;
    ``coordinator_s``: the coordinator's own time (dealing windows, merging episodes into the
    results file, the hooks); ``ray_address``: the cluster joined (None: a local instance);
    ``ray_mode``: the windows ran as Ray ``"tasks"`` or on ``"actors"``.
    """

    workers: int
    windows: tuple[WindowStats, ...] = ()
    startup_s: float = 0.0
    coordinator_s: float = 0.0
    ray_address: str | None = None
    ray_mode: str = "tasks"

    @property
    def retries(self) -> int:
        """Windows run again because their worker was lost."""
        return sum(1 for window in self.windows if window.lost)

    @property
    def per_worker(self) -> tuple[WorkerStats, ...]:
        """Each worker's windows, episodes, steps and throughput, by worker name."""
        by_worker: dict[str, list[WindowStats]] = {}
        for window in self.windows:
            if not window.lost:
                by_worker.setdefault(window.worker, []).append(window)
        return tuple(
            WorkerStats(
                worker=name,
                windows=len(done),
                episodes=sum(window.episodes for window in done),
                steps=sum(window.steps for window in done),
                busy_s=math.fsum(window.task_s for window in done),
            )
            for name, done in sorted(by_worker.items())
        )

    @property
    def coordinator_s_per_window(self) -> float:
        """The coordinator's time per window run (nan when none ran)."""
        return self.coordinator_s / len(self.windows) if self.windows else math.nan

    @property
    def dispatch_s_per_window(self) -> float:
        """Ray's scheduling and transport per completed window (``WindowStats.dispatch_s``),
        the median: a worker's first window also waits for its process to start and import."""
        done = [window.dispatch_s for window in self.windows if not window.lost]
        return statistics.median(done) if done else math.nan

    def to_dict(self) -> dict:
        """The report as plain values (``rlmesh.results.dumps`` writes it as strict JSON),
        with the per-worker rows and the per-window means."""
        return {
            **{item.name: getattr(self, item.name) for item in fields(self)},
            "windows": [vars(window) for window in self.windows],
            "per_worker": [
                {**vars(worker), "steps_per_s": worker.steps_per_s} for worker in self.per_worker
            ],
            "retries": self.retries,
            "coordinator_s_per_window": self.coordinator_s_per_window,
            "dispatch_s_per_window": self.dispatch_s_per_window,
        }

    def format(self) -> str:
        """A few lines: the run's cluster figures, then one line per worker."""
        lines = [
            f"workers {self.workers}, windows {len(self.windows)} ({self.retries} re-run), "
            f"Ray start-up {self.startup_s:.2f} s, coordinator {self.coordinator_s:.3f} s "
            f"({self.coordinator_s_per_window * 1e3:.2f} ms a window), dispatch "
            f"{self.dispatch_s_per_window * 1e3:.1f} ms a window, on Ray {self.ray_mode}"
        ]
        lines += [
            f"  {worker.worker}: {worker.windows} windows, {worker.episodes} episodes, "
            f"{worker.steps_per_s:,.0f} steps/s"
            for worker in self.per_worker
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class ClusterRunResult(RunResult):
    """A ``RunResult`` whose episodes ran on a cluster, with the ``ClusterReport`` of the run
    (None when a resumed results file already held every episode and nothing ran)."""

    cluster: ClusterReport | None = field(default=None, compare=False)

    @classmethod
    def of(cls, result: RunResult, cluster: ClusterReport | None) -> ClusterRunResult:
        return cls(
            **{item.name: getattr(result, item.name) for item in fields(RunResult)},
            cluster=cluster,
        )
