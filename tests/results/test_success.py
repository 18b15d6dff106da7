"""Success: the env's info, else a user rule, else the env spec's reward_threshold, else n/a.

Never ``terminated``: a CartPole policy that balances for 500 steps succeeds, a random one
fails, and an env without any of the three has no success rate at all.
"""

from __future__ import annotations

import doctest
import json
import re

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
import rlmesh.results.success
from gymnasium import spaces
from helpers import CORES
from rlmesh.cli import CartPoleHeuristic, RandomPolicy, _Progress, main
from rlmesh.errors import HookError, ResultsFileError
from rlmesh.results import read_columns, read_run
from rlmesh.stats import format_summary, summarize
from rlmesh.success import SuccessRule

SPEC_RULE = "reward >= 475.0 (env spec reward_threshold)"


@pytest.fixture(params=CORES)
def core(request: pytest.FixtureRequest) -> str:
    """The core's name, as ``rlmesh.run(core=...)`` takes it (every run test runs on both)."""
    return request.param


class Walk(gym.Env):
    """A walk from a seeded start in -2..2 to +3 (success) or -3 (failure); the final info
    reports ``key`` (every end, or only successful ones with ``report_failures=False``)."""

    observation_space = spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, key: str = "is_success", report_failures: bool = True) -> None:
        self.key, self.report_failures = key, report_failures

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(-2, 3))
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += 1 if action else -1
        done = abs(self.x) >= 3
        info = {}
        if done and (self.x > 0 or self.report_failures):
            info[self.key] = self.x > 0
        return np.array([self.x], np.float32), 1.0, done, False, info


def toward_the_nearer_end(obs):
    return int(obs[0] >= 0)


def starts_ahead(seed: int) -> bool:
    """Independently of rlmesh: the policy reaches +3 iff the seeded start is >= 0."""
    env = Walk()
    env.reset(seed=seed)
    return env.x >= 0


def test_a_perfect_cartpole_policy_succeeds_and_a_random_one_fails(core):
    perfect = rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=6, num_envs=3, core=core)
    assert [episode.reward for episode in perfect.episodes] == [500.0] * 6
    assert all(episode.success is True for episode in perfect.episodes)
    assert perfect.success_rate == 1.0
    assert perfect.summary()["success_rule"] == SPEC_RULE

    random = rlmesh.run(
        RandomPolicy(gym.make("CartPole-v1").action_space), "CartPole-v1", episodes=6, core=core
    )
    assert all(episode.terminated for episode in random.episodes)  # the pole fell: no success
    assert all(episode.success is False for episode in random.episodes)
    assert random.success_rate == 0.0 and random.summary()["success_rate"] == 0.0


@pytest.mark.parametrize("key", ["is_success", "success"])
def test_the_envs_own_report_wins_over_every_rule(core, key):
    result = rlmesh.run(
        toward_the_nearer_end,
        lambda: Walk(key),
        episodes=12,
        num_envs=2,
        core=core,
        success=lambda episode: True,  # a user rule: the env's report still decides
    )
    expected = [starts_ahead(episode.seed) for episode in result.episodes]
    assert [episode.success for episode in result.episodes] == expected
    assert all(episode.success_reported for episode in result.episodes)
    assert 0 < sum(expected) < 12  # both outcomes occur
    summary = result.summary()
    assert summary["success_rule"] == "env info"
    assert summary["success_rate"] == sum(expected) / 12
    assert summary["success_reported"] == 12


def test_an_env_that_reports_only_some_episodes_says_so(core):
    result = rlmesh.run(
        toward_the_nearer_end, lambda: Walk(report_failures=False), episodes=12, core=core
    )
    reached = sum(starts_ahead(episode.seed) for episode in result.episodes)
    summary = result.summary()
    assert summary["success_rule"] == (f"env info ({reached} of 12 episodes), else not available")
    # The rate is over the episodes with a verdict; the others have none.
    assert summary["success_rate"] == 1.0
    assert sum(episode.success is None for episode in result.episodes) == 12 - reached


def test_a_user_callable_judges_each_episode_once(core):
    calls = []

    def long_enough(episode: rlmesh.EpisodeResult) -> bool:
        calls.append(episode.index)
        return episode.steps >= 20

    policy = RandomPolicy(gym.make("CartPole-v1").action_space)
    result = rlmesh.run(
        policy, "CartPole-v1", episodes=8, num_envs=2, core=core, success=long_enough
    )
    assert [episode.success for episode in result.episodes] == [
        episode.steps >= 20 for episode in result.episodes
    ]
    assert sorted(calls) == list(range(8))
    assert result.summary()["success_rule"] == (
        "user rule (test_a_user_callable_judges_each_episode_once.<locals>.long_enough)"
    )


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (lambda episode: 1 / 0, "raised ZeroDivisionError on episode"),
        (lambda episode: 1, "returned int 1 for episode"),
    ],
)
def test_a_user_rule_that_fails_stops_the_run_with_a_hook_error(core, rule, message):
    with pytest.raises(HookError, match=message) as caught:
        rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=2, core=core, success=rule)
    assert "expected a bool" in str(caught.value) or "return a bool" in str(caught.value)
    assert caught.value.partial_result.num_episodes <= 2


