"""Bringing the model's batched action into the action space, one leaf of the space at a time.

Mirrors ``rust/src/actions.rs`` name for name. This file is the executable specification: the
Rust core must produce the same arrays (values and dtypes), the same errors and the same
messages.

The input is ``Plan.action`` (see ``rlmesh.adapters.ActionLeafPlan``): one leaf per leaf of the
action space, a Dict walked in order. For ``K`` rows of model output, one per lane, each leaf
is checked and converted:

- the leaf's array must hold numbers (bool, int, uint or float), ``K`` rows, and per row one
  action of the leaf's shape: ``[K, 7]`` fits ``Box[7]``, ``[K, 1, 7]`` and ``[K, 7, 1]`` do
  not (Gymnasium refuses such an action too; nothing is reshaped). A leaf of one value
  (``Box[1]``, ``Discrete``, ...) takes a scalar or a one-element vector per row: ``[K]`` or
  ``[K, 1]``. The values are read as float64;
- ``box``: every value finite; then ``rescale (lo, hi)`` maps it linearly onto
  ``[low, high]`` (``low + (x - lo) * (high - low) / (hi - lo)``, in float64), ``clip`` clips
  it to the bounds, and it is cast to the space's dtype. Nothing else is clipped: out of the
  bounds without ``clip`` passes through. An integer (or bool) Box needs integral values that
  its dtype holds; after a rescale the value is first rounded to the nearest integer (half to
  even), since a linear map onto integers lands between them;
- ``discrete``: an integer in ``start..start+n-1``; ``multi_discrete``: element-wise an integer
  in ``nvec_start..nvec_start+nvec-1``; ``multi_binary``: 0 or 1;
- the result is the space's dtype, shape ``[K, *shape]``.

The first bad value in lane order, then element order (row-major within one action), is
reported with the first rule it breaks, as a ``ModelOutputError`` naming the lane, the element,
the value and what the space expects. A row of the wrong shape is reported for the first lane
(every row of a batch has the same shape). The round runner names each lane's episode and step
as well (``_apply``'s ``lane_text``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ModelOutputError
from .args import path_text, vector
from .rotations import convert

KIND_NAMES = {
    "box": "Box",
    "discrete": "Discrete",
    "multi_discrete": "MultiDiscrete",
    "multi_binary": "MultiBinary",
}
# The numpy dtype kinds a model's action may hold ("b" bool, "i" int, "u" uint, "f" float).
# The most values a Discrete space may have for `_discrete_scalars` to keep their scalars.
CACHED_SCALARS = 1024
NUMERIC_KINDS = "biuf"
INTEGRAL_KINDS = "biu"
# How a message names the lane of row k of the model's output: "lane 3", or from the round
# runner "lane 3 (episode index 7, step 12)".
LaneText = Callable[[int], str]


def _key_text(key: object) -> str:
    """A key of the model's output as messages show it: JSON for a str, else its repr."""
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(size) for size in shape) + "]"


