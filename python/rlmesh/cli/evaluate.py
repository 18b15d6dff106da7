"""``rlmesh eval POLICY --env ID | --suite FILE``: load the policy, run the evaluation with the
progress display, and print the summary.

With ``--out`` the results file survives a crash and can be resumed (``--resume``); with
``--ray [ADDRESS]`` the episodes run across a Ray cluster (``rlmesh.cluster``), whose workers
load the policy by its name. A ``POLICY`` that is an address is a served model: rlmesh-wire-v1
(``tcp://host:port``, ``host:port``, ``unix:///path``), openpi's WebSocket protocol
(``openpi://host:port``, with ``--policy-token`` as its Api-Key) or vla-eval's
(``vlaeval://host:port``, ``--policy-token`` as a bearer token). Ctrl-C keeps the completed
episodes and says how to resume.

Example:
    >>> from rlmesh.cli import main
    >>> main(["eval", "random", "--env", "NoSuchEnv-v0"])  # a one-line error on stderr
    2
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gymnasium as gym

from ..api import run
from ..core import core_name
from ..errors import ModelDefinitionError, ResultsFileError, RlmeshError
from ..model import TemporalEnsemble
from ..policies import load_policy, policy_identity
from ..results import LOCK_SUFFIX, SUITE_KEY, dumps, read_results, read_run, read_suite
from ..settings import check_video_settings
from ..stats import format_suite_summary, format_summary
from ..stats.stopping import Precision
from ..success import rule_for
from ..view import ViewError
from .exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError, print_error
from .inputs import check_env, is_served, read_seeds, ready_made_spec, served_policy
from .progress import EpisodeSink, Progress, SuiteEpisodeSink, Throughput
from .report import suite_file_summary
from .sandbox_args import (
    check_sandbox_arguments,
    env_sandboxed,
    policy_sandboxed,
    run_overrides,
    sandboxed_env,
    sandboxed_policy,
    sandboxed_tasks,
)

# eval's options a suite sets per task, in each [[task]] table instead.
PER_TASK_OPTIONS = (
    ("env", "--env"),
    ("env_kwargs", "--env-kwargs"),
    ("seed", "--seed"),
    ("seeds", "--seeds"),
    ("episodes", "--episodes"),
    ("max_episode_steps", "--max-episode-steps"),
    ("max_episode_seconds", "--max-episode-seconds"),
)


def eval_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``rlmesh eval`` (and ``rlmesh demo``, which is one): the exit code."""
    if args.resume and args.out is None:
        raise UsageError("rlmesh eval: error: --resume needs --out FILE to resume")
    cluster = _cluster_arguments(args)
    check_sandbox_arguments(args, served_policy=is_served(args.policy))
    until = _until(args)
    if args.suite is not None:
        if until:
            raise UsageError(
                "rlmesh eval: error: --until-precision and --until-reward-precision stop one "
                "env's run: pass --env ID, not --suite"
            )
        return _eval_suite(args, argv, cluster)
    for given, option in ((args.tasks, "--tasks"), (args.suite_options, "--suite-options")):
        if given is not None:
            raise UsageError(
                f"rlmesh eval: error: {option} needs --suite NAME|FILE, the suite it applies to"
            )
    if args.env is None:
        raise UsageError(
            "rlmesh eval: error: the following arguments are required: --env (or --suite NAME|FILE)"
        )
    if not env_sandboxed(args):  # a sandboxed env's packages are in its sandbox only
        check_env(args.env)
    _check_video_options(args)
    seeds = read_seeds(args.seeds) if args.seeds is not None else None
    episodes = args.episodes or (len(seeds) if seeds is not None else 100)
    base_seed = 0 if args.seed is None else args.seed
    core = args.core or core_name()

    sandboxed = None
    if env_sandboxed(args):  # started first: a random policy takes its action space
        try:
            sandboxed = sandboxed_env(args, args.env, args.env_kwargs)
        except RlmeshError as exc:
            print_error(exc)
            return EXIT_FAILED

    def action_space() -> gym.Space:
        if sandboxed is not None:
            return sandboxed.single_action_space
        env = gym.make(args.env, **args.env_kwargs)
        try:
            return env.action_space
        finally:
            env.close()

    if is_served(args.policy):  # a served model
        try:
            policy = served_policy(args.policy, args.policy_token)
        except RlmeshError as exc:
            print_error(exc)
            return EXIT_FAILED
        policy_name, policy_sha256 = args.policy, None
    elif policy_sandboxed(args):
        try:
            policy = sandboxed_policy(args)
        except RlmeshError as exc:
            print_error(exc)
            return EXIT_FAILED
        policy_name, policy_sha256 = policy_identity(args.policy)
    else:
        try:
            policy = load_policy(args.policy, action_space)
        except gym.error.Error as exc:  # making the env for `random` failed: bad --env-kwargs
            raise UsageError(f"--env-kwargs for {args.env}: {exc}") from None
        except TypeError as exc:
            raise UsageError(f"--env-kwargs for {args.env}: {exc}") from None
        policy_name, policy_sha256 = policy_identity(args.policy)
    progress = Progress(
        episodes,
        enabled=not args.no_progress
        and not args.json
        and sys.stderr.isatty()
        and not _view_in_terminal(args),
    )
    # One env per lane; a partial of gym.make pickles, so worker processes can build them too.
    env = (
        sandboxed
        if sandboxed is not None
        else args.env
        if not args.env_kwargs
        else functools.partial(gym.make, args.env, **args.env_kwargs)
    )
    status, result = _evaluated(
        args,
        progress,
        run,
        # A cluster's workers load the policy by its name, as this process did; a served
        # policy's client travels to them, and each dials the server itself; a sandboxed
        # policy travels as its arguments, and each starts a server like it.
        policy if not cluster or is_served(args.policy) or policy_sandboxed(args) else args.policy,
        env,
        seeds=seeds,
        episodes=episodes,
        seed=base_seed,
        max_episode_steps=args.max_episode_steps,
        max_episode_seconds=args.max_episode_seconds,
        hooks=[EpisodeSink(progress), Throughput(progress)],
        core=core,
        # From the id: with --env-kwargs the env is a factory, whose spec comes late.
        success=rule_for(args.success_reward, args.env if sandboxed is None else sandboxed),
        # The results file's header records these too, and a resume must match them.
        run_info={
            "env": args.env,
            "policy": policy_name,
            "policy_sha256": policy_sha256,
            "env_kwargs": args.env_kwargs,
        },
        **{**_shared_arguments(args, argv), **run_overrides(args)},
        **cluster,
        **until,
    )
    if status == EXIT_INTERRUPTED:
        _interrupted(args, argv)
        return status
    report = getattr(result, "cluster", None)
    if args.out is not None:  # every episode the file holds (and how a stopped run stopped)
        _, result, _ = read_run(args.out)
    elif result is None:
        return status
    summary = result.summary()
    if report is not None and args.json:
        summary["cluster"] = report.to_dict()
    print(dumps(summary) if args.json else format_summary(summary))
    if report is not None and not args.json:
        print(report.format())
    _say_where_the_page_goes(args)
    return status


