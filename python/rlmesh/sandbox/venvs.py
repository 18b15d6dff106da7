"""The virtual environments sandboxes run in: built once per set of requirements and Python,
then reused.

``cached_venv(requirements, python=...)`` returns the interpreter of a virtual environment
holding ``requirements`` (sorted and deduplicated: the order they were given in does not
matter) made from ``python`` (default: this interpreter). It is kept under
``venv_root()/<key>``, the key a hash of the requirements and of the interpreter (its
implementation, version and real path), and marked complete only once every package is in; a
build that failed or was killed leaves no mark, and the next use builds it again from scratch.

The build uses ``uv`` (``uv venv`` then ``uv pip install``) when the ``uv`` package is
importable or ``uv`` is on PATH, else the standard library's ``venv`` and pip. Its output is
shown line by line (``progress``, default: stderr), since a first build downloads packages and
takes minutes. Both compile every package's bytecode as they install it: a sandboxed server
runs with ``PYTHONDONTWRITEBYTECODE`` over a read-only root, so an environment without its
``.pyc`` files would compile numpy, grpc and gymnasium from source at every start and at every
first use of a lazily imported module. Two processes that ask for the same environment at once
do not both build it: a lock file beside it (``<key>.lock``, ``fcntl.flock``) makes the second
wait for the first, then reuse what it built; the lock file is removed when its holder is done.

Example:
    >>> key = venv_key(["numpy<2", "gymnasium"], ("CPython", "3.11.7", "/usr/bin/python3.11"))
    >>> key == venv_key(["gymnasium", "numpy<2", "gymnasium"], ("CPython", "3.11.7",
    ...                  "/usr/bin/python3.11"))
    True
    >>> len(key)
    16
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import SandboxBuildError
from .requirements import runtime_requirements

Progress = Callable[[str], None]
"""Told each line of a build's progress."""

BUILD_TIMEOUT_S = 1800.0
"""The longest a build of one environment may take (downloads included)."""
MARKER = "rlmesh-sandbox.json"
"""Written into an environment once it holds every package: what it holds, how it was built."""
LAYOUT = 2
"""The marker's ``layout``: an environment built with another (1: without compiled bytecode,
unmarked) is built again on its next use."""
OUTPUT_KEPT = 40
"""How many of an installer's last lines of output a failed build reports."""


def venv_root() -> Path:
    """Where environments are kept: ``$RLMESH_SANDBOX_VENVS``, else ``sandbox-venvs`` in
    rlmesh's cache (``$RLMESH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlmesh``, else
    ``~/.cache/rlmesh``)."""
    explicit = os.environ.get("RLMESH_SANDBOX_VENVS")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("RLMESH_CACHE_DIR")
    if not cache:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        cache = os.path.join(base, "rlmesh")
    return Path(cache).expanduser() / "sandbox-venvs"


def stderr_progress(line: str) -> None:
    """The default ``Progress``: each line on stderr, marked as the sandbox's."""
    print(f"rlmesh: sandbox: {line}", file=sys.stderr, flush=True)


def interpreter_identity(python: str | None = None) -> tuple[str, str, str]:
    """``(implementation, version, real path)`` of ``python`` (default: this interpreter).

    Raises:
        SandboxBuildError: ``python`` does not run.
    """
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return (
            platform.python_implementation(),
            platform.python_version(),
            os.path.realpath(sys.executable),
        )
    probe = "import platform; print(platform.python_implementation(), platform.python_version())"
    try:
        answer = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxBuildError(
            f"python={python!r} does not run ({type(exc).__name__}: {exc}); expected the path "
            f"of a Python interpreter (3.10 or later)"
        ) from None
    implementation, version = answer.stdout.split()
    return implementation, version, os.path.realpath(python)


