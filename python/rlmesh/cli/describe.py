"""``rlmesh describe --env ID_OR_FACTORY [--tags FILE] --model POLICY``: the plan that pairs
the policy's spec with the env (its tags, from FILE or the env's metadata) and the plan's
advisories, without running an episode.

Example:
    >>> from rlmesh.cli import main
    >>> main(["describe", "--env", "CartPole-v1", "--model", "cartpole-heuristic"])
    input: obs float32[4] -> float32[4]
    action: cast to int64[] in 0..1
    0
"""

from __future__ import annotations

import argparse

import gymnasium as gym

from ..adapters import compile_spec, env_tags_of
from ..errors import SpecError
from ..policies import load_policy
from .exits import EXIT_FAILED, EXIT_OK, print_error
from .inputs import load_env, read_tags


def describe_command(args: argparse.Namespace) -> int:
    """``rlmesh describe``: the plan and its advisories; nothing is stepped."""
    made = load_env(args.env)
    env = gym.make(made, **args.env_kwargs) if isinstance(made, str) else made()
    try:
        observation_space, action_space = env.observation_space, env.action_space
        metadata = getattr(env.unwrapped, "metadata", None) or getattr(env, "metadata", None)
    finally:
        env.close()
    try:
        tags = env_tags_of(metadata) if args.tags is None else read_tags(args.tags)
        policy = load_policy(args.model, lambda: action_space)
        plan = compile_spec(getattr(policy, "spec", None), observation_space, action_space, tags)
    except SpecError as exc:
        print_error(exc)
        return EXIT_FAILED
    print(plan.describe())
    for advisory in plan.advisories():
        print(f"advisory: {advisory}")
    return EXIT_OK