def _eval_suite(args: argparse.Namespace, argv: Sequence[str], cluster: dict[str, Any]) -> int:
    """``rlmesh eval POLICY --suite FILE [--tasks a,b]``: every task (or those named), one
    after another, into one results file; the per-task and overall summary."""
    from ..suites import checked_suite, run_suite

    only = None
    if args.tasks is not None:
        only = [name.strip() for name in args.tasks.split(",") if name.strip()]
    suite = suite_tasks(args)
    try:
        suite, chosen = checked_suite(suite, only)
    except ValueError as exc:
        raise UsageError(f"--tasks {args.tasks}: {exc} (in {args.suite})") from None
    for task in chosen:
        try:
            if not env_sandboxed(args):  # a sandboxed env's packages are in its sandbox only
                check_env(task.env)
        except UsageError as exc:
            raise UsageError(f"--suite {args.suite}, task {task.name!r}: {exc}") from None
    if env_sandboxed(args):  # each task's run starts its env's sandbox
        suite = sandboxed_tasks(args, suite)
    if is_served(args.policy):
        try:
            policy = served_policy(
                args.policy, args.policy_token, ready_made_spec(args.suite, args.policy)
            )
        except RlmeshError as exc:
            print_error(exc)
            return EXIT_FAILED
        policy_name, policy_sha256 = args.policy, None
    elif policy_sandboxed(args):
        try:
            policy = sandboxed_policy(args)
        except RlmeshError as exc:
            print_error(exc)
            return EXIT_FAILED
        policy_name, policy_sha256 = policy_identity(args.policy)
    else:
        # No one action space: a random policy takes each task's from its run.
        policy = load_policy(args.policy, lambda: None)
        policy_name, policy_sha256 = policy_identity(args.policy)
    progress = Progress(
        sum(task.episodes for task in chosen),
        enabled=not args.no_progress
        and not args.json
        and sys.stderr.isatty()
        and not _view_in_terminal(args),
    )
    status, result = _evaluated(
        args,
        progress,
        run_suite,
        policy if not cluster or is_served(args.policy) or policy_sandboxed(args) else args.policy,
        suite,
        only=[task.name for task in chosen],
        hooks=[SuiteEpisodeSink(progress), Throughput(progress)],
        core=args.core or core_name(),
        success=args.success_reward,
        run_info={"policy": policy_name, "policy_sha256": policy_sha256},
        **{**_shared_arguments(args, argv), **run_overrides(args)},
        **cluster,
    )
    if status == EXIT_INTERRUPTED:
        _interrupted(args, argv)
        return status
    if result is None:
        return status
    summary = result.summary()
    if args.out is not None:  # every task the file holds, as `rlmesh report` shows it
        summary = suite_file_summary(args.out)
    print(dumps(summary) if args.json else format_suite_summary(summary))
    _say_where_the_page_goes(args)
    return status


