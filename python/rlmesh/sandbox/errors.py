"""The errors of sandboxed envs and models. Every one is an ``RlmeshError``; those of a server
that failed carry its last lines of output (``output``), since its own traceback stays in its
process.

Example:
    >>> error = SandboxStartError("the env server exited", output=["ImportError: gym_pusht"])
    >>> isinstance(error, SandboxError), error.output
    (True, ['ImportError: gym_pusht'])
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RemoteError, RlmeshError
from ..lanes.remote import SessionEndedError

OUTPUT_LINES_SHOWN = 15
"""How many of a failed server's last lines of output an error's message quotes."""


class SandboxError(RlmeshError):
    """A sandboxed env or model could not be set up or failed."""


class SandboxUnavailableError(SandboxError):
    """A sandbox was asked for where bubblewrap is missing or cannot make namespaces; the
    message says what to install, or to pass ``sandbox=False``."""


class SandboxBuildError(SandboxError):
    """The virtual environment of a sandbox could not be built (an installer failed).

    Attributes:
        output: the installer's last lines of output.
    """

    def __init__(self, message: str, *, output: Sequence[str] = ()) -> None:
        super().__init__(_with_output(message, output))
        self.output = list(output)


class SandboxStartError(SandboxError):
    """A sandboxed server did not start: it exited, or did not answer its health check
    within its deadline.

    Attributes:
        output: the server's last lines of output (stderr, and stdout after its address).
        exit_code: the process's exit status (negative: the signal that ended it), None when
            it was still running at the deadline.
    """

    def __init__(
        self, message: str, *, output: Sequence[str] = (), exit_code: int | None = None
    ) -> None:
        super().__init__(_with_output(message, output))
        self.output = list(output)
        self.exit_code = exit_code


class SandboxCrashedError(SandboxError, RemoteError):
    """A sandboxed server died while serving (beyond its ``restart`` budget); a
    ``RemoteError`` of its address, as when any served end goes away.

    Attributes:
        output: the server's last lines of output.
        exit_code: its exit status (negative: the signal that killed it).
    """

    def __init__(
        self,
        message: str,
        *,
        address: str,
        output: Sequence[str] = (),
        exit_code: int | None = None,
    ) -> None:
        RemoteError.__init__(self, _with_output(message, output), address=address, code="CRASHED")
        self.output = list(output)
        self.exit_code = exit_code


class SandboxEnvCrashedError(SandboxCrashedError, SessionEndedError):
    """A sandboxed env's server died: every lane's episode in flight is lost. Also the
    ``LaneFailures`` of every lane, so a run with ``on_error="record"`` or ``"retry"`` goes on
    with a new server (``SandboxEnv.rebuild``)."""

    def __init__(
        self,
        message: str,
        *,
        address: str,
        num_lanes: int,
        output: Sequence[str] = (),
        exit_code: int | None = None,
    ) -> None:
        SandboxCrashedError.__init__(
            self, message, address=address, output=output, exit_code=exit_code
        )
        self.errors = dict.fromkeys(range(num_lanes), f"SandboxCrashedError: {message}")
        self.outcome: object = None


def _with_output(message: str, output: Sequence[str]) -> str:
    if not output:
        return message
    shown = list(output)[-OUTPUT_LINES_SHOWN:]
    return f"{message}; its last lines of output:\n" + "\n".join(f"  | {line}" for line in shown)


__all__ = [
    "SandboxBuildError",
    "SandboxCrashedError",
    "SandboxEnvCrashedError",
    "SandboxError",
    "SandboxStartError",
    "SandboxUnavailableError",
]
