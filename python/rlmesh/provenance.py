"""Where the provenance record now lives: ``rlmesh.results.provenance`` (this alias keeps
``rlmesh.provenance`` importable).

Example:
    >>> from rlmesh.results import provenance
    >>> provenance_rows is provenance.provenance_rows, PROVENANCE_KEY
    (True, 'provenance')
"""

from .results.provenance import (
    CALLER_FIELDS,
    GIT_TIMEOUT_S,
    GPU_QUERY_TIMEOUT_S,
    GRAPHICS_VARIABLES,
    PROVENANCE_KEY,
    check_provenance,
    collect_provenance,
    cpu_model,
    env_package,
    env_packages,
    env_simulator,
    format_provenance,
    git_revision,
    gpu_models,
    graphics_variables,
    policy_name,
    provenance_rows,
    provenance_segments,
)

__all__ = [
    "CALLER_FIELDS",
    "GIT_TIMEOUT_S",
    "GPU_QUERY_TIMEOUT_S",
    "GRAPHICS_VARIABLES",
    "PROVENANCE_KEY",
    "check_provenance",
    "collect_provenance",
    "cpu_model",
    "env_package",
    "env_packages",
    "env_simulator",
    "format_provenance",
    "git_revision",
    "gpu_models",
    "graphics_variables",
    "policy_name",
    "provenance_rows",
    "provenance_segments",
]
