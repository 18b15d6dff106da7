"""The role resolver's Plan: a spec's input tree and output paired with an env's tags.

``resolve_roles`` joins the tags with the observation space (``resolve_features``), resolves
each input leaf (``resolve_inputs``) and the action (``resolve_action``), and assembles the
``Plan`` with its adapters-v1 description and advisories. ``compile_spec`` calls it for a
spec that pairs by role, and ``resolve`` (the public entry) after checking its arguments.
The description and the error wording follow the adapters-v1 conformance vectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

from ..errors import SpecError
from .action import Action
from .inputs import InputTree, input_leaves
from .keys import key_paths, quoted
from .plan import LeafPlan, Plan
from .resolve_action import resolve_action
from .resolve_features import env_features
from .resolve_inputs import resolve_leaf
from .state import Concat
from .tags import EnvTags


def resolve_roles(
    env_tags: EnvTags | Mapping[str, Any] | None,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    input_tree: InputTree | None,
    output: Action,
) -> Plan:
    """The Plan pairing ``input_tree`` and ``output`` with ``env_tags`` (EnvTags, their v1
    dict, or None) against the spaces; a SpecError for what cannot be paired or bridged.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh import adapters
        >>> tags = adapters.EnvTags(observation={"lang": adapters.TextTag(adapters.INSTRUCTION)})
        >>> space = gym.spaces.Dict({"lang": gym.spaces.Text(32)})
        >>> inputs = {"prompt": adapters.Text(adapters.INSTRUCTION)}
        >>> plan = resolve_roles(tags, space, gym.spaces.Discrete(2), inputs, adapters.CAST_ONLY)
        >>> print(plan.describe())
        observation:
          "prompt" <- text "lang"
        action:
          action: cast to int64[] in 0..1
    """
    if isinstance(env_tags, Mapping):
        env_tags = EnvTags.from_dict(env_tags)
    features = env_features(env_tags, observation_space)
    if env_tags is None:
        _refuse_untagged(input_tree, output)
    observation: list[LeafPlan] = []
    lines = ["observation:"]
    notes: list[str] = []
    if input_tree is not None:
        for slot, leaf in input_leaves(input_tree):
            plan, line, note = resolve_leaf(slot, leaf, features, observation_space)
            observation.append(plan)
            lines.append(f"  {line}")
            notes += note
    action, action_lines = resolve_action(env_tags, action_space, output)
    lines.append("action:")
    lines += [f"  {line}" for line in action_lines]
    return Plan(
        observation=tuple(observation),
        action=action,
        observation_keys=key_paths(observation_space),
        description="\n".join(lines),
        notes=tuple(notes),
    )


def _role_based(input_tree: InputTree | None, output: Action) -> bool:
    """Whether any input leaf or the output pairs by role (``ModelSpec.role_based``)."""
    leaves = () if input_tree is None else (leaf for _, leaf in input_leaves(input_tree))
    return output.role_based or any(leaf.role_based for leaf in leaves)


def _roles_wanted(input_tree: InputTree | None, output: Action) -> list[str]:
    roles: list[str] = []
    if input_tree is not None:
        for _, leaf in input_leaves(input_tree):
            parts = leaf.parts if isinstance(leaf, Concat) else (leaf,)
            roles += [part.role for part in parts if getattr(part, "role", None)]
    if output.role_based:
        roles += [c.role for c in output.components if c.role is not None]
    return list(dict.fromkeys(roles))


def _refuse_untagged(input_tree: InputTree | None, output: Action) -> None:
    if not _role_based(input_tree, output):
        return
    roles = ", ".join(quoted(role) for role in _roles_wanted(input_tree, output))
    raise SpecError(
        f"the model spec pairs by role, but the env has no tags, so no key provides the roles "
        f"{roles}; pass rlmesh.run(..., env_tags=EnvTags(...)), set the env's "
        f'metadata["rlmesh.adapters.v1.env_io_spec"], or read keys instead of roles'
    )
