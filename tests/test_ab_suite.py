"""``rlmesh.ab(..., tasks=...)`` and ``rlmesh ab --suite``: the paired comparison on a suite.

Two CartPole tasks with different seeds (and step caps) make a small suite, written as a TOML
file the way a user writes one. CartPole's heuristic balances the pole on every task; a
policy that always pushes left drops it within a dozen steps. The comparison must decide for
the heuristic on the pooled pairs, and must not decide between a policy and itself, or between
two coin-flip policies, before the cap. Each block plays the same indices of every task, so
the two results files hold the same (task, index, seed) triples, which ``rlmesh compare``
pairs.
"""

from __future__ import annotations

import json
import zlib

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from rlmesh.cli import main
from rlmesh.policies import CartPoleHeuristic, RandomPolicy
from rlmesh.report.compare import compare
from rlmesh.results import read_suite
from rlmesh.stats.sequential import paired_test

SUITE = """
name = "two-carts"

[defaults]
env = "CartPole-v1"
episodes = {episodes}

[[task]]
name = "short"
seed = 11
max_episode_steps = 120

[[task]]
name = "long"
seed = 12
episodes = {long_episodes}
"""


def core_name(core):
    return "rust" if core.__name__ == "rlmesh._core" else "python"


def suite_file(tmp_path, episodes=100, long_episodes=100):
    path = tmp_path / "suite.toml"
    path.write_text(SUITE.format(episodes=episodes, long_episodes=long_episodes))
    return path


def push_left(obs):
    return 0


def coin_flip(obs):
    """A coin flip seeded by the observation, differently from ``RandomPolicy``: as good."""
    return zlib.crc32(np.ascontiguousarray(obs).tobytes(), 54321) & 1


def random_policy():
    return RandomPolicy(gym.make("CartPole-v1").action_space)


def by_key(runs):
    """A suite file's episodes by (task, index)."""
    return {(name, e.index): e for name, run in runs.items() for e in run.episodes}


def pooled_order(caps, block):
    """The documented order of the pooled pairs: block by block, task by task, index."""
    order, start = [], 0
    while start < max(caps.values()):
        for name, cap in caps.items():
            order += [(name, k) for k in range(start, min(start + block, cap))]
        start += block
    return order


def test_run_suite_plays_only_the_indices_asked_for_each_with_its_solo_seed(core, tmp_path):
    # Task.settings keeps the shared indices: the suite's ab blocks rely on it.
    tasks = rlmesh.load_suite(suite_file(tmp_path, episodes=6, long_episodes=4))
    path = tmp_path / "part.jsonl"
    arguments = {"results_path": path, "resume": True, "core": core_name(core)}
    first = rlmesh.run_suite(push_left, tasks, indices=[1, 3], **arguments)
    assert {name: [e.index for e in first[name].episodes] for name in ("short", "long")} == {
        "short": [1, 3],
        "long": [1, 3],
    }
    rlmesh.run_suite(push_left, tasks, only=["short"], indices=range(4, 6), **arguments)
    _, runs = read_suite(path)
    assert sorted(e.index for e in runs["short"].episodes) == [1, 3, 4, 5]
    assert sorted(e.index for e in runs["long"].episodes) == [1, 3]
    # Each index is the episode a whole solo run of the task plays there.
    for task in tasks:
        solo = {
            e.index: e for e in rlmesh.run(push_left, task.env, **task.run_arguments()).episodes
        }
        for episode in runs[task.name].episodes:
            assert (episode.seed, episode.reward) == (
                solo[episode.index].seed,
                solo[episode.index].reward,
            )
    with pytest.raises(ValueError, match=r"indices\[0\] is 5"):  # long has episodes 0..3
        rlmesh.run_suite(push_left, tasks, only=["long"], indices=[5], **arguments)


def test_a_suite_file_resumes_block_after_block_when_its_provenance_changes(tmp_path):
    # ab grows a suite file one block at a time; each resumption whose provenance differs (a
    # later second, another command) records it per task: those records must not count as
    # the suite header's on the next resumption.
    tasks = rlmesh.load_suite(suite_file(tmp_path, episodes=4, long_episodes=4))
    path = tmp_path / "grown.jsonl"
    for block in range(4):
        rlmesh.run_suite(
            push_left,
            tasks,
            indices=[block],
            results_path=path,
            resume=True,
            provenance={"command": ["block", str(block)]},
        )
    _, runs = read_suite(path)
    assert {name: sorted(e.index for e in run.episodes) for name, run in runs.items()} == {
        "short": [0, 1, 2, 3],
        "long": [0, 1, 2, 3],
    }


