"""The action side, shared by model specs and env tags: ``Actuator`` and ``Action``.

``Action`` says how the model's action reaches the action space. By key (no actuators), it
rescales, clips and casts each leaf of the action space. By role, it is the layout of an
action vector, one ``Actuator`` per contiguous slice: a model declares the layout it emits, an
env's tags (``EnvTags.action``) the layout it takes, and the role resolver maps one onto the
other. A layout is pure data; its adapters-v1 form is ``{"clip": ..., "components": [...]}``
(read back by ``rlmesh.adapters.v1.action_from_v1``).

Example:
    >>> layout = Action(Actuator("action/delta_eef_pos", dim=3), Actuator("action/gripper", dim=1))
    >>> layout.dim, layout.to_dict()["components"][1]
    (4, {'role': 'action/gripper', 'dim': 1, 'encoding': None, 'range': None, 'binary': False})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .checks import (
    check_dim,
    check_encoding,
    check_range,
    check_role,
    expect_mapping,
    finite_number,
    range_json,
    split_fields,
    value_range,
)
from .node import SpecNode


@dataclass(frozen=True)
class Actuator:
    """One contiguous slice of an action vector, by role.

    Args:
        role: the action role; None makes it opaque: ``dim`` constant ``fill`` values.
        dim: the number of dims it occupies.
        encoding: the rotation encoding of a rotation actuator.
        range: ``(low, high)`` of its values; a model range different from the env's is
            mapped affinely onto it.
        binary: a binary decision, snapped to -1 / +1 (``>= 0`` opens).
        scale, invert, threshold: the side's convention, applied in that order after the
            rotation and range are bridged (model side first, then env side).
        clip: clamp to ``range`` (env side only).
        fill: the constant of an opaque (role-less) or optional actuator.
        optional: an env actuator the model may not output (it then gets ``fill``).

    Example:
        >>> Actuator("action/gripper", dim=1, range=(-1, 1)).range
        (-1.0, 1.0)
    """

    role: str | None = None
    dim: int = 0
    encoding: str | None = None
    range: tuple[float, float] | None = None
    binary: bool = False
    scale: float | None = None
    invert: bool = False
    threshold: float | None = None
    clip: bool = False
    fill: float = 0.0
    optional: bool = False

    def __post_init__(self) -> None:
        label = self.label
        check_role("Actuator", self.role, optional=True)
        check_dim(label, self.dim)
        check_encoding(label, self.encoding)
        object.__setattr__(self, "range", check_range(label, "range", self.range))
        for name in ("binary", "invert", "clip", "optional"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{label}: {name} must be a bool, got {getattr(self, name)!r}")
        for name in ("scale", "threshold"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, finite_number(label, name, value))
        object.__setattr__(self, "fill", finite_number(label, "fill", self.fill))
        if self.clip and self.range is None:
            raise SpecError(f"{label}: clip=True clamps to range, but no range is declared")

    @property
    def label(self) -> str:
        """The actuator as messages name it: ``Actuator('action/gripper')``."""
        return f"Actuator({self.role!r})" if self.role else f"Actuator(dim={self.dim})"

    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON form: the always-present fields, then any non-default correction."""
        data: dict[str, Any] = {
            "role": self.role,
            "dim": self.dim,
            "encoding": self.encoding,
            "range": range_json(self.range),
            "binary": self.binary,
        }
        for name, default in (
            ("scale", None),
            ("invert", False),
            ("threshold", None),
            ("clip", False),
            ("fill", 0.0),
            ("optional", False),
        ):
            if getattr(self, name) != default:
                data[name] = getattr(self, name)
        return data


ACTUATOR_FIELDS = (
    "role",
    "dim",
    "encoding",
    "range",
    "binary",
    "scale",
    "invert",
    "threshold",
    "clip",
    "fill",
    "optional",
)


def actuator_from_dict(data: object, where: str) -> Actuator:
    """An ``Actuator`` from its v1 form; a SpecError names ``where`` and the field."""
    data = expect_mapping(where, data)
    split_fields(where, data, ACTUATOR_FIELDS)
    values = {name: data[name] for name in ACTUATOR_FIELDS if name in data}
    if "fill" in values and values["fill"] is None:
        values.pop("fill")
    return Actuator(**values)


