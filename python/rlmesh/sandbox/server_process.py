"""One ``rlmesh serve env|model`` process that rlmesh starts in an interpreter of its own, under
bubblewrap or not, and watches and stops: ``SandboxedServer``.

How the server runs this rlmesh without the user's environment: the interpreter (a cached
virtual environment, ``venvs.py``, or one the user names) holds only rlmesh's runtime
dependencies and the packages asked for; this rlmesh's package directory (the same files,
so the same version) is put first on its path, read-only. It runs the driver's core: the
Rust core's module is built against Python's stable ABI and finds numpy's C API at run time,
so it imports with numpy 1.x as with 2.x; where it does not import (another Python
implementation), the server falls back to the pure-Python core, which needs no compiled part
of rlmesh; ``core="python"`` (``RLMESH_CORE=python`` there) asks for it outright. Nothing of
the user's environment reaches it: its variables are a short list (``PASSED_THROUGH``), its
home, caches and temporary files are in its work directory, removed when it stops.

Each server gets a run directory (``rlmesh-sandbox-*`` in the temporary directory) holding
``sock/`` (its unix socket), ``work/`` (its working and home directory, the one place it may
write) and ``path/rlmesh`` (this rlmesh's package, bound or linked). It starts with a pipe as
its stdin and stops itself when that pipe closes (the boot code watches it), so it goes when
the process that started it goes, however that process ends; under bubblewrap
``--die-with-parent`` does the same for the whole sandbox. Start-up waits for the line in
which the server says where it listens, then for its ``grpc.health.v1`` check to answer
SERVING, within ``start_timeout``; its stdout and stderr are read all along and the last
lines kept (``output``) for the errors that say why it failed.

Example:
    >>> server = SandboxedServer("env", ["serve", "env", "CartPole-v1"], sandbox=False)
    >>> server.start().startswith("unix://")
    True
    >>> server.running
    True
    >>> server.stop()
    >>> server.running
    False
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..core import core_name
from ..errors import RemoteError
from .bwrap import bwrap_argv, require_bwrap
from .errors import SandboxStartError
from .requirements import PACKAGE_DIR

START_TIMEOUT_S = 120.0
"""How long a server may take to say it listens and answer its health check, by default."""
STOP_GRACE_S = 5.0
"""How long a server may take to stop once told (its stdin closed) before it is killed."""
OUTPUT_KEPT = 200
"""How many of a server's last lines of output are kept for errors."""
PASSED_THROUGH = (
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "EGL_PLATFORM",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)
"""The variables of this process a server gets (rendering, threads, locale); no others."""

# Run with ``python -c BOOT PATH_DIR EXTRA_PATH rlmesh-arguments...``: this rlmesh first on
# the path, a thread that stops the server (SIGTERM, on which `rlmesh serve` closes) when its
# stdin closes, then the `rlmesh` command itself. The thread reads the raw descriptor: a
# daemon thread blocked in sys.stdin's buffered reader holds its lock, which aborts the
# interpreter's shutdown.
BOOT = """\
import os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
if sys.argv[2]:
    sys.path.append(sys.argv[2])
def _watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=_watch_parent, name="rlmesh-parent-watch", daemon=True).start()
sys.argv = ["rlmesh", *sys.argv[3:]]
from rlmesh.cli import main
sys.exit(main())
"""


