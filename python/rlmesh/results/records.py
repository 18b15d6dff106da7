"""The records of a run: what it returns and what a summary reads, as plain values (no I/O).

``EpisodeResult`` is one scored episode, ``RunResult`` every episode of a run with the run's
seed, waste and telemetry, ``TelemetryRow`` one line of the run's latency and throughput
telemetry (see ``rlmesh.telemetry``), and ``RunColumns`` a run as a summary reads it, one
array per field. All are frozen dataclasses of plain Python values, whichever core ran the
episodes, so they compare, pickle and serialize alike. How they are written to and read from
a results file is ``rlmesh.results.lines``.

Example:
    >>> episodes = [
    ...     EpisodeResult(1, 7, 1, 0, 30, 30.0, False, True, True, 0.5, 0.1, 0.2),
    ...     EpisodeResult(0, 5, 0, 1, 12, 12.0, True, False, False, 0.2, 0.1, 0.2),
    ... ]
    >>> result = RunResult(episodes, base_seed=0)
    >>> [episode.index for episode in result.episodes]  # sorted by index
    [0, 1]
    >>> result.total_steps, result.mean_reward, result.success_rate
    (42, 21.0, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from .success import NONE, SuccessRule


@dataclass(frozen=True)
class EpisodeResult:
    """One completed, scored episode.

    ``index`` is the episode's slot (episodes are numbered in the order they start); ``seed`` is
    None when the environment chose the episode's start itself; ``trial`` is
    ``trial_index_base + index``; ``env_index`` is the lane that ran it. ``success`` is the
    verdict of ``rlmesh.success``: what the env's final ``info`` reported
    (``success_reported`` is then True), else the run's ``SuccessRule`` (a user rule, or reward
    >= the env spec's ``reward_threshold``); None when neither gives one (not available).
    ``duration_s`` is the episode's clock, the one ``max_episode_seconds`` reads too: wall time
    from just before its reset call to the return of its last ``step``. ``predict_ms`` and
    ``step_ms`` are mean per-step model and env times. Every field but the three timings is
    identical across runs, ``num_envs`` and cores. ``task`` is the name of the suite task the
    episode belongs to (``rlmesh.run_suite``), None outside a suite.

    The per-step times are the episode's own, so they mean the same at any ``num_envs``:
    ``step_ms`` is its env's step time per step (a lane the core steps alone is timed alone; a
    step that moves K lanes in one call is charged ``1/K`` of that call's time), and
    ``predict_ms`` its share of the model's time per step (a call for P lanes is charged
    ``1/P`` of its time to each; steps that replay a queued chunk action are charged nothing).
    So at 4 lanes a 2 ms env shows about 2 ms, as the run's ``env.step`` telemetry does.

    ``error`` is None for an episode that ran to its end. With ``on_error="record"`` (or
    ``"retry"`` once the retries are spent), an episode whose env raised is kept as a result with
    ``error`` the env's ``"<ExceptionType>: <message>"``: its ``steps`` and ``reward`` are
    those of the steps completed before the failing ``reset`` / ``step`` call, it is neither
    terminated nor truncated, its ``success`` is None, and summaries count it apart, out of the
    reward, length and success statistics. ``video`` is the recorded episode's mp4
    (``record_video``), relative to the results file's directory; None for an episode not
    recorded.

    ``reset_digest`` and ``trajectory_digest`` are the determinism evidence of the episode
    (16 hex digits each, computed by the core: ``rlmesh._pycore.digests``): a hash of its first
    observation, and a rolling hash of every step's action, observation, reward and flags.
    Two runs played episode k alike when both are equal; ``rlmesh verify`` compares them.
    None in files written before they existed, and for an episode whose first observation
    never arrived (its reset failed).
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
    success_reported: bool = False
    task: str | None = None
    error: str | None = None
    video: str | None = None
    reset_digest: str | None = None
    trajectory_digest: str | None = None

    @classmethod
    def from_summary(cls, summary: Any, rule: SuccessRule | None = None) -> EpisodeResult:
        """The result of a core's ``EpisodeSummary`` (either core: the same attribute names),
        judged by ``rule`` where the env reported no success (``summary.success`` is None).

        The summary's ``episode_id`` is the core's internal handle, not part of the result.

        Raises:
            HookError: ``rule`` is the user's and it raised or returned something not a bool.
        """
        episode = object.__new__(cls)
        success = summary.success
        # A frozen dataclass's __init__ sets each field through object.__setattr__; filling
        # the instance dict at once takes half the time, and this runs once per episode.
        episode.__dict__.update(
            index=summary.index,
            seed=summary.seed,
            trial=summary.trial,
            env_index=summary.env_index,
            steps=summary.steps,
            reward=summary.reward,
            terminated=summary.terminated,
            truncated=summary.truncated,
            success=success,
            duration_s=summary.duration_s,
            predict_ms=summary.predict_ms,
            step_ms=summary.step_ms,
            success_reported=success is not None,
            task=None,
            error=summary.error,
            reset_digest=summary.reset_digest,
            trajectory_digest=summary.trajectory_digest,
        )
        if success is None and rule is not None and summary.error is None:
            episode.__dict__["success"] = rule.verdict(episode)
        return episode

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in declaration order; a field added since format 1
        (``task``, ...) only when it is set, so an episode without them reads as before.

        Example:
            >>> episode = EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2)
            >>> "task" in episode.to_dict(), replace(episode, task="push").to_dict()["task"]
            (False, 'push')
        """
        # Not asdict: it deep-copies every value, ten times the cost, and the values are plain.
        record = {name: getattr(self, name) for name in field_names(type(self))}
        for name in OPTIONAL_FIELDS:
            if record[name] is None:
                del record[name]
        return record


# The fields every episode line holds (format 1); the ones after them are optional, written
# only when set (``EpisodeResult.to_dict``).
FORMAT_1_FIELDS = 13
OPTIONAL_FIELDS = tuple(field.name for field in fields(EpisodeResult))[FORMAT_1_FIELDS:]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The names of the fields of the dataclass ``cls`` (an ``EpisodeResult``), in order."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(field.name for field in fields(cls))
    return names


def episode_order(episode: EpisodeResult) -> Any:
    """Episodes sort by index; a suite's by task, then index."""
    return (episode.task or "", episode.index)


