"""Action chunks: checking what a chunked model returned, and the per-lane replay queues.

Mirrors ``rust/src/chunks.rs`` name for name. This file is the executable specification: the
Rust core must produce the same results, raise the same error types and the same messages.

A *chunk* is ``H`` consecutive actions for one lane: an array ``[H, *action_shape]``, or a
(nested) dict whose leaves all share the leading ``H``, e.g. ``{"arm": [H, 7], "grip": [H]}``.
A *batch* of chunks for ``N`` lanes adds a leading lane axis to every leaf: ``[N, H, ...]``.

Each lane replays its own queue (docs/semantics.md, "Action chunks"): the model is called only for
lanes whose queue is empty, a queue keeps at most ``execution_horizon`` actions of a chunk (a
shorter chunk re-plans sooner), and a queue belongs to one episode, so a chunk never crosses an
episode boundary and one lane's episode ending never touches another lane's queue.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..errors import ModelOutputError
from .args import check_lanes, count_arg, i64_arg, path_text, same_length, u64_arg, vector

# numpy dtype kinds an action may hold: bool, signed, unsigned, float. Anything else (object,
# str, complex, structured) is not an action a Gymnasium space holds, and the Rust core could
# not copy object arrays as plain bytes.
ACTION_KINDS = "biuf"

Path = tuple[str, ...]


def _shape_text(shape: tuple[int, ...]) -> str:
    """A shape as Python prints a tuple: ``()``, ``(7,)``, ``(8, 7)``."""
    return str(tuple(shape))


def _flatten(value: Any, path: Path, leaves: list[tuple[Path, np.ndarray]]) -> None:
    """Append ``value``'s leaves as ``(path, array)`` in dict order, depth first."""
    if isinstance(value, dict):
        if not value:
            raise ModelOutputError(
                f"{path_text('action', path)} is an empty dict: expected at least one action leaf"
            )
        for key, item in value.items():
            if not isinstance(key, str):
                raise ModelOutputError(
                    f"{path_text('action', path)} has key {key!r}: expected str keys"
                )
            _flatten(item, (*path, key), leaves)
    else:
        leaves.append((path, np.asarray(value)))


def _chunk_leaves(chunk: Any, num_lanes: int | None) -> tuple[int, list[tuple[Path, np.ndarray]]]:
    """The horizon ``H`` of ``chunk`` and its leaves; see ``split_chunk`` for the rules."""
    leaves: list[tuple[Path, np.ndarray]] = []
    _flatten(chunk, (), leaves)
    # The axis that holds H: 0 for one lane's chunk, 1 after the lane axis of a batch.
    axis = 0 if num_lanes is None else 1
    first: tuple[str, int] | None = None
    for path, array in leaves:
        name = path_text("action", path)
        shape = _shape_text(array.shape)
        if array.dtype.kind not in ACTION_KINDS:
            raise ModelOutputError(
                f"{name} has dtype {array.dtype}: expected booleans, integers or floats"
            )
        if array.ndim <= axis:
            expected = (
                "[H, ...], a chunk of H actions along the leading axis"
                if num_lanes is None
                else f"[N, H, ...], a chunk of H actions for each of N = {num_lanes} lanes"
            )
            raise ModelOutputError(f"{name} has shape {shape}: expected {expected}")
        if num_lanes is not None and array.shape[0] != num_lanes:
            raise ModelOutputError(
                f"{name} has shape {shape}: expected [N, H, ...] with N = {num_lanes} lanes, "
                f"got N = {array.shape[0]}"
            )
        horizon = array.shape[axis]
        if horizon == 0:
            raise ModelOutputError(
                f"{name} is an empty chunk: shape {shape} holds H = 0 actions, expected at least 1"
            )
        if first is None:
            first = (name, horizon)
        elif horizon != first[1]:
            raise ModelOutputError(
                f"{name} has H = {horizon} actions but {first[0]} has H = {first[1]}: every "
                f"leaf of a chunk must share the horizon H"
            )
    assert first is not None  # _flatten yields at least one leaf or raises
    return first[1], leaves


