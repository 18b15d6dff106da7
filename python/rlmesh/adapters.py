"""What a model consumes and emits: ``ModelSpec``, its leaves, and the ``Plan`` compiled from them.

A model may declare ``spec = ModelSpec(input=..., output=...)``. The input is one leaf, or a
dict of leaves (each key a slot of the payload the model receives); each leaf names the
observation key it reads. The output says how the model's action is mapped into the action
space. A spec is pure data: it round-trips through ``to_dict()`` / ``from_dict()`` and JSON.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np
from gymnasium import spaces

from .errors import SpecError

KeyPath = tuple[str, ...]
"""A key normalized: ``()`` is the whole observation, ``("a", "b")`` is ``obs["a"]["b"]``."""

Key = str | KeyPath | None
"""A key as written in a leaf: None (the whole observation), a top-level key, or a path."""

MAX_STACK = 64
IMAGE_LAYOUTS = ("hwc", "chw")
IMAGE_DTYPES = ("uint8", "float32")
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
    """A frozen dataclass of the spec that round-trips through a plain dict with a "type"."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready data, with ``"type"`` naming the class."""
        data = {field.name: _to_json(getattr(self, field.name)) for field in fields(self)}
        return {"type": type(self).__name__, **data}

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> _SpecNode:
        """The node built from its fields (already converted back from JSON)."""
        return cls(**values)


@dataclass(frozen=True)
class Image(_SpecNode):
    """An image read from the observation (height, width, channels) and shaped for the model.

    Args:
        key: the observation key (None = the whole observation, a tuple = a nested path).
        layout: the layout the *model* wants: ``"hwc"`` as the env emits it, or ``"chw"``.
        dtype: ``"uint8"`` or ``"float32"``.
        normalize: False, True (map uint8 [0, 255] onto [0, 1]) or a range ``(lo, hi)``; needs
            ``dtype="float32"`` and a uint8 image. Stored as False or ``(lo, hi)``.
        stack: frames stacked along a new leading axis, oldest first (1 = none, at most 64):
            ``[stack, C, H, W]`` per lane for ``"chw"``, ``[stack, H, W, C]`` for ``"hwc"``.
            The first frame of an episode fills the whole window, as Gymnasium's
            ``FrameStackObservation(padding_type="reset")`` does; windows are kept per episode
            and never span two.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> image = Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4)
        >>> image.key, image.normalize
        (('pixels',), (0.0, 1.0))
        >>> space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (64, 48, 3), np.uint8)})
        >>> leaf = ModelSpec(input=image).compile(space, gym.spaces.Discrete(2)).observation[0]
        >>> leaf.frame_shape, leaf.stack, leaf.scale == 1 / 255
        ((3, 64, 48), 4, True)
    """

    key: Key = None
    layout: str = "hwc"
    dtype: str = "uint8"
    normalize: bool | tuple[float, float] = False
    stack: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _key_path(self.key, "Image"))
        _check_choice(self.label, "layout", self.layout, IMAGE_LAYOUTS)
        _check_choice(self.label, "dtype", self.dtype, IMAGE_DTYPES)
        object.__setattr__(self, "normalize", self._normalize_range())
        _check_stack(self.label, self.stack)

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
    def label(self) -> str:
        """The leaf as messages name it: ``Image(key="pixels")``."""
        return f"Image(key={_key_text(self.key)})"


@dataclass(frozen=True)
class State(_SpecNode):
    """A numeric observation leaf, flattened to one vector and cast.

    Box, Discrete (one int64 element), MultiDiscrete and MultiBinary leaves are numeric.

    Args:
        key: the observation key (None = the whole observation, a tuple = a nested path).
        dtype: ``"float32"``, ``"float64"`` or ``"int64"``.
        stack: frames stacked along a new leading axis, oldest first (1 = none, at most 64):
            ``[stack, size]`` per lane. The first frame of an episode fills the whole window, as
            Gymnasium's ``FrameStackObservation(padding_type="reset")`` does; windows are kept
            per episode and never span two.

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
    """

    key: Key = None
    dtype: str = "float32"
    stack: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _key_path(self.key, "State"))
        _check_choice(self.label, "dtype", self.dtype, FLAT_DTYPES)
        _check_stack(self.label, self.stack)

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``State(key="joints")``."""
        return f"State(key={_key_text(self.key)})"


@dataclass(frozen=True, init=False)
class Concat(_SpecNode):
    """Several numeric observation leaves, each flattened, concatenated in order into one vector.

    Args:
        *keys: the observation keys, at least one (a tuple = a nested path).
        dtype: ``"float32"``, ``"float64"`` or ``"int64"``.

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
    """

    keys: tuple[KeyPath, ...]
    dtype: str = "float32"

    def __init__(self, *keys: Key, dtype: str = "float32") -> None:
        object.__setattr__(self, "keys", tuple(_key_path(key, "Concat") for key in keys))
        object.__setattr__(self, "dtype", dtype)
        if not self.keys:
            raise SpecError('Concat() needs at least one key, e.g. Concat("joints", "gripper")')
        _check_choice(self.label, "dtype", self.dtype, FLAT_DTYPES)

    @classmethod
    def _from_fields(cls, values: dict[str, Any]) -> Concat:
        keys = values.pop("keys")
        return cls(*keys, **values)

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Concat("joints", "gripper")``."""
        return f"Concat({', '.join(_key_text(key) for key in self.keys)})"


