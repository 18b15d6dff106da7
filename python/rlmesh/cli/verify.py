"""``rlmesh verify A B [--json]``: did two runs play the same episodes? Their digests say
(``rlmesh.report.verify``).

Exit 0 when every episode the files share (by index, and task in a suite) has equal
``reset_digest`` and ``trajectory_digest``; 1 when some differ (the first one is named, and
whether it differs from its reset or later); 2 when the files cannot be verified (not results
files, no digests, no episode in common).

Example:
    >>> from rlmesh.cli import main
    >>> main(["verify", "no-such-file.jsonl", "other.jsonl"])  # a one-line error
    2
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ResultsFileError
from ..results import dumps
from .exits import EXIT_FAILED, EXIT_OK, UsageError


def add_verify_parser(commands: Any) -> None:
    """The ``verify`` command's parser, under ``commands`` (the subparsers of ``rlmesh``)."""
    verify = commands.add_parser(
        "verify",
        help="do two results files hold the same episodes? (their digests)",
        description="Compare the digests of the episodes two results files share (by index):\n"
        "each episode's reset_digest (its first observation) and trajectory_digest (every\n"
        "step's action, observation, reward and flags). Exit 0 if all are equal, 1 if some\n"
        "differ (naming the first, and whether it differs from its reset or later), 2 if the\n"
        "files cannot be verified.",
        epilog="example:\n  rlmesh verify run-1-lane.jsonl run-8-lanes.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument("a", metavar="A", help="a results file (JSON lines)")
    verify.add_argument("b", metavar="B", help="another results file")
    verify.add_argument("--json", action="store_true", help="print everything as one JSON object")


def verify_command(args: argparse.Namespace) -> int:
    """``rlmesh verify``: the verdict as text or (``--json``) one object; exit 0 or 1."""
    from ..report.verify import NothingToVerifyError, format_verification, verify

    try:
        result = verify(args.a, args.b)
    except (ResultsFileError, NothingToVerifyError) as exc:
        raise UsageError(f"rlmesh verify: error: {exc}") from None
    except OSError as exc:
        raise UsageError(
            f"rlmesh verify: error: {exc.filename}: cannot read it ({exc.strerror})"
        ) from None
    print(dumps(result) if args.json else format_verification(result))
    return EXIT_OK if result["equal"] else EXIT_FAILED
