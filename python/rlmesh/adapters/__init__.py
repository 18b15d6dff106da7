"""What a model consumes and emits, by observation key or by role (adapters-v1).

Two ways to say what a model reads:

- **by key**: ``Image("pixels")``, ``State("joints")``, ... name observation keys, and
  ``compile_spec`` checks them against the spaces (see ``rlmesh.adapters.model_spec``);
- **by role**: ``Image(IMAGE_PRIMARY, size=224)``, ``Concat(EEF_POS, State(EEF_ROT,
  encoding="rot6d"))``, ``Action(Actuator(ACTION_GRIPPER, dim=1))`` name roles, an env's
  ``EnvTags`` say which of its leaves plays each role, and ``resolve`` pairs them, planning
  every conversion (resize, flip, layout, rotation encodings, concatenation, zero-fill,
  actuator corrections) or failing with an exact error.

Either way the result is a ``Plan``, pure data the core executes per lane.

The modules, each importing only those listed before it:

- ``roles`` (the role names and width laws), ``checks`` (argument and v1 field checks),
  ``keys`` (key paths, space kinds, their text in messages);
- the spec language: ``node`` (the dict round trip every node shares), the leaves
  ``image``, ``state``, ``text``, ``custom``, the output ``action`` (``Actuator``,
  ``Action``), ``v1`` (reading the adapters-v1 form), ``inputs`` (the input tree);
- ``tags`` (the env side), ``plan`` (the ``Plan``, its describe and advisories);
- ``keyed`` (the key-based compiler), the role resolver ``resolve_features`` (the env's
  roles), ``resolve_inputs``, ``resolve_action``, ``resolve_roles`` (the plan they make);
- ``model_spec`` (``ModelSpec`` and ``compile_spec``), ``resolve`` (the public entry), and
  ``spec``, where the model-spec names were, which re-exports them.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh import adapters
    >>> tags = adapters.EnvTags(
    ...     observation={"q": adapters.StateTag(adapters.EEF_ROT, encoding="quat_xyzw")},
    ...     action=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    ... )
    >>> spec = adapters.ModelSpec(
    ...     input={"state": adapters.State(adapters.EEF_ROT, encoding="rot6d")},
    ...     output=adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1)),
    ... )
    >>> space = gym.spaces.Dict({"q": gym.spaces.Box(-1, 1, (4,), np.float32)})
    >>> plan = adapters.resolve(tags, space, gym.spaces.Box(-1, 1, (1,), np.float32), spec)
    >>> print(plan.describe())
    observation:
      "state" <- concat(q (quat_xyzw->rot6d))
    action:
      "action/gripper" <- model[0:1]
"""

from collections.abc import Mapping
from typing import Any

from ..errors import SpecError
from .action import CAST_ONLY, Action, Actuator
from .custom import Custom
from .image import Image
from .keys import is_text_space
from .model_spec import ModelSpec, compile_spec
from .plan import ActionLeafPlan, LeafPlan, Plan
from .resolve import resolve
from .roles import (
    ACTION_DELTA_POS,
    ACTION_DELTA_POS_2,
    ACTION_DELTA_ROT,
    ACTION_DELTA_ROT_2,
    ACTION_EEF_POS,
    ACTION_EEF_ROT,
    ACTION_GRIPPER,
    ACTION_GRIPPER_2,
    ACTION_JOINT_POS,
    ACTION_JOINT_VEL,
    BASE_ANG_VEL,
    BASE_ROT,
    COMMAND_BASE_VEL,
    EEF_POS,
    EEF_POS_2,
    EEF_ROT,
    EEF_ROT_2,
    EEF_WRENCH,
    ENCODINGS,
    GRIPPER_POS,
    GRIPPER_POS_2,
    IMAGE_PRIMARY,
    IMAGE_SECONDARY,
    IMAGE_WRIST,
    INSTRUCTION,
    JOINT_POS,
    JOINT_VEL,
)
from .state import Concat, State
from .tags import EnvTags, Field, ImageTag, Split, StateTag, TextTag
from .text import Text

