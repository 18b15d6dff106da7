"""Space utilities: the leaves of a space, and batches of values split into and joined from them.

A *leaf* is a fundamental space (``Box``, ``Discrete``, ``MultiBinary``, ``MultiDiscrete``,
``Text``). Composite spaces (``Dict``, ``Tuple``) are walked in pre-order: a ``Dict``'s keys
in their declared order, a ``Tuple`` in index order. A *batch* of ``N`` values of a space has
the space's structure with every leaf batched along a new leading axis: an array
``[N, *shape]`` for a numeric leaf, a list of ``N`` strings for a ``Text`` leaf, and a dict /
tuple of such batches for a composite.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> box, discrete = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3)
    >>> space = gym.spaces.Dict({"pos": box, "mode": discrete})
    >>> [(path, type(leaf).__name__) for path, leaf in space_leaves(space)]
    [(('mode',), 'Discrete'), (('pos',), 'Box')]
    >>> batch = {"mode": np.array([0, 2]), "pos": np.zeros((2, 2), np.float32)}
    >>> [leaf.shape for leaf in batch_leaves(space, batch)]
    [(2,), (2, 2)]
    >>> joined = batch_from_leaves(space, batch_leaves(space, batch))
    >>> joined["mode"].tolist(), joined["pos"].shape
    ([0, 2], (2, 2))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete, spaces.Text)

Path = tuple[str, ...]


def space_leaves(space: gymnasium.Space[Any], path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """``(path, leaf space)`` for every leaf of ``space``, in pre-order.

    Raises:
        TypeError: a space that is neither a leaf nor a ``Dict`` / ``Tuple``, naming its path.
    """
    if isinstance(space, spaces.Dict):
        for key, child in space.spaces.items():
            yield from space_leaves(child, (*path, str(key)))
    elif isinstance(space, spaces.Tuple):
        for index, child in enumerate(space.spaces):
            yield from space_leaves(child, (*path, str(index)))
    elif isinstance(space, LEAF_SPACES):
        yield path, space
    else:
        where = "/".join(path) or "the space"
        raise TypeError(
            f"{where} is a {type(space).__name__}: only Box, Discrete, MultiBinary, "
            f"MultiDiscrete and Text leaves inside Dict and Tuple spaces are supported"
        )


def batch_leaves(space: gymnasium.Space[Any], batch: Any) -> list[Any]:
    """The leaves of a ``batch`` of ``space`` values, in ``space_leaves`` order.

    Raises:
        KeyError: a dict batch without one of the space's keys (named with its path).
        ValueError: a tuple batch of another arity than the space.
    """
    out: list[Any] = []
    _collect(space, batch, (), out)
    return out


def _collect(space: gymnasium.Space[Any], batch: Any, path: Path, out: list[Any]) -> None:
    if isinstance(space, spaces.Dict):
        for key, child in space.spaces.items():
            try:
                value = batch[key]
            except (KeyError, TypeError, IndexError):
                raise KeyError(
                    f"{'/'.join((*path, str(key)))}: the value has no key {key!r}; expected the "
                    f"keys {list(space.spaces)}"
                ) from None
            _collect(child, value, (*path, str(key)), out)
    elif isinstance(space, spaces.Tuple):
        if not isinstance(batch, (tuple, list)) or len(batch) != len(space.spaces):
            raise ValueError(
                f"{'/'.join(path) or 'the value'}: expected a tuple of {len(space.spaces)} "
                f"batches, got {type(batch).__name__}"
            )
        for index, (child, value) in enumerate(zip(space.spaces, batch, strict=True)):
            _collect(child, value, (*path, str(index)), out)
    else:
        out.append(batch)


def batch_from_leaves(space: gymnasium.Space[Any], leaf_batches: Sequence[Any]) -> Any:
    """The batch whose leaves are ``leaf_batches`` (in ``space_leaves`` order): the inverse of
    ``batch_leaves``. A ``Dict`` becomes a dict, a ``Tuple`` a tuple."""
    it = iter(leaf_batches)
    batch = _build(space, it)
    if next(it, None) is not None:
        raise ValueError(f"more leaves than the space has ({len(leaf_batches)} given)")
    return batch


def _build(space: gymnasium.Space[Any], it: Iterator[Any]) -> Any:
    if isinstance(space, spaces.Dict):
        return {key: _build(child, it) for key, child in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_build(child, it) for child in space.spaces)
    try:
        return next(it)
    except StopIteration:
        raise ValueError("fewer leaves than the space has") from None


def leaf_dtype(space: Any) -> np.dtype[Any] | None:
    """The element dtype of a numeric leaf space; None for ``Text``."""
    if isinstance(space, spaces.Text):
        return None
    return np.dtype(space.dtype)


def leaf_shape(space: Any) -> tuple[int, ...]:
    """The shape of one value of a leaf space: ``()`` for ``Discrete`` and ``Text``."""
    if isinstance(space, (spaces.Discrete, spaces.Text)):
        return ()
    return tuple(space.shape)


__all__ = [
    "LEAF_SPACES",
    "batch_from_leaves",
    "batch_leaves",
    "leaf_dtype",
    "leaf_shape",
    "space_leaves",
]
