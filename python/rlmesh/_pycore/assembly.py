"""Observation assembly: each lane's raw observation -> the model's input, fused across lanes.

Mirrors ``rust/src/assembly.rs`` name for name. The plan (``rlmesh.adapters.Plan.observation``)
says, per slot of the model's payload, which observation keys to read and how to shape them;
this file applies it to K lanes at once and keeps the frame-stack windows.

Frame stacks are keyed by episode id, not by lane: a window belongs to one episode and is
evicted when it ends, so a lane's next episode starts from a fresh window. The first frame of
an episode fills the whole window, and frames are ordered oldest to newest along a new leading
axis, as Gymnasium's ``FrameStackObservation(env, k, padding_type="reset")`` does.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ObservationError
from .args import path_text, same_length, vector
from .resize import resize
from .rotations import convert

ARRAY, TEXT, CUSTOM = "array", "text", "custom"
# Role-based leaves (``rlmesh.adapters.resolve``): an image converted per lane, and a state
# concatenated from converted parts.
IMAGE, STATE = "image", "state"
FRAMED = (ARRAY, IMAGE, STATE)  # kinds whose frames can be stacked
# Where a payload's arrays start: XLA (JAX on the CPU) shares a buffer only at this alignment
# and copies any other, and numpy's own allocations are 16-byte aligned.
PAYLOAD_ALIGNMENT = 64


def read_source(raw_observation: Any, path: Sequence[str], lane: int) -> Any:
    """The value at ``path`` in one lane's raw observation."""
    value = raw_observation
    for depth, key in enumerate(path):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise ObservationError(
                f'lane {lane}: {path_text("obs", path[:depth])} has no key "{key}", which the '
                f"model's input reads as {path_text('obs', path)}"
            ) from None
    return value


