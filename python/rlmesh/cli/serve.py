"""``rlmesh serve env ID_OR_FACTORY`` and ``rlmesh serve model POLICY``: serve an env or a
policy over rlmesh-wire-v1 (gRPC, the remote extra) until SIGINT / SIGTERM or an accepted
Shutdown call. ``rlmesh eval tcp://host:port --env ...`` evaluates a served model; ``--env``
of a run may name a served env.

Example:
    >>> from rlmesh.cli import main
    >>> main(["serve", "env", "CartPole-v1", "--address", "not an address"])  # one-line error
    2
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from ..errors import RlmeshError, SpecError
from ..policies import load_policy
from .exits import EXIT_FAILED, EXIT_OK, UsageError, print_error
from .inputs import load_env, read_tags


def serve_command(args: argparse.Namespace) -> int:
    """``rlmesh serve WHAT``: serve an env or a model; the exit code once stopped."""
    if args.served == "model":
        return _serve_model(args)
    if args.served != "env":
        raise UsageError(
            "rlmesh serve: error: say what to serve: rlmesh serve env ID_OR_FACTORY, or "
            "rlmesh serve model POLICY"
        )
    return _serve_env(args)


def _serve_until_stopped(server: Any, line: str) -> int:
    """Print ``line`` (the bound address in it), then serve until SIGINT / SIGTERM or an
    accepted Shutdown call, and close the server."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        print(line, flush=True)
        # Short waits, so the signal handlers run promptly.
        while not stop.is_set() and not server.wait(0.2):
            pass
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("rlmesh: server stopped", file=sys.stderr)
    return EXIT_OK


def _serve_env(args: argparse.Namespace) -> int:
    """Serve the env ``args.env`` names, in this process or ``--workers`` processes."""
    from ..lanes import make_lanes
    from ..remote import require_grpc
    from ..remote.address import parse_address

    try:
        parse_address(args.address)
        require_grpc("serve_env")
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--address {args.address!r}: {exc}") from None
    from ..remote.env_server import serve_env

    try:
        tags = None if args.tags is None else read_tags(args.tags)
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    env = load_env(args.env)
    try:
        lanes = make_lanes(env, num_envs=args.num_envs, workers=args.workers)
    except (RlmeshError, TypeError, ValueError) as exc:
        raise UsageError(f"env {args.env!r}: {exc}") from None
    try:
        server = serve_env(
            lanes,
            args.address,
            token=args.token,
            max_message_mb=args.max_message_mb,
            allow_shutdown=args.allow_shutdown,
            env_tags=tags,
        )
    except RlmeshError as exc:
        lanes.close()
        print(f"rlmesh: {exc}", file=sys.stderr)
        return EXIT_FAILED
    plural = "" if lanes.num_lanes == 1 else "s"
    where = f" in {args.workers} worker processes" if args.workers > 1 else ""
    return _serve_until_stopped(
        server,
        f"rlmesh: serving {lanes.name} ({lanes.num_lanes} lane{plural}{where}) at {server.address}",
    )


def _serve_model(args: argparse.Namespace) -> int:
    """Serve ``args.policy`` until SIGINT / SIGTERM (or an accepted Shutdown call), over
    rlmesh-wire-v1, or (``--protocol openpi`` / ``vla-eval``) that WebSocket protocol."""
    protocol = getattr(args, "protocol", "rlmesh")
    if protocol != "rlmesh" and args.allow_shutdown:
        raise UsageError(
            f"rlmesh serve model: --allow-shutdown: {protocol}'s protocol has no Shutdown"
        )
    serve, token_name = _model_server(protocol)

    def no_action_space() -> gym.Space:
        raise UsageError(
            "rlmesh serve model: the random policy needs an env's action space; serve a Model "
            "subclass, a Model instance or a function fn(obs) -> action"
        )

    policy = load_policy(args.policy, no_action_space)
    options: dict[str, Any] = {
        "max_batch": args.max_batch,
        "max_wait_ms": args.max_wait_ms,
        "max_message_mb": args.max_message_mb,
        token_name: args.token,
    }
    if protocol == "rlmesh":
        options["allow_shutdown"] = args.allow_shutdown
    try:
        server = serve(policy, args.address, **options)
    except ValueError as exc:  # a malformed address or argument
        raise UsageError(f"rlmesh serve model: {exc}") from None
    except RlmeshError as exc:  # the address cannot be bound, or the model failed to load
        print_error(exc)
        return EXIT_FAILED
    over = "" if protocol == "rlmesh" else f" over {protocol}'s protocol"
    return _serve_until_stopped(
        server, f"rlmesh: serving model {args.policy}{over} at {server.address}"
    )


def _model_server(protocol: str) -> tuple[Callable[..., Any], str]:
    """The function serving a model over ``protocol``, and the name of its token argument;
    a ``UsageError`` naming the extra to install when its packages are missing."""
    from ..remote import require_grpc, require_openpi, require_vlaeval

    try:
        if protocol == "openpi":
            require_openpi("serve_model")
            from ..remote.openpi.server import serve_openpi

            return serve_openpi, "api_key"
        if protocol == "vla-eval":
            require_vlaeval("serve_model")
            from ..remote.vlaeval.server import serve_vlaeval

            return serve_vlaeval, "token"
        require_grpc("serve_model")
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    from ..remote.model_server import serve_model

    return serve_model, "token"
