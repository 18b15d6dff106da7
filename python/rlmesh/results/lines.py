"""The lines of a results file: each kind defined once, how it is written and how it is read.

A results file is JSON lines, each one strict JSON (``rlmesh.results.strict``). Its kinds:

- **header** (line 1, always): ``{"rlmesh_results": 1, ...config}``, the run's configuration
  (``header_line``). A suite's header lists its tasks under ``"suite"``.
- **task header** (a suite's, once per task, before its episodes):
  ``{"rlmesh_task": 1, "task": name, ...config}``, the settings that task's run was given
  (``task_line``).
- **episode**: ``EpisodeResult.to_dict()``, one per completed episode (``decode_episode``
  reads it back).
- **run segment**: ``{"rlmesh_run": 1, "wasted_steps": .., "elapsed_s": .., "telemetry":
  [..], "success_rule": ..}`` at the end of each run segment (a run, or one resumption of it;
  a suite's also names its ``task``: ``run_line``).
- **resumption**: ``{"rlmesh_resume": 1, field: value, ...}``, written by a resumption that
  changed a recorded field that is not part of the run's identity (its ``core``, its
  ``provenance``, an allowed ``policy_sha256``; a suite's also names its ``task``:
  ``resume_line``).

``parse_line`` is the one classification of a line: every reader (``rlmesh.results.reader``)
and the column scanner (``rlmesh.results.scan``, for the lines its numpy path does not claim)
go through it. The scanner's numpy path claims only lines that ``parse_line`` would call
episodes: lines that start with the episode's first field and hold no other key.

Example:
    >>> kind, header = parse_line(b'{"rlmesh_results": 1, "env": "CartPole-v1"}', 1, "line 1")
    >>> kind, config(header)
    ('header', {'env': 'CartPole-v1'})
    >>> parse_line(b'{"rlmesh_run": 1, "wasted_steps": 0}', 3, "line 3")[0]
    'run'
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import MISSING, asdict, fields
from typing import Any

from ..errors import ResultsFileError
from ..stats.stopping import RunStop
from .records import (
    TELEMETRY_COLUMNS,
    TELEMETRY_TEXT_COLUMNS,
    EpisodeResult,
    RunResult,
    TelemetryRow,
    merge_telemetry,
)
from .strict import NONFINITE_TOKENS, decode_float
from .success import SuccessRule

HEADER_KEY = "rlmesh_results"  # marks the header line; its value is the format version
RUN_KEY = "rlmesh_run"  # marks a run-segment line; its value is the format version
RESUME_KEY = "rlmesh_resume"  # marks a resumption that changed a recorded, non-identity field
TASK_KEY = "rlmesh_task"  # marks a suite task's header (what that task's resumption must match)
SUITE_KEY = "suite"  # the header field of a suite's file: its tasks, as plain data
FORMAT_VERSION = 1

# The kinds of line, as parse_line names them.
HEADER, TASK, EPISODE, RUN, RESUME = "header", "task", "episode", "run", "resume"

EPISODE_FIELDS = tuple(field.name for field in fields(EpisodeResult))
_DEFAULTS = {field.name: field.default for field in fields(EpisodeResult)}  # ordered as fields
_REQUIRED = frozenset(name for name, default in _DEFAULTS.items() if default is MISSING)
_KNOWN = frozenset(EPISODE_FIELDS)
FLOAT_FIELDS = ("reward", "duration_s", "predict_ms", "step_ms")  # may hold a non-finite token


# ---------------------------------------------------------------------------- writing


def header_line(config: dict[str, Any]) -> dict[str, Any]:
    """The header line of a file whose run has ``config``."""
    return {HEADER_KEY: FORMAT_VERSION, **config}


def task_line(config: dict[str, Any]) -> dict[str, Any]:
    """A suite task's header line (``config`` holds the task's name under ``"task"``)."""
    return {TASK_KEY: FORMAT_VERSION, **config}


def resume_line(changed: dict[str, Any], task: str | None = None) -> dict[str, Any]:
    """The line of a resumption that changed the recorded fields ``changed`` (of ``task``'s
    run, in a suite)."""
    return {RESUME_KEY: FORMAT_VERSION, **({} if task is None else {"task": task}), **changed}


def run_line(result: RunResult, elapsed_s: float | None, task: str | None) -> dict[str, Any]:
    """The line closing a run segment: its waste, observer errors, seconds, telemetry and
    (resolved) success rule; not its episodes, each written as it completed."""
    return {
        RUN_KEY: FORMAT_VERSION,
        **({} if task is None else {"task": task}),
        "wasted_steps": result.wasted_steps,
        "observer_errors": result.observer_errors,
        "elapsed_s": elapsed_s,
        "telemetry": telemetry_to_json(result.telemetry),
        "success_rule": result.success_rule.to_json(),
        # How a run with until= stopped: `rlmesh report` says so from the file alone.
        **({} if result.stop is None else {"stop": result.stop.to_dict()}),
    }


def telemetry_to_json(rows: Iterable[TelemetryRow]) -> list[dict[str, Any]]:
    """Telemetry rows as a run segment records them."""
    # A rate row's percentiles do not exist: null, as in a summary. An infinite figure is a
    # token (``strict``), read back by telemetry_from_json.
    return [
        {
            key: None if isinstance(v, float) and math.isnan(v) else v
            for key, v in asdict(row).items()
        }
        for row in rows
    ]


def telemetry_from_json(rows: Iterable[dict[str, Any]]) -> tuple[TelemetryRow, ...]:
    """Telemetry rows as a run segment recorded them (``telemetry_to_json``)."""

    def figure(value: Any) -> Any:
        if value is None:  # a percentile that does not exist
            return math.nan
        return NONFINITE_TOKENS.get(value, value) if isinstance(value, str) else value

    numbers = TELEMETRY_COLUMNS[TELEMETRY_TEXT_COLUMNS:]
    return tuple(
        TelemetryRow(row["op"], row["metric"], row["unit"], *(figure(row[n]) for n in numbers))
        for row in rows
    )


# ---------------------------------------------------------------------------- reading


def parse_record(raw: bytes, where: str) -> dict[str, Any]:
    """One line (without its newline) as the JSON object it must be.

    Raises:
        ResultsFileError: it is not JSON, or not an object (``where`` names file and line).
    """
    try:
        record = json.loads(raw)
    except ValueError:
        raise ResultsFileError(
            f"{where} is not JSON ({raw[:60]!r}); a results file holds one JSON object a line"
        ) from None
    if not isinstance(record, dict):
        raise ResultsFileError(f"{where} is {raw[:60]!r}, expected a JSON object")
    return record


def line_kind(record: dict[str, Any], number: int) -> str:
    """The kind of line ``number`` (from 1) of a file, ``record`` its JSON object."""
    if number == 1:
        return HEADER
    if RUN_KEY in record:
        return RUN
    if RESUME_KEY in record:
        return RESUME
    if TASK_KEY in record:
        return TASK
    return EPISODE


def parse_line(raw: bytes, number: int, where: str) -> tuple[str, Any]:
    """Line ``number`` of a file (``raw``, without its newline) as its kind and its value: an
    ``EpisodeResult`` for an episode line, else the line's record (a dict).

    Raises:
        ResultsFileError: the line is not JSON, line 1 is not a header, or an episode line's
            fields are not ``EpisodeResult``'s.
    """
    record = parse_record(raw, where)
    kind = line_kind(record, number)
    if kind == HEADER:
        check_header(record, raw, where)
    elif kind == EPISODE:
        return kind, decode_episode(record, where)
    return kind, record


def check_header(record: dict[str, Any], raw: bytes, where: str) -> None:
    """Refuse a first line that is not a results header."""
    if HEADER_KEY not in record:
        raise ResultsFileError(
            f"{where}: expected the header line {{{HEADER_KEY!r}: {FORMAT_VERSION}, ...}}, "
            f"got {raw[:60]!r}; is this an rlmesh results file?"
        )


def decode_episode(record: dict[str, Any], where: str) -> EpisodeResult:
    """An episode line's record as its ``EpisodeResult`` (non-finite tokens decoded)."""
    for name in FLOAT_FIELDS:
        # A float is the common case: only the others (ints, tokens, errors) are decoded.
        if name in record and record[name].__class__ is not float:
            record[name] = decode_float(record[name], f"{where}, field {name!r}")
    if _REQUIRED <= record.keys() <= _KNOWN:
        # EpisodeResult(**record), without the frozen __init__'s setattr per field (as
        # EpisodeResult.from_summary): a file holds an episode a line.
        episode = object.__new__(EpisodeResult)
        episode.__dict__.update({**_DEFAULTS, **record})
        return episode
    try:
        return EpisodeResult(**record)
    except TypeError as exc:
        raise ResultsFileError(
            f"{where} is not an episode line ({exc}); expected the fields {list(EPISODE_FIELDS)}"
        ) from None


