"""The ``Plan``: a spec compiled against one pair of spaces, pure data the cores execute.

A Plan holds one ``LeafPlan`` per slot of the model's payload (how it is assembled from a
lane's raw observation; a role-based state's parts are ``StatePartPlan``) and one
``ActionLeafPlan`` per leaf of the action space (how the model's action is brought into it;
a role-based layout's slices are ``ActionSegmentPlan``). The plan's arrays are read-only
copies (``read_only``), so a frozen plan cannot change under the cores.

A plan describes itself: one line per leaf for a key-based plan (written here), or the
adapters-v1 description the role resolver wrote; ``advisories`` says what it loses.

Example:
    >>> import gymnasium as gym
    >>> from rlmesh.adapters import compile_spec
    >>> plan = compile_spec(None, gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    >>> plan.observation[0].frame_shape, plan.action[0].kind
    ((), 'discrete')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .keys import KeyPath, array_text, path_text
from .roles import encoding_width


@dataclass(frozen=True)
class LeafPlan:
    """How one slot of the model's payload is assembled from one lane's raw observation.

    An ``"array"`` leaf reads its ``sources``, transposes the single source by ``transpose``
    or flattens and concatenates them (``flatten``), casts to ``dtype``, computes
    ``x * scale + offset``, and stacks the last ``stack`` frames along a new leading axis
    (oldest first). A ``"text"`` leaf passes its source's string through; a ``"custom"`` leaf
    calls ``fn`` on the whole raw observation.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import Image, ModelSpec
        >>> space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
        >>> plan = ModelSpec(input=Image(layout="chw")).compile(space, gym.spaces.Discrete(2))
        >>> leaf = plan.observation[0]
        >>> leaf.slot, leaf.sources, leaf.transpose, leaf.frame_shape, leaf.leaf
        ((), ((),), (2, 0, 1), (3, 84, 84), 'Image(key=None)')
    """

    slot: KeyPath  # () = the payload is this bare leaf; ("pixels",) = payload["pixels"]
    kind: str  # "array" | "text" | "custom"
    sources: tuple[KeyPath, ...]  # observation paths read, in order; () = the whole observation
    source_shapes: tuple[tuple[int, ...], ...]
    source_dtypes: tuple[str, ...]  # numpy dtype names, as the space declares them
    transpose: tuple[int, ...] | None  # axes applied to the single source, None = none
    flatten: bool  # flatten each source and concatenate
    dtype: str  # output dtype name
    scale: float  # out = cast(x) * scale + offset
    offset: float
    stack: int  # frame-stack depth, 1 = none
    frame_shape: tuple[int, ...]  # one lane's output for one frame (no lane or stack axis)
    fn: Callable[[Any], Any] | None = None  # Custom only
    leaf: str = ""  # the leaf as messages name it, e.g. 'Image(key="pixels")'
    # Role-based leaves ("image", "state"; "text" with a fill), planned by ``resolve``.
    src_layout: str = "hwc"  # image: how the env stores it
    flip: bool = False  # image: rotate 180 degrees (the two sides disagree on upside_down)
    resize: tuple[int, int] | None = None  # image: resized (height, width), before any fit
    fit: str = "stretch"  # image: "crop" / "pad" the resized frame to frame_shape's centre
    resample: str = "bilinear"  # image: "bilinear" | "bilinear_aa"
    lead_dims: int = 0  # image: leading singleton axes (inside frame_shape)
    zero_fill: bool = False  # image: no source; every frame is `fill_value`
    fill_value: float = 0.0
    parts: tuple[StatePartPlan, ...] = ()  # state: concatenated in order
    pad_to: int | None = None  # state: zero-pad to this length
    container: str = "array"  # state: "array" | "list"; text: "str" | "list"
    text_fill: str | None = None  # text: the string when the env has no such role


@dataclass(frozen=True)
class ActionLeafPlan:
    """How the model's action for one leaf of the action space is brought into that space.

    A ``"box"`` leaf maps ``rescale`` linearly onto ``[low, high]`` when set, clips to the
    bounds when ``clip``, then casts to ``dtype``. The other kinds are cast to ``dtype``; their
    valid values are ``start..start+n-1`` (discrete), ``nvec_start..nvec_start+nvec-1``
    (multi_discrete) and 0..1 (multi_binary). Arrays are float64 / int64 and read-only.

    Example:
        >>> import gymnasium as gym
        >>> from rlmesh.adapters import compile_spec
        >>> plan = compile_spec(None, gym.spaces.Discrete(4), gym.spaces.Discrete(3, start=1))
        >>> leaf = plan.action[0]
        >>> leaf.kind, leaf.shape, leaf.dtype, leaf.start, leaf.n
        ('discrete', (), 'int64', 1, 3)
    """

    path: KeyPath  # () for a non-Dict action space; the leaf's path inside a Dict action space
    kind: str  # "box" | "discrete" | "multi_discrete" | "multi_binary"
    shape: tuple[int, ...]
    dtype: str
    low: np.ndarray | None  # Box bounds (float64 arrays of `shape`), else None
    high: np.ndarray | None
    start: int = 0  # Discrete
    n: int = 0  # Discrete
    nvec: np.ndarray | None = None  # MultiDiscrete
    rescale: tuple[float, float] | None = None
    clip: bool = False
    nvec_start: np.ndarray | None = None  # MultiDiscrete: the lowest value of each entry
    # A role-based layout: the model's vector of `model_dim` values is mapped, segment by
    # segment, onto the env's vector (then clipped to `layout_clip`) before the Box cast.
    segments: tuple[ActionSegmentPlan, ...] | None = None
    model_dim: int = 0
    layout_clip: tuple[float, float] | None = None


@dataclass(frozen=True)
class StatePartPlan:
    """One part of a role-based state: a slice of one source, converted; or zeros.

    The source is flattened; ``offset``/``width`` select its slice (a Split field), the
    rotation is re-encoded ``encoding_from -> encoding_to``, then ``index`` keeps one element
    or ``dim`` the leading ones, then ``range_from -> range_to`` maps affinely. A part with
    no source is ``zeros`` zeros (an optional role the env lacks).
    """

    source: KeyPath | None
    source_shape: tuple[int, ...] = ()
    source_dtype: str = "float32"
    offset: int = 0
    width: int = 0
    encoding_from: str | None = None
    encoding_to: str | None = None
    index: int | None = None
    dim: int | None = None
    range_from: tuple[float, float] | None = None
    range_to: tuple[float, float] | None = None
    zeros: int = 0
    name: str = ""  # the source as describe shows it

    @property
    def size(self) -> int:
        """The number of values this part contributes."""
        if self.source is None:
            return self.zeros
        if self.index is not None:
            return 1
        width = self.width
        if self.encoding_to is not None and self.encoding_to != self.encoding_from:
            width = encoding_width(self.encoding_to)
        return width if self.dim is None else self.dim


@dataclass(frozen=True)
class ActionSegmentPlan:
    """One env actuator of a role-based layout: read from ``model[start:stop]``, or a fill.

    Applied in this order: rotation ``encoding_from -> encoding_to``, range map
    ``range_from -> range_to``, the model side's scale, invert, threshold, then the env
    side's, then the binary snap (``>= 0`` -> +1, else -1; a raw 0 stays 0 unless a
    threshold is declared), then the clamp to ``clip``. In float32.
    """

    role: str | None
    start: int = 0
    stop: int = 0
    encoding_from: str | None = None
    encoding_to: str | None = None
    range_from: tuple[float, float] | None = None
    range_to: tuple[float, float] | None = None
    model_scale: float | None = None
    model_invert: bool = False
    model_threshold: float | None = None
    scale: float | None = None
    invert: bool = False
    threshold: float | None = None
    binary: bool = False
    clip: tuple[float, float] | None = None
    fill: float | None = None  # an opaque (or optional, unmatched) actuator: `width` of these
    width: int = 0


@dataclass(frozen=True)
class Plan:
    """A spec compiled against one pair of spaces: every observation leaf and action leaf.

    ``observation_keys`` lists every key path of a Dict observation space (parents before
    their children), so ``advisories`` can name the keys the model never sees.

    Example:
        >>> import gymnasium as gym
        >>> from rlmesh.adapters import compile_spec
        >>> env = gym.make("CartPole-v1")
        >>> plan = compile_spec(None, env.observation_space, env.action_space)
        >>> print(plan.describe())
        input: obs float32[4] -> float32[4]
        action: cast to int64[] in 0..1
    """

    observation: tuple[LeafPlan, ...]
    action: tuple[ActionLeafPlan, ...]
    observation_keys: tuple[KeyPath, ...] = ()
    # A plan from ``resolve``: its adapters-v1 description and advisories.
    description: str | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the plan does, one line per observation leaf, then one per action leaf.

        Example:
            >>> import gymnasium as gym
            >>> import numpy as np
            >>> from rlmesh.adapters import ModelSpec, State, Text
            >>> space = gym.spaces.Dict({"lang": gym.spaces.Text(8), "q": gym.spaces.Discrete(3)})
            >>> spec = ModelSpec(input={"prompt": Text("lang"), "q": State("q", dtype="int64")})
            >>> print(spec.compile(space, gym.spaces.Box(-1, 1, (2,))).describe())
            prompt: obs["lang"] -> str
            q: obs["q"] int64[] -> int64[1] (flatten)
            action: clip to [-1, 1], cast to float32[2]
        """
        if self.description is not None:
            return self.description
        lines = [_describe_observation_leaf(leaf) for leaf in self.observation]
        lines += [describe_action_leaf(leaf) for leaf in self.action]
        return "\n".join(lines)

    def advisories(self) -> list[str]:
        """What the plan loses: lossy casts, then observation keys no leaf reads.

        Example:
            >>> import gymnasium as gym
            >>> import numpy as np
            >>> from rlmesh.adapters import Image, ModelSpec
            >>> space = gym.spaces.Dict({
            ...     "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
            ...     "joints": gym.spaces.Box(-1, 1, (7,), np.float32),
            ... })
            >>> ModelSpec(input=Image("pixels")).compile(space, gym.spaces.Discrete(2)).advisories()
            ['obs["joints"] is never read: no leaf of the spec names it.']
        """
        if self.description is not None:
            return list(self.notes)
        return _lossy_casts(self.observation) + _unread_keys(
            self.observation, self.observation_keys
        )


