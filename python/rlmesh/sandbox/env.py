"""``SandboxEnv``: the lanes of an env served by a server rlmesh starts itself, in a virtual
environment of its own and a bubblewrap sandbox, and watches and stops.

A sandboxed env is a served env (``rlmesh.RemoteEnv``, over a unix socket) whose server
(``rlmesh serve env``) runs in another interpreter: one holding the env's packages
(``packages=``, a cached virtual environment: ``venvs.py``) or one the user names
(``python=``), sandboxed by bubblewrap (``bwrap.py``: a read-only root, a private ``/tmp``,
one writable work directory, no network unless ``network=True``). Its episodes are those of
the same env run in-process: the driver seeds every reset, as for any served env.

A server that dies (a segfault, an OOM kill, ``os._exit``) fails the call that was waiting on
it with ``SandboxEnvCrashedError``, which holds the server's last lines of output. With
``restart=K`` a dead server is instead started again, up to K times: the new server replays
every episode in flight from its seed and the actions it took (kept for this only when K >
0), and the call is sent again, so for a deterministic env the run goes on exactly as if
nothing happened.

Example:
    >>> import sys, rlmesh
    >>> env = SandboxEnv("CartPole-v1", num_envs=2, python=sys.executable, sandbox=False)
    >>> result = rlmesh.run(lambda obs: int(obs[2] > 0), env, episodes=3)
    >>> env.num_lanes, [episode.index for episode in result.episodes], env.running
    (2, [0, 1, 2], False)
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import EnvError, RemoteError
from ..lanes.base import StepBatch
from ..lanes.remote import RemoteEnv, SessionEndedError
from ..remote.protocol import split_rows
from ..utils import positive_int
from .bwrap import require_bwrap
from .errors import SandboxEnvCrashedError
from .factory import FACTORY, MAKE_VARIABLE, make_variable
from .options import SandboxEnvFactory, SandboxOptions
from .server_process import START_TIMEOUT_S, SandboxedServer, ServerFacts
from .venvs import Progress, sandbox_python

CRASH_WAIT_S = 2.0
"""How long a failed call waits for the server's process to end before the failure is taken
for the server's death (its socket closes a moment before it ends)."""

RENDER_FAILED = "ENV_ERROR_CODE_UNSUPPORTED"
"""The code a server answers a render that failed with, the session going on."""

T = TypeVar("T")


