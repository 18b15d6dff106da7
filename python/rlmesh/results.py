"""What a run returns: one ``EpisodeResult`` per scored episode, inside a ``RunResult``.

Both are frozen dataclasses of plain Python values, whichever core ran the episodes, so they
compare, pickle and serialize alike. ``TelemetryRow`` is one line of the run's latency and
throughput telemetry (see ``rlmesh.telemetry``). ``ResultsFile`` is the JSON-lines results file
a run writes as it goes, and resumes (see its docstring for the format).

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

JSON: every line of a results file and every ``--json`` output is strict JSON (it parses with
``allow_nan=False``). A non-finite float is written as the string ``"Infinity"``,
``"-Infinity"`` or ``"NaN"`` (``dumps``), and reading a results file turns those strings back
into floats (``decode_float``). In a summary, a figure that does not exist is null.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import IO, Any

import numpy as np

from .errors import ResultsFileError, ResultsFileLockedError
from .success import NONE, SuccessRule

try:
    import fcntl
except ImportError:  # Windows: the lock file is created exclusively instead (see _WriterLock)
    fcntl = None  # type: ignore[assignment]

# ---------------------------------------------------------------------------- strict JSON

# Strict JSON has no nan or infinity. Every JSON rlmesh writes (results file lines, ``--json``
# output) is strict: a non-finite float is written as one of these strings, and read back as
# the float wherever a results file holds a float.
NONFINITE_TOKENS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _token(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (in nested dicts, lists and tuples) replaced by
    its token: ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``.

    Example:
        >>> strict({"reward": float("inf"), "ci": [1.0, float("nan")]})
        {'reward': 'Infinity', 'ci': [1.0, 'NaN']}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else _token(value)
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def dumps(value: Any) -> str:
    """``value`` as strict JSON (valid with ``allow_nan=False``; non-finite floats as tokens).

    Example:
        >>> dumps({"mean_reward": float("-inf"), "episodes": 3})
        '{"mean_reward": "-Infinity", "episodes": 3}'
    """
    return json.dumps(strict(value), allow_nan=False)


def decode_float(value: Any, where: str) -> float:
    """A float a results file holds: a JSON number, or a non-finite token (``strict``).

    Raises:
        ResultsFileError: anything else (``where`` names the file, line and field).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in NONFINITE_TOKENS:
        return NONFINITE_TOKENS[value]
    raise ResultsFileError(
        f"{where} is {value!r}; expected a number or one of {sorted(NONFINITE_TOKENS)}"
    )


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
        record = asdict(self)
        for name in OPTIONAL_FIELDS:
            if record[name] is None:
                del record[name]
        return record


# The fields every episode line holds (format 1); the ones after them are optional, written
# only when set (``EpisodeResult.to_dict``).
_FORMAT_1_FIELDS = 13
OPTIONAL_FIELDS = tuple(field.name for field in fields(EpisodeResult))[_FORMAT_1_FIELDS:]


def _episode_order(episode: EpisodeResult) -> Any:
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


_COLUMNS = ("op", "metric", "unit", "count", "avg", "p50", "p95", "p99", "max")
_TEXT_COLUMNS = 3  # op, metric and unit align left; the numbers align right


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
    ``elapsed_s`` its wall time. The driver sets all four.

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

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields only through object.__setattr__.
        ordered = tuple(sorted(self.episodes, key=_episode_order))
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
            **_run_fields(self),
            failed=np.array([episode.error is not None for episode in episodes], dtype=bool),
            task=task_column([episode.task for episode in episodes]),
        )

    def summary(self) -> dict[str, Any]:
        """The summary dict ``rlmesh eval --json`` prints for this run (``stats.summarize``)."""
        from .stats import summarize  # stats builds on this module

        return summarize(self)

    def format_summary(self) -> str:
        """The summary table ``rlmesh eval`` prints for this run (``stats.format_summary``)."""
        from .stats import format_summary

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


_RUN_FIELDS = (
    "base_seed",
    "wasted_steps",
    "telemetry",
    "observer_errors",
    "core",
    "success_rule",
    "episodes_requested",
    "elapsed_s",
)


def _run_fields(run: Any) -> dict[str, Any]:
    return {name: getattr(run, name) for name in _RUN_FIELDS}


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
        per_episode = {name: getattr(self, name)[rows] for name in _EPISODE_COLUMNS}
        optional = {
            name: None if getattr(self, name) is None else getattr(self, name)[rows]
            for name in ("failed", "task")
        }
        return replace(self, **per_episode, **optional, **fields)


_EPISODE_COLUMNS = ("index", "steps", "reward", "success", "success_reported")


def task_column(tasks: list[str | None]) -> np.ndarray | None:
    """``RunColumns.task`` of episodes whose tasks are ``tasks``: None when none has one."""
    if all(task is None for task in tasks):
        return None
    return np.array([task or "" for task in tasks], dtype=str)


# ---------------------------------------------------------------------------- results files

HEADER_KEY = "rlmesh_results"  # marks the header line; its value is the format version
RUN_KEY = "rlmesh_run"  # marks a run-segment line; its value is the format version
RESUME_KEY = "rlmesh_resume"  # marks a resumption that changed a recorded, non-identity field
TASK_KEY = "rlmesh_task"  # marks a suite task's header (what that task's resumption must match)
SUITE_KEY = "suite"  # the header field of a suite's file: its tasks, as plain data
FORMAT_VERSION = 1
LOCK_SUFFIX = ".lock"  # the writer's lock file sits next to the results file

# Header fields a resumed run records but need not match: the cores give equal results by
# contract, so a run started on one may be finished on the other; the provenance record
# (rlmesh.provenance: versions, host, command line) says where a segment ran.
RECORDED_NOT_IDENTITY = frozenset({"core", "provenance"})
# The policy's source file's sha256: a change is refused unless the caller allows it.
POLICY_HASH_KEY = "policy_sha256"


def _telemetry_to_json(rows: Iterable[TelemetryRow]) -> list[dict[str, Any]]:
    # A rate row's percentiles do not exist: null, as in a summary. An infinite figure is a
    # token (``strict``), read back by _telemetry_from_json.
    return [
        {
            key: None if isinstance(v, float) and math.isnan(v) else v
            for key, v in asdict(row).items()
        }
        for row in rows
    ]


