"""Pairing an env's tags with a role-based model spec: ``resolve`` -> ``Plan``.

Resolve reads widths, dtypes and layouts from the spaces, the roles and the facts a space
cannot carry from the tags, and plans every conversion the model's declared conventions need,
or fails with a ``SpecError`` naming the model input (or action role), what the env offers and
what was expected. Nothing is converted here: the ``Plan`` is data the core executes per lane.

The description (``Plan.describe()``) and the error wording follow the adapters-v1
conformance vectors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .roles import encoding_width, fixed_width
from .spec import (
    NUMERIC_SPACES,
    Action,
    ActionLeafPlan,
    ActionSegmentPlan,
    Concat,
    Custom,
    Image,
    KeyPath,
    LeafPlan,
    ModelSpec,
    Plan,
    State,
    StatePartPlan,
    Text,
    _compile_leaf,
    _input_leaves,
    _key_paths,
    _read_only,
    _signature,
    is_text_space,
)
from .tags import (
    EnvTags,
    ImageTag,
    Split,
    StateTag,
    TextTag,
    observation_tags,
)

RESAMPLES = ("bilinear", "bilinear_aa")
ROOT_SLOT = "<root>"
ROOT_SOURCE = "<obs>"


def _quoted(text: str) -> str:
    return json.dumps(text)


def _range_text(value: tuple[float, float]) -> str:
    return f"({float(value[0])!r}, {float(value[1])!r})"


def _path_name(path: tuple) -> str:
    return ".".join(str(part) for part in path) if path else ROOT_SOURCE


def _slot_name(slot: KeyPath) -> str:
    return ".".join(slot) if slot else ROOT_SLOT


@dataclass(frozen=True)
class _Feature:
    """One role the env provides: where it is and what the tag and space say of it."""

    role: str
    kind: str  # "image" | "state" | "text"
    path: tuple
    space: spaces.Space
    tag: Any
    offset: int | None = None  # a Split field's slice of the flat leaf
    width: int = 0
    encoding: str | None = None
    range: tuple[float, float] | None = None


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
    features = _features(env_tags, observation_space)
    if env_tags is None:
        _refuse_untagged(model_spec)
    observation: list[LeafPlan] = []
    lines = ["observation:"]
    notes: list[str] = []
    if model_spec.input is not None:
        for slot, leaf in _input_leaves(model_spec.input):
            plan, line, note = _resolve_leaf(slot, leaf, features, observation_space)
            observation.append(plan)
            lines.append(f"  {line}")
            notes += note
    action, action_lines = _resolve_action(env_tags, action_space, model_spec.output)
    lines.append("action:")
    lines += [f"  {line}" for line in action_lines]
    return Plan(
        observation=tuple(observation),
        action=action,
        observation_keys=_key_paths(observation_space),
        description="\n".join(lines),
        notes=tuple(notes),
    )


def _roles_wanted(spec: ModelSpec) -> list[str]:
    roles: list[str] = []
    if spec.input is not None:
        for _, leaf in _input_leaves(spec.input):
            parts = leaf.parts if isinstance(leaf, Concat) else (leaf,)
            roles += [part.role for part in parts if getattr(part, "role", None)]
    if spec.output.role_based:
        roles += [c.role for c in spec.output.components if c.role is not None]
    return list(dict.fromkeys(roles))


def _refuse_untagged(spec: ModelSpec) -> None:
    if not spec.role_based:
        return
    roles = ", ".join(_quoted(role) for role in _roles_wanted(spec))
    raise SpecError(
        f"the model spec pairs by role, but the env has no tags, so no key provides the roles "
        f"{roles}; pass rlmesh.run(..., env_tags=EnvTags(...)), set the env's "
        f'metadata["rlmesh.adapters.v1.env_io_spec"], or read keys instead of roles'
    )


# ----------------------------------------------------------------------------------------------
# Join: the tags checked against the spaces


def _subspace(space: spaces.Space, path: tuple) -> spaces.Space:
    for depth, key in enumerate(path):
        where = _path_name(path[:depth])
        if isinstance(key, str):
            if not isinstance(space, spaces.Dict) or key not in space.spaces:
                raise SpecError(
                    f"env tags: observation {_quoted(_path_name(path))} is tagged, but "
                    f"{_quoted(where)} has no key {_quoted(key)}"
                )
            space = space.spaces[key]
        else:
            if not isinstance(space, spaces.Tuple) or key >= len(space.spaces):
                raise SpecError(
                    f"env tags: observation {_quoted(_path_name(path))} is tagged, but "
                    f"{_quoted(where)} has no element {key}"
                )
            space = space.spaces[key]
    return space


def _box_range(space: spaces.Space, start: int = 0, stop: int | None = None):
    """A Box's bounds (of its flat elements ``start:stop``) when they are finite and the same
    for every element, else None."""
    if not isinstance(space, spaces.Box) or space.low.size == 0:
        return None
    lows, highs = space.low.reshape(-1)[start:stop], space.high.reshape(-1)[start:stop]
    low, high = float(lows[0]), float(highs[0])
    uniform = np.all(lows == low) and np.all(highs == high)
    if uniform and math.isfinite(low) and math.isfinite(high) and low < high:
        return low, high
    return None


def _feature_range(
    name: str,
    role: str,
    space: spaces.Space,
    declared: tuple[float, float] | None,
    start: int = 0,
    stop: int | None = None,
) -> tuple[float, float] | None:
    """The range a state feature's values span: the tag's ``range`` where the space is
    unbounded, else the space's own bounds; a tag range the space's bounds contradict is a
    SpecError rather than silently one of the two."""
    bounds = _box_range(space, start, stop)
    if declared is None:
        return bounds
    if isinstance(space, spaces.Box):
        lows, highs = space.low.reshape(-1)[start:stop], space.high.reshape(-1)[start:stop]
        finite = np.all(np.isfinite(lows)) and np.all(np.isfinite(highs))
        if finite and bounds != (float(declared[0]), float(declared[1])):
            held = "element by element" if bounds is None else f"to {_range_text(bounds)}"
            raise SpecError(
                f"env tags: state {name} ({_quoted(role)}) declares range "
                f"{_range_text(declared)}, but its space bounds it {held}; a tag's range is "
                f"for values the space leaves unbounded: drop it, or fix the space's bounds"
            )
    return declared


def _features(env_tags: EnvTags | None, observation_space: spaces.Space) -> dict[str, _Feature]:
    """Every role the env's observation tags provide, checked against the space."""
    features: dict[str, _Feature] = {}
    if env_tags is None or env_tags.observation is None:
        return features
    for path, tag in observation_tags(env_tags.observation):
        space = _subspace(observation_space, path)
        name = _quoted(_path_name(path))
        found: list[_Feature] = []
        if isinstance(tag, ImageTag):
            if not (isinstance(space, spaces.Box) and len(space.shape) == 3):
                raise SpecError(
                    f"env tags: image {name} must be a rank-3 Box ({tag.layout}), got {space}"
                )
            found.append(_Feature(tag.role, "image", path, space, tag))
        elif isinstance(tag, TextTag):
            if not is_text_space(space):
                raise SpecError(f"env tags: text {name} must be a text space, got {space}")
            found.append(_Feature(tag.role, "text", path, space, tag))
        else:
            if not isinstance(space, NUMERIC_SPACES):
                raise SpecError(f"env tags: state {name} must be a numeric space, got {space}")
            width = math.prod(space.shape)
            if isinstance(tag, StateTag):
                _check_width(name, tag.role, tag.encoding, width)
                found.append(
                    _Feature(
                        tag.role,
                        "state",
                        path,
                        space,
                        tag,
                        width=width,
                        encoding=tag.encoding,
                        range=_feature_range(name, tag.role, space, tag.range),
                    )
                )
            else:
                found += _split_features(name, path, space, tag, width)
        for feature in found:
            if feature.role in features:
                raise SpecError(
                    f"env tags: role {_quoted(feature.role)} is tagged twice, on "
                    f"{_quoted(_path_name(features[feature.role].path))} and {name}"
                )
            features[feature.role] = feature
    return features


