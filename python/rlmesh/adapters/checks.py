"""The argument checks shared by spec leaves, actions and env tags, and the v1 field rules.

Every check raises a ``SpecError`` that names the leaf (or tag) and the argument. Two range
checks exist because their messages differ by side and both are pinned: ``value_range`` for a
spec leaf's ``normalize`` / ``range`` and an action's ``rescale`` (``(lo, hi)``), and
``check_range`` for tags and actuators (``(low, high)``, None allowed).

The v1 field rules: a v1 document refuses a bare unknown field (a typo) and carries ``x-`` /
``ext-`` fields through untouched (``split_fields``).

Example:
    >>> check_range("Actuator('action/gripper')", "range", (-1, 1))
    (-1.0, 1.0)
    >>> split_fields("image tag", {"role": "image/primary", "x-note": 1}, ("role",))
    {'x-note': 1}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import SpecError
from .roles import ENCODINGS

MAX_STACK = 64
# Fields a newer writer may add: carried through untouched, never read.
EXTENSION_PREFIXES = ("x-", "ext-")


def check_choice(label: str, argument: str, value: object, choices: tuple[str, ...]) -> None:
    """``value`` is one of ``choices``, or a SpecError listing them."""
    if value not in choices:
        allowed = ", ".join(json.dumps(choice) for choice in choices)
        raise SpecError(f"{label}: {argument} must be one of {allowed}, got {value!r}")


def check_stack(label: str, stack: object) -> None:
    """``stack`` is a frame-stack depth: an int in 1..MAX_STACK."""
    if isinstance(stack, bool) or not isinstance(stack, int) or not 1 <= stack <= MAX_STACK:
        raise SpecError(
            f"{label}: stack (frames per input, 1 = none) must be an int in 1..{MAX_STACK}, "
            f"got {stack!r}"
        )


def check_int(label: str, name: str, value: object, low: int, allow_none: bool = True) -> None:
    """``value`` is an int ``>= low`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(f"{label}: {name} must be an int >= {low}, got {value!r}")


def value_range(label: str, argument: str, value: object) -> tuple[float, float]:
    """``value`` as a finite ``(lo, hi)`` with ``lo < hi``, or a SpecError naming the argument."""
    try:
        lo, hi = (float(bound) for bound in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise SpecError(
            f"{label}: {argument} must be a pair (lo, hi) of numbers, got {value!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise SpecError(f"{label}: {argument} must be finite with lo < hi, got ({lo:g}, {hi:g})")
    return lo, hi


def check_range(label: str, argument: str, value: object) -> tuple[float, float] | None:
    """``value`` as a finite ``(low, high)`` with ``low < high``, or None when None."""
    if value is None:
        return None
    try:
        low, high = (float(bound) for bound in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise SpecError(f"{label}: {argument} must be a pair (low, high), got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise SpecError(f"{label}: {argument} must be finite with low < high, got {value!r}")
    return low, high


def check_encoding(label: str, encoding: object) -> str | None:
    """A rotation encoding name, or None; a SpecError listing the known ones otherwise."""
    if encoding is None or encoding in ENCODINGS:
        return encoding  # type: ignore[return-value]
    raise SpecError(
        f"{label}: unknown rotation encoding {encoding!r}; expected one of {', '.join(ENCODINGS)}"
    )


def check_role(label: str, role: object, *, optional: bool = False) -> str | None:
    """``role`` as a non-empty str (None allowed when ``optional``)."""
    if role is None and optional:
        return None
    if not isinstance(role, str) or not role:
        raise SpecError(
            f"{label}: a role is a non-empty str such as 'proprio/eef_pos', got {role!r}"
        )
    return role


def check_dim(label: str, dim: object) -> int:
    """``dim`` as an int ``>= 1``."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise SpecError(f"{label}: dim must be an int >= 1, got {dim!r}")
    return dim


def finite_number(label: str, name: str, value: object) -> float:
    """``value`` as a finite float (a bool is refused)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{label}: {name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise SpecError(f"{label}: {name} must be a finite number, got {value!r}")
    return number


def split_fields(label: str, data: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """The extension fields of a v1 dict; a SpecError for a bare unknown field (a typo)."""
    unknown = sorted(
        name for name in data if name not in known and not name.startswith(EXTENSION_PREFIXES)
    )
    if unknown:
        raise SpecError(
            f"{label}: unknown field(s) {unknown}; known fields are {sorted(known)} (prefix an "
            f"extension field with x- or ext-)"
        )
    return {name: data[name] for name in data if name.startswith(EXTENSION_PREFIXES)}


def range_json(value: tuple[float, float] | None) -> list[float] | None:
    """A range as v1 JSON writes it: a two-element list, or None."""
    return None if value is None else [value[0], value[1]]


def expect_mapping(label: str, data: object) -> Mapping[str, Any]:
    """``data`` when it is a JSON object (a Mapping), else a SpecError naming ``label``."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{label}: expected a JSON object, got {data!r}")
    return data
