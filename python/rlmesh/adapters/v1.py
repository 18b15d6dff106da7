"""The adapters-v1 JSON form of role-based model leaves and action layouts.

A v1 document is pure data: nothing in it is imported or run. Reading is strict about bare
unknown fields (a typo is an error naming the field) and carries ``x-`` / ``ext-`` fields
through untouched, so ``from_dict(doc).to_dict() == doc`` for every document this version
writes.

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
from .spec import Action, Concat, Image, State, Text
from .tags import expect_mapping, range_json, split_fields

_IMAGE_ALWAYS = (
    "role",
    "dtype",
    "height",
    "width",
    "layout",
    "lead_dims",
    "normalize",
    "resample",
    "upside_down",
)
# Written only when not at their defaults.
_IMAGE_OPTIONS = {
    "channels": None,
    "allow_upscale": False,
    "fit": None,
    "optional": False,
    "fill": None,
    "stack": 1,
}
_PART_OPTIONS = {"dim": None, "index": None, "encoding": None, "optional": False, "range": None}
_STATE_OPTIONS = {"pad_to": None, "reshape": None, "container": "array", "stack": 1}


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    return value


def node_to_v1(node: Any) -> dict[str, Any]:
    """The v1 form of a role-based ``Image``, ``State``, ``Concat``, ``Text`` or ``Action``."""
    if isinstance(node, Action):
        return {
            "clip": range_json(node.clip),
            "components": [component.to_dict() for component in node.components],
        }
    if isinstance(node, Image):
        data: dict[str, Any] = {"type": "image"}
        data.update({name: _json(getattr(node, name)) for name in _IMAGE_ALWAYS})
        for name, default in _IMAGE_OPTIONS.items():
            if getattr(node, name) != default:
                data[name] = getattr(node, name)
        return {**data, **node.extensions}
    if isinstance(node, Text):
        return {
            "type": "text",
            "role": node.role,
            "container": node.container,
            "fill": node.fill,
            **node.extensions,
        }
    parts = node.parts if isinstance(node, Concat) else (node,)
    data = {"type": "state", "components": [_part_to_v1(part) for part in parts]}
    data["dtype"] = node.dtype
    for name, default in _STATE_OPTIONS.items():
        if getattr(node, name) != default:
            data[name] = _json(getattr(node, name))
    return {**data, **node.extensions}


def _part_to_v1(part: State) -> dict[str, Any] | str:
    """A state component: the bare role when it sets nothing else (the canonical form)."""
    data: dict[str, Any] = {"role": part.role}
    for name, default in _PART_OPTIONS.items():
        if getattr(part, name) != default:
            data[name] = _json(getattr(part, name))
    return part.role if len(data) == 1 else data


def leaf_from_v1(data: Mapping[str, Any], where: str) -> Image | State | Concat | Text:
    """A role-based model leaf from its v1 form; a SpecError names the leaf and the field."""
    data = expect_mapping(where, data)
    kind = data.get("type")
    if kind == "image":
        known = ("type", *_IMAGE_ALWAYS, *_IMAGE_OPTIONS)
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
        known = ("type", "components", "dtype", *_STATE_OPTIONS)
        extensions = split_fields(f"{where} (state)", data, known)
        components = data.get("components")
        if not isinstance(components, list) or not components:
            raise SpecError(f"{where}: a state needs a non-empty list of components")
        parts = [
            _part_from_v1(item, f"{where}.components[{i}]") for i, item in enumerate(components)
        ]
        options = {name: data[name] for name in ("dtype", *_STATE_OPTIONS) if name in data}
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
    split_fields(where, data, ("role", *_PART_OPTIONS))
    return State(
        role=data.get("role"), **{name: data[name] for name in _PART_OPTIONS if name in data}
    )