def _check_width(name: str, role: str, encoding: str | None, width: int) -> None:
    if encoding is not None and encoding_width(encoding) != width:
        raise SpecError(
            f"env tags: state {name} ({_quoted(role)}) declares encoding {encoding} "
            f"({encoding_width(encoding)} dims) but the space width is {width}"
        )
    expected = fixed_width(role)
    if expected is not None and width != expected:
        raise SpecError(
            f"env tags: state {name} ({_quoted(role)}) is {width}-D, but the role is "
            f"{expected}-D by convention"
        )


def _split_features(
    name: str, path: tuple, space: spaces.Space, split: Split, width: int
) -> list[_Feature]:
    if width != split.dim:
        raise SpecError(
            f"env tags: split {name} has fields of {split.dim} dims in all, but the space "
            f"width is {width}"
        )
    found, offset = [], 0
    for field in split.fields:
        if field.role is not None:
            found.append(
                _Feature(
                    field.role,
                    "state",
                    path,
                    space,
                    split,
                    offset=offset,
                    width=field.dim,
                    encoding=field.encoding,
                    range=_feature_range(
                        f"{name}[{offset}:{offset + field.dim}]",
                        field.role,
                        space,
                        field.range,
                        offset,
                        offset + field.dim,
                    ),
                )
            )
        offset += field.dim
    return found


