"""The ``Image`` leaf: an image input, read by observation key or paired by role.

A key-based image is read as the env emits it (height, width, channels) and may be moved to
channels-first, cast, normalized and stacked. A role-based image pairs with an env's
``ImageTag`` and may also be resized, fitted to a new aspect, flipped and zero-filled; the
role resolver plans those steps. Both forms are pure data and round-trip through a dict: the
key-based form, or adapters-v1 (``IMAGE_V1_ALWAYS`` and ``IMAGE_V1_OPTIONS``).

Example:
    >>> image = Image("image/primary", size=224, fit="crop")
    >>> image.to_dict()["height"], image.to_dict()["fit"]
    (224, 'crop')
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .checks import check_choice, check_int, check_stack, value_range
from .keys import Key, KeyPath, key_text
from .node import SpecNode, keyed_only, leaf_source, to_json

IMAGE_LAYOUTS = ("hwc", "chw")
IMAGE_DTYPES = ("uint8", "float32")
IMAGE_FITS = ("stretch", "crop", "pad")
# Environments emit images height-width-channels (the Gymnasium convention).
CHW_AXES = (2, 0, 1)
# The fields adapters-v1 always writes for an image, then those written only when not at
# their defaults.
IMAGE_V1_ALWAYS = (
    "role",
    "dtype",
    "height",
    "width",
    "layout",
    "lead_dims",
    "normalize",
    "resample",
    "upside_down",
)
IMAGE_V1_OPTIONS = {
    "channels": None,
    "allow_upscale": False,
    "fit": None,
    "optional": False,
    "fill": None,
    "stack": 1,
}


@dataclass(frozen=True, init=False)
class Image(SpecNode):
    """An image input: read by observation key, or paired by role with an env's ``ImageTag``.

    Args:
        source: a role (``IMAGE_PRIMARY``: a str with a ``/``) or an observation key (None =
            the whole observation, a tuple = a nested path); or pass ``key=`` / ``role=``.
        layout: the layout the *model* wants: ``"hwc"`` or ``"chw"``.
        dtype: ``"uint8"`` or ``"float32"``.
        normalize: False, True (uint8 [0, 255] onto [0, 1]) or a range ``(lo, hi)``; needs
            ``dtype="float32"``.
        stack: frames stacked along a new leading axis, oldest first (1 = none, at most 64).
            The first frame of an episode fills the whole window, as Gymnasium's
            ``FrameStackObservation(padding_type="reset")`` does.
        size, height, width: the target size (``size`` sets both); None keeps the env's.
        resample: ``"bilinear"`` (half-pixel centres, as OpenCV ``INTER_LINEAR``) or
            ``"bilinear_aa"`` (antialiased, as Pillow's ``BILINEAR``).
        allow_upscale: permit a target larger than the env's image.
        fit: how an aspect change is reconciled: ``"stretch"`` (scale each axis alone),
            ``"crop"`` (scale uniformly to cover the target, then cut its centre) or ``"pad"``
            (scale uniformly to fit inside, then centre it on zeros); or a preference list,
            e.g. ``("crop", "pad")``: the first that needs no disallowed upscale is used. None:
            an aspect change is a resolve error.
        upside_down: the model was trained on frames rotated 180 degrees.
        lead_dims: leading singleton axes to add (a batch or time axis the model expects).
        channels: the channel count the model wants (a mismatch is then a resolve error).
        optional, fill: a blank frame (``fill``, default 0) when the env has no such camera;
            needs ``height``, ``width`` and ``channels``.

        Every option after ``stack`` needs a role-based leaf.

    Example:
        >>> image = Image("pixels", layout="chw", dtype="float32", normalize=True, stack=4)
        >>> image.key, image.normalize, image.role
        (('pixels',), (0.0, 1.0), None)
        >>> Image("image/primary", size=224).role, Image("image/primary", size=224).height
        ('image/primary', 224)
    """

    key: KeyPath
    role: str | None
    layout: str
    dtype: str
    normalize: bool | tuple[float, float]
    stack: int
    height: int | None
    width: int | None
    channels: int | None
    lead_dims: int
    upside_down: bool
    resample: str
    allow_upscale: bool
    fit: str | tuple[str, ...] | None
    optional: bool
    fill: float | None
    extensions: Mapping[str, Any]

    _KEYED = ("key", "layout", "dtype", "normalize", "stack")

    def __init__(
        self,
        source: Key = None,
        *,
        key: Key = None,
        role: str | None = None,
        layout: str = "hwc",
        dtype: str = "uint8",
        normalize: bool | tuple[float, float] = False,
        stack: int = 1,
        size: int | None = None,
        height: int | None = None,
        width: int | None = None,
        channels: int | None = None,
        lead_dims: int = 0,
        upside_down: bool = False,
        resample: str = "bilinear",
        allow_upscale: bool = False,
        fit: str | Sequence[str] | None = None,
        optional: bool = False,
        fill: float | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        path, role = leaf_source("Image", source, key, role)
        if isinstance(fit, (list, tuple)):
            fit = tuple(fit)
        if size is not None:
            if height is not None or width is not None:
                raise SpecError("Image: pass size= or height=/width=, not both")
            height = width = size
        values = dict(
            key=path,
            role=role,
            layout=layout,
            dtype=dtype,
            normalize=normalize,
            stack=stack,
            height=height,
            width=width,
            channels=channels,
            lead_dims=lead_dims,
            upside_down=upside_down,
            resample=resample,
            allow_upscale=allow_upscale,
            fit=fit,
            optional=optional,
            fill=fill,
            extensions=dict(extensions or {}),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        label = self.label
        keyed_only(
            label,
            role,
            {
                "size/height/width": ((height, width), (None, None)),
                "channels": (channels, None),
                "lead_dims": (lead_dims, 0),
                "upside_down": (upside_down, False),
                "resample": (resample, "bilinear"),
                "allow_upscale": (allow_upscale, False),
                "fit": (fit, None),
                "optional": (optional, False),
                "fill": (fill, None),
            },
        )
        check_choice(label, "layout", layout, IMAGE_LAYOUTS)
        check_choice(label, "dtype", dtype, IMAGE_DTYPES)
        for mode in fit if isinstance(fit, tuple) else () if fit is None else (fit,):
            check_choice(label, "fit", mode, IMAGE_FITS)
        if fit == ():
            raise SpecError(f"{label}: fit must name at least one of stretch, crop, pad")
        check_stack(label, stack)
        for name in ("height", "width", "channels"):
            check_int(label, name, getattr(self, name), 1)
        check_int(label, "lead_dims", lead_dims, 0, allow_none=False)
        if fill is not None and not optional:
            raise SpecError(f"{label}: fill is the blank frame's value; it needs optional=True")
        if role is None:
            object.__setattr__(self, "normalize", self._normalize_range())
        elif normalize is not False:
            self._normalize_range()  # checked; kept as written so v1 round-trips exactly
            if isinstance(normalize, (list, tuple)):
                object.__setattr__(self, "normalize", self._normalize_range())

    def _normalize_range(self) -> bool | tuple[float, float]:
        """``normalize`` stored: False, or the range ``(lo, hi)`` that True abbreviates."""
        if self.normalize is False:
            return False
        if self.dtype != "float32":
            raise SpecError(
                f'{self.label}: normalize produces fractions, so it needs dtype="float32", '
                f"got dtype={json.dumps(self.dtype)}"
            )
        if self.normalize is True:
            return (0.0, 1.0)
        return value_range(self.label, "normalize", self.normalize)

    @property
    def role_based(self) -> bool:
        return self.role is not None

    @property
    def label(self) -> str:
        """The leaf as messages name it: ``Image(key="pixels")`` or ``Image("image/primary")``."""
        if self.role is not None:
            return f"Image({json.dumps(self.role)})"
        return f"Image(key={key_text(self.key)})"

    def _v1_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "image"}
        data.update({name: to_json(getattr(self, name)) for name in IMAGE_V1_ALWAYS})
        for name, default in IMAGE_V1_OPTIONS.items():
            if getattr(self, name) != default:
                data[name] = getattr(self, name)
        return {**data, **self.extensions}
