"""``SandboxOptions``: how a suite's envs run sandboxed, given once for every task
(``rlmesh.run_suite(model, tasks, env_sandbox=SandboxOptions(...))``); and
``SandboxEnvFactory``: one ``SandboxEnv`` described as data (the options, the env's source,
its lanes and arguments), which pickles and starts a ``SandboxEnv`` where it is called (a Ray
worker of a cluster run: ``SandboxEnv.factory()``).

A ``rlmesh.Task`` is plain data, recorded as it is in a suite's results file: it names its env
and the env's arguments, not where the env runs. The suite's runs take the rest from
``SandboxOptions``: each task's env becomes a ``SandboxEnv`` of the task's id and arguments,
with these packages, interpreter and walls, and the lanes and render mode of the run
(``num_envs=``, ``record_video=``); it is stopped when the task's run ends. The options
pickle, so what they describe can be rebuilt elsewhere.

Example:
    >>> import sys, rlmesh
    >>> tasks = [rlmesh.Task("a", "CartPole-v1", episodes=2, seed=1),
    ...          rlmesh.Task("b", "CartPole-v1", episodes=1, seed=2)]
    >>> options = SandboxOptions(python=sys.executable, sandbox=False)
    >>> suite = rlmesh.run_suite(lambda obs: 0, tasks, env_sandbox=options, num_envs=2)
    >>> [len(suite[name].episodes) for name in ("a", "b")]
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .server_process import START_TIMEOUT_S


@dataclass(frozen=True)
class SandboxOptions:
    """What ``SandboxEnv`` takes beside its source, its lanes and its env's arguments: see
    ``SandboxEnv`` for each.

    Args:
        packages: pip requirements of the envs (a cached virtual environment holds them).
        python: the interpreter to build that environment from, or to run as it is.
        workers: worker processes stepping the lanes inside the sandbox.
        network: let the envs reach the network.
        sandbox: run under bubblewrap (False: an isolated interpreter, no namespaces).
        restart: how many times a dead server is started again, its episodes replayed.
        start_timeout: seconds a server may take to build its envs and listen.
        core: the core of the server and its transport (default: the run's).

    Raises:
        ValueError: ``workers`` below 1 or ``restart`` below 0.
        TypeError: ``packages`` is not a string or a sequence of strings.
    """

    packages: tuple[str, ...] = ()
    python: str | None = None
    workers: int = 1
    network: bool = False
    sandbox: bool = True
    restart: int = 0
    start_timeout: float = START_TIMEOUT_S
    core: str | None = None

    def __post_init__(self) -> None:
        packages = self.packages
        if isinstance(packages, str):
            packages = tuple(packages.split())
        elif not all(isinstance(item, str) for item in packages):
            raise TypeError(
                f"SandboxOptions(packages=...): expected pip requirements as strings, got "
                f"{packages!r}"
            )
        object.__setattr__(self, "packages", tuple(packages))
        if int(self.workers) < 1:
            raise ValueError(f"SandboxOptions(workers={self.workers}): expected 1 or more")
        if int(self.restart) < 0:
            raise ValueError(f"SandboxOptions(restart={self.restart}): expected 0 or more")

    def factory(
        self,
        source: str,
        *,
        num_envs: int = 1,
        render_mode: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        core: str | None = None,
    ) -> SandboxEnvFactory:
        """A ``SandboxEnv`` of ``source`` with these options, as data that pickles: a
        ``SandboxEnvFactory``, which starts it when called (``num_envs`` lanes, its envs built
        with ``make_kwargs`` and ``render_mode``, unless they set one; ``core`` when the
        options name none).

        Example:
            >>> import pickle
            >>> made = SandboxOptions(sandbox=False).factory("Pendulum-v1", make_kwargs={"g": 3.0})
            >>> pickle.loads(pickle.dumps(made)) == made, made.make_kwargs
            (True, {'g': 3.0})
        """
        kwargs = dict(make_kwargs or {})
        if render_mode is not None:
            kwargs.setdefault("render_mode", render_mode)
        options = self if self.core or core is None else replace(self, core=core)
        return SandboxEnvFactory(source, options, num_envs=num_envs, make_kwargs=kwargs)

    def describe(self) -> dict[str, Any]:
        """The options as plain data (what a results file's ``run_info`` can hold)."""
        return {
            "packages": list(self.packages),
            "python": self.python,
            "workers": self.workers,
            "network": self.network,
            "sandbox": self.sandbox,
            "restart": self.restart,
        }


@dataclass(frozen=True)
class SandboxEnvFactory:
    """One ``SandboxEnv`` as data: ``source``, ``options``, ``num_envs`` lanes and the envs'
    ``make_kwargs`` (JSON values). It pickles (the options and the arguments are plain data),
    and calling it starts a ``SandboxEnv`` in the calling process: how a cluster run's Ray
    workers each start their own sandbox (``SandboxEnv.factory()``). ``python`` and the
    virtual environments' cache must be there on every machine that calls it.

    Example:
        >>> import sys
        >>> made = SandboxEnvFactory("CartPole-v1", SandboxOptions(python=sys.executable,
        ...                          sandbox=False), num_envs=2)
        >>> with made() as env:
        ...     env.num_lanes, env.name
        (2, 'CartPole-v1')
    """

    source: str
    options: SandboxOptions
    num_envs: int = 1
    make_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        """A started ``SandboxEnv`` (``rlmesh.lanes.Lanes``) of this description."""
        from .env import SandboxEnv

        options = self.options
        return SandboxEnv(
            self.source,
            packages=list(options.packages),
            python=options.python,
            num_envs=self.num_envs,
            workers=options.workers,
            network=options.network,
            sandbox=options.sandbox,
            restart=options.restart,
            start_timeout=options.start_timeout,
            core=options.core,
            **self.make_kwargs,
        )


def sandboxed_suite_env(
    options: SandboxOptions, env: str, env_kwargs: Mapping[str, Any], settings: Any
) -> Any:
    """The ``SandboxEnv`` of a suite's task (its ``env`` and ``env_kwargs``) for a run of
    ``settings`` (a ``RunSettings``: its lanes, core, and whether its videos or live view
    take frames from ``render()``).

    On a cluster (``cluster="ray"``) the env started here gives the run its facts and is
    closed; each Ray worker starts one like it (``SandboxEnv.factory()``).

    Raises:
        ValueError: the run asks for worker processes, which a sandboxed env's lanes do not
            take (its workers are its server's: ``SandboxOptions(workers=W)``).
    """
    if settings.parallel.process_workers > 1:
        raise ValueError(
            f"run_suite(workers={settings.parallel.process_workers}, env_sandbox=...): a "
            f"sandboxed env's lanes step in its server; pass SandboxOptions(workers="
            f"{settings.parallel.process_workers}) instead"
        )
    video, view = settings.video, settings.output.view
    # The videos' and the live page's frames come from render() unless from an image key.
    from_key = video is not None and video.key is not None
    wants_frames = not from_key and (video is not None or (view is not None and view.http))
    return options.factory(
        env,
        num_envs=settings.parallel.num_envs or 1,
        render_mode="rgb_array" if wants_frames else None,
        make_kwargs=env_kwargs,
        core=settings.core,
    )()


def checked_options(value: Any) -> SandboxOptions | None:
    """``value`` (``run_suite``'s ``env_sandbox``) as ``SandboxOptions``: None, the options,
    or a mapping of their fields.

    Raises:
        TypeError: anything else, or a mapping with a key that is no option.
    """
    if value is None or isinstance(value, SandboxOptions):
        return value
    if isinstance(value, Mapping):
        try:
            return SandboxOptions(**value)
        except TypeError as err:
            raise TypeError(f"env_sandbox={dict(value)!r}: {err}") from None
    raise TypeError(
        f"env_sandbox: expected rlmesh.sandbox.SandboxOptions (or a dict of its fields), got "
        f"{type(value).__name__}"
    )


__all__ = ["SandboxEnvFactory", "SandboxOptions", "checked_options", "sandboxed_suite_env"]
