"""The digests on a results file's episode lines: written by a run, read back by every reader
(the line reader and the column scanner), and a file written before them still read."""

from __future__ import annotations

import json

import numpy as np
import pytest
import rlmesh
from helpers import CORES, cartpole_policy
from rlmesh.results import EpisodeResult, ResultsFile, read_columns, read_results, read_run

DIGESTS = ("reset_digest", "trajectory_digest")


@pytest.mark.parametrize("core", CORES)
def test_a_run_writes_each_episode_s_digests_and_every_reader_reads_them(tmp_path, core):
    path = tmp_path / "run.jsonl"
    result = rlmesh.run(
        cartpole_policy, "CartPole-v1", episodes=5, max_episode_steps=50, core=core,
        results_path=path,
    )  # fmt: skip
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    episodes = [line for line in lines if "index" in line]
    assert len(episodes) == 5
    for line in episodes:
        for name in DIGESTS:
            assert len(line[name]) == 16 and int(line[name], 16) >= 0
    _, read = read_results(path)
    assert [(e.reset_digest, e.trajectory_digest) for e in read] == [
        (e.reset_digest, e.trajectory_digest) for e in result.episodes
    ]
    # The column scanner reads the same lines (its numpy path included) to the same figures.
    _, columns = read_columns(path)
    _, run, _ = read_run(path)
    np.testing.assert_array_equal(columns.index, run.columns().index)
    np.testing.assert_array_equal(columns.reward, run.columns().reward)
    assert columns.failed is None or not columns.failed.any()


def test_a_file_written_before_digests_still_reads(tmp_path):
    path = tmp_path / "old.jsonl"
    with ResultsFile.open(path, {"env": "CartPole-v1", "episodes": 3}, resume=False) as out:
        for k in range(3):
            out.append(EpisodeResult(k, k, k, 0, 10 + k, 10.0 + k, True, False, None, 0, 0, 0))
    text = path.read_text()
    assert "digest" not in text  # an episode without digests writes none: as before them
    _, episodes = read_results(path)
    assert [(e.reset_digest, e.trajectory_digest) for e in episodes] == [(None, None)] * 3
    _, columns = read_columns(path)
    assert columns.steps.tolist() == [10, 11, 12]


def test_lines_with_and_without_digests_read_side_by_side(tmp_path):
    path = tmp_path / "mixed.jsonl"
    with ResultsFile.open(path, {"env": "CartPole-v1", "episodes": 2}, resume=False) as out:
        out.append(EpisodeResult(0, 0, 0, 0, 10, 10.0, True, False, None, 0, 0, 0))
        out.append(
            EpisodeResult(
                1, 1, 1, 0, 11, 11.0, True, False, None, 0, 0, 0, task=None,
                reset_digest="0123456789abcdef", trajectory_digest="fedcba9876543210",
            )
        )  # fmt: skip
    _, episodes = read_results(path)
    assert [e.reset_digest for e in episodes] == [None, "0123456789abcdef"]
    _, columns = read_columns(path)
    assert columns.steps.tolist() == [10, 11]
