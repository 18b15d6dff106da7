"""Resolving a model's action layout onto the env's tagged action layout, by role.

The model's vector is cut into its actuators; each env actuator reads the model's slice of
the same role (``model[start:stop]``) and converts it (rotation encoding, range, each side's
scale / invert / threshold, the binary snap, the clamp), or is filled with a constant when it
is opaque or optional and the model does not output it. The result is one Box
``ActionLeafPlan`` with one ``ActionSegmentPlan`` per env actuator, and the description's
lines (``"role" <- model[0:3] ...``).

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh import adapters
    >>> gripper = adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(-1, 1), clip=True)
    >>> env = adapters.EnvTags(action=adapters.Action(gripper))
    >>> model = adapters.Action(adapters.Actuator(adapters.ACTION_GRIPPER, dim=1, range=(0, 1)))
    >>> (leaf,), lines = resolve_action(env, gym.spaces.Box(-1, 1, (1,), np.float32), model)
    >>> lines, leaf.segments[0].clip
    (['"action/gripper" <- model[0:1] (range (0.0, 1.0)->(-1.0, 1.0))'], (-1.0, 1.0))
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .action import Action
from .keyed import action_plan
from .keys import quoted, range_text, signature
from .plan import ActionLeafPlan, ActionSegmentPlan, describe_action_leaf, read_only
from .roles import encoding_width, fixed_width
from .tags import EnvTags


def resolve_action(
    env_tags: EnvTags | None, action_space: spaces.Space, output: Action
) -> tuple[tuple[ActionLeafPlan, ...], list[str]]:
    """The action plan and its lines of the description: the model's layout mapped onto the
    env's tagged layout by role, or a key-based output planned as ``compile_spec`` would."""
    if not output.role_based:
        leaves = action_plan(action_space, output)
        return leaves, [describe_action_leaf(leaf) for leaf in leaves]
    if env_tags is None or env_tags.action is None:
        raise SpecError(
            "the model's action pairs by role, but the env tags declare no action layout; "
            "tag it with EnvTags(action=Action(Actuator(...), ...))"
        )
    env = env_tags.action
    if not isinstance(action_space, spaces.Box):
        raise SpecError(
            f"a role-based action layout fills a flat Box action space, got {action_space}"
        )
    width = math.prod(action_space.shape)
    if env.dim != width:
        raise SpecError(
            f"env tags: the action layout has {env.dim} dims, but the action space width is {width}"
        )
    segments, lines = _plan_segments(output, env)
    if env.clip is not None:
        lines.append(f"clip to {range_text(env.clip)}")
    shape, dtype = signature(action_space)
    leaf = ActionLeafPlan(
        path=(),
        kind="box",
        shape=shape,
        dtype=dtype,
        low=read_only(action_space.low, np.float64),
        high=read_only(action_space.high, np.float64),
        segments=tuple(segments),
        model_dim=output.dim,
        layout_clip=env.clip,
    )
    return (leaf,), lines


def _plan_segments(model: Action, env: Action) -> tuple[list[ActionSegmentPlan], list[str]]:
    if model.clip is not None:
        raise SpecError(
            "clip is an env-side clamp on the action vector; the model's action layout must "
            "leave it unset"
        )
    offsets: dict[str, tuple[int, Any]] = {}
    cursor = 0
    for component in model.components:
        if component.role is not None:
            if component.role in offsets:
                raise SpecError(f"duplicate model action role {quoted(component.role)}")
            offsets[component.role] = (cursor, component)
        cursor += component.dim
    segments: list[ActionSegmentPlan] = []
    lines: list[str] = []
    seen: set[str] = set()
    for actuator in env.components:
        if actuator.role is None:
            segments.append(ActionSegmentPlan(role=None, fill=actuator.fill, width=actuator.dim))
            lines.append(f"(opaque {actuator.dim}d) <- fill {actuator.fill!r}")
            continue
        role = quoted(actuator.role)
        if actuator.role in seen:
            raise SpecError(f"duplicate env action role {role}")
        seen.add(actuator.role)
        if actuator.role not in offsets:
            if actuator.optional:
                segments.append(
                    ActionSegmentPlan(role=actuator.role, fill=actuator.fill, width=actuator.dim)
                )
                lines.append(
                    f"{role} <- fill {actuator.fill!r} ({actuator.dim}d; model did not output "
                    f"this optional role)"
                )
                continue
            outputs = json.dumps(sorted(offsets))
            raise SpecError(f"env action needs role {role} but the model only outputs {outputs}")
        start, component = offsets[actuator.role]
        _check_actuator_pair(role, component, actuator)
        binary = actuator.binary or component.binary
        same_range = component.range == actuator.range
        segment = ActionSegmentPlan(
            role=actuator.role,
            start=start,
            stop=start + component.dim,
            encoding_from=component.encoding,
            encoding_to=actuator.encoding,
            range_from=None if same_range else component.range,
            range_to=None if same_range else actuator.range,
            model_scale=component.scale,
            model_invert=component.invert,
            model_threshold=component.threshold,
            scale=actuator.scale,
            invert=actuator.invert,
            threshold=actuator.threshold,
            binary=binary,
            clip=actuator.range if actuator.clip else None,
            width=actuator.dim,
        )
        segments.append(segment)
        lines.append(_segment_text(segment))
    return segments, lines


def _check_actuator_pair(role: str, model: Any, env: Any) -> None:
    expected = fixed_width(model.role)
    if expected is not None and model.dim != expected:
        raise SpecError(
            f"action role {role}: model declares {model.dim} dims but the role is "
            f"{expected}-D by convention"
        )
    if model.encoding is not None and env.encoding is not None:
        if model.encoding != env.encoding and (
            model.dim != encoding_width(model.encoding) or env.dim != encoding_width(env.encoding)
        ):
            raise SpecError(
                f"action role {role}: dims {model.dim}->{env.dim} do not match encodings "
                f"{quoted(model.encoding)}->{quoted(env.encoding)}"
            )
    elif model.encoding != env.encoding:
        raise SpecError(
            f"action role {role}: cannot convert encoding {_encoding_text(model.encoding)} to "
            f"{_encoding_text(env.encoding)}; both sides must declare a rotation encoding"
        )
    elif model.dim != env.dim:
        raise SpecError(
            f"action role {role}: model outputs {model.dim} dims but the env expects {env.dim}"
        )
    if model.clip:
        raise SpecError(
            f"action role {role}: clip is an env-side clamp; declare it on the env actuator"
        )
    if (env.threshold is not None or model.threshold is not None) and not (
        env.binary or model.binary
    ):
        raise SpecError(
            f"action role {role}: threshold requires a binary component (set binary=True)"
        )


def _encoding_text(encoding: str | None) -> str:
    return "None" if encoding is None else quoted(encoding)


def _segment_text(segment: ActionSegmentPlan) -> str:
    text = f"{quoted(segment.role)} <- model[{segment.start}:{segment.stop}]"
    if segment.encoding_from != segment.encoding_to:
        text += f" ({segment.encoding_from}->{segment.encoding_to})"
    if segment.range_from is not None and segment.range_to is not None:
        text += f" (range {range_text(segment.range_from)}->{range_text(segment.range_to)})"
    if segment.scale is not None:
        text += f" (*{segment.scale!r})"
    if segment.invert:
        text += " (invert)"
    if segment.threshold is not None:
        text += f" (-{segment.threshold!r})"
    if segment.binary:
        text += " (sign)"
    return text
