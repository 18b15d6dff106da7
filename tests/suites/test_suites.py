"""Suites: each task's episodes equal a solo rlmesh.run of it, one results file for the whole
suite resumed per (task, index), TOML files checked, and the per-task and overall summary
(its stratified bootstrap checked against a plain numpy loop)."""

from __future__ import annotations

import doctest
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from gymnasium import spaces
from helpers import CORES, cartpole_policy, comparable
from rlmesh import results, stats, suites
from rlmesh.cli import main
from rlmesh.errors import ResultsFileError
from rlmesh.results import read_columns, read_run, read_suite, read_suite_columns, scan

EPISODES = 5


class Coins(gym.Env):
    """A small custom env: guess ``flips`` seeded coins, one a step; success when most are
    guessed (the env's info says so)."""

    def __init__(self, flips: int = 6):
        self.flips = flips
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def _observation(self):
        return np.array([self.hint, self.t / self.flips], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.right = 0, 0
        self.hint = float(self.np_random.random())
        return self._observation(), {}

    def step(self, action):
        coin = int(self.np_random.random() < self.hint)
        self.right += int(action) == coin
        self.t += 1
        self.hint = float(self.np_random.random())
        done = self.t >= self.flips
        info = {"is_success": self.right * 2 > self.flips} if done else {}
        return self._observation(), float(int(action) == coin), done, False, info


gym.register("SuiteCoins-v0", entry_point=f"{__name__}:Coins")


def policy(obs):
    """One deterministic policy for every task's observation space."""
    if obs.shape == (4,):  # CartPole
        return int(obs[2] + 0.3 * obs[3] > 0)
    if obs.shape == (3,):  # Pendulum: a torque against the angular velocity
        return np.clip(-0.5 * obs[2:3], -2.0, 2.0).astype(np.float32)
    return int(obs[0] > 0.5)  # Coins


TASKS = [
    rlmesh.Task("cartpole", "CartPole-v1", episodes=EPISODES, seed=3, max_episode_steps=60),
    rlmesh.Task(
        "pendulum", "Pendulum-v1", env_kwargs={"g": 12.0}, episodes=4, max_episode_steps=25
    ),
    rlmesh.Task("coins", "SuiteCoins-v0", env_kwargs={"flips": 7}, episodes=6, seed=11),
]


def solo(task, core, **kwargs):
    """The task's episodes as a run of it alone (no suite, no file) gives them."""
    result = rlmesh.run(policy, task.make_env(), core=core, **task.run_arguments(), **kwargs)
    return comparable(result, drop=("env_index", "task"))


def of_suite(run):
    assert all(episode.task is not None for episode in run.episodes)
    return comparable(run, drop=("env_index", "task"))


def test_docstring_examples_hold():
    outcome = doctest.testmod(suites, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted > 0 and outcome.failed == 0


@pytest.mark.parametrize("core", CORES)
def test_each_task_equals_a_solo_run_of_it(core, tmp_path):
    path = tmp_path / "suite.jsonl"
    suite = rlmesh.run_suite(policy, TASKS, num_envs=3, core=core, results_path=path)
    assert [task.name for task in suite.tasks] == ["cartpole", "pendulum", "coins"]
    _, on_file = read_suite(path)
    for task in TASKS:
        reference = solo(task, core)
        assert len(reference) == task.episodes
        assert of_suite(suite[task.name]) == reference, task.name
        assert of_suite(on_file[task.name]) == reference, task.name
        assert {episode.task for episode in suite[task.name].episodes} == {task.name}
    # Without a file the tasks' episodes are the same, and still name their task.
    bare = rlmesh.run_suite(policy, TASKS, num_envs=2, core=core)
    for task in TASKS:
        assert of_suite(bare[task.name]) == of_suite(suite[task.name])


def test_the_file_records_the_suite_and_reads_alike_in_columns(tmp_path, monkeypatch):
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(policy, TASKS, num_envs=2, results_path=path)
    header, columns = read_columns(path)
    assert header["suite"] == [task.to_dict() for task in TASKS]
    _, by_task = read_suite(path)
    _, column_tasks = read_suite_columns(path)
    assert list(column_tasks) == [task.name for task in TASKS]
    for task in TASKS:
        expected, got = by_task[task.name].columns(), column_tasks[task.name]
        for name in ("index", "steps", "reward", "success", "success_reported", "task"):
            np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))
        assert got.success_rule == expected.success_rule
        assert got.episodes_requested == task.episodes == expected.episodes_requested
    # The whole file in columns: read_run's episodes, by task then index.
    _, whole, _ = read_run(path)
    np.testing.assert_array_equal(columns.task, whole.columns().task)
    np.testing.assert_array_equal(columns.index, whole.columns().index)
    monkeypatch.setattr(scan, "READ_BLOCK_BYTES", 101)  # lines split across many blocks
    _, small_blocks = read_columns(path)
    np.testing.assert_array_equal(small_blocks.task, columns.task)
    np.testing.assert_array_equal(small_blocks.reward, columns.reward)