def _telemetry_from_json(rows: Iterable[dict[str, Any]]) -> tuple[TelemetryRow, ...]:
    def figure(value: Any) -> Any:
        if value is None:  # a percentile that does not exist
            return math.nan
        return NONFINITE_TOKENS.get(value, value) if isinstance(value, str) else value

    return tuple(
        TelemetryRow(row["op"], row["metric"], row["unit"], *map(figure, _telemetry_numbers(row)))
        for row in rows
    )


def _telemetry_numbers(row: dict[str, Any]) -> list[Any]:
    return [row[name] for name in _COLUMNS[_TEXT_COLUMNS:]]


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


@dataclass
class FileContents:
    """What a results file holds, by line kind: its header (line 1), its episodes, its run
    segments, its resumptions and a suite's task headers, and how many bytes of it are whole
    lines (``dropped``: a last line cut off mid-write, set aside)."""

    header: dict[str, Any] | None
    episodes: list[EpisodeResult]
    runs: list[dict[str, Any]]
    valid_bytes: int
    dropped: bytes
    resumes: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # a suite's task headers

    def config(self) -> dict[str, Any]:
        """The header without its format key (a file's header is always there once
        ``read_contents`` returned it)."""
        assert self.header is not None
        return _config(self.header)


_EPISODE_FIELDS = tuple(field.name for field in fields(EpisodeResult))
_FLOAT_FIELDS = ("reward", "duration_s", "predict_ms", "step_ms")


def _record(raw: bytes, where: str) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        raise ResultsFileError(
            f"{where} is not JSON ({raw[:60]!r}); a results file holds one JSON object a line"
        ) from None
    if not isinstance(record, dict):
        raise ResultsFileError(f"{where} is {raw[:60]!r}, expected a JSON object")
    return record


def _check_header(record: dict[str, Any], raw: bytes, where: str) -> None:
    if HEADER_KEY not in record:
        raise ResultsFileError(
            f"{where}: expected the header line {{{HEADER_KEY!r}: {FORMAT_VERSION}, ...}}, "
            f"got {raw[:60]!r}; is this an rlmesh results file?"
        )


def _episode(record: dict[str, Any], where: str) -> EpisodeResult:
    for name in _FLOAT_FIELDS:
        if name in record:
            record[name] = decode_float(record[name], f"{where}, field {name!r}")
    try:
        return EpisodeResult(**record)
    except TypeError as exc:
        raise ResultsFileError(
            f"{where} is not an episode line ({exc}); expected the fields {list(_EPISODE_FIELDS)}"
        ) from None


def read_contents(path: str | os.PathLike[str], *, cut_off: str = "skipped") -> FileContents:
    """Every line of a results file, by kind: the one reader of the format.

    A header must be there; a last line cut off mid-write (a crash) is set aside with a
    warning that says it was ``cut_off`` ("skipped" by readers, "repaired" by a resumption).

    Raises:
        ResultsFileError: the file cannot be read, is empty, or a line is not of a kind the
            format knows (the message names the file and line).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=False) as out:
        ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
        >>> contents = read_contents(path)
        >>> contents.config(), [episode.index for episode in contents.episodes]
        ({'env': 'CartPole-v1'}, [0])
    """
    contents = _read(path)
    if contents.dropped:
        _warn_dropped(path, contents.dropped, cut_off)
    if contents.header is None:
        raise ResultsFileError(f"{os.fspath(path)} is empty: it holds no results header")
    return contents


