"""Reading the adapters-v1 form of role-based model leaves and action layouts.

A v1 document is pure data: nothing in it is imported or run. Reading is strict about bare
unknown fields (a typo is an error naming the field) and carries ``x-`` / ``ext-`` fields
through untouched, so ``from_dict(doc).to_dict() == doc`` for every document this version
writes. Each role-based node writes its own v1 form (its ``to_dict``); this module reads them
back: ``leaf_from_v1`` for a leaf, ``action_from_v1`` for an action layout.

Example:
    >>> from rlmesh import adapters
    >>> doc = {"type": "text", "role": "text/instruction", "container": "str", "fill": None}
    >>> leaf = leaf_from_v1(doc, "input")
    >>> leaf.role, node_to_v1(leaf) == doc
    ('text/instruction', True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SpecError
from .action import Action, actuator_from_dict
from .checks import expect_mapping, split_fields
from .image import IMAGE_V1_ALWAYS, IMAGE_V1_OPTIONS, Image
from .state import PART_V1_OPTIONS, STATE_V1_OPTIONS, Concat, State
from .text import Text


def node_to_v1(node: Any) -> dict[str, Any]:
    """The v1 form of a role-based ``Image``, ``State``, ``Concat``, ``Text`` or ``Action``
    (what its ``to_dict`` writes)."""
    return node.to_dict()


def leaf_from_v1(data: Mapping[str, Any], where: str) -> Image | State | Concat | Text:
    """A role-based model leaf from its v1 form; a SpecError names the leaf and the field."""
    data = expect_mapping(where, data)
    kind = data.get("type")
    if kind == "image":
        known = ("type", *IMAGE_V1_ALWAYS, *IMAGE_V1_OPTIONS)
        extensions = split_fields(f"{where} (image)", data, known)
        values = {name: data[name] for name in known if name in data and name != "type"}
        if isinstance(values.get("normalize"), list):
            values["normalize"] = tuple(values["normalize"])
        return Image(**values, extensions=extensions)
    if kind == "text":
        known = ("type", "role", "container", "fill")
        extensions = split_fields(f"{where} (text)", data, known)
        return Text(
            role=data.get("role"),
            container=data.get("container", "str"),
            fill=data.get("fill"),
            extensions=extensions,
        )
    if kind == "state":
        known = ("type", "components", "dtype", *STATE_V1_OPTIONS)
        extensions = split_fields(f"{where} (state)", data, known)
        components = data.get("components")
        if not isinstance(components, list) or not components:
            raise SpecError(f"{where}: a state needs a non-empty list of components")
        parts = [
            _part_from_v1(item, f"{where}.components[{i}]") for i, item in enumerate(components)
        ]
        options = {name: data[name] for name in ("dtype", *STATE_V1_OPTIONS) if name in data}
        if len(parts) == 1:
            part = parts[0]
            return State(
                role=part.role,
                encoding=part.encoding,
                dim=part.dim,
                index=part.index,
                optional=part.optional,
                range=part.range,
                extensions=extensions,
                **options,
            )
        return Concat(*parts, extensions=extensions, **options)
    raise SpecError(f"{where}: unknown leaf type {kind!r}; expected image, state or text")


def _part_from_v1(data: object, where: str) -> State:
    if isinstance(data, str):
        return State(role=data)
    data = expect_mapping(where, data)
    split_fields(where, data, ("role", *PART_V1_OPTIONS))
    return State(
        role=data.get("role"), **{name: data[name] for name in PART_V1_OPTIONS if name in data}
    )


def action_from_v1(data: object, where: str) -> Action:
    """A role-based ``Action`` from its v1 form ``{"clip": ..., "components": [...]}``."""
    data = expect_mapping(where, data)
    split_fields(where, data, ("clip", "components"))
    components = data.get("components")
    if not isinstance(components, list):
        raise SpecError(f"{where}: components must be a list of actuators, got {components!r}")
    actuators = tuple(
        actuator_from_dict(item, f"{where}.components[{index}]")
        for index, item in enumerate(components)
    )
    return Action.layout(actuators, clip=data.get("clip"))
