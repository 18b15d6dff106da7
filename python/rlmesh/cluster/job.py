"""What a cluster run sends to its workers (``WindowJob``, once per run) and what a window
sends back as it goes (``Landed`` batches, then one ``WindowDone`` or ``WindowFailed``).

The model, an env factory and the run's arguments travel as cloudpickle bytes inside the job,
unpickled on the worker only after the coordinator's import path is in place, so a model
defined in the user's own modules loads there as it does here. A model may also travel as
the spec the CLI takes (``path/to/file.py:Name``, ``package.module:Name``, a built-in), which
the worker loads itself: the form for a model that does not pickle.

The env travels in one of three forms: a Gymnasium id, a factory of one ``gym.Env`` (each
window's run builds its lanes from it and closes them), or a factory of ``Lanes``
(``WindowJob.env_lanes``): what a ``SandboxEnv`` becomes (``SandboxEnv.factory()``, its
options, source and arguments as data), since its server is a child of the process that
started it and cannot travel. A worker calls it once and holds the lanes across the windows
it runs (``worker.HeldLanes``), so each worker starts one sandbox, not one a window.

Example:
    >>> from rlmesh.settings import run_settings
    >>> job = make_job("random", "CartPole-v1", settings=run_settings(episodes=2).for_window())
    >>> job.model, job.env
    ('random', 'CartPole-v1')
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from ..results import EpisodeResult, TelemetryRow
from ..settings import RunSettings
from ..success import SuccessRule
from .errors import NotPicklableError

MODEL_FORMS = (
    "'path/to/file.py:Name' or 'package.module:Name' (a Model subclass, instance or function "
    "the workers load by name)"
)


@dataclass(frozen=True)
class WindowJob:
    """Everything a window's task needs but its indices, put in Ray's object store once.

    ``model`` and ``env`` are a spec or id (str) or cloudpickle bytes; ``settings`` the
    cloudpickled ``RunSettings`` of each window's local run (``RunSettings.for_window``, but
    the indices); ``search_path`` the
    coordinator's import directories, appended on a worker to its own where they exist.
    ``env_lanes``: ``env`` is a factory of ``Lanes`` (a worker holds what it builds across
    its windows), not of one ``gym.Env``.
    """

    job_id: str
    model: str | bytes
    env: str | bytes
    settings: bytes
    search_path: tuple[str, ...]
    env_lanes: bool = False


@dataclass(frozen=True)
class Landed:
    """Episodes of a window that started (``(index, seed)``) or completed on ``worker`` since
    the last batch, in the order they did."""

    worker: str
    started: tuple[tuple[int, int | None], ...]
    episodes: tuple[EpisodeResult, ...]


@dataclass(frozen=True)
class WindowDone:
    """A window's run ended well: who ran it and what its run segment recorded."""

    worker: str
    task_s: float
    wasted_steps: int
    observer_errors: int
    telemetry: tuple[TelemetryRow, ...]
    success_rule: SuccessRule


@dataclass(frozen=True)
class WindowFailed:
    """A window's run raised: the error itself when it pickles, else its description."""

    worker: str
    error: BaseException | None
    description: str


def _dumps(value: Any, what: str, instead: str) -> bytes:
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise NotPicklableError(
            f"{what} {value!r} cannot be sent to the Ray workers: it does not pickle "
            f"({type(exc).__name__}: {exc}); pass {instead}"
        ) from None


def model_spec(spec: str) -> str:
    """A model named by a spec, as the workers load it: a ``file.py`` target made absolute
    (the workers' working directory may differ), checked to exist; ValueError otherwise."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        from ..policies import BUILTIN_POLICIES

        if spec in BUILTIN_POLICIES:
            return spec
        raise ValueError(f"model {spec!r} is a string, so it names a model: expected {MODEL_FORMS}")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"model {spec!r}: no file {target}; expected {MODEL_FORMS}")
        return f"{path.resolve()}:{name}"
    return spec


def make_job(model: Any, env: Any, *, settings: RunSettings) -> WindowJob:
    """The job of a cluster run, its model, env and window arguments checked to travel.

    A ``SandboxEnv`` travels as its factory (``SandboxEnv.factory()``): each worker starts a
    sandbox like it. A ``SandboxModel`` travels as its arguments: each worker process starts
    a server like it when it unpickles it.

    Raises:
        NotPicklableError: the model, the env factory or an argument (a success rule) does
            not pickle; the message says what to pass instead.
        ValueError: an env the workers cannot rebuild (an instance, a vector, lanes other
            than a ``SandboxEnv``), or a model spec that names no file.
    """
    lanes_factory = _lanes_factory(env)
    if lanes_factory is None and (
        isinstance(env, (gym.Env, gym.vector.VectorEnv))
        or not (isinstance(env, str) or callable(env))
    ):
        raise ValueError(
            f"env {type(env).__name__}: a cluster run builds its envs on the workers; pass a "
            "Gymnasium id (or module:Id), a zero-argument factory that pickles (a "
            "module-level function, or functools.partial(gymnasium.make, id, ...)), or a "
            "rlmesh.sandbox.SandboxEnv (each worker starts one like it)"
        )
    if isinstance(model, str):
        shipped_model: str | bytes = model_spec(model)
    else:
        shipped_model = _dumps(model, "model", f"it as {MODEL_FORMS}, or make it picklable")
    if lanes_factory is not None:
        shipped_env: str | bytes = _dumps(
            lanes_factory, "the sandboxed env's factory", "env arguments that are JSON values"
        )
    elif isinstance(env, str):
        shipped_env = env
    else:
        shipped_env = _dumps(
            env, "env factory", "a Gymnasium id or a module-level factory function"
        )
    shipped_settings = _dumps(
        settings,
        "the run's arguments",
        "a success rule that pickles (a module-level function, or a number)",
    )
    return WindowJob(
        job_id=uuid.uuid4().hex,
        model=shipped_model,
        env=shipped_env,
        settings=shipped_settings,
        search_path=import_directories(),
        env_lanes=lanes_factory is not None,
    )


def _lanes_factory(env: Any) -> Any:
    """The factory of ``Lanes`` that builds ``env`` again on a worker, or None for an env
    that travels as an id or a factory of one ``gym.Env``."""
    from ..sandbox import SandboxEnv

    return env.factory() if isinstance(env, SandboxEnv) else None


def import_directories() -> tuple[str, ...]:
    """This process's import directories (``""`` as the working directory), absolute."""
    found = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        if os.path.isdir(path) and path not in found:
            found.append(path)
    return tuple(found)
