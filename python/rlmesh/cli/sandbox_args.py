"""``rlmesh eval``'s "sandboxes" options, and what they turn into: the env in a
``rlmesh.sandbox.SandboxEnv``, the policy in a ``rlmesh.sandbox.SandboxModel``.

- ``--env-packages "REQ ..."`` / ``--env-python PATH``: the env's server runs in a virtual
  environment holding those packages (built once, cached), or in that interpreter;
- ``--policy-packages`` / ``--policy-python``: the same for the policy;
- ``--sandbox``: both sides that run elsewhere run under bubblewrap (a read-only root, no
  network, one writable directory), and the env runs elsewhere even without packages: a
  built-in suite's env gets its benchmark's packages (``rlmesh eval P --suite pusht
  --sandbox`` needs nothing installed beside rlmesh);
- ``--sandbox-network``: let sandboxed sides reach the network;
- ``--sandbox-restart K``: start a sandboxed side that died again, up to K times.

A sandboxed env's lanes step in its server (``--workers`` worker processes there), so the run
itself gets ``run_overrides(args)``. With ``--record-video`` (frames from ``render()``) or an
http ``--view``, its envs are built with ``render_mode="rgb_array"`` there, and their frames
cross its socket. With ``--ray``, ``--workers`` counts the Ray workers instead, and each
starts one sandbox like it (its server stepping its ``--num-envs`` lanes itself), held
across the windows it runs (``rlmesh.cluster``); a sandboxed policy travels to them as its
arguments, and each worker process starts a server of its own.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_sandbox_arguments(parser)
    >>> args = parser.parse_args(["--env-packages", "gym-pusht==0.1.8 numpy<2", "--sandbox"])
    >>> packages(args.env_packages), env_sandboxed(args), policy_sandboxed(args)
    (['gym-pusht==0.1.8', 'numpy<2'], True, False)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..suites import Task
from ..view.spec import parse_view
from .argtypes import non_negative_int
from .exits import UsageError


def add_sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the "sandboxes" group to ``rlmesh eval``'s parser."""
    group = parser.add_argument_group(
        "sandboxes",
        "run the env or the policy in an environment of its own (a cached virtual "
        "environment, or an interpreter you name), under bubblewrap with --sandbox",
    )
    group.add_argument(
        "--env-packages",
        action="append",
        metavar="REQS",
        help="pip requirements the env needs, e.g. 'gym-pusht==0.1.8' (space-separated; may "
        "be repeated): its server runs in a virtual environment holding them and rlmesh's "
        "runtime requirements, built on first use and cached",
    )
    group.add_argument(
        "--env-python",
        metavar="PATH",
        help="run the env's server with this interpreter (as it is, or with --env-packages "
        "the base of its virtual environment)",
    )
    group.add_argument(
        "--policy-packages",
        action="append",
        metavar="REQS",
        help="pip requirements the policy needs, as --env-packages: the policy is served from "
        "a virtual environment holding them",
    )
    group.add_argument(
        "--policy-python",
        metavar="PATH",
        help="serve the policy with this interpreter (as it is, or with --policy-packages the "
        "base of its virtual environment)",
    )
    group.add_argument(
        "--sandbox",
        action="store_true",
        help="run the env (and a policy given --policy-packages or --policy-python) under "
        "bubblewrap: read-only root, private /tmp, no network, one writable directory; a "
        "built-in --suite's env gets its benchmark's packages (needs Debian's bubblewrap)",
    )
    group.add_argument(
        "--sandbox-network",
        action="store_true",
        help="with --sandbox: let the sandboxed sides reach the network",
    )
    group.add_argument(
        "--sandbox-restart",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="start a sandboxed env or policy server that died again, up to K times, replaying "
        "the env's episodes in flight (default 0: the run fails, with the server's output)",
    )


def packages(values: Sequence[str] | None) -> list[str]:
    """The requirements of ``--env-packages`` / ``--policy-packages`` values (each split on
    whitespace; commas stay, as in ``'pkg>=1,<2'``)."""
    return [requirement for value in values or () for requirement in value.split()]


def env_sandboxed(args: argparse.Namespace) -> bool:
    """Whether the options put the env in a ``SandboxEnv`` (never for a command without
    them, such as ``rlmesh demo``)."""
    return any(getattr(args, name, None) for name in ("env_packages", "env_python", "sandbox"))


def policy_sandboxed(args: argparse.Namespace) -> bool:
    """Whether the options put the policy in a ``SandboxModel``."""
    return any(getattr(args, name, None) for name in ("policy_packages", "policy_python"))