def test_suite_lines_are_parsed_by_the_fast_path(tmp_path):
    """Episode lines with a task, and older lines without one, are parsed by numpy, not
    json: the block parser claims every episode line of the file."""
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(policy, TASKS[:2], results_path=path)
    plain = tmp_path / "plain.jsonl"
    rlmesh.run(policy, "CartPole-v1", episodes=4, results_path=plain)
    for file, tasks in ((path, {"cartpole", "pendulum"}), (plain, {""})):
        text = file.read_bytes()
        data = np.frombuffer(text, dtype=np.uint8)
        ends = np.flatnonzero(data == ord("\n"))
        starts = np.concatenate([[0], ends[:-1] + 1])
        rows, columns = scan._fast_episodes(data, starts, ends, np.flatnonzero(data == ord(",")))
        lines = text.splitlines()
        episode_rows = [k for k, line in enumerate(lines) if not line.startswith(b'{"rlmesh_')]
        assert rows.tolist() == episode_rows
        assert set(columns["task"].tolist()) == tasks


def _write_suite(tmp_path, text, name="suite.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


SUITE_TOML = """
name = "classic"

[defaults]
episodes = 4
max_episode_steps = 30

[[task]]
name = "cartpole"
env = "CartPole-v1"
seed = 5

[[task]]
name = "pendulum"
env = "Pendulum-v1"
env_kwargs = { g = 12.0 }
episodes = 3
"""


def test_a_toml_suite_loads_into_tasks(tmp_path):
    tasks = rlmesh.load_suite(_write_suite(tmp_path, SUITE_TOML))
    assert tasks == [
        rlmesh.Task("cartpole", "CartPole-v1", episodes=4, seed=5, max_episode_steps=30),
        rlmesh.Task(
            "pendulum", "Pendulum-v1", env_kwargs={"g": 12.0}, episodes=3, max_episode_steps=30
        ),
    ]
    # A path runs as the list does.
    by_path = rlmesh.run_suite(policy, tmp_path / "suite.toml")
    by_list = rlmesh.run_suite(policy, tasks)
    for task in tasks:
        assert of_suite(by_path[task.name]) == of_suite(by_list[task.name])


TASK = '[[task]]\nname = "a"\nenv = "CartPole-v1"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tasks = 1\n" + TASK, r"suite.toml: unknown key 'tasks'; expected name, defaults, task"),
        (TASK + "episode = 3\n", r"suite.toml, task 'a': unknown key 'episode'; expected one of"),
        (
            "[defaults]\nname = 'x'\n" + TASK,
            r"suite.toml, \[defaults\]: unknown key 'name'; expected one of env, ",
        ),
        (TASK + TASK, r"suite.toml: two tasks are named 'a'; expected a unique name per task"),
        (
            TASK + 'episodes = "ten"\n',
            r"suite.toml, task 'a': episodes is 'ten'; expected a positive integer",
        ),
        (TASK + "episodes = 0\n", r"task 'a': episodes is 0; expected a positive integer"),
        (TASK + "seed = -1\n", r"task 'a': seed is -1; expected an integer in \[0, 2\*\*64\)"),
        (TASK + "env_kwargs = 3\n", r"task 'a': env_kwargs is 3; expected a table"),
        (
            TASK + "env_kwargs = { when = 1979-05-27 }\n",
            r"task 'a': env_kwargs is .*; expected a table of gymnasium.make's keyword",
        ),
        (TASK + "max_episode_steps = 2.5\n", r"task 'a': max_episode_steps is 2.5; expected"),
        (TASK + "seeds = [1, 2]\nepisodes = 3\n", r"task 'a': episodes is 3 but seeds lists 2"),
        (
            '[[task]]\nname = "a b"\nenv = "CartPole-v1"\n',
            r"task 'a b': name is 'a b'; expected 1 to 64 letters, digits",
        ),
        ('[[task]]\nname = "a"\n', r"suite.toml, task 'a': no 'env'; every \[\[task\]\] needs"),
        ('[[task]]\nenv = "CartPole-v1"\n', r"suite.toml, task 1: no 'name'"),
        ("name = 'x'\n", r"suite.toml: no tasks; expected at least one \[\[task\]\] table"),
        (TASK + "env = \n", r"suite.toml: not a valid TOML file \(.*line 4"),
    ],
)
def test_toml_errors_name_the_file_task_and_key(tmp_path, text, message):
    path = _write_suite(tmp_path, text)
    with pytest.raises(ValueError, match=message):
        rlmesh.load_suite(path)
    # The same message from run_suite, before anything runs.
    with pytest.raises(ValueError, match=message):
        rlmesh.run_suite(policy, path)


