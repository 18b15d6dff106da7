"""The column scanner: a results file read into ``RunColumns`` in bounded memory, fast.

What ``rlmesh report`` summarizes: the file read a block at a time, its episode lines as
rlmesh writes them parsed with numpy (the fields a summary reads), every other line through
``lines.parse_line``, as the reader (``rlmesh.results.reader``) reads them; the same figures
and errors as ``read_run(path)[1].columns()``, without an object per episode.

Example:
    >>> import os, tempfile
    >>> from rlmesh.results import EpisodeResult, ResultsFile
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> with ResultsFile.open(path, {"episodes": 1}, resume=False) as out:
    ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
    >>> read_columns(path)[1].steps.tolist()
    [12]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ResultsFileError
from .lines import (
    EPISODE,
    EPISODE_FIELDS,
    RESUME_KEY,
    config,
    file_fields,
    judged_by_rule,
    parse_line,
    repeated,
    warn_dropped,
)
from .reader import FileContents, suite_tasks
from .records import FORMAT_1_FIELDS, OPTIONAL_FIELDS, EpisodeResult, RunColumns

# read_columns reads a file in blocks of this many bytes, so its memory is a few times this
# plus the columns (34 bytes an episode), however long the file. A block that fits in the CPU's
# cache is scanned about twice as fast as a 16 MB one.
READ_BLOCK_BYTES = 1 << 20

# An episode line as ResultsFile writes it (json.dumps of EpisodeResult.to_dict()): each field
# is this literal then its value, and the line ends with "}". read_columns parses such lines
# with numpy, a block at a time; any other line goes through json.
_LITERALS = tuple(
    (b"{" if k == 0 else b" ") + json.dumps(name).encode() + b": "
    for k, name in enumerate(EPISODE_FIELDS)
)
_FIELD = {name: k for k, name in enumerate(EPISODE_FIELDS)}
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
    separators = FORMAT_1_FIELDS - 1
    line_commas = np.searchsorted(commas, ends) - first_comma
    canonical = (line_commas >= separators) & (ends - starts > len(_LITERALS[0]))
    rows = np.flatnonzero(canonical)
    if rows.size == 0:
        return rows, {}
    # Field k's literal starts at the line start (k = 0) or right after comma k - 1.
    at = commas[first_comma[rows, None] + np.arange(separators)]
    literal_at = np.concatenate([starts[rows, None], at + 1], axis=1)
    value_start = literal_at + np.array([len(literal) for literal in _LITERALS[:FORMAT_1_FIELDS]])
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
    for k, pairs in enumerate(_LITERAL_WORDS[:FORMAT_1_FIELDS]):
        for offset, word in pairs:
            good &= words[np.minimum(literal_at[:, k] + offset, last_word)] == word
        good &= value_start[:, k] < value_stop[:, k]
    optional = {}
    for j, name in enumerate(OPTIONAL_FIELDS):
        literal_start = commas[np.minimum(cursor, last)] + 1
        present = remaining > 0
        for offset, word in _LITERAL_WORDS[FORMAT_1_FIELDS + j]:
            present &= words[np.minimum(literal_start + offset, top)] == word
        start = literal_start + len(_LITERALS[FORMAT_1_FIELDS + j])
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
        >>> from rlmesh.results import EpisodeResult, ResultsFile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"episodes": 3}, resume=False) as out:
        ...     for k in (2, 0):
        ...         out.append(EpisodeResult(k, k, k, 0, 10, 1.5 * k, True, False, None, 0, 0, 0))
        >>> header, columns = read_columns(path)
        >>> columns.index.tolist(), columns.reward.tolist(), columns.episodes_requested
        ([0, 2], [0.0, 3.0], 3)
    """
    contents, columns = scan_columns(path)
    return contents.config(), columns


def read_columns_with_resumes(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], RunColumns, list[dict[str, Any]]]:
    """``read_columns``, and the records of the file's resumptions that changed a recorded
    field (``rlmesh_resume`` lines, without their marker), in file order: each one's
    ``provenance`` among them.

    Example:
        >>> import os, tempfile
        >>> from rlmesh.results import EpisodeResult, ResultsFile
        >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
        >>> with ResultsFile.open(path, {"episodes": 1, "core": "rust"}, resume=False) as out:
        ...     pass
        >>> ResultsFile.open(path, {"episodes": 1, "core": "python"}, resume=True).close()
        >>> read_columns_with_resumes(path)[2]
        [{'core': 'python'}]
    """
    contents, columns = scan_columns(path)
    resumes = [config(record, RESUME_KEY) for record in contents.resumes]
    return contents.config(), columns, resumes


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
    contents, columns = scan_columns(path)
    assert contents.header is not None
    tasks = suite_tasks(path, contents.header)
    task = columns.task
    split = {}
    for spec in tasks:
        name = spec["name"]
        # The columns are sorted by task, then index: each task's episodes are one slice.
        rows = slice(0, 0)
        if task is not None:
            start, stop = np.searchsorted(task, name, "left"), np.searchsorted(task, name, "right")
            rows = slice(int(start), int(stop))
        split[name] = columns.select(rows, **contents.task_fields(name, spec))
    return contents.config(), split


def scan_columns(path: str | os.PathLike[str]) -> tuple[FileContents, RunColumns]:
    """A results file as its lines but the episodes (``FileContents`` with no episodes) and
    the episodes as ``RunColumns``, sorted by task, then index. What ``read_columns`` and
    ``read_suite_columns`` are built on."""
    name = os.fspath(path)
    parts = _ColumnParts()
    contents = FileContents(None, [], [], 0, b"")
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
                number = first_line + position
                raw = text[starts[position] : ends[position]]
                kind, value = parse_line(raw, number, f"{name}, line {number}")
                if kind == EPISODE:
                    parts.add_episode(value, number)
                else:
                    contents.add(kind, value)
            first_line += starts.size
    if carry:
        warn_dropped(path, carry, "skipped")
    header = contents.header
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
            repeated(
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
    if not judged_by_rule(header):
        reported = success >= 0
    run = RunColumns(
        index=column("index", np.int64),
        steps=column("steps", np.int64),
        reward=column("reward", np.float64),
        success=success,
        success_reported=reported,
        **file_fields(header, contents.runs),
        failed=failed,
        task=column("task", str) if has_tasks else None,
    )
    return contents, run
