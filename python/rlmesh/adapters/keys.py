"""Observation keys, the spaces they lead to, and how messages show both.

A key-based leaf names an observation key: None (the whole observation), a top-level key, or
a tuple path into nested Dicts; normalized, it is a ``KeyPath``. Compiling and resolving read
what kind of space a key leads to (``NUMERIC_SPACES``, ``is_text_space``, ``signature``), and
every message and description shows keys, paths, arrays and spaces the same way: the
key-based form (``obs["a"]["b"]``) and the adapters-v1 wording (``a.b``, quoted).

Example:
    >>> key_path(("arm", "joints"), "State"), path_text(("arm", "joints"))
    (('arm', 'joints'), 'obs["arm"]["joints"]')
    >>> array_text("uint8", (84, 84, 3)), path_name(("arm", "joints"))
    ('uint8[84,84,3]', 'arm.joints')
"""

from __future__ import annotations

import copy
import json

import numpy as np
from gymnasium import spaces

from ..errors import SpecError

KeyPath = tuple[str, ...]
"""A key normalized: ``()`` is the whole observation, ``("a", "b")`` is ``obs["a"]["b"]``."""

Key = str | KeyPath | None
"""A key as written in a leaf: None (the whole observation), a top-level key, or a path."""

NUMERIC_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# Gymnasium's own kinds whose values are never strings (only spaces.Text holds those).
_NON_TEXT_SPACES = (*NUMERIC_SPACES, spaces.Dict, spaces.Tuple, spaces.Sequence, spaces.Graph)
# The adapters-v1 wording names the whole payload and the whole observation so.
ROOT_SLOT = "<root>"
ROOT_SOURCE = "<obs>"


def is_text_space(space: spaces.Space) -> bool:
    """Whether the values of ``space`` are strings, so a ``Text`` leaf can read it.

    True for a ``gymnasium.spaces.Text``, and for a space of another kind than Gymnasium's own
    whose ``sample()`` is a ``str``: MiniGrid's ``MissionSpace`` is a ``gymnasium.Space``
    subclass, not a ``Text``, and its missions are strings. The sample is drawn from a copy, so
    the space's own random state is left as it was.

    Example:
        >>> is_text_space(spaces.Text(16)), is_text_space(spaces.Discrete(3))
        (True, False)
    """
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, _NON_TEXT_SPACES) or type(space).__module__.startswith("gymnasium."):
        return False
    try:
        sample = copy.deepcopy(space).sample()
    except Exception:  # a space that cannot sample says nothing of its values
        return False
    return isinstance(sample, str)


def signature(space: spaces.Space) -> tuple[tuple[int, ...], str]:
    """The shape and dtype name of one observation of ``space`` ("str" text, "object" others)."""
    if isinstance(space, NUMERIC_SPACES):
        return tuple(space.shape), np.dtype(space.dtype).name
    if is_text_space(space):
        return (), "str"
    return (), "object"


def key_paths(space: spaces.Space, path: KeyPath = ()) -> tuple[KeyPath, ...]:
    """Every key path of a Dict space, parents before their children; () for other spaces."""
    if not isinstance(space, spaces.Dict):
        return ()
    return tuple(
        key_path
        for key, subspace in space.spaces.items()
        for key_path in ((*path, key), *key_paths(subspace, (*path, key)))
    )


def key_path(key: object, leaf_type: str) -> KeyPath:
    """``key`` as a KeyPath (a JSON list counts as a tuple), or a SpecError naming the leaf."""
    if key is None:
        return ()
    if isinstance(key, str):
        return (key,)
    if isinstance(key, (tuple, list)) and all(isinstance(part, str) for part in key):
        return tuple(key)
    raise SpecError(
        f"{leaf_type}: a key is None (the whole observation), a str (a top-level key) or a "
        f"tuple of str (a path into nested Dicts), got {key!r}"
    )


# ----------------------------------------------------------------------------------------------
# The key-based form: what compile_spec's messages and describe show


def key_text(path: KeyPath) -> str:
    """The key as a user writes it in a leaf: ``None``, ``"a"`` or ``("a", "b")``."""
    if not path:
        return "None"
    if len(path) == 1:
        return json.dumps(path[0])
    return "(" + ", ".join(json.dumps(part) for part in path) + ")"


def path_text(path: KeyPath, root: str = "obs") -> str:
    """Where a path leads: ``obs``, ``obs["a"]["b"]``, ``action["arm"]``."""
    return root + "".join(f"[{json.dumps(part)}]" for part in path)


def array_text(dtype: str, shape: tuple[int, ...]) -> str:
    """An array's dtype and shape, compactly: ``uint8[84,84,3]``."""
    return f"{dtype}[{','.join(str(size) for size in shape)}]"


def space_text(space: spaces.Space) -> str:
    """What a space holds, in a few words, for error messages."""
    if isinstance(space, spaces.Box):
        return f"Box {array_text(np.dtype(space.dtype).name, space.shape)}"
    if isinstance(space, spaces.Dict):
        return f"Dict with keys {json.dumps(list(space.spaces))}"
    if isinstance(space, spaces.Text):
        return f"Text(max_length={space.max_length})"
    return repr(space)


# ----------------------------------------------------------------------------------------------
# The adapters-v1 wording: what resolve's messages and description show


def quoted(text: str) -> str:
    """``text`` in double quotes, as JSON writes it."""
    return json.dumps(text)


def range_text(value: tuple[float, float]) -> str:
    """A range with its bounds as floats: ``(-1.0, 1.0)``."""
    return f"({float(value[0])!r}, {float(value[1])!r})"


def path_name(path: tuple) -> str:
    """A tagged path (dict keys, tuple indices) joined by dots; ``<obs>`` for the root."""
    return ".".join(str(part) for part in path) if path else ROOT_SOURCE


def slot_name(slot: KeyPath) -> str:
    """A payload slot joined by dots; ``<root>`` for a bare leaf."""
    return ".".join(slot) if slot else ROOT_SLOT
