"""``rlmesh describe --env ID_OR_FACTORY | --suite NAME [--tags FILE] --model POLICY``: the
plan that pairs the policy's spec with the env (its tags, from FILE or the env's metadata) and
the plan's advisories, without running an episode. With a built-in suite, the env is its first
task's, and a served POLICY (an address) gets the spec the suite ships for its protocol.

Example:
    >>> from rlmesh.cli import main
    >>> main(["describe", "--env", "CartPole-v1", "--model", "cartpole-heuristic"])
    input: obs float32[4] -> float32[4]
    action: cast to int64[] in 0..1
    0
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym

from ..adapters import compile_spec, env_tags_of
from ..errors import SpecError
from ..policies import load_policy
from .exits import EXIT_FAILED, EXIT_OK, UsageError, print_error
from .inputs import is_served, load_env, read_tags, ready_made_spec, served_policy


def describe_command(args: argparse.Namespace) -> int:
    """``rlmesh describe``: the plan and its advisories; nothing is stepped."""
    if args.suite is not None:
        made, kwargs = _suite_env(args.suite, args.suite_options)
    else:
        if args.suite_options is not None:
            raise UsageError("rlmesh describe: error: --suite-options needs --suite NAME")
        made, kwargs = load_env(args.env), args.env_kwargs
    env = gym.make(made, **kwargs) if isinstance(made, str) else made()
    try:
        observation_space, action_space = env.observation_space, env.action_space
        metadata = getattr(env.unwrapped, "metadata", None) or getattr(env, "metadata", None)
    finally:
        env.close()
    try:
        tags = env_tags_of(metadata) if args.tags is None else read_tags(args.tags)
        if is_served(args.model):  # nothing is dialled: only its spec is read
            policy = served_policy(args.model, None, ready_made_spec(args.suite, args.model))
        else:
            policy = load_policy(args.model, lambda: action_space)
        plan = compile_spec(getattr(policy, "spec", None), observation_space, action_space, tags)
    except SpecError as exc:
        print_error(exc)
        return EXIT_FAILED
    print(plan.describe())
    for advisory in plan.advisories():
        print(f"advisory: {advisory}")
    return EXIT_OK


def _suite_env(name: str, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs of built-in suite ``name``'s first task (a suite's tasks share
    their spaces and tags)."""
    from .. import benchmarks

    try:
        task = benchmarks.suite(name, **(options or {}))[0]
    except (TypeError, ValueError) as exc:
        raise UsageError(f"rlmesh describe: error: --suite {name}: {exc}") from None
    return task.env, task.env_kwargs
