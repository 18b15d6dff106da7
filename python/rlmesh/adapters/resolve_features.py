"""What an env provides by role: its tags joined with its observation space.

The first step of resolving. Each tag is found in the space (a missing key, or a leaf of the
wrong kind, is an error naming the tagged path), its width checked against the role's and the
encoding's width law, and its range taken from the space's bounds (or, where the space leaves
the values unbounded, from the tag). The result maps each role to one ``Feature``; a role
tagged twice is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from ..errors import SpecError
from .keys import NUMERIC_SPACES, is_text_space, path_name, quoted, range_text
from .roles import encoding_width, fixed_width
from .tags import EnvTags, ImageTag, Split, StateTag, TextTag, observation_tags


@dataclass(frozen=True)
class Feature:
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


def _subspace(space: spaces.Space, path: tuple) -> spaces.Space:
    for depth, key in enumerate(path):
        where = path_name(path[:depth])
        if isinstance(key, str):
            if not isinstance(space, spaces.Dict) or key not in space.spaces:
                raise SpecError(
                    f"env tags: observation {quoted(path_name(path))} is tagged, but "
                    f"{quoted(where)} has no key {quoted(key)}"
                )
            space = space.spaces[key]
        else:
            if not isinstance(space, spaces.Tuple) or key >= len(space.spaces):
                raise SpecError(
                    f"env tags: observation {quoted(path_name(path))} is tagged, but "
                    f"{quoted(where)} has no element {key}"
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
            held = "element by element" if bounds is None else f"to {range_text(bounds)}"
            raise SpecError(
                f"env tags: state {name} ({quoted(role)}) declares range "
                f"{range_text(declared)}, but its space bounds it {held}; a tag's range is "
                f"for values the space leaves unbounded: drop it, or fix the space's bounds"
            )
    return declared


def env_features(env_tags: EnvTags | None, observation_space: spaces.Space) -> dict[str, Feature]:
    """Every role the env's observation tags provide, checked against the space.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh import adapters
        >>> tags = adapters.EnvTags(observation={"q": adapters.StateTag(adapters.EEF_POS)})
        >>> space = gym.spaces.Dict({"q": gym.spaces.Box(-1, 1, (3,), np.float32)})
        >>> found = env_features(tags, space)[adapters.EEF_POS]
        >>> found.kind, found.path, found.width, found.range
        ('state', ('q',), 3, (-1.0, 1.0))
    """
    features: dict[str, Feature] = {}
    if env_tags is None or env_tags.observation is None:
        return features
    for path, tag in observation_tags(env_tags.observation):
        space = _subspace(observation_space, path)
        name = quoted(path_name(path))
        found: list[Feature] = []
        if isinstance(tag, ImageTag):
            if not (isinstance(space, spaces.Box) and len(space.shape) == 3):
                raise SpecError(
                    f"env tags: image {name} must be a rank-3 Box ({tag.layout}), got {space}"
                )
            found.append(Feature(tag.role, "image", path, space, tag))
        elif isinstance(tag, TextTag):
            if not is_text_space(space):
                raise SpecError(f"env tags: text {name} must be a text space, got {space}")
            found.append(Feature(tag.role, "text", path, space, tag))
        else:
            if not isinstance(space, NUMERIC_SPACES):
                raise SpecError(f"env tags: state {name} must be a numeric space, got {space}")
            width = math.prod(space.shape)
            if isinstance(tag, StateTag):
                _check_width(name, tag.role, tag.encoding, width)
                found.append(
                    Feature(
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
                    f"env tags: role {quoted(feature.role)} is tagged twice, on "
                    f"{quoted(path_name(features[feature.role].path))} and {name}"
                )
            features[feature.role] = feature
    return features


def _check_width(name: str, role: str, encoding: str | None, width: int) -> None:
    if encoding is not None and encoding_width(encoding) != width:
        raise SpecError(
            f"env tags: state {name} ({quoted(role)}) declares encoding {encoding} "
            f"({encoding_width(encoding)} dims) but the space width is {width}"
        )
    expected = fixed_width(role)
    if expected is not None and width != expected:
        raise SpecError(
            f"env tags: state {name} ({quoted(role)}) is {width}-D, but the role is "
            f"{expected}-D by convention"
        )


def _split_features(
    name: str, path: tuple, space: spaces.Space, split: Split, width: int
) -> list[Feature]:
    if width != split.dim:
        raise SpecError(
            f"env tags: split {name} has fields of {split.dim} dims in all, but the space "
            f"width is {width}"
        )
    found, offset = [], 0
    for field in split.fields:
        if field.role is not None:
            found.append(
                Feature(
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
