"""Pairing an env's tags with a role-based model spec: ``resolve`` -> ``Plan``.

Resolve reads widths, dtypes and layouts from the spaces, the roles and the facts a space
cannot carry from the tags, and plans every conversion the model's declared conventions need,
or fails with a ``SpecError`` naming the model input (or action role), what the env offers and
what was expected. Nothing is converted here: the ``Plan`` is data the core executes per lane.

The description (``Plan.describe()``) and the error wording follow the adapters-v1
conformance vectors.

This module is the public entry; the resolver's steps have their own modules: the env's roles
(``resolve_features``), the input leaves (``resolve_inputs``), the action layout
(``resolve_action``) and the plan they make (``resolve_roles``). The entry is apart from
``resolve_roles`` because it checks its argument is a ``ModelSpec``, whose ``compile`` uses
the resolver: ``model_spec`` sits between the two, so no import goes in a circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

from ..errors import SpecError
from .model_spec import ModelSpec
from .plan import Plan
from .resolve_roles import resolve_roles
from .tags import EnvTags


def resolve(
    env_tags: EnvTags | Mapping[str, Any] | None,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    model_spec: ModelSpec,
) -> Plan:
    """Pair ``env_tags`` with ``model_spec`` by role against the spaces and plan the conversions.

    Args:
        env_tags: the env's ``EnvTags`` (or their v1 dict); None when the env has none.
        observation_space, action_space: the env's spaces.
        model_spec: a ``ModelSpec`` whose leaves (or output) pair by role; keyed leaves in it
            are compiled as ``compile_spec`` would.

    Returns:
        A ``Plan``: ``describe()`` prints the v1 description, ``advisories()`` what it
        fabricates (zero-filled parts).

    Raises:
        SpecError: a role no env key provides (and no ``optional`` / ``fill``), a width,
            encoding, size or action layout that cannot be bridged.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh import adapters
        >>> tags = adapters.EnvTags(
        ...     observation={"cam": adapters.ImageTag(adapters.IMAGE_PRIMARY, upside_down=True)},
        ...     action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
        ... )
        >>> spec = adapters.ModelSpec(
        ...     input={"image": adapters.Image(adapters.IMAGE_PRIMARY, size=4, layout="chw")},
        ...     output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
        ... )
        >>> space = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})
        >>> print(resolve(tags, space, gym.spaces.Box(-1, 1, (1,), np.float32), spec).describe())
        observation:
          "image" <- image "cam" (flip 180, resize 4x4 (bilinear), uint8, hwc->chw)
        action:
          "action/gripper" <- model[0:1]
    """
    if isinstance(env_tags, Mapping):
        env_tags = EnvTags.from_dict(env_tags)
    if not isinstance(model_spec, ModelSpec):
        raise SpecError(f"resolve: model_spec must be a ModelSpec, got {model_spec!r}")
    return resolve_roles(
        env_tags, observation_space, action_space, model_spec.input, model_spec.output
    )