ENV_TAGS_METADATA_KEY = "rlmesh.adapters.v1.env_io_spec"
"""The env ``metadata`` key whose value (EnvTags, or their v1 dict / JSON) tags the env."""

ENV_TAGS_CONTRACT_KEY = "rlmesh.adapters.v1.env_tags"
"""The key under which rlmesh 0.1.0 tags an env's ``metadata`` and a served env's contract
(the v1 dict). Tags are read from either key and served under this one, so a tagged env
served by either package resolves on either package's driver."""


def checked_env_tags(where: str, value: Any) -> EnvTags:
    """``value`` (EnvTags, their v1 dict or JSON text) as EnvTags; a SpecError naming ``where``.

    Example:
        >>> checked_env_tags("env_tags", {"observation": None, "action": None})
        EnvTags(observation=None, action=None)
    """
    try:
        if isinstance(value, EnvTags):
            return value
        if isinstance(value, str):
            return EnvTags.from_json(value)
        if isinstance(value, Mapping):
            return EnvTags.from_dict(value)
    except (SpecError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    raise SpecError(f"{where} must be EnvTags, their v1 dict or JSON text, got {value!r}")


def env_tags_of(metadata: Mapping[str, Any] | None) -> EnvTags | None:
    """The tags an env declares in ``metadata[ENV_TAGS_METADATA_KEY]`` (else under
    ``ENV_TAGS_CONTRACT_KEY``, rlmesh 0.1.0's key), or None.

    Example:
        >>> env_tags_of({ENV_TAGS_CONTRACT_KEY: {"observation": None, "action": None}})
        EnvTags(observation=None, action=None)
    """
    for key in (ENV_TAGS_METADATA_KEY, ENV_TAGS_CONTRACT_KEY):
        if metadata and metadata.get(key) is not None:
            return checked_env_tags(f"the env's metadata[{key!r}]", metadata[key])
    return None


def env_tags_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entries of an env's ``metadata`` that tag it (a subset that pickles and travels),
    e.g. for a worker process to send its driver."""
    keys = (ENV_TAGS_METADATA_KEY, ENV_TAGS_CONTRACT_KEY)
    return {key: metadata[key] for key in keys if metadata and metadata.get(key) is not None}


__all__ = [
    "ACTION_DELTA_POS",
    "ACTION_DELTA_POS_2",
    "ACTION_DELTA_ROT",
    "ACTION_DELTA_ROT_2",
    "ACTION_EEF_POS",
    "ACTION_EEF_ROT",
    "ACTION_GRIPPER",
    "ACTION_GRIPPER_2",
    "ACTION_JOINT_POS",
    "ACTION_JOINT_VEL",
    "BASE_ANG_VEL",
    "BASE_ROT",
    "CAST_ONLY",
    "COMMAND_BASE_VEL",
    "EEF_POS",
    "EEF_POS_2",
    "EEF_ROT",
    "EEF_ROT_2",
    "EEF_WRENCH",
    "ENCODINGS",
    "ENV_TAGS_CONTRACT_KEY",
    "ENV_TAGS_METADATA_KEY",
    "GRIPPER_POS",
    "GRIPPER_POS_2",
    "IMAGE_PRIMARY",
    "IMAGE_SECONDARY",
    "IMAGE_WRIST",
    "INSTRUCTION",
    "JOINT_POS",
    "JOINT_VEL",
    "Action",
    "ActionLeafPlan",
    "Actuator",
    "Concat",
    "Custom",
    "EnvTags",
    "Field",
    "Image",
    "ImageTag",
    "LeafPlan",
    "ModelSpec",
    "Plan",
    "Split",
    "State",
    "StateTag",
    "Text",
    "TextTag",
    "checked_env_tags",
    "compile_spec",
    "env_tags_metadata",
    "env_tags_of",
    "is_text_space",
    "resolve",
]
