"""The ``rlmesh`` command: evaluate a policy from the shell, with live progress and a summary.

Commands:

- ``rlmesh eval POLICY --env ID [...]``: run the evaluation, optionally into a results file
  (``--out``) that survives a crash and can be resumed (``--resume``), and with ``--ray
  [ADDRESS] --workers K`` across a Ray cluster (``rlmesh.cluster``);
- ``rlmesh demo``: ``eval`` of a built-in CartPole heuristic over 8 lanes and 100 episodes;
- ``rlmesh report FILE [--html OUT]``: the summary table and provenance of a results file
  alone, and with ``--html`` a self-contained HTML report of it (``rlmesh.report.html``);
- ``rlmesh compare A B``: policy B against policy A on the same seeded episodes, pair by pair
  (``rlmesh.report.compare``); exit 2 when the runs cannot be paired;
- ``rlmesh describe --env ID_OR_FACTORY [--tags FILE] --model POLICY``: the plan that pairs
  the policy's spec with the env (its tags, from FILE or the env's metadata) and its
  advisories, without running an episode;
- ``rlmesh serve env ID_OR_FACTORY``: serve an env over rlmesh-wire-v1 until SIGINT / SIGTERM.
- ``rlmesh serve model POLICY --address ADDR``: serve a policy over rlmesh-wire-v1 until
  SIGINT / SIGTERM (``rlmesh eval tcp://host:port --env ...`` evaluates it).

Exit codes: 0 done; 1 the run failed (the typed error's message, after the completed episodes
were written); 2 bad input (one line saying what was wrong and what was expected), or another
run is writing the ``--out`` file; 130 interrupted (Ctrl-C; completed episodes are on disk and
the message says how to resume); 141 stdout was closed early (``rlmesh eval ... | head``:
nothing printed, as ``cat`` does).

``POLICY`` and ``--env`` may name modules in the current directory, as ``python -m`` finds them.
A ``POLICY`` that is an address (``tcp://host:port``, ``host:port``, ``unix:///path``) is a
served model.

Example:
    >>> main(["eval", "random", "--env", "CartPole-v1", "--episodes", "0"])  # a one-line error
    2
    >>> main(["demo", "--episodes", "2", "--no-progress", "--json"])  # doctest: +ELLIPSIS
    {"episodes": 2, ..., "mean_reward": 500.0, ..., "success_rate": 1.0, ...}
    0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import math
import os
import shlex
import signal
import sys
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

from . import core_name, driver
from .adapters import Action, Custom, ModelSpec, checked_env_tags, compile_spec, env_tags_of
from .errors import ModelDefinitionError, ResultsFileError, RlmeshError, SpecError
from .hooks import RunHooks, RuntimeHooks
from .model import Model
from .remote.address import is_address
from .results import (
    LOCK_SUFFIX,
    SUITE_KEY,
    EpisodeResult,
    dumps,
    read_columns_with_resumes,
    read_results,
    read_run,
    read_suite,
    read_suite_columns,
)
from .settings import ON_ERRORS, RAY_MODES, check_video_settings
from .stats import format_suite_summary, format_summary, summarize, summarize_suite
from .success import rule_for
from .version import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1  # as `cat` ends


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


# ---------------------------------------------------------------------------- built-in policies


def observation_digest(obs: Any, digest: int = 0) -> int:
    """A CRC-32 of every leaf of a raw observation, whatever its space: arrays and numbers by
    their bytes, strings by their UTF-8, dicts, tuples and lists walked in order.

    Example:
        >>> observation_digest((14, 10, 0)) == observation_digest((14, 10, 1))
        False
    """
    if isinstance(obs, dict):
        for value in obs.values():
            digest = observation_digest(value, digest)
        return digest
    if isinstance(obs, (tuple, list)):
        for value in obs:
            digest = observation_digest(value, digest)
        return digest
    if isinstance(obs, str):
        return zlib.crc32(obs.encode("utf-8"), digest)
    return zlib.crc32(np.ascontiguousarray(obs).tobytes(), digest)


class RandomPolicy(Model):
    """Samples the action space, for any observation space (Tuple, Text, ... included).

    The draw is seeded by a digest of the raw observation, which descends from the episode's
    seed: the policy is a pure function, so its results are reproducible and the same for any
    ``--num-envs`` (a per-lane RNG would depend on which lane ran what).
    """

    # The whole raw observation, reduced to its digest: no space needs a leaf the model reads.
    spec = ModelSpec(input=Custom(observation_digest), output=Action(clip=False))

    def __init__(self, action_space: gym.Space | None = None) -> None:
        super().__init__()
        self.action_space = action_space
        # Without a space given (a suite: one policy, several envs), each run's env's.
        self._space_from_route = action_space is None

    def on_route(self, route: Any) -> None:
        if self._space_from_route:
            self.action_space = route.action_space

    def predict(self, digest: int) -> Any:
        self.action_space.seed(int(digest))  # the lane's value may come back as a numpy int
        return self.action_space.sample()


class CartPoleHeuristic(Model):
    """Push toward where the pole is falling: balances CartPole-v1 for all 500 steps."""

    def predict_batch(self, obs: np.ndarray) -> np.ndarray:  # obs: [N, 4]
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


BUILTIN_POLICIES = ("random", "cartpole-heuristic")


def load_object(spec: str, what: str, expected: str) -> Any:
    """The object ``package.module:Name`` or ``path/to/file.py:Name`` names (``what`` and
    ``expected`` phrase the ``UsageError`` when it does not load)."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise UsageError(f"{what} {spec!r}: {expected}")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"{what} {spec!r}: no file {target}; {expected}")
            module = _load_file(path)
        else:
            module = importlib.import_module(target)
    except UsageError:
        raise
    except Exception as exc:  # any error of the user's module is theirs to fix: one line
        raise UsageError(
            f"{what} {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not hasattr(module, name):
        raise UsageError(f"{what} {spec!r}: {target} has no attribute {name!r}")
    return getattr(module, name)


def _load_file(path: Path) -> Any:
    """The module ``path`` defines, registered as ``sys.modules[path.stem]`` as ``import``
    would, so worker processes receive its functions by reference (pickle imports them by
    module name). A module of that file already there is reused, as ``import`` does, and keeps
    the identity of what it defines; a name held by another module is left alone, and the
    file runs unregistered. The file's directory goes on sys.path, so it can import its
    neighbours."""
    resolved = path.resolve()
    name = path.stem
    held = sys.modules.get(name)
    held_file = getattr(held, "__file__", None)
    if held_file is not None and Path(held_file).resolve() == resolved:
        return held  # its directory went on sys.path when it was loaded
    sys.path.insert(0, str(resolved.parent))
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    register = held is None
    if register:
        sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        if register:
            sys.modules.pop(name, None)
        raise
    return module


def load_policy(spec: str, action_space: Callable[[], gym.Space]) -> Any:
    """The policy ``spec`` names: a built-in, ``package.module:Name`` or ``file.py:Name``.

    ``Name`` may be a ``Model`` subclass (instantiated without arguments), a ``Model`` instance
    or a callable ``fn(obs) -> action``. ``action_space()`` is called only for ``random``.
    Anything that does not load is a ``UsageError`` saying what was expected.
    """
    if spec == "random":
        return RandomPolicy(action_space())
    if spec == "cartpole-heuristic":
        return CartPoleHeuristic()
    expected = (
        "expected package.module:Name, path/to/file.py:Name, or a built-in "
        f"({', '.join(BUILTIN_POLICIES)})"
    )
    policy = load_object(spec, "policy", expected)
    name = spec.rpartition(":")[2]
    if isinstance(policy, type):
        if not issubclass(policy, Model):
            raise UsageError(
                f"policy {spec!r}: {name} is a class but not a rlmesh.Model subclass; expected "
                "a Model subclass, a Model instance or a function fn(obs) -> action"
            )
        try:
            return policy()
        except Exception as exc:
            raise UsageError(
                f"policy {spec!r}: {name}() failed: {type(exc).__name__}: {exc}; a Model "
                "subclass given by name must construct without arguments"
            ) from None
    if not callable(policy) and not isinstance(policy, Model):
        raise UsageError(
            f"policy {spec!r}: {name} is a {type(policy).__name__}; expected a Model subclass, "
            "a Model instance or a function fn(obs) -> action"
        )
    return policy


def policy_identity(spec: str) -> tuple[str, str | None]:
    """How a results file records the policy ``spec`` names: ``(name, sha256 of its source)``.

    A file path is resolved, so ``./pols.py:parity`` and ``pols.py:parity`` are one policy;
    ``module:Name`` stays as given and its hash is of the module's source file; a built-in has
    no source file (None). A resume refuses a file whose hash differs (the policy's code
    changed) unless ``--allow-changed-policy``. Call it after ``load_policy`` succeeded.

    Example:
        >>> policy_identity("random")
        ('random', None)
    """
    if spec in BUILTIN_POLICIES:
        return spec, None
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        source: str | None = str(Path(target).resolve())
        spec = f"{source}:{name}"
    else:
        source = getattr(importlib.import_module(target), "__file__", None)
    if source is None:  # a namespace package: no file holds its code
        return spec, None
    return spec, hashlib.sha256(Path(source).read_bytes()).hexdigest()


@contextlib.contextmanager
def current_directory_on_path() -> Iterator[None]:
    """Let ``POLICY`` and ``--env`` name modules in the current directory, as ``python -m``
    does (an installed ``rlmesh`` script starts with its own directory on ``sys.path``); the
    entry is taken off again afterwards, for callers of ``main`` in a longer-lived process."""
    here = os.getcwd()
    if any(entry in ("", ".", here) for entry in sys.path):
        yield
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        if here in sys.path:
            sys.path.remove(here)


# ---------------------------------------------------------------------------- argument checks


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**64), got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _reward_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a number such as 475, got {text!r}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"is not valid JSON ({exc}); expected an object such as '{{\"g\": 9.81}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"g\": 9.81}}', got {text!r}"
        )
    return value


