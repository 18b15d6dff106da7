"""What a model consumes and emits: ``ModelSpec``, its leaves, and the ``Plan`` compiled from them.

A model may declare ``spec = ModelSpec(input=..., output=...)``. The input is one leaf, or a
dict of leaves (each key a slot of the payload the model receives); each leaf names the
observation key it reads. The output says how the model's action is mapped into the action
space. A spec is pure data: it round-trips through ``to_dict()`` / ``from_dict()`` and JSON,
and reading one runs no code (a ``Custom`` leaf, which names a function to import, is read
only when allowed).

Once per route, ``compile_spec`` checks the spec against the environment's observation and
action spaces and turns it into a ``Plan``: pure data from which the cores assemble each lane's
input and apply each action. A model without a spec gets the raw observation, and its action is
only cast into the action space.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> observation_space = gym.spaces.Dict({
    ...     "pixels": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
    ...     "joints": gym.spaces.Box(-1, 1, (7,), np.float64),
    ... })
    >>> action_space = gym.spaces.Box(-2, 2, (7,), np.float32)
    >>> spec = ModelSpec(
    ...     input={
    ...         "image": Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4),
    ...         "state": State("joints"),
    ...     },
    ...     output=Action(rescale=(-1, 1)),
    ... )
    >>> plan = spec.compile(observation_space, action_space)
    >>> print(plan.describe())
    image: obs["pixels"] uint8[84,84,3] -> float32[3,84,84] (chw, x/255 -> [0, 1], stack 4)
    state: obs["joints"] float64[7] -> float32[7] (flatten)
    action: rescale [-1, 1] onto [-2, 2], clip to [-2, 2], cast to float32[7]
    >>> plan.advisories()
    ['State(key="joints") casts obs["joints"] from float64 to float32, which can lose precision.']
"""

from __future__ import annotations

import copy
import importlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .roles import is_role
from .tags import Actuator

KeyPath = tuple[str, ...]
"""A key normalized: ``()`` is the whole observation, ``("a", "b")`` is ``obs["a"]["b"]``."""

Key = str | KeyPath | None
"""A key as written in a leaf: None (the whole observation), a top-level key, or a path."""

MAX_STACK = 64
IMAGE_LAYOUTS = ("hwc", "chw")
IMAGE_DTYPES = ("uint8", "float32")
IMAGE_FITS = ("stretch", "crop", "pad")
FLAT_DTYPES = ("float32", "float64", "int64")
# Environments emit images height-width-channels (the Gymnasium convention).
CHW_AXES = (2, 0, 1)
NUMERIC_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# Gymnasium's own kinds whose values are never strings (only spaces.Text holds those).
_NON_TEXT_SPACES = (*NUMERIC_SPACES, spaces.Dict, spaces.Tuple, spaces.Sequence, spaces.Graph)


def is_text_space(space: spaces.Space) -> bool:
    """Whether the values of ``space`` are strings, so a ``Text`` leaf can read it.

    True for a ``gymnasium.spaces.Text``, and for a space of another kind than Gymnasium's own
    whose ``sample()`` is a ``str``: MiniGrid's ``MissionSpace`` is a ``gymnasium.Space``
    subclass, not a ``Text``, and its missions are strings. The sample is drawn from a copy, so
    the space's own random state is left as it was.

    Example:
        >>> is_text_space(spaces.Text(16)), is_text_space(spaces.Discrete(3))
        (True, False)
    """
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, _NON_TEXT_SPACES) or type(space).__module__.startswith("gymnasium."):
        return False
    try:
        sample = copy.deepcopy(space).sample()
    except Exception:  # a space that cannot sample says nothing of its values
        return False
    return isinstance(sample, str)


# ----------------------------------------------------------------------------------------------
# Keys and how messages show them


def _key_path(key: object, leaf_type: str) -> KeyPath:
    """``key`` as a KeyPath (a JSON list counts as a tuple), or a SpecError naming the leaf."""
    if key is None:
        return ()
    if isinstance(key, str):
        return (key,)
    if isinstance(key, (tuple, list)) and all(isinstance(part, str) for part in key):
        return tuple(key)
    raise SpecError(
        f"{leaf_type}: a key is None (the whole observation), a str (a top-level key) or a "
        f"tuple of str (a path into nested Dicts), got {key!r}"
    )


def _key_text(path: KeyPath) -> str:
    """The key as a user writes it in a leaf: ``None``, ``"a"`` or ``("a", "b")``."""
    if not path:
        return "None"
    if len(path) == 1:
        return json.dumps(path[0])
    return "(" + ", ".join(json.dumps(part) for part in path) + ")"


def _path_text(path: KeyPath, root: str = "obs") -> str:
    """Where a path leads: ``obs``, ``obs["a"]["b"]``, ``action["arm"]``."""
    return root + "".join(f"[{json.dumps(part)}]" for part in path)


def _array_text(dtype: str, shape: tuple[int, ...]) -> str:
    """An array's dtype and shape, compactly: ``uint8[84,84,3]``."""
    return f"{dtype}[{','.join(str(size) for size in shape)}]"


def _space_text(space: spaces.Space) -> str:
    """What a space holds, in a few words, for error messages."""
    if isinstance(space, spaces.Box):
        return f"Box {_array_text(np.dtype(space.dtype).name, space.shape)}"
    if isinstance(space, spaces.Dict):
        return f"Dict with keys {json.dumps(list(space.spaces))}"
    if isinstance(space, spaces.Text):
        return f"Text(max_length={space.max_length})"
    return repr(space)


# ----------------------------------------------------------------------------------------------
# Argument checks shared by the leaves


