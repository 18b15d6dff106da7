"""The numeric leaves: ``State`` (one key or role) and ``Concat`` (several, in order).

A key-based numeric leaf reads Box, Discrete, MultiDiscrete or MultiBinary leaves, flattened
into one vector and cast. A role-based one pairs each part with a role an env's ``StateTag``
(or a ``Split`` field) provides and may re-encode rotations, slice, map ranges, zero-fill an
absent optional role, pad and reshape; the role resolver plans those steps. In adapters-v1
both are one ``"state"`` leaf whose ``components`` are the parts (``PART_V1_OPTIONS``,
``STATE_V1_OPTIONS``).

Example:
    >>> Concat("proprio/eef_pos", "proprio/gripper").to_dict()["components"]
    ['proprio/eef_pos', 'proprio/gripper']
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .checks import check_choice, check_encoding, check_int, check_stack, value_range
from .keys import Key, KeyPath, key_path, key_text
from .node import SpecNode, keyed_only, leaf_source, to_json
from .roles import is_role

FLAT_DTYPES = ("float32", "float64", "int64")
STATE_CONTAINERS = ("array", "list")
# The options adapters-v1 writes only when not at their defaults: a part's, then the leaf's.
PART_V1_OPTIONS = {"dim": None, "index": None, "encoding": None, "optional": False, "range": None}
STATE_V1_OPTIONS = {"pad_to": None, "reshape": None, "container": "array", "stack": 1}


@dataclass(frozen=True, init=False)
class State(SpecNode):
    """A numeric input: read by observation key, or one role paired with an env's ``StateTag``.

    Box, Discrete (one int64 element), MultiDiscrete and MultiBinary leaves are numeric; a
    keyed leaf is flattened to one vector and cast.

    Args:
        source: a role (``EEF_POS``) or an observation key (None = the whole observation, a
            tuple = a nested path); or pass ``key=`` / ``role=``.
        dtype: ``"float32"``, ``"float64"`` or ``"int64"``.
        stack: frames stacked along a new leading axis, oldest first (1 = none, at most 64):
            ``[stack, size]`` per lane. The first frame of an episode fills the whole window, as
            Gymnasium's ``FrameStackObservation(padding_type="reset")`` does.
        encoding: the rotation encoding the model wants (the env's is converted to it).
        dim: keep the leading ``dim`` elements; index: keep element ``index`` only.
        optional: zeros when the env has no such role (the width must be known: ``dim``,
            ``index`` or ``encoding``).
        range: ``(low, high)`` the model wants, mapped affinely from the env's range.
        pad_to: zero-pad the result to this length. reshape: the result's shape.
        container: ``"array"`` or ``"list"`` (plain floats).

        ``encoding`` .. ``container`` need a role-based leaf.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import ModelSpec
        >>> space = gym.spaces.Dict({"joints": gym.spaces.Box(-1, 1, (2, 3), np.float32)})
        >>> plan = ModelSpec(input=State("joints")).compile(space, gym.spaces.Discrete(2))
        >>> plan.observation[0].frame_shape
        (6,)

        With ``stack=3``, an episode's first observation fills the window, then each step
        pushes the oldest frame out:

        >>> from rlmesh.core import load_core
        >>> space = gym.spaces.Box(-9, 9, (1,), np.float32)
        >>> plan = ModelSpec(input=State(stack=3)).compile(space, gym.spaces.Discrete(2))
        >>> assembler = load_core("python").ObservationAssembler(plan.observation)
        >>> [assembler.assemble([np.array([t], np.float32)], [0])[0].ravel().tolist()
        ...  for t in (1, 2, 3, 4)]
        [[1.0, 1.0, 1.0], [1.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]
        >>> State("proprio/eef_rot", encoding="rot6d").role
        'proprio/eef_rot'
    """

    key: KeyPath
    role: str | None
    dtype: str
    stack: int
    encoding: str | None
    dim: int | None
    index: int | None
    optional: bool
    range: tuple[float, float] | None
    pad_to: int | None
    reshape: tuple[int, ...] | None
    container: str
    extensions: Mapping[str, Any]

    _KEYED = ("key", "dtype", "stack")

    def __init__(
        self,
        source: Key = None,
        *,
        key: Key = None,
        role: str | None = None,
        dtype: str = "float32",
        stack: int = 1,
        encoding: str | None = None,
        dim: int | None = None,
        index: int | None = None,
        optional: bool = False,
        range: tuple[float, float] | None = None,
        pad_to: int | None = None,
        reshape: tuple[int, ...] | None = None,
        container: str = "array",
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        path, role = leaf_source("State", source, key, role)
        values = dict(
            key=path,
            role=role,
            dtype=dtype,
            stack=stack,
            encoding=encoding,
            dim=dim,
            index=index,
            optional=optional,
            range=range,
            pad_to=pad_to,
            reshape=None if reshape is None else tuple(reshape),
            container=container,
            extensions=dict(extensions or {}),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        label = self.label
        keyed_only(
            label,
            role,
            {
                "encoding": (encoding, None),
                "dim": (dim, None),
                "index": (index, None),
                "optional": (optional, False),
                "range": (range, None),
                "pad_to": (pad_to, None),
                "reshape": (reshape, None),
                "container": (container, "array"),
            },
        )
        check_choice(label, "dtype", dtype, FLAT_DTYPES)
        check_stack(label, stack)
        _check_part(label, self)
        check_int(label, "pad_to", pad_to, 1)
        check_choice(label, "container", container, STATE_CONTAINERS)

    @property
    def role_based(self) -> bool:
        return self.role is not None

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``State(key="joints")`` or ``State("proprio/eef_pos")``."""
        if self.role is not None:
            return f"State({json.dumps(self.role)})"
        return f"State(key={key_text(self.key)})"

    def _v1_dict(self) -> dict[str, Any]:
        return _state_v1(self, (self,))


def _check_part(label: str, part: State) -> None:
    """The fields a State shares with a Concat part: encoding, dim / index, optional, range."""
    if part.encoding is not None:
        check_encoding(label, part.encoding)
    check_int(label, "dim", part.dim, 1)
    check_int(label, "index", part.index, 0)
    if part.dim is not None and part.index is not None:
        raise SpecError(f"{label}: dim keeps the leading elements and index one; pass one")
    if not isinstance(part.optional, bool):
        raise SpecError(f"{label}: optional must be a bool, got {part.optional!r}")
    if part.range is not None:
        object.__setattr__(part, "range", value_range(label, "range", part.range))


@dataclass(frozen=True, init=False)
class Concat(SpecNode):
    """Several numeric inputs concatenated in order into one vector: by key, or by role.

    Args:
        *parts: observation keys (a tuple = a nested path), at least one; or roles (a bare
            role str, or a ``State(role, ...)`` carrying part options: encoding, dim, index,
            optional, range).
        dtype: ``"float32"``, ``"float64"`` or ``"int64"``.
        pad_to, reshape, container, stack: as for ``State`` (role-based parts only, but
            ``stack``).

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import ModelSpec
        >>> space = gym.spaces.Dict({
        ...     "joints": gym.spaces.Box(-1, 1, (7,), np.float32),
        ...     "gripper": gym.spaces.Discrete(2),
        ... })
        >>> spec = ModelSpec(input={"state": Concat("joints", "gripper")})
        >>> spec.compile(space, gym.spaces.Discrete(2)).observation[0].frame_shape
        (8,)
        >>> state = Concat("proprio/eef_pos", State("proprio/eef_rot", encoding="rot6d"))
        >>> [part.role for part in state.parts]
        ['proprio/eef_pos', 'proprio/eef_rot']
    """

    keys: tuple[KeyPath, ...]
    parts: tuple[State, ...]
    dtype: str
    pad_to: int | None
    reshape: tuple[int, ...] | None
    container: str
    stack: int
    extensions: Mapping[str, Any]

    _KEYED = ("keys", "dtype")
    _REQUIRED = ("keys",)

    def __init__(
        self,
        *parts: Key | State,
        dtype: str = "float32",
        pad_to: int | None = None,
        reshape: tuple[int, ...] | None = None,
        container: str = "array",
        stack: int = 1,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        by_role = any(isinstance(part, State) or is_role(part) for part in parts)
        if by_role:
            role_parts = tuple(_role_part(part) for part in parts)
            keys: tuple[KeyPath, ...] = ()
        else:
            role_parts = ()
            keys = tuple(key_path(key, "Concat") for key in parts)
        values = dict(
            keys=keys,
            parts=role_parts,
            dtype=dtype,
            pad_to=pad_to,
            reshape=None if reshape is None else tuple(reshape),
            container=container,
            stack=stack,
            extensions=dict(extensions or {}),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        if not parts:
            raise SpecError('Concat() needs at least one key, e.g. Concat("joints", "gripper")')
        label = self.label
        if not by_role:
            keyed_only(
                label,
                None,
                {
                    "pad_to": (pad_to, None),
                    "reshape": (reshape, None),
                    "container": (container, "array"),
                },
            )
        check_choice(label, "dtype", dtype, FLAT_DTYPES)
        check_stack(label, stack)
        check_int(label, "pad_to", pad_to, 1)
        check_choice(label, "container", container, STATE_CONTAINERS)

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> Concat:
        keys = values.pop("keys")
        return cls(*keys, **values)

    @property
    def role_based(self) -> bool:
        return bool(self.parts)

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Concat("joints", "gripper")``."""
        if self.parts:
            return f"Concat({', '.join(json.dumps(part.role) for part in self.parts)})"
        return f"Concat({', '.join(key_text(key) for key in self.keys)})"

    def _v1_dict(self) -> dict[str, Any]:
        return _state_v1(self, self.parts)


def _role_part(part: object) -> State:
    """A Concat part as a role-only State: a bare role str, or a State with part fields only."""
    if isinstance(part, str) and is_role(part):
        return State(role=part)
    if isinstance(part, State) and part.role is not None:
        container_fields = {
            "pad_to": (part.pad_to, None),
            "reshape": (part.reshape, None),
            "container": (part.container, "array"),
            "dtype": (part.dtype, "float32"),
            "stack": (part.stack, 1),
        }
        set_fields = [
            name for name, (value, default) in container_fields.items() if value != default
        ]
        if set_fields:
            raise SpecError(
                f"Concat: part {part.label} sets {', '.join(set_fields)}, which belong on the "
                f"Concat itself"
            )
        return part
    raise SpecError(
        f"Concat: a role-based part is a role str or a State(role, ...), got {part!r}; keys "
        f"and roles do not mix in one Concat"
    )


def _state_v1(leaf: State | Concat, parts: tuple[State, ...]) -> dict[str, Any]:
    """The v1 ``"state"`` leaf: its parts as components, then the leaf's options."""
    data: dict[str, Any] = {"type": "state", "components": [_part_v1(part) for part in parts]}
    data["dtype"] = leaf.dtype
    for name, default in STATE_V1_OPTIONS.items():
        if getattr(leaf, name) != default:
            data[name] = to_json(getattr(leaf, name))
    return {**data, **leaf.extensions}


def _part_v1(part: State) -> dict[str, Any] | str:
    """A state component: the bare role when it sets nothing else (the canonical form)."""
    data: dict[str, Any] = {"role": part.role}
    for name, default in PART_V1_OPTIONS.items():
        if getattr(part, name) != default:
            data[name] = to_json(getattr(part, name))
    return part.role if len(data) == 1 else data