class ObservationAssembler:
    """Builds the model's input for a group of lanes from their raw observations.

    Args:
        observation_leaves: ``Plan.observation``, the compiled leaves (``LeafPlan``).

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import ModelSpec, State
        >>> space = gym.spaces.Box(-1, 1, (3,), np.float32)
        >>> plan = ModelSpec(input={"state": State(stack=2)}).compile(space, space)
        >>> assembler = ObservationAssembler(plan.observation)
        >>> frames = [np.full(3, lane, np.float32) for lane in (1, 2)]
        >>> payload = assembler.assemble(frames, np.array([10, 11]))
        >>> payload["state"].shape  # [K lanes, stack, frame]
        (2, 2, 3)
        >>> payload["state"][1].tolist()  # first frame fills the window
        [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """

    def __init__(self, observation_leaves: Sequence[Any]) -> None:
        self._leaves = tuple(observation_leaves)
        for leaf in self._leaves:
            affine = (float(leaf.scale), float(leaf.offset)) != (1.0, 0.0)
            if affine and np.dtype(leaf.dtype).kind != "f":
                raise ValueError(
                    f"{leaf.leaf}: scale and offset need a float dtype, got {leaf.dtype}"
                )
            if leaf.kind == ARRAY and leaf.transpose is not None:
                for shape in leaf.source_shapes:
                    if sorted(leaf.transpose) != list(range(len(shape))):
                        raise ValueError(
                            f"{leaf.leaf}: transpose {tuple(leaf.transpose)} is not a "
                            f"permutation of the source's {len(shape)} axes"
                        )
        self._verbatim = [_verbatim(leaf) for leaf in self._leaves]
        # Per leaf: episode id -> the last `stack` frames, oldest first (stacked leaves only).
        self._windows: list[dict[int, deque[np.ndarray]]] = [{} for _ in self._leaves]

    @property
    def window_count(self) -> int:
        """Episodes holding at least one frame window."""
        return len({episode for windows in self._windows for episode in windows})

    def assemble(self, raw_lane_observations: Sequence[Any], episode_ids: Any) -> Any:
        """The model's input for K lanes: each leaf gains a leading lane axis.

        Args:
            raw_lane_observations: K raw observations, one per lane, as the env returned them.
            episode_ids: ``[K]`` int, the episode each observation belongs to (the frame-stack
                key).

        Returns:
            The payload: the bare leaf's value, or a dict (nested like the spec) of them. An
            array leaf is ``[K, *frame_shape]``, or ``[K, stack, *frame_shape]`` when stacked;
            a text leaf is a list of K strings; a custom leaf stacks its K results (a list if
            they are strings).

        Raises:
            ObservationError: a lane's observation lacks a key or has the wrong shape.
        """
        ids = self._check(raw_lane_observations, episode_ids)
        payload: Any = None
        for index, leaf in enumerate(self._leaves):
            value = self._assemble_leaf(index, leaf, raw_lane_observations, ids)
            payload = value if not leaf.slot else _placed(payload, tuple(leaf.slot), value)
        return payload

    def _assemble_rows(
        self, raw_lane_observations: Sequence[Any], episode_ids: list[int], holders: int
    ) -> list[np.ndarray] | None:
        """Each lane's model input as an array of its own, when the plan is one array leaf at
        the payload's root (``assemble`` then returns one ``[K, ...]`` array): row ``k`` of
        that payload, without the ``[K, ...]`` array around the rows. None for any other plan.

        For a caller that hands each lane's input to a per-lane corner: the same frame windows
        advance, and the same errors are raised in the same order, as ``assemble``.

        A lane whose row would be a copy of its raw observation as it is (a verbatim leaf) gets
        the observation itself when nothing but the caller's ``holders`` references hold it
        (``_lone_array``): nobody can change or see it while the model has it, so it is what a
        fresh copy would be, without the copy.
        """
        if len(self._leaves) != 1:
            return None
        leaf = self._leaves[0]
        if leaf.kind != ARRAY or leaf.slot:
            return None
        verbatim = self._verbatim[0]
        lone = [
            verbatim and _lone_array(raw_lane_observations, lane, leaf, holders)
            for lane in range(len(episode_ids))
        ]
        if all(lone):
            return list(raw_lane_observations)
        rows = self._assemble_leaf(0, leaf, raw_lane_observations, episode_ids)
        # Each row copied out: an array of its own, as the Rust core makes it.
        return [
            raw_lane_observations[lane] if lone[lane] else row.copy()
            for lane, row in enumerate(rows)
        ]

    def push(self, raw_lane_observations: Sequence[Any], episode_ids: Any) -> None:
        """Add each lane's frame to its episode's windows without building a payload.

        For steps where a lane replays a queued action: the stack still sees every frame.
        """
        ids = self._check(raw_lane_observations, episode_ids)
        for index, leaf in enumerate(self._leaves):
            if leaf.kind in FRAMED and leaf.stack > 1:
                for lane, (raw, episode_id) in enumerate(
                    zip(raw_lane_observations, ids, strict=True)
                ):
                    self._advance_window(index, leaf, episode_id, _frame(leaf, raw, lane))

    def evict(self, episode_id: int) -> None:
        """Forget an ended episode's windows (no-op if it has none)."""
        for windows in self._windows:
            windows.pop(int(episode_id), None)

    def _check(self, raw_lane_observations: Sequence[Any], episode_ids: Any) -> list[int]:
        ids = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids, raw_lane_observations)
        return ids.tolist()

    def _assemble_leaf(
        self, index: int, leaf: Any, raw_lane_observations: Sequence[Any], ids: list[int]
    ) -> Any:
        lanes = range(len(ids))
        if leaf.kind == TEXT:
            texts = [
                _text(leaf, raw, lane)
                for lane, raw in zip(lanes, raw_lane_observations, strict=True)
            ]
            return [[text] for text in texts] if leaf.container == "list" else texts
        if leaf.kind == CUSTOM:
            return _custom(leaf, [leaf.fn(raw) for raw in raw_lane_observations])
        stack_shape = (leaf.stack,) if leaf.stack > 1 else ()
        out = aligned_empty((len(ids), *stack_shape, *leaf.frame_shape), leaf.dtype)
        for lane, raw, episode_id in zip(lanes, raw_lane_observations, ids, strict=True):
            frame = _frame(leaf, raw, lane)
            if leaf.stack > 1:
                out[lane] = np.stack(self._advance_window(index, leaf, episode_id, frame))
            else:
                out[lane] = frame
        if leaf.kind == STATE and leaf.container == "list":
            return out.tolist()  # plain floats, one list per lane
        return out

    def _advance_window(
        self, index: int, leaf: Any, episode_id: int, frame: np.ndarray
    ) -> deque[np.ndarray]:
        windows = self._windows[index]
        window = windows.get(episode_id)
        if window is None:
            window = windows[episode_id] = deque([frame] * leaf.stack, maxlen=leaf.stack)
        else:
            window.append(frame)
        return window


