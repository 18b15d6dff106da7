"""Shared fixtures: every core-facing test runs against both cores."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The tests' folders mirror the package's; test modules, their helpers (helpers.py,
# servers.py, ...) and the envs worker processes and Ray workers load import one another by
# name, so every folder is on this process's path (worker processes inherit it, and Ray
# workers get it as the job's search path).
TESTS = Path(__file__).resolve().parent
FOLDERS = [
    str(TESTS),
    *sorted(str(path) for path in TESTS.iterdir() if path.is_dir() and any(path.glob("test_*.py"))),
]
sys.path[:0] = [folder for folder in FOLDERS if folder not in sys.path]

from rlmesh.core import load_core  # noqa: E402

# imageio-ffmpeg (the tests' video reader and writer) starts ffmpeg with preexec_fn=os.setpgrp
# unless this is set: a real fork() that runs Python and gRPC's fork handlers in the child of
# a process with gRPC and Ray threads, which now and then hung before ffmpeg ran. Without
# preexec_fn, subprocess starts ffmpeg with vfork and exec, and nothing runs in between.
os.environ["IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"] = "1"

# The robot benchmarks' simulators render without a display (Mesa's EGL); worker processes
# and served envs inherit it. Set before anything imports mujoco, which reads it on import.
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(params=["rust", "python"], ids=["rust", "python"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    """The core module under test: ``rlmesh._core`` (rust) or ``rlmesh._pycore`` (python).

    A missing Rust core fails the test rather than skipping it: a wheel without its core must
    never pass the suite quietly.
    """
    try:
        return load_core(request.param)
    except ImportError as exc:
        pytest.fail(f"the {request.param} core does not import: {exc}")


RAY_TEST_SECONDS = 180  # a test on the Ray cluster that takes longer fails (bounded_in_time)


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance of 2 CPUs for a test module, shut down after it (also when a
    test fails); its address, for runs that join it. Modules on Ray use it with
    ``pytestmark = pytest.mark.usefixtures("ray_cluster", "bounded_in_time")``."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def bounded_in_time():
    """Fail a test that has not ended after ``RAY_TEST_SECONDS`` rather than hang the suite."""
    import signal

    def expired(signum, frame):
        raise TimeoutError(f"the test took longer than {RAY_TEST_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(RAY_TEST_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
