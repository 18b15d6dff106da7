"""What reads results files: the auditable provenance record and the HTML report.

Example:
    >>> from rlmesh.report import provenance_rows
    >>> provenance_rows({"host": "box"})
    [('host', 'box')]
"""

from .html import episodes_by_task, read_report_data, render_html, write_html
from .provenance import (
    PROVENANCE_KEY,
    collect_provenance,
    format_provenance,
    git_revision,
    provenance_rows,
    provenance_segments,
)

__all__ = [
    "PROVENANCE_KEY",
    "collect_provenance",
    "episodes_by_task",
    "format_provenance",
    "git_revision",
    "provenance_rows",
    "provenance_segments",
    "read_report_data",
    "render_html",
    "write_html",
]