def _read(path: str | os.PathLike[str]) -> FileContents:
    """Parse a results file line by line; a last line without its newline (cut by a crash)
    is set aside."""
    contents = FileContents(None, [], [], 0, b"")
    seen: set[int] = set()
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ResultsFileError(f"{os.fspath(path)}: cannot read it ({exc.strerror})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                contents.dropped = raw
                break
            contents.valid_bytes += len(raw)
            raw = raw[:-1]
            where = f"{os.fspath(path)}, line {number}"
            record = _record(raw, where)
            if number == 1:
                _check_header(record, raw, where)
                contents.header = record
            elif RUN_KEY in record:
                contents.runs.append(record)
            elif RESUME_KEY in record:
                contents.resumes.append(record)
            elif TASK_KEY in record:
                contents.tasks.append(record)
            else:
                episode = _episode(record, where)
                key = (episode.task, episode.index)
                if key in seen:
                    raise ResultsFileError(_repeated(where, episode.index, episode.task))
                seen.add(key)
                contents.episodes.append(episode)
    if contents.header is not None and not _judged_by_rule(contents.header):
        contents.episodes = [
            replace(episode, success_reported=episode.success is not None)
            for episode in contents.episodes
        ]
    return contents


def _repeated(where: str, index: int, task: str | None) -> str:
    of_task = "" if task is None else f" of task {task!r}"
    return f"{where} repeats episode index {index}{of_task}"


def _judged_by_rule(header: dict[str, Any]) -> bool:
    """A file written since success rules (a suite's: its tasks' headers record them): its
    episodes say whether the env reported success. Before, a success on file was always the
    env's."""
    return "success_rule" in header or SUITE_KEY in header


def _warn_dropped(path: str | os.PathLike[str], dropped: bytes, action: str) -> None:
    preview = dropped if len(dropped) <= 60 else dropped[:60] + b"..."
    warnings.warn(
        f"{os.fspath(path)}: the last line was cut off mid-write (a crash?); {action} its "
        f"{len(dropped)} bytes: {preview!r}",
        UserWarning,
        stacklevel=3,
    )


def _file_fields(header: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``RunResult`` fields (but the episodes) of a file's header and run segments."""
    rule = SuccessRule.from_json(header.get("success_rule"))
    if rule.pending:  # an env factory's threshold: its run segments recorded what it was
        resolved = [run["success_rule"] for run in runs if run.get("success_rule")]
        if resolved:
            rule = SuccessRule.from_json(resolved[-1])
    elapsed = [run["elapsed_s"] for run in runs if run.get("elapsed_s") is not None]
    requested = header.get("episodes")
    return {
        "base_seed": header.get("seed"),
        "wasted_steps": sum(run.get("wasted_steps", 0) for run in runs),
        "observer_errors": sum(run.get("observer_errors", 0) for run in runs),
        "telemetry": merge_telemetry(
            [_telemetry_from_json(run.get("telemetry", [])) for run in runs]
        )
        if runs
        else (),
        "core": header.get("core"),
        "success_rule": rule,
        "episodes_requested": requested if isinstance(requested, int) else None,
        "elapsed_s": math.fsum(elapsed) if elapsed else None,
    }


def _combine(header: dict[str, Any], episodes: list[EpisodeResult], runs: list[dict[str, Any]]):
    """The file's episodes and run segments as one ``RunResult``, and their total seconds."""
    result = RunResult(episodes=tuple(episodes), **_file_fields(header, runs))
    return result, result.elapsed_s


def read_results(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[EpisodeResult]]:
    """A results file's header (without its format key) and episodes, sorted by index.

    Reads only: a cut-off last line is skipped with a warning, not repaired.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=False) as out:
        ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
        >>> header, episodes = read_results(path)
        >>> header, [episode.reward for episode in episodes]
        ({'env': 'CartPole-v1'}, [12.0])
    """
    header, result, _ = read_run(path)
    return header, list(result.episodes)


def read_run(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], RunResult, float | None]:
    """A results file as its header, one ``RunResult`` over every episode (with the merged
    telemetry and waste of every run segment, the header's core, success rule and episode
    count), and the segments' total seconds (None if no segment recorded its time)."""
    contents = read_contents(path)
    result, elapsed = _combine(contents.header, contents.episodes, contents.runs)
    return _config(contents.header), result, elapsed


def _config(header: dict[str, Any], marker: str = HEADER_KEY) -> dict[str, Any]:
    return {key: value for key, value in header.items() if key != marker}


class _WriterLock:
    """The exclusive right to write one results file, held for a whole run.

    The lock is ``fcntl.flock`` on a lock file next to the results file (``PATH.lock``), which
    holds its owner's pid, host and start time, so a second writer can say who holds it. The
    operating system drops a flock when its process ends however it ends, so a lock file left
    behind by a killed run is simply taken over. Readers take no lock. Without ``fcntl``
    (Windows) the lock file is created exclusively instead; one left by a killed run must then
    be deleted by hand, and the error says so.
    """

    def __init__(self, lock_path: str, fd: int) -> None:
        self.lock_path = lock_path
        # A file object owns the descriptor, so a lock its owner forgot to release is still
        # dropped when the object is collected (the flock goes with the descriptor).
        self._file: IO[bytes] | None = os.fdopen(fd, "r+b", buffering=0)

    @classmethod
    def acquire(cls, results_path: str) -> _WriterLock:
        """The lock of ``results_path``, or a ``ResultsFileLockedError`` naming its holder."""
        lock_path = results_path + LOCK_SUFFIX
        if fcntl is None:
            return cls._acquire_exclusive(results_path, lock_path)
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise _locked_error(results_path, holder, stale_hint=False) from None
            # The previous holder removes the lock file before releasing it: a lock taken on
            # the removed file guards nothing, so take it again on the file at the path.
            if _same_file(fd, lock_path):
                break
            os.close(fd)
        _write_holder(fd)
        return cls(lock_path, fd)

    @classmethod
    def _acquire_exclusive(cls, results_path: str, lock_path: str) -> _WriterLock:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with open(lock_path, "rb") as handle:
                holder = _parse_holder(handle.read())
            raise _locked_error(results_path, holder, stale_hint=True) from None
        _write_holder(fd)
        return cls(lock_path, fd)

    def release(self) -> None:
        """Remove the lock file and drop the lock; a second call does nothing."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            if _same_file(file.fileno(), self.lock_path):
                os.unlink(self.lock_path)
        finally:
            file.close()


def _same_file(fd: int, path: str) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _write_holder(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(holder).encode())


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse_holder(os.read(fd, 4096))


def _parse_holder(data: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(data)
    except ValueError:  # the holder is between taking the lock and writing its name
        return {}
    return holder if isinstance(holder, dict) else {}


def _locked_error(path: str, holder: dict[str, Any], *, stale_hint: bool) -> ResultsFileLockedError:
    if holder:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, running since {holder.get('since')}"
        )
    else:
        who = "a process that has not recorded its pid yet"
    hint = f"; if no such run is alive, delete {path}{LOCK_SUFFIX}" if stale_hint else ""
    return ResultsFileLockedError(
        f"{path} is being written by another run ({who}): wait for it to end or choose another "
        f"path (reading it, e.g. rlmesh report, works meanwhile){hint}",
        path=path,
        holder=holder,
    )


# ---------------------------------------------------------------------------- reading columns

# read_columns reads a file in blocks of this many bytes, so its memory is a few times this
# plus the columns (34 bytes an episode), however long the file. A block that fits in the CPU's
# cache is scanned about twice as fast as a 16 MB one.
READ_BLOCK_BYTES = 1 << 20

# An episode line as ResultsFile writes it (json.dumps of EpisodeResult.to_dict()): each field
# is this literal then its value, and the line ends with "}". read_columns parses such lines
# with numpy, a block at a time; any other line goes through json.
_LITERALS = tuple(
    (b"{" if k == 0 else b" ") + json.dumps(name).encode() + b": "
    for k, name in enumerate(_EPISODE_FIELDS)
)
_FIELD = {name: k for k, name in enumerate(_EPISODE_FIELDS)}
_NEWLINE, _COMMA, _CLOSE = ord("\n"), ord(","), ord("}")


def _words(literal: bytes) -> list[tuple[int, int]]:
    """(offset, little-endian uint64) pairs covering ``literal`` (8 bytes or longer)."""
    offsets = sorted({*range(0, len(literal) - 7, 8), len(literal) - 8})
    return [(o, int.from_bytes(literal[o : o + 8], "little")) for o in offsets]


_LITERAL_WORDS = tuple(_words(literal) for literal in _LITERALS)


@dataclass
class _ColumnParts:
    """Columns read so far, one array per block, and the line number of each episode."""

    index: list[np.ndarray] = field(default_factory=list)
    steps: list[np.ndarray] = field(default_factory=list)
    reward: list[np.ndarray] = field(default_factory=list)
    success: list[np.ndarray] = field(default_factory=list)
    success_reported: list[np.ndarray] = field(default_factory=list)
    failed: list[np.ndarray] = field(default_factory=list)
    task: list[np.ndarray] = field(default_factory=list)
    line: list[np.ndarray] = field(default_factory=list)

    def add(self, **columns: np.ndarray) -> None:
        for name, column in columns.items():
            getattr(self, name).append(column)

    def add_episode(self, episode: EpisodeResult, line: int) -> None:
        self.add(
            index=np.array([episode.index], dtype=np.int64),
            steps=np.array([episode.steps], dtype=np.int64),
            reward=np.array([episode.reward], dtype=np.float64),
            success=np.array(
                [-1 if episode.success is None else int(episode.success)], dtype=np.int8
            ),
            success_reported=np.array([episode.success_reported], dtype=bool),
            failed=np.array([episode.error is not None], dtype=bool),
            task=np.array([episode.task or ""], dtype=str),
            line=np.array([line], dtype=np.int64),
        )

    def joined(self, name: str, dtype: Any) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _spans(data: np.ndarray, start: np.ndarray, stop: np.ndarray) -> bytes:
    """``data[start[i] : stop[i] + 1]`` for every i, concatenated (each span ends at a comma)."""
    lengths = stop + 1 - start
    offsets = np.cumsum(lengths) - lengths
    picks = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets - start, lengths)
    return data[picks].tobytes()


def _numbers(text: bytes, dtype: Any, count: int) -> np.ndarray | None:
    """``count`` comma-terminated numbers (ints, floats or non-finite tokens), or None."""
    if b'"' in text:
        for token, number in ((b'"-Infinity"', b"-inf"), (b'"Infinity"', b"inf")):
            text = text.replace(token, number)
        text = text.replace(b'"NaN"', b"nan")
        if b'"' in text:
            return None
    try:
        values = np.fromstring(text.decode("ascii"), dtype=dtype, sep=",")
    except (ValueError, UnicodeDecodeError):
        return None
    return values if values.size == count else None


def _digits(data: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray | None:
    """The non-negative integers written in ``data[start[i] : stop[i]]``, or None if any is
    not 1 to 18 decimal digits (a sign, a point, an exponent: left to json)."""
    length = stop - start
    if length.size == 0:
        return np.empty(0, dtype=np.int64)
    if length.min() < 1 or length.max() > 18:
        return None
    value = np.zeros(length.size, dtype=np.int64)
    for j in range(int(length.max())):
        live = j < length
        digit = (data[np.where(live, start + j, start)] - ord("0")).astype(np.int64)
        if np.any(live & ((digit < 0) | (digit > 9))):
            return None
        value = np.where(live, value * 10 + digit, value)
    return value


def _word_keyword(data: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray | None:
    """Per value: 1 ``true``, 0 ``false``, -1 ``null``; None if any value is something else."""
    first, last, length = data[start], data[stop - 1], stop - start
    true = (first == ord("t")) & (last == ord("e")) & (length == 4)
    false = (first == ord("f")) & (last == ord("e")) & (length == 5)
    null = (first == ord("n")) & (last == ord("l")) & (length == 4)
    if not np.all(true | false | null):
        return None
    return np.where(true, 1, np.where(false, 0, -1)).astype(np.int8)


def _quoted(data: np.ndarray, present: np.ndarray, start: np.ndarray, stop: np.ndarray) -> bool:
    """Whether every present value in ``data[start : stop]`` is a JSON string or null."""
    start, stop = start[present], stop[present]
    if not start.size:
        return True
    length = stop - start
    null = (length == 4) & (data[start] == ord("n")) & (data[stop - 1] == ord("l"))
    text = (length >= 2) & (data[start] == ord('"')) & (data[stop - 1] == ord('"'))
    return bool(np.all(null | text))


def _texts(
    data: np.ndarray, present: np.ndarray, start: np.ndarray, stop: np.ndarray
) -> np.ndarray | None:
    """Per line, the string value in ``data[start : stop]`` (``""`` where the field is absent
    or null), or None if one holds an escape (left to json). Lines in a row with the same
    value (a suite's file holds a task's episodes together) decode it once."""
    if not present.size:
        return np.empty(0, dtype=str)
    quoted = present & (data[np.minimum(start, data.size - 1)] == ord('"'))
    length = np.where(quoted, stop - start - 2, 0)  # between the quotes; absent or null: 0
    if not length.size:
        return np.empty(0, dtype=str)
    width = max(int(length.max()), 1)
    at = start[:, None] + 1 + np.arange(width)
    live = np.arange(width) < length[:, None]
    text = np.where(live, data[np.minimum(at, data.size - 1)], 0).astype(np.uint8)
    if np.any(text == ord("\\")):
        return None
    changes = np.flatnonzero(np.any(text[1:] != text[:-1], axis=1) | (length[1:] != length[:-1]))
    firsts = np.concatenate([[0], changes + 1])
    values = [text[row, : length[row]].tobytes().decode("utf-8") for row in firsts.tolist()]
    counts = np.diff(np.concatenate([firsts, [length.size]]))
    return np.repeat(np.array(values, dtype=str), counts)


def _fast_episodes(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, commas: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Which lines (positions in ``starts``) are canonical episode lines, and their columns.

    A canonical line has exactly one comma between fields (so no value holds one), the
    format-1 fields' literals where they belong, then any of the optional fields in order
    (``OPTIONAL_FIELDS``, each a string or null), and values that parse; a line that is not is
    left to json (a block whose values do not parse is left to json whole).
    """
    first_comma = np.searchsorted(commas, starts)
    separators = _FORMAT_1_FIELDS - 1
    line_commas = np.searchsorted(commas, ends) - first_comma
    canonical = (line_commas >= separators) & (ends - starts > len(_LITERALS[0]))
    rows = np.flatnonzero(canonical)
    if rows.size == 0:
        return rows, {}
    # Field k's literal starts at the line start (k = 0) or right after comma k - 1.
    at = commas[first_comma[rows, None] + np.arange(separators)]
    literal_at = np.concatenate([starts[rows, None], at + 1], axis=1)
    value_start = literal_at + np.array([len(literal) for literal in _LITERALS[:_FORMAT_1_FIELDS]])
    # The comma after the format-1 fields (where the optional ones follow), else the "}".
    cursor = first_comma[rows] + separators
    remaining = line_commas[rows] - separators
    line_end = ends[rows] - 1
    last = commas.size - 1
    base_stop = np.where(remaining > 0, commas[np.minimum(cursor, last)], line_end)
    value_stop = np.concatenate([at, base_stop[:, None]], axis=1)
    words = np.ndarray((data.size - 7,), dtype="<u8", buffer=data, strides=(1,))
    top = words.size - 1
    good = data[ends[rows] - 1] == _CLOSE
    # A line that is not an episode's may put a literal's place past the block's end.
    good &= value_start.max(axis=1) < ends[rows]
    last_word = top
    for k, pairs in enumerate(_LITERAL_WORDS[:_FORMAT_1_FIELDS]):
        for offset, word in pairs:
            good &= words[np.minimum(literal_at[:, k] + offset, last_word)] == word
        good &= value_start[:, k] < value_stop[:, k]
    optional = {}
    for j, name in enumerate(OPTIONAL_FIELDS):
        literal_start = commas[np.minimum(cursor, last)] + 1
        present = remaining > 0
        for offset, word in _LITERAL_WORDS[_FORMAT_1_FIELDS + j]:
            present &= words[np.minimum(literal_start + offset, top)] == word
        start = literal_start + len(_LITERALS[_FORMAT_1_FIELDS + j])
        stop = np.where(remaining > 1, commas[np.minimum(cursor + 1, last)], line_end)
        present &= start < stop
        optional[name] = (present, start, stop)
        cursor, remaining = cursor + present, remaining - present
    good &= remaining == 0  # every comma accounted for: no field but those known
    keep = np.flatnonzero(good)
    rows, value_start, value_stop = rows[keep], value_start[keep], value_stop[keep]
    optional = {name: tuple(part[keep] for part in parts) for name, parts in optional.items()}
    count = rows.size

    def numbers(name: str, dtype: Any) -> np.ndarray | None:
        k = _FIELD[name]
        return _numbers(_spans(data, value_start[:, k], value_stop[:, k]), dtype, count)

    def keyword(name: str) -> np.ndarray | None:
        k = _FIELD[name]
        return _word_keyword(data, value_start[:, k], value_stop[:, k])

    def integers(name: str) -> np.ndarray | None:
        k = _FIELD[name]
        return _digits(data, value_start[:, k], value_stop[:, k])

    if not all(_quoted(data, *parts) for parts in optional.values()):
        return rows[:0], {}
    columns = {
        "index": integers("index"),
        "steps": integers("steps"),
        "reward": numbers("reward", np.float64),
        "success": keyword("success"),
        "success_reported": keyword("success_reported"),
        "task": _texts(data, *optional["task"]),
    }
    if any(column is None for column in columns.values()) or np.any(
        columns["success_reported"] < 0
    ):
        return rows[:0], {}
    columns["success_reported"] = columns["success_reported"].astype(bool)
    present, start, stop = optional["error"]
    null = (stop - start == 4) & (data[np.minimum(start, data.size - 1)] == ord("n"))
    columns["failed"] = present & ~null  # a failed episode's line holds its error's text
    return rows, columns


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank among the distinct ``values`` (``np.unique``'s inverse), computed on
    the runs of equal values: a suite's file holds each task's episodes together, so there
    are few runs, and sorting them is cheap where sorting every value is not."""
    changes = np.flatnonzero(values[1:] != values[:-1]) + 1
    firsts = np.concatenate([[0], changes])
    run_ranks = np.unique(values[firsts], return_inverse=True)[1]
    return np.repeat(run_ranks, np.diff(np.concatenate([firsts, [values.size]])))


@dataclass
class _Scan:
    """What ``read_columns`` reads of a file: its header, columns, and the other records."""

    header: dict[str, Any]
    columns: RunColumns
    runs: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    resumes: list[dict[str, Any]]


def read_columns(path: str | os.PathLike[str]) -> tuple[dict[str, Any], RunColumns]:
    """A results file's header (without its format key) and the file as ``RunColumns``: what
    ``rlmesh report`` summarizes, in bounded memory and without an object per episode.

    The same figures as ``read_run(path)[1].columns()``, and the same errors for a line that
    is not JSON, an episode index given twice (of one task, in a suite's file) or a missing
    header; a cut-off last line is skipped with a warning. Episode lines as rlmesh writes them
    are parsed a block at a time with numpy (their ``index``, ``steps``, ``reward``,
    ``success``, ``success_reported`` and ``task``: what a summary reads); any other line is
    parsed as JSON. A suite's file reads per task with ``read_suite_columns``.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"episodes": 3}, resume=False) as out:
        ...     for k in (2, 0):
        ...         out.append(EpisodeResult(k, k, k, 0, 10, 1.5 * k, True, False, None, 0, 0, 0))
        >>> header, columns = read_columns(path)
        >>> columns.index.tolist(), columns.reward.tolist(), columns.episodes_requested
        ([0, 2], [0.0, 3.0], 3)
    """
    scan = _scan_columns(path)
    return _config(scan.header), scan.columns


def read_columns_with_resumes(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], RunColumns, list[dict[str, Any]]]:
    """``read_columns``, and the records of the file's resumptions that changed a recorded
    field (``rlmesh_resume`` lines, without their marker), in file order: each one's
    ``provenance`` among them.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"episodes": 1, "core": "rust"}, resume=False) as out:
        ...     pass
        >>> ResultsFile.open(path, {"episodes": 1, "core": "python"}, resume=True).close()
        >>> read_columns_with_resumes(path)[2]
        [{'core': 'python'}]
    """
    scan = _scan_columns(path)
    return _config(scan.header), scan.columns, scan.resumes


def read_suite_columns(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, RunColumns]]:
    """A suite's results file (``rlmesh.run_suite``) as its header and, for every task of the
    suite in its order, that task's ``RunColumns`` (with its success rule, episodes asked
    for, telemetry and waste; a task never started holds no episodes).

    Raises:
        ResultsFileError: the file is not a suite's (its header lists no tasks), or as
            ``read_columns``.
    """
    scan = _scan_columns(path)
    tasks = _suite_tasks(path, scan.header)
    headers = {record["task"]: _config(record, TASK_KEY) for record in scan.tasks}
    columns, task = scan.columns, scan.columns.task
    split = {}
    for spec in tasks:
        name = spec["name"]
        # The columns are sorted by task, then index: each task's episodes are one slice.
        rows = slice(0, 0)
        if task is not None:
            start, stop = np.searchsorted(task, name, "left"), np.searchsorted(task, name, "right")
            rows = slice(int(start), int(stop))
        header = headers.get(name, spec)
        runs = [run for run in scan.runs if run.get("task") == name]
        split[name] = columns.select(rows, **_file_fields(header, runs))
    return _config(scan.header), split


def read_suite(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, RunResult]]:
    """A suite's results file as its header and one ``RunResult`` per task of the suite, in
    its order (a task never started holds no episodes). Errors as ``read_suite_columns``."""
    contents = read_contents(path)
    tasks = _suite_tasks(path, contents.header)
    headers = {record["task"]: _config(record, TASK_KEY) for record in contents.tasks}
    runs = {}
    for spec in tasks:
        name = spec["name"]
        episodes = [episode for episode in contents.episodes if episode.task == name]
        task_runs = [run for run in contents.runs if run.get("task") == name]
        runs[name], _ = _combine(headers.get(name, spec), episodes, task_runs)
    return _config(contents.header), runs


def _suite_tasks(path: str | os.PathLike[str], header: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = header.get(SUITE_KEY)
    if not isinstance(tasks, list) or not all(
        isinstance(task, dict) and isinstance(task.get("name"), str) for task in tasks
    ):
        raise ResultsFileError(
            f"{os.fspath(path)} is not a suite's results file: its header lists no tasks "
            f"({SUITE_KEY!r}); read it with read_columns / read_run"
        )
    return tasks


def _scan_columns(path: str | os.PathLike[str]) -> _Scan:
    name = os.fspath(path)
    parts = _ColumnParts()
    header: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    first_line = 1
    with open(path, "rb") as handle:
        carry = b""
        while True:
            block = handle.read(READ_BLOCK_BYTES)
            if not block:
                break
            text = carry + block
            cut = text.rfind(b"\n") + 1
            text, carry = text[:cut], text[cut:]
            if not text:
                continue
            data = np.frombuffer(text, dtype=np.uint8)
            ends = np.flatnonzero(data == _NEWLINE)
            starts = np.concatenate([[0], ends[:-1] + 1])
            rows, columns = _fast_episodes(data, starts, ends, np.flatnonzero(data == _COMMA))
            if first_line == 1 and rows.size and rows[0] == 0:  # line 1 must be the header
                rows, columns = rows[1:], {key: value[1:] for key, value in columns.items()}
            if rows.size:
                parts.add(line=first_line + rows, **columns)
            slow = np.ones(starts.size, dtype=bool)
            slow[rows] = False
            for position in np.flatnonzero(slow).tolist():
                raw = text[starts[position] : ends[position]]
                number = first_line + position
                where = f"{name}, line {number}"
                record = _record(raw, where)
                if number == 1:
                    _check_header(record, raw, where)
                    header = record
                elif RUN_KEY in record:
                    runs.append(record)
                elif RESUME_KEY in record:
                    resumes.append(_config(record, RESUME_KEY))
                elif TASK_KEY in record:
                    tasks.append(record)
                else:
                    parts.add_episode(_episode(record, where), number)
            first_line += starts.size
    if carry:
        _warn_dropped(path, carry, "skipped")
    if header is None:
        raise ResultsFileError(f"{name} is empty: it holds no results header")
    index = parts.joined("index", np.int64)
    task = parts.joined("task", str)
    has_tasks = bool(task.size) and bool(np.any(task != ""))
    # (task, index) as one sortable key: the task's rank among the names, then the index.
    rank = _ranks(task) if has_tasks else None
    key = index if rank is None else rank.astype(np.int64) * (1 << 40) + index
    # A run of one lane writes its episodes in index order: then nothing needs reordering.
    order = None if np.all(key[1:] > key[:-1]) else np.argsort(key, kind="stable")
    if order is not None and np.any(key[order][1:] == key[order][:-1]):
        # As json reading finds it: the first line, in file order, that repeats an index.
        lines = parts.joined("line", np.int64)
        by_line = np.lexsort((lines, key))
        again = np.flatnonzero(key[by_line][1:] == key[by_line][:-1]) + 1
        first = by_line[again[np.argmin(lines[by_line][again])]]
        raise ResultsFileError(
            _repeated(
                f"{name}, line {int(lines[first])}",
                int(index[first]),
                str(task[first]) if has_tasks and task[first] else None,
            )
        )

    def column(name: str, dtype: Any) -> np.ndarray:
        joined = parts.joined(name, dtype)
        return joined if order is None else joined[order]

    success = column("success", np.int8)
    reported = column("success_reported", bool)
    failed = column("failed", bool)
    if not _judged_by_rule(header):
        reported = success >= 0
    columns = RunColumns(
        index=column("index", np.int64),
        steps=column("steps", np.int64),
        reward=column("reward", np.float64),
        success=success,
        success_reported=reported,
        **_file_fields(header, runs),
        failed=failed,
        task=column("task", str) if has_tasks else None,
    )
    return _Scan(header, columns, runs, tasks, resumes)


class ResultsFile:
    """A JSON-lines results file, written as episodes complete, and resumable.

    Format: line 1 is the header ``{"rlmesh_results": 1, ...config}``, the run's configuration
    (whatever the caller passes: policy, env, seeds, caps, version, core). Then one line per
    completed episode, ``EpisodeResult.to_dict()``, in completion order, flushed as written,
    so a crash loses at most the line being written. At the end of each run segment (a run, or
    one resumption of it), ``append_run`` writes ``{"rlmesh_run": 1, "wasted_steps": ..,
    "elapsed_s": .., "telemetry": [..]}``, so the summary of a file needs nothing else. A
    resumption that changed a recorded field (its ``core``, or an allowed ``policy_sha256``)
    first writes ``{"rlmesh_resume": 1, field: its value, ...}``.

    ``ResultsFile.open(path, header, resume=...)`` first takes the file's writer lock (see
    ``_WriterLock``), held until ``close``: while another writer holds it, the file is left
    untouched and a ``ResultsFileLockedError`` names the holder. A missing or empty file is
    started with the header. A file holding results is refused without ``resume``. With
    ``resume``, the file's header (updated by its recorded resumptions) must equal ``header``
    (after a JSON round trip) or the differing fields are listed in a ``ResultsFileError``,
    except ``core`` (the cores' results are equal by contract), ``provenance`` (where and from
    what each segment ran: ``rlmesh.provenance``), and ``policy_sha256`` when
    ``allow_changed_policy`` (then with a warning); a last line cut mid-write is dropped from
    the file with a warning; the completed episodes are loaded (``episodes``, ``indices``) and
    new lines are appended.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> episode = EpisodeResult(3, 5, 3, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2)
        >>> with ResultsFile.open(path, {"episodes": 4}, resume=False) as out:
        ...     out.append(episode)
        >>> with ResultsFile.open(path, {"episodes": 4}, resume=True) as out:
        ...     sorted(out.indices)
        [3]
        >>> ResultsFile.open(path, {"episodes": 5}, resume=True)
        Traceback (most recent call last):
        ...
        rlmesh.errors.ResultsFileError: ... episodes: the file has 4, this run has 5. Resume ...
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        handle: IO[str],
        header: dict[str, Any],
        episodes: list[EpisodeResult],
        runs: list[dict[str, Any]],
        lock: _WriterLock | None = None,
        *,
        tasks: Iterable[dict[str, Any]] = (),
        resumes: Iterable[dict[str, Any]] = (),
    ) -> None:
        self.path = os.fspath(path)
        self.header = header
        self._handle = handle
        self._episodes = list(episodes)
        self._runs = list(runs)
        self._lock = lock
        self._tasks = {record["task"]: record for record in tasks}
        self._resumes = list(resumes)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        resume: bool,
        allow_changed_policy: bool = False,
    ) -> ResultsFile:
        """Start ``path`` with ``header``, or (``resume``) continue the run it holds.

        ``allow_changed_policy``: on resume, accept a ``policy_sha256`` other than the file's
        (the policy's code changed), with a warning, and record the new one.

        ``path`` may also be one task's part of an open suite file (``TaskResults``, what
        ``rlmesh.run_suite`` hands each task's run as its ``results_path``): that task's
        episodes are then the file's, and ``header`` is the task's.
        """
        if isinstance(path, TaskResults):
            return path.begin(header, allow_changed_policy=allow_changed_policy)
        lock = _WriterLock.acquire(os.fspath(path))
        try:
            return cls._open_locked(path, header, resume, allow_changed_policy, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open_locked(
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        resume: bool,
        allow_changed_policy: bool,
        lock: _WriterLock,
    ) -> ResultsFile:
        # The header as it will read back, so a comparison never trips on tuple-vs-list.
        config = json.loads(dumps(_config(header)))
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        if exists and not resume:
            raise ResultsFileError(
                f"{os.fspath(path)} already holds results: pass --resume (resume=True) to "
                "continue that run, or choose another path"
            )
        contents = _read(path) if exists else None
        changed: dict[str, Any] = {}
        if contents is not None and contents.header is not None:
            # Checked before the repair below: a refused resume leaves the file as it was.
            # What the file's run is now: its header, updated by every recorded resumption.
            recorded = _config(contents.header)
            for resumption in contents.resumes:
                recorded.update(_config(resumption, RESUME_KEY))
            _check_suite(path, recorded.get(SUITE_KEY), config.get(SUITE_KEY))
            changed = _check_identity(path, recorded, config, allow_changed_policy)
        if contents is not None and contents.dropped:
            _warn_dropped(path, contents.dropped, "dropped")
            with open(path, "r+b") as handle:
                handle.truncate(contents.valid_bytes)
        if contents is None or contents.header is None:  # nothing usable yet: start afresh
            handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
            handle.write(dumps({HEADER_KEY: FORMAT_VERSION, **config}) + "\n")
            handle.flush()
            return cls(path, handle, config, [], [], lock)
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        results = cls(
            path,
            handle,
            config,
            contents.episodes,
            contents.runs,
            lock,
            tasks=contents.tasks,
            resumes=contents.resumes,
        )
        if changed:
            results._write({RESUME_KEY: FORMAT_VERSION, **changed})
        return results

    @property
    def episodes(self) -> tuple[EpisodeResult, ...]:
        """Every episode in the file, sorted by index (a suite's by task, then index)."""
        return tuple(sorted(self._episodes, key=_episode_order))

    @property
    def indices(self) -> frozenset[int]:
        """The indices of the episodes in the file."""
        return frozenset(episode.index for episode in self._episodes)

    def append(self, episode: EpisodeResult) -> None:
        """Write one completed episode's line and flush it to the OS."""
        self._write(episode.to_dict())
        self._episodes.append(episode)

    def append_run(
        self, result: RunResult, *, elapsed_s: float | None = None, task: str | None = None
    ) -> None:
        """Close a run segment: its wasted steps, observer errors, wall time and telemetry
        (not its episodes, which ``append`` wrote as they completed); ``task``: the suite
        task whose run it was."""
        record = {
            RUN_KEY: FORMAT_VERSION,
            **({} if task is None else {"task": task}),
            "wasted_steps": result.wasted_steps,
            "observer_errors": result.observer_errors,
            "elapsed_s": elapsed_s,
            "telemetry": _telemetry_to_json(result.telemetry),
            "success_rule": result.success_rule.to_json(),
        }
        self._write(record)
        self._runs.append(record)

    def run_result(self) -> tuple[RunResult, float | None]:
        """Every episode in the file as one ``RunResult`` (see ``read_run``), and the seconds
        of the run segments."""
        return _combine(self.header, self._episodes, self._runs)

    def close(self) -> None:
        """Close the file and release its writer lock (a second call does nothing)."""
        try:
            self._handle.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, record: dict[str, Any]) -> None:
        self._handle.write(dumps(record) + "\n")
        self._handle.flush()

    def task(self, name: str) -> TaskResults:
        """Task ``name``'s part of this suite's file, to pass a run as its ``results_path``."""
        return TaskResults(self, name)


