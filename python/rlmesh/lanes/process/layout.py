"""The shared-memory buffer of process lanes: one slot per lane for every observation and action
leaf, and per-lane rewards and flags, laid out from the spaces.

The driver and every worker map the same buffer and build the same numpy views over it from
one ``SharedLayout`` (the driver computes it and sends it to the workers). Only values that fit
a slot exactly travel through it: an ndarray of the leaf's dtype and shape, inside a Dict /
Tuple of exactly the space's keys in the space's order. Anything else (a Discrete leaf given as
a Python int, a float64 array for a float32 Box, a Text leaf, a dict with keys in another
order) goes through the pipe pickled as the env returned it, so what the driver hands on is
always what an in-process env would have returned.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from multiprocessing import shared_memory
    >>> box, discrete = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3)
    >>> space = gym.spaces.Dict({"pos": box, "mode": discrete})
    >>> layout = SharedLayout.of(space, gym.spaces.Discrete(2), num_lanes=4)
    >>> memory = shared_memory.SharedMemory(create=True, size=layout.size)
    >>> views = layout.views(memory.buf)
    >>> obs = {"mode": np.int64(2), "pos": np.ones(2, np.float32)}
    >>> loose = views.put_observation(1, obs)  # "mode" is a NumPy scalar: it goes loose
    >>> sorted(loose)
    [0]
    >>> taken = views.take_observations(np.array([1]), [loose])[0]
    >>> taken["mode"], taken["pos"].tolist()
    (np.int64(2), [1.0, 1.0])
    >>> del views, taken
    >>> memory.close(); memory.unlink()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from ...spaces import batch_from_leaves, leaf_dtype, leaf_shape, space_leaves
from ...utils import lane_actions

ALIGN = 64  # each region starts on a cache line


@dataclass(frozen=True)
class LeafSlot:
    """Where one leaf's ``[num_lanes, *shape]`` array lives in the buffer; ``dtype`` None for a
    leaf with no fixed size (``Text``), which always travels through the pipe."""

    path: tuple[str, ...]
    dtype: str | None
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class WholeValue:
    """An observation that does not have the space's structure, sent through the pipe whole."""

    value: Any


