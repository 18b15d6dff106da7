"""``rlmesh ab POLICY_A POLICY_B --env ID --episodes MAX --out-dir DIR``: which policy is
better? Both play the same episodes, in blocks, until an anytime-valid paired test decides at
``--alpha`` or the cap is reached (``rlmesh.ab``).

Prints the decision, the pairs played, the difference A - B with its confidence sequence, the
anytime-valid p-value and the two results files (``DIR/a.jsonl``, ``DIR/b.jsonl``, which
``rlmesh compare`` reads). Exit 0 when the comparison ran (decided or not); 1 when a run
failed; 2 on bad input.

Example:
    >>> from rlmesh.cli import main
    >>> main(["ab", "random", "random", "--env", "NoSuchEnv-v0", "--episodes", "4",
    ...       "--out-dir", "unused"])  # a one-line error
    2
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

import gymnasium as gym

from ..ab import ab
from ..errors import RlmeshError
from ..policies import load_policy, policy_identity
from ..results import dumps
from .argtypes import json_object, positive_int, reward_threshold, seed
from .exits import EXIT_FAILED, EXIT_OK, UsageError, print_error
from .inputs import check_env


def _alpha(text: str) -> float:
    """A test's level: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1) such as 0.05, got {text!r}")
    return value


def add_ab_parser(commands: Any) -> None:
    """The ``ab`` command's parser, under ``commands`` (the subparsers of ``rlmesh``)."""
    parser = commands.add_parser(
        "ab",
        help="which of two policies is better? (a sequential paired test)",
        description="Play POLICY_A and POLICY_B on the same seeded episodes, in blocks, until\n"
        "an anytime-valid paired test decides at --alpha which is better, or --episodes (the\n"
        "cap) is reached. Compares success when both runs judge it (--success-reward R), else\n"
        "the return within --reward-bounds LO HI. Looking after every block keeps the chance\n"
        "of deciding between two equal policies at or below --alpha.",
        epilog="example:\n  rlmesh ab cartpole-heuristic random --env CartPole-v1 --episodes 200 "
        "--out-dir ab/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("policy_a", metavar="POLICY_A", help="a policy (as for rlmesh eval)")
    parser.add_argument("policy_b", metavar="POLICY_B", help="the other policy")
    parser.add_argument("--env", required=True, help="a Gymnasium id (e.g. CartPole-v1)")
    parser.add_argument(
        "--env-kwargs", type=json_object, default={}, help="JSON object for gymnasium.make"
    )
    parser.add_argument(
        "--episodes", type=positive_int, required=True, metavar="MAX", help="the most pairs"
    )
    parser.add_argument(
        "--alpha", type=_alpha, default=0.05, help="the test's level (default 0.05)"
    )
    parser.add_argument(
        "--out-dir", required=True, metavar="DIR", help="where a.jsonl and b.jsonl go (new)"
    )
    parser.add_argument(
        "--block", type=positive_int, default=10, metavar="K", help="pairs between looks (10)"
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="base seed: episode k uses episode_seed(S, k)"
    )
    parser.add_argument(
        "--success-reward",
        type=reward_threshold,
        metavar="R",
        help="an episode whose env reports no is_success/success succeeds iff its reward >= R "
        "(default: the env spec's reward_threshold)",
    )
    parser.add_argument(
        "--reward-bounds",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        help="what an episode's return can be (e.g. 0 500): compares returns when success is "
        "not judged",
    )
    parser.add_argument(
        "--measure",
        choices=("success", "reward"),
        help="what is compared (default: success when both runs judge it, else the return)",
    )
    parser.add_argument(
        "--max-episode-steps", type=positive_int, help="truncate episodes at this many steps"
    )
    parser.add_argument("--num-envs", type=positive_int, default=1, help="lanes (default 1)")
    parser.add_argument("--core", choices=("rust", "python"), help="the core (default: active)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def ab_command(args: argparse.Namespace) -> int:
    """``rlmesh ab``: the result as text or (``--json``) one object; the exit code."""
    check_env(args.env)

    def action_space() -> gym.Space:
        env = gym.make(args.env, **args.env_kwargs)
        try:
            return env.action_space
        finally:
            env.close()

    infos = []
    policies = []
    for spec in (args.policy_a, args.policy_b):
        try:
            policies.append(load_policy(spec, action_space))
        except (gym.error.Error, TypeError) as exc:
            raise UsageError(f"rlmesh ab: error: --env-kwargs for {args.env}: {exc}") from None
        name, sha256 = policy_identity(spec)
        infos.append(
            {
                "env": args.env,
                "policy": name,
                "policy_sha256": sha256,
                "env_kwargs": args.env_kwargs,
            }
        )
    env = (
        args.env
        if not args.env_kwargs
        else functools.partial(gym.make, args.env, **args.env_kwargs)
    )
    optional = {
        key: value
        for key, value in (
            ("success", args.success_reward),
            ("max_episode_steps", args.max_episode_steps),
            ("core", args.core),
        )
        if value is not None
    }
    try:
        result = ab(
            policies[0],
            policies[1],
            env,
            episodes=args.episodes,
            alpha=args.alpha,
            block=args.block,
            measure=args.measure,
            reward_bounds=args.reward_bounds,
            out_dir=args.out_dir,
            seed=args.seed,
            run_info_a=infos[0],
            run_info_b=infos[1],
            num_envs=args.num_envs,
            **optional,
        )
    except (ValueError, FileExistsError) as exc:
        raise UsageError(f"rlmesh ab: error: {exc}") from None
    except RlmeshError as exc:
        print_error(exc)
        return EXIT_FAILED
    print(dumps(result.summary()) if args.json else result.format())
    return EXIT_OK