class SandboxedServer:
    """``rlmesh SERVE_ARGS --address unix://...`` in ``python``, sandboxed by bubblewrap
    unless ``sandbox`` is False.

    Args:
        what: what it serves, for messages (``"env"``, ``"model"``).
        serve_args: the ``rlmesh`` command's arguments but the address
            (``["serve", "env", "CartPole-v1", "--num-envs", "4"]``).
        python: the interpreter (default: this one).
        sandbox: run it under bubblewrap (``bwrap.py``); False runs it without namespaces.
        network: with ``sandbox``, share the host's network (default: a network namespace of
            its own, with nothing in it).
        read_only: more paths it reads (a factory's file, the current directory), bound
            read-only into the sandbox.
        extra_path: a directory appended to its ``sys.path`` (read-only), or None.
        environment: more variables for it.
        start_timeout: seconds to wait for it to listen and answer its health check.
        core: the core it runs and whose transport makes the health check (default: the
            active core); ``"rust"`` falls back to the Python core where the Rust core does
            not import in its interpreter.
        graceful: stop it by closing its stdin (it closes its env or model and exits), for a
            server that leaves something on the host when killed (worker processes' shared
            memory in the host's ``/dev/shm``, not sandboxed); default: kill it at once,
            since nothing of it outlives its run directory and, sandboxed, its namespaces,
            and a graceful stop costs a quarter of a second.
    """

    def __init__(
        self,
        what: str,
        serve_args: Sequence[str],
        *,
        python: str | None = None,
        sandbox: bool = True,
        network: bool = False,
        read_only: Sequence[str] = (),
        extra_path: str | None = None,
        environment: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
        core: str | None = None,
        graceful: bool = False,
    ) -> None:
        self.what = what
        self.graceful = graceful
        self.serve_args = list(serve_args)
        self.python = python or sys.executable
        self.sandbox = sandbox
        self.network = network
        self.read_only = list(read_only)
        self.extra_path = extra_path
        self.environment = dict(environment or {})
        self.start_timeout = start_timeout
        self.core = core
        self.address = ""
        self._bwrap = require_bwrap() if sandbox else None
        self._process: subprocess.Popen[bytes] | None = None
        self._output: deque[str] = deque(maxlen=OUTPUT_KEPT)
        self._finalizer: Any = None
        self._readers: list[threading.Thread] = []
        self._run_dir = Path()

    # ---------------------------------------------------------------- state

    @property
    def pid(self) -> int | None:
        """The pid of the process started (bubblewrap's, when sandboxed), None before."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Whether the server's process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """Its exit status once it ended (negative: the signal that ended it), else None."""
        return None if self._process is None else self._process.poll()

    def output(self) -> list[str]:
        """Its last lines of output (stdout and stderr, in the order they were read)."""
        return list(self._output)

    def died(self, within_s: float = 2.0) -> bool:
        """Whether it is dead, waiting up to ``within_s`` for a process that is going (its
        socket closes a moment before it ends)."""
        if self._process is None:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=within_s)
        return self._process.poll() is not None

    def describe(self) -> str:
        """What it is, for messages: ``"the sandboxed env server (pid 123)"``."""
        kind = "sandboxed" if self.sandbox else "isolated"
        return f"the {kind} {self.what} server (pid {self.pid})"

    # ---------------------------------------------------------------- start and stop

    def start(self) -> str:
        """Start it and wait until it answers its health check; its address.

        Raises:
            SandboxStartError: it exited, or did not answer within ``start_timeout`` (it is
                stopped then); the error holds its last lines of output.
        """
        if self.running:
            raise RuntimeError(f"{self.describe()} is already running")
        self._output.clear()
        run_dir = Path(tempfile.mkdtemp(prefix="rlmesh-sandbox-"))
        try:
            argv, environment, work = self._command(run_dir)
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=environment,
                start_new_session=True,  # its own group: a Ctrl-C reaches it through us
            )
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        self._process = process
        ready = threading.Event()
        self._readers = [
            _reader(process.stdout, self._output, ready),
            _reader(process.stderr, self._output, None),
        ]
        self._finalizer = weakref.finalize(
            self, _stop, process, self._readers, run_dir, self._grace()
        )
        try:
            self._wait_ready(ready)
        except BaseException:
            self.stop()
            raise
        return self.address

    def stop(self, grace: float | None = None) -> None:
        """Stop it and remove its run directory. Stopping again does nothing.

        With ``graceful`` (and ``grace`` not 0), its stdin is closed (it closes its env or
        model and exits) and it is killed after ``grace`` seconds (default
        ``STOP_GRACE_S``); else it is killed at once.
        """
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
            process = self._process
            assert process is not None
            _stop(process, self._readers, self._run_dir, self._grace(grace))

    def _grace(self, grace: float | None = None) -> float:
        if not self.graceful:
            return 0.0
        return STOP_GRACE_S if grace is None else grace

    def _command(self, run_dir: Path) -> tuple[list[str], dict[str, str], str]:
        """The command line, its variables and working directory, in ``run_dir``."""
        self._run_dir = run_dir
        sock, work, path = run_dir / "sock", run_dir / "work", run_dir / "path"
        for directory in (sock, work, path, work / "tmp"):
            directory.mkdir()
        socket_path = sock / f"{self.what}.sock"
        self.address = f"unix://{socket_path}"
        package = path / "rlmesh"
        argv = [
            self.python,
            "-c",
            BOOT,
            str(path),
            self.extra_path or "",
            *self.serve_args,
            "--address",
            self.address,
        ]
        if self._bwrap is None:
            package.symlink_to(PACKAGE_DIR, target_is_directory=True)
        else:
            package.mkdir()  # the mount point of the package, bound read-only
            read_only = [*_interpreter_paths(self.python), *self.read_only]
            if self.extra_path:
                read_only.append(self.extra_path)
            argv = [
                *bwrap_argv(
                    read_only=[p for p in read_only if os.path.exists(p)],
                    writable=[str(sock), str(work)],
                    network=self.network,
                    workdir=str(work),
                    bwrap=self._bwrap,
                ),
                "--ro-bind",
                str(PACKAGE_DIR),
                str(package),
                "--",
                *argv,
            ]
        environment = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        bin_dir = str(Path(self.python).parent)
        environment.update(
            PATH=os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
            HOME=str(work),
            TMPDIR=str(work / "tmp"),
            XDG_CACHE_HOME=str(work / ".cache"),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONNOUSERSITE="1",
            PYTHONUNBUFFERED="1",
        )
        if (self.core or core_name()) == "python":
            environment["RLMESH_CORE"] = "python"
        # Else unset: the Rust core where it imports (its abi3 module takes numpy 1.x and 2.x
        # alike), the pure-Python core, with a one-line warning, where it does not.
        environment.update(self.environment)
        return argv, environment, str(work)

    def _wait_ready(self, ready: threading.Event) -> None:
        process = self._process
        assert process is not None
        deadline = time.monotonic() + self.start_timeout
        while not ready.wait(0.02):
            if process.poll() is not None:
                _settle(self._readers)
                raise SandboxStartError(
                    f"{self.describe()} exited with status {process.returncode} before it "
                    f"listened ({_command_line(self.serve_args)})",
                    output=self.output(),
                    exit_code=process.returncode,
                )
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"{self.describe()} did not listen within {self.start_timeout:g} s "
                    f"(start_timeout) ({_command_line(self.serve_args)})",
                    output=self.output(),
                )
        try:
            self._health_check(max(1.0, deadline - time.monotonic()))
        except RemoteError as err:
            raise SandboxStartError(
                f"{self.describe()} listens at {self.address} but its health check failed: {err}",
                output=self.output(),
                exit_code=process.poll(),
            ) from None

    def _health_check(self, timeout: float) -> None:
        """``grpc.health.v1.Health/Check`` of the server; a ``RemoteError`` unless SERVING."""
        from grpc_health.v1 import health_pb2

        from ..remote.connection import HEALTH_PREFIX, open_channel, remote_failure, wire_transport

        channel, _ = open_channel(self.address, connect_timeout=timeout, core=self.core)
        try:
            raw = channel.unary(f"{HEALTH_PREFIX}Check", b"", metadata=(), timeout=timeout)
        except wire_transport(self.core).WireStatusError as err:
            raise remote_failure(err, self.address, "the health check") from None
        finally:
            channel.close()
        status = health_pb2.HealthCheckResponse.FromString(raw).status
        if status != health_pb2.HealthCheckResponse.SERVING:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            raise RemoteError(f"the health check answered {name}", address=self.address)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SandboxedServer({self.what}, {self.address or 'not started'}, {state})"


def _interpreter_paths(python: str) -> list[str]:
    """The directories an interpreter needs: its environment's (the parent of ``bin``), and
    its real installation's, which a virtual environment's ``bin/python`` links to."""
    paths = [str(Path(python).absolute().parent.parent)]
    real = Path(os.path.realpath(python)).parent.parent
    paths.append(str(real))
    return list(dict.fromkeys(paths))


def _reader(
    stream: IO[bytes] | None, kept: deque[str], ready: threading.Event | None
) -> threading.Thread:
    """A thread that reads ``stream`` line by line into ``kept`` (so the server never blocks
    on a full pipe), setting ``ready`` at the line that says where the server listens."""

    def read() -> None:
        assert stream is not None
        with contextlib.suppress(ValueError, OSError):  # closed under us at stop
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip()
                if ready is not None and not ready.is_set() and " at unix://" in line:
                    ready.set()
                    continue
                if line:
                    kept.append(line)

    thread = threading.Thread(target=read, name="rlmesh-sandbox-output", daemon=True)
    thread.start()
    return thread


def _settle(readers: Sequence[threading.Thread], timeout: float = 1.0) -> None:
    """Let the readers take what a process that ended wrote last."""
    for thread in readers:
        thread.join(timeout)


def _stop(
    process: subprocess.Popen[bytes],
    readers: Sequence[threading.Thread],
    run_dir: Path,
    grace: float,
) -> None:
    """Stop ``process`` (its stdin closed, then its group killed after ``grace`` s; at once
    with no grace), reap it, drain its output and remove ``run_dir``."""
    try:
        if grace > 0 and process.poll() is None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
        # Whatever is left of its group (worker processes of a server not under bubblewrap);
        # under bubblewrap, killing it kills the sandbox (--die-with-parent).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        _settle(readers, 2.0)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _command_line(args: Sequence[str]) -> str:
    return "rlmesh " + " ".join(args)


__all__ = ["BOOT", "PASSED_THROUGH", "START_TIMEOUT_S", "STOP_GRACE_S", "SandboxedServer"]


class ServerFacts:
    """What a sandboxed side says of its server (``SandboxEnv``, ``SandboxModel``), from
    its ``_server`` (a ``SandboxedServer``)."""

    _server: SandboxedServer

    @property
    def address(self) -> str:
        """The server's unix socket (a new one after a restart)."""
        return self._server.address

    @property
    def pid(self) -> int | None:
        """The pid of the server's process (bubblewrap's, when sandboxed)."""
        return self._server.pid

    @property
    def running(self) -> bool:
        """Whether the server is alive."""
        return self._server.running

    def output(self) -> list[str]:
        """The server's last lines of output."""
        return self._server.output()
