"""What every sandbox test shares: the virtual environments' cache, kept between runs, and the
check that a test leaves nothing behind (no server process, run directory, lock or mount)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the remote extra (grpcio) is not installed")

from helpers import live_processes

# Built once and reused by every later run, as tests/servers.py keeps the peers' venvs.
VENVS = Path(
    os.environ.get("RLMESH_SANDBOX_VENVS")
    or Path.home() / ".cache" / "rlmesh-tests" / "sandbox-venvs"
)

RUN_DIR_PREFIX = "rlmesh-sandbox-"


def sandbox_processes() -> set[int]:
    """The live processes whose command line names a sandbox's run directory (a server, its
    bubblewrap and its worker processes)."""
    return live_processes(RUN_DIR_PREFIX.encode())


def run_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(RUN_DIR_PREFIX)}


def locks() -> set[str]:
    return {path.name for path in VENVS.glob("*.lock")} if VENVS.exists() else set()


def mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


@pytest.fixture(autouse=True)
def venv_cache(monkeypatch):
    """The sandboxes' environments in the tests' cache (commands the tests start inherit it)."""
    monkeypatch.setenv("RLMESH_SANDBOX_VENVS", str(VENVS))


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Fail a test after which a sandbox's process, run directory, lock file or a mount of
    this process's namespace is left (processes get a few seconds to go)."""
    before = (sandbox_processes(), run_dirs(), locks(), mounts())
    yield
    deadline = time.monotonic() + 10
    while True:
        after = (sandbox_processes(), run_dirs(), locks(), mounts())
        left = [
            f"{what}: {sorted(now - was) if isinstance(now, set) else 'changed'}"
            for what, was, now in zip(
                ("processes", "run directories", "locks", "mounts"), before, after, strict=True
            )
            if (now - was if isinstance(now, set) else now != was)
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, "left behind: " + "; ".join(left)
