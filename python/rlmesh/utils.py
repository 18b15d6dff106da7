"""Helpers shared by the package outside the cores: trees of arrays, checks, env labels.

The cores (``rlmesh._core`` and its mirror ``rlmesh._pycore``) keep their own argument
helpers (``args.rs`` / ``args.py``); everything else reads arguments, walks observation and
action trees, and names envs through this module, so each rule has one home.

Example:
    >>> import numpy as np
    >>> map_leaves({"arm": np.zeros(2), "hand": {"grip": np.ones(1)}}, lambda leaf: leaf.shape)
    {'arm': (2,), 'hand': {'grip': (1,)}}
    >>> print(path_text("action", ("hand", "grip")))
    action["hand"]["grip"]
    >>> positive_int("episodes", 0)
    Traceback (most recent call last):
    ...
    ValueError: episodes must be a positive integer, got 0
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import VectorEnv

from .errors import EnvError
from .remote.address import is_address, parse_address

# ------------------------------------------------------------------------------ trees


def map_leaves(tree: Any, fn: Callable[..., Any], *others: Any) -> Any:
    """``fn`` applied leaf by leaf across trees of one structure (dicts nest; anything else is
    a leaf), e.g. a batched action ``{"arm": [K, 7], "grip": [K]}``."""
    if isinstance(tree, dict):
        return {
            key: map_leaves(value, fn, *(o[key] for o in others)) for key, value in tree.items()
        }
    return fn(tree, *others)


def leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(path, leaf)`` for every leaf of a tree of dicts, in dict order."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*path, str(key)))
    else:
        yield path, tree


def scatter_rows(target: Any, rows: np.ndarray, values: Any) -> None:
    """``target[rows] = values`` leaf by leaf (a dict of arrays fills each of its arrays)."""
    if isinstance(target, dict):
        for key in target:
            scatter_rows(target[key], rows, values[key])
    else:
        target[rows] = values


def path_text(root: str, path: Sequence[str]) -> str:
    """How messages name a leaf: ``root["a"]["b"]`` (keys as ``json.dumps`` writes them), or
    ``root`` for the tree itself."""
    return root + "".join(f"[{json.dumps(key)}]" for key in path)


def lane_actions(actions: Any, count: int, path: tuple[str, ...] = ()) -> Sequence[Any]:
    """``actions`` batched along a leading lane axis, as something indexed by lane position.

    An array is returned as it is: indexing it yields a lane's row (a numpy scalar for a 1-D
    batch, as Gymnasium's own vectors pass them). A dict or tuple of batches becomes a list of
    ``count`` per-lane dicts or tuples.

    Raises:
        ValueError: a leaf without ``count`` rows along its leading axis.
    """
    if type(actions) is not np.ndarray:  # the usual batch skips the Mapping ABC check
        if isinstance(actions, Mapping):
            columns = {
                key: lane_actions(leaf, count, (*path, str(key))) for key, leaf in actions.items()
            }
            return [{key: column[k] for key, column in columns.items()} for k in range(count)]
        if isinstance(actions, tuple):
            parts = [lane_actions(leaf, count, (*path, str(i))) for i, leaf in enumerate(actions)]
            return [tuple(part[k] for part in parts) for k in range(count)]
    try:
        rows = len(actions)
    except TypeError:
        rows = None
    if rows != count:
        raise ValueError(
            f"{path_text('actions', path)} must hold one action per lane stepped ({count}) "
            f"along its leading axis, got {'no lane axis' if rows is None else rows}"
        )
    return actions  # type: ignore[no-any-return]


def shares(ns: int, count: int) -> np.ndarray:
    """``[count]`` int64 durations adding up to ``ns``: one timing split over the ``count``
    lanes or calls it spans, in equal shares, the first ``ns % count`` one nanosecond longer.

    Example:
        >>> shares(10, 3).tolist()
        [4, 3, 3]
    """
    share, remainder = divmod(int(ns), count) if count else (0, 0)
    durations = np.full(count, share, dtype=np.int64)
    durations[:remainder] += 1
    return durations


# ------------------------------------------------------------------------------ checks


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int ``>= 1`` (numpy integers too; not a bool); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_seconds(name: str, value: Any) -> float:
    """``value`` as a float ``> 0`` (seconds); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------ envs


def env_label(env: Any) -> str:
    """How rlmesh names an env in results, messages and headers: a served env's address in
    its one canonical spelling (``tcp://host:port``, ``unix:///absolute/path`` or
    ``unix:relative/path``, as ``rlmesh.remote.address.Address`` prints it), so that every
    spelling of one server is one env; a Gymnasium id as given; else the env's registered id
    (``env.spec.id``), else its type's name.

    Example:
        >>> env_label("127.0.0.1:50051"), env_label("tcp://127.0.0.1:50051")
        ('tcp://127.0.0.1:50051', 'tcp://127.0.0.1:50051')
        >>> env_label("unix:/tmp/env.sock"), env_label("CartPole-v1")
        ('unix:///tmp/env.sock', 'CartPole-v1')
    """
    if isinstance(env, str):
        return address_label(env) if is_address(env) else env
    spec = getattr(env, "spec", None)
    spec_id = getattr(spec, "id", None)
    return spec_id if isinstance(spec_id, str) else type(env).__name__


def address_label(address: str) -> str:
    """``address`` in its canonical spelling (``str`` of the parsed ``Address``), or as given
    when it does not parse (``rlmesh.run`` refuses it later, saying why)."""
    try:
        return str(parse_address(address))
    except ValueError:
        return address


def env_failure(env_name: str, method: str, err: Exception, lane: int | None = None) -> EnvError:
    """The ``EnvError`` for an env's ``method`` that raised ``err`` on ``lane``."""
    where = env_name if lane is None else f"lane {lane} ({env_name})"
    return EnvError(f"{where}: {method}() raised {type(err).__name__}: {err}")


def vector_spec(env: VectorEnv[Any, Any, Any]) -> EnvSpec | None:
    """The ``EnvSpec`` of one lane of ``env``: the vector's own (``gymnasium.make_vec`` sets
    it), else its first env's (a vector built from env functions has none of its own), else
    None.

    Example:
        >>> import gymnasium
        >>> vector = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")])
        >>> vector.spec is None, vector_spec(vector).reward_threshold
        (True, 475.0)
    """
    if env.spec is not None:
        return env.spec
    try:
        spec = env.get_attr("spec")[0]
    except Exception:  # a vector that cannot say (e.g. a custom one without get_attr)
        return None
    return spec if isinstance(spec, EnvSpec) else None
