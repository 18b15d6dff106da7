"""``rlmesh eval``'s sandbox options (``rlmesh.cli.sandbox_args``): parsed by their argument
group, turned into a sandboxed env, suite or policy whose episodes are the local run's, and
refused where they cannot go with other options."""

from __future__ import annotations

import argparse
import functools

import gymnasium as gym
import pytest
import rlmesh
from helpers import TIMING_FIELDS, cartpole_policy, comparable
from rlmesh.cli.exits import UsageError
from rlmesh.cli.sandbox_args import (
    add_sandbox_arguments,
    check_sandbox_arguments,
    env_sandboxed,
    packages,
    policy_sandboxed,
    run_overrides,
    sandboxed_env,
    sandboxed_policy,
    sandboxed_tasks,
)
from rlmesh.sandbox.bwrap import find_bwrap
from sandbox_policies import HERE as POLICIES

RUN = {"episodes": 4, "max_episode_steps": 50}


def parse(*argv, policy="random"):
    """The options as ``rlmesh eval POLICY`` parses them (its other options that the sandbox
    reads added with their defaults)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-envs", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--restart-workers", type=int, default=0)
    parser.add_argument("--pipeline", action="store_true")
    parser.add_argument("--ray", nargs="?", const="")
    parser.add_argument("--suite")
    parser.add_argument("--core")
    add_sandbox_arguments(parser)
    args = parser.parse_args(list(argv))
    args.policy = policy
    return args


def test_packages_are_split_on_whitespace_and_may_be_repeated():
    args = parse("--env-packages", "gym-pusht>=0.1.8,<0.2 numpy<2", "--env-packages", "scipy")
    assert packages(args.env_packages) == ["gym-pusht>=0.1.8,<0.2", "numpy<2", "scipy"]
    assert env_sandboxed(args) and not policy_sandboxed(args)
    assert not env_sandboxed(parse()) and run_overrides(parse()) == {}
    assert run_overrides(args) == {"workers": None}  # its workers are the server's


@pytest.mark.parametrize(
    ("argv", "served", "says"),
    [
        (["--policy-packages", "torch"], True, "address of a model served already"),
        (["--sandbox-network"], False, "--sandbox-network needs --sandbox"),
        (["--sandbox", "--pipeline"], False, "--pipeline is for local worker processes"),
        (["--env-packages", "x", "--restart-workers", "1"], False, "--sandbox-restart K"),
    ],
)
def test_options_that_cannot_go_together_are_one_line_usage_errors(argv, served, says):
    with pytest.raises(UsageError, match=says):
        check_sandbox_arguments(parse(*argv), served_policy=served)


needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")


@needs_bwrap
def test_sandbox_with_env_kwargs_plays_the_local_runs_episodes():
    args = parse("--sandbox", "--num-envs", "2", "--workers", "2")
    check_sandbox_arguments(args, served_policy=False)
    env = sandboxed_env(args, "Pendulum-v1", {"g": 3.0})
    assert env.sandboxed and env.num_lanes == 2
    result = rlmesh.run(lambda obs: [0.5], env, **RUN)
    heavy = functools.partial(gym.make, "Pendulum-v1", g=3.0)
    local = rlmesh.run(lambda obs: [0.5], heavy, num_envs=2, **RUN)
    assert comparable(result) == comparable(local)


@needs_bwrap
def test_a_sandboxed_built_in_suite_brings_its_own_packages():
    pytest.importorskip(
        "gym_pusht", reason="the pusht extra (gym-pusht) is not installed"
    )  # the local run compared with
    from rlmesh import benchmarks

    tasks = benchmarks.suite("pusht", episodes=2, max_episode_steps=15)
    args = parse("--suite", "pusht", "--sandbox")
    sandboxed = sandboxed_tasks(args, tasks)
    assert [task.to_dict() for task in sandboxed] == [task.to_dict() for task in tasks]

    def policy(obs):
        return obs["agent_pos"] + 30.0

    result = rlmesh.run_suite(policy, sandboxed)
    local = rlmesh.run_suite(policy, tasks)
    for task in tasks:
        assert comparable(result[task.name], reward_digits=9) == comparable(
            local[task.name], reward_digits=9
        )


@needs_bwrap
def test_policy_packages_serve_the_policy_from_its_own_environment():
    args = parse("--policy-packages", "numpy<2", "--sandbox", policy=f"{POLICIES}:heuristic")
    check_sandbox_arguments(args, served_policy=False)
    model = sandboxed_policy(args)
    assert model.sandboxed
    result = rlmesh.run(model, "CartPole-v1", num_envs=2, **RUN)
    local = rlmesh.run(cartpole_policy, "CartPole-v1", num_envs=2, **RUN)
    assert comparable(result) == comparable(local)


def _wired():
    """Whether ``rlmesh eval`` has the sandbox options (cli/main.py adds their group)."""
    from rlmesh.cli.main import build_parser

    try:
        build_parser().parse_args(["eval", "random", "--env", "CartPole-v1", "--sandbox"])
    except UsageError:
        return False
    return True


needs_wiring = pytest.mark.skipif(
    not _wired(), reason="rlmesh eval does not have the sandbox options (cli/main.py)"
)

EVAL = ["--env", "CartPole-v1", "--episodes", "4", "--max-episode-steps", "80", "--no-progress"]


def episodes_of(path):
    _, episodes = rlmesh.read_results(path)
    return [
        {k: v for k, v in episode.to_dict().items() if k not in {*TIMING_FIELDS, "env_index"}}
        for episode in episodes
    ]


@needs_bwrap
@needs_wiring
def test_rlmesh_eval_runs_the_env_sandboxed_with_its_workers_there(tmp_path):
    from rlmesh.cli import main

    sandboxed, local = tmp_path / "sandboxed.jsonl", tmp_path / "local.jsonl"
    argv = ["eval", "cartpole-heuristic", *EVAL, "--num-envs", "2"]
    assert main([*argv, "--out", str(local)]) == 0
    options = ["--env-packages", "numpy<2", "--sandbox", "--workers", "2"]
    assert main([*argv, *options, "--out", str(sandboxed)]) == 0
    assert episodes_of(sandboxed) == episodes_of(local)


@needs_bwrap
@needs_wiring
def test_rlmesh_eval_serves_the_policy_sandboxed_and_resumes(tmp_path):
    from rlmesh.cli import main

    out = tmp_path / "results.jsonl"
    argv = ["eval", f"{POLICIES}:heuristic", *EVAL, "--policy-packages", "numpy<2", "--sandbox"]
    assert main([*argv, "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-3]) + "\n")  # a run cut short: its last lines lost
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    local = tmp_path / "local.jsonl"
    assert main(["eval", f"{POLICIES}:heuristic", *EVAL, "--out", str(local)]) == 0
    assert episodes_of(out) == episodes_of(local)