def read_seeds(path: str) -> list[int]:
    """The seeds in ``path``: non-negative integers separated by whitespace or commas."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--seeds {path}: cannot read it ({exc.strerror})") from None
    seeds = []
    for number, line in enumerate(text.splitlines(), start=1):
        for token in line.replace(",", " ").split():
            if not token.isdigit():
                raise UsageError(
                    f"--seeds {path}, line {number}: {token!r} is not a non-negative integer; "
                    "expected integer seeds separated by whitespace, commas or newlines"
                )
            seeds.append(int(token))
    if not seeds:
        raise UsageError(f"--seeds {path} holds no seeds; expected at least one integer")
    return seeds


def check_env(env_id: str) -> None:
    """Refuse an env id Gymnasium does not know, before anything runs.

    ``module:Id`` imports ``module`` first (as ``gymnasium.make`` does), for envs registered on
    import.
    """
    module, _, name = env_id.rpartition(":")
    expected = (
        "expected a registered Gymnasium id such as CartPole-v1 (or module:Id for an env its "
        "module registers)"
    )
    try:
        if module:
            importlib.import_module(module)
    except Exception as exc:
        raise UsageError(
            f"--env {env_id!r}: importing {module} failed: {type(exc).__name__}: "
            f"{str(exc).rstrip('.')}; {expected}"
        ) from None
    try:
        gym.spec(name)
    except Exception as exc:
        raise UsageError(f"--env {env_id!r}: {str(exc).rstrip('.')}; {expected}") from None


# ---------------------------------------------------------------------------- progress


class _Progress:
    """The live progress bar (rich, on stderr), or nothing when disabled."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.bar = None
        self.total = total
        self.rewards: list[float] = []
        self.successes: list[bool] = []  # the episodes with a verdict (success available)
        self.enabled = enabled
        self.lane_steps_per_s: float | None = None

    def start(self, done: Sequence[EpisodeResult]) -> None:
        """Show the bar, counting the episodes a resumed results file already holds."""
        self.rewards = [episode.reward for episode in done]
        self.successes = [episode.success for episode in done if episode.success is not None]
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("<"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("eval", total=self.total, completed=len(done), status="")
        self.bar.start()

    def add_done(self, done: Sequence[EpisodeResult]) -> None:
        """Count the episodes a resumed file already holds of a suite's next task."""
        self.rewards += [episode.reward for episode in done]
        self.successes += [episode.success for episode in done if episode.success is not None]
        self._update(advance=len(done))

    def episode(self, episode: EpisodeResult) -> None:
        self.rewards.append(episode.reward)
        if episode.success is not None:
            self.successes.append(episode.success)
        self._update(advance=1)

    def throughput(self, lane_steps_per_s: float) -> None:
        self.lane_steps_per_s = lane_steps_per_s
        self._update(advance=0)

    def status(self) -> str:
        """The bar's text: throughput, mean reward, and the success rate (n/a when success is
        not available)."""
        rate = "-" if self.lane_steps_per_s is None else f"{self.lane_steps_per_s:,.0f}"
        reward = f"{np.mean(self.rewards):.2f}" if self.rewards else "-"
        success = f"{np.mean(self.successes):.1%}" if self.successes else "n/a"
        return f"{rate} lane-steps/s  reward {reward}  success {success}"

    def _update(self, advance: int) -> None:
        if self.bar is None:
            return
        self.bar.update(self.task, advance=advance, status=self.status())

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class _EpisodeSink(RunHooks):
    """Shows each completed episode in the progress bar (the driver writes the results file)."""

    def __init__(self, progress: _Progress) -> None:
        self.progress = progress

    def on_run_start(self, context: dict[str, Any]) -> None:
        self.progress.start(context["completed_episodes"])

    def on_episode_end(self, result: EpisodeResult) -> None:
        self.progress.episode(result)


class _SuiteEpisodeSink(_EpisodeSink):
    """One progress bar across a suite's tasks, each task's run starting where it stands."""

    started = False

    def on_run_start(self, context: dict[str, Any]) -> None:
        if self.started:
            self.progress.add_done(context["completed_episodes"])
        else:
            self.started = True
            super().on_run_start(context)


class _Throughput(RuntimeHooks):
    """Lane-steps per second from each telemetry window, for the progress bar."""

    def __init__(self, progress: _Progress) -> None:
        self.progress = progress

    def telemetry_snapshot(self, rows: Sequence[Any]) -> None:
        for row in rows:
            if row.op == "driver" and row.metric == "lane-steps" and row.avg == row.avg:
                self.progress.throughput(row.avg)


# ---------------------------------------------------------------------------- commands


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
    from .cluster import require_ray

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


def _evaluated(
    args: argparse.Namespace, progress: _Progress, evaluate: Callable[..., Any], *a: Any, **kw: Any
) -> tuple[int, Any]:
    """``evaluate(*a, **kw)`` (``run`` or ``run_suite``) as eval runs it: ``(status, result)``,
    the result partial when the run failed (EXIT_FAILED, said on stderr) and None when it was
    interrupted (EXIT_INTERRUPTED); a UsageError for what the user gave wrong."""
    try:
        return EXIT_OK, _interruptible(evaluate, *a, **kw)
    except ResultsFileError as exc:
        raise UsageError(str(exc)) from None
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
        print(f"rlmesh: error: {exc}", file=sys.stderr)
        return EXIT_FAILED, getattr(exc, "partial_result", None)
    finally:
        progress.stop()


def _eval(args: argparse.Namespace, argv: Sequence[str]) -> int:
    cluster = _cluster_arguments(args)
    if args.suite is not None:
        return _eval_suite(args, argv, cluster)
    if args.tasks is not None:
        raise UsageError("rlmesh eval: error: --tasks needs --suite FILE, the suite to choose from")
    if args.env is None:
        raise UsageError(
            "rlmesh eval: error: the following arguments are required: --env (or --suite FILE)"
        )
    check_env(args.env)
    _check_video_options(args)
    seeds = read_seeds(args.seeds) if args.seeds is not None else None
    episodes = args.episodes or (len(seeds) if seeds is not None else 100)
    base_seed = 0 if args.seed is None else args.seed
    core = args.core or core_name()

    def action_space() -> gym.Space:
        env = gym.make(args.env, **args.env_kwargs)
        try:
            return env.action_space
        finally:
            env.close()

    if is_address(args.policy):  # a served model
        try:
            policy = _served_policy(args.policy, args.policy_token)
        except RlmeshError as exc:
            print(f"rlmesh: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        policy_name, policy_sha256 = args.policy, None
    else:
        try:
            policy = load_policy(args.policy, action_space)
        except gym.error.Error as exc:  # making the env for `random` failed: bad --env-kwargs
            raise UsageError(f"--env-kwargs for {args.env}: {exc}") from None
        except TypeError as exc:
            raise UsageError(f"--env-kwargs for {args.env}: {exc}") from None
        policy_name, policy_sha256 = policy_identity(args.policy)
    timeouts = _timeouts(args)
    progress = _Progress(
        episodes, enabled=not args.no_progress and not args.json and sys.stderr.isatty()
    )
    # One env per lane; a partial of gym.make pickles, so worker processes can build them too.
    env = (
        args.env
        if not args.env_kwargs
        else functools.partial(gym.make, args.env, **args.env_kwargs)
    )
    status, result = _evaluated(
        args,
        progress,
        driver.run,
        # A cluster's workers load the policy by its name, as this process did.
        policy if not cluster else args.policy,
        env,
        seeds=seeds,
        episodes=episodes,
        seed=base_seed,
        num_envs=args.num_envs,
        workers=args.workers,
        restart_workers=args.restart_workers,
        pipeline=args.pipeline,
        execution_horizon=args.horizon,
        max_episode_steps=args.max_episode_steps,
        max_episode_seconds=args.max_episode_seconds,
        timeouts=timeouts or None,
        on_error=args.on_error,
        max_retries=args.max_retries,
        hooks=[_EpisodeSink(progress), _Throughput(progress)],
        core=core,
        results_path=args.out,
        resume=args.resume,
        allow_changed_policy=args.allow_changed_policy,
        record_video=args.record_video,
        video_dir=args.video_dir,
        video_key=args.video_key,
        # From the id: with --env-kwargs the env is a factory, whose spec comes late.
        success=rule_for(args.success_reward, args.env),
        # The results file's header records these too, and a resume must match them.
        run_info={
            "env": args.env,
            "policy": policy_name,
            "policy_sha256": policy_sha256,
            "env_kwargs": args.env_kwargs,
        },
        # Recorded in the header's auditable record, not checked on resume.
        provenance={"policy": args.policy, "command": ["rlmesh", *argv]},
        **cluster,
    )
    if status == EXIT_INTERRUPTED:
        _interrupted(args, argv)
        return status
    report = getattr(result, "cluster", None)
    if args.out is not None:
        _, result, _ = read_run(args.out)
    elif result is None:
        return status
    summary = result.summary()
    if report is not None and args.json:
        summary["cluster"] = report.to_dict()
    _print_summary(summary, as_json=args.json)
    if report is not None and not args.json:
        print(report.format())
    return status


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


def _eval_suite(args: argparse.Namespace, argv: Sequence[str], cluster: dict[str, Any]) -> int:
    """``rlmesh eval POLICY --suite FILE [--tasks a,b]``: every task (or those named), one
    after another, into one results file; the per-task and overall summary."""
    from .suites import checked_suite, load_suite, run_suite

    given = [option for name, option in PER_TASK_OPTIONS if getattr(args, name)]
    if given:
        raise UsageError(
            f"rlmesh eval: error: {', '.join(given)} cannot go with --suite: a suite sets "
            f"{'it' if len(given) == 1 else 'them'} per task, in its [[task]] tables"
        )
    only = None
    if args.tasks is not None:
        only = [name.strip() for name in args.tasks.split(",") if name.strip()]
    try:
        suite = load_suite(args.suite)
    except ValueError as exc:
        raise UsageError(f"--suite {exc}") from None
    try:
        suite, chosen = checked_suite(suite, only)
    except ValueError as exc:
        raise UsageError(f"--tasks {args.tasks}: {exc} (in {args.suite})") from None
    for task in chosen:
        try:
            check_env(task.env)
        except UsageError as exc:
            raise UsageError(f"--suite {args.suite}, task {task.name!r}: {exc}") from None
    if is_address(args.policy):
        try:
            policy = _served_policy(args.policy, args.policy_token)
        except RlmeshError as exc:
            print(f"rlmesh: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        policy_name, policy_sha256 = args.policy, None
    else:
        # No one action space: a random policy takes each task's from its run.
        policy = load_policy(args.policy, lambda: None)
        policy_name, policy_sha256 = policy_identity(args.policy)
    timeouts = _timeouts(args)
    progress = _Progress(
        sum(task.episodes for task in chosen),
        enabled=not args.no_progress and not args.json and sys.stderr.isatty(),
    )
    status, result = _evaluated(
        args,
        progress,
        run_suite,
        policy if not cluster else args.policy,
        suite,
        only=[task.name for task in chosen],
        num_envs=args.num_envs,
        workers=args.workers,
        restart_workers=args.restart_workers,
        pipeline=args.pipeline,
        execution_horizon=args.horizon,
        timeouts=timeouts or None,
        on_error=args.on_error,
        max_retries=args.max_retries,
        hooks=[_SuiteEpisodeSink(progress), _Throughput(progress)],
        core=args.core or core_name(),
        results_path=args.out,
        resume=args.resume,
        allow_changed_policy=args.allow_changed_policy,
        record_video=args.record_video,
        video_dir=args.video_dir,
        video_key=args.video_key,
        success=args.success_reward,
        run_info={"policy": policy_name, "policy_sha256": policy_sha256},
        provenance={"policy": args.policy, "command": ["rlmesh", *argv]},
        **cluster,
    )
    if status == EXIT_INTERRUPTED:
        _interrupted(args, argv)
        return status
    if result is None:
        return status
    summary = result.summary()
    if args.out is not None:  # every task the file holds, as `rlmesh report` shows it
        summary = _suite_file_summary(args.out)
    print(dumps(summary) if args.json else format_suite_summary(summary))
    return status


def _suite_file_summary(path: str) -> dict[str, Any]:
    """The summary of every task of a suite's file, a task never started included."""
    return summarize_suite(read_suite_columns(path)[1])


def _served_policy(address: str, token: str | None) -> Any:
    """``rlmesh.RemoteModel(address)``: needs the remote extra."""
    from .remote import require_grpc

    try:
        require_grpc("RemoteModel")
    except ImportError as exc:
        raise UsageError(f"policy {address!r} is a served model: {exc}") from None
    from .remote.model_client import RemoteModel

    return RemoteModel(address, token=token)


def _serve_model(args: argparse.Namespace) -> int:
    """Serve ``args.policy`` until SIGINT / SIGTERM (or an accepted Shutdown call)."""
    from .remote import require_grpc

    try:
        require_grpc("serve_model")
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    from .remote.model_server import serve_model

    def no_action_space() -> gym.Space:
        raise UsageError(
            "rlmesh serve model: the random policy needs an env's action space; serve a Model "
            "subclass, a Model instance or a function fn(obs) -> action"
        )

    policy = load_policy(args.policy, no_action_space)
    try:
        server = serve_model(
            policy,
            args.address,
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            token=args.token,
            max_message_mb=args.max_message_mb,
            allow_shutdown=args.allow_shutdown,
        )
    except ValueError as exc:  # a malformed address
        raise UsageError(f"rlmesh serve model: {exc}") from None
    except RlmeshError as exc:  # the address cannot be bound, or the model failed to load
        print(f"rlmesh: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return _serve_until_stopped(server, f"rlmesh: serving model {args.policy} at {server.address}")


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


def _report(args: argparse.Namespace) -> int:
    from .provenance import format_provenance, provenance_segments

    try:
        header, columns, resumes = read_columns_with_resumes(args.file)
        suite = SUITE_KEY in header  # a suite's file: per task and overall
        summary = _suite_file_summary(args.file) if suite else summarize(columns)
    except OSError as exc:
        raise UsageError(f"{args.file}: cannot read it ({exc.strerror})") from None
    except ResultsFileError as exc:
        raise UsageError(str(exc)) from None
    # An unfinished file (a crash, an interrupt) says so: "6 of 10, incomplete".
    table = format_suite_summary(summary) if suite else format_summary(summary)
    # The auditable record of each run segment (rlmesh.provenance), after the figures.
    segments = provenance_segments(header, resumes)
    if args.json:
        print(dumps({**summary, "provenance": segments}))
    else:
        print(table + "\n\n" + format_provenance(segments))
    if args.html is not None:
        _write_html(args)
    return EXIT_OK


def _write_html(args: argparse.Namespace) -> None:
    """``rlmesh report FILE --html OUT``: the self-contained HTML report (the report extra)."""
    from .report.html import write_html

    try:
        write_html(args.file, args.html)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--html {args.html}: cannot write it ({exc.strerror})") from None
    print(f"rlmesh: wrote {args.html}", file=sys.stderr)


def _compare(args: argparse.Namespace) -> int:
    from .report.compare import RunsNotPairedError, compare, format_comparison

    try:
        comparison = compare(
            args.a,
            args.b,
            confidence=args.confidence,
            resamples=args.resamples,
            seed=args.seed,
            intersection=args.intersection,
        )
    except (ResultsFileError, RunsNotPairedError) as exc:
        raise UsageError(f"rlmesh compare: error: {exc}") from None
    print(dumps(comparison) if args.json else format_comparison(comparison))
    return EXIT_OK


def _confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1) such as 0.95, got {text!r}")
    return value


def _print_summary(summary: dict[str, Any], *, as_json: bool) -> None:
    print(dumps(summary) if as_json else format_summary(summary))


# ---------------------------------------------------------------------------- the parser


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


def _add_run_options(parser: argparse.ArgumentParser, *, episodes: int | None) -> None:
    parser.add_argument(
        "--num-envs", type=_positive_int, default=None, help="lanes run in parallel (default 1)"
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        metavar="W",
        help="worker processes stepping the lanes (default 1: the lanes run in this process); "
        "with --ray, the Ray workers running windows of episodes at once (default: one per CPU)",
    )
    parser.add_argument(
        "--restart-workers",
        type=_non_negative_int,
        default=0,
        help="restart a worker that dies up to this many times, replaying its episodes "
        "(needs --workers 2 or more; default 0)",
    )
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="overlap the model with the workers stepping: each worker's lanes go on as soon "
        "as it has stepped (needs --workers 2 or more; same results for a per-lane model)",
    )
    parser.add_argument(
        "--episodes",
        type=_positive_int,
        default=episodes,
        help=f"episodes to score (default {episodes or 'len(seeds), else 100'})",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--core", choices=("rust", "python"), help="the core (default: active)")


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the episodes across a Ray cluster: join ADDRESS ('auto', 'host:6379', "
        "'ray://host:10001'), or without one start a local Ray instance with this machine's "
        "CPUs (needs the ray extra)",
    )
    parser.add_argument(
        "--ray-mode",
        choices=RAY_MODES,
        help="with --ray, how the workers run their windows: 'tasks', a Ray task a window whose "
        "run loads the model (default), or 'actors', --workers long-lived Ray actors that load "
        "the model once each (Model.load), for a model that is expensive to load",
    )


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="rlmesh",
        description="Evaluate RL agents and robot policies on Gymnasium environments.",
        epilog="example:\n  rlmesh eval random --env CartPole-v1 --episodes 20 --num-envs 4",
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"rlmesh {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    evaluate = commands.add_parser(
        "eval",
        help="evaluate a policy",
        description="Evaluate POLICY on an environment and print the summary.",
        epilog="example:\n  rlmesh eval my_policy.py:Policy --env CartPole-v1 --num-envs 8 "
        "--episodes 100 --out results.jsonl",
        formatter_class=formatter,
    )
    evaluate.add_argument(
        "policy",
        metavar="POLICY",
        help="package.module:Name, path/to/file.py:Name (a Model subclass, a Model instance or "
        f"a callable), a built-in: {', '.join(BUILTIN_POLICIES)}, or the address of a served "
        "model (tcp://host:port, host:port, unix:///path)",
    )
    evaluate.add_argument(
        "--policy-token", metavar="T", help="the bearer token of a served POLICY (an address)"
    )
    evaluate.add_argument("--env", help="a Gymnasium id, e.g. CartPole-v1")
    evaluate.add_argument(
        "--suite",
        metavar="FILE",
        help="evaluate every task of a suite's TOML file instead of one --env (each [[task]] "
        "sets its env, env_kwargs, episodes, seed and caps)",
    )
    evaluate.add_argument(
        "--tasks", metavar="A,B", help="with --suite: run only these tasks (comma-separated)"
    )
    evaluate.add_argument(
        "--env-kwargs", type=_json_object, default={}, help="JSON object for gymnasium.make"
    )
    seeding = evaluate.add_mutually_exclusive_group()
    seeding.add_argument(
        "--seed", type=_seed, help="base seed in [0, 2**64): episode k uses episode_seed(S, k)"
    )
    seeding.add_argument("--seeds", metavar="FILE", help="one integer seed per episode")
    evaluate.add_argument(
        "--horizon", type=_positive_int, default=1, help="actions replayed per predicted chunk"
    )
    evaluate.add_argument(
        "--max-episode-steps", type=_positive_int, help="truncate episodes at this many steps"
    )
    evaluate.add_argument(
        "--max-episode-seconds",
        type=_positive_seconds,
        metavar="S",
        help="truncate episodes at this many seconds of wall clock",
    )
    for op, what in (("step", "env.step"), ("reset", "env.reset"), ("predict", "model call")):
        evaluate.add_argument(
            f"--timeout-{op}",
            type=_positive_seconds,
            metavar="S",
            help=f"fail the run (exit 1) when one {what} takes longer than S seconds",
        )
    evaluate.add_argument(
        "--on-error",
        choices=ON_ERRORS,
        default="raise",
        help="when an env raises in reset or step: fail the run (raise, the default), record "
        "the episode as failed and go on with the env rebuilt (record), or play the same "
        "episode again with its seed up to --max-retries times, then record it (retry)",
    )
    evaluate.add_argument(
        "--max-retries",
        type=_non_negative_int,
        metavar="N",
        help="times a failed part of the run is run again (default 3): with --on-error retry, "
        "an episode whose env failed (then it is recorded failed); with --ray, a window whose "
        "worker died, elsewhere with the same seeds (then the run fails)",
    )
    evaluate.add_argument(
        "--success-reward",
        type=_reward_threshold,
        metavar="R",
        help="an episode whose env reports no is_success/success succeeds iff its reward >= R "
        "(default: the env spec's reward_threshold, else success is n/a)",
    )
    evaluate.add_argument("--out", metavar="FILE", help="write results, one JSON line each")
    evaluate.add_argument(
        "--resume", action="store_true", help="continue the run in --out, adding missing episodes"
    )
    evaluate.add_argument(
        "--allow-changed-policy",
        action="store_true",
        help="with --resume: continue although the policy's source file changed (recorded)",
    )
    evaluate.add_argument(
        "--record-video",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="record the episodes of index 0..K-1 to mp4 files, linked from their results "
        "(needs the video extra)",
    )
    evaluate.add_argument(
        "--video-dir",
        metavar="DIR",
        help="where --record-video writes (default: <--out stem>_videos/ beside --out)",
    )
    evaluate.add_argument(
        "--video-key",
        metavar="KEY",
        help="with --record-video: take the frames from this image key of the observation "
        "('observation': the whole observation) instead of render() in rgb_array mode",
    )
    _add_cluster_options(evaluate)
    _add_run_options(evaluate, episodes=None)

    demo = commands.add_parser(
        "demo",
        help="a built-in CartPole heuristic over 8 lanes and 100 episodes",
        description="Evaluate a built-in CartPole heuristic: nothing to write, nothing to set.",
        epilog="example:\n  rlmesh demo --episodes 20",
        formatter_class=formatter,
    )
    _add_run_options(demo, episodes=100)

    report = commands.add_parser(
        "report",
        help="the summary of a results file",
        description="Print the summary table of a results file written by `rlmesh eval --out`, "
        "and the provenance of each run segment (versions, host, command line, git revision).",
        epilog="example:\n  rlmesh report results.jsonl --html report.html",
        formatter_class=formatter,
    )
    report.add_argument("file", metavar="FILE", help="a results file (JSON lines)")
    report.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    report.add_argument(
        "--html",
        metavar="OUT",
        help="also write a self-contained HTML report to OUT: tables, plots, videos, metadata "
        "(needs the report extra)",
    )

    paired = commands.add_parser(
        "compare",
        help="policy B against policy A on the same episodes",
        description="Compare two results files of runs with the same seeds, episode by episode\n"
        "(matched by task, index and seed): the paired difference B - A in mean return with\n"
        "a paired bootstrap CI, in success rate with Newcombe's paired interval and McNemar's\n"
        "exact test, per task and overall, and how many episodes each policy won.",
        epilog="example:\n  rlmesh compare baseline.jsonl candidate.jsonl --json",
        formatter_class=formatter,
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
        type=_confidence,
        metavar="C",
        default=0.95,
        help="the intervals' level (0.95)",
    )
    paired.add_argument(
        "--resamples",
        type=_positive_int,
        metavar="N",
        default=10_000,
        help="bootstrap resamples (10000)",
    )
    paired.add_argument(
        "--seed", type=_non_negative_int, default=0, metavar="S", help="the bootstrap's seed (0)"
    )
    paired.add_argument("--json", action="store_true", help="print everything as one JSON object")

    describe = commands.add_parser(
        "describe",
        help="the plan pairing a policy's spec with an env",
        description="Print how POLICY's spec is fitted to the env (by key, or by role against "
        "the env's tags) and the plan's advisories, without running an episode.",
        epilog="example:\n  rlmesh describe --env my_env.py:make_env --tags tags.json "
        "--model my_policy.py:Policy",
        formatter_class=formatter,
    )
    describe.add_argument(
        "--env", required=True, help="a Gymnasium id, package.module:make_env or file.py:make_env"
    )
    describe.add_argument(
        "--env-kwargs", type=_json_object, default={}, help="JSON object for gymnasium.make"
    )
    describe.add_argument(
        "--tags",
        metavar="FILE",
        help="the env's tags, adapters-v1 JSON (default: the env's "
        'metadata["rlmesh.adapters.v1.env_io_spec"])',
    )
    describe.add_argument(
        "--model", required=True, metavar="POLICY", help="the policy, as for rlmesh eval"
    )

    serve = commands.add_parser(
        "serve",
        help="serve an env or a model over rlmesh-wire-v1",
        description="Serve an env or a model (gRPC, rlmesh-wire-v1) until SIGINT or SIGTERM.",
        formatter_class=formatter,
    )
    served = serve.add_subparsers(dest="served", metavar="WHAT", parser_class=_Parser)
    _add_serve_env(served, formatter)
    serve_model = served.add_parser(
        "model",
        help="serve a policy",
        description="Serve POLICY on ADDR; evaluate it with `rlmesh eval ADDR --env ID`.",
        epilog="example:\n  rlmesh serve model my_policy.py:Policy --address 127.0.0.1:50051",
        formatter_class=formatter,
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
        "--max-batch", type=_positive_int, metavar="N", help="most rows per model call"
    )
    serve_model.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        metavar="W",
        help="how long a predict waits for other drivers' predicts to batch with (default 2)",
    )
    serve_model.add_argument("--token", metavar="T", help="require this bearer token")
    serve_model.add_argument(
        "--max-message-mb", type=float, default=64.0, metavar="M", help="largest message (64)"
    )
    serve_model.add_argument(
        "--allow-shutdown", action="store_true", help="accept the Shutdown call"
    )
    return parser


def _add_serve_env(served: Any, formatter: type[argparse.HelpFormatter]) -> None:
    serve_env = served.add_parser(
        "env",
        help="serve an env",
        description="Serve an env; prints one line with the address it listens on.",
        epilog="example:\n  rlmesh serve env CartPole-v1 --address 127.0.0.1:50051 --num-envs 8",
        formatter_class=formatter,
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
        "--num-envs", type=_positive_int, default=None, help="lanes served (default 1)"
    )
    serve_env.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="W",
        help="step the lanes in W worker processes, built there from the id or factory "
        "(default 1: in this process)",
    )
    serve_env.add_argument("--token", help="require this bearer token of every client")
    serve_env.add_argument(
        "--max-message-mb",
        type=_positive_seconds,
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


def load_env(spec: str) -> Any:
    """What ``rlmesh serve env`` serves: an env factory (``module:fn`` or ``file.py:fn``) or
    a Gymnasium id (``CartPole-v1``, ``module:Id``), told apart by whether ``fn`` exists."""
    target, _, name = spec.rpartition(":")
    factory = target.endswith(".py")
    if target and not factory:
        try:
            factory = hasattr(importlib.import_module(target), name)
        except Exception:  # check_env says what is wrong with the module
            factory = False
    if not factory:
        check_env(spec)
        return spec
    made = load_object(
        spec, "env", "expected a Gymnasium id, package.module:make_env or file.py:make_env"
    )
    if not callable(made):
        raise UsageError(
            f"env {spec!r}: {name} is a {type(made).__name__}; expected a zero-argument "
            f"function returning a gymnasium.Env"
        )
    return made


def read_tags(path: str) -> Any:
    """The ``EnvTags`` in the adapters-v1 JSON file ``--tags path``; a UsageError if it cannot
    be read, a SpecError naming the file if it is not valid tags."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--tags {path!r}: {exc.strerror}") from None
    return checked_env_tags(f"--tags {path}", text)


def _describe(args: argparse.Namespace) -> int:
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
        print(f"rlmesh: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(plan.describe())
    for advisory in plan.advisories():
        print(f"advisory: {advisory}")
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
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
    from .lanes import make_lanes
    from .remote import require_grpc
    from .remote.address import parse_address

    try:
        parse_address(args.address)
        require_grpc("serve_env")
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--address {args.address!r}: {exc}") from None
    from .remote.env_server import serve_env

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


def _demo_args(args: argparse.Namespace) -> argparse.Namespace:
    """The demo is ``eval cartpole-heuristic --env CartPole-v1 --num-envs 8 --episodes 100``."""
    options = {**vars(args), "num_envs": args.num_envs or 8}
    return argparse.Namespace(
        **options,
        policy="cartpole-heuristic",
        env="CartPole-v1",
        suite=None,
        tasks=None,
        env_kwargs={},
        seed=None,
        seeds=None,
        horizon=1,
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
                if args.resume and args.out is None:
                    raise UsageError("rlmesh eval: error: --resume needs --out FILE to resume")
                return _eval(args, argv)
            if args.command == "demo":
                return _eval(_demo_args(args), argv)
            if args.command == "report":
                return _report(args)
            if args.command == "compare":
                return _compare(args)
            if args.command == "describe":
                return _describe(args)
            if args.command == "serve":
                return _serve(args)
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