# ----------------------------------------------------------------------------------------------
# Observation leaves


def _resolve_leaf(
    slot: KeyPath, leaf: Any, features: dict[str, _Feature], observation_space: spaces.Space
) -> tuple[LeafPlan, str, list[str]]:
    placement = _quoted(_slot_name(slot))
    if isinstance(leaf, Custom) or not leaf.role_based:
        plan = _compile_leaf(slot, leaf, observation_space)
        return plan, f"{placement} <- {leaf.label}", []
    if isinstance(leaf, Image):
        return _resolve_image(slot, placement, leaf, features)
    if isinstance(leaf, Text):
        return _resolve_text(slot, placement, leaf, features)
    return _resolve_state(slot, placement, leaf, features)


def _missing(placement: str, kind: str, role: str, features: dict[str, _Feature]) -> SpecError:
    offered = [feature.role for feature in features.values() if feature.kind == kind]
    offered_text = ", ".join(_quoted(role) for role in offered) or "none"
    return SpecError(
        f"input {placement} needs {kind} role {_quoted(role)}, but no env key provides it "
        f"(env {kind} roles: {offered_text}); tag it, or mark the input optional"
    )


def _resolve_image(
    slot: KeyPath, placement: str, image: Image, features: dict[str, _Feature]
) -> tuple[LeafPlan, str, list[str]]:
    if image.resample not in RESAMPLES:
        raise SpecError(
            f"input {placement}: unsupported resample {image.resample!r}; expected one of "
            f"{', '.join(RESAMPLES)}"
        )
    lo, hi = _normalize(image)
    feature = features.get(image.role)
    if feature is not None and feature.kind != "image":
        raise SpecError(
            f"input {placement}: role {_quoted(image.role)} is tagged on "
            f"{_quoted(_path_name(feature.path))} as {feature.kind}, not an image"
        )
    if feature is None:
        if not image.optional:
            raise _missing(placement, "image", image.role, features)
        if None in (image.height, image.width, image.channels):
            raise SpecError(
                f"input {placement}: optional image {_quoted(image.role)} needs height, "
                f"width and channels to zero fill a frame the env does not have"
            )
        frame = (image.height, image.width, image.channels)
        fill = 0.0 if image.fill is None else float(image.fill)
        plan = _image_plan(
            slot, image, None, frame, frame, "hwc", (1.0, 0.0), zero_fill=True, fill=fill
        )
        line = f"{placement} <- zeros({frame[0]}x{frame[1]}x{frame[2]})"
        note = f"image {placement}: the env provides no source camera; using a blank (zero) frame"
        return plan, line, [note]
    tag: ImageTag = feature.tag
    shape = tuple(int(size) for size in feature.space.shape)
    height, width, channels = shape if tag.layout == "hwc" else (shape[1], shape[2], shape[0])
    if image.channels is not None and image.channels != channels:
        raise SpecError(
            f"input {placement}: the model wants {image.channels} channels but "
            f"{_quoted(_path_name(feature.path))} has {channels}"
        )
    target = (image.height or height, image.width or width)
    source = _quoted(_path_name(feature.path))
    fit, resize = _fit(placement, image, source, (height, width), target)
    source_dtype = np.dtype(feature.space.dtype).name
    if image.normalize is not False and source_dtype != "uint8":
        raise SpecError(
            f"input {placement}: normalize maps uint8 [0, 255], but "
            f"{_quoted(_path_name(feature.path))} is {source_dtype}"
        )
    if source_dtype != "uint8" and image.dtype != "float32":
        raise SpecError(
            f"input {placement}: {_quoted(_path_name(feature.path))} is a {source_dtype} "
            f'image; rlmesh delivers it as dtype="float32", not {image.dtype}'
        )
    flip = tag.upside_down != image.upside_down
    frame = (*target, channels)
    plan = _image_plan(
        slot,
        image,
        feature,
        shape,
        frame,
        tag.layout,
        ((hi - lo) / 255.0, lo),
        flip=flip,
        resize=resize,
        fit=fit,
    )
    notes = []
    if fit == "crop":
        notes.append(f"image {placement}: aspect crop drops edge pixels")
    elif fit == "pad":
        notes.append(f"image {placement}: aspect pad adds letterbox borders")
    steps = []
    if tag.layout != "hwc":
        steps.append(f"{tag.layout}->hwc")
    if flip:
        steps.append("flip 180")
    if resize is not None:
        steps.append(f"resize {target[0]}x{target[1]} ({image.resample})")
    if image.normalize is not False:
        steps.append("normalize /255" if (lo, hi) == (0.0, 1.0) else f"normalize [{lo!r}, {hi!r}]")
    steps.append(image.dtype)
    if image.layout != "hwc":
        steps.append(f"hwc->{image.layout}")
    if image.lead_dims:
        steps.append(f"+{image.lead_dims} lead dims")
    line = f"{placement} <- image {source} ({', '.join(steps)})"
    return plan, line, notes


