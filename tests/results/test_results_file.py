"""ResultsFile: the header, one flushed line per episode, resume, and crash repair."""

from __future__ import annotations

import json

import pytest
from rlmesh.errors import ResultsFileError
from rlmesh.results import (
    EpisodeResult,
    ResultsFile,
    RunResult,
    TelemetryRow,
    read_results,
    read_run,
)

HEADER = {"policy": "random", "env": "CartPole-v1", "env_kwargs": {}, "episodes": 4, "seed": 0}


def _episode(index, reward=1.0):
    return EpisodeResult(index, 100 + index, index, 0, 5, reward, True, False, None, 0.1, 0.2, 0.3)


def test_writes_a_header_then_one_flushed_line_per_episode(tmp_path):
    path = tmp_path / "r.jsonl"
    out = ResultsFile.open(path, HEADER, resume=False)
    out.append(_episode(1))
    # Flushed: on disk before the file is closed.
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"rlmesh_results": 1, **HEADER}
    assert json.loads(lines[1]) == _episode(1).to_dict()
    out.close()


def test_an_existing_file_is_refused_without_resume(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    with pytest.raises(ResultsFileError, match="already holds results: pass --resume"):
        ResultsFile.open(path, HEADER, resume=False)


def test_resume_loads_the_episodes_and_appends(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(2))
        out.append(_episode(0))
    with ResultsFile.open(path, HEADER, resume=True) as out:
        assert out.indices == {0, 2}
        assert [episode.index for episode in out.episodes] == [0, 2]
        out.append(_episode(1))
    header, episodes = read_results(path)
    assert header == HEADER
    assert [episode.index for episode in episodes] == [0, 1, 2]


def test_resume_of_a_missing_file_starts_it(tmp_path):
    with ResultsFile.open(tmp_path / "new.jsonl", HEADER, resume=True) as out:
        assert out.episodes == ()


def test_a_header_mismatch_lists_every_differing_field(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    other = {**HEADER, "episodes": 8, "seed": 3}
    with pytest.raises(ResultsFileError) as caught:
        ResultsFile.open(path, other, resume=True)
    message = str(caught.value)
    assert "episodes: the file has 4, this run has 8" in message
    assert "seed: the file has 0, this run has 3" in message
    assert "env" not in message.split("run than this one:")[1].replace("episodes", "")


def test_a_line_cut_mid_write_is_dropped_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
        out.append(_episode(1))
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # the crash cut the last line
    with pytest.warns(UserWarning, match=r"r\.jsonl: the last line was cut off.*dropped its"):
        out = ResultsFile.open(path, HEADER, resume=True)
    assert out.indices == {0}
    out.append(_episode(1))
    out.close()
    assert path.read_bytes() == whole


def test_a_crash_while_writing_the_header_starts_afresh(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"rlmesh_res')
    with pytest.warns(UserWarning, match="cut off"):
        ResultsFile.open(path, HEADER, resume=True).close()
    assert read_results(path) == (HEADER, [])


def test_a_corrupt_complete_line_is_an_error_naming_it(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    with open(path, "a") as handle:
        handle.write("garbage\n")
    with pytest.raises(ResultsFileError, match="line 2 is not JSON"):
        read_results(path)


def test_not_a_results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ResultsFileError, match="expected the header line"):
        read_results(path)


def test_run_segments_merge_into_one_result(tmp_path):
    path = tmp_path / "r.jsonl"
    step = TelemetryRow("env.step", "latency", "ms", 10, 1.0, 1.0, 2.0, 3.0, 4.0)
    rate = TelemetryRow("driver", "lane-steps", "1/s", 100, 50.0, *[float("nan")] * 4)
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0, reward=2.0))
        out.append_run(
            RunResult((), base_seed=0, wasted_steps=1, telemetry=(step, rate)), elapsed_s=2.0
        )
    step2 = TelemetryRow("env.step", "latency", "ms", 30, 3.0, 3.0, 4.0, 5.0, 9.0)
    rate2 = TelemetryRow("driver", "lane-steps", "1/s", 300, 100.0, *[float("nan")] * 4)
    with ResultsFile.open(path, HEADER, resume=True) as out:
        out.append(_episode(1, reward=4.0))
        out.append_run(
            RunResult((), base_seed=0, wasted_steps=2, telemetry=(step2, rate2)), elapsed_s=3.0
        )
        in_memory = out.run_result()
    _, result, elapsed = read_run(path)
    assert (result, elapsed) == in_memory
    assert result.mean_reward == 3.0 and result.wasted_steps == 3 and elapsed == 5.0
    merged_step, merged_rate = result.telemetry
    assert (merged_step.count, merged_step.p50, merged_step.max) == (40, 2.5, 9.0)
    assert merged_rate.count == 400 and merged_rate.avg == pytest.approx(400 / (2 + 3))
    json.loads(path.read_text().splitlines()[2])  # strict JSON: nan written as null
    assert "NaN" not in path.read_text()


def test_a_change_of_core_is_accepted_on_resume_and_recorded(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, {**HEADER, "core": "rust"}, resume=False) as out:
        out.append(_episode(0))
    with ResultsFile.open(path, {**HEADER, "core": "python"}, resume=True) as out:
        assert out.indices == {0}
        out.append(_episode(1))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["core"] == "rust"  # the header keeps the first run's core
    assert {"rlmesh_resume": 1, "core": "python"} in lines
    header, episodes = read_results(path)
    assert header["core"] == "rust" and [episode.index for episode in episodes] == [0, 1]


def test_a_resume_that_changes_nothing_writes_no_resume_line(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    ResultsFile.open(path, HEADER, resume=True).close()
    assert len(path.read_text().splitlines()) == 1


def test_a_changed_policy_source_is_refused_with_every_difference(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, {**HEADER, "policy_sha256": "aaaa"}, resume=False).close()
    with pytest.raises(ResultsFileError) as caught:
        ResultsFile.open(path, {**HEADER, "policy_sha256": "bbbb", "seed": 1}, resume=True)
    message = str(caught.value)
    assert 'policy_sha256: the file has "aaaa", this run has "bbbb"' in message
    assert "seed: the file has 0, this run has 1" in message
    assert "--allow-changed-policy (allow_changed_policy=True)" in message


def test_an_allowed_policy_change_warns_and_is_recorded(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, {**HEADER, "policy_sha256": "aaaa"}, resume=False) as out:
        out.append(_episode(0))
    with pytest.warns(UserWarning, match=r"policy's source file changed.*\"aaaa\".*\"bbbb\""):
        out = ResultsFile.open(
            path, {**HEADER, "policy_sha256": "bbbb"}, resume=True, allow_changed_policy=True
        )
    out.append(_episode(1))
    out.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[2] == {"rlmesh_resume": 1, "policy_sha256": "bbbb"}
    assert [episode.index for episode in read_results(path)[1]] == [0, 1]
    # The recorded change counts from then on: the new code resumes without asking again,
    # and going back to the old code is a change again.
    ResultsFile.open(path, {**HEADER, "policy_sha256": "bbbb"}, resume=True).close()
    assert len(path.read_text().splitlines()) == 4
    with pytest.raises(ResultsFileError, match='the file has "bbbb", this run has "aaaa"'):
        ResultsFile.open(path, {**HEADER, "policy_sha256": "aaaa"}, resume=True)
    # Other fields are still checked when a policy change is allowed.
    with pytest.raises(ResultsFileError, match="episodes: the file has 4, this run has 5"):
        ResultsFile.open(
            path, {**HEADER, "episodes": 5, "policy_sha256": "bbbb"}, resume=True,
            allow_changed_policy=True,
        )  # fmt: skip


def test_a_refused_resume_leaves_a_cut_file_as_it_was(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
    cut = path.read_bytes()[:-10]
    path.write_bytes(cut)
    with pytest.raises(ResultsFileError, match="holds another run"):
        ResultsFile.open(path, {**HEADER, "seed": 5}, resume=True)
    assert path.read_bytes() == cut
