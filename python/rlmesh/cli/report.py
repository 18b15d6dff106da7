"""``rlmesh report FILE [--json] [--html OUT]``: the summary table of a results file and the
provenance of each run segment, and with ``--html`` a self-contained HTML report of it.

Example:
    >>> from rlmesh.cli import main
    >>> main(["report", "no-such-file.jsonl"])  # a one-line error on stderr
    2
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import ResultsFileError
from ..results import SUITE_KEY, dumps, read_columns_with_resumes, read_suite_columns
from ..stats import format_suite_summary, format_summary, summarize, summarize_suite
from .exits import EXIT_OK, UsageError


def suite_file_summary(path: str) -> dict[str, Any]:
    """The summary of every task of a suite's file, a task never started included."""
    return summarize_suite(read_suite_columns(path)[1])


def report_command(args: argparse.Namespace) -> int:
    """``rlmesh report``: the summary (per task and overall for a suite's file), then the
    provenance; an unfinished file (a crash, an interrupt) says so: "6 of 10, incomplete"."""
    from ..provenance import format_provenance, provenance_segments

    try:
        header, columns, resumes = read_columns_with_resumes(args.file)
        suite = SUITE_KEY in header  # a suite's file: per task and overall
        summary = suite_file_summary(args.file) if suite else summarize(columns)
    except OSError as exc:
        raise UsageError(f"{args.file}: cannot read it ({exc.strerror})") from None
    except ResultsFileError as exc:
        raise UsageError(str(exc)) from None
    table = format_suite_summary(summary) if suite else format_summary(summary)
    # The auditable record of each run segment (rlmesh.provenance), after the figures.
    segments = provenance_segments(header, resumes)
    if args.json:
        print(dumps({**summary, "provenance": segments}))
    else:
        print(table + "\n\n" + format_provenance(segments))
    if args.html is not None:
        _write_html(args)
    return EXIT_OK


def _write_html(args: argparse.Namespace) -> None:
    """``rlmesh report FILE --html OUT``: the self-contained HTML report (the report extra)."""
    from ..report.html import write_html

    try:
        write_html(args.file, args.html)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--html {args.html}: cannot write it ({exc.strerror})") from None
    print(f"rlmesh: wrote {args.html}", file=sys.stderr)