def test_a_missing_suite_file_says_so(tmp_path):
    with pytest.raises(ValueError, match=r"nothing.toml: cannot read the suite"):
        rlmesh.load_suite(tmp_path / "nothing.toml")


def test_tasks_in_python_are_checked_alike():
    with pytest.raises(ValueError, match=r"task 'a': episodes is 0; expected a positive integer"):
        rlmesh.Task("a", "CartPole-v1", episodes=0)
    with pytest.raises(ValueError, match=r"task 'a': env is 3; expected a Gymnasium id"):
        rlmesh.Task("a", 3)
    assert rlmesh.Task("a", "CartPole-v1").episodes == suites.DEFAULT_EPISODES
    assert rlmesh.Task("a", "CartPole-v1", seeds=[4, 5]).episodes == 2
    with pytest.raises(ValueError, match=r"tasks: two tasks are named 'a'"):
        rlmesh.run_suite(policy, [rlmesh.Task("a", "CartPole-v1")] * 2)
    with pytest.raises(ValueError, match=r"tasks must be rlmesh.Task objects, got a str"):
        rlmesh.run_suite(policy, ["CartPole-v1"])
    with pytest.raises(ValueError, match=r"episodes, seed are set per task in a suite"):
        rlmesh.run_suite(policy, TASKS, episodes=3, seed=1)


@pytest.mark.parametrize("core", CORES)
def test_only_the_chosen_tasks_run(core, tmp_path):
    path = tmp_path / "suite.jsonl"
    suite = rlmesh.run_suite(policy, TASKS, only=["coins", "cartpole"], core=core,
                             results_path=path)  # fmt: skip
    assert [task.name for task in suite.tasks] == ["cartpole", "coins"]  # in suite order
    assert set(suite.runs) == {"cartpole", "coins"}
    _, on_file = read_suite(path)
    assert on_file["pendulum"].num_episodes == 0
    assert of_suite(on_file["coins"]) == solo(TASKS[2], core)
    with pytest.raises(ValueError, match=r"unknown task 'cart'; the suite's tasks are "
                                         r"cartpole, pendulum, coins"):  # fmt: skip
        rlmesh.run_suite(policy, TASKS, only=["cart"])
    # The rest of the suite runs later into the same file.
    rlmesh.run_suite(policy, TASKS, only=["pendulum"], core=core, results_path=path, resume=True)
    _, on_file = read_suite(path)
    assert of_suite(on_file["pendulum"]) == solo(TASKS[1], core)


