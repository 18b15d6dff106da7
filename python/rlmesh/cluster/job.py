"""What a cluster run sends to its workers (``WindowJob``, once per run) and what a window
sends back as it goes (``Landed`` batches, then one ``WindowDone`` or ``WindowFailed``).

The model, an env factory and the run's arguments travel as cloudpickle bytes inside the job,
unpickled on the worker only after the coordinator's import path is in place, so a model
defined in the user's own modules loads there as it does here. A model may also travel as
the spec the CLI takes (``path/to/file.py:Name``, ``package.module:Name``, a built-in), which
the worker loads itself: the form for a model that does not pickle.

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
    """

    job_id: str
    model: str | bytes
    env: str | bytes
    settings: bytes
    search_path: tuple[str, ...]


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

    Raises:
        NotPicklableError: the model, the env factory or an argument (a success rule) does
            not pickle; the message says what to pass instead.
        ValueError: an env the workers cannot rebuild (an instance, a vector, lanes), or a
            model spec that names no file.
    """
    if isinstance(env, (gym.Env, gym.vector.VectorEnv)) or not (
        isinstance(env, str) or callable(env)
    ):
        raise ValueError(
            f"env {type(env).__name__}: a cluster run builds its envs on the workers; pass a "
            "Gymnasium id (or module:Id) or a zero-argument factory that pickles (a "
            "module-level function, or functools.partial(gymnasium.make, id, ...))"
        )
    if isinstance(model, str):
        shipped_model: str | bytes = model_spec(model)
    else:
        shipped_model = _dumps(model, "model", f"it as {MODEL_FORMS}, or make it picklable")
    shipped_env = (
        env
        if isinstance(env, str)
        else _dumps(env, "env factory", "a Gymnasium id or a module-level factory function")
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
    )


def import_directories() -> tuple[str, ...]:
    """This process's import directories (``""`` as the working directory), absolute."""
    found = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        if os.path.isdir(path) and path not in found:
            found.append(path)
    return tuple(found)
