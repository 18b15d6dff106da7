"""The ``rlmesh`` command's entry point: ``main``, the parser and the dispatch to each command.

The options of ``eval`` (and ``demo``) are shown in groups that mirror the parts of a run's
settings: what to evaluate, episodes and seeds, limits, parallelism, placement, failures,
output and video. Each command's work is in its own module (``evaluate``, ``demo``,
``report``, ``compare``, ``verify``, ``describe``, ``serve``).

Example:
    >>> main(["eval", "random", "--env", "CartPole-v1", "--pipeline"])  # a one-line error
    2
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ..policies import BUILTIN_POLICIES, current_directory_on_path
from ..settings import ON_ERRORS, RAY_MODES
from ..version import __version__
from .ab import ab_command, add_ab_parser
from .argtypes import (
    confidence,
    json_object,
    non_negative_float,
    non_negative_int,
    positive_int,
    positive_seconds,
    reward_threshold,
    seed,
    view,
)
from .benchmarks import benchmarks_command
from .compare import compare_command
from .demo import demo_command
from .describe import describe_command
from .evaluate import eval_command
from .exits import EXIT_BROKEN_PIPE, EXIT_USAGE, UsageError
from .report import report_command
from .sandbox_args import add_sandbox_arguments
from .serve import serve_command
from .verify import add_verify_parser, verify_command
from .watch import add_watch_parser, watch_command

_FORMATTER = argparse.RawDescriptionHelpFormatter


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rlmesh`` command with ``argv`` (default ``sys.argv[1:]``); the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with current_directory_on_path():
            status = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could not be handled
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what the closed pipe did
    not take raises nothing either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (captured, replaced): nothing to do
        pass


def _main(argv: list[str]) -> int:
    with warnings.catch_warnings():
        # Warnings (a repaired results file, a run-time notice) are one line each.
        warnings.showwarning = _show_warning
        try:
            args = build_parser().parse_args(argv)
            for flag, given in (
                ("--restart-workers", getattr(args, "restart_workers", 0)),
                ("--pipeline", getattr(args, "pipeline", False)),
            ):
                if args.command in ("eval", "demo") and given and (args.workers or 1) < 2:
                    raise UsageError(
                        f"rlmesh {args.command}: error: {flag} needs --workers 2 or more "
                        f"(with --workers 1 the envs run in this process)"
                    )
            if args.command == "eval":
                return eval_command(args, argv)
            if args.command == "demo":
                return demo_command(args, argv)
            if args.command == "report":
                return report_command(args)
            if args.command == "watch":
                return watch_command(args)
            if args.command == "compare":
                return compare_command(args)
            if args.command == "verify":
                return verify_command(args)
            if args.command == "describe":
                return describe_command(args)
            if args.command == "serve":
                return serve_command(args)
            if args.command == "ab":
                return ab_command(args)
            if args.command == "benchmarks":
                return benchmarks_command(args)
            build_parser().print_help()
            return EXIT_USAGE
        except UsageError as exc:
            message = str(exc)
            print(
                message if message.startswith("rlmesh") else f"rlmesh: error: {message}",
                file=sys.stderr,
            )
            return EXIT_USAGE


def _show_warning(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
    print(f"rlmesh: warning: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------- the parser


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``rlmesh`` command and its subcommands."""
    parser = _Parser(
        prog="rlmesh",
        description="Evaluate RL agents and robot policies on Gymnasium environments.",
        epilog="example:\n  rlmesh eval random --env CartPole-v1 --episodes 20 --num-envs 4",
        formatter_class=_FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"rlmesh {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_eval(commands)
    _add_demo(commands)
    _add_report(commands)
    _add_compare(commands)
    add_watch_parser(commands)
    add_verify_parser(commands)
    add_ab_parser(commands)
    _add_describe(commands)
    _add_serve(commands)
    _add_benchmarks(commands)
    return parser


def _add_eval(commands: Any) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a policy",
        description="Evaluate POLICY on an environment and print the summary.",
        epilog="example:\n  rlmesh eval my_policy.py:Policy --env CartPole-v1 --num-envs 8 "
        "--episodes 100 --out results.jsonl",
        formatter_class=_FORMATTER,
    )
    evaluate.add_argument(
        "policy",
        metavar="POLICY",
        help="package.module:Name, path/to/file.py:Name (a Model subclass, a Model instance or "
        f"a callable), a built-in: {', '.join(BUILTIN_POLICIES)}, or the address of a served "
        "model (tcp://host:port, host:port, unix:///path, openpi://host:port, "
        "vlaeval://host:port); several replicas of one served model as comma-separated "
        "addresses (openpi://a:8000,openpi://b:8000)",
    )
    what = evaluate.add_argument_group("policy and env")
    what.add_argument(
        "--policy-token",
        metavar="T",
        help="the token of a served POLICY (an address): its bearer token, or an openpi:// "
        "server's Api-Key",
    )
    what.add_argument("--env", help="a Gymnasium id, e.g. CartPole-v1")
    what.add_argument(
        "--suite",
        metavar="NAME|FILE",
        help="evaluate every task of a built-in suite (rlmesh benchmarks lists them; "
        "--episodes, --seed and --max-episode-steps then apply to each task) or of a suite's "
        "TOML file (each [[task]] sets its env, env_kwargs, episodes, seed and caps) instead "
        "of one --env",
    )
    what.add_argument(
        "--tasks", metavar="A,B", help="with --suite: run only these tasks (comma-separated)"
    )
    what.add_argument(
        "--suite-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help="with a built-in --suite: its options, e.g. '{\"image_size\": 128}' "
        "(rlmesh benchmarks NAME --json lists them)",
    )
    what.add_argument(
        "--env-kwargs", type=json_object, default={}, help="JSON object for gymnasium.make"
    )
    what.add_argument(
        "--horizon", type=positive_int, default=1, help="actions replayed per predicted chunk"
    )
    what.add_argument(
        "--ensemble",
        type=non_negative_float,
        metavar="M",
        help="execute chunks by temporal ensembling: predict a chunk every step and execute "
        "the exp(-M*i)-weighted average of every chunk covering the step (ACT: M=0.01)",
    )
    episodes = _add_episodes(evaluate, default=None)
    seeding = episodes.add_mutually_exclusive_group()
    seeding.add_argument(
        "--seed", type=seed, help="base seed in [0, 2**64): episode k uses episode_seed(S, k)"
    )
    seeding.add_argument("--seeds", metavar="FILE", help="one integer seed per episode")
    episodes.add_argument(
        "--success-reward",
        type=reward_threshold,
        metavar="R",
        help="an episode whose env reports no is_success/success succeeds iff its reward >= R "
        "(default: the env spec's reward_threshold, else success is n/a)",
    )
    episodes.add_argument(
        "--until-precision",
        type=float,
        metavar="E",
        help="stop at the first n where the success rate's anytime-valid 95%% confidence "
        "sequence over episodes 0..n-1 is within +/-E (e.g. 0.05); --episodes is the cap",
    )
    episodes.add_argument(
        "--until-reward-precision",
        type=float,
        metavar="E",
        help="the same on the mean return, within +/-E in the return's units (needs "
        "--reward-bounds)",
    )
    episodes.add_argument(
        "--reward-bounds",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        help="with --until-reward-precision: what an episode's return can be, e.g. 0 500",
    )
    limits = evaluate.add_argument_group("limits")
    limits.add_argument(
        "--max-episode-steps", type=positive_int, help="truncate episodes at this many steps"
    )
    limits.add_argument(
        "--max-episode-seconds",
        type=positive_seconds,
        metavar="S",
        help="truncate episodes at this many seconds of wall clock",
    )
    for op, thing in (("step", "env.step"), ("reset", "env.reset"), ("predict", "model call")):
        limits.add_argument(
            f"--timeout-{op}",
            type=positive_seconds,
            metavar="S",
            help=f"fail the run (exit 1) when one {thing} takes longer than S seconds",
        )
    _add_parallelism(evaluate)
    _add_placement(evaluate)
    failures = evaluate.add_argument_group("failures")
    failures.add_argument(
        "--on-error",
        choices=ON_ERRORS,
        default="raise",
        help="when an env raises in reset or step: fail the run (raise, the default), record "
        "the episode as failed and go on with the env rebuilt (record), or play the same "
        "episode again with its seed up to --max-retries times, then record it (retry)",
    )
    failures.add_argument(
        "--max-retries",
        type=non_negative_int,
        metavar="N",
        help="times a failed part of the run is run again (default 3): with --on-error retry, "
        "an episode whose env failed (then it is recorded failed); with --ray, a window whose "
        "worker died, elsewhere with the same seeds (then the run fails)",
    )
    output = _add_output(evaluate)
    output.add_argument("--out", metavar="FILE", help="write results, one JSON line each")
    output.add_argument(
        "--resume", action="store_true", help="continue the run in --out, adding missing episodes"
    )
    output.add_argument(
        "--allow-changed-policy",
        action="store_true",
        help="with --resume: continue although the policy's source file changed (recorded)",
    )
    video = evaluate.add_argument_group("video")
    video.add_argument(
        "--record-video",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="record the episodes of index 0..K-1 to mp4 files, linked from their results "
        "(needs the video extra)",
    )
    video.add_argument(
        "--video-dir",
        metavar="DIR",
        help="where --record-video writes (default: <--out stem>_videos/ beside --out)",
    )
    video.add_argument(
        "--video-key",
        metavar="KEY",
        help="with --record-video: take the frames from this image key of the observation "
        "('observation': the whole observation) instead of render() in rgb_array mode",
    )
    add_sandbox_arguments(evaluate)
    _add_core(evaluate)


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="a built-in CartPole heuristic over 8 lanes and 100 episodes",
        description="Evaluate a built-in CartPole heuristic: nothing to write, nothing to set.",
        epilog="example:\n  rlmesh demo --episodes 20",
        formatter_class=_FORMATTER,
    )
    _add_episodes(demo, default=100)
    _add_parallelism(demo)
    _add_output(demo)
    _add_core(demo)