@pytest.mark.parametrize("heuristic_is", ["A", "B"])
def test_the_suite_comparison_decides_for_the_better_policy(core, tmp_path, heuristic_is):
    models = (CartPoleHeuristic(), push_left)
    if heuristic_is == "B":
        models = models[::-1]
    result = rlmesh.ab(
        *models,
        tasks=suite_file(tmp_path),
        episodes=40,
        success=100,
        block=4,
        num_envs=2,
        out_dir=tmp_path / "ab",
        core=core_name(core),
    )
    sign = 1 if heuristic_is == "A" else -1
    assert result.decision == heuristic_is and result.measure == "success"
    assert result.tasks == ("short", "long") and result.cap == 80
    assert result.decided_at is not None and result.decided_at <= result.episodes < 80
    assert result.episodes % 8 == 0  # whole blocks of 4 indices of both tasks
    assert result.p_value <= result.alpha and sign * result.lower > 0
    assert isinstance(result.a, rlmesh.SuiteResult)
    # Two suite files with the same (task, index, seed) triples, which compare pairs.
    (header_a, runs_a), (_, runs_b) = (read_suite(path) for path in result.paths)
    assert [task["name"] for task in header_a["suite"]] == ["short", "long"]
    a, b = by_key(runs_a), by_key(runs_b)
    per_task = result.episodes // 2
    assert (
        sorted(a) == sorted(b) == sorted((t, k) for t in ("short", "long") for k in range(per_task))
    )
    assert all(a[key].seed == b[key].seed for key in a)
    assert a[("short", 0)].seed != a[("long", 0)].seed  # each task seeds its own episodes
    # The decision is the paired test's on the pooled pairs in the documented order.
    order = pooled_order({"short": per_task, "long": per_task}, 4)
    test = paired_test([float(a[k].success) for k in order], [float(b[k].success) for k in order])
    assert test.decision(result.alpha) == (result.decided_at, sign)
    assert result.p_value == pytest.approx(test.p_value[-1])
    comparison = compare(*result.paths)
    assert comparison["pairs"] == result.episodes and len(comparison["tasks"]) == 2
    assert main(["compare", str(result.paths[0]), str(result.paths[1])]) == 0


def test_one_policy_twice_never_decides_on_a_suite(core, tmp_path):
    result = rlmesh.ab(
        random_policy(),
        random_policy(),
        tasks=suite_file(tmp_path, long_episodes=9),
        episodes=20,
        success=20,
        block=7,
        out_dir=tmp_path / "ab",
        core=core_name(core),
    )
    # long stops at its own 9 episodes: 20 + 9 pairs.
    assert (result.decision, result.decided_at, result.episodes, result.cap) == (None, None, 29, 29)
    assert result.difference == 0.0 and result.e_value <= 1
    _, runs = read_suite(result.paths[0])
    assert [len(runs[name].episodes) for name in ("short", "long")] == [20, 9]


@pytest.mark.parametrize("seeds", [(0, 1), (2, 3), (4, 5)])
def test_two_equal_policies_are_not_told_apart_on_a_suite(seeds):
    tasks = [
        rlmesh.Task("first", "CartPole-v1", seed=seeds[0], episodes=30),
        rlmesh.Task("second", "CartPole-v1", seed=seeds[1], episodes=30),
    ]
    result = rlmesh.ab(
        random_policy(),
        coin_flip,
        tasks=tasks,
        episodes=30,
        measure="reward",  # success (a return of 475) would be a run of zeros for both
        reward_bounds=(0, 500),
        block=10,
    )
    assert result.decision is None and result.episodes == result.cap == 60
    assert result.p_value > result.alpha and result.lower <= 0 <= result.upper
    returns = [
        [e.reward for r in side.runs.values() for e in r.episodes] for side in (result.a, result.b)
    ]
    assert returns[0] != returns[1]  # different policies: the test had differences to weigh
    assert result.paths is None


