"""Failure isolation: ``on_error="raise" | "record" | "retry"`` and ``max_retries``.

The env here fails on chosen seeds, at a chosen step (0: in its reset), for a chosen number of
attempts; it counts the attempts in a file per seed, so the count holds across the worker
processes of process lanes. Every run gives each episode index ``k`` the seed ``100 + k``
(``seeds=``), so a failure is placed at an index, and every episode that does not fail is
compared field by field with the same episode of a run where nothing fails.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from rlmesh.cli import main
from rlmesh.errors import EnvError, ModelError, ModelOutputError
from rlmesh.results import EpisodeResult, ResultsFile, read_columns, read_run
from rlmesh.settings import run_settings
from rlmesh.stats import summarize

CORES = ["rust", "python"]
EPISODES = 10
SEEDS = [100 + index for index in range(EPISODES)]
FIELDS = ("index", "seed", "trial", "steps", "reward", "terminated", "truncated")


class FlakyEnv(gym.Env):
    """Deterministic by seed: reward ``1 + seed % 3`` a step, terminated after ``3 + seed % 5``
    steps. ``fail[seed] = (step, times)`` raises ``RuntimeError`` in the ``step``-th step (0:
    in ``reset``) of that seed's first ``times`` attempts; ``attempts`` is the directory where
    each seed's resets are counted (one byte each)."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, attempts: str, fail: dict[int, tuple[int, int]] | None = None):
        self.attempts = Path(attempts)
        self.fail = fail or {}
        self.seed_, self.t, self.failing_step = 0, 0, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t, self.failing_step = seed, 0, None
        if seed in self.fail:
            with open(self.attempts / str(seed), "ab") as log:
                log.write(b".")
            attempt = (self.attempts / str(seed)).stat().st_size
            step, times = self.fail[seed]
            if attempt <= times:
                self.failing_step = step
        if self.failing_step == 0:
            raise RuntimeError(f"reset of seed {seed} failed")
        return np.array([0.0, seed], dtype=np.float64), {}

    def step(self, action):
        self.t += 1
        if self.failing_step == self.t:
            raise RuntimeError(f"step {self.t} of seed {self.seed_} failed")
        observation = np.array([self.t, self.seed_], dtype=np.float64)
        return observation, 1.0 + self.seed_ % 3, self.t >= 3 + self.seed_ % 5, False, {}


def policy(observation):
    return int(observation[0]) % 2


def flaky(tmp_path: Path, fail: dict[int, tuple[int, int]] | None = None):
    """A picklable factory of ``FlakyEnv`` counting attempts under ``tmp_path``."""
    directory = tmp_path / "attempts"
    directory.mkdir(parents=True, exist_ok=True)
    return functools.partial(FlakyEnv, str(directory), fail or {})


def attempts(tmp_path: Path, seed: int) -> int:
    log = tmp_path / "attempts" / str(seed)
    return log.stat().st_size if log.exists() else 0


