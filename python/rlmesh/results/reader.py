"""THE reader of results files: every line, by kind, as records.

``read_contents`` reads a file line by line through ``lines.parse_line`` into a
``FileContents``; everything that reads a file's lines as objects goes through it: the
``read_results`` / ``read_run`` / ``read_suite`` functions here, ``ResultsFile.open`` when it
resumes, ``rlmesh compare`` and the HTML report. ``rlmesh report``'s summary reads the same
lines in columns (``rlmesh.results.scan``), with the same classification. ``read_appended``
goes on from a ``FileContents`` read before with only the lines the file gained since (what
``rlmesh watch`` follows a growing file with); ``parse_file`` is it from nothing.

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
from typing import Any, BinaryIO

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
    lines: int = 0  # whole lines read: the number of the next one is lines + 1
    # Where read_appended goes on from: the header line's bytes (the file it reads must still
    # start with them) and the (task, index) of every episode read (a repeat is an error).
    head: bytes = field(default=b"", repr=False, compare=False)
    seen: set[tuple[str | None, int]] = field(default_factory=set, repr=False, compare=False)

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
    ``read_contents`` is the reader; this is what a resumption repairs from. The same as
    ``read_appended(path, None)``.

    Raises:
        ResultsFileError: the file cannot be read, or a line is not of a kind the format
            knows, or repeats an episode (of one task).
    """
    return read_appended(path, None)


def read_appended(path: str | os.PathLike[str], contents: FileContents | None) -> FileContents:
    """``contents`` (what this or ``parse_file`` returned for ``path`` before; None: nothing
    read yet) with the whole lines the file gained since, parsed as ``parse_file`` parses
    them: a follower of a file another process appends to (``rlmesh watch``) reads what was
    added, not the whole file again. The result is what ``parse_file(path)`` would give.

    ``contents`` is extended in place and returned, or left as it was when this raises. A last
    line without its newline stays set aside (``dropped``) until it is whole. A file that no
    longer holds what ``contents`` read (shorter than it, another header, a line boundary
    moved: rewritten) is read from its start into a new ``FileContents``.

    Raises:
        ResultsFileError: as ``parse_file`` (an episode repeated across two reads too).

    Example:
        >>> import os, tempfile
        >>> from rlmesh.results import EpisodeResult, ResultsFile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=False) as out:
        ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
        >>> contents = read_appended(path, None)
        >>> with ResultsFile.open(path, {"env": "CartPole-v1"}, resume=True) as out:
        ...     out.append(EpisodeResult(1, 6, 1, 0, 9, 9.0, True, False, None, 0.2, 0.1, 0.2))
        >>> [episode.index for episode in read_appended(path, contents).episodes]
        [0, 1]
    """
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ResultsFileError(
            f"{os.fspath(path)}: cannot read it ({exc.strerror}); expected a results file "
            "written by rlmesh eval --out or rlmesh.run(results_path=...)"
        ) from None
    with handle:
        if contents is None or not _holds(handle, contents):
            contents = FileContents(None, [], [], 0, b"")
        handle.seek(contents.valid_bytes)
        _append_lines(os.fspath(path), handle, contents)
    return contents


def _holds(handle: BinaryIO, contents: FileContents) -> bool:
    """Whether the file still holds what ``contents`` read: as long, the same header line,
    and a line ending where the read lines end (a cheap look, not a proof: a rewrite of the
    same header with a line ending at that byte passes, and its lines then read as new)."""
    if contents.valid_bytes == 0:
        return True  # nothing read yet: reading from the start is going on
    if not contents.head or os.fstat(handle.fileno()).st_size < contents.valid_bytes:
        return False
    if handle.read(len(contents.head)) != contents.head:
        return False
    handle.seek(contents.valid_bytes - 1)
    return handle.read(1) == b"\n"


def _append_lines(path: str, handle: BinaryIO, contents: FileContents) -> None:
    """Parse the lines from the handle's position into ``contents``, all or (on an error)
    none: they are parsed aside first, then kept."""
    added = FileContents(contents.header, [], [], contents.valid_bytes, b"")
    added.lines, added.head = contents.lines, contents.head
    seen = contents.seen
    new_keys: set[tuple[str | None, int]] = set()
    for number, raw in enumerate(handle, start=contents.lines + 1):
        if not raw.endswith(b"\n"):
            added.dropped = raw
            break
        where = f"{path}, line {number}"
        kind, value = parse_line(raw[:-1], number, where)
        if kind == EPISODE:
            key = (value.task, value.index)
            if key in seen or key in new_keys:
                raise ResultsFileError(repeated(where, value.index, value.task))
            new_keys.add(key)
        elif kind == HEADER:
            added.head = raw
        added.add(kind, value)
        added.valid_bytes += len(raw)
        added.lines = number
    if added.header is not None and not judged_by_rule(added.header):
        # A file from before success rules: a success on file was always the env's.
        added.episodes = [
            replace(episode, success_reported=episode.success is not None)
            for episode in added.episodes
        ]
    contents.header, contents.head = added.header, added.head
    contents.episodes += added.episodes
    contents.runs += added.runs
    contents.resumes += added.resumes
    contents.tasks += added.tasks
    contents.valid_bytes, contents.lines, contents.dropped = (
        added.valid_bytes,
        added.lines,
        added.dropped,
    )
    seen |= new_keys


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
