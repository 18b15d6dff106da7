"""Honest statistics of a run: confidence intervals, robust means, and the summary tables.

Which module owns what: ``intervals`` the pure math (the bootstrap, stratified bootstrap,
interquartile mean, Wilson, Newcombe and McNemar, each formula in its docstring), and
``summaries`` the summary of a run or a suite (``summarize``, ``summarize_suite``) and the
tables ``rlmesh`` prints of them. Every name is importable from here, as before the package
was split.

Example:
    >>> wilson_interval(8, 10)
    (0.4901624..., 0.9433178...)
    >>> interquartile_mean([1, 2, 3, 4, 5, 6, 7, 100])
    4.5
    >>> bootstrap_mean_ci([1, 2, float("inf")])
    (1.0, inf)
"""

from .intervals import (
    BOOTSTRAP_BLOCK,
    BOOTSTRAP_EXACT_MAX,
    bootstrap_mean_ci,
    interquartile_mean,
    mcnemar_exact_p,
    paired_rate_difference_ci,
    stratified_bootstrap_mean_ci,
    wilson_interval,
)
from .summaries import (
    LISTED_FAILURES,
    OVERALL_METHOD,
    TABLE_OVERALL_NOTE,
    format_suite_summary,
    format_summary,
    suite_overall,
    summarize,
    summarize_suite,
    summary_rows,
)

__all__ = [
    "BOOTSTRAP_BLOCK",
    "BOOTSTRAP_EXACT_MAX",
    "LISTED_FAILURES",
    "OVERALL_METHOD",
    "TABLE_OVERALL_NOTE",
    "bootstrap_mean_ci",
    "format_suite_summary",
    "format_summary",
    "interquartile_mean",
    "mcnemar_exact_p",
    "paired_rate_difference_ci",
    "stratified_bootstrap_mean_ci",
    "suite_overall",
    "summarize",
    "summarize_suite",
    "summary_rows",
    "wilson_interval",
]
