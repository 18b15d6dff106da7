"""``rlmesh demo``: ``rlmesh eval cartpole-heuristic --env CartPole-v1 --num-envs 8
--episodes 100``, the built-in CartPole heuristic with nothing to write and nothing to set.

Example:
    >>> args = demo_args(argparse.Namespace(num_envs=None, episodes=100))
    >>> args.policy, args.env, args.num_envs, args.episodes
    ('cartpole-heuristic', 'CartPole-v1', 8, 100)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .evaluate import eval_command


def demo_args(args: argparse.Namespace) -> argparse.Namespace:
    """The demo's options (``--episodes``, ``--num-envs``, ``--json``...) completed into those
    of ``rlmesh eval cartpole-heuristic --env CartPole-v1``, 8 lanes by default."""
    options = {**vars(args), "num_envs": args.num_envs or 8}
    return argparse.Namespace(
        **options,
        policy="cartpole-heuristic",
        env="CartPole-v1",
        suite=None,
        tasks=None,
        suite_options=None,
        env_kwargs={},
        seed=None,
        seeds=None,
        horizon=1,
        ensemble=None,
        max_episode_steps=None,
        max_episode_seconds=None,
        timeout_reset=None,
        timeout_step=None,
        timeout_predict=None,
        success_reward=None,
        out=None,
        resume=False,
        allow_changed_policy=False,
        ray=None,
        ray_mode=None,
        on_error="raise",
        max_retries=None,
        record_video=0,
        video_dir=None,
        video_key=None,
    )


def demo_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``rlmesh demo``: the exit code of the eval it stands for."""
    return eval_command(demo_args(args), argv)