class StopAfter(rlmesh.RunHooks):
    """Fails the suite's run when ``limit`` episodes have completed, across its tasks, and
    counts the episode starts of each run."""

    def __init__(self, limit=None):
        self.limit, self.completed, self.started = limit, 0, []

    def on_episode_start(self, *, episode, seed):
        self.started.append(episode)

    def on_episode_end(self, result):
        self.completed += 1
        if self.limit is not None and self.completed >= self.limit:
            raise KeyboardInterrupt  # as a Ctrl-C would, after the episode is on disk


@pytest.mark.parametrize("core", CORES)
def test_an_interrupted_suite_resumes_where_it_stopped(core, tmp_path):
    whole = tmp_path / "whole.jsonl"
    reference = rlmesh.run_suite(policy, TASKS, core=core, results_path=whole)
    path = tmp_path / "stopped.jsonl"
    stop = StopAfter(limit=EPISODES + 2)  # the first task and two of the second's
    with pytest.raises(KeyboardInterrupt):
        rlmesh.run_suite(policy, TASKS, core=core, results_path=path, hooks=stop, num_envs=2)
    _, partial = read_suite(path)
    assert [run.num_episodes for run in partial.values()] == [EPISODES, 2, 0]
    counter = StopAfter()
    resumed = rlmesh.run_suite(policy, TASKS, core=core, results_path=path, resume=True,
                               hooks=counter)  # fmt: skip
    # Done tasks are not re-run, the half-done one runs only its missing indices.
    done = {episode.index for episode in partial["pendulum"].episodes}
    assert sorted(counter.started) == sorted(
        [k for k in range(TASKS[1].episodes) if k not in done] + list(range(TASKS[2].episodes))
    )
    _, on_file = read_suite(path)
    for task in TASKS:
        assert of_suite(on_file[task.name]) == of_suite(reference[task.name]), task.name
        assert of_suite(resumed[task.name]) == of_suite(reference[task.name]), task.name


def test_a_failed_task_carries_the_suite_so_far(tmp_path):
    def breaks_on_pendulum(obs):  # a model error (a bug) ends the suite on its second task
        if obs.shape == (3,):
            return np.zeros(5, dtype=np.float32)  # the wrong shape
        return policy(obs)

    with pytest.raises(rlmesh.ModelOutputError) as failed:
        rlmesh.run_suite(breaks_on_pendulum, TASKS, results_path=tmp_path / "s.jsonl")
    partial = failed.value.partial_result
    assert isinstance(partial, rlmesh.SuiteResult)
    assert partial["cartpole"].num_episodes == EPISODES
    assert partial["pendulum"].num_episodes == 0 and "coins" not in partial.runs
    assert partial.summary()["overall"]["complete"] is False


@pytest.mark.parametrize("core", CORES)
def test_a_cut_off_file_resumes_to_the_same_episodes(core, tmp_path):
    path = tmp_path / "suite.jsonl"
    reference = rlmesh.run_suite(policy, TASKS, core=core, results_path=path)
    lines = path.read_text().splitlines(keepends=True)
    # Keep the file up to the second episode of the last task, its third cut mid-line.
    coins = [k for k, line in enumerate(lines) if '"task": "coins"' in line and '"index"' in line]
    path.write_text("".join(lines[: coins[2]]) + lines[coins[2]][:40])
    with pytest.warns(UserWarning, match="cut off mid-write"):
        rlmesh.run_suite(policy, TASKS, core=core, results_path=path, resume=True, num_envs=2)
    _, on_file = read_suite(path)
    for task in TASKS:
        assert of_suite(on_file[task.name]) == of_suite(reference[task.name]), task.name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda tasks: [
                tasks[0],
                rlmesh.Task("pendulum", "Pendulum-v1", episodes=4, max_episode_steps=25),
                tasks[2],
            ],
            r"holds another suite than this one: task 'pendulum', env_kwargs: the file has "
            r"\{\"g\": 12.0\}",
        ),
        (
            lambda tasks: [*tasks, rlmesh.Task("more", "CartPole-v1", episodes=2)],
            r"task 'more' is not in the file's suite \(its tasks: cartpole, pendulum, coins\)",
        ),
        (lambda tasks: tasks[:2], r"task 'coins' is in the file's suite but not in this one"),
    ],
)
def test_resuming_with_a_changed_suite_is_refused(tmp_path, change, message):
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(policy, TASKS, only=["cartpole"], results_path=path)
    before = path.read_bytes()
    with pytest.raises(ResultsFileError, match=message):
        rlmesh.run_suite(policy, change(TASKS), results_path=path, resume=True)
    assert path.read_bytes() == before
    with pytest.raises(ResultsFileError, match=r"already holds results: pass --resume"):
        rlmesh.run_suite(policy, TASKS, results_path=path)