def _count_text(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _row_shape_fits(row_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether one row of the model's output is one action of ``shape``: the same shape, or
    for a leaf of one value, a scalar or a one-element vector either way."""
    if row_shape == shape:
        return True
    return len(shape) <= 1 and len(row_shape) <= 1 and math.prod(shape) == math.prod(row_shape) == 1


def _index_text(element: int, shape: tuple[int, ...]) -> str:
    """Element ``element`` (row-major) of an action of ``shape``: ``[3]``, ``[1, 2]``, ``""``."""
    if not shape:
        return ""
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(element, shape)) + "]"


def _value_text(value: float, integral_input: bool) -> str:
    """A value as the model gave it: an int when its array held integers, else a float."""
    return repr(int(value)) if integral_input else repr(float(value))


class _Leaf:
    """One ``ActionLeafPlan``, prepared: flat float64 bounds and the texts messages use."""

    def __init__(self, plan: Any) -> None:
        path = tuple(plan.path)
        if not all(isinstance(key, str) for key in path):
            raise ValueError(f"an action leaf's path must be a tuple of str, got {path!r}")
        self.path = path
        self.where = path_text("action", path)
        self.kind = str(plan.kind)
        if self.kind not in KIND_NAMES:
            raise ValueError(
                f"{self.where}: unknown action leaf kind {self.kind!r}; expected one of "
                f"{', '.join(KIND_NAMES)}"
            )
        self.shape = tuple(int(size) for size in plan.shape)
        self.size = math.prod(self.shape)
        self.dtype = np.dtype(str(plan.dtype))
        self.label = f"{KIND_NAMES[self.kind]} {self.dtype.name}{_shape_text(self.shape)}"
        # An integer (or bool) output holds exactly the integers min..max: both ends, and
        # max + 1, are powers of two or zero, so the float64 comparisons below are exact.
        self.integer = self.dtype.kind in INTEGRAL_KINDS
        if self.dtype.kind == "b":
            self.dtype_min, self.dtype_max = 0, 1
        elif self.integer:
            info = np.iinfo(self.dtype)
            self.dtype_min, self.dtype_max = int(info.min), int(info.max)
        # A role-based layout: each row is the model's vector of `model_dim` values, mapped
        # onto the env's vector before the Box conversion.
        self.segments = getattr(plan, "segments", None)
        self.row_shape = self.shape if self.segments is None else (int(plan.model_dim),)
        if self.segments is not None:
            if self.kind != "box":
                raise ValueError(f"{self.where}: a role-based action layout needs a Box leaf")
            clip = plan.layout_clip
            self.layout_clip = None if clip is None else (float(clip[0]), float(clip[1]))
            filled = sum(segment.width for segment in self.segments)
            if filled != self.size:
                raise ValueError(
                    f"{self.where}: the action layout fills {filled} values of an action of "
                    f"{self.size}"
                )
        if self.kind == "box":
            self.low = self._flat(plan.low, "low")
            self.high = self._flat(plan.high, "high")
            self.span = self.high - self.low
            self.rescale = None if plan.rescale is None else tuple(float(b) for b in plan.rescale)
            self.clip = bool(plan.clip)
        elif self.kind == "discrete":
            self.start, self.n = int(plan.start), int(plan.n)
        elif self.kind == "multi_discrete":
            self.lowest = self._flat(plan.nvec_start, "nvec_start", np.int64)
            self.stop = self.lowest + self._flat(plan.nvec, "nvec", np.int64)

    def _flat(self, values: Any, name: str, dtype: type = np.float64) -> np.ndarray:
        flat = np.asarray(values, dtype=dtype).reshape(-1)
        if flat.size != self.size:
            raise ValueError(
                f"{self.where}: {name} has {flat.size} values for an action of shape "
                f"{_shape_text(self.shape)}"
            )
        return flat


def _overlap(leaf: _Leaf) -> ValueError:
    return ValueError(f"{leaf.where} overlaps another action leaf: each leaf needs its own path")


def _build_tree(leaves: tuple[_Leaf, ...]) -> int | dict:
    """The action space's shape: a leaf's index, or a dict of subtrees in the space's order."""
    root: int | dict | None = None
    for index, leaf in enumerate(leaves):
        if not leaf.path:
            if root is not None:
                raise _overlap(leaf)
            root = index
            continue
        if root is None:
            root = {}
        if isinstance(root, int):
            raise _overlap(leaf)
        node = root
        for key in leaf.path[:-1]:
            child = node.setdefault(key, {})
            if isinstance(child, int):
                raise _overlap(leaf)
            node = child
        if leaf.path[-1] in node:
            raise _overlap(leaf)
        node[leaf.path[-1]] = index
    return {} if root is None else root


class ActionApplier:
    """Checks the model's batched action and converts it into the action space.

    Args:
        action_leaves: ``Plan.action``, one ``ActionLeafPlan`` per leaf of the action space.

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from rlmesh.adapters import Action, ModelSpec
        >>> space = gym.spaces.Dict({
        ...     "arm": gym.spaces.Box(-2, 2, (2,), np.float32),
        ...     "gripper": gym.spaces.Discrete(2),
        ... })
        >>> plan = ModelSpec(output=Action(rescale=(-1, 1))).compile(space, space)
        >>> applier = ActionApplier(plan.action)
        >>> action = applier.apply_actions(
        ...     {"arm": [[0.5, -1.5], [1.0, 0.0]], "gripper": [1, 0]}, lanes=[3, 5]
        ... )
        >>> action["arm"].dtype, action["arm"].tolist(), action["gripper"].tolist()
        (dtype('float32'), [[1.0, -2.0], [2.0, 0.0]], [1, 0])
        >>> applier.apply_actions({"arm": [[0, 0], [0, 0]], "gripper": [1, 2]}, lanes=[3, 5])
        Traceback (most recent call last):
        ...
        rlmesh.errors.ModelOutputError: lane 5: action["gripper"] is 2; expected an integer in ...
    """

    def __init__(self, action_leaves: Sequence[Any]) -> None:
        self._leaves = tuple(_Leaf(plan) for plan in action_leaves)
        self._tree = _build_tree(self._leaves)
        # The int64 scalar of each value of a small Discrete space, made on first use: a numpy
        # scalar is immutable, so every step may hand an env the same one.
        self._scalars: list[np.int64] | None = None

    def apply_actions(self, batched_model_output: Any, lanes: Any) -> Any:
        """The model's action for ``K`` lanes, checked and converted into the action space.

        Args:
            batched_model_output: for a non-Dict action space, an array-like ``[K, *shape]``;
                for a Dict action space, a dict with the space's keys (nested like the space),
                each leaf an array-like ``[K, *shape]`` (``[K]`` or ``[K, 1]`` for a leaf of one
                value).
            lanes: ``[K]`` int, the lanes the rows belong to, in row order.

        Returns:
            One array ``[K, *shape]`` of the space's dtype per leaf; nested in dicts like the
            action space when it is a Dict.

        Raises:
            ModelOutputError: a missing or unexpected key, an array that does not hold numbers,
                a row count that is not ``K``, a row that is not one action of the leaf's
                shape, or a bad value.
            ValueError: ``lanes`` is not a 1-D array of integers.
        """
        lane_list = vector(lanes, "int64", "lanes").tolist()
        return self._apply(batched_model_output, lane_list, lambda row: f"lane {lane_list[row]}")

    def _apply(self, batched_model_output: Any, lanes: list[int], lane_text: LaneText) -> Any:
        """``apply_actions`` with the lanes read; messages name row ``k``'s lane as
        ``lane_text(k)`` (the round runner adds the episode and step)."""
        return self._apply_node(self._tree, (), batched_model_output, lanes, lane_text)

    def _discrete_scalars(self, values: list[int]) -> list[np.int64] | None:
        """The env actions of a per-lane corner's plain integer outputs, one per lane, as
        numpy int64 scalars: what indexing ``_apply``'s ``[K]`` output gives a lane, without
        the arrays on the way.

        Only for an action space that is one ``Discrete`` leaf of int64 whose values float64
        holds exactly (so ``_apply`` would compare and cast each value exactly), and only when
        every value is in range; None otherwise, and ``_apply`` decides (and words any
        refusal).
        """
        if not isinstance(self._tree, int) or len(self._leaves) != 1:
            return None
        leaf = self._leaves[0]
        if leaf.kind != "discrete" or leaf.dtype != np.int64 or leaf.shape:
            return None
        stop = leaf.start + leaf.n
        if max(abs(leaf.start), abs(stop)) > 2**53:
            return None
        if not all(leaf.start <= value < stop for value in values):
            return None
        if leaf.n > CACHED_SCALARS:
            return [np.int64(value) for value in values]
        if self._scalars is None:
            self._scalars = [np.int64(value) for value in range(leaf.start, stop)]
        return [self._scalars[value - leaf.start] for value in values]

    def _apply_node(
        self,
        node: int | dict,
        path: tuple[str, ...],
        output: Any,
        lanes: list,
        lane_text: LaneText,
    ) -> Any:
        if isinstance(node, int):
            return self._apply_leaf(self._leaves[node], output, len(lanes), lane_text)
        where = path_text("action", path)
        keys_text = json.dumps(list(node))
        if not isinstance(output, Mapping):
            raise ModelOutputError(
                f"{where}: expected a dict with keys {keys_text}, got {type(output).__name__}"
            )
        for key in node:
            if key not in output:
                raise ModelOutputError(
                    f"{where}: missing key {_key_text(key)}; expected keys {keys_text}"
                )
        for key in output:
            if not (isinstance(key, str) and key in node):
                raise ModelOutputError(
                    f"{where}: unexpected key {_key_text(key)}; expected keys {keys_text}"
                )
        return {
            key: self._apply_node(child, (*path, key), output[key], lanes, lane_text)
            for key, child in node.items()
        }

    def _apply_leaf(self, leaf: _Leaf, output: Any, count: int, lane_text: LaneText) -> np.ndarray:
        try:
            array = np.asarray(output)
        except (TypeError, ValueError) as exc:
            raise ModelOutputError(
                f"{leaf.where}: expected {_count_text(count, 'row')} (one per lane) of "
                f"{leaf.label}, got {type(output).__name__} that numpy cannot read as an array: "
                f"{exc}"
            ) from None
        if array.dtype.kind not in NUMERIC_KINDS:
            raise ModelOutputError(
                f"{leaf.where}: expected numbers for {leaf.label}, got dtype {array.dtype}"
            )
        if array.ndim == 0 or array.shape[0] != count:
            raise ModelOutputError(
                f"{leaf.where}: expected {_count_text(count, 'row')} (one per lane) of "
                f"{leaf.label}, got shape {_shape_text(array.shape)}"
            )
        if count and not _row_shape_fits(array.shape[1:], leaf.row_shape):
            expected = _shape_text(leaf.row_shape)
            if math.prod(leaf.row_shape) == 1 and len(leaf.row_shape) <= 1:
                expected = "[] or [1]"
            raise ModelOutputError(
                f"{lane_text(0)}: {leaf.where}: expected shape {expected} per lane for "
                f"{leaf.label}, got {_shape_text(array.shape[1:])}"
            )
        values = np.ascontiguousarray(array, dtype=np.float64).reshape(
            count, math.prod(leaf.row_shape)
        )
        if leaf.segments is not None:
            values = _map_layout(leaf, values)
        integral_input = array.dtype.kind in INTEGRAL_KINDS
        # Bad values must not raise numpy warnings on their way to the error that names them,
        # and a finite value rescaled past float64 (or cast past float32) becomes inf in both
        # cores without a word.
        with np.errstate(all="ignore"):
            result = _CONVERT[leaf.kind](leaf, values, lane_text, integral_input)
            return result.astype(leaf.dtype).reshape(count, *leaf.shape)


def _map_layout(leaf: _Leaf, x: np.ndarray) -> np.ndarray:
    """The model's vectors ``[K, model_dim]`` mapped onto the env's ``[K, size]``, segment by
    segment, in float32 (see ``rlmesh.adapters.ActionSegmentPlan`` for the order)."""
    f32 = np.float32
    model = x.astype(f32)
    pieces = []
    with np.errstate(all="ignore"):
        for segment in leaf.segments:
            if segment.fill is not None:
                pieces.append(np.full((len(x), segment.width), segment.fill, f32))
                continue
            piece = model[:, segment.start : segment.stop]
            source, target = segment.encoding_from, segment.encoding_to
            if source is not None and target is not None and source != target:
                piece = np.stack([convert(row, source, target) for row in piece]).astype(f32)
            if segment.range_from is not None and segment.range_to is not None:
                (lo_from, hi_from), (lo_to, hi_to) = segment.range_from, segment.range_to
                gain = f32((hi_to - lo_to) / (hi_from - lo_from))
                piece = f32(lo_to) + (piece - f32(lo_from)) * gain
            for scale, invert, threshold in (
                (segment.model_scale, segment.model_invert, segment.model_threshold),
                (segment.scale, segment.invert, segment.threshold),
            ):
                if scale is not None:
                    piece = piece * f32(scale)
                if invert:
                    piece = -piece
                if threshold is not None:
                    piece = piece - f32(threshold)
            if segment.binary:
                # >= 0 opens; a raw 0 with no threshold declared stays neutral.
                thresholded = segment.threshold is not None or segment.model_threshold is not None
                snapped = np.where(piece >= 0, f32(1), f32(-1))
                piece = np.where(thresholded | (piece != 0), snapped, piece).astype(f32)
            if segment.clip is not None:
                piece = np.clip(piece, f32(segment.clip[0]), f32(segment.clip[1]))
            pieces.append(piece.astype(f32))
        out = np.concatenate(pieces, axis=1)
        if leaf.layout_clip is not None:
            out = np.clip(out, f32(leaf.layout_clip[0]), f32(leaf.layout_clip[1]))
    return out.astype(np.float64)


# The converters: float64 values ``[K, size]`` in, the action as float64 ``[K, size]`` out
# (the caller casts it to the dtype). Each states its rules as (bad mask, explain) pairs;
# ``_raise_first`` reports the first bad element in row-major order with the first rule it
# breaks, so the order of the rules is part of the specification.

Explain = Callable[[int, int], tuple[str, str]]  # (row, element) -> (value shown, expected)


def _raise_first(leaf: _Leaf, lane_text: LaneText, rules: list[tuple[np.ndarray, Explain]]) -> None:
    bad = np.logical_or.reduce([mask for mask, _ in rules])
    if not bad.any():
        return
    row, element = divmod(int(np.argmax(bad)), leaf.size)
    explain = next(explain for mask, explain in rules if mask[row, element])
    shown, expected = explain(row, element)
    raise ModelOutputError(
        f"{lane_text(row)}: {leaf.where}{_index_text(element, leaf.shape)} is {shown}; "
        f"expected {expected} for {leaf.label}"
    )


def _convert_box(
    leaf: _Leaf, x: np.ndarray, lane_text: LaneText, integral_input: bool
) -> np.ndarray:
    def given(row: int, element: int) -> str:
        return _value_text(x[row, element], integral_input)

    finite = np.isfinite(x)
    y = np.where(finite, x, 0.0)  # a non-finite value is reported before any other rule
    if leaf.rescale is not None:
        lo, hi = leaf.rescale
        y = leaf.low + (y - lo) * leaf.span / (hi - lo)
        if leaf.integer:
            y = np.rint(y)  # a linear map onto integers lands between them: round half to even
    if leaf.clip:
        y = np.clip(y, leaf.low, leaf.high)
    rules: list[tuple[np.ndarray, Explain]] = [
        (~finite, lambda r, e: (given(r, e), "a finite number"))
    ]
    if leaf.integer:
        held = f"an integer {leaf.dtype.name} holds ({leaf.dtype_min}..{leaf.dtype_max})"

        def rescaled(row: int, element: int) -> str:
            if leaf.rescale is None:
                return given(row, element)
            return f"{given(row, element)} ({float(y[row, element])!r} after rescale)"

        rules += [
            (y != np.floor(y), lambda r, e: (given(r, e), "an integer")),
            (
                (y < leaf.dtype_min) | (y >= float(leaf.dtype_max + 1)),
                lambda r, e: (rescaled(r, e), held),
            ),
        ]
    _raise_first(leaf, lane_text, rules)
    return y


def _integers_in(x: np.ndarray, lowest: Any, stop: Any) -> np.ndarray:
    """Where ``x`` is an integer in ``lowest..stop-1`` (compared in float64; NaN is not)."""
    return (x == np.floor(x)) & (x >= lowest) & (x < stop)


def _convert_discrete(
    leaf: _Leaf, x: np.ndarray, lane_text: LaneText, integral_input: bool
) -> np.ndarray:
    stop = leaf.start + leaf.n
    expected = f"an integer in {leaf.start}..{stop - 1}"
    ok = _integers_in(x, float(leaf.start), float(stop))
    _raise_first(
        leaf, lane_text, [(~ok, lambda r, e: (_value_text(x[r, e], integral_input), expected))]
    )
    return x


def _convert_multi_discrete(
    leaf: _Leaf, x: np.ndarray, lane_text: LaneText, integral_input: bool
) -> np.ndarray:
    def explain(row: int, element: int) -> tuple[str, str]:
        lowest, stop = int(leaf.lowest[element]), int(leaf.stop[element])
        return _value_text(x[row, element], integral_input), f"an integer in {lowest}..{stop - 1}"

    ok = _integers_in(x, leaf.lowest.astype(np.float64), leaf.stop.astype(np.float64))
    _raise_first(leaf, lane_text, [(~ok, explain)])
    return x


def _convert_multi_binary(
    leaf: _Leaf, x: np.ndarray, lane_text: LaneText, integral_input: bool
) -> np.ndarray:
    ok = (x == 0) | (x == 1)
    _raise_first(
        leaf, lane_text, [(~ok, lambda r, e: (_value_text(x[r, e], integral_input), "0 or 1"))]
    )
    return x


_CONVERT = {
    "box": _convert_box,
    "discrete": _convert_discrete,
    "multi_discrete": _convert_multi_discrete,
    "multi_binary": _convert_multi_binary,
}
