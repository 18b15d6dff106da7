"""The env side of adapters-v1: what each observation leaf and action dim *is*, by role.

An env tags its spaces once (``EnvTags``); the tags carry only what a space cannot say (the
role, an image's layout and orientation, a rotation's encoding, a range). Keys, widths and
dtypes are read from the spaces at resolve time. Tags are pure data and serialize to the v1
JSON form (``to_dict`` / ``EnvTags.from_dict``). The action layout is an ``Action`` of
``Actuator`` slices, shared with model specs (``rlmesh.adapters.action``).

Example:
    >>> from rlmesh import adapters
    >>> tags = adapters.EnvTags(
    ...     observation={
    ...         "agentview": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True),
    ...         "eef_quat": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw"),
    ...     },
    ...     action=adapters.Action(
    ...         adapters.Actuator(adapters.ACTION_DELTA_POS, dim=3),
    ...         adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1)),
    ...         clip=(-1, 1),
    ...     ),
    ... )
    >>> tags.to_dict()["observation"]["agentview"]
    {'type': 'image', 'role': 'image/primary', 'layout': 'hwc', 'upside_down': True}
    >>> adapters.EnvTags.from_dict(tags.to_dict()) == tags
    True
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from .action import Action
from .action import Actuator as Actuator  # its home before the action side had one
from .checks import (
    check_dim,
    check_encoding,
    check_range,
    check_role,
    expect_mapping,
    range_json,
    split_fields,
)
from .roles import encoding_width
from .v1 import action_from_v1

LAYOUTS = ("hwc", "chw")


# ----------------------------------------------------------------------------------------------
# Observation tags


@dataclass(frozen=True)
class ImageTag:
    """An image leaf of the observation: its role, layout and whether it renders upside down.

    Args:
        role: the image role, e.g. ``IMAGE_PRIMARY``.
        layout: ``"hwc"`` (height, width, channels) or ``"chw"``, how the env stores it.
        upside_down: the camera renders rotated 180 degrees from upright.
    """

    role: str
    layout: str = "hwc"
    upside_down: bool = False
    extensions: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_role("ImageTag", self.role)
        if self.layout not in LAYOUTS:
            raise SpecError(
                f"ImageTag({self.role!r}): layout must be 'hwc' or 'chw', got {self.layout!r}"
            )
        if not isinstance(self.upside_down, bool):
            raise SpecError(f"ImageTag({self.role!r}): upside_down must be a bool")

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form."""
        return {
            "type": "image",
            "role": self.role,
            "layout": self.layout,
            "upside_down": self.upside_down,
            **self.extensions,
        }


@dataclass(frozen=True)
class StateTag:
    """A numeric leaf of the observation: its role, rotation encoding and range.

    Args:
        role: the state role, e.g. ``EEF_POS``.
        encoding: the rotation encoding when the leaf is a rotation (``"quat_xyzw"``, ...).
        range: ``(low, high)`` of the values, where the space leaves them unbounded (a
            bounded space's own bounds are the range; a tag range they contradict is refused
            at resolve time).
    """

    role: str
    encoding: str | None = None
    range: tuple[float, float] | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        label = f"StateTag({self.role!r})"
        check_role("StateTag", self.role)
        check_encoding(label, self.encoding)
        object.__setattr__(self, "range", check_range(label, "range", self.range))

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form."""
        return {
            "type": "state",
            "role": self.role,
            "encoding": self.encoding,
            "range": range_json(self.range),
            **self.extensions,
        }


@dataclass(frozen=True)
class TextTag:
    """A text leaf of the observation (typically the instruction)."""

    role: str
    extensions: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_role("TextTag", self.role)

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form."""
        return {"type": "text", "role": self.role, **self.extensions}


