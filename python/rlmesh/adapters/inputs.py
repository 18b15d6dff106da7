"""A model's input tree: leaves nested in dicts whose keys are the payload's slots.

``input_leaves`` walks the tree in order (the payload's order) and checks it; the tree's
saved form is a dict per leaf (``"type"`` names the leaf: the key-based class name, or a v1
``"image"`` / ``"state"`` / ``"text"``) in the same dicts (``tree_to_dict`` /
``tree_from_dict``).

Example:
    >>> from rlmesh.adapters import Image, State
    >>> tree = {"image": Image("pixels"), "robot": {"joints": State("joints")}}
    >>> [(slot, leaf.label) for slot, leaf in input_leaves(tree)]
    [(('image',), 'Image(key="pixels")'), (('robot', 'joints'), 'State(key="joints")')]
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import SpecError
from .custom import Custom
from .image import Image
from .keys import KeyPath, path_text
from .node import SpecNode, node_from_dict
from .state import Concat, State
from .text import Text
from .v1 import leaf_from_v1

Leaf = Image | State | Concat | Text | Custom
InputTree = Leaf | Mapping[str, "InputTree"]
LEAF_TYPES: dict[str, type[SpecNode]] = {
    leaf_type.__name__: leaf_type for leaf_type in (Image, State, Concat, Text, Custom)
}
V1_LEAF_TYPES = ("image", "state", "text")


def input_leaves(tree: object, slot: KeyPath = ()) -> Iterator[tuple[KeyPath, Leaf]]:
    """Every leaf of an input tree with its slot in the payload, in order."""
    if isinstance(tree, tuple(LEAF_TYPES.values())):
        yield slot, tree
        return
    if isinstance(tree, Mapping) and tree and all(isinstance(name, str) for name in tree):
        for name, subtree in tree.items():
            yield from input_leaves(subtree, (*slot, name))
        return
    raise SpecError(
        f"ModelSpec: {path_text(slot, 'input')} must be a leaf ({', '.join(LEAF_TYPES)}) or "
        f"a non-empty dict of them with str keys, got {tree!r}"
    )


def tree_to_dict(tree: InputTree | None) -> Any:
    """An input tree as JSON-ready data: each leaf's ``to_dict``, in the tree's dicts."""
    if isinstance(tree, Mapping):
        return {name: tree_to_dict(subtree) for name, subtree in tree.items()}
    return None if tree is None else tree.to_dict()


def tree_from_dict(data: Any, slot: KeyPath, allow_custom: bool) -> Any:
    """An input tree from its dict form: a dict whose "type" is a str is a leaf, else slots."""
    if data is None:
        return None
    if isinstance(data, Mapping) and data.get("type") in V1_LEAF_TYPES:
        return leaf_from_v1(data, path_text(slot, "input"))
    if isinstance(data, Mapping) and data.get("type") == "Custom" and not allow_custom:
        raise SpecError(
            f"{path_text(slot, 'input')}: a Custom leaf names code "
            f"({json.dumps(data.get('fn'))}) and reading it would import that module; a spec "
            f"read from data runs no code: pass allow_custom=True to from_dict / from_json "
            f"only for a spec as trusted as that code"
        )
    if isinstance(data, Mapping) and isinstance(data.get("type"), str):
        return node_from_dict(data, LEAF_TYPES)
    if isinstance(data, Mapping):
        return {
            name: tree_from_dict(subtree, (*slot, name), allow_custom)
            for name, subtree in data.items()
        }
    raise SpecError(
        f"ModelSpec.from_dict: {path_text(slot, 'input')} must be a leaf dict with a "
        f'"type" or a dict of them, got {data!r}'
    )
