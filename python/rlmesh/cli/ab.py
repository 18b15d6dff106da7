"""``rlmesh ab POLICY_A POLICY_B --env ID | --suite NAME|FILE --episodes MAX --out-dir DIR``:
which policy is better? Both play the same episodes, in blocks, until an anytime-valid paired
test decides at ``--alpha`` or the cap is reached (``rlmesh.ab``).

``--suite`` takes what ``rlmesh eval --suite`` takes (a built-in suite's name, with
``--seed``, ``--max-episode-steps`` and ``--suite-options`` applied to each task, or a suite's
TOML file) and ``--tasks a,b``; each block then plays the same indices of every task, and the
test pools the pairs of all tasks (``rlmesh.ab`` says in which order). ``--episodes`` caps the
indices of each task (a task also stops at its own episodes).

Prints the decision, the pairs played, the difference A - B with its confidence sequence, the
anytime-valid p-value and the two results files (``DIR/a.jsonl``, ``DIR/b.jsonl``, which
``rlmesh compare`` reads; suite results files with ``--suite``). Exit 0 when the comparison
ran (decided or not); 1 when a run failed; 2 on bad input.

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
import sys
from typing import Any

import gymnasium as gym

from ..ab import ab
from ..errors import RlmeshError
from ..policies import load_policy, policy_identity
from ..results import dumps
from .argtypes import json_object, positive_int, reward_threshold, seed
from .exits import EXIT_FAILED, EXIT_OK, UsageError, print_error
from .inputs import check_env, is_served, ready_made_spec, served_policy

# eval's per-task options that ab has not (--env excludes --suite): eval's suite reading must
# see them unset. ab's --episodes is the comparison's cap, not each task's episodes.
_NOT_ON_AB = {"env": None, "seeds": None, "episodes": None, "max_episode_seconds": None}


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
        "of deciding between two equal policies at or below --alpha. With --suite, each block\n"
        "plays the same indices of every task and the test pools the pairs of all tasks.",
        epilog="example:\n  rlmesh ab cartpole-heuristic random --env CartPole-v1 --episodes 200 "
        "--out-dir ab/\n  rlmesh ab a.py:Policy b.py:Policy --suite suite.toml --episodes 50 "
        "--out-dir ab/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("policy_a", metavar="POLICY_A", help="a policy (as for rlmesh eval)")
    parser.add_argument("policy_b", metavar="POLICY_B", help="the other policy")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--env", help="a Gymnasium id (e.g. CartPole-v1)")
    where.add_argument(
        "--suite",
        metavar="NAME|FILE",
        help="compare on every task of a built-in suite (rlmesh benchmarks) or of a suite's "
        "TOML file, as rlmesh eval --suite takes it, instead of one --env",
    )
    parser.add_argument("--tasks", metavar="A,B", help="with --suite: compare on these tasks only")
    parser.add_argument(
        "--suite-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help="with a built-in --suite: its options, as for rlmesh eval",
    )
    parser.add_argument(
        "--env-kwargs", type=json_object, default={}, help="JSON object for gymnasium.make"
    )
    parser.add_argument(
        "--episodes",
        type=positive_int,
        required=True,
        metavar="MAX",
        help="the most pairs (with --suite: the most indices of each task)",
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
        "--seed",
        type=seed,
        help="base seed: episode k uses episode_seed(S, k) (default 0; a suite's file sets "
        "each task's)",
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
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the comparison whose files DIR holds (interrupted, or a smaller cap): "
        "the episodes they hold are read back, not played again",
    )
    parser.add_argument(
        "--policy-token",
        metavar="T",
        help="the token of a served POLICY_A or POLICY_B (an address): its bearer token, or an "
        "openpi:// server's Api-Key",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument(
        "--no-progress", action="store_true", help="no line on stderr after each block"
    )


def ab_command(args: argparse.Namespace) -> int:
    """``rlmesh ab``: the result as text or (``--json``) one object; the exit code."""
    if args.suite is None:
        for given, option in ((args.tasks, "--tasks"), (args.suite_options, "--suite-options")):
            if given is not None:
                raise UsageError(f"rlmesh ab: error: {option} needs --suite NAME|FILE")
        check_env(args.env)
        where: dict[str, Any] = {"env": _env(args), "seed": args.seed}
        action_space: Any = functools.partial(_action_space, args)
        steps = args.max_episode_steps
    else:
        where = {"tasks": _suite(args), "only": _only(args.tasks)}
        action_space = _no_action_space  # a random policy takes each task's from its run
        steps = None  # a built-in suite's tasks carry it; a file's set their own
    infos = []
    policies = []
    for spec in (args.policy_a, args.policy_b):
        if is_served(spec):  # a served model: its address names it, it has no source to hash
            try:
                policies.append(
                    served_policy(spec, args.policy_token, ready_made_spec(args.suite, spec))
                )
            except RlmeshError as exc:
                print_error(exc)
                return EXIT_FAILED
            info: dict[str, Any] = {"policy": spec, "policy_sha256": None}
        else:
            try:
                policies.append(load_policy(spec, action_space))
            except (gym.error.Error, TypeError) as exc:
                raise UsageError(f"rlmesh ab: error: --env-kwargs for {args.env}: {exc}") from None
            name, sha256 = policy_identity(spec)
            info = {"policy": name, "policy_sha256": sha256}
        if args.suite is None:  # a suite's run adds each task's env to its header itself
            info.update(env=args.env, env_kwargs=args.env_kwargs)
        infos.append(info)
    optional = {
        key: value
        for key, value in (
            ("success", args.success_reward),
            ("max_episode_steps", steps),
            ("core", args.core),
        )
        if value is not None
    }
    try:
        result = ab(
            policies[0],
            policies[1],
            episodes=args.episodes,
            alpha=args.alpha,
            block=args.block,
            measure=args.measure,
            reward_bounds=args.reward_bounds,
            out_dir=args.out_dir,
            resume=args.resume,
            progress=None if args.no_progress else functools.partial(print, file=sys.stderr),
            run_info_a=infos[0],
            run_info_b=infos[1],
            num_envs=args.num_envs,
            **where,
            **optional,
        )
    except (ValueError, FileExistsError) as exc:
        raise UsageError(f"rlmesh ab: error: {exc}") from None
    except RlmeshError as exc:
        print_error(exc)
        return EXIT_FAILED
    print(dumps(result.summary()) if args.json else result.format())
    return EXIT_OK


def _env(args: argparse.Namespace) -> Any:
    """What both runs get as the env: the id, or a picklable factory with its kwargs."""
    if not args.env_kwargs:
        return args.env
    return functools.partial(gym.make, args.env, **args.env_kwargs)


def _no_action_space() -> None:
    return None


def _action_space(args: argparse.Namespace) -> gym.Space:
    env = gym.make(args.env, **args.env_kwargs)
    try:
        return env.action_space
    finally:
        env.close()


def _suite(args: argparse.Namespace) -> list[Any]:
    """The tasks ``--suite`` names, read as ``rlmesh eval --suite`` reads them (its episodes
    left at each task's own: ``--episodes`` is ab's cap), each task's env checked."""
    from .evaluate import suite_tasks

    options = argparse.Namespace(**{**vars(args), **_NOT_ON_AB})
    try:
        tasks = suite_tasks(options)
    except UsageError as exc:  # its messages name the eval command they were written for
        raise UsageError(str(exc).replace("rlmesh eval:", "rlmesh ab:", 1)) from None
    for task in tasks:
        try:
            check_env(task.env)
        except UsageError as exc:
            raise UsageError(f"--suite {args.suite}, task {task.name!r}: {exc}") from None
    return tasks


def _only(tasks: str | None) -> list[str] | None:
    """``--tasks a,b`` as a list of names (None: every task)."""
    if tasks is None:
        return None
    return [name.strip() for name in tasks.split(",") if name.strip()]
