"""``rlmesh compare A B``: policy B against policy A on the same seeded episodes, pair by pair
(``rlmesh.report.compare``); exit 2 when the runs cannot be paired.

Example:
    >>> from rlmesh.cli import main
    >>> main(["compare", "a.jsonl", "b.jsonl", "--confidence", "2"])  # a one-line error
    2
"""

from __future__ import annotations

import argparse

from ..errors import ResultsFileError
from ..results import dumps
from .exits import EXIT_OK, UsageError


def compare_command(args: argparse.Namespace) -> int:
    """``rlmesh compare``: the paired comparison, as a table or (``--json``) one object."""
    from ..report.compare import RunsNotPairedError, compare, format_comparison

    try:
        comparison = compare(
            args.a,
            args.b,
            confidence=args.confidence,
            resamples=args.resamples,
            seed=args.seed,
            intersection=args.intersection,
        )
    except (ResultsFileError, RunsNotPairedError) as exc:
        raise UsageError(f"rlmesh compare: error: {exc}") from None
    print(dumps(comparison) if args.json else format_comparison(comparison))
    return EXIT_OK
