"""The ``Text`` leaf: a string input, read by observation key or paired by role.

A text space is a ``gymnasium.spaces.Text`` or any other space whose values are strings
(``rlmesh.adapters.keys.is_text_space``). A role-based text leaf pairs with an env's
``TextTag`` and may give a fixed string when the env has no such role.

Example:
    >>> Text("text/instruction", fill="do the task").to_dict()
    {'type': 'text', 'role': 'text/instruction', 'container': 'str', 'fill': 'do the task'}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .checks import check_choice
from .keys import Key, KeyPath, key_text
from .node import SpecNode, keyed_only, leaf_source

TEXT_CONTAINERS = ("str", "list")


@dataclass(frozen=True, init=False)
class Text(SpecNode):
    """A string input: read by observation key, or paired by role with an env's ``TextTag``.

    A text space is a ``gymnasium.spaces.Text`` or any other space whose values are strings,
    such as MiniGrid's ``MissionSpace`` (see ``is_text_space``). Batched: a list of N strings.

    Args:
        source: a role (``INSTRUCTION``) or an observation key; or ``key=`` / ``role=``.
        container: ``"str"``, or ``"list"`` for a one-element list (role-based only).
        fill: the string given when the env has no such role (role-based only); without it a
            missing role is a resolve error.

    Example:
        >>> import gymnasium as gym
        >>> from rlmesh.adapters import ModelSpec
        >>> space = gym.spaces.Dict({"instruction": gym.spaces.Text(64)})
        >>> spec = ModelSpec(input={"prompt": Text("instruction")})
        >>> spec.compile(space, gym.spaces.Discrete(2)).observation[0].kind
        'text'
        >>> Text("text/instruction", fill="do the task").fill
        'do the task'
    """

    key: KeyPath
    role: str | None
    container: str
    fill: str | None
    extensions: Mapping[str, Any]

    _KEYED = ("key",)

    def __init__(
        self,
        source: Key = None,
        *,
        key: Key = None,
        role: str | None = None,
        container: str = "str",
        fill: str | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        path, role = leaf_source("Text", source, key, role)
        for name, value in dict(
            key=path, role=role, container=container, fill=fill, extensions=dict(extensions or {})
        ).items():
            object.__setattr__(self, name, value)
        keyed_only(self.label, role, {"container": (container, "str"), "fill": (fill, None)})
        check_choice(self.label, "container", container, TEXT_CONTAINERS)
        if fill is not None and not isinstance(fill, str):
            raise SpecError(f"{self.label}: fill must be a str, got {fill!r}")

    @property
    def role_based(self) -> bool:
        return self.role is not None

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Text(key="instruction")``."""
        if self.role is not None:
            return f"Text({json.dumps(self.role)})"
        return f"Text(key={key_text(self.key)})"

    def _v1_dict(self) -> dict[str, Any]:
        return {
            "type": "text",
            "role": self.role,
            "container": self.container,
            "fill": self.fill,
            **self.extensions,
        }
