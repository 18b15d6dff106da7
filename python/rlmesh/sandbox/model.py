"""``SandboxModel``: a policy served by a server rlmesh starts itself, in a virtual environment
of its own and a bubblewrap sandbox, and watches and stops.

It is a ``rlmesh.RemoteModel`` (over a unix socket) whose server (``rlmesh serve model``) runs
in another interpreter: one holding the policy's packages (``packages=``, a cached virtual
environment) or one the user names (``python=``), sandboxed by bubblewrap unless
``sandbox=False``. The driver assembles the model's payload as for any served model (its spec
comes in the handshake); the server batches and calls the policy.

The server starts at construction (the handshake gives the spec the run compiles its plan
against) and stops when the model is closed, at the end of each run; a later run starts it
again. A copy made by pickling (a cluster run's workers get one) starts a server of its own,
from the same packages or interpreter, where it is unpickled. A server that dies fails the
call waiting on it with ``SandboxCrashedError`` (its last lines of output in it); with
``restart=K`` it is started again up to K times and the call is sent again. What the policy
kept per episode on the dead server is lost, so a restart keeps results identical for
policies whose actions depend only on their input.

Example:
    >>> import sys, rlmesh
    >>> model = SandboxModel("cartpole-heuristic", python=sys.executable, sandbox=False)
    >>> result = rlmesh.run(model, "CartPole-v1", episodes=2, max_episode_steps=20)
    >>> [episode.steps for episode in result.episodes], model.running
    ([20, 20], False)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..contexts import PredictContext
from ..errors import RemoteError
from ..model import Model, Route
from ..remote.model_client import RemoteModel
from ..utils import positive_int
from .bwrap import require_bwrap
from .errors import SandboxCrashedError
from .server_process import START_TIMEOUT_S, SandboxedServer, ServerFacts
from .venvs import Progress, sandbox_python

CRASH_WAIT_S = 2.0
"""How long a failed call waits for the server's process to end before the failure is taken
for the server's death."""

T = TypeVar("T")