@dataclass(frozen=True)
class SharedLayout:
    """The regions of the buffer: observation leaves, action leaves, rewards, terminated,
    truncated, each ``[num_lanes, ...]``, in that order."""

    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    num_lanes: int
    observation_slots: tuple[LeafSlot, ...]
    action_slots: tuple[LeafSlot, ...]
    rewards_offset: int
    terminated_offset: int
    truncated_offset: int
    size: int

    @classmethod
    def of(
        cls,
        observation_space: gymnasium.Space[Any],
        action_space: gymnasium.Space[Any],
        num_lanes: int,
    ) -> SharedLayout:
        """The layout for ``num_lanes`` lanes of these spaces.

        Raises:
            TypeError: a space with a leaf other than Box, Discrete, MultiBinary,
                MultiDiscrete and Text inside Dict / Tuple (named by its path).
        """
        end = 0

        def region(nbytes: int) -> int:
            nonlocal end
            start = -(-end // ALIGN) * ALIGN
            end = start + max(nbytes, 1)
            return start

        def slots(space: gymnasium.Space[Any]) -> tuple[LeafSlot, ...]:
            out = []
            for path, leaf in space_leaves(space):
                dtype, shape = leaf_dtype(leaf), leaf_shape(leaf)
                if dtype is None:
                    out.append(LeafSlot(path, None, shape, -1))
                    continue
                nbytes = num_lanes * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                out.append(LeafSlot(path, dtype.str, shape, region(nbytes)))
            return tuple(out)

        observation_slots = slots(observation_space)
        action_slots = slots(action_space)
        rewards = region(8 * num_lanes)
        terminated = region(num_lanes)
        truncated = region(num_lanes)
        return cls(
            observation_space,
            action_space,
            num_lanes,
            observation_slots,
            action_slots,
            rewards,
            terminated,
            truncated,
            max(end, 1),
        )

    def views(self, buffer: Any) -> SharedViews:
        """Numpy views of every region over ``buffer`` (a ``SharedMemory.buf``)."""

        def view(slot: LeafSlot) -> np.ndarray | None:
            if slot.dtype is None:
                return None
            return np.ndarray(
                (self.num_lanes, *slot.shape), np.dtype(slot.dtype), buffer, slot.offset
            )

        n = self.num_lanes
        return SharedViews(
            self,
            [view(slot) for slot in self.observation_slots],
            [view(slot) for slot in self.action_slots],
            np.ndarray((n,), np.float64, buffer, self.rewards_offset),
            np.ndarray((n,), np.bool_, buffer, self.terminated_offset),
            np.ndarray((n,), np.bool_, buffer, self.truncated_offset),
        )


def _fitted_leaves(space: gymnasium.Space[Any], value: Any, out: list[Any]) -> bool:
    """Append ``value``'s leaves to ``out`` if it has exactly ``space``'s structure (dict keys
    in the space's order, tuples of its arity); False as soon as it does not."""
    if isinstance(space, spaces.Dict):
        if type(value) is not dict or list(value) != list(space.spaces):
            return False
        return all(_fitted_leaves(child, value[key], out) for key, child in space.spaces.items())
    if isinstance(space, spaces.Tuple):
        if type(value) is not tuple or len(value) != len(space.spaces):
            return False
        return all(_fitted_leaves(c, v, out) for c, v in zip(space.spaces, value, strict=True))
    out.append(value)
    return True


class SharedViews:
    """The views of one process's mapping of the buffer, and the moves through them.

    Workers call ``put_observation`` and ``take_action``; the driver ``put_actions`` and
    ``take_observations``. Rewards and flags are plain views: ``rewards[lane] = ...``.
    """

    def __init__(
        self,
        layout: SharedLayout,
        observations: list[np.ndarray | None],
        actions: list[np.ndarray | None],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        self.layout = layout
        self.observations = observations
        self.actions = actions
        self.rewards = rewards
        self.terminated = terminated
        self.truncated = truncated
        self._composite_observation = isinstance(
            layout.observation_space, (spaces.Dict, spaces.Tuple)
        )
        self._composite_action = isinstance(layout.action_space, (spaces.Dict, spaces.Tuple))

    # ---------------------------------------------------------------- observations

    def put_observation(self, lane: int, observation: Any) -> dict[int, Any] | WholeValue | None:
        """Write ``observation`` into ``lane``'s slots. Returns what must go through the pipe:
        None (all of it is in the buffer), ``{leaf index: value}`` for the leaves that do not
        fit their slot, or the ``WholeValue`` when its structure is not the space's."""
        leaves: list[Any] = []
        if not _fitted_leaves(self.layout.observation_space, observation, leaves):
            return WholeValue(observation)
        loose = None
        for index, (leaf, view) in enumerate(zip(leaves, self.observations, strict=True)):
            if (
                view is not None
                and type(leaf) is np.ndarray
                and leaf.dtype == view.dtype
                and leaf.shape == view.shape[1:]
            ):
                view[lane] = leaf
            else:
                if loose is None:
                    loose = {}
                loose[index] = leaf
        return loose

    def take_observations(
        self, lanes: np.ndarray, loose: Sequence[dict[int, Any] | WholeValue | None]
    ) -> list[Any]:
        """The observations of ``lanes`` (``[K]`` int), ``loose[k]`` being what lane ``k``'s
        worker sent through the pipe. Each leaf is copied out of the buffer once for all K
        lanes, so the next step cannot overwrite what the driver keeps."""
        batches = [None if view is None else view[lanes] for view in self.observations]
        space = self.layout.observation_space
        whole = batches[0]
        # Every observation in the buffer: its rows, as views (a 1-d batch's rows would be
        # NumPy scalars, not the 0-d arrays an env's Discrete observation is read as).
        if not (self._composite_observation or whole is None or whole.ndim < 2 or any(loose)):
            return list(whole)
        out = []
        for k in range(len(lanes)):
            extra = loose[k]
            if isinstance(extra, WholeValue):
                out.append(extra.value)
                continue
            leaves = [
                extra[i] if extra is not None and i in extra else batch[k, ...]  # type: ignore[index]
                for i, batch in enumerate(batches)
            ]
            out.append(
                batch_from_leaves(space, leaves) if self._composite_observation else leaves[0]
            )
        return out

    # ---------------------------------------------------------------- actions

    def put_actions(self, lanes: np.ndarray, actions: Any) -> list[Any] | None:
        """Write the batched ``actions`` of ``lanes`` into their slots; None when they all fit,
        else the per-lane actions (as an in-process lane would get them) for the pipe."""
        leaves: list[Any] = []
        count = len(lanes)
        fits = _fitted_leaves(self.layout.action_space, actions, leaves) and all(
            view is not None
            and type(leaf) is np.ndarray
            and leaf.dtype == view.dtype
            and leaf.shape == (count, *view.shape[1:])
            for leaf, view in zip(leaves, self.actions, strict=True)
        )
        if not fits:
            return list(lane_actions(actions, count))
        for leaf, view in zip(leaves, self.actions, strict=True):
            view[lanes] = leaf
        return None

    def take_action(self, lane: int) -> Any:
        """``lane``'s action from its slots, a row copied out (a NumPy scalar for a shape-()
        leaf), as an in-process lane takes a row of the batch."""
        leaves = []
        for view in self.actions:
            row = view[lane]  # type: ignore[index]
            leaves.append(row.copy() if isinstance(row, np.ndarray) else row)
        if self._composite_action:
            return batch_from_leaves(self.layout.action_space, leaves)
        return leaves[0]
