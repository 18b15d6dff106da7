"""Determinism evidence: each episode's reset digest and trajectory digest.

Mirrors ``rust/src/digests.rs`` name for name. This file is the executable specification: the
Rust core must give the same digests for the same values.

An episode's ``reset_digest`` is ``value_digest`` of its first observation; its
``trajectory_digest`` folds in every step the episode took: the action the core handed the
env, the observation, the reward and the flags the step returned. Two runs played the same
episode exactly when both digests are equal (up to a 64-bit collision); an episode whose
``reset_digest`` differs did not start from the same state. The digests are 64-bit, written
as 16 lowercase hex digits, and the same on both cores, any number of lanes, worker
processes, a served env and Ray (what the core sees of a lane is the same in all of them).

What is hashed (``rlmesh-digest-1``; ``absorb(h, w)`` is ``splitmix64(h ^ w)``, the
SplitMix64 step of ``seeding``, on 64-bit words):

- **a leaf** (an array, or a number): the value as ``numpy.asarray`` gives it (a Python
  ``bool``, ``int`` and ``float`` are a 0-d bool, int64 and float64), little-endian and in C
  order. Its prefix absorbs into ``LEAF_SEED``, in order, ``ord(dtype.kind)``,
  ``dtype.itemsize``, ``ndim`` and each size of its shape (so a dtype or shape change is a
  different digest), and the leaf's digest is ``absorb(prefix, bulk(bytes))``. A leaf whose
  kind is not one of ``biufcSU`` (objects, datetimes, structured records), or that numpy
  cannot make an array of, is ``absorb(absorb(LEAF_SEED, ord("O")), text_digest(text))``,
  ``text`` the ``repr`` of its ``tolist()`` (of the value itself when numpy refused it).
- **bulk(bytes)**: the bytes as little-endian 64-bit words ``w_j`` (the last one padded with
  zero bytes), each with the key ``k_j = splitmix64(KEY_BASE + j)``, summed modulo 2**64:
  ``((lo(w_j) + lo(k_j)) mod 2**32) * ((hi(w_j) + hi(k_j)) mod 2**32) + w_j``, where ``lo``
  and ``hi`` are a word's low and high 32 bits (the NH construction, which numpy and SIMD
  compute a whole array at a time: a 256x256x3 image in microseconds).
- **text** (a dict key, a ``repr``): its UTF-8 bytes (surrogates passed through),
  ``absorb(absorb(TEXT_SEED, len), bulk(bytes))``.
- **a dict** (any ``dict``: a ``Dict`` space's observation or action): ``absorb(DICT_SEED,
  len)``, then for each key in the order of ``str(key)``'s UTF-8 bytes (a Gymnasium ``Dict``
  space's own order, whatever order the env built the dict in), its key's ``text_digest``
  and its value's digest. **A tuple**: ``absorb(TUPLE_SEED, len)``, then each item's digest.
  Anything else is a leaf (a list too: ``numpy.asarray`` of it).
- **a trajectory**: ``absorb(TRAJECTORY_SEED, reset)``, then for each step, in order, the
  digests of the lane's action (as the env received it: its row of the action batch the
  core made, after the action plan) and of the observation the step returned, the reward as
  the bits of a float64 and ``terminated | truncated << 1`` as the env returned them (before
  a ``max_episode_steps`` or ``max_episode_seconds`` cap truncates the episode).

What the digests cannot see: a ``transform_action`` hook's changes to an action (the core
hashes the action it handed out); and an env that restarts its lanes itself in the step that
ended them (``SAME_STEP`` autoreset) returns the next episode's first observation in that
step, which the ended episode's last step hashes in place of its final one.

Example:
    >>> import numpy as np
    >>> value_digest(np.zeros(3, np.float32)) == value_digest(np.zeros(3, np.float64))
    False
    >>> value_digest({"b": 1, "a": 2.0}) == value_digest({"a": 2.0, "b": 1})
    True
    >>> len(value_digest((np.arange(4), "text")))
    16
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .seeding import splitmix64

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
# The domains of the digests: ASCII tags, so no two kinds of value start alike.
KEY_BASE = 0x726C6D6573686B79  # "rlmeshky"
LEAF_SEED = 0x6C656166  # "leaf"
TEXT_SEED = 0x74657874  # "text"
DICT_SEED = 0x64696374  # "dict"
TUPLE_SEED = 0x7475706C  # "tupl"
TRAJECTORY_SEED = 0x7472616A  # "traj"
# The leaf of a value whose repr raised too.
UNREADABLE = 0x3F3F3F3F  # "????"
# The dtype kinds whose bytes are hashed as they are.
BYTE_KINDS = "biufcSU"
# Up to this many 64-bit words, bulk() loops in Python; past it, numpy takes the words at once.
SMALL_WORDS = 16
# digests_of stacks arrays up to this size to hash them at once.
STACKED_BYTES = 4096

_U64 = np.uint64
_LITTLE = sys.byteorder == "little"


def absorb(state: int, word: int) -> int:
    """One word into a digest's state: ``splitmix64(state ^ word)``."""
    return splitmix64(state ^ word)