@dataclass(frozen=True)
class Field:
    """One slice of a flat vector tagged by ``Split``; ``role=None`` skips ``dim`` elements.

    ``range`` is as ``StateTag``'s, for the slice: the slice's own bounds when the space has
    them, else the declared range.

    Example:
        >>> Field("proprio/eef_pos", 3), Field(dim=10).role
        (Field(role='proprio/eef_pos', dim=3, encoding=None, range=None), None)
    """

    role: str | None = None
    dim: int = 0
    encoding: str | None = None
    range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        label = f"Field({self.role!r})"
        check_role("Field", self.role, optional=True)
        check_dim(label, self.dim)
        check_encoding(label, self.encoding)
        object.__setattr__(self, "range", check_range(label, "range", self.range))
        if self.role is None and (self.encoding is not None or self.range is not None):
            raise SpecError("Field(dim=...): a skip (no role) carries no encoding or range")
        if self.encoding is not None and encoding_width(self.encoding) != self.dim:
            raise SpecError(
                f"{label}: encoding {self.encoding} is {encoding_width(self.encoding)}-D but "
                f"dim is {self.dim}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form of one field of a split tag."""
        return {
            "role": self.role,
            "dim": self.dim,
            "encoding": self.encoding,
            "range": range_json(self.range),
        }


@dataclass(frozen=True, init=False)
class Split:
    """A flat numeric leaf cut into role-tagged slices, in order (Metaworld-style vectors).

    Example:
        >>> split = Split(Field("proprio/eef_pos", 3), Field("proprio/gripper", 1), Field(dim=4))
        >>> split.dim, [f.role for f in split.fields]
        (8, ['proprio/eef_pos', 'proprio/gripper', None])
    """

    fields: tuple[Field, ...]

    def __init__(self, *fields: Field) -> None:
        if not fields or not all(isinstance(item, Field) for item in fields):
            raise SpecError("Split(*fields): needs at least one Field(...)")
        object.__setattr__(self, "fields", tuple(fields))

    @property
    def dim(self) -> int:
        """The width the tagged leaf must have: the sum of the fields' dims."""
        return sum(item.dim for item in self.fields)

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form."""
        return {"type": "split", "fields": [item.to_dict() for item in self.fields]}


ObservationTag = ImageTag | StateTag | TextTag | Split
_TAG_FIELDS = {
    "image": ("type", "role", "layout", "upside_down"),
    "state": ("type", "role", "encoding", "range"),
    "text": ("type", "role"),
    "split": ("type", "fields"),
}


def observation_tag_from_dict(data: Mapping[str, Any], where: str) -> ObservationTag:
    """One observation tag from its v1 form."""
    kind = data.get("type")
    if kind not in _TAG_FIELDS:
        raise SpecError(f"{where}: unknown tag type {kind!r}; expected one of {list(_TAG_FIELDS)}")
    extensions = split_fields(f"{where} ({kind} tag)", data, _TAG_FIELDS[kind])
    if kind == "image":
        return ImageTag(
            data.get("role"),
            layout=data.get("layout", "hwc"),
            upside_down=data.get("upside_down", False),
            extensions=extensions,
        )
    if kind == "state":
        return StateTag(
            data.get("role"),
            encoding=data.get("encoding"),
            range=data.get("range"),
            extensions=extensions,
        )
    if kind == "text":
        return TextTag(data.get("role"), extensions=extensions)
    fields_data = data.get("fields")
    if not isinstance(fields_data, list):
        raise SpecError(f"{where}: a split tag needs a list of fields, got {fields_data!r}")
    parsed = []
    for index, item in enumerate(fields_data):
        item = expect_mapping(f"{where}.fields[{index}]", item)
        split_fields(f"{where}.fields[{index}]", item, ("role", "dim", "encoding", "range"))
        parsed.append(
            Field(item.get("role"), item.get("dim"), item.get("encoding"), item.get("range"))
        )
    return Split(*parsed)


def _is_tag(value: object) -> bool:
    return isinstance(value, (ImageTag, StateTag, TextTag, Split))


def observation_tags(
    tree: object, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple, ObservationTag]]:
    """Every tag of an observation tag tree with its path (dict keys, tuple indices)."""
    if _is_tag(tree):
        yield path, tree  # type: ignore[misc]
    elif isinstance(tree, Mapping):
        for key, subtree in tree.items():
            if not isinstance(key, str):
                raise SpecError(f"EnvTags: observation keys are str, got {key!r}")
            yield from observation_tags(subtree, (*path, key))
    elif isinstance(tree, tuple):
        for index, subtree in enumerate(tree):
            yield from observation_tags(subtree, (*path, index))
    else:
        raise SpecError(
            f"EnvTags: observation{''.join(f'[{json.dumps(p)}]' for p in path)} must be a tag "
            f"(ImageTag, StateTag, TextTag, Split), a dict or a tuple of them, got {tree!r}"
        )


def _tree_to_dict(tree: object) -> Any:
    if _is_tag(tree):
        return tree.to_dict()  # type: ignore[union-attr]
    if isinstance(tree, Mapping):
        return {key: _tree_to_dict(subtree) for key, subtree in tree.items()}
    if isinstance(tree, tuple):
        return [_tree_to_dict(subtree) for subtree in tree]
    return None


def _tree_from_dict(data: object, where: str) -> Any:
    if isinstance(data, Mapping) and isinstance(data.get("type"), str):
        return observation_tag_from_dict(data, where)
    if isinstance(data, Mapping):
        return {key: _tree_from_dict(value, f"{where}.{key}") for key, value in data.items()}
    if isinstance(data, list):
        return tuple(_tree_from_dict(value, f"{where}[{i}]") for i, value in enumerate(data))
    if data is None:
        return None
    raise SpecError(f"{where}: expected a tag object, a dict or a list of them, got {data!r}")


# ----------------------------------------------------------------------------------------------
# EnvTags


@dataclass(frozen=True)
class EnvTags:
    """An env's tags: an observation tag tree and its action layout.

    Args:
        observation: a tag (``ImageTag``, ``StateTag``, ``TextTag``, ``Split``), or a dict
            (mirroring a Dict space, nested for nested Dicts) or tuple of them.
        action: an ``Action(*Actuator, clip=...)``, the layout of the env's action vector.
    """

    observation: Any = None
    action: Any = None

    def __post_init__(self) -> None:
        if self.observation is not None:
            for _ in observation_tags(self.observation):
                pass  # walking the tree is the check
        if self.action is not None and not (
            isinstance(self.action, Action) and self.action.components is not None
        ):
            raise SpecError(
                f"EnvTags: action must be Action(Actuator(...), ...), got {self.action!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form: ``{"observation": ..., "action": ...}``."""
        return {
            "observation": _tree_to_dict(self.observation),
            "action": None if self.action is None else self.action.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvTags:
        """Tags from their v1 JSON form (a SpecError names what is wrong and where)."""
        data = expect_mapping("EnvTags", data)
        split_fields("EnvTags", data, ("observation", "action"))
        action = data.get("action")
        return cls(
            observation=_tree_from_dict(data.get("observation"), "observation"),
            action=None if action is None else action_from_v1(action, "action"),
        )

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> EnvTags:
        """Tags from ``to_json`` text (or a v1 tags file's content)."""
        return cls.from_dict(json.loads(text))