def read_only(values: Any, dtype: type) -> np.ndarray:
    """A private, read-only copy, so a frozen plan cannot change under the cores."""
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


# ----------------------------------------------------------------------------------------------
# Describing and advising


def _describe_observation_leaf(leaf: LeafPlan) -> str:
    """One line of ``Plan.describe`` for a key-based observation leaf."""
    slot = ".".join(leaf.slot) or "input"
    if leaf.kind == "custom":
        return f"{slot}: {leaf.leaf} on the whole observation"
    if leaf.kind == "text":
        return f"{slot}: {path_text(leaf.sources[0])} -> str"
    sources = " + ".join(
        f"{path_text(path)} {array_text(dtype, shape)}"
        for path, shape, dtype in zip(
            leaf.sources, leaf.source_shapes, leaf.source_dtypes, strict=True
        )
    )
    notes = []
    if leaf.transpose is not None:
        notes.append("chw")  # the only transpose a spec can ask for
    if leaf.flatten:
        notes.append("flatten")
    if (leaf.scale, leaf.offset) != (1.0, 0.0):
        notes.append(f"x/255 -> [{leaf.offset:g}, {leaf.offset + 255.0 * leaf.scale:g}]")
    if leaf.stack > 1:
        notes.append(f"stack {leaf.stack}")
    output = array_text(leaf.dtype, leaf.frame_shape)
    return f"{slot}: {sources} -> {output}" + (f" ({', '.join(notes)})" if notes else "")