_GAMMA, _MUL_1, _MUL_2 = _U64(GOLDEN_GAMMA), _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_SHIFT_1, _SHIFT_2, _SHIFT_3, _HALF = _U64(30), _U64(27), _U64(31), _U64(32)


def _mix(z: np.ndarray) -> np.ndarray:
    """``splitmix64`` of every element of a uint64 array, as a new array (numpy's uint64
    arithmetic wraps); in place after the first step, which is what a round's few lanes pay
    for: the calls, not the arithmetic."""
    z = np.add(z, _GAMMA)
    shifted = np.right_shift(z, _SHIFT_1)
    np.bitwise_xor(z, shifted, out=z)
    np.multiply(z, _MUL_1, out=z)
    np.right_shift(z, _SHIFT_2, out=shifted)
    np.bitwise_xor(z, shifted, out=z)
    np.multiply(z, _MUL_2, out=z)
    np.right_shift(z, _SHIFT_3, out=shifted)
    np.bitwise_xor(z, shifted, out=z)
    return z


def absorb_many(states: Any, words: np.ndarray) -> np.ndarray:
    """``absorb`` element-wise: ``states`` (one int, or a uint64 array) with uint64 ``words``."""
    return _mix(np.bitwise_xor(np.asarray(states, dtype=_U64), words, dtype=_U64))


class Keys:
    """The keys of ``bulk``, ``k_j = splitmix64(KEY_BASE + j)``, as the uint32 halves numpy
    adds, computed once and grown on demand (a process holds one set, as large as the largest
    value it hashed)."""

    def __init__(self) -> None:
        self._low = np.zeros(0, dtype=np.uint32)
        self._high = np.zeros(0, dtype=np.uint32)
        self._small = [splitmix64((KEY_BASE + j) & M64) for j in range(SMALL_WORDS)]

    def small(self) -> list[int]:
        """The first ``SMALL_WORDS`` keys, as Python ints."""
        return self._small

    def halves(self, words: int) -> tuple[np.ndarray, np.ndarray]:
        """The low and high 32 bits of the first ``words`` keys (uint32 arrays)."""
        if len(self._low) < words:
            size = max(words, 2 * len(self._low), 1024)
            keys = _mix(_U64(KEY_BASE) + np.arange(size, dtype=_U64))
            self._low = (keys & _U64(M32)).astype(np.uint32)
            self._high = (keys >> _HALF).astype(np.uint32)
        return self._low[:words], self._high[:words]


KEYS = Keys()