def _fit(
    placement: str,
    image: Image,
    source: str,
    size: tuple[int, int],
    target: tuple[int, int],
) -> tuple[str, tuple[int, int] | None]:
    """The fit mode an image resize uses, and the size it resizes to before that mode crops or
    pads it to ``target``: the first of ``image.fit``'s preferences needing no disallowed
    upscale. A SpecError when none does, or when the aspect changes and ``fit`` is None."""
    if target == size:
        return "stretch", None
    (height, width), (to_height, to_width) = size, target
    if to_height * width == to_width * height:  # one uniform scale: every mode is a stretch
        modes: tuple[str, ...] = ("stretch",)
    elif image.fit is None:
        raise SpecError(
            f"input {placement}: target {to_height}x{to_width} changes the aspect of {source} "
            f'({height}x{width}); set fit to "stretch", "crop" or "pad"'
        )
    else:
        modes = image.fit if isinstance(image.fit, tuple) else (image.fit,)
    for mode in modes:
        scaled = _scaled_size(mode, size, target)
        if image.allow_upscale or (scaled[0] <= height and scaled[1] <= width):
            return mode, scaled
    tried = "" if modes == ("stretch",) else f" with fit {' or '.join(modes)}"
    raise SpecError(
        f"input {placement}: target {to_height}x{to_width} is larger than {source} "
        f"({height}x{width}){tried}; set allow_upscale=True or lower the target"
    )