class TaskResults:
    """One task's part of a suite's results file: what ``ResultsFile.open`` returns for it,
    and all a run sees of the file.

    The task's run opens it with its own header (``begin``): the first time, that header is
    written as a ``{"rlmesh_task": 1, "task": name, ...}`` line; on a resumption it must match
    the recorded one, as a run's header must match its file's. Its episodes are appended with
    ``task`` set, its run segments name the task, and closing it leaves the file (and its
    lock) to the suite. ``episodes``, ``indices`` and ``run_result`` are the task's alone.
    """

    def __init__(self, file: ResultsFile, name: str) -> None:
        self.file, self.name = file, name
        self.path = file.path
        self.header: dict[str, Any] = {}

    def begin(self, header: dict[str, Any], *, allow_changed_policy: bool) -> TaskResults:
        """Record (or, resuming, check) the task's header; returns this part."""
        file = self.file
        config = {**json.loads(dumps(_config(header))), "task": self.name}
        recorded = file._tasks.get(self.name)
        if recorded is None:
            record = {TASK_KEY: FORMAT_VERSION, **config}
            file._write(record)
            file._tasks[self.name] = record
        else:
            found = _config(recorded, TASK_KEY)
            for resumption in file._resumes:
                if resumption.get("task") == self.name:
                    found.update(_config(resumption, RESUME_KEY))
            where = f"{file.path} (task {self.name!r})"
            changed = _check_identity(where, found, config, allow_changed_policy)
            if changed:
                record = {RESUME_KEY: FORMAT_VERSION, "task": self.name, **changed}
                file._write(record)
                file._resumes.append(record)
        self.header = config
        return self

    @property
    def episodes(self) -> tuple[EpisodeResult, ...]:
        """The task's episodes in the file, sorted by index."""
        return tuple(
            sorted(
                (episode for episode in self.file._episodes if episode.task == self.name),
                key=lambda episode: episode.index,
            )
        )

    @property
    def indices(self) -> frozenset[int]:
        """The indices of the task's episodes in the file."""
        return frozenset(e.index for e in self.file._episodes if e.task == self.name)

    def append(self, episode: EpisodeResult) -> None:
        """Write one of the task's completed episodes, ``task`` set, and flush it."""
        self.file.append(replace(episode, task=self.name))

    def append_run(self, result: RunResult, *, elapsed_s: float | None = None) -> None:
        """Close one of the task's run segments."""
        self.file.append_run(result, elapsed_s=elapsed_s, task=self.name)

    def run_result(self) -> tuple[RunResult, float | None]:
        """The task's episodes and run segments as one ``RunResult``, and their seconds."""
        runs = [run for run in self.file._runs if run.get("task") == self.name]
        return _combine(self.header, list(self.episodes), runs)

    def close(self) -> None:
        """Nothing: the suite's file stays open for its next task."""


