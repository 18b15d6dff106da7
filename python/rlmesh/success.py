"""Where the success rules now live: ``rlmesh.results.success`` (this alias keeps
``rlmesh.success`` importable).

Example:
    >>> from rlmesh.results import success
    >>> rule_for is success.rule_for, rule_for(200, "CartPole-v1").label
    (True, 'reward >= 200.0 (user rule)')
"""

from .results.success import (
    ENV_INFO,
    ENV_SPEC,
    KINDS,
    NONE,
    NOT_AVAILABLE,
    USER_REWARD,
    USER_RULE,
    Built,
    Judged,
    SuccessRule,
    describe,
    rule_for,
)

__all__ = [
    "ENV_INFO",
    "ENV_SPEC",
    "KINDS",
    "NONE",
    "NOT_AVAILABLE",
    "USER_REWARD",
    "USER_RULE",
    "Built",
    "Judged",
    "SuccessRule",
    "describe",
    "rule_for",
]
