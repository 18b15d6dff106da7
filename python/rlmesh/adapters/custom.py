"""The ``Custom`` leaf: the escape hatch, a user function called on the raw observation.

The only leaf that runs user code. A spec stores its function by import path
(``"module:qualname"``), and reading one back imports that module, so a spec read from data
holds a ``Custom`` leaf only when its reader allows it.

Example:
    >>> Custom(abs).to_dict(), Custom(abs).label
    ({'type': 'Custom', 'fn': 'builtins:abs'}, 'Custom(fn=abs)')
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .node import SpecNode


@dataclass(frozen=True)
class Custom(SpecNode):
    """The escape hatch: ``fn(raw_obs) -> value``, called on one lane's full raw observation.

    The only leaf that runs user code. To save the spec (``to_dict``), ``fn`` must be importable
    by its name: a function defined with ``def`` at the top level of a module, stored as
    ``"module:qualname"``. Reading it back imports that module, so ``from_dict`` /
    ``from_json`` refuse it unless told ``allow_custom=True``.

    Example:
        >>> from rlmesh.adapters import ModelSpec
        >>> spec = ModelSpec(input={"speed": Custom(abs)})
        >>> spec.to_dict()["input"]
        {'speed': {'type': 'Custom', 'fn': 'builtins:abs'}}
        >>> Custom(lambda obs: obs).to_dict()
        Traceback (most recent call last):
        ...
        rlmesh.errors.SpecError: Custom(fn=<lambda>) cannot be saved: ...
    """

    fn: Callable[[Any], Any]

    _KEYED = ("fn",)
    _REQUIRED = ("fn",)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SpecError(f"Custom: fn must be a callable fn(raw_obs) -> value, got {self.fn!r}")

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "Custom", "fn": "module:qualname"}``; a SpecError if fn has no such name."""
        return {"type": "Custom", "fn": _import_path(self.fn, self.label)}

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> Custom:
        return cls(_import_function(values["fn"]))

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Custom(fn=crop_wrist)``."""
        return f"Custom(fn={getattr(self.fn, '__qualname__', repr(self.fn))})"


def _import_object(path: str) -> object:
    """The object ``"module:qualname"`` names; ImportError, AttributeError or ValueError if none."""
    module_name, _, qualname = path.partition(":")
    target: object = importlib.import_module(module_name)
    for attribute in qualname.split("."):
        target = getattr(target, attribute)
    return target


def _import_path(fn: Callable[[Any], Any], label: str) -> str:
    """``"module:qualname"`` of ``fn``, checked by importing it back."""
    path = f"{getattr(fn, '__module__', None)}:{getattr(fn, '__qualname__', None)}"
    try:
        named = _import_object(path)
    except (ImportError, AttributeError, ValueError):
        named = None
    if named is not fn:
        raise SpecError(
            f"{label} cannot be saved: a spec stores fn by its import path, and a lambda, a "
            f"local function or a callable object has none; define fn with `def` at the top "
            f"level of a module and pass that function"
        )
    return path


def _import_function(path: object) -> Callable[[Any], Any]:
    """The function ``"module:qualname"`` names, for ``Custom.from_dict``."""
    if not isinstance(path, str):
        raise SpecError(f'Custom: fn must be an import path "module:qualname", got {path!r}')
    try:
        function = _import_object(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SpecError(f"Custom: cannot import fn {json.dumps(path)}: {exc}") from None
    if not callable(function):
        raise SpecError(f"Custom: fn {json.dumps(path)} names {function!r}, which is not callable")
    return function