class SandboxEnv(ServerFacts):
    """``num_envs`` lanes of ``source``, served from a sandbox rlmesh starts, as
    ``rlmesh.lanes.Lanes`` (``rlmesh.run(model, SandboxEnv(...))``).

    Args:
        source: a Gymnasium id (``"CartPole-v1"``, ``"module:Id"`` for an env its module
            registers on import) or a factory (``"package.module:make_env"``,
            ``"path/to/file.py:make_env"``), as ``rlmesh serve env`` takes it: resolved in the
            sandbox's interpreter, where its packages are.
        packages: pip requirements the env needs (``["gym-pusht==0.1.8"]``): installed, with
            rlmesh's runtime requirements, in a virtual environment built on first use and
            cached by the sorted requirements and the Python version.
        python: the interpreter to build that environment from; without ``packages``, an
            interpreter used as it is (a virtual environment the user made, which holds
            rlmesh's runtime requirements: numpy, gymnasium, grpcio, protobuf, rich).
        num_envs: the lanes (envs) the server builds.
        workers: step the lanes in this many worker processes inside the sandbox.
        network: let the env reach the network (default: a network namespace of its own,
            with nothing in it).
        sandbox: run the server under bubblewrap (needs ``bwrap``); False runs it in its own
            interpreter and environment without the namespaces.
        restart: how many times a server that died is started again, its episodes in flight
            replayed (default 0: the call fails with ``SandboxEnvCrashedError``).
        start_timeout: seconds the server may take to build its envs and listen.
        progress: told each line of a first build's progress (default: stderr).
        core: the core of the calls' transport and of the server (``"rust"`` or
            ``"python"``; default the active core); a server whose interpreter cannot import
            the Rust core runs the Python core.
        **make_kwargs: keyword arguments of ``gymnasium.make(source, ...)`` or of the factory,
            JSON values; ``render_mode="rgb_array"`` builds envs whose frames cross the
            socket (``render``), so a run records videos of them (``record_video=K``).

    Raises:
        SandboxUnavailableError: ``sandbox=True`` where bubblewrap is missing (the message
            says what to install).
        SandboxBuildError: the environment's packages could not be installed.
        SandboxStartError: the server exited or did not listen within ``start_timeout``; the
            error holds its last lines of output (an import error, a bad id).
        TypeError: ``source`` is not a string, or an argument is not a JSON value.

    Example:
        >>> import sys, rlmesh
        >>> env = SandboxEnv("Pendulum-v1", python=sys.executable, sandbox=False, g=3.0)
        >>> result = rlmesh.run(lambda obs: [0.0], env, episodes=2, max_episode_steps=4)
        >>> env.name, [episode.steps for episode in result.episodes]
        ('Pendulum-v1', [4, 4])
    """

    resets_itself = False
    env_steps = None
    core_calls_step = True
    lockstep = False

    def __init__(
        self,
        source: str,
        *,
        packages: str | Sequence[str] = (),
        python: str | None = None,
        num_envs: int = 1,
        workers: int = 1,
        network: bool = False,
        sandbox: bool = True,
        restart: int = 0,
        start_timeout: float = START_TIMEOUT_S,
        progress: Progress | None = None,
        core: str | None = None,
        **make_kwargs: Any,
    ) -> None:
        if not isinstance(source, str):
            raise TypeError(
                f"SandboxEnv(source): expected a Gymnasium id or a factory's name "
                f"('package.module:make_env', 'path/to/file.py:make_env'), got a "
                f"{type(source).__name__}: an env object cannot cross into another interpreter"
            )
        self.source = source
        self._restart = int(restart)
        if self._restart < 0:
            raise ValueError(f"restart must be 0 or more, got {restart}")
        self.restarts = 0
        self._core = core
        self._client: RemoteEnv | None = None
        self._closed = False
        target, read_only, environment = _served_source(source, make_kwargs)
        serve_args = ["serve", "env", target]
        serve_args += ["--num-envs", str(positive_int("num_envs", num_envs))]
        serve_args += ["--workers", str(positive_int("workers", workers))]
        # What started it, as data that pickles: the same env elsewhere (factory()).
        self._factory = SandboxEnvFactory(
            _absolute(source),
            SandboxOptions(
                packages=(packages,) if isinstance(packages, str) else tuple(packages),
                python=None if python is None else os.path.abspath(os.path.expanduser(python)),
                workers=workers,
                network=network,
                sandbox=sandbox,
                restart=restart,
                start_timeout=start_timeout,
                core=core,
            ),
            num_envs=num_envs,
            make_kwargs=dict(make_kwargs),
        )
        self.sandboxed = bool(sandbox)
        if self.sandboxed:
            require_bwrap()  # before a long build: say at once what is missing
        interpreter = sandbox_python(packages, python, progress)
        self._server = SandboxedServer(
            "env",
            serve_args,
            python=interpreter,
            sandbox=self.sandboxed,
            network=network,
            read_only=read_only,
            extra_path=os.getcwd(),
            environment=environment,
            start_timeout=start_timeout,
            core=core,
            # Worker processes not sandboxed keep shared memory in the host's /dev/shm, which
            # only their graceful close removes.
            graceful=not self.sandboxed and workers > 1,
        )
        # Per lane, the episode in flight as (seed, trial, actions taken), for a replay on a
        # new server; kept only when there may be one.
        self._episodes: list[tuple[Any, Any, list[Any]] | None] = []
        self._connect()
        self.rebuild = self._rebuild

    def _connect(self) -> None:
        """Start the server and open the session; the lanes' facts from its contract."""
        address = self._server.start()
        try:
            client = RemoteEnv(address, core=self._core)
        except BaseException:
            self._server.stop()
            raise
        self._client = client
        self.num_lanes = client.num_lanes
        self.name = client.name
        self.single_observation_space = client.single_observation_space
        self.single_action_space = client.single_action_space
        self.spec = client.spec
        self.metadata = client.metadata
        self.accepts_trial_index = client.accepts_trial_index
        self.render_mode = client.render_mode
        self.render_fps = client.render_fps
        if len(self._episodes) != self.num_lanes:  # the first server (a restart keeps them)
            self._episodes = [None] * self.num_lanes

    # ---------------------------------------------------------------- the Lanes protocol

    def reset(
        self, lanes: np.ndarray, seeds: Sequence[int | None], trials: Sequence[int | None]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        lanes = np.asarray(lanes, dtype=np.int64)
        answer = self._guarded(
            f"resetting lanes {lanes.tolist()}",
            lambda client: client.reset(lanes, seeds, trials),
            _no_reset,
            resetting=lanes.tolist(),
        )
        if self._restart:
            for lane, seed, trial in zip(lanes.tolist(), seeds, trials, strict=True):
                self._episodes[lane] = (seed, trial, [])
        return answer

    def step(self, lanes: np.ndarray, actions: Any) -> StepBatch:
        lanes = np.asarray(lanes, dtype=np.int64)
        batch = self._guarded("a step", lambda client: client.step(lanes, actions), _no_step)
        if self._restart:
            self._note_steps(lanes, actions, batch)
        return batch

    def env_episode_ids(self) -> np.ndarray | None:
        return None

    def render(self, lane: int) -> np.ndarray:
        """Lane ``lane``'s frame, drawn in the sandbox and sent over its socket as PNG: what
        its env's ``render()`` returns, for envs built with ``render_mode="rgb_array"`` (a
        keyword of ``SandboxEnv``, passed to the env: ``rlmesh.run(..., record_video=K)``
        records these frames).

        Raises:
            EnvError: the env's ``render()`` raised in the server, which answered with the
                lane, the env and the exception (as an env in this process raises it); the
                session and the other lanes' episodes go on.
            RemoteError: the envs do not render in ``rgb_array`` mode (``render_mode`` says
                how they do), or the server failed otherwise.
        """
        if self.render_mode != "rgb_array":
            raise RemoteError(
                f"SandboxEnv({self.source!r}) has render_mode={self.render_mode!r}, so its "
                f"lanes draw no frames: pass render_mode='rgb_array' to SandboxEnv (its env is "
                f"built with it)",
                address=self.address,
            )
        try:
            return self._guarded(
                f"rendering lane {lane}", lambda client: client.render(lane), _none
            )
        except RemoteError as err:
            if err.code != RENDER_FAILED:
                raise
            raise EnvError(err.detail or str(err)) from err

    def factory(self) -> SandboxEnvFactory:
        """This env as data that pickles: calling it starts another ``SandboxEnv`` like this
        one (same source, lanes, arguments, packages or interpreter, walls), in the process
        that calls it. A cluster run sends it to its Ray workers, each starting one sandbox
        for every window it runs.

        Example:
            >>> import pickle, sys
            >>> with SandboxEnv("CartPole-v1", python=sys.executable, sandbox=False) as env:
            ...     made = pickle.loads(pickle.dumps(env.factory()))
            >>> made.source, made.num_envs, made.options.sandbox
            ('CartPole-v1', 1, False)
        """
        return self._factory

    def close(self) -> None:
        """End the session and stop the server (its run directory removed). Closing again
        does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._client is not None:
                self._client.close()
        finally:
            self._server.stop()

    def _rebuild(self, lanes: np.ndarray) -> None:
        """After a failure: a new session, or a new server when it died; its lanes hold no
        episode until their next ``reset``."""
        self._episodes = [None] * self.num_lanes
        if self._server.running and self._client is not None:
            self._client.rebuild(lanes)
            return
        self._replace_server()

    def __enter__(self) -> SandboxEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "sandboxed" if self.sandboxed else "isolated"
        return f"SandboxEnv({self.source}, num_lanes={self.num_lanes}, {kind})"

    # ---------------------------------------------------------------- faults

    def _guarded(
        self,
        doing: str,
        call: Callable[[RemoteEnv], T],
        outcome: Callable[[], Any],
        resetting: Sequence[int] = (),
    ) -> T:
        """``call(client)``; when it failed because the server died, restart it and replay its
        episodes in flight (but those of ``resetting``) and call again, or raise the
        ``SandboxEnvCrashedError`` (whose ``outcome``, what the call returned for no lane,
        is ``outcome()``) beyond the restarts."""
        replay = False
        while True:
            client = self._client
            assert client is not None
            try:
                if replay:
                    self._replay(exclude=set(resetting))
                    replay = False
                return call(client)
            except RemoteError as err:
                in_band = isinstance(err, SessionEndedError) or str(err.code).startswith(
                    "ENV_ERROR_CODE"
                )
                if in_band or not self._server.died(CRASH_WAIT_S):
                    raise
                if self.restarts >= self._restart:
                    crashed = self._crashed(doing)
                    crashed.outcome = outcome()
                    raise crashed from err
                self.restarts += 1
                self._replace_server()
                replay = True

    def _replace_server(self) -> None:
        """A new server and session in place of a dead one; none once the env is closed (a
        run failing on a server that ``close`` stopped from another thread, as a Ray actor
        being ended does, must not leave a new one behind)."""
        if self._closed:
            raise RemoteError(
                f"{self!r} is closed: it starts no new server (its lanes were closed while "
                f"they were in use)",
                address=self.address,
            )
        if self._client is not None:
            self._client.close()  # the dead server's session: nothing is sent
        self._server.stop(grace=0)  # it is dead: nothing to wait for
        self._connect()

    def _crashed(self, doing: str) -> SandboxEnvCrashedError:
        server = self._server
        code = server.exit_code
        in_flight = [
            f"trial {episode[1]} on lane {lane}" if episode[1] is not None else f"lane {lane}"
            for lane, episode in enumerate(self._episodes)
            if episode is not None
        ]
        restarts = (
            f"it was restarted {self.restarts} times already (restart={self._restart})"
            if self._restart
            else "pass restart=K to start it again and replay its episodes in flight"
        )
        episodes = f"; episodes in flight: {', '.join(in_flight)}" if in_flight else ""
        return SandboxEnvCrashedError(
            f"{server.describe()} of {self.name} died (exit status {code}) during {doing}"
            f"{episodes}. The episodes completed before it are kept (err.partial_result); "
            f"{restarts}",
            address=server.address,
            num_lanes=self.num_lanes,
            output=server.output(),
            exit_code=code,
        )

    def _note_steps(self, lanes: np.ndarray, actions: Any, batch: StepBatch) -> None:
        """Keep each stepped lane's episode up to date: an ended one is no longer in flight,
        the others keep the action just taken, for a replay."""
        ended = np.asarray(batch.terminated) | np.asarray(batch.truncated)
        rows = split_rows(actions, len(lanes))
        for lane, done, row in zip(lanes.tolist(), ended.tolist(), rows, strict=True):
            episode = self._episodes[lane]
            if done:
                self._episodes[lane] = None
            elif episode is not None:
                episode[2].append(copy.deepcopy(row))  # the driver may reuse its buffers

    def _replay(self, exclude: set[int]) -> None:
        """Play every episode in flight (but those of ``exclude``) again on the new server:
        the same seeds and trials, then their actions, lanes that took their k-th action
        stepping together."""
        client = self._client
        assert client is not None
        replayed = [
            (lane, episode)
            for lane, episode in enumerate(self._episodes)
            if episode is not None and lane not in exclude
        ]
        for seeded in (True, False):  # a remote reset seeds all its lanes or none
            group = [(lane, ep) for lane, ep in replayed if (ep[0] is not None) == seeded]
            if group:
                client.reset(
                    np.array([lane for lane, _ in group], dtype=np.int64),
                    [episode[0] for _, episode in group],
                    [episode[1] for _, episode in group],
                )
        longest = max((len(episode[2]) for _, episode in replayed), default=0)
        for k in range(longest):
            group = [(lane, ep[2][k]) for lane, ep in replayed if len(ep[2]) > k]
            client.step(
                np.array([lane for lane, _ in group], dtype=np.int64),
                _stack([action for _, action in group]),
            )


def _absolute(source: str) -> str:
    """``source`` with a factory's file as an absolute path (the same file from any working
    directory)."""
    target, colon, name = source.rpartition(":")
    if colon and target.endswith(".py"):
        return f"{Path(target).expanduser().absolute()}:{name}"
    return source


def _served_source(
    source: str, make_kwargs: dict[str, Any]
) -> tuple[str, list[str], dict[str, str]]:
    """What the server is told to serve, the paths it must read, and its extra variables: a
    factory's file as an absolute path (its directory bound read-only), and with
    ``make_kwargs`` the factory of ``factory.py``, told the source in its environment."""
    target, colon, name = source.rpartition(":")
    read_only: list[str] = []
    if colon and target.endswith(".py"):
        path = Path(target).expanduser().absolute()
        if not path.is_file():
            raise ValueError(f"SandboxEnv({source!r}): no file {path}")
        source = f"{path}:{name}"
        read_only.append(str(path.parent))
    if not make_kwargs:
        return source, read_only, {}
    return FACTORY, read_only, {MAKE_VARIABLE: make_variable(source, make_kwargs)}


def _stack(rows: list[Any]) -> Any:
    """Per-lane actions as one batch along a new leading axis (dicts and tuples by leaf)."""
    first = rows[0]
    if isinstance(first, dict):
        return {key: _stack([row[key] for row in rows]) for key in first}
    if isinstance(first, tuple):
        return tuple(_stack([row[i] for row in rows]) for i in range(len(first)))
    return np.stack([np.asarray(row) for row in rows])


def _none() -> None:
    return None


def _no_reset() -> tuple[np.ndarray, list[Any], list[Any]]:
    return np.zeros(0, dtype=np.int64), [], []


def _no_step() -> StepBatch:
    nothing = np.zeros(0, dtype=np.bool_)
    return StepBatch(np.zeros(0, dtype=np.int64), [], np.zeros(0), nothing, nothing.copy(), [])


__all__ = ["CRASH_WAIT_S", "SandboxEnv"]