def _check_suite(path: str | os.PathLike[str], found: Any, wanted: Any) -> None:
    """Refuse resuming a suite's file with another suite, naming each task and field that
    differ (a task given as plain data: ``rlmesh.Task.to_dict()``)."""
    if found == wanted or not isinstance(found, list) or not isinstance(wanted, list):
        return
    by_name = {task.get("name"): task for task in found if isinstance(task, dict)}
    names = ", ".join(map(str, by_name))
    differences = []
    for task in wanted:
        name = task.get("name")
        if name not in by_name:
            differences.append(f"task {name!r} is not in the file's suite (its tasks: {names})")
            continue
        recorded = by_name.pop(name)
        keys = sorted(set(recorded) | set(task))
        changed = [key for key in keys if recorded.get(key) != task.get(key)]
        differences += [f"task {name!r}, {d}" for d in _differences(recorded, task, changed)]
    differences += [f"task {name!r} is in the file's suite but not in this one" for name in by_name]
    if not differences:  # the same tasks in another order
        differences = [
            f"the tasks are in another order: the file has {[t.get('name') for t in found]}, "
            f"this suite has {[t.get('name') for t in wanted]}"
        ]
    raise ResultsFileError(
        f"{os.fspath(path)} holds another suite than this one: "
        + "; ".join(differences)
        + ". Resume with the same suite, or choose another path"
    )


