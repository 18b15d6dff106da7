"""The results file a run writes as it goes, and resumes: ``ResultsFile``, and ``TaskResults``
(one suite task's part of a suite's file), with the checks that a resumption is the same run.

Example:
    >>> import os, tempfile
    >>> from rlmesh.results import EpisodeResult
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> with ResultsFile.open(path, {"episodes": 2}, resume=False) as out:
    ...     out.append(EpisodeResult(0, 5, 0, 0, 12, 12.0, True, False, None, 0.2, 0.1, 0.2))
    >>> with ResultsFile.open(path, {"episodes": 2}, resume=True) as out:
    ...     sorted(out.indices)
    [0]
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import replace
from typing import IO, Any

from ..errors import ResultsFileError
from ..remote.address import is_address
from ..utils import address_label
from . import lines
from .lock import WriterLock
from .reader import combine, parse_file
from .records import EpisodeResult, RunResult, episode_order
from .strict import dumps

# Header fields a resumed run records but need not match: the cores give equal results by
# contract, so a run started on one may be finished on the other; the provenance record
# (rlmesh.provenance: versions, host, command line) says where a segment ran.
RECORDED_NOT_IDENTITY = frozenset({"core", "provenance"})
# The policy's source file's sha256: a change is refused unless the caller allows it.
POLICY_HASH_KEY = "policy_sha256"


class ResultsFile:
    """A JSON-lines results file, written as episodes complete, and resumable.

    Format (each kind of line is defined in ``rlmesh.results.lines``): line 1 is the header
    ``{"rlmesh_results": 1, ...config}``, the run's configuration (whatever the caller passes:
    policy, env, seeds, caps, version, core). Then one line per
    completed episode, ``EpisodeResult.to_dict()``, in completion order, flushed as written,
    so a crash loses at most the line being written. At the end of each run segment (a run, or
    one resumption of it), ``append_run`` writes ``{"rlmesh_run": 1, "wasted_steps": ..,
    "elapsed_s": .., "telemetry": [..]}``, so the summary of a file needs nothing else. A
    resumption that changed a recorded field (its ``core``, or an allowed ``policy_sha256``)
    first writes ``{"rlmesh_resume": 1, field: its value, ...}``.

    ``ResultsFile.open(path, header, resume=...)`` first takes the file's writer lock (see
    ``rlmesh.results.lock``), held until ``close``: while another writer holds it, the file is left
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
        lock: WriterLock | None = None,
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
        lock = WriterLock.acquire(os.fspath(path))
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
        lock: WriterLock,
    ) -> ResultsFile:
        # The header as it will read back, so a comparison never trips on tuple-vs-list.
        config = json.loads(dumps(lines.config(header)))
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        if exists and not resume:
            raise ResultsFileError(
                f"{os.fspath(path)} already holds results: pass --resume (resume=True) to "
                "continue that run, or choose another path"
            )
        contents = parse_file(path) if exists else None
        changed: dict[str, Any] = {}
        if contents is not None and contents.header is not None:
            # Checked before the repair below: a refused resume leaves the file as it was.
            # What the file's run is now: its header, updated by every recorded resumption.
            recorded = lines.config(contents.header)
            for resumption in contents.resumes:
                if "task" in resumption:  # a suite task's resumption: its task's, not the file's
                    continue
                recorded.update(lines.config(resumption, lines.RESUME_KEY))
            _check_suite(path, recorded.get(lines.SUITE_KEY), config.get(lines.SUITE_KEY))
            changed = _check_identity(path, recorded, config, allow_changed_policy)
        if contents is not None and contents.dropped:
            lines.warn_dropped(path, contents.dropped, "dropped")
            with open(path, "r+b") as handle:
                handle.truncate(contents.valid_bytes)
        if contents is None or contents.header is None:  # nothing usable yet: start afresh
            handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
            handle.write(dumps(lines.header_line(config)) + "\n")
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
            results._write(lines.resume_line(changed))
        return results

    @property
    def episodes(self) -> tuple[EpisodeResult, ...]:
        """Every episode in the file, sorted by index (a suite's by task, then index)."""
        return tuple(sorted(self._episodes, key=episode_order))

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
        record = lines.run_line(result, elapsed_s, task)
        self._write(record)
        self._runs.append(record)

    def run_result(self) -> tuple[RunResult, float | None]:
        """Every episode in the file as one ``RunResult`` (see ``read_run``), and the seconds
        of the run segments."""
        return combine(self.header, self._episodes, self._runs)

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
        config = {**json.loads(dumps(lines.config(header))), "task": self.name}
        recorded = file._tasks.get(self.name)
        if recorded is None:
            record = lines.task_line(config)
            file._write(record)
            file._tasks[self.name] = record
        else:
            found = lines.config(recorded, lines.TASK_KEY)
            for resumption in file._resumes:
                if resumption.get("task") == self.name:
                    found.update(lines.config(resumption, lines.RESUME_KEY))
            where = f"{file.path} (task {self.name!r})"
            changed = _check_identity(where, found, config, allow_changed_policy)
            if changed:
                record = lines.resume_line(changed, self.name)
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
        return combine(self.header, list(self.episodes), runs)

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
    env = found.get("env")
    if isinstance(env, str) and is_address(env):
        # A served env is one env however its address is spelled: files written before the
        # header's spelling was canonical may hold another.
        found = {**found, "env": address_label(env)}
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