def bulk(data: bytes) -> int:
    """The NH sum of ``data``'s little-endian 64-bit words with their keys (see the module
    docstring), modulo 2**64."""
    words = -(-len(data) // 8)
    if words <= SMALL_WORDS:
        acc = 0
        keys = KEYS.small()
        for j in range(words):
            word = int.from_bytes(data[8 * j : 8 * j + 8], "little")  # the last one padded
            key = keys[j]
            low = ((word & M32) + (key & M32)) & M32
            high = ((word >> 32) + (key >> 32)) & M32
            acc = (acc + low * high + word) & M64
        return acc
    return int(bulk_rows(np.frombuffer(data, dtype=np.uint8).reshape(1, -1))[0])


def bulk_rows(rows: np.ndarray) -> np.ndarray:
    """``bulk`` of each row of a ``[K, B]`` uint8 array, at once: ``[K]`` uint64."""
    count, size = rows.shape
    words = -(-size // 8)
    if size % 8:
        padded = np.zeros((count, 8 * words), dtype=np.uint8)
        padded[:, :size] = rows
        rows = padded
    values = np.ascontiguousarray(rows).view("<u8")
    halves = values.view("<u4")  # each word's low half, then its high half
    low_keys, high_keys = KEYS.halves(words)
    # Into buffers kept from call to call: a fresh temporary the size of an image costs the
    # kernel's page faults, ten times the arithmetic. uint32 sums wrap as the definition does.
    low, high, terms = _scratch(count * words)
    low, high = low.reshape(count, words), high.reshape(count, words)
    terms = terms.reshape(count, words)
    np.add(halves[:, 0::2], low_keys, out=low)
    np.add(halves[:, 1::2], high_keys, out=high)
    np.multiply(low, high, out=terms, dtype=_U64)
    np.add(terms, values, out=terms)
    return terms.sum(axis=1, dtype=_U64)


_SCRATCH = threading.local()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two uint32 buffers and a uint64 one of ``size`` elements, this thread's own."""
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or len(buffers[0]) < size:
        capacity = max(size, 1024)
        buffers = (
            np.empty(capacity, dtype=np.uint32),
            np.empty(capacity, dtype=np.uint32),
            np.empty(capacity, dtype=_U64),
        )
        _SCRATCH.buffers = buffers
    return buffers[0][:size], buffers[1][:size], buffers[2][:size]


def text_digest(text: bytes) -> int:
    """The digest of a text's UTF-8 bytes (a dict key, a ``repr``)."""
    return absorb(absorb(TEXT_SEED, len(text)), bulk(text))


def _text(value: Any) -> bytes:
    """``str(value)`` as UTF-8, surrogates passed through."""
    return str(value).encode("utf-8", "surrogatepass")


_PREFIXES: dict[tuple[str, int, tuple[int, ...]], int] = {}


def leaf_prefix(kind: str, itemsize: int, shape: tuple[int, ...]) -> int:
    """What a leaf's digest starts from: its dtype's kind and item size, and its shape."""
    key = (kind, itemsize, shape)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        prefix = absorb(absorb(absorb(LEAF_SEED, ord(kind)), itemsize), len(shape))
        for size in shape:
            prefix = absorb(prefix, size)
        if len(_PREFIXES) < 4096:  # the few leaves of a run's spaces
            _PREFIXES[key] = prefix
    return prefix


def _readable(array: np.ndarray) -> bool:
    """Whether ``array``'s bytes are hashed as they are: a kind of ``BYTE_KINDS``, no
    fields, little-endian, C-contiguous."""
    dtype = array.dtype
    if dtype.kind not in BYTE_KINDS or dtype.fields is not None:
        return False
    order = dtype.byteorder
    return (order in "|<" or (order == "=" and _LITTLE)) and array.flags.c_contiguous


def canonical(value: Any) -> np.ndarray | None:
    """``value`` as the array whose bytes are hashed: ``numpy.asarray``, little-endian, C
    order; None for a value hashed by its ``repr`` (see the module docstring)."""
    if isinstance(value, np.ndarray) and _readable(value):
        return value
    array = np.asarray(value)
    dtype = array.dtype
    if dtype.kind not in BYTE_KINDS or dtype.fields is not None:
        return None
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE):
        array = array.astype(dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return array


def _opaque(value: Any) -> int:
    """The leaf of a value hashed by its ``repr``."""
    try:
        listed = np.asarray(value).tolist()
    except Exception:
        listed = value
    text = repr(listed).encode("utf-8", "surrogatepass")
    return absorb(absorb(LEAF_SEED, ord("O")), text_digest(text))


def _scalar(value: Any) -> int | None:
    """The leaf of a plain Python bool, int (one an int64 holds) or float; None for any
    other value."""
    kind = type(value)
    if kind is bool:
        return absorb(leaf_prefix("b", 1, ()), bulk(b"\x01" if value else b"\x00"))
    if kind is int and -(2**63) <= value < 2**63:
        return absorb(leaf_prefix("i", 8, ()), bulk(struct.pack("<q", value)))
    if kind is float:
        return absorb(leaf_prefix("f", 8, ()), bulk(struct.pack("<d", value)))
    return None


def _leaf(value: Any) -> int:
    scalar = _scalar(value)
    if scalar is not None:
        return scalar
    try:
        array = canonical(value)
    except Exception:  # numpy cannot make an array of it: its repr
        array = None
    if array is None:
        return _opaque(value)
    return array_digest(array)


def array_digest(array: np.ndarray) -> int:
    """The leaf of an array ``canonical`` returned."""
    prefix = leaf_prefix(array.dtype.kind, array.dtype.itemsize, array.shape)
    if array.nbytes <= 8 * SMALL_WORDS:
        return absorb(prefix, bulk(array.tobytes()))
    return absorb(prefix, int(bulk_rows(array.reshape(1, -1).view(np.uint8))[0]))


def _digest(value: Any) -> int:
    if isinstance(value, dict):
        items = sorted(((_text(key), item) for key, item in value.items()), key=_first)
        state = absorb(DICT_SEED, len(items))
        for key, item in items:
            state = absorb(absorb(state, text_digest(key)), _digest(item))
        return state
    if isinstance(value, tuple):
        state = absorb(TUPLE_SEED, len(value))
        for item in value:
            state = absorb(state, _digest(item))
        return state
    return _leaf(value)


def _first(item: tuple[bytes, Any]) -> bytes:
    return item[0]


def digest_of(value: Any) -> int:
    """The 64-bit digest of an observation or action (see the module docstring); a value
    whose ``repr`` raised is ``UNREADABLE``'s leaf, so hashing never fails a run."""
    try:
        return _digest(value)
    except Exception:
        return absorb(LEAF_SEED, UNREADABLE)


def hex_digest(digest: int) -> str:
    """A digest as a results file writes it: 16 lowercase hex digits."""
    return f"{digest:016x}"


def value_digest(value: Any) -> str:
    """The digest of an observation or action, as 16 hex digits: an episode's
    ``reset_digest`` is this of its first observation.

    Example:
        >>> value_digest(1) == value_digest(True), value_digest(1.0) == value_digest(1)
        (False, False)
    """
    return hex_digest(digest_of(value))


def digests_of(values: Sequence[Any]) -> np.ndarray:
    """``digest_of`` each of ``values``, as a uint64 array; arrays of one dtype and shape
    (a round's observations, most often) are hashed together."""
    first = values[0] if len(values) else None
    # Small arrays stacked, so numpy's calls are paid once; a large one (an image) is hashed
    # where it lies, as a copy would cost more than the calls.
    if (
        len(values) > 1
        and type(first) is np.ndarray
        and first.nbytes <= STACKED_BYTES
        and _readable(first)
    ):
        dtype, shape = first.dtype, first.shape
        if all(
            type(value) is np.ndarray and value.dtype == dtype and value.shape == shape
            for value in values
        ):
            rows = np.array(values).reshape(len(values), -1).view(np.uint8)
            return absorb_many(leaf_prefix(dtype.kind, dtype.itemsize, shape), bulk_rows(rows))
    return np.array([digest_of(value) for value in values], dtype=_U64)


def batch_digests(batch: Any, count: int) -> np.ndarray:
    """The digest of each of the ``count`` actions of a batch along a leading lane axis (an
    array, or a dict or tuple of them), as a uint64 array: each equals ``digest_of`` of the
    action its lane's env receives (its row; a dict or tuple of its rows)."""
    try:
        return _batch(batch, count)
    except Exception:
        return _rows(batch, count)


def _row(batch: Any, k: int) -> Any:
    try:
        return batch[k]
    except Exception:
        return None


def _rows(batch: Any, count: int) -> np.ndarray:
    """``digest_of`` each row of ``batch``, one by one."""
    return np.array([digest_of(_row(batch, k)) for k in range(count)], dtype=_U64)


def _batch(batch: Any, count: int) -> np.ndarray:
    if isinstance(batch, dict):
        items = sorted(((_text(key), leaf) for key, leaf in batch.items()), key=_first)
        states = absorb_many(DICT_SEED, np.full(count, len(items), dtype=_U64))
        for key, leaf in items:
            states = absorb_many(absorb_many(states, _U64(text_digest(key))), _batch(leaf, count))
        return states
    if isinstance(batch, tuple):
        states = absorb_many(TUPLE_SEED, np.full(count, len(batch), dtype=_U64))
        for leaf in batch:
            states = absorb_many(states, _batch(leaf, count))
        return states
    array = canonical(batch) if isinstance(batch, np.ndarray) else None
    if array is None or array.ndim == 0 or array.shape[0] != count:
        return _rows(batch, count)
    prefix = leaf_prefix(array.dtype.kind, array.dtype.itemsize, array.shape[1:])
    rows = array.reshape(count, -1).view(np.uint8) if count else np.zeros((0, 0), np.uint8)
    return absorb_many(prefix, bulk_rows(rows))


class LaneDigests:
    """Each lane's running digests, kept by the ``RoundRunner`` (internal to it, in both
    cores): an episode's reset digest once its first observation arrives, and its trajectory
    as its steps are recorded, started afresh with every episode, so a lane's episodes never
    mix.

    A step's parts arrive in separate calls, in any order within the step: ``act`` (the
    actions the core hands the envs), ``observe`` (what the step returned), then ``step`` (its
    reward and flags, once the round is recorded) folds them into the trajectory.

    Args:
        num_lanes: the run's lanes.
        enabled: False computes nothing and gives every episode no digests (for measuring
            what the digests cost; a run always keeps them).
    """

    def __init__(self, num_lanes: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self._awaiting = [False] * num_lanes
        self._reset: list[int | None] = [None] * num_lanes
        self._trajectory = np.zeros(num_lanes, dtype=_U64)
        self._action = np.zeros(num_lanes, dtype=_U64)
        self._observation = np.zeros(num_lanes, dtype=_U64)

    def begin(self, lanes: Sequence[int]) -> None:
        """Episodes started on ``lanes``: each awaits its first observation."""
        if not self.enabled:
            return
        for lane in lanes:
            self._awaiting[lane] = True
            self._reset[lane] = None

    def begin_with(self, lane: int, observation: Any) -> None:
        """An episode started on ``lane`` with ``observation`` already there (a vector that
        restarts its lanes itself returned it with a step)."""
        if not self.enabled:
            return
        self._first(lane, digest_of(observation))

    def _first(self, lane: int, digest: int) -> None:
        self._awaiting[lane] = False
        self._reset[lane] = digest
        self._trajectory[lane] = absorb(TRAJECTORY_SEED, digest)
        self._action[lane] = self._observation[lane] = 0

    def observe(self, lanes: Sequence[int], observations: Sequence[Any], running: Any) -> None:
        """Observations arrived for ``lanes``: an episode's first, or what the step a running
        lane is taking returned (``running(lane)``); any other lane's is not hashed."""
        if not self.enabled or not len(lanes):
            return
        awaiting = self._awaiting
        kept = [k for k, lane in enumerate(lanes) if awaiting[lane] or running(lane)]
        if not kept:
            return
        digests = digests_of([observations[k] for k in kept]).tolist()
        for k, digest in zip(kept, digests, strict=True):
            lane = lanes[k]
            if awaiting[lane]:
                self._first(lane, digest)
            else:
                self._observation[lane] = digest

    def observe_steps(self, lanes: Sequence[int], observations: Sequence[Any]) -> None:
        """What the step each of ``lanes`` (running, past their first observation) took
        returned."""
        if not self.enabled or not len(lanes):
            return
        self._observation[np.asarray(lanes, dtype=np.int64)] = digests_of(observations)

    def act(self, lanes: Sequence[int], actions: Any) -> None:
        """The actions ``[K, ...]`` (or a dict or tuple of them) handed to ``lanes``' envs."""
        if not self.enabled or not len(lanes):
            return
        self._action[np.asarray(lanes, dtype=np.int64)] = batch_digests(actions, len(lanes))

    def act_integers(self, lanes: Sequence[int], values: Sequence[int]) -> None:
        """``lanes``' envs got int64 scalars of ``values``: as rows of an int64 batch."""
        if not self.enabled or not len(lanes):
            return
        rows = np.asarray(values, dtype="<i8").reshape(len(values), 1).view(np.uint8)
        digests = absorb_many(leaf_prefix("i", 8, ()), bulk_rows(rows))
        self._action[np.asarray(lanes, dtype=np.int64)] = digests

    def step(
        self, lanes: Sequence[int], rewards: np.ndarray, terminated: Any, truncated: Any
    ) -> None:
        """The step of ``lanes`` was recorded, with these rewards and the env's flags: fold
        each lane's action, observation, reward and flags into its trajectory."""
        if not self.enabled or not len(lanes):
            return
        at = np.asarray(lanes, dtype=np.int64)
        rewards = np.asarray(rewards, dtype="<f8").view("<u8")
        flags = np.add(terminated, np.multiply(truncated, 2, dtype=_U64), dtype=_U64)
        state = absorb_many(self._trajectory[at], self._action[at])
        state = absorb_many(state, self._observation[at])
        self._trajectory[at] = absorb_many(absorb_many(state, rewards), flags)
        self._action[at] = self._observation[at] = 0

    def episode(self, lane: int) -> tuple[int | None, int | None]:
        """``(reset, trajectory)`` of ``lane``'s episode; None before its first observation
        (a reset that failed) and when disabled."""
        reset = self._reset[lane] if self.enabled else None
        if reset is None:
            return None, None
        return reset, int(self._trajectory[lane])
