"""read_appended: a results file read in steps, as it grows, gives what parse_file gives.

A real writer (``ResultsFile``) appends, or a file's own bytes are written in pieces; after
each piece the contents read so far, extended with what the file gained, must be exactly
what parsing the whole file gives: header, episodes, run segments, resumptions, task headers,
whole bytes, the cut-off last line, and the errors.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmesh.errors import ResultsFileError
from rlmesh.results import EpisodeResult, ResultsFile, RunResult, TelemetryRow
from rlmesh.results.reader import FileContents, parse_file, read_appended

HEADER = {"env": "CartPole-v1", "episodes": 6, "seed": 0, "success_rule": None}
COMPARED = (
    "header",
    "episodes",
    "runs",
    "resumes",
    "tasks",
    "valid_bytes",
    "dropped",
    "lines",
    "head",
    "seen",
)


def _episode(index: int, *, steps: int = 5, success: bool | None = None) -> EpisodeResult:
    return EpisodeResult(index, 100 + index, index % 2, 0, steps, float(steps), True, False,
                         success, 0.1, 0.2, 0.3)  # fmt: skip


def _run(wasted: int) -> RunResult:
    row = TelemetryRow("env.step", "latency", "ms", 10, 1.0, 1.0, 2.0, 3.0, 4.0)
    return RunResult((), base_seed=0, wasted_steps=wasted, telemetry=(row,))


def assert_as_whole(contents: FileContents, path) -> None:
    """``contents`` holds exactly what parsing the whole file at ``path`` gives."""
    whole = parse_file(path)
    for name in COMPARED:
        assert getattr(contents, name) == getattr(whole, name), name


def append_bytes(path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_a_file_a_writer_appends_to_reads_as_the_whole_after_each_step(tmp_path):
    path = tmp_path / "r.jsonl"
    out = ResultsFile.open(path, {**HEADER, "core": "rust"}, resume=False)
    contents = read_appended(path, None)
    assert_as_whole(contents, path)
    assert contents.header is not None and contents.episodes == []
    steps = [
        lambda: out.append(_episode(0)),
        lambda: (out.append(_episode(2, steps=9)), out.append(_episode(1, success=True))),
        lambda: out.append_run(_run(3), elapsed_s=1.5),
        lambda: None,  # nothing new
    ]
    for step in steps:
        step()
        previous = contents
        contents = read_appended(path, contents)
        assert contents is previous  # extended in place: the file was not read afresh
        assert_as_whole(contents, path)
    out.close()
    # A resumption on another core writes a resumption line, then more episodes.
    with ResultsFile.open(path, {**HEADER, "core": "python"}, resume=True) as out:
        contents = read_appended(path, contents)
        assert_as_whole(contents, path)
        assert [resume["core"] for resume in contents.resumes] == ["python"]
        out.append(_episode(3))
        out.append_run(_run(1), elapsed_s=0.5)
    assert read_appended(path, contents) is contents
    assert_as_whole(contents, path)
    assert [episode.index for episode in contents.episodes] == [0, 2, 1, 3]
    assert [run["wasted_steps"] for run in contents.runs] == [3, 1]
    result, elapsed = contents.run_result()
    assert result.num_episodes == 4 and elapsed == 2.0


def test_a_line_cut_off_is_set_aside_until_it_is_whole(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
    contents = read_appended(path, None)
    line = (json.dumps(_episode(1).to_dict()) + "\n").encode()
    done = 0
    for cut in (7, 30, len(line) - 1):  # the line grows, still without its newline
        append_bytes(path, line[done:cut])
        done = cut
        contents = read_appended(path, contents)
        assert contents.dropped == line[:cut] and len(contents.episodes) == 1
        assert_as_whole(contents, path)
    append_bytes(path, line[-1:])
    contents = read_appended(path, contents)
    assert contents.dropped == b"" and [e.index for e in contents.episodes] == [0, 1]
    assert_as_whole(contents, path)


def test_a_header_cut_off_at_first_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
    data = path.read_bytes()
    path.write_bytes(b"")
    contents = read_appended(path, None)
    assert contents.header is None and contents.valid_bytes == 0
    header_end = data.index(b"\n") + 1
    append_bytes(path, data[:10])
    contents = read_appended(path, contents)
    assert contents.header is None and contents.dropped == data[:10]
    assert_as_whole(contents, path)
    append_bytes(path, data[10 : header_end + 4])  # the header whole, an episode begun
    contents = read_appended(path, contents)
    assert contents.header == {"rlmesh_results": 1, **HEADER} and contents.episodes == []
    assert contents.dropped == data[header_end : header_end + 4]
    assert_as_whole(contents, path)
    append_bytes(path, data[header_end + 4 :])
    contents = read_appended(path, contents)
    assert [episode.index for episode in contents.episodes] == [0]
    assert_as_whole(contents, path)


def test_a_rewritten_file_is_read_from_its_start(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        for index in range(4):
            out.append(_episode(index))
    first = read_appended(path, None)
    path.unlink()
    with ResultsFile.open(path, HEADER, resume=False) as out:  # shorter: one episode
        out.append(_episode(7, steps=8))
    contents = read_appended(path, first)
    assert contents is not first and [e.index for e in contents.episodes] == [7]
    assert_as_whole(contents, path)
    assert [e.index for e in first.episodes] == [0, 1, 2, 3]  # what was read stays as it was
    # Longer, under another header: not the file that was read either.
    path.unlink()
    with ResultsFile.open(path, {**HEADER, "seed": 1}, resume=False) as out:
        for index in range(6):
            out.append(_episode(index, steps=6))
    again = read_appended(path, contents)
    assert again is not contents and again.header["seed"] == 1
    assert_as_whole(again, path)
    # The same header, longer, its lines ending elsewhere.
    data = path.read_bytes()
    header_end = data.index(b"\n") + 1
    lines = data[header_end:].splitlines(keepends=True)
    extra = (json.dumps(_episode(6).to_dict()) + "\n").encode()
    path.write_bytes(data[:header_end] + lines[0][:-1] + b" \n" + b"".join(lines[1:]) + extra)
    assert path.read_bytes()[again.valid_bytes - 1 : again.valid_bytes] != b"\n"
    rewritten = read_appended(path, again)
    assert rewritten is not again and len(rewritten.episodes) == 7
    assert_as_whole(rewritten, path)


def test_an_episode_repeated_across_two_reads_is_an_error_and_changes_nothing(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
        out.append(_episode(1))
    contents = read_appended(path, None)
    kept = {name: getattr(contents, name) for name in COMPARED}
    kept = {name: value.copy() if hasattr(value, "copy") else value for name, value in kept.items()}
    append_bytes(path, (json.dumps(_episode(2).to_dict()) + "\n").encode())
    append_bytes(path, (json.dumps(_episode(1, steps=7).to_dict()) + "\n").encode())
    with pytest.raises(ResultsFileError) as incremental:
        read_appended(path, contents)
    with pytest.raises(ResultsFileError) as whole:
        parse_file(path)
    assert str(incremental.value) == str(whole.value)
    assert "line 5 repeats episode index 1" in str(incremental.value)
    assert {name: getattr(contents, name) for name in COMPARED} == kept  # read nothing
    with pytest.raises(ResultsFileError) as again:  # and says so again
        read_appended(path, contents)
    assert str(again.value) == str(whole.value)


def test_a_line_not_of_the_format_is_the_error_parse_file_raises(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
    contents = read_appended(path, None)
    append_bytes(path, b'{"index": 1, "oops": 2}\n')
    with pytest.raises(ResultsFileError) as incremental:
        read_appended(path, contents)
    with pytest.raises(ResultsFileError) as whole:
        parse_file(path)
    assert str(incremental.value) == str(whole.value) and "line 3" in str(whole.value)
    assert contents.valid_bytes == len(path.read_bytes()) - len(b'{"index": 1, "oops": 2}\n')


def test_a_suites_file_read_in_steps(tmp_path):
    path = tmp_path / "suite.jsonl"
    suite = [{"name": "a", "env": "CartPole-v1"}, {"name": "b", "env": "CartPole-v1"}]
    out = ResultsFile.open(path, {"suite": suite, "seed": 0}, resume=False)
    contents = read_appended(path, None)
    for name, indices in (("a", (0, 1)), ("b", (0,)), ("b", (1, 2))):
        task = ResultsFile.open(out.task(name), {"episodes": 3}, resume=False)
        for index in indices:  # the same indices in two tasks: not repeats
            task.append(_episode(index))
        task.append_run(_run(index))
        contents = read_appended(path, contents)
        assert_as_whole(contents, path)
    assert [(record["task"]) for record in contents.tasks] == ["a", "b"]
    assert [(e.task, e.index) for e in contents.episodes] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)
    ]  # fmt: skip
    runs = contents.task_runs(path)
    assert {name: run.num_episodes for name, run in runs.items()} == {"a": 2, "b": 3}
    out.task("a").append(_episode(1))  # task a's episode 1 again
    out.close()
    with pytest.raises(ResultsFileError, match="repeats episode index 1 of task 'a'"):
        read_appended(path, contents)


def test_a_file_from_before_success_rules_reads_the_same_in_steps(tmp_path):
    # Its header records no success rule: a success on file was the env's, for the episodes
    # of every read.
    path = tmp_path / "old.jsonl"
    path.write_bytes(b'{"rlmesh_results": 1, "env": "CartPole-v1"}\n')
    contents = read_appended(path, None)
    for index, success in enumerate((True, None, False)):
        record = _episode(index, success=success).to_dict()
        record.pop("success_reported", None)
        append_bytes(path, (json.dumps(record) + "\n").encode())
        contents = read_appended(path, contents)
        assert_as_whole(contents, path)
    assert [e.success_reported for e in contents.episodes] == [True, False, True]


def _written_file() -> bytes:
    """A file's bytes: a header, episodes, run segments, a resumption on another core."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "r.jsonl")
        with ResultsFile.open(path, {**HEADER, "core": "rust"}, resume=False) as out:
            for index in range(3):
                out.append(_episode(index, success=index == 1))
            out.append_run(_run(2), elapsed_s=1.0)
        with ResultsFile.open(path, {**HEADER, "core": "python"}, resume=True) as out:
            for index in range(3, 6):
                out.append(_episode(index, steps=index))
            out.append_run(_run(0), elapsed_s=2.0)
        with open(path, "rb") as handle:
            return handle.read()


WRITTEN = _written_file()


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, len(WRITTEN)), max_size=12))
def test_any_split_of_a_files_bytes_reads_as_the_whole(cuts):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "r.jsonl")
        open(path, "wb").close()
        contents = None
        done = 0
        for cut in [*sorted(cuts), len(WRITTEN)]:
            append_bytes(path, WRITTEN[done:cut])
            done = max(done, cut)
            previous = contents
            contents = read_appended(path, contents)
            assert previous is None or contents is previous
            assert_as_whole(contents, path)
    assert contents.dropped == b"" and len(contents.episodes) == 6
