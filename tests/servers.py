"""Servers in their own processes for the remote tests: ours (``rlmesh serve ...``) and the
published rlmesh 0.1.0's, in a virtual environment of its own.

``served(argv)`` starts a process that prints the address it listens on (``tcp://...`` or
``unix://...``) on a line of its stdout, waits for that line, yields the address, and stops
the process (and its group) on exit, whatever happened (``stop``). ``peer_python()`` is the
Python of a venv holding ``rlmesh==0.1.0`` and Gymnasium: made once and cached under
``$RLMESH_PEER_VENV`` (default ``~/.cache/rlmesh-tests/peer-0.1.0``); a test that needs it
skips, saying why, only when the install itself fails. ``openpi_client_python()`` is the
same for a venv holding openpi's own client (``openpi-client``), cached under
``$RLMESH_OPENPI_CLIENT_VENV`` (default ``~/.cache/rlmesh-tests/peer-openpi-client``).
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import venv
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

PEER_VERSION = "0.1.0"
PEER_REQUIREMENTS = [f"rlmesh=={PEER_VERSION}", "gymnasium>=1.0,<2", "numpy"]
_ADDRESS = re.compile(r"((?:tcp|unix|ws)://\S+)")


def peer_venv_dir() -> Path:
    default = Path.home() / ".cache" / "rlmesh-tests" / f"peer-{PEER_VERSION}"
    return Path(os.environ.get("RLMESH_PEER_VENV", default))


def cached_venv(root: Path, installs: list[list[str]], what: str) -> str:
    """The Python of a venv at ``root`` holding what ``installs`` (pip arguments, one list a
    step) install, made on first use and kept; ``pytest.skip`` naming ``what`` if pip fails."""
    python = root / "bin" / "python"
    marker = root / ".installed"
    if marker.exists() and python.exists():
        return str(python)
    root.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    for step in installs:
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *step],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if install.returncode != 0:
            pytest.skip(
                f"cannot install {what} ({' '.join(step)}) into {root}: "
                f"{install.stderr.strip().splitlines()[-1:]}"
            )
    marker.write_text(what)
    return str(python)


def peer_python() -> str:
    """The Python of the peer's venv, made on first use; ``pytest.skip`` if pip cannot
    install the published package."""
    return cached_venv(peer_venv_dir(), [PEER_REQUIREMENTS], "the published peer")


# openpi-client pins numpy<2 but runs on numpy 2; it imports typing_extensions, msgpack and
# websockets, so those come beside it instead of its own (too narrow) requirements.
OPENPI_CLIENT_REQUIREMENTS = ["msgpack", "websockets", "typing_extensions", "numpy"]


def openpi_client_venv_dir() -> Path:
    default = Path.home() / ".cache" / "rlmesh-tests" / "peer-openpi-client"
    return Path(os.environ.get("RLMESH_OPENPI_CLIENT_VENV", default))


def openpi_client_python() -> str:
    """The Python of a venv holding ``openpi-client`` (openpi's ``WebsocketClientPolicy``),
    made on first use; ``pytest.skip`` if pip cannot install it."""
    return cached_venv(
        openpi_client_venv_dir(),
        [["--no-deps", "openpi-client"], OPENPI_CLIENT_REQUIREMENTS],
        "openpi's client",
    )


@contextlib.contextmanager
def served(
    argv: Sequence[str], *, ready_timeout: float = 60.0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``argv`` until the block ends; yields the first address it prints on stdout."""
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield read_address(process, ready_timeout)
    finally:
        stop(process)


def read_address(process: subprocess.Popen[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    seen: list[str] = []
    while time.monotonic() < deadline:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        match = _ADDRESS.search(line)
        if match:
            return match.group(1)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    stderr = process.stderr.read() if process.stderr else ""
    stop(process)  # closes the streams, so only after reading what it said
    raise AssertionError(
        f"{' '.join(process.args)} printed no address within {timeout} s; "
        f"stdout: {''.join(seen)!r}; stderr: {stderr[-2000:]!r}"
    )


def read_line(process: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The next line of ``process``'s stdout, or an AssertionError after ``timeout`` seconds
    (so a process that never prints cannot hang a test)."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    try:
        if not selector.select(timeout=timeout):
            raise AssertionError(
                f"{' '.join(map(str, process.args))} printed nothing in {timeout} s"
            )
        return process.stdout.readline()
    finally:
        selector.close()


STOP_GRACE_S = 5.0


def stop(process: subprocess.Popen[str]) -> None:
    """Stop ``process`` with SIGTERM, on which a server closes its lanes (their worker
    processes and shared memory go with them, and multiprocessing's named semaphores, which a
    SIGKILL of the whole session would leave in /dev/shm); then kill what is left of its session
    (all of it, if the server did not end within ``STOP_GRACE_S``), and reap it."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def rlmesh_cli(*args: str) -> list[str]:
    """``rlmesh ARGS`` with this interpreter (so the checkout under test is what runs)."""
    return [sys.executable, "-m", "rlmesh", *args]