def _scaled_size(mode: str, size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The size ``mode`` resizes ``size`` to before it crops or pads to ``target``: ``crop``
    scales uniformly to cover the target, ``pad`` to fit inside it (rounded half up)."""
    if mode == "stretch":
        return target
    ratios = (target[0] / size[0], target[1] / size[1])
    scale = max(ratios) if mode == "crop" else min(ratios)
    scaled = tuple(math.floor(side * scale + 0.5) for side in size)
    if mode == "crop":
        return max(scaled[0], target[0]), max(scaled[1], target[1])
    return min(max(scaled[0], 1), target[0]), min(max(scaled[1], 1), target[1])


def _normalize(image: Image) -> tuple[float, float]:
    """The range uint8 [0, 255] maps onto: (0, 255) (identity) when not normalizing."""
    if image.normalize is False:
        return 0.0, 255.0
    if image.normalize is True:
        return 0.0, 1.0
    return tuple(float(bound) for bound in image.normalize)  # type: ignore[return-value]


def _image_plan(
    slot: KeyPath,
    image: Image,
    feature: _Feature | None,
    source_shape: tuple[int, ...],
    frame: tuple[int, int, int],
    src_layout: str,
    affine: tuple[float, float],
    *,
    flip: bool = False,
    resize: tuple[int, int] | None = None,
    fit: str = "stretch",
    zero_fill: bool = False,
    fill: float = 0.0,
) -> LeafPlan:
    out = frame if image.layout == "hwc" else (frame[2], frame[0], frame[1])
    return LeafPlan(
        slot=slot,
        kind="image",
        sources=() if feature is None else (feature.path,),
        source_shapes=() if feature is None else (source_shape,),
        source_dtypes=() if feature is None else (np.dtype(feature.space.dtype).name,),
        transpose=(2, 0, 1) if image.layout == "chw" else None,
        flatten=False,
        dtype=image.dtype,
        scale=affine[0],
        offset=affine[1],
        stack=image.stack,
        frame_shape=(1,) * image.lead_dims + out,
        leaf=image.label,
        src_layout=src_layout,
        flip=flip,
        resize=resize,
        fit=fit,
        resample=image.resample,
        lead_dims=image.lead_dims,
        zero_fill=zero_fill,
        fill_value=fill,
    )


def _resolve_text(
    slot: KeyPath, placement: str, text: Text, features: dict[str, _Feature]
) -> tuple[LeafPlan, str, list[str]]:
    feature = features.get(text.role)
    if feature is None and text.fill is None:
        raise _missing(placement, "text", text.role, features)
    if feature is not None and feature.kind != "text":
        raise SpecError(
            f"input {placement}: role {_quoted(text.role)} is tagged on "
            f"{_quoted(_path_name(feature.path))} as {feature.kind}, not text"
        )
    source = () if feature is None else (feature.path,)
    plan = LeafPlan(
        slot=slot,
        kind="text",
        sources=source,
        source_shapes=((),) * len(source),
        source_dtypes=("str",) * len(source),
        transpose=None,
        flatten=False,
        dtype="str",
        scale=1.0,
        offset=0.0,
        stack=1,
        frame_shape=(),
        leaf=text.label,
        container=text.container,
        text_fill=text.fill if feature is None else None,
    )
    shown = f"fill {_quoted(text.fill)}" if feature is None else _quoted(_path_name(feature.path))
    return plan, f"{placement} <- text {shown}", []


def _resolve_state(
    slot: KeyPath, placement: str, leaf: State | Concat, features: dict[str, _Feature]
) -> tuple[LeafPlan, str, list[str]]:
    parts = leaf.parts if isinstance(leaf, Concat) else (leaf,)
    planned = [_resolve_part(placement, part, features) for part in parts]
    total = sum(part.size for part in planned)
    if leaf.pad_to is not None and total > leaf.pad_to:
        raise SpecError(
            f"input {placement}: the parts hold {total} values, more than pad_to={leaf.pad_to}"
        )
    length = leaf.pad_to or total
    frame: tuple[int, ...] = (length,)
    if leaf.reshape is not None:
        if math.prod(leaf.reshape) != length:
            raise SpecError(
                f"input {placement}: reshape {list(leaf.reshape)} holds "
                f"{math.prod(leaf.reshape)} values, but the state has {length}"
            )
        frame = tuple(leaf.reshape)
    if leaf.container == "list" and leaf.stack > 1:
        raise SpecError(f"input {placement}: a stacked state needs container='array'")
    plan = LeafPlan(
        slot=slot,
        kind="state",
        sources=tuple(part.source for part in planned if part.source is not None),
        source_shapes=tuple(part.source_shape for part in planned if part.source is not None),
        source_dtypes=tuple(part.source_dtype for part in planned if part.source is not None),
        transpose=None,
        flatten=True,
        dtype=leaf.dtype,
        scale=1.0,
        offset=0.0,
        stack=leaf.stack,
        frame_shape=frame,
        leaf=leaf.label,
        parts=tuple(planned),
        pad_to=leaf.pad_to,
        container=leaf.container,
    )
    line = f"{placement} <- concat({', '.join(_part_text(part) for part in planned)})"
    if leaf.pad_to is not None:
        line += f", pad to {leaf.pad_to}"
    zeros = sum(1 for part in planned if part.source is None)
    notes = (
        [f"state {placement}: {zeros} component(s) zero-filled for an absent env role"]
        if zeros
        else []
    )
    return plan, line, notes


def _resolve_part(placement: str, part: State, features: dict[str, _Feature]) -> StatePartPlan:
    role = _quoted(part.role)
    expected = fixed_width(part.role)
    if expected is not None and part.dim is not None and part.dim != expected:
        raise SpecError(
            f"input {placement}: part {role} declares {part.dim} dims but the role is "
            f"{expected}-D by convention"
        )
    feature = features.get(part.role)
    if feature is None:
        if not part.optional:
            raise _missing(placement, "state", part.role, features)
        if part.index is not None:
            width = 1
        elif part.dim is not None:
            width = part.dim
        elif part.encoding is not None:
            width = encoding_width(part.encoding)
        else:
            raise SpecError(
                f"input {placement}: optional part {role} has no width to zero fill; set "
                f"dim, index or encoding"
            )
        return StatePartPlan(source=None, zeros=width)
    if feature.kind != "state":
        raise SpecError(
            f"input {placement}: role {role} is tagged on {_quoted(_path_name(feature.path))} "
            f"as {feature.kind}, not state"
        )
    encoding_from, encoding_to = feature.encoding, part.encoding
    width = feature.width
    if encoding_to is not None and encoding_from is None:
        raise SpecError(
            f"input {placement}: part {role} wants encoding {encoding_to}, but the env tags "
            f"{_quoted(_path_name(feature.path))} with no rotation encoding to convert from"
        )
    if encoding_to is not None:
        width = encoding_width(encoding_to)
    if encoding_to is None:
        encoding_to = encoding_from
    if part.dim is not None and part.dim > width:
        raise SpecError(
            f"input {placement}: part {role} keeps dim={part.dim}, but "
            f"{_quoted(_path_name(feature.path))} provides {width}"
        )
    if part.index is not None and part.index >= width:
        raise SpecError(
            f"input {placement}: part {role} selects index {part.index}, but "
            f"{_quoted(_path_name(feature.path))} provides {width}"
        )
    mapped = part.range is not None and feature.range is not None
    return StatePartPlan(
        source=feature.path,
        source_shape=tuple(int(size) for size in feature.space.shape),
        source_dtype=_signature(feature.space)[1],
        offset=feature.offset or 0,
        width=feature.width,
        encoding_from=encoding_from,
        encoding_to=encoding_to,
        index=part.index,
        dim=part.dim,
        range_from=feature.range if mapped else None,
        range_to=part.range if mapped else None,
        name=_path_name(feature.path),
    )


def _part_text(part: StatePartPlan) -> str:
    if part.source is None:
        return f"zeros({part.zeros})"
    text = part.name
    split = part.width != math.prod(part.source_shape)
    if split:
        text += f"[{part.offset}:{part.offset + part.width}]"
    if part.encoding_from != part.encoding_to:
        text += f" ({part.encoding_from}->{part.encoding_to})"
    if part.index is not None:
        text += f"[{part.index}]"
    elif part.dim is not None and not (split and part.dim == part.width):
        text += f"[:{part.dim}]"
    if part.range_from is not None:
        text += f" (range {_range_text(part.range_from)}->{_range_text(part.range_to)})"
    return text


# ----------------------------------------------------------------------------------------------
# The action


def _resolve_action(
    env_tags: EnvTags | None, action_space: spaces.Space, output: Action
) -> tuple[tuple[ActionLeafPlan, ...], list[str]]:
    from .spec import _action_plan, _describe_action_leaf

    if not output.role_based:
        leaves = _action_plan(action_space, output)
        return leaves, [_describe_action_leaf(leaf) for leaf in leaves]
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
        lines.append(f"clip to {_range_text(env.clip)}")
    shape, dtype = _signature(action_space)
    leaf = ActionLeafPlan(
        path=(),
        kind="box",
        shape=shape,
        dtype=dtype,
        low=_read_only(action_space.low, np.float64),
        high=_read_only(action_space.high, np.float64),
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
                raise SpecError(f"duplicate model action role {_quoted(component.role)}")
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
        role = _quoted(actuator.role)
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
                f"{_quoted(model.encoding)}->{_quoted(env.encoding)}"
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
    return "None" if encoding is None else _quoted(encoding)


def _segment_text(segment: ActionSegmentPlan) -> str:
    text = f"{_quoted(segment.role)} <- model[{segment.start}:{segment.stop}]"
    if segment.encoding_from != segment.encoding_to:
        text += f" ({segment.encoding_from}->{segment.encoding_to})"
    if segment.range_from is not None and segment.range_to is not None:
        text += f" (range {_range_text(segment.range_from)}->{_range_text(segment.range_to)})"
    if segment.scale is not None:
        text += f" (*{segment.scale!r})"
    if segment.invert:
        text += " (invert)"
    if segment.threshold is not None:
        text += f" (-{segment.threshold!r})"
    if segment.binary:
        text += " (sign)"
    return text