def _verbatim(leaf: Any) -> bool:
    """Whether the leaf's value is the raw observation as it is: one array read whole at the
    root, in the leaf's dtype and shape, with no transpose, scale, stack or conversion."""
    return (
        leaf.kind == ARRAY
        and len(leaf.sources) == 1
        and not leaf.sources[0]
        and tuple(leaf.source_shapes[0]) == tuple(leaf.frame_shape)
        and leaf.transpose is None
        and (float(leaf.scale), float(leaf.offset)) == (1.0, 0.0)
        and leaf.stack == 1
        and leaf.fn is None
    )


def _lone_array(values: Sequence[Any], lane: int, leaf: Any, holders: int) -> bool:
    """Whether ``values[lane]`` is an array a model may have in place of a fresh copy of it:
    an ``ndarray`` itself (no subclass) of the leaf's dtype and frame shape, C-contiguous,
    writeable and owning its data, referenced only by the caller's ``holders`` references (an
    env that keeps the array it returned, to fill it again, holds one more)."""
    # Counted before any name here refers to it; less the reference the argument holds.
    if sys.getrefcount(values[lane]) - 1 != holders:
        return False
    value = values[lane]
    if type(value) is not np.ndarray:
        return False
    flags = value.flags
    return (
        flags.c_contiguous
        and flags.writeable
        and flags.owndata
        and value.base is None
        and value.shape == tuple(leaf.frame_shape)
        and value.dtype == np.dtype(leaf.dtype)
    )


def _read(raw_observation: Any, path: Sequence[str], shape: Sequence[int], lane: int) -> Any:
    """The value at ``path``, checked against the space's shape."""
    value = np.asarray(read_source(raw_observation, path, lane))
    if value.shape != tuple(shape):
        raise ObservationError(
            f"lane {lane}: {path_text('obs', path)} has shape {value.shape} but the "
            f"observation space declares {tuple(shape)}"
        )
    return value


def _frame(leaf: Any, raw_observation: Any, lane: int) -> np.ndarray:
    """One lane's frame of an array leaf: read, check shape, cast, transpose or flatten, scale."""
    if leaf.kind == IMAGE:
        return _image_frame(leaf, raw_observation, lane)
    if leaf.kind == STATE:
        return _state_frame(leaf, raw_observation, lane)
    parts = []
    for path, shape in zip(leaf.sources, leaf.source_shapes, strict=True):
        value = _read(raw_observation, path, shape, lane)
        # A copy: envs may reuse their observation buffers, and windows keep frames.
        parts.append(np.array(value, dtype=leaf.dtype, copy=True))
    if leaf.flatten:
        frame = np.concatenate([part.ravel() for part in parts])
    elif leaf.transpose is not None:
        frame = np.ascontiguousarray(parts[0].transpose(leaf.transpose))
    else:
        frame = parts[0]
    if (leaf.scale, leaf.offset) != (1.0, 0.0):
        dtype = np.dtype(leaf.dtype).type
        frame = frame * dtype(leaf.scale) + dtype(leaf.offset)
    return frame


def _image_frame(leaf: Any, raw_observation: Any, lane: int) -> np.ndarray:
    """One lane's image: to hwc, flip 180, resize, crop or pad, cast and scale, to the model's
    layout."""
    dtype = np.dtype(leaf.dtype)
    if leaf.zero_fill:
        return np.full(tuple(leaf.frame_shape), leaf.fill_value, dtype)
    image = _read(raw_observation, leaf.sources[0], leaf.source_shapes[0], lane)
    if leaf.src_layout == "chw":
        image = image.transpose(1, 2, 0)
    if leaf.flip:
        image = image[::-1, ::-1]
    if leaf.resize is not None:
        image = resize(np.ascontiguousarray(image), leaf.resize[0], leaf.resize[1], leaf.resample)
    if leaf.fit != "stretch":
        image = _fit_centred(image, leaf)
    frame = np.array(image, dtype=dtype, copy=True)
    if (leaf.scale, leaf.offset) != (1.0, 0.0):
        frame = frame * dtype.type(leaf.scale) + dtype.type(leaf.offset)
    if leaf.transpose is not None:
        frame = frame.transpose(leaf.transpose)
    return np.ascontiguousarray(frame).reshape(tuple(leaf.frame_shape))


