"""Temporal ensembling: each lane's action as the weighted average of every chunk that covers
its step.

Mirrors ``rust/src/ensembles.rs`` name for name. This file is the executable specification:
the Rust core must produce the same actions to the bit, raise the same error types and the
same messages.

With temporal ensembling (ACT, Zhao et al. 2023) the model is asked for a chunk at every step
of every running lane, and the action executed at step ``t`` of an episode averages, over the
``n`` chunks predicted at steps ``s <= t`` that still reach ``t`` (``t < s + H``), their
predictions for ``t``, oldest first, with weights ``w_i = exp(-m * i)`` (``i = 0`` the oldest):
``a_t = sum_i w_i * chunk_i[t - s_i] / sum_i w_i``. A larger ``m`` trusts the older
predictions more; ``m = 0`` is a plain mean.

Each lane's buffer belongs to one episode, as a replay queue does (``chunks.ChunkQueues``): its
step counter starts at the episode's first push, and the buffer goes when the episode ends, so
predictions never mix across episodes or lanes.

Exactness: both cores compute each weight with the C library's ``exp`` (``math.exp``, Rust's
``f64::exp``) and accumulate in float64 in the same order, one multiply and one add per chunk
(no fused multiply-add, no pairwise sums), then divide once and cast to the leaf's dtype. The
actions are therefore the same to the bit in both cores, and on any lane count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ModelOutputError
from .args import check_lanes, count_arg, i64_arg, path_text, same_length, vector
from .chunks import Layout, Path, _chunk_leaves, _unflatten, conformed, layout_of


def ensemble_rate(value: Any) -> float:
    """``m`` as a float that is finite and not negative, or a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"m must be a number >= 0, got {type(value).__name__}")
    rate = float(value)
    if not (math.isfinite(rate) and rate >= 0.0):
        raise ValueError(f"m must be a finite number >= 0, got {rate}")
    return rate