def _check_choice(label: str, argument: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        allowed = ", ".join(json.dumps(choice) for choice in choices)
        raise SpecError(f"{label}: {argument} must be one of {allowed}, got {value!r}")


def _check_stack(label: str, stack: object) -> None:
    if isinstance(stack, bool) or not isinstance(stack, int) or not 1 <= stack <= MAX_STACK:
        raise SpecError(
            f"{label}: stack (frames per input, 1 = none) must be an int in 1..{MAX_STACK}, "
            f"got {stack!r}"
        )


def _value_range(label: str, argument: str, value: object) -> tuple[float, float]:
    """``value`` as a finite ``(lo, hi)`` with ``lo < hi``, or a SpecError naming the argument."""
    try:
        lo, hi = (float(bound) for bound in value)
    except (TypeError, ValueError):
        raise SpecError(
            f"{label}: {argument} must be a pair (lo, hi) of numbers, got {value!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise SpecError(f"{label}: {argument} must be finite with lo < hi, got ({lo:g}, {hi:g})")
    return lo, hi


# ----------------------------------------------------------------------------------------------
# The spec: leaves, Action, ModelSpec


def _to_json(value: Any) -> Any:
    """Tuples (key paths, ranges) as lists: what JSON would make of them anyway."""
    if isinstance(value, tuple):
        return [_to_json(item) for item in value]
    return value


def _from_json(value: Any) -> Any:
    """Lists back to tuples, undoing ``_to_json``."""
    if isinstance(value, list):
        return tuple(_from_json(item) for item in value)
    return value


class _SpecNode:
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
            from .v1 import node_to_v1

            return node_to_v1(self)
        data = {name: _to_json(getattr(self, name)) for name in self._KEYED}
        return {"type": type(self).__name__, **data}

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> _SpecNode:
        """The node built from its fields (already converted back from JSON)."""
        return cls(**values)


def _source(label: str, source: object, key: object, role: object) -> tuple[KeyPath, str | None]:
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
    return _key_path(key, label), None


def _keyed_only(label: str, role: str | None, options: dict[str, tuple[object, object]]) -> None:
    """A key-based leaf refuses the options that only resolve by role can plan."""
    if role is not None:
        return
    given = [name for name, (value, default) in options.items() if value != default]
    if given:
        raise SpecError(
            f"{label}: {', '.join(given)} need(s) a role-based leaf (pair it by role, e.g. "
            f"Image(IMAGE_PRIMARY, ...), with env tags), not a key"
        )


def _check_int(label: str, name: str, value: object, low: int, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(f"{label}: {name} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True, init=False)
class Image(_SpecNode):
    """An image input: read by observation key, or paired by role with an env's ``ImageTag``.

    Args:
        source: a role (``IMAGE_PRIMARY``: a str with a ``/``) or an observation key (None =
            the whole observation, a tuple = a nested path); or pass ``key=`` / ``role=``.
        layout: the layout the *model* wants: ``"hwc"`` or ``"chw"``.
        dtype: ``"uint8"`` or ``"float32"``.
        normalize: False, True (uint8 [0, 255] onto [0, 1]) or a range ``(lo, hi)``; needs
            ``dtype="float32"``.
        stack: frames stacked along a new leading axis, oldest first (1 = none, at most 64).
            The first frame of an episode fills the whole window, as Gymnasium's
            ``FrameStackObservation(padding_type="reset")`` does.
        size, height, width: the target size (``size`` sets both); None keeps the env's.
        resample: ``"bilinear"`` (half-pixel centres, as OpenCV ``INTER_LINEAR``) or
            ``"bilinear_aa"`` (antialiased, as Pillow's ``BILINEAR``).
        allow_upscale: permit a target larger than the env's image.
        fit: how an aspect change is reconciled: ``"stretch"`` (scale each axis alone),
            ``"crop"`` (scale uniformly to cover the target, then cut its centre) or ``"pad"``
            (scale uniformly to fit inside, then centre it on zeros); or a preference list,
            e.g. ``("crop", "pad")``: the first that needs no disallowed upscale is used. None:
            an aspect change is a resolve error.
        upside_down: the model was trained on frames rotated 180 degrees.
        lead_dims: leading singleton axes to add (a batch or time axis the model expects).
        channels: the channel count the model wants (a mismatch is then a resolve error).
        optional, fill: a blank frame (``fill``, default 0) when the env has no such camera;
            needs ``height``, ``width`` and ``channels``.

        Every option after ``stack`` needs a role-based leaf.

    Example:
        >>> image = Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4)
        >>> image.key, image.normalize, image.role
        (('pixels',), (0.0, 1.0), None)
        >>> Image("image/primary", size=224).role, Image("image/primary", size=224).height
        ('image/primary', 224)
    """

    key: KeyPath
    role: str | None
    layout: str
    dtype: str
    normalize: bool | tuple[float, float]
    stack: int
    height: int | None
    width: int | None
    channels: int | None
    lead_dims: int
    upside_down: bool
    resample: str
    allow_upscale: bool
    fit: str | tuple[str, ...] | None
    optional: bool
    fill: float | None
    extensions: Mapping[str, Any]

    _KEYED = ("key", "layout", "dtype", "normalize", "stack")

    def __init__(
        self,
        source: Key = None,
        *,
        key: Key = None,
        role: str | None = None,
        layout: str = "hwc",
        dtype: str = "uint8",
        normalize: bool | tuple[float, float] = False,
        stack: int = 1,
        size: int | None = None,
        height: int | None = None,
        width: int | None = None,
        channels: int | None = None,
        lead_dims: int = 0,
        upside_down: bool = False,
        resample: str = "bilinear",
        allow_upscale: bool = False,
        fit: str | Sequence[str] | None = None,
        optional: bool = False,
        fill: float | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        path, role = _source("Image", source, key, role)
        if isinstance(fit, (list, tuple)):
            fit = tuple(fit)
        if size is not None:
            if height is not None or width is not None:
                raise SpecError("Image: pass size= or height=/width=, not both")
            height = width = size
        values = dict(
            key=path,
            role=role,
            layout=layout,
            dtype=dtype,
            normalize=normalize,
            stack=stack,
            height=height,
            width=width,
            channels=channels,
            lead_dims=lead_dims,
            upside_down=upside_down,
            resample=resample,
            allow_upscale=allow_upscale,
            fit=fit,
            optional=optional,
            fill=fill,
            extensions=dict(extensions or {}),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        label = self.label
        _keyed_only(
            label,
            role,
            {
                "size/height/width": ((height, width), (None, None)),
                "channels": (channels, None),
                "lead_dims": (lead_dims, 0),
                "upside_down": (upside_down, False),
                "resample": (resample, "bilinear"),
                "allow_upscale": (allow_upscale, False),
                "fit": (fit, None),
                "optional": (optional, False),
                "fill": (fill, None),
            },
        )
        _check_choice(label, "layout", layout, IMAGE_LAYOUTS)
        _check_choice(label, "dtype", dtype, IMAGE_DTYPES)
        for mode in fit if isinstance(fit, tuple) else () if fit is None else (fit,):
            _check_choice(label, "fit", mode, IMAGE_FITS)
        if fit == ():
            raise SpecError(f"{label}: fit must name at least one of stretch, crop, pad")
        _check_stack(label, stack)
        for name in ("height", "width", "channels"):
            _check_int(label, name, getattr(self, name), 1)
        _check_int(label, "lead_dims", lead_dims, 0, allow_none=False)
        if fill is not None and not optional:
            raise SpecError(f"{label}: fill is the blank frame's value; it needs optional=True")
        if role is None:
            object.__setattr__(self, "normalize", self._normalize_range())
        elif normalize is not False:
            self._normalize_range()  # checked; kept as written so v1 round-trips exactly
            if isinstance(normalize, (list, tuple)):
                object.__setattr__(self, "normalize", self._normalize_range())

    def _normalize_range(self) -> bool | tuple[float, float]:
        """``normalize`` stored: False, or the range ``(lo, hi)`` that True abbreviates."""
        if self.normalize is False:
            return False
        if self.dtype != "float32":
            raise SpecError(
                f'{self.label}: normalize produces fractions, so it needs dtype="float32", '
                f"got dtype={json.dumps(self.dtype)}"
            )
        if self.normalize is True:
            return (0.0, 1.0)
        return _value_range(self.label, "normalize", self.normalize)

    @property
    def role_based(self) -> bool:
        return self.role is not None

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Image(key="pixels")`` or ``Image("image/primary")``."""
        if self.role is not None:
            return f"Image({json.dumps(self.role)})"
        return f"Image(key={_key_text(self.key)})"


@dataclass(frozen=True, init=False)
class State(_SpecNode):
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
        path, role = _source("State", source, key, role)
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
        _keyed_only(
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
        _check_choice(label, "dtype", dtype, FLAT_DTYPES)
        _check_stack(label, stack)
        _check_part(label, self)
        _check_int(label, "pad_to", pad_to, 1)
        _check_choice(label, "container", container, STATE_CONTAINERS)

    @property
    def role_based(self) -> bool:
        return self.role is not None

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``State(key="joints")`` or ``State("proprio/eef_pos")``."""
        if self.role is not None:
            return f"State({json.dumps(self.role)})"
        return f"State(key={_key_text(self.key)})"


STATE_CONTAINERS = ("array", "list")


def _check_part(label: str, part: State) -> None:
    """The fields a State shares with a Concat part: encoding, dim / index, optional, range."""
    if part.encoding is not None:
        from .tags import check_encoding

        check_encoding(label, part.encoding)
    _check_int(label, "dim", part.dim, 1)
    _check_int(label, "index", part.index, 0)
    if part.dim is not None and part.index is not None:
        raise SpecError(f"{label}: dim keeps the leading elements and index one; pass one")
    if not isinstance(part.optional, bool):
        raise SpecError(f"{label}: optional must be a bool, got {part.optional!r}")
    if part.range is not None:
        object.__setattr__(part, "range", _value_range(label, "range", part.range))


@dataclass(frozen=True, init=False)
class Concat(_SpecNode):
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
            keys = tuple(_key_path(key, "Concat") for key in parts)
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
            _keyed_only(
                label,
                None,
                {
                    "pad_to": (pad_to, None),
                    "reshape": (reshape, None),
                    "container": (container, "array"),
                },
            )
        _check_choice(label, "dtype", dtype, FLAT_DTYPES)
        _check_stack(label, stack)
        _check_int(label, "pad_to", pad_to, 1)
        _check_choice(label, "container", container, STATE_CONTAINERS)

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
        return f"Concat({', '.join(_key_text(key) for key in self.keys)})"


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


@dataclass(frozen=True, init=False)
class Text(_SpecNode):
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
        path, role = _source("Text", source, key, role)
        for name, value in dict(
            key=path, role=role, container=container, fill=fill, extensions=dict(extensions or {})
        ).items():
            object.__setattr__(self, name, value)
        _keyed_only(self.label, role, {"container": (container, "str"), "fill": (fill, None)})
        _check_choice(self.label, "container", container, TEXT_CONTAINERS)
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
        return f"Text(key={_key_text(self.key)})"


TEXT_CONTAINERS = ("str", "list")


@dataclass(frozen=True)
class Custom(_SpecNode):
    """The escape hatch: ``fn(raw_obs) -> value``, called on one lane's full raw observation.

    The only leaf that runs user code. To save the spec (``to_dict``), ``fn`` must be importable
    by its name: a function defined with ``def`` at the top level of a module, stored as
    ``"module:qualname"``. Reading it back imports that module, so ``from_dict`` /
    ``from_json`` refuse it unless told ``allow_custom=True``.

    Example:
        >>> import gymnasium as gym
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


_CLIP_DEFAULT: Any = object()


@dataclass(frozen=True, init=False)
class Action(_SpecNode):
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
                from .tags import check_range

                clip = check_range("Action", "clip", clip)
            object.__setattr__(self, "components", tuple(components))
        else:
            clip = True if clip is _CLIP_DEFAULT else clip
            if rescale is not None:
                rescale = _value_range("Action", "rescale", rescale)
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


CAST_ONLY = Action(rescale=None, clip=False)
"""The output of a model without a spec: its action is only cast into the action space."""

Leaf = Image | State | Concat | Text | Custom
InputTree = Leaf | Mapping[str, "InputTree"]
_LEAF_TYPES: dict[str, type[_SpecNode]] = {
    leaf_type.__name__: leaf_type for leaf_type in (Image, State, Concat, Text, Custom)
}
V1_LEAF_TYPES = ("image", "state", "text")


def action_from_v1(data: object, where: str) -> Action:
    """A role-based ``Action`` from its v1 form ``{"clip": ..., "components": [...]}``."""
    from .tags import actuator_from_dict, expect_mapping, split_fields

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


def _input_leaves(tree: object, slot: KeyPath = ()) -> Iterator[tuple[KeyPath, Leaf]]:
    """Every leaf of an input tree with its slot in the payload, in order."""
    if isinstance(tree, tuple(_LEAF_TYPES.values())):
        yield slot, tree
        return
    if isinstance(tree, Mapping) and tree and all(isinstance(name, str) for name in tree):
        for name, subtree in tree.items():
            yield from _input_leaves(subtree, (*slot, name))
        return
    raise SpecError(
        f"ModelSpec: {_path_text(slot, 'input')} must be a leaf ({', '.join(_LEAF_TYPES)}) or "
        f"a non-empty dict of them with str keys, got {tree!r}"
    )


@dataclass(frozen=True)
class ModelSpec:
    """What a model consumes (``input``) and emits (``output``); declared as ``Model.spec``.

    A leaf with ``stack=k`` gives the model the episode's last ``k`` observations along a new
    leading axis, oldest first. Its first observation fills all ``k`` places (``[f0, f0, f0]``,
    then ``[f0, f0, f1]``, ...), as Gymnasium's ``FrameStackObservation(padding_type="reset")``
    does; the windows are kept per episode, so a lane's next episode starts afresh. With
    action chunks the window still moves every env step.

    The model's action must have the action space's shape per lane (a leaf of one value, such
    as ``Box(1,)`` or ``Discrete``, takes a scalar or a one-element vector); nothing is reshaped,
    and any other shape is a ``ModelOutputError`` naming the lane, episode index and step.

    Args:
        input: one leaf (the payload is that leaf's value), a dict of leaves (the payload is a
            dict with the same keys; dicts may nest), or None for the raw observation.
        output: how the action is mapped into the action space (default: clip Box actions).

    Example:
        >>> import json
        >>> spec = ModelSpec(input={"image": Image("pixels", stack=2), "state": State("joints")})
        >>> ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
        True
        >>> spec.to_dict()["input"]["state"]
        {'type': 'State', 'key': ['joints'], 'dtype': 'float32', 'stack': 1}
    """

    input: InputTree | None = None
    output: Action = field(default_factory=Action)

    def __post_init__(self) -> None:
        if self.input is not None:
            for _ in _input_leaves(self.input):
                pass  # walking the tree is the check
        if not isinstance(self.output, Action):
            raise SpecError(f"ModelSpec: output must be an Action(...), got {self.output!r}")

    @property
    def role_based(self) -> bool:
        """Whether any input leaf or the output pairs by role (resolve needs env tags)."""
        leaves = () if self.input is None else (leaf for _, leaf in _input_leaves(self.input))
        return self.output.role_based or any(leaf.role_based for leaf in leaves)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (adapters-v1 for role-based leaves and output); a
        SpecError if a Custom fn has no import path."""
        return {"input": _tree_to_dict(self.input), "output": self.output.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, allow_custom: bool = False) -> ModelSpec:
        """The spec ``to_dict`` produced (also after JSON, and any adapters-v1 model spec); a
        SpecError naming what is unknown.

        Reading a spec runs no code: a ``Custom`` leaf names a function by import path, and
        importing it runs its module, so such a leaf is refused unless ``allow_custom=True``
        (for a spec from a source as trusted as the code it names).

        Example:
            >>> ModelSpec.from_dict({"input": {"type": "Custom", "fn": "builtins:abs"}})
            Traceback (most recent call last):
            ...
            rlmesh.errors.SpecError: input: a Custom leaf names code ("builtins:abs") ...
            >>> spec = ModelSpec.from_dict(
            ...     {"input": {"type": "Custom", "fn": "builtins:abs"}}, allow_custom=True
            ... )
            >>> spec.input.fn is abs
            True
        """
        if not isinstance(data, Mapping):
            raise SpecError(f"ModelSpec.from_dict: expected a dict, got {data!r}")
        unknown = sorted(set(data) - {"input", "output"})
        if unknown:
            raise SpecError(
                f'ModelSpec.from_dict: unknown field(s) {unknown}; a spec has "input" and "output"'
            )
        output = data.get("output")
        if output is None:
            action = Action()
        elif isinstance(output, Mapping) and "components" in output:
            action = action_from_v1(output, "output")
        else:
            action = _node_from_dict(output, {"Action": Action})
        return cls(input=_tree_from_dict(data.get("input"), (), allow_custom), output=action)

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``: a spec file's content."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str, *, allow_custom: bool = False) -> ModelSpec:
        """The spec a ``to_json`` text (a spec file) holds; pure data, nothing is run (a
        ``Custom`` leaf only with ``allow_custom=True``, as for ``from_dict``)."""
        return cls.from_dict(json.loads(text), allow_custom=allow_custom)

    def compile(self, observation_space: spaces.Space, action_space: spaces.Space) -> Plan:
        """``compile_spec(self, observation_space, action_space)``."""
        return compile_spec(self, observation_space, action_space)


def _tree_to_dict(tree: InputTree | None) -> Any:
    if isinstance(tree, Mapping):
        return {name: _tree_to_dict(subtree) for name, subtree in tree.items()}
    return None if tree is None else tree.to_dict()


def _tree_from_dict(data: Any, slot: KeyPath, allow_custom: bool) -> Any:
    """An input tree from its dict form: a dict whose "type" is a str is a leaf, else slots."""
    if data is None:
        return None
    if isinstance(data, Mapping) and data.get("type") in V1_LEAF_TYPES:
        from .v1 import leaf_from_v1

        return leaf_from_v1(data, _path_text(slot, "input"))
    if isinstance(data, Mapping) and data.get("type") == "Custom" and not allow_custom:
        raise SpecError(
            f"{_path_text(slot, 'input')}: a Custom leaf names code "
            f"({json.dumps(data.get('fn'))}) and reading it would import that module; a spec "
            f"read from data runs no code: pass allow_custom=True to from_dict / from_json "
            f"only for a spec as trusted as that code"
        )
    if isinstance(data, Mapping) and isinstance(data.get("type"), str):
        return _node_from_dict(data, _LEAF_TYPES)
    if isinstance(data, Mapping):
        return {
            name: _tree_from_dict(subtree, (*slot, name), allow_custom)
            for name, subtree in data.items()
        }
    raise SpecError(
        f"ModelSpec.from_dict: {_path_text(slot, 'input')} must be a leaf dict with a "
        f'"type" or a dict of them, got {data!r}'
    )


def _node_from_dict(data: Mapping[str, Any], types: dict[str, type[_SpecNode]]) -> Any:
    """A leaf or Action from its dict form, refusing an unknown type or field by name."""
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


# ----------------------------------------------------------------------------------------------
# The plan: pure data for the cores


@dataclass(frozen=True)
class LeafPlan:
    """How one slot of the model's payload is assembled from one lane's raw observation.

    An ``"array"`` leaf reads its ``sources``, transposes the single source by ``transpose``
    or flattens and concatenates them (``flatten``), casts to ``dtype``, computes
    ``x * scale + offset``, and stacks the last ``stack`` frames along a new leading axis
    (oldest first). A ``"text"`` leaf passes its source's string through; a ``"custom"`` leaf
    calls ``fn`` on the whole raw observation.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
        >>> plan = ModelSpec(input=Image(layout="chw")).compile(space, gym.spaces.Discrete(2))
        >>> leaf = plan.observation[0]
        >>> leaf.slot, leaf.sources, leaf.transpose, leaf.frame_shape, leaf.leaf
        ((), ((),), (2, 0, 1), (3, 84, 84), 'Image(key=None)')
    """

    slot: KeyPath  # () = the payload is this bare leaf; ("pixels",) = payload["pixels"]
    kind: str  # "array" | "text" | "custom"
    sources: tuple[KeyPath, ...]  # observation paths read, in order; () = the whole observation
    source_shapes: tuple[tuple[int, ...], ...]
    source_dtypes: tuple[str, ...]  # numpy dtype names, as the space declares them
    transpose: tuple[int, ...] | None  # axes applied to the single source, None = none
    flatten: bool  # flatten each source and concatenate
    dtype: str  # output dtype name
    scale: float  # out = cast(x) * scale + offset
    offset: float
    stack: int  # frame-stack depth, 1 = none
    frame_shape: tuple[int, ...]  # one lane's output for one frame (no lane or stack axis)
    fn: Callable[[Any], Any] | None = None  # Custom only
    leaf: str = ""  # the leaf as messages name it, e.g. 'Image(key="pixels")'
    # Role-based leaves ("image", "state"; "text" with a fill), planned by ``resolve``.
    src_layout: str = "hwc"  # image: how the env stores it
    flip: bool = False  # image: rotate 180 degrees (the two sides disagree on upside_down)
    resize: tuple[int, int] | None = None  # image: resized (height, width), before any fit
    fit: str = "stretch"  # image: "crop" / "pad" the resized frame to frame_shape's centre
    resample: str = "bilinear"  # image: "bilinear" | "bilinear_aa"
    lead_dims: int = 0  # image: leading singleton axes (inside frame_shape)
    zero_fill: bool = False  # image: no source; every frame is `fill_value`
    fill_value: float = 0.0
    parts: tuple[StatePartPlan, ...] = ()  # state: concatenated in order
    pad_to: int | None = None  # state: zero-pad to this length
    container: str = "array"  # state: "array" | "list"; text: "str" | "list"
    text_fill: str | None = None  # text: the string when the env has no such role


@dataclass(frozen=True)
class ActionLeafPlan:
    """How the model's action for one leaf of the action space is brought into that space.

    A ``"box"`` leaf maps ``rescale`` linearly onto ``[low, high]`` when set, clips to the
    bounds when ``clip``, then casts to ``dtype``. The other kinds are cast to ``dtype``; their
    valid values are ``start..start+n-1`` (discrete), ``nvec_start..nvec_start+nvec-1``
    (multi_discrete) and 0..1 (multi_binary). Arrays are float64 / int64 and read-only.

    Example:
        >>> import gymnasium as gym
        >>> plan = compile_spec(None, gym.spaces.Discrete(4), gym.spaces.Discrete(3, start=1))
        >>> leaf = plan.action[0]
        >>> leaf.kind, leaf.shape, leaf.dtype, leaf.start, leaf.n
        ('discrete', (), 'int64', 1, 3)
    """

    path: KeyPath  # () for a non-Dict action space; the leaf's path inside a Dict action space
    kind: str  # "box" | "discrete" | "multi_discrete" | "multi_binary"
    shape: tuple[int, ...]
    dtype: str
    low: np.ndarray | None  # Box bounds (float64 arrays of `shape`), else None
    high: np.ndarray | None
    start: int = 0  # Discrete
    n: int = 0  # Discrete
    nvec: np.ndarray | None = None  # MultiDiscrete
    rescale: tuple[float, float] | None = None
    clip: bool = False
    nvec_start: np.ndarray | None = None  # MultiDiscrete: the lowest value of each entry
    # A role-based layout: the model's vector of `model_dim` values is mapped, segment by
    # segment, onto the env's vector (then clipped to `layout_clip`) before the Box cast.
    segments: tuple[ActionSegmentPlan, ...] | None = None
    model_dim: int = 0
    layout_clip: tuple[float, float] | None = None


@dataclass(frozen=True)
class StatePartPlan:
    """One part of a role-based state: a slice of one source, converted; or zeros.

    The source is flattened; ``offset``/``width`` select its slice (a Split field), the
    rotation is re-encoded ``encoding_from -> encoding_to``, then ``index`` keeps one element
    or ``dim`` the leading ones, then ``range_from -> range_to`` maps affinely. A part with
    no source is ``zeros`` zeros (an optional role the env lacks).
    """

    source: KeyPath | None
    source_shape: tuple[int, ...] = ()
    source_dtype: str = "float32"
    offset: int = 0
    width: int = 0
    encoding_from: str | None = None
    encoding_to: str | None = None
    index: int | None = None
    dim: int | None = None
    range_from: tuple[float, float] | None = None
    range_to: tuple[float, float] | None = None
    zeros: int = 0
    name: str = ""  # the source as describe shows it

    @property
    def size(self) -> int:
        """The number of values this part contributes."""
        if self.source is None:
            return self.zeros
        if self.index is not None:
            return 1
        width = self.width
        if self.encoding_to is not None and self.encoding_to != self.encoding_from:
            from .roles import encoding_width

            width = encoding_width(self.encoding_to)
        return width if self.dim is None else self.dim


@dataclass(frozen=True)
class ActionSegmentPlan:
    """One env actuator of a role-based layout: read from ``model[start:stop]``, or a fill.

    Applied in this order: rotation ``encoding_from -> encoding_to``, range map
    ``range_from -> range_to``, the model side's scale, invert, threshold, then the env
    side's, then the binary snap (``>= 0`` -> +1, else -1; a raw 0 stays 0 unless a
    threshold is declared), then the clamp to ``clip``. In float32.
    """

    role: str | None
    start: int = 0
    stop: int = 0
    encoding_from: str | None = None
    encoding_to: str | None = None
    range_from: tuple[float, float] | None = None
    range_to: tuple[float, float] | None = None
    model_scale: float | None = None
    model_invert: bool = False
    model_threshold: float | None = None
    scale: float | None = None
    invert: bool = False
    threshold: float | None = None
    binary: bool = False
    clip: tuple[float, float] | None = None
    fill: float | None = None  # an opaque (or optional, unmatched) actuator: `width` of these
    width: int = 0


@dataclass(frozen=True)
class Plan:
    """A spec compiled against one pair of spaces: every observation leaf and action leaf.

    ``observation_keys`` lists every key path of a Dict observation space (parents before
    their children), so ``advisories`` can name the keys the model never sees.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> plan = compile_spec(None, env.observation_space, env.action_space)
        >>> print(plan.describe())
        input: obs float32[4] -> float32[4]
        action: cast to int64[] in 0..1
    """

    observation: tuple[LeafPlan, ...]
    action: tuple[ActionLeafPlan, ...]
    observation_keys: tuple[KeyPath, ...] = ()
    # A plan from ``resolve``: its adapters-v1 description and advisories.
    description: str | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the plan does, one line per observation leaf, then one per action leaf.

        Example:
            >>> import gymnasium as gym
            >>> import numpy as np
            >>> space = gym.spaces.Dict({"lang": gym.spaces.Text(8), "q": gym.spaces.Discrete(3)})
            >>> spec = ModelSpec(input={"prompt": Text("lang"), "q": State("q", dtype="int64")})
            >>> print(spec.compile(space, gym.spaces.Box(-1, 1, (2,))).describe())
            prompt: obs["lang"] -> str
            q: obs["q"] int64[] -> int64[1] (flatten)
            action: clip to [-1, 1], cast to float32[2]
        """
        if self.description is not None:
            return self.description
        lines = [_describe_observation_leaf(leaf) for leaf in self.observation]
        lines += [_describe_action_leaf(leaf) for leaf in self.action]
        return "\n".join(lines)

    def advisories(self) -> list[str]:
        """What the plan loses: lossy casts, then observation keys no leaf reads.

        Example:
            >>> import gymnasium as gym
            >>> import numpy as np
            >>> space = gym.spaces.Dict({
            ...     "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
            ...     "joints": gym.spaces.Box(-1, 1, (7,), np.float32),
            ... })
            >>> ModelSpec(input=Image("pixels")).compile(space, gym.spaces.Discrete(2)).advisories()
            ['obs["joints"] is never read: no leaf of the spec names it.']
        """
        if self.description is not None:
            return list(self.notes)
        return _lossy_casts(self.observation) + _unread_keys(
            self.observation, self.observation_keys
        )


# ----------------------------------------------------------------------------------------------
# Compiling


def compile_spec(
    spec: ModelSpec | None,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    env_tags: Any = None,
) -> Plan:
    """Check ``spec`` against the spaces and turn it into a ``Plan``; once per route.

    With ``spec=None`` the model gets the raw observation (a Dict observation becomes a dict of
    leaves, each in the space's own dtype) and its action is only cast into the action space.
    A spec that pairs by role is resolved against ``env_tags`` (``rlmesh.adapters.resolve``).

    Raises:
        SpecError: the spec does not fit the spaces; the message names the leaf, the key and
            what the space holds.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("Pendulum-v1")
        >>> plan = compile_spec(None, env.observation_space, env.action_space)
        >>> [(leaf.kind, leaf.dtype, leaf.frame_shape) for leaf in plan.observation]
        [('array', 'float32', (3,))]
        >>> [(leaf.kind, leaf.clip, leaf.rescale) for leaf in plan.action]
        [('box', False, None)]
    """
    if spec is not None and spec.role_based:
        from .resolve import resolve

        return resolve(env_tags, observation_space, action_space, spec)
    if spec is None or spec.input is None:
        observation = _raw_observation_plan(observation_space)
    else:
        observation = tuple(
            _compile_leaf(slot, leaf, observation_space) for slot, leaf in _input_leaves(spec.input)
        )
    return Plan(
        observation=observation,
        action=_action_plan(action_space, CAST_ONLY if spec is None else spec.output),
        observation_keys=_key_paths(observation_space),
    )


def _compile_leaf(slot: KeyPath, leaf: Leaf, observation_space: spaces.Space) -> LeafPlan:
    """One leaf's plan; messages name the leaf and, inside a dict payload, its slot."""
    where = leaf.label if not slot else f"{leaf.label} at {_path_text(slot, 'input')}"
    if isinstance(leaf, Image):
        return _compile_image(slot, leaf, observation_space, where)
    if isinstance(leaf, State):
        return _compile_flat(slot, leaf, (leaf.key,), leaf.stack, observation_space, where)
    if isinstance(leaf, Concat):
        return _compile_flat(slot, leaf, leaf.keys, 1, observation_space, where)
    if isinstance(leaf, Text):
        return _compile_text(slot, leaf, observation_space, where)
    return _custom_leaf(slot, leaf, observation_space)


def _compile_image(
    slot: KeyPath, image: Image, observation_space: spaces.Space, where: str
) -> LeafPlan:
    path = image.key
    space = _lookup(observation_space, path, where)
    if not isinstance(space, spaces.Box):
        raise _wrong_space(where, path, space, "a Box image")
    if len(space.shape) != 3:
        raise SpecError(
            f"{where}: {_path_text(path)} holds {_space_text(space)} of rank {len(space.shape)}; "
            f"an image needs rank 3 (height, width, channels)"
        )
    if image.normalize and space.dtype != np.uint8:
        raise SpecError(
            f"{where}: normalize maps uint8 [0, 255] into a range, but {_path_text(path)} holds "
            f"{_space_text(space)}; drop normalize or read a uint8 image"
        )
    lo, hi = image.normalize or (0.0, 255.0)  # no normalization: x * 1.0 + 0.0
    return _array_leaf(
        slot,
        image.label,
        (path,),
        (space,),
        dtype=image.dtype,
        transpose=CHW_AXES if image.layout == "chw" else None,
        scale=(hi - lo) / 255.0,
        offset=lo,
        stack=image.stack,
    )


def _compile_flat(
    slot: KeyPath,
    leaf: State | Concat,
    paths: tuple[KeyPath, ...],
    stack: int,
    observation_space: spaces.Space,
    where: str,
) -> LeafPlan:
    """A State or Concat: numeric leaves, flattened and concatenated in order."""
    source_spaces = []
    for path in paths:
        space = _lookup(observation_space, path, where)
        if not isinstance(space, NUMERIC_SPACES):
            raise _wrong_space(
                where, path, space, "a numeric leaf (Box, Discrete, MultiDiscrete, MultiBinary)"
            )
        source_spaces.append(space)
    return _array_leaf(
        slot, leaf.label, paths, tuple(source_spaces), dtype=leaf.dtype, flatten=True, stack=stack
    )


def _compile_text(
    slot: KeyPath, text: Text, observation_space: spaces.Space, where: str
) -> LeafPlan:
    space = _lookup(observation_space, text.key, where)
    if not is_text_space(space):
        raise _wrong_space(where, text.key, space, "a Text space (or one whose values are str)")
    return _text_leaf(slot, text.label, text.key)


def _lookup(observation_space: spaces.Space, path: KeyPath, where: str) -> spaces.Space:
    """The subspace at ``path``, or a SpecError saying which key is missing and what is there."""
    space = observation_space
    for depth, key in enumerate(path):
        if not isinstance(space, spaces.Dict) or key not in space.spaces:
            raise SpecError(
                f"{where}: {_path_text(path[:depth])} has no key {json.dumps(key)}; it holds "
                f"{_space_text(space)}"
            )
        space = space.spaces[key]
    return space


def _wrong_space(where: str, path: KeyPath, space: spaces.Space, wanted: str) -> SpecError:
    """The error for a key that leads to the wrong kind of space, with how to reach a leaf."""
    hint = ""
    if isinstance(space, spaces.Dict) and space.spaces:
        example = _key_text((*path, next(iter(space.spaces))))
        hint = f"; name a leaf inside it with a tuple path, e.g. key={example}"
    elif isinstance(space, spaces.Tuple):
        hint = "; read it with Custom(fn)"
    return SpecError(f"{where}: {_path_text(path)} holds {_space_text(space)}, not {wanted}{hint}")


def _signature(space: spaces.Space) -> tuple[tuple[int, ...], str]:
    """The shape and dtype name of one observation of ``space`` ("str" text, "object" others)."""
    if isinstance(space, NUMERIC_SPACES):
        return tuple(space.shape), np.dtype(space.dtype).name
    if is_text_space(space):
        return (), "str"
    return (), "object"


def _array_leaf(
    slot: KeyPath,
    label: str,
    paths: tuple[KeyPath, ...],
    source_spaces: tuple[spaces.Space, ...],
    *,
    dtype: str,
    transpose: tuple[int, ...] | None = None,
    flatten: bool = False,
    scale: float = 1.0,
    offset: float = 0.0,
    stack: int = 1,
) -> LeafPlan:
    shapes, dtypes = zip(*(_signature(space) for space in source_spaces), strict=True)
    if flatten:
        frame_shape: tuple[int, ...] = (sum(math.prod(shape) for shape in shapes),)
    elif transpose is not None:
        frame_shape = tuple(shapes[0][axis] for axis in transpose)
    else:
        frame_shape = shapes[0]
    return LeafPlan(
        slot=slot,
        kind="array",
        sources=paths,
        source_shapes=shapes,
        source_dtypes=dtypes,
        transpose=transpose,
        flatten=flatten,
        dtype=dtype,
        scale=scale,
        offset=offset,
        stack=stack,
        frame_shape=frame_shape,
        leaf=label,
    )


def _text_leaf(slot: KeyPath, label: str, path: KeyPath) -> LeafPlan:
    return LeafPlan(
        slot=slot,
        kind="text",
        sources=(path,),
        source_shapes=((),),
        source_dtypes=("str",),
        transpose=None,
        flatten=False,
        dtype="str",
        scale=1.0,
        offset=0.0,
        stack=1,
        frame_shape=(),
        leaf=label,
    )


def _custom_leaf(slot: KeyPath, custom: Custom, observation_space: spaces.Space) -> LeafPlan:
    """A Custom leaf reads the whole observation; what it returns is the model's business."""
    shape, dtype = _signature(observation_space)
    return LeafPlan(
        slot=slot,
        kind="custom",
        sources=((),),
        source_shapes=(shape,),
        source_dtypes=(dtype,),
        transpose=None,
        flatten=False,
        dtype="object",
        scale=1.0,
        offset=0.0,
        stack=1,
        frame_shape=(),
        fn=custom.fn,
        leaf=custom.label,
    )


def _raw_observation_plan(space: spaces.Space, path: KeyPath = ()) -> tuple[LeafPlan, ...]:
    """The raw observation as leaves: each numeric or text leaf as is, in the payload's place."""
    if isinstance(space, spaces.Dict):
        return tuple(
            leaf
            for key, subspace in space.spaces.items()
            for leaf in _raw_observation_plan(subspace, (*path, key))
        )
    label = f"raw {_path_text(path)}"
    if isinstance(space, NUMERIC_SPACES):
        return (_array_leaf(path, label, (path,), (space,), dtype=np.dtype(space.dtype).name),)
    if is_text_space(space):
        return (_text_leaf(path, label, path),)
    raise SpecError(
        f"{_path_text(path)} holds {_space_text(space)}, which a model without a spec cannot "
        f"receive; declare spec = ModelSpec(input=Custom(fn)) to read it"
    )


def _key_paths(space: spaces.Space, path: KeyPath = ()) -> tuple[KeyPath, ...]:
    """Every key path of a Dict space, parents before their children; () for other spaces."""
    if not isinstance(space, spaces.Dict):
        return ()
    return tuple(
        key_path
        for key, subspace in space.spaces.items()
        for key_path in ((*path, key), *_key_paths(subspace, (*path, key)))
    )


# ----------------------------------------------------------------------------------------------
# The action plan


def _action_plan(action_space: spaces.Space, output: Action) -> tuple[ActionLeafPlan, ...]:
    """One leaf per leaf of the action space (Dicts are walked), each under ``output``."""
    leaves = tuple(
        _action_leaf(path, space, output) for path, space in _action_leaves(action_space)
    )
    if output.rescale is not None and not any(leaf.kind == "box" for leaf in leaves):
        raise SpecError(
            f"{output.label} maps onto the bounds of a Box action space, but the action space "
            f"holds no Box: it is {_space_text(action_space)}"
        )
    return leaves


def _action_leaves(
    space: spaces.Space, path: KeyPath = ()
) -> Iterator[tuple[KeyPath, spaces.Space]]:
    if isinstance(space, spaces.Dict):
        for key, subspace in space.spaces.items():
            yield from _action_leaves(subspace, (*path, key))
    else:
        yield path, space


def _action_leaf(path: KeyPath, space: spaces.Space, output: Action) -> ActionLeafPlan:
    if isinstance(space, spaces.Box):
        return _box_action_leaf(path, space, output)
    if not isinstance(space, NUMERIC_SPACES):
        raise SpecError(
            f"{_path_text(path, 'action')} is {_space_text(space)}; rlmesh applies actions to "
            f"Box, Discrete, MultiDiscrete and MultiBinary spaces and Dicts of them"
        )
    shape, dtype = _signature(space)
    if isinstance(space, spaces.Discrete):
        return ActionLeafPlan(
            path, "discrete", shape, dtype, None, None, start=int(space.start), n=int(space.n)
        )
    if isinstance(space, spaces.MultiDiscrete):
        return ActionLeafPlan(
            path,
            "multi_discrete",
            shape,
            dtype,
            None,
            None,
            nvec=_read_only(space.nvec, np.int64),
            nvec_start=_read_only(space.start, np.int64),
        )
    return ActionLeafPlan(path, "multi_binary", shape, dtype, None, None)


def _box_action_leaf(path: KeyPath, space: spaces.Box, output: Action) -> ActionLeafPlan:
    bounded = bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
    if output.rescale is not None and not bounded:
        raise SpecError(
            f"{output.label} maps onto the bounds of {_path_text(path, 'action')}, but it is "
            f"{_space_text(space)} with infinite bounds; give the space finite bounds or drop "
            f"rescale"
        )
    shape, dtype = _signature(space)
    return ActionLeafPlan(
        path=path,
        kind="box",
        shape=shape,
        dtype=dtype,
        low=_read_only(space.low, np.float64),
        high=_read_only(space.high, np.float64),
        rescale=output.rescale,
        clip=output.clip,
    )


def _read_only(values: Any, dtype: type) -> np.ndarray:
    """A private, read-only copy, so a frozen plan cannot change under the cores."""
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


# ----------------------------------------------------------------------------------------------
# Describing and advising


def _describe_observation_leaf(leaf: LeafPlan) -> str:
    slot = ".".join(leaf.slot) or "input"
    if leaf.kind == "custom":
        return f"{slot}: {leaf.leaf} on the whole observation"
    if leaf.kind == "text":
        return f"{slot}: {_path_text(leaf.sources[0])} -> str"
    sources = " + ".join(
        f"{_path_text(path)} {_array_text(dtype, shape)}"
        for path, shape, dtype in zip(
            leaf.sources, leaf.source_shapes, leaf.source_dtypes, strict=True
        )
    )
    notes = []
    if leaf.transpose is not None:
        notes.append("chw")  # the only transpose a spec can ask for
    if leaf.flatten:
        notes.append("flatten")
    if (leaf.scale, leaf.offset) != (1.0, 0.0):
        notes.append(f"x/255 -> [{leaf.offset:g}, {leaf.offset + 255.0 * leaf.scale:g}]")
    if leaf.stack > 1:
        notes.append(f"stack {leaf.stack}")
    output = _array_text(leaf.dtype, leaf.frame_shape)
    return f"{slot}: {sources} -> {output}" + (f" ({', '.join(notes)})" if notes else "")


def _describe_action_leaf(leaf: ActionLeafPlan) -> str:
    steps = []
    if leaf.kind == "box":
        bounds = _bounds_text(leaf.low, leaf.high)
        if leaf.rescale is not None:
            steps.append(f"rescale [{leaf.rescale[0]:g}, {leaf.rescale[1]:g}] onto {bounds}")
        if leaf.clip:
            steps.append(f"clip to {bounds}")
    cast = f"cast to {_array_text(leaf.dtype, leaf.shape)}"
    if leaf.kind == "discrete":
        cast += f" in {leaf.start}..{leaf.start + leaf.n - 1}"
    elif leaf.kind == "multi_discrete":
        lowest = leaf.nvec_start.tolist()
        cast += f" in {lowest}..{(leaf.nvec_start + leaf.nvec - 1).tolist()}"
    elif leaf.kind == "multi_binary":
        cast += " in 0..1"
    steps.append(cast)
    return f"{_path_text(leaf.path, 'action')}: {', '.join(steps)}"


def _bounds_text(low: np.ndarray, high: np.ndarray) -> str:
    """``[-2, 2]`` when every element shares its bounds, else per element."""
    if low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0]):
        return f"[{low.flat[0]:g}, {high.flat[0]:g}]"
    return "the per-element bounds"


def _lossy_casts(observation: tuple[LeafPlan, ...]) -> list[str]:
    """A sentence per source that the leaf's cast cannot hold exactly (numpy's "safe" rule)."""
    return [
        f"{leaf.leaf} casts {_path_text(path)} from {dtype} to {leaf.dtype}, which can lose "
        f"precision."
        for leaf in observation
        if leaf.kind == "array"
        for path, dtype in zip(leaf.sources, leaf.source_dtypes, strict=True)
        if not np.can_cast(dtype, leaf.dtype, casting="safe")
    ]


def _unread_keys(observation: tuple[LeafPlan, ...], keys: tuple[KeyPath, ...]) -> list[str]:
    """A sentence per observation key no leaf reads (the outermost one of an unread subtree)."""
    if any(leaf.kind == "custom" for leaf in observation):
        return []  # a Custom leaf sees the whole observation
    sources = [path for leaf in observation for path in leaf.sources]
    unread: list[KeyPath] = []
    for key in keys:
        inside_unread = any(key[: len(outer)] == outer for outer in unread)
        read = any(_related(key, source) for source in sources)
        if not (inside_unread or read):
            unread.append(key)
    return [f"{_path_text(key)} is never read: no leaf of the spec names it." for key in unread]


def _related(key: KeyPath, source: KeyPath) -> bool:
    """Whether reading ``source`` reads some of ``key``: one path is a prefix of the other."""
    shorter = min(len(key), len(source))
    return key[:shorter] == source[:shorter]
