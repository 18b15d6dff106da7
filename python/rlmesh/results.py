"""What a run returns: one ``EpisodeResult`` per scored episode, inside a ``RunResult``.

Both are frozen dataclasses of plain Python values, whichever core ran the episodes, so they
compare, pickle and serialize alike. ``TelemetryRow`` is one line of the run's latency and
throughput telemetry (see ``rlmesh.telemetry``).

Example:
    >>> episodes = [
    ...     EpisodeResult(1, 7, 1, 0, 30, 30.0, False, True, None, 0.5, 0.1, 0.2),
    ...     EpisodeResult(0, 5, 0, 1, 12, 12.0, True, False, None, 0.2, 0.1, 0.2),
    ... ]
    >>> result = RunResult(episodes, base_seed=0)
    >>> [episode.index for episode in result.episodes]  # sorted by index
    [0, 1]
    >>> result.total_steps, result.mean_reward, result.success_rate
    (42, 21.0, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EpisodeResult:
    """One completed, scored episode.

    ``index`` is the episode's slot (episodes are numbered in the order they start); ``seed`` is
    None when the environment chose the episode's start itself; ``trial`` is
    ``trial_index_base + index``; ``env_index`` is the lane that ran it. ``success`` is None when
    the final ``info`` said nothing about success. ``duration_s`` is wall time from reset to
    the end; ``predict_ms`` and ``step_ms`` are mean per-step model and env times. Every field
    but the three timings is identical across runs, ``num_envs`` and cores.
    """

    index: int
    seed: int | None
    trial: int
    env_index: int
    steps: int
    reward: float
    terminated: bool
    truncated: bool
    success: bool | None
    duration_s: float
    predict_ms: float
    step_ms: float

    @classmethod
    def from_summary(cls, summary: Any) -> EpisodeResult:
        """The result of a core's ``EpisodeSummary`` (either core: the same attribute names).

        The summary's ``episode_id`` is the core's internal handle, not part of the result.
        """
        return cls(**{field.name: getattr(summary, field.name) for field in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in declaration order."""
        return asdict(self)


@dataclass(frozen=True)
class TelemetryRow:
    """One line of telemetry: an op's latency, or the run's throughput, over some span.

    Latency rows (``metric="latency"``, ``unit="ms"``) give ``count`` calls of ``op`` and their
    mean, p50, p95, p99 and max. Throughput rows (``op="driver"``, ``metric`` ``"steps"`` or
    ``"lane-steps"``, ``unit="1/s"``) give ``count`` steps and their rate in ``avg``; a rate has no
    distribution, so their ``p50`` to ``max`` are nan.
    """

    op: str
    metric: str
    unit: str
    count: int
    avg: float
    p50: float
    p95: float
    p99: float
    max: float


_COLUMNS = ("op", "metric", "unit", "count", "avg", "p50", "p95", "p99", "max")
_TEXT_COLUMNS = 3  # op, metric and unit align left; the numbers align right


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3f}"
    return str(value)


@dataclass(frozen=True)
class RunResult:
    """Every scored episode of a run, with the run's seed, waste and telemetry.

    The constructor stores ``episodes`` as a tuple sorted by ``index`` (episodes complete out
    of order; results read in slot order) and ``telemetry`` as a tuple. ``wasted_steps`` counts
    the lane-steps of surplus episodes; ``telemetry`` is the run's cumulative telemetry.
    """

    episodes: tuple[EpisodeResult, ...]
    base_seed: int | None
    wasted_steps: int = 0
    telemetry: tuple[TelemetryRow, ...] = ()

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields only through object.__setattr__.
        ordered = tuple(sorted(self.episodes, key=lambda episode: episode.index))
        object.__setattr__(self, "episodes", ordered)
        object.__setattr__(self, "telemetry", tuple(self.telemetry))

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def total_steps(self) -> int:
        """Steps of the scored episodes (surplus steps are in ``wasted_steps``)."""
        return sum(episode.steps for episode in self.episodes)

    @property
    def mean_reward(self) -> float:
        """The mean episode reward; nan when there are no episodes (no mean to report)."""
        if not self.episodes:
            return math.nan
        return math.fsum(episode.reward for episode in self.episodes) / len(self.episodes)

    @property
    def success_rate(self) -> float:
        """The fraction of successful episodes; nan when there are no episodes.

        An episode succeeded if its ``success`` says so; when ``success`` is None (the env
        reports no success), reaching a terminal state (``terminated``) counts as success.
        """
        if not self.episodes:
            return math.nan
        successes = sum(
            episode.terminated if episode.success is None else episode.success
            for episode in self.episodes
        )
        return successes / len(self.episodes)

    def format_telemetry(self) -> str:
        """The telemetry rows as an aligned text table, one line per row after a header.

        Numbers show 3 decimals, nan shows as ``-``.

        Example:
            >>> row = TelemetryRow("env.step", "latency", "ms", 40, 0.5, 0.45, 0.9, 1.2, 3.0)
            >>> print(RunResult((), base_seed=0, telemetry=(row,)).format_telemetry())
            op        metric   unit  count    avg    p50    p95    p99    max
            env.step  latency  ms       40  0.500  0.450  0.900  1.200  3.000
        """
        lines = [list(_COLUMNS)]
        lines += [[_cell(getattr(row, column)) for column in _COLUMNS] for row in self.telemetry]
        widths = [max(len(line[column]) for line in lines) for column in range(len(_COLUMNS))]
        return "\n".join(
            "  ".join(
                cell.ljust(width) if column < _TEXT_COLUMNS else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in lines
        )
