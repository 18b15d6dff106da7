"""What every node of a model spec shares: the dict round trip and a leaf's source argument.

A node (a leaf, or the ``Action``) is a frozen dataclass that round-trips through a plain
dict. A key-based node writes the key-based form, ``{"type": "Image", "key": [...], ...}``
(its ``_KEYED`` fields), read back by ``node_from_dict``; a role-based node writes its
adapters-v1 form (its ``_v1_dict``), read back by ``rlmesh.adapters.v1``.

A leaf's first argument is its source: a ``kind/name`` str is a role, anything else a key
(``leaf_source``); the options only the role resolver can plan are refused on a key-based
leaf (``keyed_only``).

Example:
    >>> leaf_source("Image", "image/primary", None, None), leaf_source("Image", "rgb", None, None)
    (((), 'image/primary'), (('rgb',), None))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SpecError
from .keys import KeyPath, key_path
from .roles import is_role


def to_json(value: Any) -> Any:
    """Tuples (key paths, ranges) as lists: what JSON would make of them anyway."""
    if isinstance(value, tuple):
        return [to_json(item) for item in value]
    return value


def _from_json(value: Any) -> Any:
    """Lists back to tuples, undoing ``to_json``."""
    if isinstance(value, list):
        return tuple(_from_json(item) for item in value)
    return value


class SpecNode:
    """A frozen dataclass of the spec that round-trips through a plain dict with a "type".

    A key-based leaf keeps the key-based form (``{"type": "Image", "key": [...], ...}``, the
    fields in ``_KEYED``); a role-based leaf (or a role-based ``Action``) writes adapters-v1.
    """

    _KEYED: tuple[str, ...] = ()
    _REQUIRED: tuple[str, ...] = ()

    @property
    def role_based(self) -> bool:
        """Whether the node pairs by role (adapters-v1) rather than by observation key."""
        return False

    def to_dict(self) -> dict[str, Any]:
        """The node as JSON-ready data: the key-based form, or adapters-v1 for roles."""
        if self.role_based:
            return self._v1_dict()
        data = {name: to_json(getattr(self, name)) for name in self._KEYED}
        return {"type": type(self).__name__, **data}

    def _v1_dict(self) -> dict[str, Any]:
        """The adapters-v1 form; each node that can pair by role writes its own."""
        raise NotImplementedError(f"{type(self).__name__} has no adapters-v1 form")

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> SpecNode:
        """The node built from its fields (already converted back from JSON)."""
        return cls(**values)


def node_from_dict(data: Mapping[str, Any], types: dict[str, type[SpecNode]]) -> Any:
    """A leaf or Action from its key-based dict form, refusing an unknown type or field by name."""
    if not isinstance(data, Mapping):
        raise SpecError(f'ModelSpec.from_dict: expected a dict with a "type", got {data!r}')
    type_name = data.get("type")
    if type_name not in types:
        raise SpecError(
            f"ModelSpec.from_dict: unknown type {type_name!r}; expected one of {list(types)}"
        )
    node_type = types[type_name]
    known = node_type._KEYED
    unknown = sorted(set(data) - {"type"} - set(known))
    if unknown:
        raise SpecError(f"ModelSpec.from_dict: {type_name} has no field(s) {unknown}")
    missing = [name for name in node_type._REQUIRED if name not in data]
    if missing:
        raise SpecError(f"ModelSpec.from_dict: {type_name} is missing field(s) {missing}")
    values = {name: _from_json(value) for name, value in data.items() if name != "type"}
    return node_type._from_fields(values)


def leaf_source(
    label: str, source: object, key: object, role: object
) -> tuple[KeyPath, str | None]:
    """A leaf's first argument split into (key path, role): a ``kind/name`` str is a role."""
    if source is not None and (key is not None or role is not None):
        raise SpecError(f"{label}: pass the source once: positionally, or as key= or role=")
    if source is not None:
        if is_role(source):
            role = source
        else:
            key = source
    if role is not None:
        if key is not None:
            raise SpecError(f"{label}: a leaf reads a key or pairs by role, not both")
        if not isinstance(role, str) or not role:
            raise SpecError(f"{label}: role must be a non-empty str, got {role!r}")
        return (), role
    return key_path(key, label), None


def keyed_only(label: str, role: str | None, options: dict[str, tuple[object, object]]) -> None:
    """A key-based leaf refuses the options that only resolve by role can plan."""
    if role is not None:
        return
    given = [name for name, (value, default) in options.items() if value != default]
    if given:
        raise SpecError(
            f"{label}: {', '.join(given)} need(s) a role-based leaf (pair it by role, e.g. "
            f"Image(IMAGE_PRIMARY, ...), with env tags), not a key"
        )
