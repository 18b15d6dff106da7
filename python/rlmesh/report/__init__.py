"""What reads results files: the paired comparison of two runs (``compare``).

Example:
    >>> from rlmesh.report import compare, format_comparison
    >>> callable(compare) and callable(format_comparison)
    True
"""

from .compare import RunsNotPairedError, compare, format_comparison

__all__ = ["RunsNotPairedError", "compare", "format_comparison"]