def describe_action_leaf(leaf: ActionLeafPlan) -> str:
    """One line of ``Plan.describe`` for a key-based action leaf (and a role-based spec's
    keyed output)."""
    steps = []
    if leaf.kind == "box":
        bounds = _bounds_text(leaf.low, leaf.high)
        if leaf.rescale is not None:
            steps.append(f"rescale [{leaf.rescale[0]:g}, {leaf.rescale[1]:g}] onto {bounds}")
        if leaf.clip:
            steps.append(f"clip to {bounds}")
    cast = f"cast to {array_text(leaf.dtype, leaf.shape)}"
    if leaf.kind == "discrete":
        cast += f" in {leaf.start}..{leaf.start + leaf.n - 1}"
    elif leaf.kind == "multi_discrete":
        lowest = leaf.nvec_start.tolist()
        cast += f" in {lowest}..{(leaf.nvec_start + leaf.nvec - 1).tolist()}"
    elif leaf.kind == "multi_binary":
        cast += " in 0..1"
    steps.append(cast)
    return f"{path_text(leaf.path, 'action')}: {', '.join(steps)}"


def _bounds_text(low: np.ndarray, high: np.ndarray) -> str:
    """``[-2, 2]`` when every element shares its bounds, else per element."""
    if low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0]):
        return f"[{low.flat[0]:g}, {high.flat[0]:g}]"
    return "the per-element bounds"


def _lossy_casts(observation: tuple[LeafPlan, ...]) -> list[str]:
    """A sentence per source that the leaf's cast cannot hold exactly (numpy's "safe" rule)."""
    return [
        f"{leaf.leaf} casts {path_text(path)} from {dtype} to {leaf.dtype}, which can lose "
        f"precision."
        for leaf in observation
        if leaf.kind == "array"
        for path, dtype in zip(leaf.sources, leaf.source_dtypes, strict=True)
        if not np.can_cast(dtype, leaf.dtype, casting="safe")
    ]


def _unread_keys(observation: tuple[LeafPlan, ...], keys: tuple[KeyPath, ...]) -> list[str]:
    """A sentence per observation key no leaf reads (the outermost one of an unread subtree)."""
    if any(leaf.kind == "custom" for leaf in observation):
        return []  # a Custom leaf sees the whole observation
    sources = [path for leaf in observation for path in leaf.sources]
    unread: list[KeyPath] = []
    for key in keys:
        inside_unread = any(key[: len(outer)] == outer for outer in unread)
        read = any(_related(key, source) for source in sources)
        if not (inside_unread or read):
            unread.append(key)
    return [f"{path_text(key)} is never read: no leaf of the spec names it." for key in unread]


def _related(key: KeyPath, source: KeyPath) -> bool:
    """Whether reading ``source`` reads some of ``key``: one path is a prefix of the other."""
    shorter = min(len(key), len(source))
    return key[:shorter] == source[:shorter]