def check_sandbox_arguments(args: argparse.Namespace, *, served_policy: bool) -> None:
    """Refuse options that cannot go together, as one-line usage errors: a served POLICY (an
    address) with policy packages, ``--sandbox-network`` without
    ``--sandbox``, and the options of local worker processes with a sandboxed env (whose
    ``--workers`` are its server's)."""
    if policy_sandboxed(args) and served_policy:
        raise UsageError(
            f"rlmesh eval: error: --policy-packages and --policy-python serve the policy from "
            f"code, but POLICY {args.policy!r} is the address of a model served already"
        )
    if getattr(args, "sandbox_network", False) and not getattr(args, "sandbox", False):
        raise UsageError("rlmesh eval: error: --sandbox-network needs --sandbox")
    if env_sandboxed(args):
        for flag, given, instead in (
            ("--pipeline", getattr(args, "pipeline", False), "drop it"),
            ("--restart-workers", getattr(args, "restart_workers", 0), "--sandbox-restart K"),
        ):
            if given:
                raise UsageError(
                    f"rlmesh eval: error: {flag} is for local worker processes, but a "
                    f"sandboxed env's --workers step its lanes in its server: {instead}"
                )


def run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments that a sandboxed env changes: its worker processes are the
    server's, so the run itself has none (with ``--ray``, ``--workers`` are Ray workers,
    which the run keeps)."""
    if not env_sandboxed(args) or _on_ray(args):
        return {}
    return {"workers": None}


def _on_ray(args: argparse.Namespace) -> bool:
    return getattr(args, "ray", None) is not None


def _env_options(args: argparse.Namespace, extra_packages: Sequence[str] = ()) -> dict[str, Any]:
    """``SandboxEnv``'s options from the arguments (its env's own arguments apart)."""
    options = {
        "packages": [*extra_packages, *packages(args.env_packages)],
        "python": args.env_python,
        "num_envs": args.num_envs or 1,
        # With --ray, --workers counts Ray workers, each with a sandbox of its own.
        "workers": 1 if _on_ray(args) else args.workers or 1,
        "network": bool(args.sandbox_network),
        "sandbox": bool(args.sandbox),
        "restart": args.sandbox_restart,
        "core": args.core,
    }
    if _wants_frames(args):
        options["render_mode"] = "rgb_array"
    return options


def _wants_frames(args: argparse.Namespace) -> bool:
    """Whether the run takes frames from ``render()``: videos without ``--video-key``, or a
    live page (``--view http``)."""
    if getattr(args, "video_key", None) is not None:
        return False
    if getattr(args, "record_video", 0):
        return True
    view = getattr(args, "view", None)
    return bool(view) and bool(getattr(parse_view(view), "http", False))


def _with_env_kwargs(options: dict[str, Any], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``SandboxEnv``'s keywords: ``options`` and the env's arguments, which win (a
    ``render_mode`` of ``--env-kwargs`` stays)."""
    return {**options, **env_kwargs}


def sandboxed_env(args: argparse.Namespace, env: str, env_kwargs: dict[str, Any]) -> Any:
    """The ``SandboxEnv`` of ``--env ID`` (its ``--env-kwargs`` given to ``gymnasium.make``
    in the sandbox). Starting it builds its environment when new, and starts its server."""
    from ..sandbox import SandboxEnv

    return SandboxEnv(env, **_with_env_kwargs(_env_options(args), env_kwargs))


def sandboxed_tasks(args: argparse.Namespace, tasks: Sequence[Task]) -> list[Task]:
    """The suite's tasks, each making its env as a ``SandboxEnv``; a built-in ``--suite``'s
    env gets its benchmark's packages (the requirements of its rlmesh extra)."""
    from .. import benchmarks
    from ..sandbox import extra_requirements

    facts = benchmarks.SUITES.get(args.suite)
    builtin = facts is not None and not os.path.exists(args.suite)
    extra = extra_requirements(facts.extra) if builtin and facts is not None else []
    options = _env_options(args, extra)
    return [SandboxedTask.of(task, options) for task in tasks]


def sandboxed_policy(args: argparse.Namespace) -> Any:
    """The ``SandboxModel`` serving ``POLICY`` from its packages or interpreter."""
    from ..sandbox import SandboxModel

    return SandboxModel(
        args.policy,
        packages=packages(args.policy_packages),
        python=args.policy_python,
        network=bool(args.sandbox_network),
        sandbox=bool(args.sandbox),
        restart=args.sandbox_restart,
        core=args.core,
    )


class SandboxedTask(Task):
    """A suite's task whose env is a ``SandboxEnv`` (the same fields, so the results file
    records the task as it is)."""

    _sandbox: dict[str, Any]

    @classmethod
    def of(cls, task: Task, options: dict[str, Any]) -> SandboxedTask:
        """``task``, making its env in a sandbox with ``options`` (``SandboxEnv``'s)."""
        made = cls(**{field.name: getattr(task, field.name) for field in fields(Task)})
        object.__setattr__(made, "_sandbox", dict(options))
        return made

    def make_env(self) -> Any:
        """A ``SandboxEnv`` of the task's env id, built with its ``env_kwargs``."""
        from ..sandbox import SandboxEnv

        return SandboxEnv(self.env, **_with_env_kwargs(self._sandbox, self.env_kwargs))


__all__ = [
    "SandboxedTask",
    "add_sandbox_arguments",
    "check_sandbox_arguments",
    "env_sandboxed",
    "packages",
    "policy_sandboxed",
    "run_overrides",
    "sandboxed_env",
    "sandboxed_policy",
    "sandboxed_tasks",
]