def succeeded(episode: EpisodeResult) -> bool | None:
    """Whether ``episode`` succeeded, as rlmesh counts it everywhere (``rlmesh.success``):
    ``episode.success``, None when success is not available. Never ``terminated``."""
    return episode.success


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


TELEMETRY_COLUMNS = ("op", "metric", "unit", "count", "avg", "p50", "p95", "p99", "max")
TELEMETRY_TEXT_COLUMNS = 3  # op, metric and unit align left; the numbers align right


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def mean(values: Iterable[float]) -> float:
    """The exact mean (``math.fsum``) of ``values``: nan when empty, or for +inf with -inf.

    Example:
        >>> mean([1.0, 2.0]), mean([1.0, float("inf")])
        (1.5, inf)
    """
    values = list(values) if not isinstance(values, (list, tuple, np.ndarray)) else values
    if len(values) == 0:
        return math.nan
    try:
        return math.fsum(values) / len(values)
    except ValueError:  # fsum refuses inf + -inf, whose mean is undefined
        return math.nan


@dataclass(frozen=True)
class RunResult:
    """Every scored episode of a run, with the run's seed, waste and telemetry.

    The constructor stores ``episodes`` as a tuple sorted by ``index`` (episodes complete out
    of order; results read in slot order; a suite's by ``task``, then ``index``) and
    ``telemetry`` as a tuple. ``wasted_steps`` counts the lane-steps of surplus episodes;
    ``telemetry`` is the run's cumulative telemetry; ``observer_errors`` counts the
    ``RuntimeHooks`` observer calls that raised (each was logged and the run went on).
    ``core`` is the core that ran it (``"rust"`` / ``"python"``), ``success_rule`` the rule
    its episodes were judged by (``rlmesh.success``), ``episodes_requested`` how many episodes
    the run was asked for (more than ``num_episodes`` for a run that stopped early), and
    ``elapsed_s`` its wall time. The driver sets all four. ``stop`` is how a run with
    ``until=`` ended (``rlmesh.stats.stopping.RunStop``: its confidence sequence, n, and why
    it stopped), None for any other run.

    Example:
        >>> episode = EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2)
        >>> result = RunResult([episode], base_seed=0, core="python", episodes_requested=2)
        >>> result.success_rate is None, result.summary()["episodes_requested"]
        (True, 2)
        >>> print(result.format_summary().splitlines()[0])
        episodes                                   1 of 2, incomplete
    """

    episodes: tuple[EpisodeResult, ...]
    base_seed: int | None
    wasted_steps: int = 0
    telemetry: tuple[TelemetryRow, ...] = ()
    observer_errors: int = 0
    core: str | None = None
    success_rule: SuccessRule = field(default_factory=lambda: SuccessRule(NONE))
    episodes_requested: int | None = None
    elapsed_s: float | None = None
    # How a run with until= ended: an rlmesh.stats.stopping.RunStop (stats builds on these
    # records, so it is not imported here); None for a run without a stopping rule.
    stop: Any = None

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields only through object.__setattr__.
        ordered = tuple(sorted(self.episodes, key=episode_order))
        object.__setattr__(self, "episodes", ordered)
        object.__setattr__(self, "telemetry", tuple(self.telemetry))

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def total_steps(self) -> int:
        """Steps of the scored episodes, failed ones' included (surplus steps are in
        ``wasted_steps``)."""
        return sum(episode.steps for episode in self.episodes)

    @property
    def failed_indices(self) -> list[int]:
        """The indices of the episodes recorded as failed (``EpisodeResult.error`` set: their
        env raised), ascending."""
        return [episode.index for episode in self.episodes if episode.error is not None]

    @property
    def mean_reward(self) -> float:
        """The mean reward of the episodes that ran to their end (failed ones are left out);
        nan when there are none (no mean to report)."""
        return mean([episode.reward for episode in self.episodes if episode.error is None])

    @property
    def success_rate(self) -> float | None:
        """The fraction of the episodes with a verdict (``EpisodeResult.success`` not None;
        a failed episode has none) that succeeded; None when no episode has one (success is
        not available)."""
        verdicts = [episode.success for episode in self.episodes if episode.success is not None]
        return sum(verdicts) / len(verdicts) if verdicts else None

    def columns(self) -> RunColumns:
        """The run as ``RunColumns``: what a summary needs, one array per field."""
        episodes = self.episodes
        return RunColumns(
            index=np.array([episode.index for episode in episodes], dtype=np.int64),
            steps=np.array([episode.steps for episode in episodes], dtype=np.int64),
            reward=np.array([episode.reward for episode in episodes], dtype=np.float64),
            success=np.array(
                [-1 if episode.success is None else int(episode.success) for episode in episodes],
                dtype=np.int8,
            ),
            success_reported=np.array(
                [episode.success_reported for episode in episodes], dtype=bool
            ),
            **run_fields(self),
            failed=np.array([episode.error is not None for episode in episodes], dtype=bool),
            task=task_column([episode.task for episode in episodes]),
        )

    def summary(self) -> dict[str, Any]:
        """The summary dict ``rlmesh eval --json`` prints for this run (``stats.summarize``)."""
        # The one upward import of the results package, a convenience for callers: stats
        # builds on these records, so it is imported on use (here and in format_summary).
        from ..stats.summaries import summarize

        return summarize(self)

    def format_summary(self) -> str:
        """The summary table ``rlmesh eval`` prints for this run (``stats.format_summary``)."""
        from ..stats.summaries import format_summary  # the convenience import of summary()

        return format_summary(self.summary())

    def format_telemetry(self) -> str:
        """The telemetry rows as an aligned text table, one line per row after a header.

        Numbers show 3 decimals, nan shows as ``-``.

        Example:
            >>> row = TelemetryRow("env.step", "latency", "ms", 40, 0.5, 0.45, 0.9, 1.2, 3.0)
            >>> print(RunResult((), base_seed=0, telemetry=(row,)).format_telemetry())
            op        metric   unit  count    avg    p50    p95    p99    max
            env.step  latency  ms       40  0.500  0.450  0.900  1.200  3.000
        """
        lines = [list(TELEMETRY_COLUMNS)]
        lines += [
            [_cell(getattr(row, column)) for column in TELEMETRY_COLUMNS] for row in self.telemetry
        ]
        widths = [
            max(len(line[column]) for line in lines) for column in range(len(TELEMETRY_COLUMNS))
        ]
        return "\n".join(
            "  ".join(
                cell.ljust(width) if column < TELEMETRY_TEXT_COLUMNS else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in lines
        )


RUN_FIELDS = (
    "base_seed",
    "wasted_steps",
    "telemetry",
    "observer_errors",
    "core",
    "success_rule",
    "episodes_requested",
    "elapsed_s",
    "stop",
)


def run_fields(run: Any) -> dict[str, Any]:
    return {name: getattr(run, name) for name in RUN_FIELDS}


@dataclass(frozen=True)
class RunColumns:
    """A run as a summary sees it: per-episode columns in index order, and the run's fields.

    A few bytes per episode where a ``RunResult`` holds an object per episode: ``rlmesh
    report`` reads a results file into this (``read_columns``). ``index``, ``steps``: int64;
    ``reward``: float64; ``success``: int8, 1 succeeded, 0 failed, -1 not available;
    ``success_reported``: bool, the env's info gave the verdict; ``failed``: bool, the episode
    was recorded as failed (``EpisodeResult.error``), None when no episode was. ``task``: the
    suite task of each episode (a numpy str array, ``""`` for an episode of no task), None when
    no episode has one (not a suite). The other fields are ``RunResult``'s.
    """

    index: np.ndarray
    steps: np.ndarray
    reward: np.ndarray
    success: np.ndarray
    success_reported: np.ndarray
    base_seed: int | None
    wasted_steps: int = 0
    telemetry: tuple[TelemetryRow, ...] = ()
    observer_errors: int = 0
    core: str | None = None
    success_rule: SuccessRule = field(default_factory=lambda: SuccessRule(NONE))
    episodes_requested: int | None = None
    elapsed_s: float | None = None
    stop: Any = None
    failed: np.ndarray | None = None
    task: np.ndarray | None = None

    @property
    def num_episodes(self) -> int:
        return int(self.index.size)

    def select(self, rows: np.ndarray, **fields: Any) -> RunColumns:
        """The episodes at ``rows`` (a boolean mask, positions or a slice), with ``fields``
        replaced.

        Example:
            >>> columns = RunResult((), base_seed=0).columns()
            >>> columns.select(np.zeros(0, dtype=bool), episodes_requested=3).episodes_requested
            3
        """
        per_episode = {name: getattr(self, name)[rows] for name in EPISODE_COLUMNS}
        optional = {
            name: None if getattr(self, name) is None else getattr(self, name)[rows]
            for name in ("failed", "task")
        }
        return replace(self, **per_episode, **optional, **fields)


EPISODE_COLUMNS = ("index", "steps", "reward", "success", "success_reported")


def task_column(tasks: list[str | None]) -> np.ndarray | None:
    """``RunColumns.task`` of episodes whose tasks are ``tasks``: None when none has one."""
    if all(task is None for task in tasks):
        return None
    return np.array([task or "" for task in tasks], dtype=str)


def merge_telemetry(segments: list[tuple[TelemetryRow, ...]]) -> tuple[TelemetryRow, ...]:
    """The telemetry of several run segments (a run and its resumptions) as one.

    One segment is returned as it is. Across segments, counts add up, ``max`` is the largest,
    ``avg`` and the percentiles are count-weighted means (percentiles do not merge exactly; this
    is the honest approximation without the raw samples), and a throughput row's rate is the
    total count over the total time (``sum(count) / sum(count / rate)``).

    Example:
        >>> a = TelemetryRow("env.step", "latency", "ms", 1, 1.0, 1.0, 1.0, 1.0, 1.0)
        >>> b = TelemetryRow("env.step", "latency", "ms", 3, 3.0, 3.0, 3.0, 3.0, 5.0)
        >>> merged, = merge_telemetry([(a,), (b,)])
        >>> merged.count, merged.avg, merged.max
        (4, 2.5, 5.0)
    """
    if len(segments) == 1:
        return tuple(segments[0])
    groups: dict[tuple[str, str, str], list[TelemetryRow]] = {}
    for rows in segments:
        for row in rows:
            groups.setdefault((row.op, row.metric, row.unit), []).append(row)
    merged = []
    for (op, metric, unit), rows in groups.items():
        count = sum(row.count for row in rows)
        if unit == "1/s":
            seconds = sum(row.count / row.avg for row in rows if row.count and row.avg > 0)
            rate = count / seconds if seconds > 0 else math.nan
            merged.append(TelemetryRow(op, metric, unit, count, rate, *[math.nan] * 4))
            continue

        def weighted(name: str, rows: list[TelemetryRow] = rows, count: int = count) -> float:
            if count == 0:
                return math.nan
            return math.fsum(getattr(row, name) * row.count for row in rows if row.count) / count

        merged.append(
            TelemetryRow(
                op,
                metric,
                unit,
                count,
                weighted("avg"),
                weighted("p50"),
                weighted("p95"),
                weighted("p99"),
                max(row.max for row in rows),
            )
        )
    return tuple(merged)
