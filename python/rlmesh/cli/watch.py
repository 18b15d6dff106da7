"""``rlmesh watch FILE [--http [PORT]]``: the live view of a results file another process is
writing (a run in another terminal, a Ray coordinator), or of one that is complete (then it
is the report, and it reloads when a resumption appends): a live table in the terminal, and
with ``--http`` the page, until Ctrl-C (or, with ``--until-complete``, until the file holds
every episode it asks for).

Example:
    >>> parser = argparse.ArgumentParser(prog="rlmesh")
    >>> _ = add_watch_parser(parser.add_subparsers(dest="command"))
    >>> try:
    ...     watch_command(parser.parse_args(["watch", "no-such-file.jsonl"]))
    ... except UsageError as exc:
    ...     print(str(exc).split(";")[0])
    rlmesh watch: error: no-such-file.jsonl: no such file
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..view import LiveState, ResultsFollower, TerminalView, ViewError, ViewServer
from ..view.spec import LOOPBACK
from ..view.state import FINISHED
from .argtypes import non_negative_int, positive_seconds
from .exits import EXIT_INTERRUPTED, EXIT_OK, UsageError

_FORMATTER = argparse.RawDescriptionHelpFormatter
_TICK_S = 0.2


def add_watch_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``watch`` to the ``rlmesh`` command's subparsers (``commands``)."""
    watch = commands.add_parser(
        "watch",
        help="the live view of a results file being written",
        description="Follow a results file another process writes (or a complete one): a "
        "live table of its progress, per-task success with intervals, failures and latency, "
        "and with --http the same as a page that updates itself.",
        epilog="example:\n  rlmesh watch results.jsonl --http 8000",
        formatter_class=_FORMATTER,
    )
    watch.add_argument("file", metavar="FILE", help="a results file (JSON lines)")
    watch.add_argument(
        "--http",
        type=non_negative_int,
        nargs="?",
        const=0,
        metavar="PORT",
        help="also serve the page on PORT (without PORT, or 0: any free port); its address is "
        "printed",
    )
    watch.add_argument(
        "--host",
        default=LOOPBACK,
        help=f"with --http, the interface to serve on (default {LOOPBACK}: this machine only)",
    )
    watch.add_argument(
        "--no-terminal",
        action="store_true",
        help="no live table (with --http: the page alone)",
    )
    watch.add_argument(
        "--until-complete",
        action="store_true",
        help="exit once the file holds every episode it asks for (default: until Ctrl-C)",
    )
    watch.add_argument(
        "--poll",
        type=positive_seconds,
        default=0.5,
        metavar="S",
        help="seconds between two looks at the file (default 0.5)",
    )
    return watch


def watch_command(args: argparse.Namespace) -> int:
    """``rlmesh watch``: the exit code (0 at Ctrl-C or, with ``--until-complete``, once the
    file is complete; 2 for a file that is not a results file or a port in use)."""
    if args.host != LOOPBACK and args.http is None:
        raise UsageError("rlmesh watch: error: --host names where --http serves: pass --http")
    _check_exists(args.file)
    state = LiveState(f"rlmesh watch {os.path.basename(args.file)}")
    follower = ResultsFollower(args.file, state, poll_every=args.poll)
    follower.poll()  # the first read: a file that is no results file is refused before anything
    if follower.error is not None:
        raise UsageError(f"rlmesh watch: error: {follower.error}")
    server = None
    if args.http is not None:
        try:
            server = ViewServer(state, args.host, args.http)
        except ViewError as exc:
            raise UsageError(f"rlmesh watch: error: --http {args.http}: {exc}") from None
        print(f"rlmesh: watching {args.file} at {server.url}", file=sys.stderr, flush=True)
    terminal = None if args.no_terminal else TerminalView(state)
    follower.start()
    if terminal is not None:
        terminal.start()
    try:
        while not (args.until_complete and state.status == FINISHED):
            time.sleep(_TICK_S)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        follower.close()
        if terminal is not None:
            terminal.stop()
        if server is not None:
            server.close()
    return EXIT_OK


def _check_exists(path: str) -> None:
    """Refuse a path where no file is, before anything is shown."""
    if not os.path.exists(path):
        raise UsageError(
            f"rlmesh watch: error: {path}: no such file; expected a results file written by "
            "rlmesh eval --out or rlmesh.run(results_path=...) (start the run first)"
        )
