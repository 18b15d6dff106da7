"""The argument types of the ``rlmesh`` command: each turns one option's text into its value,
or raises ``argparse.ArgumentTypeError`` saying what was expected (argparse prints it as one
line, exit code 2).

Example:
    >>> positive_int("8")
    8
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a positive integer, got '0'
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def positive_int(text: str) -> int:
    """An integer >= 1 (``--episodes``, ``--num-envs``, ``--workers``...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (``--restart-workers``, ``--max-retries``, ``--record-video``...)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (``--ensemble``'s rate)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def seed(text: str) -> int:
    """A base seed: an integer in [0, 2**64)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**64), got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number > 0 (seconds for the limits and timeouts, MiB for message sizes)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def reward_threshold(text: str) -> float:
    """Any number but NaN: the reward an episode must reach to succeed."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a number such as 475, got {text!r}")
    return value


def confidence(text: str) -> float:
    """An intervals' level: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1) such as 0.95, got {text!r}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (``--env-kwargs``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"is not valid JSON ({exc}); expected an object such as '{{\"g\": 9.81}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"g\": 9.81}}', got {text!r}"
        )
    return value


def view(text: str) -> str:
    """``--view``: a live view, as ``rlmesh.run(view=...)`` takes it (``rlmesh.view.spec``)."""
    from ..view.spec import ViewError, parse_view

    try:
        parse_view(text)
    except ViewError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