def _fit_centred(image: np.ndarray, leaf: Any) -> np.ndarray:
    """The resized ``[h, w, c]`` image cut (``crop``) or placed on zeros (``pad``) at the
    centre of the leaf's frame, rounding its offset down."""
    out = leaf.frame_shape[leaf.lead_dims :]
    height, width = (out[1], out[2]) if leaf.transpose is not None else (out[0], out[1])
    top, left = abs(image.shape[0] - height) // 2, abs(image.shape[1] - width) // 2
    if leaf.fit == "crop":
        return image[top : top + height, left : left + width]
    canvas = np.zeros((height, width, image.shape[2]), image.dtype)
    canvas[top : top + image.shape[0], left : left + image.shape[1]] = image
    return canvas


def _state_frame(leaf: Any, raw_observation: Any, lane: int) -> np.ndarray:
    """One lane's state: each part read, sliced, re-encoded, cut and range-mapped; then
    concatenated, zero-padded and cast. In float64 until the cast."""
    pieces = []
    for part in leaf.parts:
        if part.source is None:
            pieces.append(np.zeros(part.zeros))
            continue
        value = _read(raw_observation, part.source, part.source_shape, lane)
        values = value.astype(np.float64).reshape(-1)[part.offset : part.offset + part.width]
        if part.encoding_to is not None and part.encoding_from != part.encoding_to:
            values = convert(values, part.encoding_from, part.encoding_to)
        if part.index is not None:
            values = values[part.index : part.index + 1]
        elif part.dim is not None:
            values = values[: part.dim]
        if part.range_from is not None:
            (lo_from, hi_from), (lo_to, hi_to) = part.range_from, part.range_to
            values = lo_to + (values - lo_from) * ((hi_to - lo_to) / (hi_from - lo_from))
        pieces.append(values)
    flat = np.concatenate(pieces)
    if leaf.pad_to is not None:
        flat = np.concatenate([flat, np.zeros(leaf.pad_to - flat.size)])
    return flat.astype(leaf.dtype).reshape(tuple(leaf.frame_shape))


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new, uninitialised C-ordered array whose data starts at a multiple of
    ``PAYLOAD_ALIGNMENT`` bytes: a view into a slightly longer byte array, its base.

    Example:
        >>> array = aligned_empty((2, 3), np.float32)
        >>> array.shape, array.ctypes.data % PAYLOAD_ALIGNMENT, array.flags.c_contiguous
        ((2, 3), 0, True)
    """
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + PAYLOAD_ALIGNMENT - 1, np.uint8)
    start = -raw.ctypes.data % PAYLOAD_ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


def _text(leaf: Any, raw_observation: Any, lane: int) -> str:
    if not leaf.sources:
        return leaf.text_fill
    value = read_source(raw_observation, leaf.sources[0], lane)
    if not isinstance(value, str):
        raise ObservationError(
            f"lane {lane}: {path_text('obs', leaf.sources[0])} is {type(value).__name__}, but "
            f"{leaf.leaf} reads a str"
        )
    return value


def _custom(leaf: Any, values: list[Any]) -> Any:
    """K results of a Custom leaf: strings stay a list, anything else is stacked."""
    if all(isinstance(value, str) for value in values):
        return values
    try:
        return np.stack([np.asarray(value) for value in values])
    except ValueError as exc:
        raise ObservationError(
            f"{leaf.leaf} returned values that cannot be stacked across lanes: {exc}"
        ) from None


def _placed(payload: dict[str, Any] | None, slot: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``payload`` with ``value`` at ``slot`` (a path of dict keys), creating dicts on the way."""
    root = {} if payload is None else payload
    node = root
    for key in slot[:-1]:
        node = node.setdefault(key, {})
    node[slot[-1]] = value
    return root
