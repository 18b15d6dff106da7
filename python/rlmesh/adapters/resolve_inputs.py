"""Resolving a model's role-based input leaves against what the env provides.

Each leaf becomes a ``LeafPlan`` the core executes, one line of the v1 description
(``"slot" <- ...``) and its advisories. An image is converted from the env's layout and
orientation, resized (``bilinear`` or ``bilinear_aa``), fitted to a new aspect by
stretching, cropping or padding, normalized and moved to the model's layout, or zero-filled
when optional and absent. A text leaf passes the env's string through, or a fill. A state
concatenates its parts, each a slice of one env leaf re-encoded, cut and range-mapped, or
zeros for an optional role the env lacks.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from rlmesh import adapters
    >>> from rlmesh.adapters.resolve_features import env_features
    >>> tags = adapters.EnvTags(observation={"q": adapters.StateTag(adapters.EEF_ROT, "quat_xyzw")})
    >>> space = gym.spaces.Dict({"q": gym.spaces.Box(-1, 1, (4,), np.float32)})
    >>> leaf = adapters.State(adapters.EEF_ROT, encoding="rot6d")
    >>> plan, line, notes = resolve_leaf(("state",), leaf, env_features(tags, space), space)
    >>> line, plan.frame_shape, notes
    ('"state" <- concat(q (quat_xyzw->rot6d))', (6,), [])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .custom import Custom
from .image import Image
from .keyed import compile_leaf
from .keys import KeyPath, path_name, quoted, range_text, signature, slot_name
from .plan import LeafPlan, StatePartPlan
from .resolve_features import Feature
from .roles import encoding_width, fixed_width
from .state import Concat, State
from .tags import ImageTag
from .text import Text

RESAMPLES = ("bilinear", "bilinear_aa")


def resolve_leaf(
    slot: KeyPath, leaf: Any, features: dict[str, Feature], observation_space: spaces.Space
) -> tuple[LeafPlan, str, list[str]]:
    """One input leaf's plan, its line of the description and its advisories; a key-based
    leaf (or a Custom one) is compiled as ``compile_spec`` would."""
    placement = quoted(slot_name(slot))
    if isinstance(leaf, Custom) or not leaf.role_based:
        plan = compile_leaf(slot, leaf, observation_space)
        return plan, f"{placement} <- {leaf.label}", []
    if isinstance(leaf, Image):
        return _resolve_image(slot, placement, leaf, features)
    if isinstance(leaf, Text):
        return _resolve_text(slot, placement, leaf, features)
    return _resolve_state(slot, placement, leaf, features)


def _missing(placement: str, kind: str, role: str, features: dict[str, Feature]) -> SpecError:
    offered = [feature.role for feature in features.values() if feature.kind == kind]
    offered_text = ", ".join(quoted(role) for role in offered) or "none"
    return SpecError(
        f"input {placement} needs {kind} role {quoted(role)}, but no env key provides it "
        f"(env {kind} roles: {offered_text}); tag it, or mark the input optional"
    )


def _resolve_image(
    slot: KeyPath, placement: str, image: Image, features: dict[str, Feature]
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
            f"input {placement}: role {quoted(image.role)} is tagged on "
            f"{quoted(path_name(feature.path))} as {feature.kind}, not an image"
        )
    if feature is None:
        if not image.optional:
            raise _missing(placement, "image", image.role, features)
        if None in (image.height, image.width, image.channels):
            raise SpecError(
                f"input {placement}: optional image {quoted(image.role)} needs height, "
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
            f"{quoted(path_name(feature.path))} has {channels}"
        )
    target = (image.height or height, image.width or width)
    source = quoted(path_name(feature.path))
    fit, resize = _fit(placement, image, source, (height, width), target)
    source_dtype = np.dtype(feature.space.dtype).name
    if image.normalize is not False and source_dtype != "uint8":
        raise SpecError(
            f"input {placement}: normalize maps uint8 [0, 255], but "
            f"{quoted(path_name(feature.path))} is {source_dtype}"
        )
    if source_dtype != "uint8" and image.dtype != "float32":
        raise SpecError(
            f"input {placement}: {quoted(path_name(feature.path))} is a {source_dtype} "
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
    feature: Feature | None,
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
    slot: KeyPath, placement: str, text: Text, features: dict[str, Feature]
) -> tuple[LeafPlan, str, list[str]]:
    feature = features.get(text.role)
    if feature is None and text.fill is None:
        raise _missing(placement, "text", text.role, features)
    if feature is not None and feature.kind != "text":
        raise SpecError(
            f"input {placement}: role {quoted(text.role)} is tagged on "
            f"{quoted(path_name(feature.path))} as {feature.kind}, not text"
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
    shown = f"fill {quoted(text.fill)}" if feature is None else quoted(path_name(feature.path))
    return plan, f"{placement} <- text {shown}", []


def _resolve_state(
    slot: KeyPath, placement: str, leaf: State | Concat, features: dict[str, Feature]
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


def _resolve_part(placement: str, part: State, features: dict[str, Feature]) -> StatePartPlan:
    role = quoted(part.role)
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
            f"input {placement}: role {role} is tagged on {quoted(path_name(feature.path))} "
            f"as {feature.kind}, not state"
        )
    encoding_from, encoding_to = feature.encoding, part.encoding
    width = feature.width
    if encoding_to is not None and encoding_from is None:
        raise SpecError(
            f"input {placement}: part {role} wants encoding {encoding_to}, but the env tags "
            f"{quoted(path_name(feature.path))} with no rotation encoding to convert from"
        )
    if encoding_to is not None:
        width = encoding_width(encoding_to)
    if encoding_to is None:
        encoding_to = encoding_from
    if part.dim is not None and part.dim > width:
        raise SpecError(
            f"input {placement}: part {role} keeps dim={part.dim}, but "
            f"{quoted(path_name(feature.path))} provides {width}"
        )
    if part.index is not None and part.index >= width:
        raise SpecError(
            f"input {placement}: part {role} selects index {part.index}, but "
            f"{quoted(path_name(feature.path))} provides {width}"
        )
    mapped = part.range is not None and feature.range is not None
    return StatePartPlan(
        source=feature.path,
        source_shape=tuple(int(size) for size in feature.space.shape),
        source_dtype=signature(feature.space)[1],
        offset=feature.offset or 0,
        width=feature.width,
        encoding_from=encoding_from,
        encoding_to=encoding_to,
        index=part.index,
        dim=part.dim,
        range_from=feature.range if mapped else None,
        range_to=part.range if mapped else None,
        name=path_name(feature.path),
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
        text += f" (range {range_text(part.range_from)}->{range_text(part.range_to)})"
    return text
