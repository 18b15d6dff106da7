"""``rlmesh.ab`` and ``rlmesh ab``: a sequential paired comparison of two policies.

CartPole's built-in heuristic balances the pole for all 500 steps; a random policy drops it
within a few dozen. With success at a return of 100, the comparison must decide for the
heuristic, early, whichever side it is on. Two policies of equal quality (a random policy
and another seeded differently, or one policy twice) must not be told apart before the cap.
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
from rlmesh.results import read_results
from rlmesh.stats.sequential import paired_test

ENV = "CartPole-v1"
CAP = 60


def core_name(core):
    return "rust" if core.__name__ == "rlmesh._core" else "python"


def random_policy():
    return RandomPolicy(gym.make(ENV).action_space)


def other_random_policy(obs):
    """A coin flip seeded by the observation, differently from ``RandomPolicy``: as good."""
    return zlib.crc32(np.ascontiguousarray(obs).tobytes(), 12345) & 1


def episodes_of(path):
    return {episode.index: episode for episode in read_results(path)[1]}


@pytest.mark.parametrize("heuristic_is", ["A", "B"])
def test_ab_decides_for_the_better_policy(core, tmp_path, heuristic_is):
    models = (CartPoleHeuristic(), random_policy())
    if heuristic_is == "B":
        models = models[::-1]
    result = rlmesh.ab(
        *models,
        ENV,
        episodes=CAP,
        success=100,
        out_dir=tmp_path,
        num_envs=2,
        block=5,
        core=core_name(core),
    )
    assert result.decision == heuristic_is
    assert result.measure == "success"
    assert result.decided_at is not None and result.decided_at <= result.episodes < CAP
    assert result.p_value <= result.alpha
    sign = 1 if heuristic_is == "A" else -1
    assert sign * result.difference > 0
    assert result.lower <= result.difference <= result.upper
    assert (result.lower > 0) if sign > 0 else (result.upper < 0)
    # The two files hold the same indices, played with the same seeds: the pairs.
    a, b = (episodes_of(path) for path in result.paths)
    assert sorted(a) == sorted(b) == list(range(result.episodes))
    assert [a[k].seed for k in a] == [b[k].seed for k in a]
    assert [e.index for e in result.a.episodes] == list(range(result.episodes))
    # The decision is the paired test's on the files' episodes, read back.
    test = paired_test(
        [float(a[k].success) for k in sorted(a)], [float(b[k].success) for k in sorted(b)]
    )
    assert test.decision(result.alpha) == (result.decided_at, sign)
    assert result.p_value == pytest.approx(test.p_value[-1])
    assert main(["compare", str(result.paths[0]), str(result.paths[1])]) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_equal_policies_are_not_told_apart_before_the_cap(seed):
    result = rlmesh.ab(
        random_policy(),
        other_random_policy,
        ENV,
        episodes=CAP,
        seed=seed,
        measure="reward",  # success (a return of 475) would be a run of zeros for both
        reward_bounds=(0, 500),
        block=10,
    )
    assert result.decision is None and result.decided_at is None
    assert result.episodes == CAP and result.p_value > result.alpha
    assert result.lower <= 0 <= result.upper
    returns_a = [e.reward for e in result.a.episodes]
    returns_b = [e.reward for e in result.b.episodes]
    assert returns_a != returns_b  # different policies: the test had differences to weigh
    assert result.paths is None  # without out_dir, nothing is left behind


def test_one_policy_twice_never_decides(core, tmp_path):
    result = rlmesh.ab(
        random_policy(),
        random_policy(),
        ENV,
        episodes=30,
        success=20,
        out_dir=tmp_path,
        block=7,
        core=core_name(core),
    )
    assert (result.decision, result.episodes, result.difference) == (None, 30, 0.0)
    assert result.e_value <= 1
    a, b = (episodes_of(path) for path in result.paths)
    assert sorted(a) == list(range(30))
    assert all(a[k].trajectory_digest == b[k].trajectory_digest for k in a)


def test_the_cli_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "ab"
    argv = ["ab", "random", "cartpole-heuristic", "--env", ENV, "--episodes", "40"]
    assert main([*argv, "--success-reward", "100", "--out-dir", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decision"] == "B" and summary["measure"] == "success"
    assert summary["p_value"] <= 0.05 and summary["confidence_sequence"][1] < 0
    assert summary["a"]["file"] == str(out / "a.jsonl")
    header, episodes = read_results(out / "b.jsonl")
    assert header["policy"] == "cartpole-heuristic"
    assert [e.index for e in episodes] == list(range(summary["episodes"]))
    assert main(["compare", str(out / "a.jsonl"), str(out / "b.jsonl")]) == 0
    capsys.readouterr()
    text_dir = tmp_path / "text"
    assert main([*argv, "--reward-bounds", "0", "500", "--out-dir", str(text_dir)]) == 0
    text = capsys.readouterr().out
    # CartPole-v1's reward_threshold (475) judges success: the heuristic always reaches it.
    assert text.startswith("decision: B is better (success, alpha 0.05)")
    assert "confidence sequence" in text and "p-value (anytime-valid)" in text
    assert f"b: {text_dir / 'b.jsonl'}" in text
    reward_dir = tmp_path / "reward"
    assert (
        main(
            [
                *argv,
                "--reward-bounds",
                "0",
                "500",
                "--measure",
                "reward",
                "--out-dir",
                str(reward_dir),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("decision: B is better (reward, alpha 0.05)")


def torque(value):
    return lambda obs: np.full(1, value, np.float32)


def test_a_comparison_without_success_or_bounds_names_the_fix(tmp_path, capsys):
    # Pendulum-v1 has no reward_threshold and reports no success.
    with pytest.raises(ValueError, match=r"reward_bounds=\(lo, hi\)"):
        rlmesh.ab(torque(0), torque(1), "Pendulum-v1", episodes=4, max_episode_steps=3)
    argv = ["ab", "random", "random", "--env", "Pendulum-v1", "--episodes", "4"]
    assert main([*argv, "--max-episode-steps", "3", "--out-dir", str(tmp_path / "p")]) == 2
    assert "--reward-bounds LO HI" in capsys.readouterr().err
    result = rlmesh.ab(
        torque(0),
        torque(2),
        "Pendulum-v1",
        episodes=4,
        max_episode_steps=3,
        reward_bounds=(-17 * 3, 0),  # a step's reward is in [-16.3, 0]
    )
    assert result.measure == "reward" and result.episodes == 4


def test_bad_arguments_are_refused(tmp_path, capsys):
    heuristic = CartPoleHeuristic()
    with pytest.raises(ValueError, match="indices"):
        rlmesh.ab(heuristic, heuristic, ENV, episodes=4, indices=[0, 1])
    with pytest.raises(ValueError, match="episodes must be a positive integer"):
        rlmesh.ab(heuristic, heuristic, ENV, episodes=0)
    with pytest.raises(ValueError, match="reward_bounds"):
        rlmesh.ab(heuristic, heuristic, ENV, episodes=4, measure="reward")
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(FileExistsError, match=r"a\.jsonl already exists"):
        rlmesh.ab(heuristic, heuristic, ENV, episodes=4, out_dir=tmp_path)
    argv = ["ab", "random", "random", "--env", ENV, "--episodes", "4", "--out-dir", "x"]
    assert main([*argv, "--alpha", "1.5"]) == 2
    assert "--alpha: must be a number in (0, 1)" in capsys.readouterr().err
