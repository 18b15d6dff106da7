"""One writer per results file: the lock ResultsFile.open takes and every exit path releases."""

from __future__ import annotations

import json
import os

import pytest
import rlmesh
from helpers import CORES
from rlmesh.errors import ModelError, ResultsFileError, ResultsFileLockedError
from rlmesh.results import LOCK_SUFFIX, EpisodeResult, ResultsFile, read_results, read_run

HEADER = {"policy": "random", "env": "CartPole-v1", "episodes": 4, "seed": 0}


def _episode(index):
    return EpisodeResult(index, 100 + index, index, 0, 5, 1.0, True, False, None, 0.1, 0.2, 0.3)


def test_a_second_writer_is_refused_naming_the_holder_and_the_file_is_untouched(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
        before = path.read_bytes()
        with pytest.raises(ResultsFileLockedError) as caught:
            ResultsFile.open(path, HEADER, resume=True)
        error = caught.value
        assert isinstance(error, ResultsFileError)  # one except catches every results problem
        assert error.path == str(path) and error.holder["pid"] == os.getpid()
        message = str(error)
        assert str(path) in message and f"pid {os.getpid()} on " in message
        assert "\n" not in message
        assert path.read_bytes() == before


def test_readers_work_while_the_writer_holds_the_file(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile.open(path, HEADER, resume=False) as out:
        out.append(_episode(0))
        out.append(_episode(1))
        header, episodes = read_results(path)
        assert header == HEADER and [episode.index for episode in episodes] == [0, 1]
        assert read_run(path)[1].num_episodes == 2


def test_close_releases_the_lock_and_removes_the_lock_file(tmp_path):
    path = tmp_path / "r.jsonl"
    lock_path = tmp_path / ("r.jsonl" + LOCK_SUFFIX)
    out = ResultsFile.open(path, HEADER, resume=False)
    assert json.loads(lock_path.read_text())["pid"] == os.getpid()
    out.close()
    assert not lock_path.exists()
    ResultsFile.open(path, HEADER, resume=True).close()


def test_a_refused_resume_releases_the_lock(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    with pytest.raises(ResultsFileError, match="holds another run"):
        ResultsFile.open(path, {**HEADER, "episodes": 9}, resume=True)
    ResultsFile.open(path, HEADER, resume=True).close()


def test_a_lock_file_left_by_a_dead_run_is_taken_over(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, HEADER, resume=False).close()
    # A killed run leaves its lock file, but the lock itself died with the process.
    (tmp_path / ("r.jsonl" + LOCK_SUFFIX)).write_text('{"pid": 1, "host": "gone", "since": "x"}')
    with ResultsFile.open(path, HEADER, resume=True) as out:
        assert out.episodes == ()


@pytest.mark.parametrize("core", CORES)
def test_rlmesh_run_on_a_held_file_raises_the_typed_error(tmp_path, core):
    path = tmp_path / "r.jsonl"
    holder = ResultsFile.open(path, HEADER, resume=False)
    before = path.read_bytes()
    try:
        with pytest.raises(ResultsFileLockedError, match="is being written by another run"):
            rlmesh.run(
                lambda obs: 0, "CartPole-v1", episodes=2, core=core, results_path=path, resume=True
            )
        assert path.read_bytes() == before
    finally:
        holder.close()


class _Interrupting(rlmesh.Model):
    def predict(self, obs):
        raise KeyboardInterrupt


def _failing(obs):
    raise RuntimeError("boom")


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("model", "raised"),
    [(lambda obs: 0, None), (_failing, ModelError), (_Interrupting(), KeyboardInterrupt)],
    ids=["success", "error", "ctrl-c"],
)
def test_every_way_a_run_ends_releases_the_lock(tmp_path, core, model, raised):
    path = tmp_path / "r.jsonl"
    arguments = {"episodes": 2, "core": core, "results_path": path}
    if raised is None:
        rlmesh.run(model, "CartPole-v1", **arguments)
    else:
        with pytest.raises(raised):
            rlmesh.run(model, "CartPole-v1", **arguments)
    assert not (tmp_path / ("r.jsonl" + LOCK_SUFFIX)).exists()
    # Another writer in this very process gets the file: the lock is not merely left to exit.
    rlmesh.run(lambda obs: 0, "CartPole-v1", **arguments, resume=True)


class FailsAtStart(rlmesh.RunHooks):
    def on_run_start(self, context):
        raise RuntimeError("no start today")


def test_a_complete_file_resumed_with_a_failing_start_hook_releases_the_lock(tmp_path):
    path = tmp_path / "r.jsonl"
    policy = lambda obs: 0  # noqa: E731
    rlmesh.run(policy, "CartPole-v1", episodes=2, results_path=path)
    with pytest.raises(Exception, match="no start today"):  # nothing is left to run
        rlmesh.run(
            policy,
            "CartPole-v1",
            episodes=2,
            results_path=path,
            resume=True,
            hooks=FailsAtStart(),
        )
    assert not (tmp_path / ("r.jsonl" + LOCK_SUFFIX)).exists()
    assert rlmesh.run(policy, "CartPole-v1", episodes=2, results_path=path, resume=True)
