"""What a run returns: one ``EpisodeResult`` per scored episode, inside a ``RunResult``.

Both are frozen dataclasses of plain Python values, whichever core ran the episodes, so they
compare, pickle and serialize alike. ``TelemetryRow`` is one line of the run's latency and
throughput telemetry (see ``rlmesh.telemetry``). ``ResultsFile`` is the JSON-lines results file
a run writes as it goes, and resumes (see its docstring for the format).

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

import json
import math
import os
import socket
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from dataclasses import field as dataclasses_field
from typing import IO, Any

from .errors import ResultsFileError, ResultsFileLockedError

try:
    import fcntl
except ImportError:  # Windows: the lock file is created exclusively instead (see _WriterLock)
    fcntl = None  # type: ignore[assignment]


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
        episode = object.__new__(cls)
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
            success=summary.success,
            duration_s=summary.duration_s,
            predict_ms=summary.predict_ms,
            step_ms=summary.step_ms,
        )
        return episode

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in declaration order."""
        return asdict(self)


def succeeded(episode: EpisodeResult) -> bool:
    """Success as rlmesh counts it, everywhere: what the env reported in its final ``info``
    (``is_success``, else ``success``); when it reported nothing, reaching a terminal state
    (``terminated``, as opposed to being truncated) counts as success."""
    return episode.terminated if episode.success is None else episode.success


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
    the lane-steps of surplus episodes; ``telemetry`` is the run's cumulative telemetry;
    ``observer_errors`` counts the ``RuntimeHooks`` observer calls that raised (each was logged
    and the run went on).
    """

    episodes: tuple[EpisodeResult, ...]
    base_seed: int | None
    wasted_steps: int = 0
    telemetry: tuple[TelemetryRow, ...] = ()
    observer_errors: int = 0

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
        """The fraction of episodes that ``succeeded``; nan when there are no episodes."""
        if not self.episodes:
            return math.nan
        return sum(map(succeeded, self.episodes)) / len(self.episodes)

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


# ---------------------------------------------------------------------------- results files

HEADER_KEY = "rlmesh_results"  # marks the header line; its value is the format version
RUN_KEY = "rlmesh_run"  # marks a run-segment line; its value is the format version
RESUME_KEY = "rlmesh_resume"  # marks a resumption that changed a recorded, non-identity field
FORMAT_VERSION = 1
LOCK_SUFFIX = ".lock"  # the writer's lock file sits next to the results file

# Header fields a resumed run records but need not match: the cores give equal results by
# contract, so a run started on one may be finished on the other.
RECORDED_NOT_IDENTITY = frozenset({"core"})
# The policy's source file's sha256: a change is refused unless the caller allows it.
POLICY_HASH_KEY = "policy_sha256"


def _telemetry_to_json(rows: Iterable[TelemetryRow]) -> list[dict[str, Any]]:
    # Strict JSON has no nan: a rate row's missing percentiles are written as null.
    return [
        {
            key: None if isinstance(v, float) and math.isnan(v) else v
            for key, v in asdict(row).items()
        }
        for row in rows
    ]


def _telemetry_from_json(rows: Iterable[dict[str, Any]]) -> tuple[TelemetryRow, ...]:
    return tuple(
        TelemetryRow(**{key: math.nan if v is None else v for key, v in row.items()})
        for row in rows
    )


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
class _Contents:
    """What a results file holds: its header, episodes, run segments, and its valid length."""

    header: dict[str, Any] | None
    episodes: list[EpisodeResult]
    runs: list[dict[str, Any]]
    valid_bytes: int
    dropped: bytes
    resumes: list[dict[str, Any]] = dataclasses_field(default_factory=list)


def _read(path: str | os.PathLike[str]) -> _Contents:
    """Parse a results file; a last line without its newline (cut by a crash) is set aside."""
    with open(path, "rb") as handle:
        data = handle.read()
    valid_bytes = data.rfind(b"\n") + 1  # 0 when there is no complete line
    contents = _Contents(None, [], [], valid_bytes, data[valid_bytes:])
    seen: set[int] = set()
    for number, raw in enumerate(data[:valid_bytes].splitlines(), start=1):
        where = f"{os.fspath(path)}, line {number}"
        try:
            record = json.loads(raw)
        except ValueError:
            raise ResultsFileError(
                f"{where} is not JSON ({raw[:60]!r}); a results file holds one JSON object a line"
            ) from None
        if not isinstance(record, dict):
            raise ResultsFileError(f"{where} is {raw[:60]!r}, expected a JSON object")
        if number == 1:
            if HEADER_KEY not in record:
                raise ResultsFileError(
                    f"{where}: expected the header line {{{HEADER_KEY!r}: {FORMAT_VERSION}, ...}}, "
                    f"got {raw[:60]!r}; is this an rlmesh results file?"
                )
            contents.header = record
        elif RUN_KEY in record:
            contents.runs.append(record)
        elif RESUME_KEY in record:
            contents.resumes.append(record)
        else:
            try:
                episode = EpisodeResult(**record)
            except TypeError as exc:
                raise ResultsFileError(
                    f"{where} is not an episode line ({exc}); expected the fields "
                    f"{[field.name for field in fields(EpisodeResult)]}"
                ) from None
            if episode.index in seen:
                raise ResultsFileError(f"{where} repeats episode index {episode.index}")
            seen.add(episode.index)
            contents.episodes.append(episode)
    return contents


def _warn_dropped(path: str | os.PathLike[str], dropped: bytes, action: str) -> None:
    preview = dropped if len(dropped) <= 60 else dropped[:60] + b"..."
    warnings.warn(
        f"{os.fspath(path)}: the last line was cut off mid-write (a crash?); {action} its "
        f"{len(dropped)} bytes: {preview!r}",
        UserWarning,
        stacklevel=3,
    )


def _combine(header: dict[str, Any], episodes: list[EpisodeResult], runs: list[dict[str, Any]]):
    """The file's episodes and run segments as one ``RunResult``, and their total seconds."""
    result = RunResult(
        episodes=tuple(episodes),
        base_seed=header.get("seed"),
        wasted_steps=sum(run.get("wasted_steps", 0) for run in runs),
        observer_errors=sum(run.get("observer_errors", 0) for run in runs),
        telemetry=merge_telemetry([_telemetry_from_json(run.get("telemetry", [])) for run in runs])
        if runs
        else (),
    )
    elapsed = [run["elapsed_s"] for run in runs if run.get("elapsed_s") is not None]
    return result, (math.fsum(elapsed) if elapsed else None)


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
    telemetry and waste of every run segment), and the segments' total seconds (None if no
    segment recorded its time)."""
    contents = _read(path)
    if contents.dropped:
        _warn_dropped(path, contents.dropped, "skipped")
    if contents.header is None:
        raise ResultsFileError(f"{os.fspath(path)} is empty: it holds no results header")
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
    except ``core`` (the cores' results are equal by contract), and ``policy_sha256`` when
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
    ) -> None:
        self.path = os.fspath(path)
        self.header = header
        self._handle = handle
        self._episodes = list(episodes)
        self._runs = list(runs)
        self._lock = lock

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
        """
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
        config = json.loads(json.dumps(_config(header)))
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
            changed = _check_identity(path, recorded, config, allow_changed_policy)
        if contents is not None and contents.dropped:
            _warn_dropped(path, contents.dropped, "dropped")
            with open(path, "r+b") as handle:
                handle.truncate(contents.valid_bytes)
        if contents is None or contents.header is None:  # nothing usable yet: start afresh
            handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
            handle.write(json.dumps({HEADER_KEY: FORMAT_VERSION, **config}) + "\n")
            handle.flush()
            return cls(path, handle, config, [], [], lock)
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        results = cls(path, handle, config, contents.episodes, contents.runs, lock)
        if changed:
            results._write({RESUME_KEY: FORMAT_VERSION, **changed})
        return results

    @property
    def episodes(self) -> tuple[EpisodeResult, ...]:
        """Every episode in the file, sorted by index."""
        return tuple(sorted(self._episodes, key=lambda episode: episode.index))

    @property
    def indices(self) -> frozenset[int]:
        """The indices of the episodes in the file."""
        return frozenset(episode.index for episode in self._episodes)

    def append(self, episode: EpisodeResult) -> None:
        """Write one completed episode's line and flush it to the OS."""
        self._write(episode.to_dict())
        self._episodes.append(episode)

    def append_run(self, result: RunResult, *, elapsed_s: float | None = None) -> None:
        """Close a run segment: its wasted steps, observer errors, wall time and telemetry
        (not its episodes, which ``append`` wrote as they completed)."""
        record = {
            RUN_KEY: FORMAT_VERSION,
            "wasted_steps": result.wasted_steps,
            "observer_errors": result.observer_errors,
            "elapsed_s": elapsed_s,
            "telemetry": _telemetry_to_json(result.telemetry),
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
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()


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