def test_a_task_run_with_other_settings_is_refused_on_resume(tmp_path):
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(policy, TASKS, only=["cartpole"], results_path=path)
    refused = r"\(task 'cartpole'\) holds another run than this one: execution_horizon: the file"
    with pytest.raises(ResultsFileError, match=refused):
        rlmesh.run_suite(policy, TASKS, results_path=path, resume=True, execution_horizon=2)


# ---------------------------------------------------------------------------- the summary


def reference_stratified_ci(groups, confidence=0.95, resamples=10_000, seed=0):
    """The stratified percentile bootstrap written out: per block of ``BOOTSTRAP_BLOCK``
    resamples, each group in order draws its picks from the one generator."""
    rng = np.random.default_rng(seed)
    groups = [np.asarray(group, dtype=np.float64) for group in groups]
    statistics = []
    for start in range(0, resamples, stats.BOOTSTRAP_BLOCK):
        count = min(stats.BOOTSTRAP_BLOCK, resamples - start)
        means = sum(group[rng.integers(0, group.size, (count, group.size))].mean(axis=1)
                    for group in groups)  # fmt: skip
        statistics.extend(means / len(groups))
    tail = (1 - confidence) / 2
    return tuple(np.quantile(statistics, [tail, 1 - tail]))


def test_the_stratified_bootstrap_equals_a_plain_numpy_loop():
    rng = np.random.default_rng(5)
    groups = [rng.normal(0, 1, 7), rng.normal(3, 2, 30), rng.normal(-1, 0.5, 2)]
    got = stats.stratified_bootstrap_mean_ci(groups, resamples=2_000, seed=9)
    want = reference_stratified_ci(groups, resamples=2_000, seed=9)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # Resampled within each task: a task whose values are all equal adds no spread.
    flat = stats.stratified_bootstrap_mean_ci([[2.0] * 5, [4.0] * 50])
    assert flat == (3.0, 3.0)
    # Success verdicts: the mean of the tasks' rates, not of the pooled episodes.
    verdicts = [[1, 1, 1, 1], [0] * 20 + [1] * 20]
    lo, hi = stats.stratified_bootstrap_mean_ci(verdicts, resamples=1_000)
    np.testing.assert_allclose((lo, hi), reference_stratified_ci(verdicts, resamples=1_000))
    assert lo < 0.75 < hi


def test_the_stratified_bootstrap_uses_its_normal_limit_for_many_values():
    rng = np.random.default_rng(1)
    groups = [rng.normal(0, 1, 3_000), rng.normal(5, 3, 2_000)]
    lo, hi = stats.stratified_bootstrap_mean_ci(groups)
    means = [group.mean() for group in groups]
    spread = math.sqrt(sum(group.var() / group.size for group in groups)) / 2
    z = 1.959963984540054
    np.testing.assert_allclose((lo, hi), (np.mean(means) - z * spread, np.mean(means) + z * spread))
    # And the drawn bootstrap agrees with it (a few thousandths of the spread apart).
    drawn = reference_stratified_ci(groups, resamples=400)
    np.testing.assert_allclose(drawn, (lo, hi), atol=0.2 * spread)


