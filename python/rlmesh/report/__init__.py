"""What reads results files: the paired comparison of two runs (``compare``), the auditable
provenance record and the HTML report.

Example:
    >>> from rlmesh.report import compare, provenance_rows
    >>> callable(compare), provenance_rows({"host": "box"})
    (True, [('host', 'box')])
"""

from ..results.provenance import (
    PROVENANCE_KEY,
    collect_provenance,
    format_provenance,
    git_revision,
    provenance_rows,
    provenance_segments,
)
from .compare import RunsNotPairedError, compare, format_comparison
from .html import episodes_by_task, read_report_data, render_html, write_html

__all__ = [
    "PROVENANCE_KEY",
    "RunsNotPairedError",
    "collect_provenance",
    "compare",
    "episodes_by_task",
    "format_comparison",
    "format_provenance",
    "git_revision",
    "provenance_rows",
    "provenance_segments",
    "read_report_data",
    "render_html",
    "write_html",
]
