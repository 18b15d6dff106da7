"""The key-based compiler: a spec whose leaves name observation keys, checked and planned.

``compile_keys`` checks each leaf against the observation space (the key exists and leads to
the kind of space the leaf reads) and plans it: read, transpose or flatten, cast, scale,
stack. Without an input tree the model gets the raw observation, each numeric or text leaf as
is. The action plan (``action_plan``) walks the action space and rescales, clips and casts
each leaf as the output says. Every error names the leaf, the key
and what the space holds.

``compile_spec`` (``rlmesh.adapters.model_spec``) sends a spec here, or to the role resolver
when it pairs by role; the resolver compiles a key-based leaf inside a role-based spec with
``compile_leaf``.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh.adapters import CAST_ONLY, State
    >>> space = gym.spaces.Dict({"q": gym.spaces.Box(-1, 1, (2,), np.float64)})
    >>> plan = compile_keys({"q": State("q")}, CAST_ONLY, space, gym.spaces.Discrete(3))
    >>> print(plan.describe())
    q: obs["q"] float64[2] -> float32[2] (flatten)
    action: cast to int64[] in 0..2
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .action import Action
from .custom import Custom
from .image import CHW_AXES, Image
from .inputs import InputTree, Leaf, input_leaves
from .keys import (
    NUMERIC_SPACES,
    KeyPath,
    is_text_space,
    key_paths,
    key_text,
    path_text,
    signature,
    space_text,
)
from .plan import ActionLeafPlan, LeafPlan, Plan, read_only
from .state import Concat, State
from .text import Text


def compile_keys(
    input_tree: InputTree | None,
    output: Action,
    observation_space: spaces.Space,
    action_space: spaces.Space,
) -> Plan:
    """The Plan of a key-based input tree (None: the raw observation) and output."""
    if input_tree is None:
        observation = _raw_observation_plan(observation_space)
    else:
        observation = tuple(
            compile_leaf(slot, leaf, observation_space) for slot, leaf in input_leaves(input_tree)
        )
    return Plan(
        observation=observation,
        action=action_plan(action_space, output),
        observation_keys=key_paths(observation_space),
    )


def compile_leaf(slot: KeyPath, leaf: Leaf, observation_space: spaces.Space) -> LeafPlan:
    """One leaf's plan; messages name the leaf and, inside a dict payload, its slot."""
    where = leaf.label if not slot else f"{leaf.label} at {path_text(slot, 'input')}"
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
            f"{where}: {path_text(path)} holds {space_text(space)} of rank {len(space.shape)}; "
            f"an image needs rank 3 (height, width, channels)"
        )
    if image.normalize and space.dtype != np.uint8:
        raise SpecError(
            f"{where}: normalize maps uint8 [0, 255] into a range, but {path_text(path)} holds "
            f"{space_text(space)}; drop normalize or read a uint8 image"
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
                f"{where}: {path_text(path[:depth])} has no key {json.dumps(key)}; it holds "
                f"{space_text(space)}"
            )
        space = space.spaces[key]
    return space


def _wrong_space(where: str, path: KeyPath, space: spaces.Space, wanted: str) -> SpecError:
    """The error for a key that leads to the wrong kind of space, with how to reach a leaf."""
    hint = ""
    if isinstance(space, spaces.Dict) and space.spaces:
        example = key_text((*path, next(iter(space.spaces))))
        hint = f"; name a leaf inside it with a tuple path, e.g. key={example}"
    elif isinstance(space, spaces.Tuple):
        hint = "; read it with Custom(fn)"
    return SpecError(f"{where}: {path_text(path)} holds {space_text(space)}, not {wanted}{hint}")


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
    shapes, dtypes = zip(*(signature(space) for space in source_spaces), strict=True)
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
    shape, dtype = signature(observation_space)
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
    label = f"raw {path_text(path)}"
    if isinstance(space, NUMERIC_SPACES):
        return (_array_leaf(path, label, (path,), (space,), dtype=np.dtype(space.dtype).name),)
    if is_text_space(space):
        return (_text_leaf(path, label, path),)
    raise SpecError(
        f"{path_text(path)} holds {space_text(space)}, which a model without a spec cannot "
        f"receive; declare spec = ModelSpec(input=Custom(fn)) to read it"
    )


# ----------------------------------------------------------------------------------------------
# The action plan


def action_plan(action_space: spaces.Space, output: Action) -> tuple[ActionLeafPlan, ...]:
    """One leaf per leaf of the action space (Dicts are walked), each under ``output``."""
    leaves = tuple(
        _action_leaf(path, space, output) for path, space in _action_leaves(action_space)
    )
    if output.rescale is not None and not any(leaf.kind == "box" for leaf in leaves):
        raise SpecError(
            f"{output.label} maps onto the bounds of a Box action space, but the action space "
            f"holds no Box: it is {space_text(action_space)}"
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
            f"{path_text(path, 'action')} is {space_text(space)}; rlmesh applies actions to "
            f"Box, Discrete, MultiDiscrete and MultiBinary spaces and Dicts of them"
        )
    shape, dtype = signature(space)
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
            nvec=read_only(space.nvec, np.int64),
            nvec_start=read_only(space.start, np.int64),
        )
    return ActionLeafPlan(path, "multi_binary", shape, dtype, None, None)


def _box_action_leaf(path: KeyPath, space: spaces.Box, output: Action) -> ActionLeafPlan:
    bounded = bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
    if output.rescale is not None and not bounded:
        raise SpecError(
            f"{output.label} maps onto the bounds of {path_text(path, 'action')}, but it is "
            f"{space_text(space)} with infinite bounds; give the space finite bounds or drop "
            f"rescale"
        )
    shape, dtype = signature(space)
    return ActionLeafPlan(
        path=path,
        kind="box",
        shape=shape,
        dtype=dtype,
        low=read_only(space.low, np.float64),
        high=read_only(space.high, np.float64),
        rescale=output.rescale,
        clip=output.clip,
    )