def _add_episodes(parser: argparse.ArgumentParser, *, default: int | None) -> Any:
    """The "episodes and seeds" group, holding ``--episodes`` (the demo's default: 100)."""
    group = parser.add_argument_group("episodes and seeds")
    group.add_argument(
        "--episodes",
        type=positive_int,
        default=default,
        help=f"episodes to score (default {default or 'len(seeds), else 100'})",
    )
    return group


def _add_parallelism(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parallelism")
    group.add_argument(
        "--num-envs", type=positive_int, default=None, help="lanes run in parallel (default 1)"
    )
    group.add_argument(
        "--workers",
        type=positive_int,
        metavar="W",
        help="worker processes stepping the lanes (default 1: the lanes run in this process); "
        "with --ray, the Ray workers running windows of episodes at once (default: one per CPU)",
    )
    group.add_argument(
        "--restart-workers",
        type=non_negative_int,
        default=0,
        help="restart a worker that dies up to this many times, replaying its episodes "
        "(needs --workers 2 or more; default 0)",
    )
    group.add_argument(
        "--pipeline",
        action="store_true",
        help="overlap the model with the workers stepping: each worker's lanes go on as soon "
        "as it has stepped (needs --workers 2 or more; same results for a per-lane model)",
    )


def _add_placement(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("placement")
    group.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the episodes across a Ray cluster: join ADDRESS ('auto', 'host:6379', "
        "'ray://host:10001'), or without one start a local Ray instance with this machine's "
        "CPUs (needs the ray extra)",
    )
    group.add_argument(
        "--ray-mode",
        choices=RAY_MODES,
        help="with --ray, how the workers run their windows: 'tasks', a Ray task a window whose "
        "run loads the model (default), or 'actors', --workers long-lived Ray actors that load "
        "the model once each (Model.load), for a model that is expensive to load",
    )


def _add_output(parser: argparse.ArgumentParser) -> Any:
    """The "output" group, holding ``--json`` and ``--no-progress``."""
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    group.add_argument(
        "--view",
        type=view,
        metavar="KIND",
        help="watch the run live: http (a page on 127.0.0.1, any free port; its address is "
        "printed), http:PORT, http:HOST:PORT, terminal (a live table instead of the progress "
        "bar) or both",
    )
    return group


def _add_core(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--core", choices=("rust", "python"), help="the core (default: active)")


def _add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="the summary of a results file",
        description="Print the summary table of a results file written by `rlmesh eval --out`, "
        "and the provenance of each run segment (versions, host, command line, git revision).",
        epilog="example:\n  rlmesh report results.jsonl --html report.html",
        formatter_class=_FORMATTER,
    )
    report.add_argument("file", metavar="FILE", help="a results file (JSON lines)")
    report.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    report.add_argument(
        "--html",
        metavar="OUT",
        help="also write a self-contained HTML report to OUT: tables, plots, videos, metadata "
        "(needs the report extra)",
    )


def _add_compare(commands: Any) -> None:
    paired = commands.add_parser(
        "compare",
        help="policy B against policy A on the same episodes",
        description="Compare two results files of runs with the same seeds, episode by episode\n"
        "(matched by task, index and seed): the paired difference B - A in mean return with\n"
        "a paired bootstrap CI, in success rate with Newcombe's paired interval and McNemar's\n"
        "exact test, per task and overall, and how many episodes each policy won.",
        epilog="example:\n  rlmesh compare baseline.jsonl candidate.jsonl --json",
        formatter_class=_FORMATTER,
    )
    paired.add_argument("a", metavar="A", help="the results file of the baseline run")
    paired.add_argument("b", metavar="B", help="the results file of the run compared to A")
    paired.add_argument(
        "--intersection",
        action="store_true",
        help="compare only the episodes both files hold (default: refuse files that differ)",
    )
    paired.add_argument(
        "--confidence",
        type=confidence,
        metavar="C",
        default=0.95,
        help="the intervals' level (0.95)",
    )
    paired.add_argument(
        "--resamples",
        type=positive_int,
        metavar="N",
        default=10_000,
        help="bootstrap resamples (10000)",
    )
    paired.add_argument(
        "--seed", type=non_negative_int, default=0, metavar="S", help="the bootstrap's seed (0)"
    )
    paired.add_argument("--json", action="store_true", help="print everything as one JSON object")


def _add_describe(commands: Any) -> None:
    describe = commands.add_parser(
        "describe",
        help="the plan pairing a policy's spec with an env",
        description="Print how POLICY's spec is fitted to the env (by key, or by role against "
        "the env's tags) and the plan's advisories, without running an episode.",
        epilog="example:\n  rlmesh describe --env my_env.py:make_env --tags tags.json "
        "--model my_policy.py:Policy",
        formatter_class=_FORMATTER,
    )
    where = describe.add_mutually_exclusive_group(required=True)
    where.add_argument("--env", help="a Gymnasium id, package.module:make_env or file.py:make_env")
    where.add_argument(
        "--suite",
        metavar="NAME",
        help="a built-in suite (rlmesh benchmarks): the plan on its first task's env, with the "
        "spec the suite ships for a served POLICY's protocol",
    )
    describe.add_argument(
        "--suite-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help="with --suite: its options, as for rlmesh eval",
    )
    describe.add_argument(
        "--env-kwargs", type=json_object, default={}, help="JSON object for gymnasium.make"
    )
    describe.add_argument(
        "--tags",
        metavar="FILE",
        help="the env's tags, adapters-v1 JSON (default: the env's "
        'metadata["rlmesh.adapters.v1.env_io_spec"])',
    )
    describe.add_argument(
        "--model",
        required=True,
        metavar="POLICY",
        help="the policy, as for rlmesh eval (an address too)",
    )


def _add_benchmarks(commands: Any) -> None:
    listing = commands.add_parser(
        "benchmarks",
        help="the built-in robot benchmark suites",
        description="List the built-in suites (LIBERO, PushT, ALOHA, Meta-World): tasks, "
        "episodes per task, step cap, the extra that installs each and whether it is "
        "installed; with NAME, that suite's tasks.",
        epilog="example:\n  rlmesh benchmarks\n  rlmesh eval random --suite libero_spatial "
        "--episodes 2 --num-envs 2",
        formatter_class=_FORMATTER,
    )
    listing.add_argument("name", nargs="?", metavar="NAME", help="one suite: its tasks")
    listing.add_argument("--json", action="store_true", help="print it as JSON")


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve an env or a model over rlmesh-wire-v1",
        description="Serve an env or a model (gRPC, rlmesh-wire-v1) until SIGINT or SIGTERM.",
        formatter_class=_FORMATTER,
    )
    served = serve.add_subparsers(dest="served", metavar="WHAT", parser_class=_Parser)
    _add_serve_env(served)
    _add_serve_model(served)


def _add_serve_env(served: Any) -> None:
    serve_env = served.add_parser(
        "env",
        help="serve an env",
        description="Serve an env; prints one line with the address it listens on.",
        epilog="example:\n  rlmesh serve env CartPole-v1 --address 127.0.0.1:50051 --num-envs 8",
        formatter_class=_FORMATTER,
    )
    serve_env.add_argument(
        "env",
        metavar="ID_OR_FACTORY",
        help="a Gymnasium id, or package.module:make_env / path/to/file.py:make_env (a "
        "zero-argument function returning a gymnasium.Env, or a VectorEnv)",
    )
    serve_env.add_argument(
        "--address",
        default="127.0.0.1:0",
        help="host:port, tcp://host:port or unix:///path (default 127.0.0.1:0, a free port)",
    )
    serve_env.add_argument(
        "--num-envs", type=positive_int, default=None, help="lanes served (default 1)"
    )
    serve_env.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="W",
        help="step the lanes in W worker processes, built there from the id or factory "
        "(default 1: in this process)",
    )
    serve_env.add_argument("--token", help="require this bearer token of every client")
    serve_env.add_argument(
        "--max-message-mb",
        type=positive_seconds,
        default=64.0,
        metavar="M",
        help="the largest message accepted or sent, in MiB (default 64)",
    )
    serve_env.add_argument(
        "--allow-shutdown", action="store_true", help="accept the Shutdown call of a client"
    )
    serve_env.add_argument(
        "--tags",
        metavar="FILE",
        help="the env's role tags, adapters-v1 JSON, published to drivers (default: the "
        "env's own metadata tags, if any)",
    )


