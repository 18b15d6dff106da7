"""What a model consumes and emits: ``ModelSpec``, and ``compile_spec``, which plans it.

A model may declare ``spec = ModelSpec(input=..., output=...)``. The input is one leaf, or a
dict of leaves (each key a slot of the payload the model receives); each leaf names the
observation key it reads. The output says how the model's action is mapped into the action
space. A spec is pure data: it round-trips through ``to_dict()`` / ``from_dict()`` and JSON,
and reading one runs no code (a ``Custom`` leaf, which names a function to import, is read
only when allowed).

Once per route, ``compile_spec`` checks the spec against the environment's observation and
action spaces and turns it into a ``Plan``: pure data from which the cores assemble each lane's
input and apply each action. A model without a spec gets the raw observation, and its action is
only cast into the action space. A spec whose leaves (or output) pair by role goes to the role
resolver (``rlmesh.adapters.resolve_roles``), any other to the key-based compiler
(``rlmesh.adapters.keyed``).

The leaves live in their own modules (``image``, ``state``, ``text``, ``custom``), the output
in ``action``, the input tree in ``inputs``, and the plan in ``plan``.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh.adapters import Action, Image, State
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

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gymnasium import spaces

from ..errors import SpecError
from .action import CAST_ONLY, Action
from .inputs import InputTree, input_leaves, tree_from_dict, tree_to_dict
from .keyed import compile_keys
from .node import node_from_dict
from .plan import Plan
from .resolve_roles import resolve_roles
from .v1 import action_from_v1


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
        >>> from rlmesh.adapters import Image, State
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
            for _ in input_leaves(self.input):
                pass  # walking the tree is the check
        if not isinstance(self.output, Action):
            raise SpecError(f"ModelSpec: output must be an Action(...), got {self.output!r}")

    @property
    def role_based(self) -> bool:
        """Whether any input leaf or the output pairs by role (resolve needs env tags)."""
        leaves = () if self.input is None else (leaf for _, leaf in input_leaves(self.input))
        return self.output.role_based or any(leaf.role_based for leaf in leaves)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (adapters-v1 for role-based leaves and output); a
        SpecError if a Custom fn has no import path."""
        return {"input": tree_to_dict(self.input), "output": self.output.to_dict()}

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
            action = node_from_dict(output, {"Action": Action})
        return cls(input=tree_from_dict(data.get("input"), (), allow_custom), output=action)

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
        return resolve_roles(env_tags, observation_space, action_space, spec.input, spec.output)
    if spec is None:
        return compile_keys(None, CAST_ONLY, observation_space, action_space)
    return compile_keys(spec.input, spec.output, observation_space, action_space)