def test_the_suite_summary_rows_and_overall(tmp_path):
    suite = rlmesh.run_suite(policy, TASKS, num_envs=2)
    summary = suite.summary()
    rows = {row["task"]: row for row in summary["tasks"]}
    assert list(rows) == ["cartpole", "pendulum", "coins"]
    rates, returns = [], []
    for task in TASKS:
        run, row = suite[task.name], rows[task.name]
        rewards = [episode.reward for episode in run.episodes]
        verdicts = [episode.success for episode in run.episodes if episode.success is not None]
        assert row["episodes"] == task.episodes and row["errors"] == 0
        assert row["mean_reward"] == pytest.approx(np.mean(rewards))
        assert row["mean_reward_ci95"] == list(stats.bootstrap_mean_ci(rewards))
        if verdicts:
            rates.append(np.mean(verdicts))
            assert row["success_ci95"] == list(stats.wilson_interval(sum(verdicts), len(verdicts)))
        else:
            assert row["success_rate"] is None
        returns.append(np.mean(rewards))
    overall = summary["overall"]
    assert overall["success_tasks"] == 2  # Pendulum has no success rule
    assert overall["success_rate"] == pytest.approx(np.mean(rates))
    assert overall["mean_reward"] == pytest.approx(np.mean(returns))
    groups = [[e.reward for e in suite[t.name].episodes] for t in TASKS]
    np.testing.assert_allclose(overall["mean_reward_ci95"], reference_stratified_ci(groups))
    assert "stratified bootstrap" in overall["method"]
    table = suite.format_summary()
    assert table.splitlines()[0].split()[:4] == ["task", "episodes", "errors", "success"]
    # The table's overall row is the mean of the success rates only (its returns are per task).
    assert "overall: success is the unweighted mean of the per-task success rates" in table
    assert "stratified bootstrap, each task's episodes resampled within the task" in table
    json.loads(results.dumps(summary), parse_constant=None)  # strict JSON


def _table_rows(table: str) -> dict[str, list[str]]:
    """The printed suite table's rows by their first cell, cells split at 2+ spaces."""
    rows = {}
    for line in table.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        rows.setdefault(cells[0], cells)
    return rows


def test_the_top_table_says_each_task_s_success_rule_and_pools_no_returns(tmp_path, capsys):
    """CartPole and Acrobot each judged by their own env spec's reward_threshold: the table
    names that rule per task (not "not available" beside a success rate), and its overall
    row gives the mean of the success rates but no mean reward of the two tasks' returns."""
    tasks = [
        rlmesh.Task("cartpole", "CartPole-v1", episodes=4, seed=1, max_episode_steps=30),
        rlmesh.Task("acrobot", "Acrobot-v1", episodes=3, seed=2, max_episode_steps=30),
    ]
    path = tmp_path / "suite.jsonl"
    suite = rlmesh.run_suite(policy, tasks, results_path=path)
    assert main(["report", str(path)]) == 0
    reported = capsys.readouterr().out.split("\n\n")[0]
    assert reported == suite.format_summary()
    rules = {"cartpole": "reward >= 475.0", "acrobot": "reward >= -100.0"}
    rows = _table_rows(reported)
    assert rows["task"][-1] == "success rule"
    for name, threshold in rules.items():
        assert rows[name][3] == ("0.0%" if name == "cartpole" else "100.0%")
        assert rows[name][-1] == f"{threshold} (env spec reward_threshold)", rows[name]
    assert "not available" not in reported
    # Overall: the two success rates' mean; no reward figure across the two tasks.
    assert rows["overall"][:5] == ["overall", "7", "0", "50.0%", rows["overall"][4]]
    assert rows["overall"][5:] == ["-", "-"], rows["overall"]
    assert "returns are not pooled across tasks" in reported
    # The JSON keeps every task's rule by name.
    printed = suite.summary()
    assert [row["success_rule"] for row in printed["tasks"]] == [
        f"{threshold} (env spec reward_threshold)" for threshold in rules.values()
    ]


# ---------------------------------------------------------------------------- the command