def _add_serve_model(served: Any) -> None:
    serve_model = served.add_parser(
        "model",
        help="serve a policy",
        description="Serve POLICY on ADDR; evaluate it with `rlmesh eval ADDR --env ID`.",
        epilog="example:\n  rlmesh serve model my_policy.py:Policy --address 127.0.0.1:50051",
        formatter_class=_FORMATTER,
    )
    serve_model.add_argument(
        "policy", metavar="POLICY", help="package.module:Name or path/to/file.py:Name"
    )
    serve_model.add_argument(
        "--address",
        default="127.0.0.1:0",
        help="host:port (port 0: any free one), tcp://host:port or unix:///path (default "
        "127.0.0.1:0, loopback)",
    )
    serve_model.add_argument(
        "--max-batch", type=positive_int, metavar="N", help="most rows per model call"
    )
    serve_model.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        metavar="W",
        help="how long a predict waits for other drivers' predicts to batch with (default 2)",
    )
    serve_model.add_argument(
        "--token",
        metavar="T",
        help="require this token: a bearer token, or with --protocol openpi an Api-Key",
    )
    serve_model.add_argument(
        "--protocol",
        choices=("rlmesh", "openpi", "vla-eval"),
        default="rlmesh",
        help="rlmesh (rlmesh-wire-v1, gRPC), openpi (openpi's WebSocket policy protocol, for "
        "openpi's clients; --token is then its Api-Key) or vla-eval (vla-eval's WebSocket "
        "protocol, for its clients; --token then as a Bearer header or ?token=); ADDR of the "
        "WebSocket protocols host:port or ws://host:port",
    )
    serve_model.add_argument(
        "--max-message-mb", type=float, default=64.0, metavar="M", help="largest message (64)"
    )
    serve_model.add_argument(
        "--allow-shutdown", action="store_true", help="accept the Shutdown call"
    )
