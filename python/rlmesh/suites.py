"""Suites: several tasks (an env, its kwargs, episodes, seed, caps) evaluated as one.

A suite is plain data: a list of ``Task`` or a TOML file (``load_suite``), from which no code
runs. ``run_suite`` runs each task with ``rlmesh.run``, one after another, so every task's
episodes are exactly a solo ``rlmesh.run`` of that task's; every other argument (lanes, worker
processes, a Ray cluster, hooks, timeouts) means what it means to ``rlmesh.run``. With
``results_path`` one file holds the whole suite: its header lists the tasks, each task's run
adds a task header line, its episodes (``EpisodeResult.task`` set) and run segments, so
``resume=True`` runs only what is missing, per (task, index).

The TOML form (``[defaults]`` applies to every task; a task's own keys win)::

    name = "classic-control"          # optional

    [defaults]
    episodes = 20
    seed = 0

    [[task]]
    name = "cartpole"
    env = "CartPole-v1"

    [[task]]
    name = "pendulum-heavy"
    env = "Pendulum-v1"
    env_kwargs = { g = 12.0 }
    max_episode_steps = 100

Example:
    >>> import rlmesh
    >>> tasks = [rlmesh.Task("balance", "CartPole-v1", episodes=3, max_episode_steps=20),
    ...          rlmesh.Task("swing", "Pendulum-v1", episodes=2, max_episode_steps=10)]
    >>> suite = rlmesh.run_suite(lambda obs: obs[:1] * 0, tasks[1:])
    >>> [episode.task for episode in suite["swing"].episodes]
    ['swing', 'swing']
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import gymnasium as gym
import numpy as np

from .api import evaluate, run_to_end, view_options
from .core import core_name
from .provenance import PROVENANCE_KEY, collect_provenance
from .results import SUITE_KEY, ResultsFile, RunResult
from .settings import RunSettings, check_argument_names, run_settings
from .version import __version__
from .view import open_view

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, published before it joined the standard library
    import tomli as tomllib

DEFAULT_EPISODES = 100
"""A task's episodes when it names neither ``episodes`` nor ``seeds`` (as ``rlmesh eval``)."""

TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a task's name may be: it names the task in results files, ``--tasks a,b`` and file
names (videos), so letters, digits, ``_``, ``.`` and ``-``, at most 64, not starting with a
punctuation mark."""

# What rlmesh.run takes that a task sets itself: run_suite refuses them as shared arguments.
PER_TASK_ARGUMENTS = frozenset(
    {
        "env",
        "env_kwargs",
        "episodes",
        "seed",
        "seeds",
        "max_episode_steps",
        "max_episode_seconds",
        "trial_index_base",
    }
)


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _plain(value: Any) -> bool:
    """Whether ``value`` is data a results header can hold (what TOML and JSON share)."""
    if isinstance(value, (str, bool)) or _integer(value):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


@dataclass(frozen=True)
class Task:
    """One task of a suite: the per-task settings of ``rlmesh.run``, as plain data.

    Args:
        name: the task's name (``TASK_NAME``: letters, digits, ``_ . -``; unique in a suite).
        env: a Gymnasium id (``"CartPole-v1"``, or ``"module:Id"`` for an env its module
            registers on import).
        env_kwargs: keyword arguments of ``gymnasium.make`` (strings, numbers, booleans,
            lists and tables).
        episodes: episodes to score (default ``len(seeds)``, else 100).
        seed: the base seed: episode k resets with ``episode_seed(seed, trial_index_base + k)``.
        max_episode_steps, max_episode_seconds: truncate an episode (``rlmesh.run``'s caps).
        seeds: explicit per-episode seeds instead of ``seed``.
        trial_index_base: the global index of episode 0 (a shard of a larger task).
        success_reward: an episode whose env reports no success succeeds iff its reward >= R
            (default: the run's ``success=``, else the env spec's ``reward_threshold``).

    Raises:
        ValueError: a field of the wrong type or out of range; the message names the task,
            the field, what it was and what was expected.

    Example:
        >>> Task("cartpole", "CartPole-v1", episodes=10).to_dict()["episodes"]
        10
        >>> Task("cart pole", "CartPole-v1")
        Traceback (most recent call last):
        ...
        ValueError: task 'cart pole': name is 'cart pole'; expected ...
    """

    name: str
    env: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    episodes: int | None = None
    seed: int = 0
    max_episode_steps: int | None = None
    max_episode_seconds: float | None = None
    seeds: tuple[int, ...] | None = None
    trial_index_base: int = 0
    success_reward: float | None = None

    def __post_init__(self) -> None:
        where = f"task {self.name!r}"
        for name, value in _checked_fields(asdict(self), where).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """The task as plain data, what a suite's results file records of it."""
        data = asdict(self)
        data["seeds"] = None if self.seeds is None else list(self.seeds)
        return data

    def make_env(self) -> Any:
        """What ``rlmesh.run`` gets as its env: the id, or with ``env_kwargs`` a picklable
        factory of ``gymnasium.make(env, **env_kwargs)`` (worker processes and Ray workers
        build their envs from it)."""
        if not self.env_kwargs:
            return self.env
        return functools.partial(gym.make, self.env, **self.env_kwargs)

    def run_arguments(self) -> dict[str, Any]:
        """The task's keyword arguments of ``rlmesh.run`` (but the env): what a task sets of
        a run (``PER_TASK_ARGUMENTS``)."""
        return {
            "episodes": self.episodes,
            "seed": self.seed,
            "seeds": None if self.seeds is None else list(self.seeds),
            "max_episode_steps": self.max_episode_steps,
            "max_episode_seconds": self.max_episode_seconds,
            "trial_index_base": self.trial_index_base,
        }

    def settings(self, shared: RunSettings) -> RunSettings:
        """The task's run: ``shared`` (the suite's settings, the same for every task) with the
        task's own part set: its episodes and seeds, its caps (``run_arguments``), and its
        success rule (``success_reward``, else the shared one). The shared ``indices`` (which
        of the task's episodes to play; None: all) stay.

        Example:
            >>> from rlmesh.settings import run_settings
            >>> task = Task("short", "CartPole-v1", episodes=3, seed=7, max_episode_steps=9)
            >>> settings = task.settings(run_settings(num_envs=2, indices=[1, 2]))
            >>> settings.episodes.count, settings.episodes.indices
            (3, [1, 2])
            >>> settings.limits.max_episode_steps
            9
        """
        own = run_settings(**self.run_arguments())
        return replace(
            shared,
            episodes=replace(own.episodes, indices=shared.episodes.indices),
            limits=replace(
                shared.limits,
                max_episode_steps=own.limits.max_episode_steps,
                max_episode_seconds=own.limits.max_episode_seconds,
            ),
            success=shared.success if self.success_reward is None else self.success_reward,
        )


TASK_KEYS = tuple(item.name for item in fields(Task))


def _checked_fields(values: dict[str, Any], where: str) -> dict[str, Any]:
    """A task's fields checked (``where`` names it in errors), with ``episodes`` resolved."""

    def bad(key: str, expected: str) -> ValueError:
        return ValueError(f"{where}: {key} is {values[key]!r}; expected {expected}")

    name, env = values["name"], values["env"]
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise bad(
            "name",
            "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    if not isinstance(env, str) or not env:
        raise bad("env", "a Gymnasium id such as 'CartPole-v1' (or 'module:Id')")
    kwargs = values["env_kwargs"]
    if not isinstance(kwargs, Mapping) or not _plain(dict(kwargs)):
        raise bad(
            "env_kwargs",
            "a table of gymnasium.make's keyword arguments: strings, numbers, booleans, "
            "arrays and tables",
        )
    seeds = values["seeds"]
    if seeds is not None:
        if (
            isinstance(seeds, (str, bytes))
            or not isinstance(seeds, Sequence)
            or not seeds
            or not all(_integer(s) and 0 <= s < 2**64 for s in seeds)
        ):
            raise bad("seeds", "a non-empty list of integer seeds in [0, 2**64)")
        seeds = tuple(int(s) for s in seeds)
    episodes = values["episodes"]
    if episodes is None:
        episodes = len(seeds) if seeds is not None else DEFAULT_EPISODES
    elif not _integer(episodes) or episodes < 1:
        raise bad("episodes", "a positive integer")
    if seeds is not None and episodes > len(seeds):
        raise ValueError(
            f"{where}: episodes is {episodes} but seeds lists {len(seeds)}; expected at most "
            "one episode per seed"
        )
    seed = values["seed"]
    if not _integer(seed) or not 0 <= seed < 2**64:
        raise bad("seed", "an integer in [0, 2**64)")
    steps = values["max_episode_steps"]
    if steps is not None and (not _integer(steps) or steps < 1):
        raise bad("max_episode_steps", "a positive integer (or none)")
    seconds = values["max_episode_seconds"]
    if seconds is not None and (not _number(seconds) or not 0 < seconds < math.inf):
        raise bad("max_episode_seconds", "a positive number of seconds (or none)")
    base = values["trial_index_base"]
    if not _integer(base) or base < 0:
        raise bad("trial_index_base", "a non-negative integer")
    reward = values["success_reward"]
    if reward is not None and (not _number(reward) or math.isnan(reward)):
        raise bad("success_reward", "a number (or none)")
    return {
        "name": name,
        "env": env,
        "env_kwargs": dict(kwargs),
        "episodes": int(episodes),
        "seed": int(seed),
        "max_episode_steps": None if steps is None else int(steps),
        "max_episode_seconds": None if seconds is None else float(seconds),
        "seeds": seeds,
        "trial_index_base": int(base),
        "success_reward": None if reward is None else float(reward),
    }


SUITE_FILE_KEYS = ("name", "defaults", "task")


def load_suite(path: str | os.PathLike[str]) -> list[Task]:
    """The tasks of a suite's TOML file (module docstring: the format), in file order.

    The file is data only: nothing in it is run. Each ``[[task]]`` table takes ``Task``'s
    fields; ``[defaults]`` gives any of them but ``name`` to every task.

    Raises:
        ValueError: the file does not read, is not TOML, or holds an unknown key, a task
            without a name or env, two tasks of one name, or a value of the wrong type; the
            message names the file, the task and the key, and what was expected.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "suite.toml")
        >>> text = '[[task]]\\nname = "a"\\nenv = "CartPole-v1"\\nepisode = 3\\n'
        >>> _ = open(path, "w").write(text)
        >>> load_suite(path)
        Traceback (most recent call last):
        ...
        ValueError: ...suite.toml, task 'a': unknown key 'episode'; expected one of ...
    """
    name = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read the suite ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{name}: not a valid TOML file ({exc})") from None
    unknown = [key for key in document if key not in SUITE_FILE_KEYS]
    if unknown:
        raise ValueError(
            f"{name}: unknown key {unknown[0]!r}; expected {', '.join(SUITE_FILE_KEYS)} "
            "(each task a [[task]] table)"
        )
    if "name" in document and not isinstance(document["name"], str):
        raise ValueError(f"{name}: name is {document['name']!r}; expected a string")
    defaults = document.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ValueError(f"{name}: defaults is {defaults!r}; expected a [defaults] table")
    settable = [key for key in TASK_KEYS if key != "name"]
    for key in defaults:
        if key not in settable:
            raise ValueError(
                f"{name}, [defaults]: unknown key {key!r}; expected one of {', '.join(settable)}"
            )
    tables = document.get("task")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ValueError(
            f"{name}: no tasks; expected at least one [[task]] table with a name and an env"
        )
    tasks: list[Task] = []
    for number, table in enumerate(tables, start=1):
        label = table.get("name")
        where = f"{name}, task {label!r}" if isinstance(label, str) else f"{name}, task {number}"
        for key in table:
            if key not in TASK_KEYS:
                raise ValueError(
                    f"{where}: unknown key {key!r}; expected one of {', '.join(TASK_KEYS)}"
                )
        for key in ("name", "env"):
            if key not in table and key not in defaults:
                raise ValueError(f"{where}: no {key!r}; every [[task]] needs a name and an env")
        values = {item.name: _default(item) for item in fields(Task)}
        values.update(defaults)
        values.update(table)
        tasks.append(Task(**_checked_fields(values, where)))
    _check_unique(tasks, name)
    return tasks


def _default(item: Any) -> Any:
    return item.default_factory() if callable(item.default_factory) else item.default


def _check_unique(tasks: Sequence[Task], where: str) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.name in seen:
            raise ValueError(
                f"{where}: two tasks are named {task.name!r}; expected a unique name per task"
            )
        seen.add(task.name)


def checked_suite(tasks: Any, only: Sequence[str] | None = None) -> tuple[list[Task], list[Task]]:
    """The suite ``tasks`` is (a list of ``Task``, or the path of its TOML file), and the
    tasks of it to run: those ``only`` names, in suite order (default all).

    Raises:
        ValueError: not a suite, two tasks of one name, or ``only`` names a task the suite
            does not have (the message lists those it has).
    """
    if isinstance(tasks, (str, os.PathLike)):
        suite = load_suite(tasks)
    else:
        if isinstance(tasks, Task) or not isinstance(tasks, Sequence) or not tasks:
            raise ValueError(
                f"tasks must be a non-empty list of rlmesh.Task or the path of a suite's "
                f"TOML file, got {type(tasks).__name__}"
            )
        for task in tasks:
            if not isinstance(task, Task):
                raise ValueError(
                    f"tasks must be rlmesh.Task objects, got a {type(task).__name__}: {task!r}"
                )
        suite = list(tasks)
        _check_unique(suite, "tasks")
    if only is None:
        return suite, suite
    if isinstance(only, str):
        only = [only]
    names = [task.name for task in suite]
    unknown = [name for name in only if name not in names]
    if unknown or not only:
        raise ValueError(
            f"{'no task named' if not only else f'unknown task {unknown[0]!r}'}; the suite's "
            f"tasks are {', '.join(names)}"
        )
    return suite, [task for task in suite if task.name in only]


@dataclass(frozen=True)
class SuiteResult:
    """What ``run_suite`` returns: the suite's tasks that ran and each one's ``RunResult``.

    ``tasks``: the tasks run, in suite order; ``runs``: task name -> its ``RunResult`` (with a
    results file, every episode of the task in it; each episode's ``task`` set). A task that
    never started (the suite failed before it) has no entry. ``result["name"]`` is a task's
    run.
    """

    tasks: tuple[Task, ...]
    runs: dict[str, RunResult]

    def __getitem__(self, name: str) -> RunResult:
        return self.runs[name]

    def summary(self) -> dict[str, Any]:
        """The suite's summary dict (``stats.summarize_suite``): per task, and overall."""
        from .stats import summarize_suite

        empty = {
            task.name: RunResult((), base_seed=task.seed, episodes_requested=task.episodes)
            for task in self.tasks
        }
        return summarize_suite({**empty, **self.runs})

    def format_summary(self) -> str:
        """The suite's summary table, as ``rlmesh eval --suite`` prints it."""
        from .stats import format_suite_summary

        return format_suite_summary(self.summary())


def run_suite(model: Any, tasks: Any, **kwargs: Any) -> SuiteResult:
    """Evaluate ``model`` on every task of a suite, one task after another.

    Takes the arguments of ``arun_suite``. Inside a running event loop, ``await
    arun_suite(...)`` instead.
    """
    return run_to_end("run_suite", lambda: arun_suite(model, tasks, **kwargs))


async def arun_suite(
    model: Any,
    tasks: Any,
    *,
    only: Sequence[str] | None = None,
    results_path: str | os.PathLike[str] | None = None,
    resume: bool = False,
    allow_changed_policy: bool = False,
    run_info: dict[str, Any] | None = None,
    core: str | None = None,
    success: Any = None,
    env_sandbox: Any = None,
    **run_kwargs: Any,
) -> SuiteResult:
    """Evaluate ``model`` on the tasks of a suite: the coroutine behind ``rlmesh.run_suite``.

    Args:
        model: what ``rlmesh.run`` takes (the same model serves every task; each task's run
            loads and closes it).
        tasks: a list of ``rlmesh.Task``, or the path of a suite's TOML file (``load_suite``).
        only: names of the tasks to run (default all), e.g. ``["cartpole"]``.
        results_path: one JSONL file for the whole suite: its header lists the suite's
            tasks, and each episode line names its task.
        resume: continue that file: the suite must be the one it records (the error names
            each task and field that differ); each task runs only the indices it lacks.
        allow_changed_policy, run_info, core: as ``rlmesh.run``'s, for every task
            (``run_info`` goes into each task's header).
        success: the success rule of the tasks that set no ``success_reward``.
        env_sandbox: run each task's env sandboxed: ``rlmesh.sandbox.SandboxOptions`` (or a
            dict of its fields), each task's env then a ``SandboxEnv`` of its id and
            ``env_kwargs`` with the run's ``num_envs``, stopped when its run ends; its worker
            processes are the options' ``workers``.
        **run_kwargs: any other ``rlmesh.run`` argument, the same for every task:
            ``num_envs``, ``workers`` (process lanes), ``cluster="ray"``, ``hooks``,
            ``timeouts``, ``indices`` (play only these of each task's episode indices,
            each in ``0..episodes-1`` of every task run), ... (not those a task sets:
            ``PER_TASK_ARGUMENTS``). Hooks hear
            each task's run as a run of its own (``on_run_start`` / ``on_run_end`` once per
            task); the episodes they are handed do not name the task, those of the results
            file and of the returned ``SuiteResult`` do.

    Returns:
        The ``SuiteResult``: each task's ``RunResult``, equal episode for episode to a solo
        ``rlmesh.run`` of that task.

    Raises:
        ValueError: a bad suite, an unknown name in ``only``, or a per-task argument given.
        RlmeshError: a task's run failed; ``err.partial_result`` is the ``SuiteResult`` of
            the tasks so far (the failed task's completed episodes included).

    Example:
        >>> suite = run_suite(lambda obs: 0, [Task("short", "CartPole-v1", episodes=2)])
        >>> suite.summary()["tasks"][0]["episodes"]
        2
    """
    given = sorted(PER_TASK_ARGUMENTS & set(run_kwargs))
    if given:
        raise ValueError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set per task in a suite "
            "(rlmesh.Task fields, or keys of a [[task]] table): set them there"
        )
    suite, chosen = checked_suite(tasks, only)
    if env_sandbox is not None:
        from .sandbox.options import checked_options, sandboxed_suite_env

        env_sandbox = checked_options(env_sandbox)
    if resume and results_path is None:
        raise ValueError("resume=True needs results_path=, the suite's results file to continue")
    hooks = run_kwargs.pop("hooks", None)
    check_argument_names(run_kwargs, "rlmesh.run_suite")
    core = core or core_name()
    # The arguments every task shares, checked once; each task sets its own part.
    shared = run_settings(**run_kwargs, core=core, success=success, results_path=results_path)
    results = None
    if results_path is not None:
        header = {
            SUITE_KEY: [task.to_dict() for task in suite],
            "rlmesh_version": __version__,
            "core": core,
            # The suite's auditable record (not checked on resume); each task's header has its
            # own too.
            PROVENANCE_KEY: collect_provenance(
                model=model, env=chosen[0].env, core=core, **(shared.output.provenance or {})
            ),
        }
        results = ResultsFile.open(results_path, header, resume=resume)
    runs: dict[str, RunResult] = {}
    # The suite's one live view (cleared: a new run), which each task's run adds to.
    view = (
        None
        if shared.output.view is None
        else open_view(shared.output.view, **view_options(shared))
    )
    try:
        for task in chosen:
            settings = task.settings(shared)
            output = replace(
                shared.output,
                run_info={
                    **(run_info or {}),
                    "task": task.name,
                    "env": task.env,
                    "env_kwargs": task.env_kwargs,
                },
                results_path=None if results is None else results.task(task.name),
                resume=results is not None,  # the suite's file was checked as a whole above
                allow_changed_policy=allow_changed_policy,
            )
            video = shared.video and replace(shared.video, prefix=task.name)
            settings = replace(settings, output=output, video=video)
            env = None
            try:
                env = (
                    task.make_env()
                    if env_sandbox is None
                    else sandboxed_suite_env(env_sandbox, task.env, task.env_kwargs, settings)
                )
                result = await evaluate(model, env, settings, hooks=hooks, view=view)
            except BaseException as exc:
                if env_sandbox is not None and env is not None:
                    env.close()  # its server, if the run stopped before its lanes closed it
                partial = getattr(exc, "partial_result", None)
                if isinstance(partial, RunResult):
                    runs[task.name] = _of_task(partial, task.name)
                if isinstance(exc, Exception):
                    exc.partial_result = SuiteResult(tuple(chosen), runs)  # type: ignore[attr-defined]
                raise
            runs[task.name] = _of_task(result, task.name)
    finally:
        if results is not None:
            results.close()
    return SuiteResult(tuple(chosen), runs)


def _of_task(result: RunResult, name: str) -> RunResult:
    """``result`` with each episode's ``task`` set (a run with a results file has them)."""
    if all(episode.task == name for episode in result.episodes):
        return result
    return replace(result, episodes=tuple(replace(e, task=name) for e in result.episodes))
