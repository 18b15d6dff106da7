"""Where the model-spec names were: all still importable here; the code now lives beside it.

``ModelSpec`` and ``compile_spec`` are in ``rlmesh.adapters.model_spec``, the leaves in
``image``, ``state``, ``text`` and ``custom``, the output in ``action``, the input tree in
``inputs``, the plan in ``plan``, and keys and spaces in ``keys``.

Example:
    >>> import gymnasium as gym
    >>> plan = ModelSpec(input=State()).compile(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    >>> print(plan.describe())
    input: obs int64[] -> float32[1] (flatten)
    action: cast to int64[] in 0..1
"""

from ..errors import SpecError
from .action import CAST_ONLY, Action, Actuator
from .checks import MAX_STACK
from .custom import Custom
from .image import CHW_AXES, IMAGE_DTYPES, IMAGE_FITS, IMAGE_LAYOUTS, Image
from .inputs import V1_LEAF_TYPES, InputTree, Leaf
from .keys import NUMERIC_SPACES, Key, KeyPath, is_text_space
from .model_spec import ModelSpec, compile_spec
from .plan import ActionLeafPlan, ActionSegmentPlan, LeafPlan, Plan, StatePartPlan
from .roles import is_role
from .state import FLAT_DTYPES, STATE_CONTAINERS, Concat, State
from .text import TEXT_CONTAINERS, Text
from .v1 import action_from_v1

__all__ = [
    "CAST_ONLY",
    "CHW_AXES",
    "FLAT_DTYPES",
    "IMAGE_DTYPES",
    "IMAGE_FITS",
    "IMAGE_LAYOUTS",
    "MAX_STACK",
    "NUMERIC_SPACES",
    "STATE_CONTAINERS",
    "TEXT_CONTAINERS",
    "V1_LEAF_TYPES",
    "Action",
    "ActionLeafPlan",
    "ActionSegmentPlan",
    "Actuator",
    "Concat",
    "Custom",
    "Image",
    "InputTree",
    "Key",
    "KeyPath",
    "Leaf",
    "LeafPlan",
    "ModelSpec",
    "Plan",
    "SpecError",
    "State",
    "StatePartPlan",
    "Text",
    "action_from_v1",
    "compile_spec",
    "is_role",
    "is_text_space",
]
