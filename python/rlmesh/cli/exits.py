"""How the ``rlmesh`` command ends: its exit codes, and the one-line error for bad input.

0 done; 1 the run failed (the typed error's message, after the completed episodes were
written); 2 bad input (a ``UsageError``: one line saying what was wrong and what was
expected), or another run is writing the ``--out`` file; 130 interrupted (Ctrl-C); 141
stdout was closed early (``rlmesh eval ... | head``), as ``cat`` ends.

Example:
    >>> (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED)
    (0, 1, 2, 130)
"""

from __future__ import annotations

import signal
import sys

# Defined with the policy loader, which raises it too, and which sits below the CLI.
from ..policies import UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1  # as `cat` ends

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "print_error",
]


def print_error(message: object) -> None:
    """``rlmesh: error: MESSAGE`` on stderr, for a run that failed (exit code 1)."""
    print(f"rlmesh: error: {message}", file=sys.stderr)
