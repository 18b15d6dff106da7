"""What a model consumes and emits, by observation key or by role (adapters-v1).

Two ways to say what a model reads:

- **by key**: ``Image("pixels")``, ``State("joints")``, ... name observation keys, and
  ``compile_spec`` checks them against the spaces (see ``rlmesh.adapters.spec``);
- **by role**: ``Image(IMAGE_PRIMARY, size=224)``, ``Concat(EEF_POS, State(EEF_ROT,
  encoding="rot6d"))``, ``Action(Actuator(ACTION_GRIPPER, dim=1))`` name roles, an env's
  ``EnvTags`` say which of its leaves plays each role, and ``resolve`` pairs them, planning
  every conversion (resize, flip, layout, rotation encodings, concatenation, zero-fill,
  actuator corrections) or failing with an exact error.

Either way the result is a ``Plan``, pure data the core executes per lane.

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
    >>> adapters.ModelSpec.from_dict(spec.to_dict()) == spec
    True
"""

from .resolve import resolve
from .roles import (
    ACTION_DELTA_POS,
    ACTION_DELTA_POS_2,
    ACTION_DELTA_ROT,
    ACTION_DELTA_ROT_2,
    ACTION_GRIPPER,
    ACTION_GRIPPER_2,
    EEF_POS,
    EEF_POS_2,
    EEF_ROT,
    EEF_ROT_2,
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
from .spec import (
    CAST_ONLY,
    Action,
    ActionLeafPlan,
    Concat,
    Custom,
    Image,
    LeafPlan,
    ModelSpec,
    Plan,
    State,
    Text,
    compile_spec,
    is_text_space,
)
from .tags import Actuator, EnvTags, Field, ImageTag, Split, StateTag, TextTag

ENV_TAGS_METADATA_KEY = "rlmesh.adapters.v1.env_io_spec"
"""The env ``metadata`` key whose value (EnvTags, or their v1 dict / JSON) tags the env."""

__all__ = [
    "ACTION_DELTA_POS",
    "ACTION_DELTA_POS_2",
    "ACTION_DELTA_ROT",
    "ACTION_DELTA_ROT_2",
    "ACTION_GRIPPER",
    "ACTION_GRIPPER_2",
    "CAST_ONLY",
    "EEF_POS",
    "EEF_POS_2",
    "EEF_ROT",
    "EEF_ROT_2",
    "ENCODINGS",
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
    "compile_spec",
    "is_text_space",
    "resolve",
]