def split_chunk(chunk: Any, num_lanes: int | None = None) -> int:
    """Check a chunk a model returned and give its horizon ``H``: how many actions it holds.

    Args:
        chunk: with ``num_lanes=None``, one lane's chunk: an array-like ``[H, *action_shape]``
            or a (nested) dict of them whose leaves all share ``H``. With ``num_lanes=N``, a
            batch of chunks: every leaf is ``[N, H, *leaf_action_shape]``.
        num_lanes: None for one lane's chunk, else the ``N`` lanes the batch must hold.

    Returns:
        ``H >= 1``.

    Raises:
        ModelOutputError: an empty chunk (``H = 0``), leaves that disagree on ``H`` (both are
            named), a leaf with too few dimensions, a batch whose leading dimension is not
            ``N``, a leaf that holds neither booleans, integers nor floats, an empty dict or a
            dict key that is not a str. The message names the leaf (``action``,
            ``action["arm"]``), what was expected and what came back.

    Example:
        >>> split_chunk(np.zeros((8, 7), dtype=np.float32))
        8
        >>> split_chunk({"arm": np.zeros((4, 16, 7)), "grip": np.zeros((4, 16))}, num_lanes=4)
        16
        >>> try:
        ...     split_chunk({"arm": np.zeros((8, 7)), "grip": np.zeros(4)})
        ... except ModelOutputError as err:
        ...     print(err)
        action["grip"] has H = 4 actions but action["arm"] has H = 8: every leaf of a chunk ...
    """
    lanes = None if num_lanes is None else u64_arg(num_lanes, "num_lanes")
    horizon, _ = _chunk_leaves(chunk, lanes)
    return horizon


def _unflatten(paths: list[Path], arrays: list[np.ndarray]) -> Any:
    """The leaves back in their dicts (key order as first seen), or the lone root array."""
    if paths == [()]:
        return arrays[0]
    root: dict[str, Any] = {}
    for path, array in zip(paths, arrays, strict=True):
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array
    return root


Layout = list[tuple[Path, tuple[int, ...], np.dtype]]


def layout_of(leaves: list[tuple[Path, np.ndarray]]) -> Layout:
    """The action layout a batch of chunks ``[K, H, ...]`` sets: each leaf's path, per-step
    shape and dtype, in the batch's leaf order."""
    return [(path, array.shape[2:], array.dtype) for path, array in leaves]


def conformed(layout: Layout, leaves: list[tuple[Path, np.ndarray]]) -> list[np.ndarray]:
    """The arrays of ``leaves`` in ``layout``'s order.

    Raises:
        ValueError: other leaves than the layout's, or a leaf of another per-step shape or
            dtype (both named).
    """
    by_path = dict(leaves)
    if set(by_path) != {path for path, _, _ in layout}:
        found = ", ".join(path_text("action", path) for path, _ in leaves)
        held = ", ".join(path_text("action", path) for path, _, _ in layout)
        raise ValueError(f"chunks hold leaves [{found}] but earlier pushes held [{held}]")
    arrays = []
    for path, step_shape, dtype in layout:
        array = by_path[path]
        if array.shape[2:] != step_shape or array.dtype != dtype:
            raise ValueError(
                f"{path_text('action', path)} holds {array.dtype} actions of shape "
                f"{_shape_text(array.shape[2:])} but earlier pushes held {dtype} actions "
                f"of shape {_shape_text(step_shape)}"
            )
        arrays.append(array)
    return arrays