class TemporalEnsembles:
    """Per-lane, per-episode buffers of predicted chunks, averaged into one action per step.

    The layout of an action (leaves, each leaf's per-step shape and float dtype) is learned
    from the first push and fixed from then on.

    Args:
        num_lanes: ``N >= 1`` lanes, numbered ``0..N-1``.
        m: the weights' rate, ``w_i = exp(-m * i)``: finite and ``>= 0``.

    Example:
        >>> ensembles = TemporalEnsembles(num_lanes=1, m=0.0)  # m = 0: a plain mean
        >>> ensembles.push([0], [7], np.array([[[0.0], [2.0], [4.0]]]))  # [N=1, H=3, 1]
        >>> ensembles.pop([0], [7]).tolist()  # step 0: one chunk covers it
        [[0.0]]
        >>> ensembles.push([0], [7], np.array([[[10.0], [20.0], [30.0]]]))
        >>> ensembles.pop([0], [7]).tolist()  # step 1: (2 + 10) / 2
        [[6.0]]
        >>> ensembles.held().tolist(), ensembles.drop(7), ensembles.held().tolist()
        ([2], 2, [0])
    """

    def __init__(self, num_lanes: int, m: float) -> None:
        self._num_lanes = count_arg(num_lanes, "num_lanes")
        self._m = ensemble_rate(m)
        # Per lane: the chunks still reaching its next step, oldest first, as (the step they
        # were predicted at, per-leaf float64 arrays [H, ...] in layout order); the episode
        # that owns them (None: nothing held); the episode's current step; whether that
        # step's chunk was pushed and its action not popped yet.
        self._chunks: list[list[tuple[int, tuple[np.ndarray, ...]]]] = [
            [] for _ in range(self._num_lanes)
        ]
        self._episode: list[int | None] = [None] * self._num_lanes
        self._step = [0] * self._num_lanes
        self._pushed = [False] * self._num_lanes
        self._owner: dict[int, int] = {}
        self._layout: Layout | None = None

    @property
    def m(self) -> float:
        """The weights' rate: ``w_i = exp(-m * i)``, ``i = 0`` the oldest chunk."""
        return self._m

    def push(self, lanes: Any, episode_ids: Any, chunks: Any) -> None:
        """Add each lane's newest chunk: lane ``lanes[k]`` of episode ``episode_ids[k]`` gets
        row k, predicted at the episode's current step.

        Args:
            lanes: ``[K]`` int, lanes whose current step has no chunk yet.
            episode_ids: ``[K]`` int, the episode each lane is running; a lane's first push
                of an episode starts its buffer at step 0.
            chunks: a batch ``[K, H, ...]`` (an array, or a nested dict of arrays) of env
                actions with float leaves; copied (as float64), so later changes to
                ``chunks`` do not reach the buffers.

        Raises:
            ValueError: mismatched lengths, a bad lane, a lane already pushed to at this step,
                a lane holding another episode's chunks, an episode given twice or held on
                another lane, or a layout that differs from earlier pushes.
            ModelOutputError: ``chunks`` is not a valid batch of ``K`` chunks, or a leaf does
                not hold floats.
        """
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids_array, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        ids = ids_array.tolist()
        pushing: dict[int, int] = {}
        for lane, episode_id in zip(checked, ids, strict=True):
            if self._pushed[lane]:
                raise ValueError(
                    f"lane {lane} already has the chunk of step {self._step[lane]} of episode "
                    f"{self._episode[lane]}: pop its action before pushing again"
                )
            held = self._episode[lane]
            if held is not None and held != episode_id:
                raise ValueError(
                    f"lane {lane} holds chunks of episode {held}, not episode {episode_id}: "
                    f"drop an episode's chunks when it ends"
                )
            if episode_id in pushing:
                raise ValueError(
                    f"episode {episode_id} is given for lanes {pushing[episode_id]} and "
                    f"{lane}: an episode lives on one lane"
                )
            owner = self._owner.get(episode_id)
            if owner is not None and owner != lane:
                raise ValueError(
                    f"episode {episode_id} already has chunks on lane {owner}: an episode "
                    f"lives on one lane"
                )
            pushing[episode_id] = lane
        _, leaves = _chunk_leaves(chunks, len(checked))
        arrays = self._conform(leaves)

        for row, (lane, episode_id) in enumerate(zip(checked, ids, strict=True)):
            if self._episode[lane] is None:
                self._episode[lane] = episode_id
                self._owner[episode_id] = lane
                self._step[lane] = 0
            # np.array copies: the buffer owns its predictions.
            predicted = tuple(np.array(array[row], dtype=np.float64) for array in arrays)
            self._chunks[lane].append((self._step[lane], predicted))
            self._pushed[lane] = True

    def _conform(self, leaves: list[tuple[Path, np.ndarray]]) -> list[np.ndarray]:
        """The leaves' arrays in layout order; the first push sets the layout."""
        for path, array in leaves:
            if array.dtype.kind != "f":
                raise ModelOutputError(
                    f"{path_text('action', path)} holds {array.dtype} actions: temporal "
                    f"ensembling averages actions, so every action leaf must hold floats (a "
                    f"Box space of floats)"
                )
        if self._layout is None:
            self._layout = layout_of(leaves)
        return conformed(self._layout, leaves)

    def pop(self, lanes: Any, episode_ids: Any) -> Any:
        """Each lane's action for its current step, the weighted average of the chunks that
        cover it; the lane moves on to its next step, and chunks that end before it go.

        Args:
            lanes: ``[K]`` int, lanes pushed to at their current step.
            episode_ids: ``[K]`` int, the episode each lane is running; it must own the
                buffer.

        Returns:
            The actions batched like the pushed chunks without their horizon axis: an array
            ``[K, *action_shape]``, or a nested dict of them, with the pushed dtypes.

        Raises:
            ValueError: mismatched lengths, a bad lane, a lane not pushed to at its current
                step, or a buffer owned by another episode.
        """
        lanes_array = vector(lanes, "int64", "lanes")
        ids_array = vector(episode_ids, "int64", "episode_ids")
        same_length("episode_ids", ids_array, lanes_array)
        checked = check_lanes(lanes_array, self._num_lanes)
        ids = ids_array.tolist()
        for lane, episode_id in zip(checked, ids, strict=True):
            if self._episode[lane] != episode_id:
                raise ValueError(
                    f"lane {lane} holds chunks of episode {self._episode[lane]}, not episode "
                    f"{episode_id}: push a chunk for the episode's step first, and drop an "
                    f"episode's chunks when it ends"
                )
            if not self._pushed[lane]:
                raise ValueError(
                    f"lane {lane} has no chunk for step {self._step[lane]} of episode "
                    f"{episode_id}: with temporal ensembling the model predicts at every step"
                )
        assert self._layout is not None  # a lane was pushed to

        outputs = [
            np.empty((len(checked), *step_shape), dtype=dtype)
            for _, step_shape, dtype in self._layout
        ]
        for row, lane in enumerate(checked):
            step = self._step[lane]
            held = self._chunks[lane]
            weights = [math.exp(-self._m * i) for i in range(len(held))]
            total_weight = 0.0
            for weight in weights:
                total_weight += weight
            for leaf, output in enumerate(outputs):
                total = np.zeros(output.shape[1:], dtype=np.float64)
                for weight, (start, predicted) in zip(weights, held, strict=True):
                    total = total + weight * predicted[leaf][step - start]
                output[row] = (total / total_weight).astype(output.dtype)
            self._step[lane] = step + 1
            self._pushed[lane] = False
            # A chunk of H actions predicted at step s covers steps s..s+H-1.
            held[:] = [
                (start, predicted)
                for start, predicted in held
                if start + len(predicted[0]) > step + 1
            ]
        return _unflatten([path for path, _, _ in self._layout], outputs)

    def drop(self, episode_id: int) -> int:
        """Discard the chunks of episode ``episode_id`` (its episode ended); only its lane is
        touched, and an episode holding nothing is a no-op. Returns how many chunks went."""
        episode_id = i64_arg(episode_id, "episode_id")
        lane = self._owner.pop(episode_id, None)
        if lane is None:
            return 0
        discarded = len(self._chunks[lane])
        self._chunks[lane] = []
        self._episode[lane] = None
        self._step[lane] = 0
        self._pushed[lane] = False
        return discarded

    def held(self, lanes: Any = None) -> np.ndarray:
        """How many chunks each of ``lanes`` (``[K]``, all by default) holds: int64."""
        checked = (
            list(range(self._num_lanes))
            if lanes is None
            else check_lanes(vector(lanes, "int64", "lanes"), self._num_lanes)
        )
        return np.array([len(self._chunks[lane]) for lane in checked], dtype=np.int64)

    def __repr__(self) -> str:
        held = sum(len(chunks) for chunks in self._chunks)
        return f"TemporalEnsembles(num_lanes={self._num_lanes}, m={self._m}, held={held})"
