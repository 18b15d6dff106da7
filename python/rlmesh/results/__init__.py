"""What a run returns and the results file it writes: records, the file's format, its one
reader and its writer.

Which module owns what:

- ``records``: ``EpisodeResult``, ``RunResult``, ``TelemetryRow``, ``RunColumns``,
  ``merge_telemetry`` (plain values, no I/O);
- ``strict``: strict JSON (``strict``, ``dumps``, ``decode_float``, the non-finite tokens);
- ``lines``: the line kinds of a results file (header, task header, episode, run segment,
  resumption), how each is written, and ``parse_line``, the one classification of a line;
- ``reader``: THE reader (``read_contents`` into a ``FileContents``; ``read_results``,
  ``read_run``, ``read_suite``);
- ``scan``: the column scanner (``read_columns``, ``read_columns_with_resumes``,
  ``read_suite_columns``), what ``rlmesh report`` summarizes;
- ``file``: ``ResultsFile`` and ``TaskResults``, the file a run writes and resumes, and the
  checks that a resumption is the same run; ``lock``: its writer's lock;
- ``success``: the success rules (``rlmesh.success`` is its alias);
- ``provenance``: the auditable record of a run (``rlmesh.provenance`` is its alias).

Every name is importable from here, as before the package was split.

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

from ..errors import ResultsFileError, ResultsFileLockedError
from .file import POLICY_HASH_KEY, RECORDED_NOT_IDENTITY, ResultsFile, TaskResults
from .lines import FORMAT_VERSION, HEADER_KEY, RESUME_KEY, RUN_KEY, SUITE_KEY, TASK_KEY
from .lock import LOCK_SUFFIX
from .reader import FileContents, read_contents, read_results, read_run, read_suite
from .records import (
    OPTIONAL_FIELDS,
    EpisodeResult,
    RunColumns,
    RunResult,
    TelemetryRow,
    mean,
    merge_telemetry,
    succeeded,
    task_column,
)

# The scanner reads its block size from rlmesh.results.scan: set it there.
from .scan import (
    READ_BLOCK_BYTES,
    read_columns,
    read_columns_with_resumes,
    read_suite_columns,
)
from .strict import NONFINITE_TOKENS, decode_float, dumps, strict
from .success import NONE, SuccessRule

__all__ = [
    "FORMAT_VERSION",
    "HEADER_KEY",
    "LOCK_SUFFIX",
    "NONE",
    "NONFINITE_TOKENS",
    "OPTIONAL_FIELDS",
    "POLICY_HASH_KEY",
    "READ_BLOCK_BYTES",
    "RECORDED_NOT_IDENTITY",
    "RESUME_KEY",
    "RUN_KEY",
    "SUITE_KEY",
    "TASK_KEY",
    "EpisodeResult",
    "FileContents",
    "ResultsFile",
    "ResultsFileError",
    "ResultsFileLockedError",
    "RunColumns",
    "RunResult",
    "SuccessRule",
    "TaskResults",
    "TelemetryRow",
    "decode_float",
    "dumps",
    "mean",
    "merge_telemetry",
    "read_columns",
    "read_columns_with_resumes",
    "read_contents",
    "read_results",
    "read_run",
    "read_suite",
    "read_suite_columns",
    "strict",
    "succeeded",
    "task_column",
]
