"""THE reader of results files: every line, by kind, as records.

``read_contents`` reads a file line by line through ``lines.parse_line`` into a
``FileContents``; everything that reads a file's lines as objects goes through it: the
``read_results`` / ``read_run`` / ``read_suite`` functions here, ``ResultsFile.open`` when it
resumes, ``rlmesh compare`` and the HTML report. ``rlmesh report``'s summary reads the same
lines in columns (``rlmesh.results.scan``), with the same classification.

Example:
    >>> import os, tempfile
    >>> from rlmesh.results import EpisodeResult, ResultsFile
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=False) as out:
    ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
    >>> header, result, seconds = read_run(path)
    >>> header, result.num_episodes
    ({'env': 'CartPole-v1'}, 1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ResultsFileError
from .lines import (
    EPISODE,
    HEADER,
    RESUME,
    RUN,
    SUITE_KEY,
    TASK,
    TASK_KEY,
    config,
    file_fields,
    judged_by_rule,
    parse_line,
    repeated,
    warn_dropped,
)
from .records import EpisodeResult, RunResult


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

    def add(self, kind: str, value: Any) -> None:
        """Keep one line's ``value`` (``lines.parse_line``) where its ``kind`` goes."""
        if kind == EPISODE:
            self.episodes.append(value)
        elif kind == RUN:
            self.runs.append(value)
        elif kind == TASK:
            self.tasks.append(value)
        elif kind == RESUME:
            self.resumes.append(value)
        elif kind == HEADER:
            self.header = value

    def config(self) -> dict[str, Any]:
        """The header without its format key (a file's header is always there once
        ``read_contents`` returned it)."""
        assert self.header is not None
        return config(self.header)

    def run_result(self) -> tuple[RunResult, float | None]:
        """Every episode and run segment of the file as one ``RunResult`` (see
        ``read_run``), and the segments' total seconds."""
        assert self.header is not None
        return combine(self.header, self.episodes, self.runs)

    def task_fields(self, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``RunResult`` fields (but the episodes) of suite task ``name``: its task
        header's (else ``spec``'s, the suite's entry for a task never started) and its run
        segments'."""
        headers = {record["task"]: record for record in self.tasks}
        header = config(headers[name], TASK_KEY) if name in headers else (spec or {})
        return file_fields(header, [run for run in self.runs if run.get("task") == name])

    def task_runs(self, path: str | os.PathLike[str]) -> dict[str, RunResult]:
        """A suite's file (at ``path``, for the error) as one ``RunResult`` per task of the
        suite, in its order, each with its task header's fields (see ``read_suite``)."""
        assert self.header is not None
        runs = {}
        for spec in suite_tasks(path, self.header):
            name = spec["name"]
            episodes = tuple(episode for episode in self.episodes if episode.task == name)
            runs[name] = RunResult(episodes, **self.task_fields(name, spec))
        return runs


def read_contents(path: str | os.PathLike[str], *, cut_off: str = "skipped") -> FileContents:
    """Every line of a results file, by kind: the one reader of the format.

    A header must be there; a last line cut off mid-write (a crash) is set aside with a
    warning that says it was ``cut_off`` ("skipped" by readers, "repaired" by a resumption).

    Raises:
        ResultsFileError: the file cannot be read, is empty, or a line is not of a kind the
            format knows (the message names the file and line).

    Example:
        >>> import os, tempfile
        >>> from rlmesh.results import EpisodeResult, ResultsFile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=False) as out:
        ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
        >>> contents = read_contents(path)
        >>> contents.config(), [episode.index for episode in contents.episodes]
        ({'env': 'CartPole-v1'}, [0])
    """
    contents = parse_file(path)
    if contents.dropped:
        warn_dropped(path, contents.dropped, cut_off)
    if contents.header is None:
        raise ResultsFileError(f"{os.fspath(path)} is empty: it holds no results header")
    return contents


def parse_file(path: str | os.PathLike[str]) -> FileContents:
    """Parse a results file line by line, as it is: a last line without its newline (cut by
    a crash) is set aside in ``dropped`` without a warning, an empty file has no header.
    ``read_contents`` is the reader; this is what a resumption repairs from.

    Raises:
        ResultsFileError: the file cannot be read, or a line is not of a kind the format
            knows, or repeats an episode (of one task).
    """
    contents = FileContents(None, [], [], 0, b"")
    seen: set[tuple[str | None, int]] = set()
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ResultsFileError(
            f"{os.fspath(path)}: cannot read it ({exc.strerror}); expected a results file "
            "written by rlmesh eval --out or rlmesh.run(results_path=...)"
        ) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                contents.dropped = raw
                break
            contents.valid_bytes += len(raw)
            where = f"{os.fspath(path)}, line {number}"
            kind, value = parse_line(raw[:-1], number, where)
            if kind == EPISODE:
                key = (value.task, value.index)
                if key in seen:
                    raise ResultsFileError(repeated(where, value.index, value.task))
                seen.add(key)
            contents.add(kind, value)
    if contents.header is not None and not judged_by_rule(contents.header):
        contents.episodes = [
            replace(episode, success_reported=episode.success is not None)
            for episode in contents.episodes
        ]
    return contents


def combine(
    header: dict[str, Any], episodes: list[EpisodeResult], runs: list[dict[str, Any]]
) -> tuple[RunResult, float | None]:
    """Episodes and the run segments of their header as one ``RunResult``, and their total
    seconds."""
    result = RunResult(episodes=tuple(episodes), **file_fields(header, runs))
    return result, result.elapsed_s


def read_results(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[EpisodeResult]]:
    """A results file's header (without its format key) and episodes, sorted by index.

    Reads only: a cut-off last line is skipped with a warning, not repaired.

    Example:
        >>> import os, tempfile
        >>> from rlmesh.results import EpisodeResult, ResultsFile
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
    result, elapsed = contents.run_result()
    return contents.config(), result, elapsed


def read_suite(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, RunResult]]:
    """A suite's results file as its header and one ``RunResult`` per task of the suite, in
    its order (a task never started holds no episodes). Errors as ``read_suite_columns``."""
    contents = read_contents(path)
    return contents.config(), contents.task_runs(path)


def suite_tasks(path: str | os.PathLike[str], header: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks a suite's header lists (``SUITE_KEY``), each a dict with its ``name``.

    Raises:
        ResultsFileError: the header lists none: ``path`` is not a suite's file.
    """
    tasks = header.get(SUITE_KEY)
    if not isinstance(tasks, list) or not all(
        isinstance(task, dict) and isinstance(task.get("name"), str) for task in tasks
    ):
        raise ResultsFileError(
            f"{os.fspath(path)} is not a suite's results file: its header lists no tasks "
            f"({SUITE_KEY!r}); read it with read_columns / read_run"
        )
    return tasks