class ChunkQueues:
    """Per-lane replay queues of chunked actions.

    Each lane holds at most one queue, owned by one episode: the actions of the last chunk
    pushed for it, at most ``execution_horizon`` of them, popped one per env step. The layout
    of an action (its leaf structure, each leaf's per-step shape and dtype) is learned from the
    first push and fixed from then on.

    Args:
        num_lanes: ``N >= 1`` lanes, numbered ``0..N-1``.
        execution_horizon: ``E >= 1``, the most actions of one chunk a lane replays before the
            model is asked again.

    Example:
        >>> queues = ChunkQueues(num_lanes=2, execution_horizon=3)
        >>> chunk = np.arange(2 * 4 * 1, dtype=np.float32).reshape(2, 4, 1)  # [N=2, H=4, 1]
        >>> queues.push([0, 1], [10, 11], chunk)  # keeps the first 3 of 4 actions per lane
        >>> queues.queued().tolist()
        [3, 3]
        >>> queues.pop([0, 1], [10, 11]).tolist()
        [[0.0], [4.0]]
        >>> queues.drop(11)  # lane 1's episode ended: its 2 remaining actions are discarded
        2
        >>> queues.lanes_needing_predict().tolist(), queues.queued().tolist()
        ([1], [2, 0])
    """

    def __init__(self, num_lanes: int, execution_horizon: int) -> None:
        self._num_lanes = count_arg(num_lanes, "num_lanes")
        self._execution_horizon = count_arg(execution_horizon, "execution_horizon")
        # Per lane: the queued actions, oldest first, each a tuple of per-leaf arrays in layout
        # order; and the episode that owns them (None when the queue is empty).
        self._queues: list[deque[tuple[np.ndarray, ...]]] = [
            deque() for _ in range(self._num_lanes)
        ]
        self._episode: list[int | None] = [None] * self._num_lanes
        # Which lane holds each episode's queue: an episode lives on one lane.
        self._owner: dict[int, int] = {}
        # (path, per-step shape, dtype) per leaf, from the first push.
        self._layout: Layout | None = None

    # ------------------------------------------------------------------ properties

    @property
    def execution_horizon(self) -> int:
        """The most actions of one chunk a lane replays before the model is asked again."""
        return self._execution_horizon

    # ------------------------------------------------------------------ queues

    def push(self, lanes: Any, episode_ids: Any, chunks: Any) -> None:
        """Queue a batch of chunks: lane ``lanes[k]`` of episode ``episode_ids[k]`` gets row k.

        Args:
            lanes: ``[K]`` int, lanes whose queue is empty.
            episode_ids: ``[K]`` int, the episode each lane is running; it owns the queue.
            chunks: a batch ``[K, H, ...]`` (an array, or a nested dict of arrays), already
                converted to env actions. Each lane keeps its first ``min(H,
                execution_horizon)`` actions, copied: later changes to ``chunks`` do not reach
                the queue.

        Raises:
            ValueError: mismatched lengths, a bad lane, a lane whose queue is not empty, an
                episode given twice or already queued on another lane, or a layout (leaves,
                per-step shapes, dtypes) that differs from earlier pushes.
            ModelOutputError: ``chunks`` is not a valid batch of ``K`` chunks
                (``split_chunk(chunks, num_lanes=K)``).
        """
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids_array, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        ids = ids_array.tolist()
        pushing: dict[int, int] = {}
        for lane, episode_id in zip(checked, ids, strict=True):
            queue = self._queues[lane]
            if queue:
                raise ValueError(
                    f"lane {lane} still holds {len(queue)} queued actions of episode "
                    f"{self._episode[lane]}: push only to lanes whose queue is empty "
                    f"(lanes_needing_predict)"
                )
            if episode_id in pushing:
                raise ValueError(
                    f"episode {episode_id} is given for lanes {pushing[episode_id]} and "
                    f"{lane}: an episode lives on one lane"
                )
            owner = self._owner.get(episode_id)
            if owner is not None:
                raise ValueError(
                    f"episode {episode_id} already has queued actions on lane {owner}: an "
                    f"episode lives on one lane"
                )
            pushing[episode_id] = lane
        horizon, leaves = _chunk_leaves(chunks, len(checked))
        arrays = self._conform(leaves)

        kept = min(horizon, self._execution_horizon)
        for row, (lane, episode_id) in enumerate(zip(checked, ids, strict=True)):
            # np.array copies: the queue owns its actions.
            self._queues[lane].extend(
                tuple(np.array(array[row, step]) for array in arrays) for step in range(kept)
            )
            self._episode[lane] = episode_id
            self._owner[episode_id] = lane

    def _conform(self, leaves: list[tuple[Path, np.ndarray]]) -> list[np.ndarray]:
        """The leaves' arrays in layout order; the first push sets the layout."""
        if self._layout is None:
            self._layout = layout_of(leaves)
        return conformed(self._layout, leaves)

    def pop(self, lanes: Any, episode_ids: Any) -> Any:
        """Take the next action of each lane's queue: one env step's actions for ``lanes``.

        Args:
            lanes: ``[K]`` int, lanes whose queue is not empty.
            episode_ids: ``[K]`` int, the episode each lane is running; it must own the queue.

        Returns:
            The actions batched like the pushed chunks without their horizon axis: an array
            ``[K, *action_shape]``, or a nested dict of such arrays; row k is lane
            ``lanes[k]``'s action, with the pushed dtype.

        Raises:
            ValueError: mismatched lengths, a bad lane, a lane whose queue is empty or owned by
                another episode, or nothing pushed yet.
        """
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids_array, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        ids = ids_array.tolist()
        for lane, episode_id in zip(checked, ids, strict=True):
            if not self._queues[lane]:
                raise ValueError(
                    f"lane {lane} has no queued action for episode {episode_id}: call the "
                    f"model for lanes_needing_predict first"
                )
            if self._episode[lane] != episode_id:
                raise ValueError(
                    f"lane {lane} holds queued actions of episode {self._episode[lane]}, not "
                    f"episode {episode_id}: drop an episode's queue when it ends"
                )
        if self._layout is None:
            raise ValueError(
                "nothing was pushed yet: ChunkQueues learns the action layout from the first push"
            )

        outputs = [
            np.empty((len(checked), *step_shape), dtype=dtype)
            for _, step_shape, dtype in self._layout
        ]
        for row, lane in enumerate(checked):
            action = self._queues[lane].popleft()
            for output, leaf in zip(outputs, action, strict=True):
                output[row] = leaf
            if not self._queues[lane]:
                self._release(lane)
        return _unflatten([path for path, _, _ in self._layout], outputs)

    def _release(self, lane: int) -> None:
        """Empty ``lane``'s queue and forget its owner."""
        self._queues[lane].clear()
        episode_id = self._episode[lane]
        if episode_id is not None:
            del self._owner[episode_id]
            self._episode[lane] = None

    def drop(self, episode_id: int) -> int:
        """Discard the queued actions of episode ``episode_id`` (its episode ended).

        Only the lane holding that episode's queue is touched; an episode with nothing queued
        is a no-op. Returns how many actions were discarded.
        """
        episode_id = i64_arg(episode_id, "episode_id")
        lane = self._owner.get(episode_id)
        if lane is None:
            return 0
        discarded = len(self._queues[lane])
        self._release(lane)
        return discarded

    # ------------------------------------------------------------------ queries

    def _lanes(self, lanes: Any) -> list[int]:
        if lanes is None:
            return list(range(self._num_lanes))
        return check_lanes(vector(lanes, "int64", "lanes"), self._num_lanes)

    def lanes_needing_predict(self, lanes: Any = None) -> np.ndarray:
        """Of ``lanes`` (``[K]``, all lanes by default), those whose queue is empty, in order.

        Returns ``[J]`` int64: the lanes the model must be called for before the next pop.
        """
        return np.array(
            [lane for lane in self._lanes(lanes) if not self._queues[lane]], dtype=np.int64
        )

    def queued(self, lanes: Any = None) -> np.ndarray:
        """How many actions each of ``lanes`` (``[K]``, all by default) has queued: int64."""
        return np.array([len(self._queues[lane]) for lane in self._lanes(lanes)], dtype=np.int64)

    def __repr__(self) -> str:
        queued = sum(len(queue) for queue in self._queues)
        return (
            f"ChunkQueues(num_lanes={self._num_lanes}, "
            f"execution_horizon={self._execution_horizon}, queued={queued})"
        )