def config(header: dict[str, Any], marker: str = HEADER_KEY) -> dict[str, Any]:
    """A header (or task header, or resumption: ``marker``) without its format key."""
    return {key: value for key, value in header.items() if key != marker}


def judged_by_rule(header: dict[str, Any]) -> bool:
    """A file written since success rules (a suite's: its tasks' headers record them): its
    episodes say whether the env reported success. Before, a success on file was always the
    env's."""
    return "success_rule" in header or SUITE_KEY in header


def repeated(where: str, index: int, task: str | None) -> str:
    """The error message of an episode index (of ``task``) given twice."""
    of_task = "" if task is None else f" of task {task!r}"
    return f"{where} repeats episode index {index}{of_task}"


def warn_dropped(path: str | os.PathLike[str], dropped: bytes, action: str) -> None:
    """Warn that the file's last line, cut off mid-write, was ``action`` (skipped, ...)."""
    preview = dropped if len(dropped) <= 60 else dropped[:60] + b"..."
    warnings.warn(
        f"{os.fspath(path)}: the last line was cut off mid-write (a crash?); {action} its "
        f"{len(dropped)} bytes: {preview!r}",
        UserWarning,
        stacklevel=3,
    )


def file_fields(header: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``RunResult`` fields (but the episodes) of a header and its run segments."""
    rule = SuccessRule.from_json(header.get("success_rule"))
    if rule.pending:  # an env factory's threshold: its run segments recorded what it was
        resolved = [run["success_rule"] for run in runs if run.get("success_rule")]
        if resolved:
            rule = SuccessRule.from_json(resolved[-1])
    elapsed = [run["elapsed_s"] for run in runs if run.get("elapsed_s") is not None]
    requested = header.get("episodes")
    stops = [RunStop.from_dict(run["stop"]) for run in runs if isinstance(run.get("stop"), dict)]
    return {
        "base_seed": header.get("seed"),
        "wasted_steps": sum(run.get("wasted_steps", 0) for run in runs),
        "observer_errors": sum(run.get("observer_errors", 0) for run in runs),
        "telemetry": merge_telemetry(
            [telemetry_from_json(run.get("telemetry", [])) for run in runs]
        )
        if runs
        else (),
        "core": header.get("core"),
        "success_rule": rule,
        "episodes_requested": requested if isinstance(requested, int) else None,
        "elapsed_s": math.fsum(elapsed) if elapsed else None,
        "stop": stops[-1] if stops else None,
    }