def rows(result):
    return {
        episode.index: {name: getattr(episode, name) for name in FIELDS}
        for episode in result.episodes
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The run where nothing fails, the reference for every other."""
    tmp_path = tmp_path_factory.mktemp("clean")
    return rows(rlmesh.run(policy, flaky(tmp_path), seeds=SEEDS, core="python"))


# Index 2 fails in its reset, index 5 in its 2nd step, index 8 in its 4th.
FAILURES = {102: (0, math.inf), 105: (2, math.inf), 108: (4, math.inf)}
EXPECTED_ERRORS = {
    2: "RuntimeError: reset of seed 102 failed",
    5: "RuntimeError: step 2 of seed 105 failed",
    8: "RuntimeError: step 4 of seed 108 failed",
}


def check_recorded(result, clean):
    """The failed episodes exactly at the chosen indices, with the steps and reward before the
    failing call; every other episode equal to the clean run's."""
    assert result.failed_indices == sorted(EXPECTED_ERRORS)
    assert [episode.index for episode in result.episodes] == list(range(EPISODES))
    for episode in result.episodes:
        if episode.index in EXPECTED_ERRORS:
            seed = SEEDS[episode.index]
            completed_steps = FAILURES[seed][0] - 1 if FAILURES[seed][0] else 0
            assert episode.error == EXPECTED_ERRORS[episode.index]
            assert (episode.seed, episode.steps) == (seed, completed_steps)
            assert episode.reward == completed_steps * (1.0 + seed % 3)
            assert (episode.terminated, episode.truncated, episode.success) == (False, False, None)
        else:
            assert episode.error is None
            assert rows_of(episode) == clean[episode.index]


def rows_of(episode):
    return {name: getattr(episode, name) for name in FIELDS}


# ---------------------------------------------------------------------------- raise


@pytest.mark.parametrize("core", CORES)
def test_raise_is_the_default_and_fails_the_run_with_the_completed_episodes(tmp_path, core):
    with pytest.raises(EnvError, match=r"lane 0 \(FlakyEnv\): step\(\) raised RuntimeError") as err:
        rlmesh.run(policy, flaky(tmp_path, {103: (2, 1)}), seeds=SEEDS, core=core)
    assert [episode.index for episode in err.value.partial_result.episodes] == [0, 1, 2]
    assert isinstance(err.value.__cause__, RuntimeError)


# ---------------------------------------------------------------------------- record


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_record_marks_the_failed_episodes_and_the_rest_equal_a_clean_run(
    tmp_path, clean, core, num_envs
):
    result = rlmesh.run(
        policy,
        flaky(tmp_path, FAILURES),
        seeds=SEEDS,
        num_envs=num_envs,
        on_error="record",
        core=core,
    )
    check_recorded(result, clean)
    # Recorded at once: no index is played twice.
    assert [attempts(tmp_path, seed) for seed in FAILURES] == [1, 1, 1]


@pytest.mark.parametrize("core", CORES)
def test_record_through_the_awaited_round_equals_the_core_s_round(tmp_path, clean, core):
    steps = []

    class Steps(rlmesh.RunHooks):  # a per-step hook: the driver awaits every round itself
        def on_step(self, event):
            steps.append((event.episode, event.step))

    result = rlmesh.run(
        policy,
        flaky(tmp_path, FAILURES),
        seeds=SEEDS,
        num_envs=3,
        on_error="record",
        core=core,
        hooks=Steps(),
    )
    check_recorded(result, clean)
    # A step hook hears only of the steps that happened, the failed ones' completed steps too.
    assert len(steps) == result.total_steps


@pytest.mark.parametrize("core", CORES)
def test_record_in_worker_processes(tmp_path, clean, core):
    result = rlmesh.run(
        policy,
        flaky(tmp_path, FAILURES),
        seeds=SEEDS,
        num_envs=4,
        workers=2,
        on_error="record",
        core=core,
    )
    check_recorded(result, clean)


@pytest.mark.parametrize("core", CORES)
def test_a_recorded_failure_rebuilds_the_lane_s_env(tmp_path, clean, core):
    built = []

    def factory():
        env = FlakyEnv(str(tmp_path), {101: (1, math.inf)})
        built.append(env)
        return env

    result = rlmesh.run(policy, factory, seeds=SEEDS, on_error="record", core=core)
    assert result.failed_indices == [1]
    assert len(built) == 2  # the lane's env, and the one built after it failed
    assert {index: rows_of(e) for index, e in enumerate(result.episodes) if index != 1} == {
        index: row for index, row in clean.items() if index != 1
    }


# ---------------------------------------------------------------------------- retry


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_retry_of_a_transient_failure_equals_a_clean_run(tmp_path, clean, core, num_envs):
    transient = {seed: (step, 2) for seed, (step, _) in FAILURES.items()}  # fails twice
    result = rlmesh.run(
        policy,
        flaky(tmp_path, transient),
        seeds=SEEDS,
        num_envs=num_envs,
        on_error="retry",
        max_retries=2,
        core=core,
    )
    assert result.failed_indices == []
    assert rows(result) == clean
    assert [attempts(tmp_path, seed) for seed in transient] == [3, 3, 3]


@pytest.mark.parametrize("core", CORES)
def test_retry_in_worker_processes_equals_a_clean_run(tmp_path, clean, core):
    transient = {seed: (step, 1) for seed, (step, _) in FAILURES.items()}
    result = rlmesh.run(
        policy,
        flaky(tmp_path, transient),
        seeds=SEEDS,
        num_envs=4,
        workers=2,
        on_error="retry",
        core=core,
    )
    assert rows(result) == clean


@pytest.mark.parametrize("core", CORES)
def test_a_permanent_failure_is_recorded_after_max_retries(tmp_path, clean, core):
    result = rlmesh.run(
        policy,
        flaky(tmp_path, FAILURES),
        seeds=SEEDS,
        num_envs=2,
        on_error="retry",
        max_retries=2,
        core=core,
    )
    check_recorded(result, clean)
    assert [attempts(tmp_path, seed) for seed in FAILURES] == [3, 3, 3]  # 1 + 2 retries


@pytest.mark.parametrize("core", CORES)
def test_a_retried_episode_starts_afresh_for_the_model_and_the_hooks(tmp_path, core):
    started, ended, model_ends = [], [], []

    class Remembering(rlmesh.Model):
        stateless = True

        def predict(self, observation):
            return policy(observation)

        def on_episode_end(self, episode_id):
            model_ends.append(episode_id)

    class Hooks(rlmesh.RunHooks):
        def on_episode_start(self, *, episode, seed):
            started.append(episode)

        def on_episode_end(self, result):
            ended.append((result.index, result.error))

    rlmesh.run(
        Remembering(),
        flaky(tmp_path, {101: (2, 1)}),
        seeds=SEEDS[:3],
        on_error="retry",
        core=core,
        hooks=Hooks(),
    )
    assert started == [0, 1, 1, 2]  # index 1 started again
    assert ended == [(0, None), (1, None), (2, None)]  # and ended once
    # The model was told of the abandoned attempt's end too: four episodes, each once.
    assert sorted(model_ends) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------- model errors


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("on_error", ["record", "retry"])
def test_model_errors_stay_fatal(tmp_path, core, on_error):
    def raising(observation):
        raise ValueError("a bug in the policy")

    with pytest.raises(ModelError, match="a bug in the policy"):
        rlmesh.run(raising, flaky(tmp_path), seeds=SEEDS, on_error=on_error, core=core)
    with pytest.raises(ModelOutputError):
        rlmesh.run(
            lambda obs: [0, 1, 2], flaky(tmp_path), seeds=SEEDS, on_error=on_error, core=core
        )


# ---------------------------------------------------------------------------- the boundary


def test_lanes_that_cannot_be_rebuilt_are_refused_when_failures_are_isolated(tmp_path):
    instance = flaky(tmp_path)()
    with pytest.raises(ValueError, match=r"on_error='record' rebuilds .* FlakyEnv .* cannot"):
        rlmesh.run(policy, instance, seeds=SEEDS, on_error="record")
    vector = gym.vector.SyncVectorEnv([flaky(tmp_path)] * 2)
    with pytest.raises(ValueError, match=r"on_error='retry' rebuilds .* SyncVectorEnv"):
        rlmesh.run(policy, vector, seeds=SEEDS, on_error="retry")
    vector.close()
    instance.close()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"on_error": "skip"}, "on_error must be one of ['raise', 'record', 'retry'], got 'skip'"),
        ({"on_error": "retry", "max_retries": -1}, "max_retries must be a non-negative integer"),
        ({"on_error": "retry", "max_retries": True}, "max_retries must be a non-negative integer"),
        ({"on_error": "record", "max_retries": 2}, "max_retries=2 counts the times a failed"),
        ({"max_retries": 1}, "with on_error='retry', or a window whose Ray worker was lost"),
    ],
)
def test_bad_failure_settings_are_refused_saying_what_was_expected(given, message):
    with pytest.raises(ValueError) as refused:
        run_settings(episodes=2, **given)
    assert message in str(refused.value)