_CLIP_DEFAULT: Any = object()


@dataclass(frozen=True, init=False)
class Action(SpecNode):
    """How the model's action reaches the action space.

    Two forms:

    - **by key** (no actuators): ``Action(rescale=None, clip=True)``: ``rescale`` maps the
      model's range ``(lo, hi)`` linearly onto each Box's bounds, ``clip`` clips Box actions to
      their bounds, then the action is cast into the space;
    - **by role**: ``Action(*actuators, clip=None)``: the layout of an action vector, one
      ``Actuator`` per contiguous slice; ``clip`` is None or a ``(low, high)`` applied to the
      whole env vector (env side only). A model's layout is paired with the env's tagged
      layout by role.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import ModelSpec
        >>> box = gym.spaces.Box(-2, 2, (1,), np.float32)
        >>> spec = ModelSpec(output=Action(rescale=(-1, 1)))
        >>> leaf = spec.compile(gym.spaces.Box(-1, 1, (3,)), box).action[0]
        >>> leaf.rescale, leaf.clip, leaf.high
        ((-1.0, 1.0), True, array([2.]))
        >>> layout = Action(Actuator("action/delta_eef_pos", dim=3), Actuator("action/x", dim=1))
        >>> layout.dim, layout.clip
        (4, None)
    """

    rescale: tuple[float, float] | None
    clip: bool | tuple[float, float] | None
    components: tuple[Actuator, ...] | None

    _KEYED = ("rescale", "clip")

    def __init__(
        self,
        *components: Actuator,
        rescale: tuple[float, float] | None = None,
        clip: Any = _CLIP_DEFAULT,
    ) -> None:
        if components:
            if not all(isinstance(component, Actuator) for component in components):
                raise SpecError(
                    f"Action(*actuators): each one is an Actuator(...), got {components!r}"
                )
            if rescale is not None:
                raise SpecError(
                    "Action: rescale maps onto Box bounds by key; with actuators declare each "
                    "one's range instead"
                )
            clip = None if clip is _CLIP_DEFAULT else clip
            if clip is not None:
                clip = check_range("Action", "clip", clip)
            object.__setattr__(self, "components", tuple(components))
        else:
            clip = True if clip is _CLIP_DEFAULT else clip
            if rescale is not None:
                rescale = value_range("Action", "rescale", rescale)
            if not isinstance(clip, bool):
                raise SpecError(f"Action: clip must be True or False, got {clip!r}")
            object.__setattr__(self, "components", None)
        object.__setattr__(self, "rescale", rescale)
        object.__setattr__(self, "clip", clip)

    @classmethod
    def layout(
        cls, components: tuple[Actuator, ...], clip: tuple[float, float] | None = None
    ) -> Action:
        """A role-based layout (possibly of no actuators) from a sequence of actuators."""
        action = cls(*components, clip=clip) if components else cls.__new__(cls)
        if not components:
            object.__setattr__(action, "rescale", None)
            object.__setattr__(action, "clip", clip)
            object.__setattr__(action, "components", ())
        return action

    @property
    def role_based(self) -> bool:
        return self.components is not None

    @property
    def dim(self) -> int:
        """The width of a role-based action vector: the sum of its actuators' dims."""
        return sum(component.dim for component in self.components or ())

    @property
    def label(self) -> str:
        """The output as messages name it: ``Action(rescale=(-1, 1))``."""
        if self.components is not None:
            return f"Action({', '.join(component.label for component in self.components)})"
        if self.rescale is None:
            return "Action()"
        lo, hi = self.rescale
        return f"Action(rescale=({lo:g}, {hi:g}))"

    def _v1_dict(self) -> dict[str, Any]:
        return {
            "clip": range_json(self.clip),
            "components": [component.to_dict() for component in self.components],
        }


CAST_ONLY = Action(rescale=None, clip=False)
"""The output of a model without a spec: its action is only cast into the action space."""