def test_a_reward_threshold_number_is_a_user_rule(core):
    policy = RandomPolicy(gym.make("CartPole-v1").action_space)
    result = rlmesh.run(policy, "CartPole-v1", episodes=10, core=core, success=20)
    assert [episode.success for episode in result.episodes] == [
        episode.reward >= 20 for episode in result.episodes
    ]
    assert result.summary()["success_rule"] == "reward >= 20.0 (user rule)"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: "CartPole-v1", id="id"),
        pytest.param(lambda: gym.make("CartPole-v1"), id="instance"),
        pytest.param(lambda: lambda: gym.make("CartPole-v1"), id="factory"),
        pytest.param(
            lambda: gym.vector.SyncVectorEnv(
                [lambda: gym.make("CartPole-v1")] * 2,
                autoreset_mode=gym.vector.AutoresetMode.DISABLED,
            ),
            id="vector",
        ),
    ],
)
def test_the_env_specs_threshold_is_found_for_every_form_of_env(core, make, tmp_path):
    env = make()
    path = tmp_path / "results.jsonl"
    result = rlmesh.run(
        CartPoleHeuristic(),
        env,
        episodes=2,
        core=core,
        results_path=path,
        close_env=True,
    )
    assert result.summary()["success_rule"] == SPEC_RULE
    assert result.success_rate == 1.0
    # The file says the same, also for a factory whose spec was known only once it had run.
    _, columns = read_columns(path)
    assert summarize(columns)["success_rule"] == SPEC_RULE


def test_without_any_rule_success_is_none_everywhere(core, tmp_path, capsys):
    path = tmp_path / "pendulum.jsonl"
    assert gym.spec("Pendulum-v1").reward_threshold is None
    result = rlmesh.run(
        lambda obs: np.zeros(1, np.float32),
        "Pendulum-v1",
        episodes=2,
        core=core,
        results_path=path,
    )
    assert [episode.success for episode in result.episodes] == [None, None]
    assert result.success_rate is None
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:3]]
    assert [line["success"] for line in lines] == [None, None]
    summary = result.summary()
    assert summary["success_rate"] is None and summary["success_ci95"] == [None, None]
    assert summary["success_rule"] == "not available"
    assert re.search(r"success rate\s+n/a", format_summary(summary))

    assert main(["report", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["success_rate"] is None and printed["success_rule"] == "not available"


def test_the_progress_bar_shows_n_a_without_verdicts():
    progress = _Progress(4, enabled=False)
    result = rlmesh.run(lambda obs: np.zeros(1, np.float32), "Pendulum-v1", episodes=2)
    progress.start(result.episodes)
    assert progress.status().endswith("success n/a")
    perfect = rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=2)
    progress.episode(perfect.episodes[0])
    assert progress.status().endswith("success 100.0%")


def _cli_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_demo_shows_a_true_success_rate(capsys):
    summary = _cli_json(capsys, ["demo", "--episodes", "8", "--no-progress", "--json"])
    assert summary["mean_reward"] == 500.0
    assert summary["success_rate"] == 1.0 and summary["success_rule"] == SPEC_RULE
    assert main(["demo", "--episodes", "8", "--no-progress"]) == 0
    assert re.search(r"success rate\s+100\.0%", capsys.readouterr().out)


def test_success_reward_on_the_command_line_is_recorded_and_resumed(capsys, tmp_path):
    out = tmp_path / "random.jsonl"
    argv = ["eval", "random", "--env", "CartPole-v1", "--episodes", "10", "--out", str(out)]
    summary = _cli_json(capsys, [*argv, "--success-reward", "20", "--no-progress", "--json"])
    _, result, _ = read_run(out)
    judged = [episode.reward >= 20 for episode in result.episodes]
    assert [episode.success for episode in result.episodes] == judged
    assert summary["success_rate"] == sum(judged) / 10
    assert summary["success_rule"] == "reward >= 20.0 (user rule)"
    reported = _cli_json(capsys, ["report", str(out), "--json"])
    assert reported.pop("provenance") and reported == summary

    # A resume with another rule would judge its episodes differently: refused.
    assert main([*argv, "--resume", "--success-reward", "30", "--no-progress"]) == 2
    assert "success_rule" in capsys.readouterr().err
    with pytest.raises(ResultsFileError, match="success_rule"):
        rlmesh.run(RandomPolicy(gym.make("CartPole-v1").action_space), "CartPole-v1",
                   episodes=10, results_path=out, resume=True)  # fmt: skip


def test_success_reward_must_be_a_number(capsys):
    argv = ["eval", "random", "--env", "CartPole-v1", "--success-reward", "nan"]
    assert main(argv) == 2
    assert "--success-reward: must be a number" in capsys.readouterr().err


def test_bad_success_arguments_are_refused():
    with pytest.raises(TypeError, match="success= must be None, a reward threshold"):
        rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=1, success="yes")
    with pytest.raises(TypeError, match="success= must be"):
        rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=1, success=True)
    with pytest.raises(ValueError, match="not nan"):
        rlmesh.run(CartPoleHeuristic(), "CartPole-v1", episodes=1, success=float("nan"))


def test_a_rule_survives_the_header_round_trip():
    for rule in (
        SuccessRule("env spec", reward_threshold=475.0),
        SuccessRule("user reward", reward_threshold=-3.5),
        SuccessRule("user rule", name="mine"),
        SuccessRule("none"),
    ):
        assert SuccessRule.from_json(json.loads(json.dumps(rule.to_json()))) == rule
    assert SuccessRule.from_json(None) == SuccessRule("none")  # a file from before rules


def test_the_success_module_examples_hold():
    outcome = doctest.testmod(rlmesh.results.success, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted > 0 and outcome.failed == 0