def _say_where_the_page_goes(args: argparse.Namespace) -> None:
    """With ``--view http``, say on stderr that the page closes with the command, and how
    ``rlmesh watch`` serves the run's page again from its results file."""
    view = getattr(args, "view", None) or ""
    if not view.startswith(("http", "both")):
        return
    if args.out is None:
        again = "pass --out FILE to keep the run, then `rlmesh watch FILE --http` shows it again"
    else:
        again = f"`rlmesh watch {shlex.quote(args.out)} --http` shows this run's page again"
    print(f"rlmesh: the live view closes with this command; {again}", file=sys.stderr)


def suite_tasks(args: argparse.Namespace) -> list[Any]:
    """The tasks ``--suite`` names: a built-in suite (``rlmesh.benchmarks``), with
    ``--episodes``, ``--seed``, ``--max-episode-steps`` and ``--suite-options`` applied to
    each task, or a suite's TOML file, which sets all of them per task itself."""
    from .. import benchmarks
    from ..suites import load_suite

    builtin = args.suite in benchmarks.SUITES and not os.path.exists(args.suite)
    settable = ("seed", "episodes", "max_episode_steps") if builtin else ()
    given = [
        option for name, option in PER_TASK_OPTIONS if getattr(args, name) and name not in settable
    ]
    if given:
        sets = "each task's" if builtin else "them per task, in its [[task]] tables"
        raise UsageError(
            f"rlmesh eval: error: {', '.join(given)} cannot go with --suite: a suite sets {sets}"
        )
    if not builtin:
        if args.suite_options is not None:
            raise UsageError(
                f"rlmesh eval: error: --suite-options is for a built-in suite "
                f"({', '.join(benchmarks.SUITES)}); {args.suite} is a file"
            )
        if not os.path.exists(args.suite) and not args.suite.endswith(".toml"):
            raise UsageError(
                f"--suite {args.suite}: no such file and no built-in suite of that name; the "
                f"built-in suites are {', '.join(benchmarks.SUITES)} (rlmesh benchmarks)"
            )
        try:
            return load_suite(args.suite)
        except ValueError as exc:
            raise UsageError(f"--suite {exc}") from None
    try:
        return benchmarks.suite(
            args.suite,
            episodes=args.episodes,
            max_episode_steps=args.max_episode_steps,
            seed=args.seed or 0,
            **(args.suite_options or {}),
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--suite {args.suite}: {exc}") from None


def _shared_arguments(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments of ``run`` that a single env's run and a suite's take alike from
    the options: parallelism, the loop, timeouts, failures, output and video."""
    return {
        "num_envs": args.num_envs,
        "workers": args.workers,
        "restart_workers": args.restart_workers,
        "pipeline": args.pipeline,
        "execution_horizon": args.horizon,
        "ensemble": None if args.ensemble is None else TemporalEnsemble(m=args.ensemble),
        "timeouts": _timeouts(args) or None,
        "on_error": args.on_error,
        "max_retries": args.max_retries,
        "results_path": args.out,
        "resume": args.resume,
        "allow_changed_policy": args.allow_changed_policy,
        "record_video": args.record_video,
        "video_dir": args.video_dir,
        "video_key": args.video_key,
        "view": args.view,
        # Recorded in the header's auditable record, not checked on resume.
        "provenance": {"policy": args.policy, "command": ["rlmesh", *argv]},
    }


def _until(args: argparse.Namespace) -> dict[str, Any]:
    """``run``'s ``until=`` from ``--until-precision E`` or ``--until-reward-precision E
    [--reward-bounds LO HI]`` (none without them); a ``UsageError`` naming the option for a
    precision ``rlmesh.Precision`` refuses. (``rlmesh demo`` has none of these options.)"""
    success = getattr(args, "until_precision", None)
    reward = getattr(args, "until_reward_precision", None)
    bounds = getattr(args, "reward_bounds", None)
    if bounds is not None and reward is None:
        raise UsageError(
            "rlmesh eval: error: --reward-bounds bounds the return for --until-reward-precision "
            "E: pass that too"
        )
    if success is not None and reward is not None:
        raise UsageError(
            "rlmesh eval: error: --until-precision (the success rate) and "
            "--until-reward-precision (the mean return): pass one of them"
        )
    if success is None and reward is None:
        return {}
    option = "--until-precision" if success is not None else "--until-reward-precision"
    try:
        if success is not None:
            return {"until": Precision(success=success)}
        # An id's env declares no bounds before it is made: the command line needs them.
        precision = Precision(reward=reward, reward_bounds=bounds and tuple(bounds))
        return {"until": precision.bounded()}
    except ValueError as exc:
        raise UsageError(f"rlmesh eval: error: {option}: {exc}") from None


def _cluster_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``run``'s cluster arguments from ``--ray [ADDRESS]`` (none without ``--ray``;
    ``--workers`` and ``--max-retries`` go to ``run`` either way); a ``UsageError`` if Ray is
    missing, or for a ``--max-retries`` that neither ``--on-error retry`` nor ``--ray`` reads."""
    if args.max_retries is not None and args.ray is None and args.on_error != "retry":
        raise UsageError(
            "rlmesh eval: error: --max-retries needs --on-error retry (episodes whose env "
            "failed) or --ray [ADDRESS] (windows whose worker died)"
        )
    if args.ray_mode is not None and args.ray is None:
        raise UsageError(
            f"rlmesh eval: error: --ray-mode {args.ray_mode} says how Ray workers run their "
            "windows: it needs --ray [ADDRESS]"
        )
    if args.ray is None:
        return {}
    from ..cluster import require_ray

    try:
        require_ray("--ray")
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    return {
        "cluster": "ray",
        "ray_address": args.ray or None,  # a bare --ray: a local Ray instance
        **({} if args.ray_mode is None else {"ray_mode": args.ray_mode}),
    }


def _timeouts(args: argparse.Namespace) -> dict[str, float]:
    """``--timeout-reset/-step/-predict`` as ``run``'s ``timeouts=`` (the ones given)."""
    given = (
        ("reset", args.timeout_reset),
        ("step", args.timeout_step),
        ("predict", args.timeout_predict),
    )
    return {op: limit for op, limit in given if limit is not None}


def _check_video_options(args: argparse.Namespace) -> None:
    """``--record-video`` and its options, refused before any work as usage errors."""
    if not args.record_video:
        if args.video_dir is not None or args.video_key is not None:
            raise UsageError(
                "rlmesh eval: error: --video-dir and --video-key need --record-video K"
            )
        return
    if args.out is None and args.video_dir is None:
        raise UsageError(
            "rlmesh eval: error: --record-video needs --out FILE (the videos go beside it, in "
            "<FILE stem>_videos/) or --video-dir DIR"
        )
    try:
        check_video_settings(
            record_video=args.record_video,
            video_dir=args.video_dir,
            video_key=args.video_key,
            video_prefix=None,
            results_path=args.out,
        )
    except (ValueError, ImportError) as exc:
        raise UsageError(f"rlmesh eval: error: --record-video: {exc}") from None


def _evaluated(
    args: argparse.Namespace, progress: Progress, evaluate: Callable[..., Any], *a: Any, **kw: Any
) -> tuple[int, Any]:
    """``evaluate(*a, **kw)`` (``run`` or ``run_suite``) as eval runs it: ``(status, result)``,
    the result partial when the run failed (EXIT_FAILED, said on stderr) and None when it was
    interrupted (EXIT_INTERRUPTED); a UsageError for what the user gave wrong."""
    try:
        return EXIT_OK, _interruptible(evaluate, *a, **kw)
    except ResultsFileError as exc:
        raise UsageError(str(exc)) from None
    except ViewError as exc:  # the page's port is in use: nothing ran
        raise UsageError(f"rlmesh {args.command}: error: --view {args.view}: {exc}") from None
    except ModelDefinitionError as exc:  # not a model: nothing ran
        raise UsageError(f"policy {args.policy!r}: {exc}") from None
    except OSError as exc:
        # The results file, or the writer's lock file next to it.
        if args.out is None or exc.filename not in (args.out, args.out + LOCK_SUFFIX):
            raise
        raise UsageError(f"--out {args.out}: cannot open it ({exc.strerror})") from None
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED, None
    except RlmeshError as exc:
        print_error(exc)
        return EXIT_FAILED, getattr(exc, "partial_result", None)
    finally:
        progress.stop()


def _raise_interrupt(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def _interruptible(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with Ctrl-C raising at once, wherever the run is.

    ``asyncio.run`` replaces the default SIGINT handler with one that cancels the main task at
    its next real suspension point; a run whose awaits never suspend would then go on to the
    end. A handler of our own (which asyncio leaves alone) raises in place instead, and the
    driver's teardown closes the run as for any failure.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    previous = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Say on stderr what an interrupted run kept, and the command that resumes it."""
    if args.out is None:
        print(
            "rlmesh: interrupted; nothing was kept (pass --out FILE to keep completed episodes "
            "and resume)",
            file=sys.stderr,
        )
        return
    again = list(argv) if "--resume" in argv else [*argv, "--resume"]
    if getattr(args, "suite", None) is not None:
        header, runs = read_suite(args.out)
        episodes = [episode for run in runs.values() for episode in run.episodes]
        header = {"episodes": sum(task["episodes"] for task in header[SUITE_KEY])}
    else:
        header, episodes = read_results(args.out)
    print(
        f"rlmesh: interrupted; {len(episodes)} of {header['episodes']} episodes are in "
        f"{args.out}. Resume with: rlmesh {shlex.join(again)}",
        file=sys.stderr,
    )


def _view_in_terminal(args: argparse.Namespace) -> bool:
    """``--view`` shows its live table in the terminal (in place of the progress bar)."""
    return (getattr(args, "view", None) or "").startswith(("terminal", "both"))
