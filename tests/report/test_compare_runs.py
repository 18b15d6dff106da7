"""Paired comparison of real runs: two policies on CartPole-v1 through rlmesh.run on both
cores, and the `rlmesh compare` command end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import CORES
from rlmesh.cli import CartPoleHeuristic, RandomPolicy, main
from rlmesh.results import read_results
from scipy.stats import binomtest

EPISODES = 24


def noisy_heuristic(percent):
    """The heuristic, but for the observations whose digest falls in ``percent`` of 100, where
    it pushes the other way: a pure function of the observation, so reproducible on any lane,
    and with CartPole's seeds 0..23 the 20% and 30% versions each win some episodes."""

    def policy(obs):
        push = int(obs[2] + 0.3 * obs[3] > 0)
        flip = zlib.crc32(obs.tobytes()) % 100 < percent
        return 1 - push if flip else push

    return policy


def make_policy(name):
    if name == "heuristic":
        return CartPoleHeuristic()
    if name == "random":
        return RandomPolicy(gym.spaces.Discrete(2))
    return noisy_heuristic(int(name.removeprefix("noisy")))


def evaluate(path, policy, *, core, seed=0, episodes=EPISODES, num_envs=3):
    model = make_policy(policy)
    return rlmesh.run(
        model,
        "CartPole-v1",
        episodes=episodes,
        num_envs=num_envs,
        seed=seed,
        core=core,
        results_path=str(path),
        run_info={"policy": policy},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The random policy and the heuristic, one results file each per core."""
    folder = tmp_path_factory.mktemp("runs")
    files = {}
    for core in CORES:
        for policy in ("random", "heuristic", "noisy20", "noisy30"):
            path = folder / f"{policy}-{core}.jsonl"
            evaluate(path, policy, core=core, num_envs=3 if core == "rust" else 2)
            files[policy, core] = path
    return files


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("policy_a", "policy_b"), [("random", "heuristic"), ("noisy20", "noisy30")]
)
def test_two_real_policies_compare_as_their_episodes_say(runs, core, policy_a, policy_b):
    a_path, b_path = runs[policy_a, core], runs[policy_b, core]
    result = rlmesh.compare(a_path, b_path)
    _, a = read_results(a_path)
    _, b = read_results(b_path)
    assert [episode.seed for episode in a] == [episode.seed for episode in b]
    rewards_a = np.array([episode.reward for episode in a])
    rewards_b = np.array([episode.reward for episode in b])
    overall = result["overall"]
    assert result["pairs"] == overall["pairs"] == EPISODES
    assert overall["return_wins"] == {
        "b": int(np.sum(rewards_b > rewards_a)),
        "a": int(np.sum(rewards_a > rewards_b)),
        "tie": int(np.sum(rewards_a == rewards_b)),
    }
    assert overall["mean_return_difference"] == pytest.approx(np.mean(rewards_b - rewards_a))
    if policy_a.startswith("noisy"):  # the pair where each policy wins some episodes
        assert min(overall["return_wins"]["a"], overall["return_wins"]["b"]) > 0
    low, high = overall["mean_return_difference_ci"]
    assert low <= overall["mean_return_difference"] <= high
    # CartPole-v1's reward_threshold (475) judges success.
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x.success and not y.success)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y.success and not x.success)
    success = overall["success"]
    assert (success["only_a"], success["only_b"]) == (only_a, only_b)
    assert success["rate_b"] == pytest.approx(np.mean([episode.success for episode in b]))
    assert success["mcnemar_p"] == pytest.approx(
        binomtest(min(only_a, only_b), only_a + only_b).pvalue
    )
    assert result["a"]["policy"] == policy_a and result["b"]["policy"] == policy_b


def test_the_comparison_is_the_same_on_either_core_and_from_run_results(runs, tmp_path):
    by_core = {
        core: rlmesh.compare(runs["random", core], runs["heuristic", core]) for core in CORES
    }
    for result in by_core.values():
        for side in ("a", "b"):
            result[side].pop("source")
    assert by_core["rust"] == by_core["python"]
    # A RunResult in hand compares as its file does.
    a = evaluate(tmp_path / "a.jsonl", "random", core="rust")
    b = evaluate(tmp_path / "b.jsonl", "heuristic", core="python")
    in_hand = rlmesh.compare(a, b)
    for key in ("tasks", "overall", "pairs", "excluded_for_errors"):
        assert in_hand[key] == by_core["rust"][key]


def test_real_runs_of_other_seeds_or_fewer_episodes_are_refused(runs, tmp_path):
    other_seed = tmp_path / "seed1.jsonl"
    evaluate(other_seed, "heuristic", core="rust", seed=1, episodes=EPISODES)
    with pytest.raises(rlmesh.RlmeshError, match=r"base seeds 0 and 1\): episode 0 has seed"):
        rlmesh.compare(runs["random", "rust"], other_seed)
    shorter = tmp_path / "short.jsonl"
    evaluate(shorter, "heuristic", core="python", episodes=EPISODES - 4)
    with pytest.raises(rlmesh.RlmeshError, match=r"4 episodes of .* are not in"):
        rlmesh.compare(runs["random", "rust"], shorter)
    result = rlmesh.compare(runs["random", "rust"], shorter, intersection=True)
    assert (result["pairs"], result["only_in_a"]) == (EPISODES - 4, 4)


# ---------------------------------------------------------------------------- the command


def test_rlmesh_compare_prints_the_table(runs, capsys):
    a, b = str(runs["random", "rust"]), str(runs["heuristic", "python"])
    assert main(["compare", a, b]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == f"b - a: b = {b} (heuristic), a = {a} (random); positive means b did better"
    assert lines[1].split()[:5] == ["return", "pairs", "a", "b", "b-a"]
    assert lines[2].split()[:2] == ["overall", str(EPISODES)]
    assert any(line.startswith("success ") and "McNemar p" in line for line in lines)
    assert "Newcombe" in text and "paired bootstrap" in text


def test_rlmesh_compare_json_is_strict_and_everything(runs, capsys):
    a, b = str(runs["random", "python"]), str(runs["heuristic", "rust"])
    argv = ["compare", a, b, "--json", "--confidence", "0.9", "--resamples", "500", "--seed", "3"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    expected = rlmesh.compare(a, b, confidence=0.9, resamples=500, seed=3)
    assert printed == json.loads(json.dumps(expected))
    assert printed["confidence"] == 0.9 and printed["methods"]["success_test"]


def test_rlmesh_compare_exits_2_with_one_line_for_runs_it_cannot_pair(runs, tmp_path, capsys):
    shorter = tmp_path / "short.jsonl"
    evaluate(shorter, "random", core="rust", episodes=EPISODES - 1)
    assert main(["compare", str(runs["heuristic", "rust"]), str(shorter)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("rlmesh compare: error: the runs do not hold the same episodes")
    assert error.count("\n") == 1
    assert main(["compare", str(runs["heuristic", "rust"]), str(shorter), "--intersection"]) == 0
    assert f"{EPISODES - 1} pairs matched" in capsys.readouterr().out
    for argv, words in [
        (["compare", str(shorter), str(tmp_path / "none.jsonl")], "cannot read it"),
        (["compare", str(shorter), str(shorter), "--confidence", "95"], "in (0, 1)"),
        (["compare", str(shorter), str(shorter), "--resamples", "0"], "positive integer"),
    ]:
        assert main(argv) == 2
        assert words in capsys.readouterr().err


def test_python_m_rlmesh_compare_runs_as_a_command(runs):
    done = subprocess.run(
        [sys.executable, "-m", "rlmesh", "compare", str(runs["random", "rust"]),
         str(runs["random", "python"]), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout, parse_constant=pytest.fail)
    # The same policy on the same seeds, on either core: the same episodes.
    assert result["overall"]["mean_return_difference"] == 0.0
    assert result["overall"]["mean_return_difference_ci"] == [0.0, 0.0]
    assert result["overall"]["return_wins"]["tie"] == EPISODES