def _check_identity(
    path: str | os.PathLike[str],
    found: dict[str, Any],
    wanted: dict[str, Any],
    allow_changed_policy: bool,
) -> dict[str, Any]:
    """Refuse a resume whose header differs from the file's in an identity field, listing
    every difference; return the recorded fields this resumption changes (to be recorded)."""
    keys = sorted(set(found) | set(wanted))
    changed = [key for key in keys if found.get(key) != wanted.get(key)]
    policy_changed = POLICY_HASH_KEY in changed
    refused = [
        key
        for key in changed
        if key not in RECORDED_NOT_IDENTITY
        and not (key == POLICY_HASH_KEY and allow_changed_policy)
    ]
    if refused:
        listed = _differences(found, wanted, refused)
        if POLICY_HASH_KEY in refused:
            listed[refused.index(POLICY_HASH_KEY)] += (
                " (the policy's source file changed since the file was started; pass "
                "--allow-changed-policy (allow_changed_policy=True) to add episodes of the new "
                "code to it anyway)"
            )
        raise ResultsFileError(
            f"{os.fspath(path)} holds another run than this one: "
            + "; ".join(listed)
            + ". Resume with the same settings, or choose another path"
        )
    if policy_changed:
        warnings.warn(
            f"{os.fspath(path)}: the policy's source file changed since the file was started "
            f"({_differences(found, wanted, [POLICY_HASH_KEY])[0]}); continuing as "
            "--allow-changed-policy (allow_changed_policy=True) asks, so the file mixes episodes "
            "of both versions",
            UserWarning,
            stacklevel=4,
        )
    return {key: wanted.get(key) for key in changed}


def _differences(found: dict[str, Any], wanted: dict[str, Any], keys: Iterable[str]) -> list[str]:
    return [
        f"{key}: the file has {json.dumps(found.get(key))}, this run has "
        f"{json.dumps(wanted.get(key))}"
        for key in keys
    ]
