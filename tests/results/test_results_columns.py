"""read_columns (what ``rlmesh report`` reads) gives exactly what read_run gives, in columns.

The fast path parses rlmesh's own episode lines with numpy; every other line goes through
json. Either way the figures, and the errors, are read_run's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import rlmesh
from helpers import CORES
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmesh import results
from rlmesh.cli import CartPoleHeuristic
from rlmesh.errors import ResultsFileError
from rlmesh.results import (
    EpisodeResult,
    ResultsFile,
    RunResult,
    lines,
    read_columns,
    read_run,
    scan,
)

ARRAYS = ("index", "steps", "reward", "success", "success_reported")
FIELDS = (
    "base_seed",
    "wasted_steps",
    "telemetry",
    "observer_errors",
    "core",
    "success_rule",
    "episodes_requested",
    "elapsed_s",
)


def assert_same_columns(path) -> None:
    header, result, _ = read_run(path)
    columns_header, columns = read_columns(path)
    expected = result.columns()
    assert columns_header == header
    for name in ARRAYS:
        got, want = getattr(columns, name), getattr(expected, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    for name in FIELDS:
        assert getattr(columns, name) == getattr(expected, name), name


def write(path, lines) -> None:
    path.write_text("".join(line + "\n" for line in lines))


HEADER = json.dumps({"rlmesh_results": 1, "episodes": 4, "success_rule": {"kind": "none"}})


def episode_line(index, **changes) -> str:
    episode = EpisodeResult(index, index, index, 0, 10 + index, index / 3, True, False, None,
                            0.1, 0.2, 0.3)  # fmt: skip
    return results.dumps({**episode.to_dict(), **changes})


@pytest.mark.parametrize("core", CORES)
def test_a_real_run_reads_the_same_in_columns(core, tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=9, num_envs=3, core=core,
               max_episode_steps=40, results_path=path)  # fmt: skip
    assert_same_columns(path)
    monkeypatch.setattr(scan, "READ_BLOCK_BYTES", 97)  # lines split across many blocks
    assert_same_columns(path)


def test_lines_not_as_rlmesh_writes_them_are_read_by_json(tmp_path):
    path = tmp_path / "edited.jsonl"
    reordered = json.dumps(dict(reversed(list(json.loads(episode_line(1)).items()))))
    compact = json.dumps(json.loads(episode_line(2)), separators=(",", ":"))
    write(path, [HEADER, episode_line(0), reordered, compact, episode_line(3, success=True)])
    assert_same_columns(path)
    _, columns = read_columns(path)
    assert columns.index.tolist() == [0, 1, 2, 3]
    assert columns.success.tolist() == [-1, -1, -1, 1]


def test_non_finite_rewards_read_back(tmp_path):
    path = tmp_path / "inf.jsonl"
    rewards = [math.inf, -math.inf, math.nan, 1e300, -0.0, 5e-324]
    write(path, [HEADER] + [episode_line(k, reward=r) for k, r in enumerate(rewards)])
    assert_same_columns(path)
    _, columns = read_columns(path)
    np.testing.assert_array_equal(columns.reward, rewards)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([episode_line(0)], "line 1: expected the header line"),
        ([HEADER, episode_line(0), episode_line(1), episode_line(0)], "line 4 repeats episode 0"),
        ([HEADER, episode_line(0), "{not json"], "line 3 is not JSON"),
        ([HEADER, episode_line(0, reward="lots")], "field 'reward' is 'lots'; expected a number"),
        ([HEADER, episode_line(0, extra=1)], "line 2 is not an episode line"),
    ],
)
def test_bad_files_fail_alike(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    write(path, lines)
    message = message.replace("episode 0", "episode index 0")
    with pytest.raises(ResultsFileError, match=message) as by_json:
        read_run(path)
    with pytest.raises(ResultsFileError) as by_columns:
        read_columns(path)
    assert str(by_columns.value) == str(by_json.value)


def test_a_cut_off_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text(HEADER + "\n" + episode_line(0) + "\n" + episode_line(1)[:30])
    with pytest.warns(UserWarning, match="cut off mid-write"):
        _, columns = read_columns(path)
    assert columns.index.tolist() == [0]


def test_a_file_from_before_success_rules_counts_its_successes_as_the_envs(tmp_path):
    path = tmp_path / "old.jsonl"
    old = {key: value for key, value in json.loads(episode_line(0, success=True)).items()
           if key != "success_reported"}  # fmt: skip
    write(path, [json.dumps({"rlmesh_results": 1, "episodes": 1}), json.dumps(old)])
    assert_same_columns(path)
    _, columns = read_columns(path)
    assert columns.success_reported.tolist() == [True]


episodes_strategy = st.lists(
    st.builds(
        lambda steps, reward, success, reported, seed: (steps, reward, success, reported, seed),
        st.integers(0, 10**12),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([True, False, None]),
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 2**63)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(episodes=episodes_strategy, block=st.integers(16, 4096))
def test_any_episodes_written_read_back_the_same(tmp_path_factory, episodes, block):
    path = tmp_path_factory.mktemp("any") / "r.jsonl"
    order = list(range(len(episodes)))[::-1]  # completion order differs from index order
    with ResultsFile.open(path, {"episodes": len(episodes)}, resume=False) as out:
        for k in order:
            steps, reward, success, reported, seed = episodes[k]
            out.append(EpisodeResult(k, seed, k, 1, steps, reward, False, True, success,
                                     0.5, 0.25, 0.125, reported))  # fmt: skip
        out.append_run(RunResult((), base_seed=0), elapsed_s=2.0)
    previous = scan.READ_BLOCK_BYTES
    scan.READ_BLOCK_BYTES = block
    try:
        assert_same_columns(path)
    finally:
        scan.READ_BLOCK_BYTES = previous


def test_rlmesh_episode_lines_take_the_fast_path(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=5, max_episode_steps=20,
               results_path=path)  # fmt: skip
    parsed = []
    record = lines.parse_record  # every line not claimed by numpy is parsed by json here
    monkeypatch.setattr(
        lines, "parse_record", lambda raw, where: parsed.append(raw) or record(raw, where)
    )
    read_columns(path)
    assert len(parsed) == 2  # the header and the run segment; no episode line