class SandboxModel(ServerFacts, Model):
    """The policy ``policy`` served from a sandbox rlmesh starts, as a ``Model``
    (``rlmesh.run(SandboxModel(...), env)``).

    Args:
        policy: ``"package.module:Name"`` or ``"path/to/file.py:Name"`` (a ``Model``
            subclass, a ``Model`` instance or a function ``fn(obs) -> action``), or
            ``"cartpole-heuristic"``, as
            ``rlmesh serve model`` takes it: loaded in the sandbox's interpreter, where its
            packages are.
        packages: pip requirements the policy needs (``["torch==2.5.1"]``): installed, with
            rlmesh's runtime requirements, in a virtual environment built on first use and
            cached by the sorted requirements and the Python version.
        python: the interpreter to build that environment from; without ``packages``, an
            interpreter used as it is (it must hold rlmesh's runtime requirements).
        network: let the policy reach the network (default: no network at all).
        sandbox: run the server under bubblewrap (needs ``bwrap``); False runs it in its own
            interpreter and environment without the namespaces.
        restart: how many times a server that died is started again (default 0).
        start_timeout: seconds the server may take to load the policy and listen.
        max_batch: the most rows one call of the policy takes (None: no limit).
        progress: told each line of a first build's progress (default: stderr).
        core: the core of the calls' transport and of the server (default the active core).

    Raises:
        SandboxUnavailableError: ``sandbox=True`` where bubblewrap is missing.
        SandboxBuildError: the environment's packages could not be installed.
        SandboxStartError: the server exited or did not listen within ``start_timeout``;
            the error holds its last lines of output.
    """

    # The server keys what the policy remembers by episode id: lanes share it safely.
    stateless = True

    def __init__(
        self,
        policy: str,
        *,
        packages: str | Sequence[str] = (),
        python: str | None = None,
        network: bool = False,
        sandbox: bool = True,
        restart: int = 0,
        start_timeout: float = START_TIMEOUT_S,
        max_batch: int | None = None,
        progress: Progress | None = None,
        core: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(policy, str):
            raise TypeError(
                f"SandboxModel(policy): expected 'package.module:Name' or "
                f"'path/to/file.py:Name', got a {type(policy).__name__}: an object cannot "
                f"cross into another interpreter"
            )
        self.policy = policy
        # What a copy starts its own server with (__reduce__): the arguments as data.
        self._arguments = {
            "packages": (packages,) if isinstance(packages, str) else tuple(packages),
            "python": None if python is None else os.path.abspath(os.path.expanduser(python)),
            "network": network,
            "sandbox": sandbox,
            "restart": restart,
            "start_timeout": start_timeout,
            "max_batch": max_batch,
            "core": core,
        }
        self._restart = int(restart)
        if self._restart < 0:
            raise ValueError(f"restart must be 0 or more, got {restart}")
        self.restarts = 0
        self._core = core
        self._route: Route | None = None
        target, read_only = _served_policy(policy)
        serve_args = ["serve", "model", target]
        if max_batch is not None:
            serve_args += ["--max-batch", str(positive_int("max_batch", max_batch))]
        self.sandboxed = bool(sandbox)
        if self.sandboxed:
            require_bwrap()  # before a long build: say at once what is missing
        self._server = SandboxedServer(
            "model",
            serve_args,
            python=sandbox_python(packages, python, progress),
            sandbox=self.sandboxed,
            network=network,
            read_only=read_only,
            extra_path=os.getcwd(),
            start_timeout=start_timeout,
            core=core,
        )
        self._client = self._connect()
        self.spec = self._client.spec

    def _connect(self) -> RemoteModel:
        address = self._server.start()
        try:
            client = RemoteModel(address, core=self._core)
        except BaseException:
            self._server.stop()
            raise
        if self._route is not None:
            client.on_route(self._route)
        return client

    def __reduce__(self) -> tuple[Any, ...]:
        # A server does not travel: a copy (a cluster's worker) starts one like it, from the
        # same packages or interpreter, when it is unpickled.
        return (functools.partial(type(self), **self._arguments), (self.policy,))

    def __repr__(self) -> str:
        kind = "sandboxed" if self.sandboxed else "isolated"
        return f"SandboxModel({self.policy}, {kind})"

    # ---------------------------------------------------------------- the model

    def on_route(self, route: Route) -> None:
        """Tell the served policy the run's spaces (``RemoteModel.on_route``)."""
        self._route = route
        self._client.on_route(route)

    def load(self) -> None:
        """Start the server again if a previous run's end stopped it, then open the stream."""
        if not self._server.running:
            self._client = self._connect()
        self._guarded("loading", lambda client: client.load())

    def predict_batch(self, obs: Any, context: list[PredictContext]) -> Any:
        """One action per row, from the served policy."""
        return self._guarded("a predict", lambda client: client.predict_batch(obs, context))

    def predict_chunk_batch(
        self, obs: Any, execution_horizon: int | None = None, context: list[PredictContext] = ()
    ) -> Any:
        """Chunks ``[K, H, ...]`` from the served policy."""
        return self._guarded(
            "a predict",
            lambda client: client.predict_chunk_batch(obs, execution_horizon, context),
        )

    def on_episode_end(self, episode_id: int) -> None:
        """Tell the served policy the episode ended."""
        self._guarded("an episode's end", lambda client: client.on_episode_end(episode_id))

    def close(self) -> None:
        """Close the stream and stop the server (a later run starts it again)."""
        try:
            self._client.close()
        finally:
            self._server.stop()

    # ---------------------------------------------------------------- faults

    def _guarded(self, doing: str, call: Callable[[RemoteModel], T]) -> T:
        """``call(client)``; when it failed because the server died, a new server (loaded,
        told the route) and the call again, or ``SandboxCrashedError`` beyond the restarts."""
        while True:
            try:
                return call(self._client)
            except RemoteError as err:
                if isinstance(err, SandboxCrashedError) or not self._server.died(CRASH_WAIT_S):
                    raise
                if self.restarts >= self._restart:
                    raise self._crashed(doing) from err
                self.restarts += 1
                self._client.close()
                self._server.stop(grace=0)
                self._client = self._connect()
                if doing != "loading":
                    self._client.load()

    def _crashed(self, doing: str) -> SandboxCrashedError:
        server = self._server
        restarts = (
            f"it was restarted {self.restarts} times already (restart={self._restart})"
            if self._restart
            else "pass restart=K to start it again"
        )
        return SandboxCrashedError(
            f"{server.describe()} of {self.policy} died (exit status {server.exit_code}) during "
            f"{doing}; {restarts}",
            address=server.address,
            output=server.output(),
            exit_code=server.exit_code,
        )


def _served_policy(policy: str) -> tuple[str, list[str]]:
    """What the server is told to load, and the paths it must read: a policy's file as an
    absolute path, its directory bound read-only."""
    target, colon, name = policy.rpartition(":")
    if colon and target.endswith(".py"):
        path = Path(target).expanduser().absolute()
        if not path.is_file():
            raise ValueError(f"SandboxModel({policy!r}): no file {path}")
        return f"{path}:{name}", [str(path.parent)]
    return policy, []


__all__ = ["CRASH_WAIT_S", "SandboxModel"]