def venv_key(requirements: Sequence[str], identity: tuple[str, str, str]) -> str:
    """The cache key of an environment: a hash of the sorted requirements and the
    interpreter's identity (``interpreter_identity``)."""
    text = json.dumps(
        {"requirements": sorted(set(requirements)), "python": list(identity)}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def find_uv() -> str | None:
    """The ``uv`` executable: the ``uv`` package's, else the one on PATH; None without."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv

        return str(uv.find_uv_bin())
    return shutil.which("uv")


def cached_venv(
    requirements: Sequence[str],
    *,
    python: str | None = None,
    progress: Progress | None = None,
    root: str | os.PathLike[str] | None = None,
) -> str:
    """The interpreter of an environment holding ``requirements``, made from ``python``;
    built on first use (see the module), reused after.

    Args:
        requirements: pip requirement strings (``"gym-pusht==0.1.8"``, ``"numpy<2"``).
        python: the interpreter to make it from (default: this one).
        progress: told each line of a build's progress (default: ``stderr_progress``).
        root: where environments are kept (default: ``venv_root()``).

    Raises:
        SandboxBuildError: the installer failed (the message holds its last lines), or took
            longer than ``BUILD_TIMEOUT_S``.
    """
    tell = progress or stderr_progress
    identity = interpreter_identity(python)
    wanted = sorted(set(requirements))
    directory = Path(root) if root is not None else venv_root()
    target = directory / venv_key(wanted, identity)
    interpreter = target / "bin" / "python"
    if _complete(target):
        return str(interpreter)
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(target.with_name(target.name + ".lock"), tell, target):
        if _complete(target):  # another process built it while this one waited
            return str(interpreter)
        _build(target, wanted, identity, tell)
    return str(interpreter)


def sandbox_python(
    packages: str | Sequence[str] = (),
    python: str | None = None,
    progress: Progress | None = None,
) -> str:
    """The interpreter a sandboxed server runs in: ``python`` as it is when it comes without
    ``packages`` (it must hold rlmesh's runtime requirements itself); else the cached
    environment (``cached_venv``) made from ``python`` (default: this interpreter) holding
    rlmesh's runtime requirements and ``packages``.

    Raises:
        ValueError: ``python`` is not an executable file.
        SandboxBuildError: building the environment failed.
    """
    wanted = [packages] if isinstance(packages, str) else list(packages)
    if python is not None:
        python = os.path.abspath(os.path.expanduser(python))
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(
                f"python={python!r} is not an executable file; expected the path of a Python "
                f"interpreter, such as a virtual environment's bin/python"
            )
        if not wanted:
            return python
    return cached_venv([*runtime_requirements(), *wanted], python=python, progress=progress)


def _complete(target: Path) -> bool:
    """Whether ``target`` holds every package, built the way this version builds."""
    try:
        record = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    layout = record.get("layout") if isinstance(record, dict) else None
    return layout == LAYOUT and (target / "bin" / "python").exists()


def _build(
    target: Path, requirements: list[str], identity: tuple[str, str, str], tell: Progress
) -> None:
    uv = find_uv()
    tool = "uv" if uv else "venv and pip"
    shown = ", ".join(requirements) or "no packages"
    tell(f"building a virtual environment with {tool} for {shown} (first use; kept in {target})")
    started = time.monotonic()
    shutil.rmtree(target, ignore_errors=True)  # what a failed or killed build left
    python = target / "bin" / "python"
    base = identity[2]
    if uv:
        create = [uv, "venv", "--python", base, str(target)]
        install = [uv, "pip", "install", "--compile-bytecode", "--python", str(python)]
        install += requirements
    else:  # pip compiles bytecode by default
        create = [base, "-m", "venv", str(target)]
        install = [str(python), "-m", "pip", "install", "--progress-bar", "off", *requirements]
    deadline = started + BUILD_TIMEOUT_S
    try:
        _run_step(create, tell, deadline)
        if requirements:
            _run_step(install, tell, deadline)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    record = {
        "layout": LAYOUT,
        "requirements": requirements,
        "python": list(identity),
        "built_with": tool,
        "build_seconds": round(seconds, 1),
    }
    (target / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    tell(f"built in {seconds:.0f} s")


def _run_step(argv: list[str], tell: Progress, deadline: float) -> None:
    """Run one installer command, telling each line of its output; a ``SandboxBuildError``
    with its last lines when it fails or outlives ``deadline``."""
    kept: deque[str] = deque(maxlen=OUTPUT_KEPT)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # Ctrl-C reaches it through our teardown, which kills it
    )
    try:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip()
            if line:
                kept.append(line)
                tell(line)
            if time.monotonic() > deadline:
                raise SandboxBuildError(
                    f"building a sandbox's virtual environment took longer than "
                    f"{BUILD_TIMEOUT_S:g} s ({' '.join(argv[:3])} ...)",
                    output=kept,
                )
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise SandboxBuildError(
            f"building a sandbox's virtual environment took longer than {BUILD_TIMEOUT_S:g} s",
            output=kept,
        ) from None
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    if code != 0:
        raise SandboxBuildError(
            f"building a sandbox's virtual environment failed: {' '.join(argv)} exited with "
            f"status {code}",
            output=kept,
        )


@contextlib.contextmanager
def _build_lock(path: Path, tell: Progress, target: Path) -> Iterator[None]:
    """Hold ``path`` locked (``flock``) while building ``target``; the file is removed before
    the lock is let go. A waiter that got the lock of a file removed meanwhile takes the new
    one, so two holders never overlap."""
    told = False
    while True:
        handle = open(path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    tell(f"waiting for another process building {target}")
                    told = True
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
        except BaseException:
            handle.close()
            raise
        handle.close()  # its holder removed it: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        handle.close()


__all__ = [
    "BUILD_TIMEOUT_S",
    "LAYOUT",
    "MARKER",
    "cached_venv",
    "find_uv",
    "interpreter_identity",
    "sandbox_python",
    "stderr_progress",
    "venv_key",
    "venv_root",
]