def test_one_max_retries_serves_episodes_and_windows():
    """rlmesh.run's one max_retries is, inside, the episodes' retries and the windows'."""
    assert run_settings().failures.episode_retries == 3
    retried = run_settings(on_error="retry", max_retries=5)
    assert retried.failures.episode_retries == 5 and retried.placement is None
    clustered = run_settings(max_retries=0, cluster="ray")
    assert clustered.placement.window_retries == 0 == clustered.failures.episode_retries


# ---------------------------------------------------------------------------- results files


@pytest.mark.parametrize("core", CORES)
def test_failures_are_written_read_back_and_kept_on_resume(tmp_path, clean, core):
    out = tmp_path / "results.jsonl"
    env = flaky(tmp_path, FAILURES)
    first = rlmesh.run(  # the first 6 indices of the 10: the run stopped there
        policy,
        env,
        seeds=SEEDS,
        indices=range(6),
        on_error="record",
        core=core,
        results_path=out,
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    errors = {line["index"]: line.get("error") for line in lines if "index" in line}
    assert errors == {index: EXPECTED_ERRORS.get(index) for index in range(6)}
    _, on_file, _ = read_run(out)
    assert on_file.episodes == first.episodes
    # A resume keeps the recorded failures as results: index 2 and 5 are not played again.
    resumed = rlmesh.run(
        policy, env, seeds=SEEDS, on_error="record", core=core, results_path=out, resume=True
    )
    check_recorded(resumed, clean)
    assert [attempts(tmp_path, seed) for seed in FAILURES] == [1, 1, 1]


# ---------------------------------------------------------------------------- summaries


def test_the_summary_counts_and_lists_failures_out_of_the_statistics(tmp_path, clean):
    out = tmp_path / "results.jsonl"
    result = rlmesh.run(
        policy,
        flaky(tmp_path, FAILURES),
        seeds=SEEDS,
        on_error="record",
        results_path=out,
        success=5.0,  # a reward of 5 or more succeeds: a rule that would judge a failed one
    )
    ended = [episode for episode in result.episodes if episode.error is None]
    rewards = [episode.reward for episode in ended]
    assert result.mean_reward == pytest.approx(np.mean(rewards))
    assert result.success_rate == np.mean([reward >= 5.0 for reward in rewards])
    summary = summarize(result)
    assert (summary["episodes"], summary["failed"], summary["failed_indices"]) == (
        EPISODES,
        3,
        [2, 5, 8],
    )
    assert summary["total_steps"] == sum(episode.steps for episode in result.episodes)
    assert summary["mean_reward"] == pytest.approx(np.mean(rewards))
    assert summary["episode_length_min"] == min(episode.steps for episode in ended)
    assert summary["success_rate"] == result.success_rate
    # The fast column reader of a results file gives the same summary.
    _, columns = read_columns(out)
    from_file = summarize(columns)
    for key in ("episodes", "failed", "failed_indices", "total_steps", "mean_reward_ci95"):
        assert from_file[key] == summary[key], key
    for key in ("mean_reward", "iqm_reward", "success_rate", "episode_length_mean"):
        assert from_file[key] == pytest.approx(summary[key]), key
    assert re.search(
        r"failed episodes \(env error\) +3: indices 2, 5, 8\n", result.format_summary()
    )


def test_a_summary_without_failures_says_nothing_of_them():
    result = rlmesh.run(policy, "CartPole-v1", episodes=2)
    assert (result.summary()["failed"], result.summary()["failed_indices"]) == (0, [])
    assert "failed" not in result.format_summary()


# ---------------------------------------------------------------------------- the command


def test_the_cli_records_failures_and_report_lists_them(tmp_path, capsys, monkeypatch):
    gym.register(
        "rlmesh-tests/Flaky-v0",
        entry_point=FlakyEnv,
        kwargs={"attempts": str(tmp_path), "fail": {1: (2, 1)}},
    )
    try:
        out = tmp_path / "results.jsonl"
        seeds = tmp_path / "seeds.txt"
        seeds.write_text("0\n1\n2\n")
        argv = ["eval", "random", "--env", "rlmesh-tests/Flaky-v0", "--seeds", str(seeds)]
        assert main([*argv, "--out", str(out), "--on-error", "record", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["failed"], summary["failed_indices"]) == (1, [1])
        assert main(["report", str(out)]) == 0
        assert re.search(r"failed episodes \(env error\) +1: indices 1\n", capsys.readouterr().out)
        # A transient failure with --on-error retry: nothing failed.
        assert main([*argv, "--on-error", "retry", "--max-retries", "1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["failed"] == 0
        assert main([*argv, "--on-error", "record", "--max-retries", "1"]) == 2
        assert "--max-retries needs --on-error retry" in capsys.readouterr().err
    finally:
        gym.registry.pop("rlmesh-tests/Flaky-v0", None)


# ---------------------------------------------------------------------------- served envs


@pytest.mark.parametrize("core", CORES)
def test_a_served_env_s_failure_is_recorded_and_its_session_opened_again(tmp_path, clean, core):
    pytest.importorskip("grpc")
    with rlmesh.serve_env(flaky(tmp_path, FAILURES), num_envs=1) as server:
        result = rlmesh.run(policy, server.address, seeds=SEEDS, on_error="record", core=core)
    assert result.failed_indices == sorted(EXPECTED_ERRORS)
    for index, expected in EXPECTED_ERRORS.items():
        error = result.episodes[index].error
        # The error the driver saw: the server's in-band answer, naming the env's own.
        assert error.startswith("RemoteError: ") and expected in error, error
    assert {index: row for index, row in rows(result).items() if index not in EXPECTED_ERRORS} == {
        index: row for index, row in clean.items() if index not in EXPECTED_ERRORS
    }


@pytest.mark.parametrize("core", CORES)
def test_a_served_env_s_failure_fails_every_episode_in_flight_there(tmp_path, clean, core):
    """The wire ends a session with the env's error, so the other lanes' episodes are lost
    too: with retry they are played again, and every episode equals the clean run's."""
    pytest.importorskip("grpc")
    transient = {seed: (step, 1) for seed, (step, _) in FAILURES.items()}
    with rlmesh.serve_env(flaky(tmp_path, transient), num_envs=3) as server:
        result = rlmesh.run(
            policy, server.address, seeds=SEEDS, on_error="retry", max_retries=5, core=core
        )
    assert rows(result) == clean


def test_the_column_reader_reads_failed_lines_and_files_from_before_the_error_field(tmp_path):
    path = tmp_path / "results.jsonl"
    errors = {3: "RuntimeError: a message, with a comma", 4: "OSError: gone"}
    with ResultsFile.open(path, {"episodes": 6}, resume=False) as out:
        for k in (5, 0, 3, 1, 4, 2):
            episode = EpisodeResult(k, k, k, 0, 10 + k, 1.5 * k, True, False, None, 0.1, 0.1, 0.1)
            out.append(replace(episode, error=errors.get(k)))
    _, run, _ = read_run(path)
    _, columns = read_columns(path)
    assert (
        columns.failed.tolist() == run.columns().failed.tolist() == [k in errors for k in range(6)]
    )
    # The same file as written before episodes had an error field: no line is failed.
    old = tmp_path / "old.jsonl"
    header, *lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    kept = [{k: v for k, v in record.items() if k != "error"} for record in records]
    old.write_text("\n".join([header, *map(json.dumps, kept)]) + "\n")
    _, old_columns = read_columns(old)
    assert old_columns.failed.tolist() == [False] * 6
    for name in ("index", "steps", "reward", "success", "success_reported"):
        assert getattr(old_columns, name).tolist() == getattr(columns, name).tolist(), name