def test_cli_eval_suite_report_and_resume_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_suite(tmp_path, SUITE_TOML)
    argv = ["eval", "random", "--suite", "suite.toml", "--out", "r.jsonl", "--no-progress"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [row["task"] for row in printed["tasks"]] == ["cartpole", "pendulum"]
    assert printed["overall"]["episodes"] == 7 and printed["overall"]["complete"] is True
    assert main(["report", "r.jsonl", "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    # The report adds the suite's auditable record (rlmesh.provenance) to eval's summary.
    assert reported.pop("provenance")[0]["command"] == ["rlmesh", *argv, "--json"]
    assert reported == printed
    _, runs = read_suite_columns(tmp_path / "r.jsonl")
    assert reported["overall"] == stats.summarize_suite(runs)["overall"]
    assert main(["report", "r.jsonl"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("task") and "overall" in table and "stratified bootstrap" in table
    # The random policy's episodes are those of a solo run of each task.
    for task in rlmesh.load_suite(tmp_path / "suite.toml"):
        assert main(["eval", "random", "--env", task.env, "--env-kwargs",
                     json.dumps(task.env_kwargs), "--episodes", str(task.episodes), "--seed",
                     str(task.seed), "--max-episode-steps", str(task.max_episode_steps),
                     "--out", f"{task.name}.jsonl", "--json"]) == 0  # fmt: skip
        capsys.readouterr()
        _, alone, _ = read_run(tmp_path / f"{task.name}.jsonl")
        _, in_suite = read_suite(tmp_path / "r.jsonl")
        assert of_suite(in_suite[task.name]) == comparable(alone, drop=("env_index", "task"))
    # Cut the file inside the second task: --resume finishes it with the same episodes.
    before = read_suite(tmp_path / "r.jsonl")[1]
    lines = (tmp_path / "r.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "r.jsonl").write_text("".join(lines[:-3]))
    assert main([*argv, "--resume", "--json"]) == 0
    capsys.readouterr()
    after = read_suite(tmp_path / "r.jsonl")[1]
    for name in before:
        assert of_suite(after[name]) == of_suite(before[name])


def test_cli_tasks_filter_and_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_suite(tmp_path, SUITE_TOML)
    base = ["eval", "random", "--suite", "suite.toml", "--no-progress"]
    assert main([*base, "--tasks", "pendulum", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [row["task"] for row in printed["tasks"]] == ["pendulum"]
    assert main([*base, "--tasks", "pendulum,nope"]) == 2
    error = capsys.readouterr().err
    assert "--tasks pendulum,nope: unknown task 'nope'; the suite's tasks are cartpole, " in error
    assert main([*base, "--episodes", "3", "--seed", "1"]) == 2
    assert "--seed, --episodes cannot go with --suite" in capsys.readouterr().err
    assert main(["eval", "random", "--env", "CartPole-v1", "--tasks", "a"]) == 2
    assert "--tasks needs --suite NAME|FILE" in capsys.readouterr().err
    assert main(["eval", "random"]) == 2
    assert "required: --env (or --suite NAME|FILE)" in capsys.readouterr().err
    _write_suite(tmp_path, TASK + "episode = 3\n", name="bad.toml")
    assert main(["eval", "random", "--suite", "bad.toml"]) == 2
    assert "bad.toml, task 'a': unknown key 'episode'" in capsys.readouterr().err
    _write_suite(tmp_path, '[[task]]\nname = "a"\nenv = "NoSuchEnv-v0"\n', name="env.toml")
    assert main(["eval", "random", "--suite", "env.toml"]) == 2
    assert "--suite env.toml, task 'a': " in capsys.readouterr().err


def test_a_suite_resumed_on_the_other_core_reads_back(tmp_path, capsys):
    """The resumption records the new core per task; readers skip that record."""
    path = tmp_path / "suite.jsonl"
    stop = StopAfter(limit=EPISODES + 1)
    with pytest.raises(KeyboardInterrupt):
        rlmesh.run_suite(policy, TASKS, core="rust", results_path=path, hooks=stop)
    rlmesh.run_suite(policy, TASKS, core="python", results_path=path, resume=True)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    resumes = [record for record in records if "rlmesh_resume" in record]
    assert {record.get("task") for record in resumes} >= {"cartpole", "pendulum"}
    _, by_task = read_suite(path)
    _, column_tasks = read_suite_columns(path)
    for task in TASKS:
        assert of_suite(by_task[task.name]) == solo(task, "rust")
        np.testing.assert_array_equal(
            column_tasks[task.name].reward, by_task[task.name].columns().reward
        )
    assert main(["report", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["complete"] is True


def test_an_index_repeated_within_a_task_fails_alike_in_both_readers(tmp_path):
    path = tmp_path / "suite.jsonl"
    rlmesh.run_suite(policy, TASKS[:2], results_path=path)
    lines = path.read_text().splitlines(keepends=True)
    pendulum = next(
        k
        for k, line in enumerate(lines)
        if line.startswith('{"index"') and '"task": "pendulum"' in line  # an episode's line
    )
    lines.append(lines[pendulum])  # the same (task, index) again, at the end
    path.write_text("".join(lines))
    message = f"line {len(lines)} repeats episode index 0 of task 'pendulum'"
    with pytest.raises(ResultsFileError, match=message):
        read_suite(path)
    with pytest.raises(ResultsFileError, match=message):
        read_columns(path)


def test_failed_episodes_are_counted_listed_and_kept_out_of_the_figures():
    """Episodes whose ``error`` is set (the failure-isolation field, read with getattr so the
    summary works with or without it) count as errors, not as rewards or verdicts."""

    @dataclass(frozen=True)
    class Failable(rlmesh.EpisodeResult):
        error: str | None = None

    def episode(k, reward, success, error=None):
        return Failable(k, k, k, 0, 10, reward, True, False, success, 0, 0, 0, True, "a", error)

    run = rlmesh.RunResult(
        [episode(0, 1.0, True), episode(1, 0.0, False), episode(2, 99.0, True, "EnvError: x")],
        base_seed=0,
        episodes_requested=3,
    )
    row = stats.summarize_suite({"a": run})["tasks"][0]
    assert (row["episodes"], row["errors"], row["error_indices"]) == (3, 1, [2])
    assert row["mean_reward"] == 0.5 and row["success_rate"] == 0.5
    assert row["complete"] is True
    assert "failed episodes (kept out of the figures): a [2]" in stats.format_suite_summary(
        stats.summarize_suite({"a": run})
    )


SLOW_POLICY = """
import time
import numpy as np


def policy(obs):
    time.sleep(0.002)
    if obs.shape == (4,):
        return int(obs[2] + 0.3 * obs[3] > 0)
    return np.clip(-0.5 * obs[2:3], -2.0, 2.0).astype(np.float32)
"""


def test_cli_ctrl_c_keeps_the_suite_and_resume_completes_it(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_POLICY)
    _write_suite(tmp_path, SUITE_TOML.replace("episodes = 4", "episodes = 12"))
    argv = ["eval", "slow.py:policy", "--suite", "suite.toml", "--num-envs", "2", "--no-progress"]
    command = [sys.executable, "-m", "rlmesh", *argv, "--out", "stopped.jsonl"]
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                               stdout=subprocess.DEVNULL, env={**os.environ})  # fmt: skip
    out = tmp_path / "stopped.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a few episodes on file, the suite not done
            if out.exists() and out.read_text().count('"index"') >= 3:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # the test failed with the run still going
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "Resume with: rlmesh eval slow.py:policy --suite suite.toml" in err
    assert "--resume" in err and "of 15 episodes are in stopped.jsonl" in err
    resumed = subprocess.run([*command, "--resume"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run([*command[:-1], "whole.jsonl"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    _, stopped = read_suite(out)
    _, reference = read_suite(tmp_path / "whole.jsonl")
    for name in reference:
        assert of_suite(stopped[name]) == of_suite(reference[name]), name


def test_the_blocking_forms_refuse_a_running_event_loop_naming_the_awaitable_one():
    import asyncio

    async def inside():
        with pytest.raises(RuntimeError, match=r"use `await rlmesh\.arun_suite\(\.\.\.\)`"):
            rlmesh.run_suite(cartpole_policy, TASKS)
        with pytest.raises(RuntimeError, match=r"use `await rlmesh\.arun\(\.\.\.\)`"):
            rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1)

    asyncio.run(inside())
