"""rlmesh-wire-v1 values: spaces as ``SpaceSpec``, batches as ``SpaceValue``, infos as ``MetaMap``.

The wire is not self-describing: a ``SpaceValue`` is one ``bytes`` per leaf of the space both
peers agreed on (``rlmesh.spaces.space_leaves`` order), each the leaf's little-endian
elements at its declared dtype, ``[N, *shape]`` row-major for a batch of ``N``. ``N`` always
comes from the enclosing message. A ``Text`` leaf is ``[u64 count][u64 byte length x count]``
then the UTF-8 bodies.

Every decode checks what it is given against the space (leaf count, byte lengths, dtypes
known) and raises ``WireFormatError`` naming the leaf and what was expected, so a malformed
message never reaches an env or a model.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> codec = SpaceCodec(gym.spaces.Box(-1, 1, (3,), np.float32))
    >>> value = codec.encode(np.ones((2, 3)), rows=2)
    >>> [len(leaf) for leaf in value.leaves]
    [24]
    >>> codec.decode(value, rows=2).dtype
    dtype('float32')
    >>> space_from_spec(space_spec(gym.spaces.Discrete(4, start=1)))
    Discrete(4, start=1)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from ..errors import RlmeshError
from ..spaces import batch_from_leaves, batch_leaves, leaf_shape, space_leaves
from .wire.spaces.v1 import meta_pb2, spaces_pb2, types_pb2, value_pb2

PROTOCOL_GENERATION = "rlmesh-wire-v1"
"""The byte contract both peers must name exactly at handshake."""

WORKFLOW_EDITION = "2026.06"
"""The behavioural contract (``docs/editions/2026.06.md`` of rlmesh 0.1.0) this package follows."""


class WireFormatError(RlmeshError, ValueError):
    """A message that does not match the spaces agreed at handshake (wrong leaf count, byte
    length, dtype or structure), or a value the wire cannot carry."""


_DTYPES: dict[int, np.dtype[Any]] = {
    types_pb2.DATA_TYPE_BOOL: np.dtype(np.bool_),
    types_pb2.DATA_TYPE_UINT8: np.dtype(np.uint8),
    types_pb2.DATA_TYPE_UINT16: np.dtype(np.uint16),
    types_pb2.DATA_TYPE_UINT32: np.dtype(np.uint32),
    types_pb2.DATA_TYPE_UINT64: np.dtype(np.uint64),
    types_pb2.DATA_TYPE_INT8: np.dtype(np.int8),
    types_pb2.DATA_TYPE_INT16: np.dtype(np.int16),
    types_pb2.DATA_TYPE_INT32: np.dtype(np.int32),
    types_pb2.DATA_TYPE_INT64: np.dtype(np.int64),
    types_pb2.DATA_TYPE_FLOAT16: np.dtype(np.float16),
    types_pb2.DATA_TYPE_FLOAT32: np.dtype(np.float32),
    types_pb2.DATA_TYPE_FLOAT64: np.dtype(np.float64),
}
_WIRE_DTYPES = {dtype: code for code, dtype in _DTYPES.items()}


def wire_dtype(dtype: Any, where: str = "the space") -> int:
    """The ``DataType`` of a numpy dtype; ``WireFormatError`` for one the wire lacks."""
    try:
        return _WIRE_DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise WireFormatError(
            f"{where} has dtype {dtype}, which rlmesh-wire-v1 cannot carry: expected one of "
            f"{sorted(str(d) for d in _DTYPES.values())}"
        ) from None


def numpy_dtype(code: int, where: str = "the space") -> np.dtype[Any]:
    """The numpy dtype of a ``DataType``; ``WireFormatError`` for an unknown one."""
    try:
        return _DTYPES[code]
    except KeyError:
        raise WireFormatError(
            f"{where} has DataType {code}, which rlmesh-wire-v1 does not define (1..12)"
        ) from None


# ------------------------------------------------------------------------------ spaces


def space_spec(space: gymnasium.Space[Any], where: str = "space") -> spaces_pb2.SpaceSpec:
    """The ``SpaceSpec`` of a Gymnasium space.

    Raises:
        WireFormatError: a space or dtype the wire cannot describe, naming its path.
    """
    if isinstance(space, spaces.Dict):
        keys = [str(key) for key in space.spaces]
        return spaces_pb2.SpaceSpec(
            dict=spaces_pb2.DictSpec(
                keys=keys,
                spaces=[
                    space_spec(child, f"{where}/{key}")
                    for key, child in zip(keys, space.spaces.values(), strict=True)
                ],
            )
        )
    if isinstance(space, spaces.Tuple):
        return spaces_pb2.SpaceSpec(
            tuple=spaces_pb2.TupleSpec(
                spaces=[space_spec(child, f"{where}/{i}") for i, child in enumerate(space.spaces)]
            )
        )
    if isinstance(space, spaces.Text):
        return spaces_pb2.SpaceSpec(
            text=spaces_pb2.TextSpec(
                min_length=space.min_length,
                max_length=space.max_length,
                charset="".join(sorted(space.character_set)),
            )
        )
    if not isinstance(
        space, (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)
    ):
        raise WireFormatError(
            f"{where} is a {type(space).__name__}, which rlmesh-wire-v1 cannot describe: "
            f"expected Box, Discrete, MultiBinary, MultiDiscrete, Text, Dict or Tuple"
        )
    spec = spaces_pb2.SpaceSpec(shape=list(leaf_shape(space)), dtype=wire_dtype(space.dtype, where))
    if isinstance(space, spaces.Box):
        spec.box.CopyFrom(_box_bounds(space))
    elif isinstance(space, spaces.Discrete):
        spec.discrete.n = int(space.n)
        spec.discrete.start = int(space.start)
    elif isinstance(space, spaces.MultiBinary):
        spec.multi_binary.SetInParent()
    else:
        spec.multi_discrete.nvec.extend(int(n) for n in np.asarray(space.nvec).ravel())
    return spec


def _box_bounds(space: spaces.Box) -> spaces_pb2.BoxSpec:
    low, high = np.asarray(space.low, space.dtype), np.asarray(space.high, space.dtype)
    floating = np.issubdtype(space.dtype, np.floating)
    if floating and np.all(np.isneginf(low)) and np.all(np.isposinf(high)):
        return spaces_pb2.BoxSpec(unbounded=True)
    if low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0]):
        return spaces_pb2.BoxSpec(
            uniform=spaces_pb2.UniformBounds(
                low=low.flat[0:1].astype(low.dtype.newbyteorder("<")).tobytes(),
                high=high.flat[0:1].astype(high.dtype.newbyteorder("<")).tobytes(),
            )
        )
    little = space.dtype.newbyteorder("<")
    return spaces_pb2.BoxSpec(
        elementwise=spaces_pb2.ElementwiseBounds(
            low=low.astype(little).tobytes(), high=high.astype(little).tobytes()
        )
    )


def space_from_spec(spec: spaces_pb2.SpaceSpec, where: str = "space") -> gymnasium.Space[Any]:
    """The Gymnasium space a ``SpaceSpec`` describes.

    Raises:
        WireFormatError: an unknown kind or dtype, or bounds of the wrong byte length.
    """
    kind = spec.WhichOneof("spec")
    if kind == "dict":
        if len(spec.dict.keys) != len(spec.dict.spaces):
            raise WireFormatError(
                f"{where}: DictSpec has {len(spec.dict.keys)} keys but "
                f"{len(spec.dict.spaces)} spaces"
            )
        return spaces.Dict(
            {
                key: space_from_spec(child, f"{where}/{key}")
                for key, child in zip(spec.dict.keys, spec.dict.spaces, strict=True)
            }
        )
    if kind == "tuple":
        return spaces.Tuple(
            [space_from_spec(child, f"{where}/{i}") for i, child in enumerate(spec.tuple.spaces)]
        )
    if kind == "text":
        text = spec.text
        charset = text.charset or None
        kwargs: dict[str, Any] = {"min_length": text.min_length}
        if charset is not None:
            kwargs["charset"] = charset
        return spaces.Text(text.max_length, **kwargs)
    if kind is None:
        raise WireFormatError(f"{where}: SpaceSpec names no space kind")
    dtype = numpy_dtype(spec.dtype, where)
    shape = tuple(int(n) for n in spec.shape)
    if kind == "discrete":
        return spaces.Discrete(spec.discrete.n, start=spec.discrete.start, dtype=dtype)
    if kind == "multi_binary":
        return spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    if kind == "multi_discrete":
        return spaces.MultiDiscrete(
            np.asarray(spec.multi_discrete.nvec).reshape(shape), dtype=dtype
        )
    low, high = _bounds_from_spec(spec.box, dtype, shape, where)
    return spaces.Box(low, high, shape, dtype)


def _bounds_from_spec(
    box: spaces_pb2.BoxSpec, dtype: np.dtype[Any], shape: tuple[int, ...], where: str
) -> tuple[np.ndarray, np.ndarray]:
    little = dtype.newbyteorder("<")
    which = box.WhichOneof("bounds")
    if which is None or which == "unbounded":
        if not np.issubdtype(dtype, np.floating):
            info = np.iinfo(dtype) if dtype != np.bool_ else None
            lo, hi = (0, 1) if info is None else (info.min, info.max)
            return np.full(shape, lo, dtype), np.full(shape, hi, dtype)
        return np.full(shape, -np.inf, dtype), np.full(shape, np.inf, dtype)
    bounds = getattr(box, which)
    count = 1 if which == "uniform" else int(np.prod(shape, dtype=np.int64))
    arrays = []
    for name in ("low", "high"):
        raw = getattr(bounds, name)
        if len(raw) != count * dtype.itemsize:
            raise WireFormatError(
                f"{where}: Box {which} {name} has {len(raw)} bytes, expected "
                f"{count * dtype.itemsize} ({count} x {dtype})"
            )
        values = np.frombuffer(raw, little).astype(dtype)
        arrays.append(
            np.broadcast_to(values, shape).copy() if which == "uniform" else values.reshape(shape)
        )
    return arrays[0], arrays[1]


# ------------------------------------------------------------------------------ values


class SpaceCodec:
    """Encodes and decodes batches of one space's values.

    Args:
        space: the agreed space; its leaves fix the ``SpaceValue`` layout.

    Example:
        >>> import gymnasium as gym
        >>> space = gym.spaces.Dict({"t": gym.spaces.Text(8), "k": gym.spaces.Discrete(3)})
        >>> codec = SpaceCodec(space)
        >>> batch = codec.decode(codec.encode({"k": [2, 0], "t": ["go", "stop"]}, rows=2), rows=2)
        >>> batch["k"].tolist(), batch["t"]
        ([2, 0], ['go', 'stop'])
    """

    def __init__(self, space: gymnasium.Space[Any]) -> None:
        self.space = space
        self._leaves = [
            (
                "/".join(path) or "value",
                None if isinstance(leaf, spaces.Text) else np.dtype(leaf.dtype),
                leaf_shape(leaf),
            )
            for path, leaf in space_leaves(space)
        ]
        # Per numeric leaf, fixed once: the wire's (little-endian) dtype, whether it is this
        # host's own (then bytes go out and come in without a conversion), bytes per row.
        self._layout = [
            None
            if dtype is None
            else (
                dtype.newbyteorder("<"),
                dtype.newbyteorder("<") == dtype,
                int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
            )
            for _, dtype, shape in self._leaves
        ]
        # A space that is one numeric leaf (most envs): a batch is one array, and it skips the
        # tree walk both ways.
        self.single_array = (
            not isinstance(space, (spaces.Dict, spaces.Tuple)) and self._layout[0] is not None
        )

    def encode(self, batch: Any, rows: int) -> value_pb2.SpaceValue:
        """``batch`` (``rows`` values, batched as ``rlmesh.spaces`` describes) as a SpaceValue.

        Numbers are cast to the leaf's dtype; a float given for an integer leaf must hold
        whole numbers in range, never silently truncated.

        Raises:
            WireFormatError: a leaf of another shape than ``[rows, *shape]``, non-integral
                floats for an integer leaf, or a missing key.
        """
        return value_pb2.SpaceValue(leaves=self.encode_leaves(batch, rows))

    def encode_leaves(self, batch: Any, rows: int) -> list[bytes]:
        """``encode``'s leaves alone, to extend a message's ``SpaceValue`` in place (a
        SpaceValue handed to a message is copied into it)."""
        if self.single_array:
            return [self._encode_leaf(0, batch, rows)]
        try:
            leaf_batches = batch_leaves(self.space, batch)
        except (KeyError, ValueError) as err:
            raise WireFormatError(str(err).strip("'\"")) from None
        out = []
        for position, leaf in enumerate(leaf_batches):
            if self._layout[position] is None:
                out.append(_encode_text(leaf, rows, self._leaves[position][0]))
            else:
                out.append(self._encode_leaf(position, leaf, rows))
        return out

    def _encode_leaf(self, position: int, leaf: Any, rows: int) -> bytes:
        where, dtype, shape = self._leaves[position]
        little, native, _ = self._layout[position]  # type: ignore[misc]
        array = leaf if type(leaf) is np.ndarray else np.asarray(leaf)
        if array.shape != (rows, *shape):
            raise WireFormatError(
                f"{where} has shape {array.shape}, expected {(rows, *shape)} ({rows} rows of "
                f"{shape})"
            )
        if array.dtype != dtype:
            array = _cast(array, dtype, where)
        # tobytes() writes C order whatever the strides; only a foreign byte order converts.
        return array.tobytes() if native else np.ascontiguousarray(array, little).tobytes()

    def decode(self, value: value_pb2.SpaceValue, rows: int) -> Any:
        """The batch of ``rows`` values a SpaceValue holds (writable numpy arrays, lists of
        strings for text).

        Raises:
            WireFormatError: another number of leaves than the space has, or a leaf whose byte
                length is not ``rows * prod(shape) * itemsize`` (the leaf named).
        """
        if len(value.leaves) != len(self._leaves):
            raise WireFormatError(
                f"the value has {len(value.leaves)} leaves, expected {len(self._leaves)} "
                f"(one per leaf of {self.space})"
            )
        if self.single_array:
            return self._decode_leaf(0, value.leaves[0], rows)
        decoded = [
            _decode_text(raw, rows, self._leaves[position][0])
            if self._layout[position] is None
            else self._decode_leaf(position, raw, rows)
            for position, raw in enumerate(value.leaves)
        ]
        return batch_from_leaves(self.space, decoded)

    def _decode_leaf(self, position: int, raw: bytes, rows: int) -> np.ndarray:
        where, dtype, shape = self._leaves[position]
        little, native, row_bytes = self._layout[position]  # type: ignore[misc]
        if len(raw) != rows * row_bytes:
            raise WireFormatError(
                f"{where} has {len(raw)} bytes, expected {rows * row_bytes} ({rows} rows of "
                f"{shape} {dtype})"
            )
        # A copy either way: frombuffer over the message's bytes is read-only. Read at the
        # space's own dtype when it is the wire's, so the batch's dtype is exactly the space's.
        if native:
            array = np.frombuffer(raw, dtype).copy()
        else:
            array = np.frombuffer(raw, little).astype(dtype)
        return array.reshape((rows, *shape))


def _cast(array: np.ndarray, dtype: np.dtype[Any], where: str) -> np.ndarray:
    if np.issubdtype(dtype, np.integer) and np.issubdtype(array.dtype, np.floating):
        info = np.iinfo(dtype)
        ok = (
            np.isfinite(array)
            & (array == np.round(array))
            & (array >= info.min)
            & (array <= info.max)
        )
        if not ok.all():
            bad = array[~ok].flat[0].item()
            raise WireFormatError(
                f"{where}: {bad} is not a whole number in the range of {dtype}; floats are "
                f"sent for an integer leaf only when they hold whole numbers"
            )
    return array.astype(dtype)


_U64 = struct.Struct("<Q")


def _encode_text(leaf: Any, rows: int, where: str) -> bytes:
    texts = [leaf] if isinstance(leaf, str) else list(leaf)
    if len(texts) != rows or not all(isinstance(text, str) for text in texts):
        raise WireFormatError(f"{where}: expected a list of {rows} strings, got {leaf!r}")
    bodies = [text.encode("utf-8") for text in texts]
    header = _U64.pack(rows) + b"".join(_U64.pack(len(body)) for body in bodies)
    return header + b"".join(bodies)


def _decode_text(raw: bytes, rows: int, where: str) -> list[str]:
    head = 8 * (rows + 1)
    if len(raw) < head or _U64.unpack_from(raw)[0] != rows:
        raise WireFormatError(f"{where}: the text slab does not start with a count of {rows}")
    lengths = [_U64.unpack_from(raw, 8 * (i + 1))[0] for i in range(rows)]
    if head + sum(lengths) != len(raw):
        raise WireFormatError(
            f"{where}: the text slab has {len(raw)} bytes, its header announces "
            f"{head + sum(lengths)}"
        )
    out, offset = [], head
    for length in lengths:
        try:
            out.append(raw[offset : offset + length].decode("utf-8"))
        except UnicodeDecodeError as err:
            raise WireFormatError(f"{where}: text that is not UTF-8 ({err})") from None
        offset += length
    return out


# ------------------------------------------------------------------------------ metadata


def meta_map(values: Mapping[str, Any]) -> meta_pb2.MetaMap:
    """A dict (an info, reset options, spec metadata) as a MetaMap.

    Numbers, strings, bools, bytes, None, numpy scalars and arrays (as lists), lists and dicts
    travel as themselves; anything else as its ``repr``, so an info never fails a step.
    """
    out = meta_pb2.MetaMap()
    for key, value in values.items():
        out.entries[str(key)].CopyFrom(meta_value(value))
    return out


def meta_value(value: Any) -> meta_pb2.MetaValue:
    """One value as a MetaValue (see ``meta_map``); None as a MetaValue holding nothing."""
    if value is None:
        return meta_pb2.MetaValue()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return meta_pb2.MetaValue(bool=value)
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return meta_pb2.MetaValue(integer=value)
        return meta_pb2.MetaValue(number=float(value))
    if isinstance(value, float):
        return meta_pb2.MetaValue(number=value)
    if isinstance(value, str):
        return meta_pb2.MetaValue(text=value)
    if isinstance(value, (bytes, bytearray)):
        return meta_pb2.MetaValue(bytes=bytes(value))
    if isinstance(value, Mapping):
        return meta_pb2.MetaValue(map=meta_map(value))
    if isinstance(value, (list, tuple)):
        return meta_pb2.MetaValue(
            list=meta_pb2.MetaList(items=[meta_value(item) for item in value])
        )
    return meta_pb2.MetaValue(text=repr(value))


def from_meta_map(meta: meta_pb2.MetaMap) -> dict[str, Any]:
    """A MetaMap as a dict of plain Python values."""
    return {key: from_meta_value(value) for key, value in meta.entries.items()}


def from_meta_value(value: meta_pb2.MetaValue) -> Any:
    """One MetaValue as a plain Python value (None when it holds nothing)."""
    kind = value.WhichOneof("kind")
    if kind == "map":
        return from_meta_map(value.map)
    if kind == "list":
        return [from_meta_value(item) for item in value.list.items]
    return None if kind is None else getattr(value, kind)


__all__ = [
    "PROTOCOL_GENERATION",
    "WORKFLOW_EDITION",
    "SpaceCodec",
    "WireFormatError",
    "from_meta_map",
    "from_meta_value",
    "meta_map",
    "meta_value",
    "numpy_dtype",
    "space_from_spec",
    "space_spec",
    "wire_dtype",
]
