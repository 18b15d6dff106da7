"""Checked conversion of the arguments the core's methods take.

Mirrors ``rust/src/args.rs``: the same accepted types and dtype kinds, the same messages.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

# Shared with the rest of the package (args.rs has its own).
from ..utils import path_text as path_text

# The numpy dtype kinds each argument type accepts ("b" bool, "i" signed, "u" unsigned,
# "f" float). Anything else is refused rather than silently reinterpreted.
_KINDS = {"int64": "iu", "float64": "iuf", "bool": "biu"}
_KIND_NAMES = {"int64": "integers", "float64": "numbers", "bool": "booleans"}
U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1


def u64_arg(value: object, name: str) -> int:
    """``value`` as an int in ``[0, 2**64)``, or a ``ValueError`` naming ``name``."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer in [0, 2**64), got {type(value).__name__}"
        ) from None
    if not 0 <= number <= U64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2**64), got {number}")
    return number


def i64_arg(value: object, name: str) -> int:
    """``value`` as an int in ``[-2**63, 2**63)`` (a clock reading), or a ``ValueError``."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer in [-2**63, 2**63), got {type(value).__name__}"
        ) from None
    if not -I64_MAX - 1 <= number <= I64_MAX:
        raise ValueError(f"{name} must be an integer in [-2**63, 2**63), got {number}")
    return number


def count_arg(value: object, name: str) -> int:
    """``value`` as a positive int (a count of lanes or episodes), or a ``ValueError``."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if number <= 0:
        raise ValueError(f"{name} must be at least 1, got {number}")
    return u64_arg(number, name)


def vector(values: Any, dtype: str, name: str) -> np.ndarray:
    """``values`` as a 1-D array of ``dtype`` (``"int64"``, ``"float64"`` or ``"bool"``).

    Raises:
        ValueError: naming ``name`` when ``values`` is not 1-D or holds the wrong kind.
    """
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.size and array.dtype.kind not in _KINDS[dtype]:
        raise ValueError(f"{name} must hold {_KIND_NAMES[dtype]}, got dtype {array.dtype}")
    if dtype == "int64" and array.size and array.dtype.kind == "u" and array.max() > I64_MAX:
        raise ValueError(f"{name} holds {array.max()}, which does not fit in int64")
    return array.astype(dtype, copy=False)


def same_length(name: str, array: Sequence[Any] | np.ndarray, lanes: np.ndarray) -> None:
    """Refuse a per-lane argument whose length is not the number of lanes given."""
    if len(array) != len(lanes):
        raise ValueError(f"{name} has {len(array)} entries but lanes has {len(lanes)}")


def check_lanes(lanes: np.ndarray, num_lanes: int) -> list[int]:
    """``lanes`` as a list, refusing a lane out of ``0..num_lanes-1`` or a lane given twice."""
    seen = [False] * num_lanes
    checked = lanes.tolist()
    for lane in checked:
        if not 0 <= lane < num_lanes:
            raise ValueError(
                f"lane {lane} is out of range: this route has lanes 0..{num_lanes - 1}"
            )
        if seen[lane]:
            raise ValueError(f"lane {lane} appears twice in lanes")
        seen[lane] = True
    return checked