def test_the_cli_compares_on_a_suite_file(tmp_path, capsys):
    suite = suite_file(tmp_path)
    out = tmp_path / "ab"
    argv = ["ab", "random", "cartpole-heuristic", "--suite", str(suite), "--episodes", "30"]
    assert main([*argv, "--success-reward", "100", "--out-dir", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decision"] == "B" and summary["tasks"] == ["short", "long"]
    assert summary["confidence_sequence"][1] < 0 and summary["cap"] == 60
    header, runs = read_suite(out / "b.jsonl")
    assert [task["name"] for task in header["suite"]] == ["short", "long"]
    assert {run.episodes[0].task for run in runs.values()} == {"short", "long"}
    a, b = by_key(read_suite(out / "a.jsonl")[1]), by_key(runs)
    assert {key: e.seed for key, e in a.items()} == {key: e.seed for key, e in b.items()}
    assert len(a) == summary["episodes"]
    assert main(["compare", str(out / "a.jsonl"), str(out / "b.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == summary["episodes"]
    # --tasks picks the tasks; the text names them.
    assert main([*argv, "--tasks", "long", "--out-dir", str(tmp_path / "long")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decision: B is better (success, alpha 0.05)")
    assert "tasks: 1 (long)" in text
    runs = read_suite(tmp_path / "long" / "a.jsonl")[1]
    assert not runs["short"].episodes and runs["long"].episodes


def test_the_cli_refuses_what_a_suite_sets_and_unknown_suites(tmp_path, capsys):
    suite = str(suite_file(tmp_path))
    base = ["ab", "random", "random", "--episodes", "4", "--out-dir", str(tmp_path / "x")]
    assert main([*base, "--suite", suite, "--seed", "3"]) == 2
    assert "rlmesh ab: error: --seed cannot go with --suite" in capsys.readouterr().err
    assert main([*base, "--suite", "no_such_suite"]) == 2
    assert "no such file and no built-in suite of that name" in capsys.readouterr().err
    assert main([*base, "--suite", suite, "--tasks", "medium"]) == 2
    assert "unknown task 'medium'" in capsys.readouterr().err
    assert main([*base, "--env", "CartPole-v1", "--tasks", "long"]) == 2
    assert "--tasks needs --suite" in capsys.readouterr().err
    assert main([*base, "--env", "CartPole-v1", "--suite", suite]) == 2
    assert "--suite: not allowed with argument --env" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_api_takes_an_env_or_tasks_and_leaves_seeds_to_the_tasks(tmp_path):
    tasks = rlmesh.load_suite(suite_file(tmp_path))
    heuristic = CartPoleHeuristic()
    with pytest.raises(ValueError, match="got both"):
        rlmesh.ab(heuristic, heuristic, "CartPole-v1", tasks=tasks, episodes=2)
    with pytest.raises(ValueError, match="got neither"):
        rlmesh.ab(heuristic, heuristic, episodes=2)
    with pytest.raises(ValueError, match="each task sets its own seed"):
        rlmesh.ab(heuristic, heuristic, tasks=tasks, episodes=2, seed=1)
    with pytest.raises(ValueError, match="only= names tasks of a suite"):
        rlmesh.ab(heuristic, heuristic, "CartPole-v1", episodes=2, only=["short"])
    with pytest.raises(ValueError, match="max_episode_steps is set per task"):
        rlmesh.ab(heuristic, heuristic, tasks=tasks, episodes=2, max_episode_steps=5)


def test_the_cli_takes_a_built_in_suite_by_name(tmp_path, capsys):
    pytest.importorskip("gym_pusht", reason="the pusht extra (gym-pusht) is not installed")
    out = tmp_path / "pusht"
    argv = ["ab", "random", "random", "--suite", "pusht", "--episodes", "2", "--block", "1"]
    options = ["--seed", "5", "--max-episode-steps", "3", "--out-dir", str(out), "--json"]
    assert main([*argv, *options]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tasks"] == ["pusht"] and summary["episodes"] == summary["cap"] == 2
    (header, runs_a), (_, runs_b) = (read_suite(out / name) for name in ("a.jsonl", "b.jsonl"))
    # --seed and --max-episode-steps reached each task, as with rlmesh eval --suite.
    assert [(t["seed"], t["max_episode_steps"]) for t in header["suite"]] == [(5, 3)]
    a, b = by_key(runs_a), by_key(runs_b)
    assert sorted(a) == [("pusht", 0), ("pusht", 1)]
    assert all(a[key].seed == b[key].seed for key in a)
    assert main(["compare", str(out / "a.jsonl"), str(out / "b.jsonl")]) == 0
