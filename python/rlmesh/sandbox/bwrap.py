"""The bubblewrap command line a sandboxed server runs under, and whether bubblewrap works here.

The sandbox (``bwrap_argv``): the host's root read-only, a fresh ``/dev``, ``/proc`` and a
private ``/tmp``; every namespace of its own (``--unshare-all``: PID, IPC, UTS, network, ...),
the network one shared with the host only when asked (``network=True``); the paths the server
reads (its interpreter, rlmesh's package, the env's or policy's files) bound read-only at
their own paths, and the few it writes (its work directory, the directory of its unix socket)
bound writable; and ``--die-with-parent``, so the sandbox and everything in it is killed when
the process that started it dies. Nothing outside the writable directories can be changed
from inside, and with its own network namespace nothing on the host's network (its loopback
included) can be reached: the driver talks to it over the unix socket only.

Example:
    >>> argv = bwrap_argv(read_only=["/opt/venv"], writable=["/tmp/run/work"], network=False,
    ...                   workdir="/tmp/run/work", bwrap="/usr/bin/bwrap")
    >>> argv[:3], "--share-net" in argv, argv[-2:]
    (['/usr/bin/bwrap', '--ro-bind', '/'], False, ['--chdir', '/tmp/run/work'])
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache

from .errors import SandboxUnavailableError

INSTALL_HINT = (
    "install bubblewrap (Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
    "bubblewrap), or pass sandbox=False (--no-sandbox) to run the server in its own "
    "environment without the sandbox's namespaces"
)


def bwrap_argv(
    *,
    read_only: Sequence[str],
    writable: Sequence[str],
    network: bool,
    workdir: str,
    bwrap: str = "bwrap",
) -> list[str]:
    """The ``bwrap`` arguments (before ``--`` and the command) of a sandbox that reads
    ``read_only``, writes ``writable``, starts in ``workdir`` and reaches the network only
    with ``network``."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    argv += ["--unshare-all"]
    if network:
        argv += ["--share-net"]
    argv += ["--die-with-parent"]
    # After the private /tmp: a path under /tmp is bound into it, not hidden by it.
    for path in dict.fromkeys(read_only):
        argv += ["--ro-bind", path, path]
    for path in dict.fromkeys(writable):
        argv += ["--bind", path, path]
    return [*argv, "--chdir", workdir]


def find_bwrap() -> str | None:
    """The ``bwrap`` executable on PATH, None without one."""
    return shutil.which("bwrap")


def require_bwrap() -> str:
    """The ``bwrap`` executable, after checking once per process that it can make a sandbox
    here (user namespaces may be disabled).

    Raises:
        SandboxUnavailableError: no ``bwrap`` on PATH, or it cannot make a sandbox; the
            message says what to install or to pass ``sandbox=False``.
    """
    found = find_bwrap()
    if found is None:
        raise SandboxUnavailableError(
            f"a sandbox needs bubblewrap (bwrap), which is not on PATH: {INSTALL_HINT}"
        )
    problem = _probe(found)
    if problem:
        raise SandboxUnavailableError(
            f"bubblewrap ({found}) cannot make a sandbox on this machine: {problem}; user "
            f"namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1), or "
            f"{INSTALL_HINT.split(', or ', 1)[1]}"
        )
    return found


@cache
def _probe(bwrap: str) -> str:
    """What went wrong running ``true`` in the sandbox ``bwrap`` makes; "" when it ran."""
    argv = [*bwrap_argv(read_only=(), writable=(), network=False, workdir="/", bwrap=bwrap)]
    try:
        done = subprocess.run([*argv, "--", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return ""
    said = done.stderr.strip().splitlines()
    return said[-1] if said else f"it exited with status {done.returncode}"


__all__ = ["INSTALL_HINT", "bwrap_argv", "find_bwrap", "require_bwrap"]
