"""Strict JSON: every JSON rlmesh writes parses with ``allow_nan=False``.

Strict JSON has no nan or infinity. Every line of a results file and every ``--json`` output
writes a non-finite float as the string ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``
(``dumps``), and reading a results file turns those strings back into floats wherever it holds
a float (``decode_float``). In a summary, a figure that does not exist is null.

Example:
    >>> dumps({"ci": [1.0, float("nan")]})
    '{"ci": [1.0, "NaN"]}'
    >>> decode_float("-Infinity", "line 2, field 'reward'")
    -inf
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import ResultsFileError

# The tokens of the non-finite floats, and the floats they stand for.
NONFINITE_TOKENS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _token(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (in nested dicts, lists and tuples) replaced by
    its token: ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``.

    Example:
        >>> strict({"reward": float("inf"), "ci": [1.0, float("nan")]})
        {'reward': 'Infinity', 'ci': [1.0, 'NaN']}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else _token(value)
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def dumps(value: Any) -> str:
    """``value`` as strict JSON (valid with ``allow_nan=False``; non-finite floats as tokens).

    Example:
        >>> dumps({"mean_reward": float("-inf"), "episodes": 3})
        '{"mean_reward": "-Infinity", "episodes": 3}'
    """
    return json.dumps(strict(value), allow_nan=False)


def decode_float(value: Any, where: str) -> float:
    """A float a results file holds: a JSON number, or a non-finite token (``strict``).

    Raises:
        ResultsFileError: anything else (``where`` names the file, line and field).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in NONFINITE_TOKENS:
        return NONFINITE_TOKENS[value]
    raise ResultsFileError(
        f"{where} is {value!r}; expected a number or one of {sorted(NONFINITE_TOKENS)}"
    )