@dataclass(frozen=True)
class Text(_SpecNode):
    """A string from a text observation space, passed through (batched: a list of N strings).

    A text space is a ``gymnasium.spaces.Text`` or any other space whose values are strings,
    such as MiniGrid's ``MissionSpace`` (see ``is_text_space``).

    Example:
        >>> import gymnasium as gym
        >>> space = gym.spaces.Dict({"instruction": gym.spaces.Text(64)})
        >>> spec = ModelSpec(input={"prompt": Text("instruction")})
        >>> spec.compile(space, gym.spaces.Discrete(2)).observation[0].kind
        'text'
    """

    key: Key = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _key_path(self.key, "Text"))

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Text(key="instruction")``."""
        return f"Text(key={_key_text(self.key)})"


@dataclass(frozen=True)
class Custom(_SpecNode):
    """The escape hatch: ``fn(raw_obs) -> value``, called on one lane's full raw observation.

    The only leaf that runs user code. To save the spec (``to_dict``), ``fn`` must be importable
    by its name: a function defined with ``def`` at the top level of a module, stored as
    ``"module:qualname"``.

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


@dataclass(frozen=True)
class Action(_SpecNode):
    """How the model's action is mapped into the action space: rescale, then clip, then cast.

    Args:
        rescale: None, or the model's range ``(lo, hi)``, mapped linearly onto the bounds of each
            Box in the action space (which must be finite).
        clip: clip Box actions to their bounds.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> box = gym.spaces.Box(-2, 2, (1,), np.float32)
        >>> spec = ModelSpec(output=Action(rescale=(-1, 1)))
        >>> leaf = spec.compile(gym.spaces.Box(-1, 1, (3,)), box).action[0]
        >>> leaf.rescale, leaf.clip, leaf.high
        ((-1.0, 1.0), True, array([2.]))
    """

    rescale: tuple[float, float] | None = None
    clip: bool = True

    def __post_init__(self) -> None:
        if self.rescale is not None:
            object.__setattr__(self, "rescale", _value_range("Action", "rescale", self.rescale))
        if not isinstance(self.clip, bool):
            raise SpecError(f"Action: clip must be True or False, got {self.clip!r}")

    @property
    def label(self) -> str:
        """The output as messages name it: ``Action(rescale=(-1, 1))``."""
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

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data; a SpecError if a Custom fn has no import path."""
        return {"input": _tree_to_dict(self.input), "output": self.output.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """The spec ``to_dict`` produced (also after JSON); a SpecError naming what is unknown."""
        if not isinstance(data, Mapping):
            raise SpecError(f"ModelSpec.from_dict: expected a dict, got {data!r}")
        unknown = sorted(set(data) - {"input", "output"})
        if unknown:
            raise SpecError(
                f'ModelSpec.from_dict: unknown field(s) {unknown}; a spec has "input" and "output"'
            )
        output = data.get("output")
        return cls(
            input=_tree_from_dict(data.get("input"), ()),
            output=Action() if output is None else _node_from_dict(output, {"Action": Action}),
        )

    def compile(self, observation_space: spaces.Space, action_space: spaces.Space) -> Plan:
        """``compile_spec(self, observation_space, action_space)``."""
        return compile_spec(self, observation_space, action_space)


def _tree_to_dict(tree: InputTree | None) -> Any:
    if isinstance(tree, Mapping):
        return {name: _tree_to_dict(subtree) for name, subtree in tree.items()}
    return None if tree is None else tree.to_dict()


def _tree_from_dict(data: Any, slot: KeyPath) -> Any:
    """An input tree from its dict form: a dict whose "type" is a str is a leaf, else slots."""
    if data is None:
        return None
    if isinstance(data, Mapping) and isinstance(data.get("type"), str):
        return _node_from_dict(data, _LEAF_TYPES)
    if isinstance(data, Mapping):
        return {name: _tree_from_dict(subtree, (*slot, name)) for name, subtree in data.items()}
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
    known = fields(node_type)
    unknown = sorted(set(data) - {"type"} - {node_field.name for node_field in known})
    if unknown:
        raise SpecError(f"ModelSpec.from_dict: {type_name} has no field(s) {unknown}")
    missing = [
        node_field.name
        for node_field in known
        if node_field.default is MISSING and node_field.name not in data
    ]
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
        return _lossy_casts(self.observation) + _unread_keys(
            self.observation, self.observation_keys
        )


# ----------------------------------------------------------------------------------------------
# Compiling


def compile_spec(
    spec: ModelSpec | None, observation_space: spaces.Space, action_space: spaces.Space
) -> Plan:
    """Check ``spec`` against the spaces and turn it into a ``Plan``; once per route.

    With ``spec=None`` the model gets the raw observation (a Dict observation becomes a dict of
    leaves, each in the space's own dtype) and its action is only cast into the action space.

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
