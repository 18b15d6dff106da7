"""The JAX flavour of the model API: ``rlmesh.jax.Model``, whose corners get ``jax.Array``
inputs on the model's ``device``, and the conversions ``asarray`` / ``from_array``.

A corner receives what the numpy model gets, with every numeric array a ``jax.Array``: a Dict
observation as a dict of arrays, text leaves still lists of strings, frame stacks and chunks
of the same shapes. It may return JAX arrays on any device, numpy arrays or numbers. A run
converts once per model call for the whole batch: on the CPU through DLPack, sharing the
numpy payload rlmesh assembled for that call (the cores start each payload array on the
64-byte boundary XLA needs to share a buffer; it copies an array passed otherwise); on another
device with one ``jax.device_put`` per leaf. A per-lane corner
(``predict``, ``predict_chunk``) gets its lane's part of that one batch, all lanes cut in one
compiled call. Outputs come back to numpy once per call; bfloat16 (and other float types
numpy lacks) come back as float32.

64-bit types: JAX keeps int64, uint64, float64 and complex128 only with ``jax_enable_x64``;
otherwise it would silently make them 32-bit. rlmesh refuses them instead, naming the leaf
and the fixes: ``jax.config.update("jax_enable_x64", True)`` before the run, or a
``ModelSpec`` that casts the leaf (e.g. ``State(key, dtype="float32")``).

Importing ``rlmesh`` never imports JAX; importing this module does, and without it raises an
``ImportError`` naming the extra to install.

Example:
    >>> import numpy as np
    >>> import rlmesh
    >>> import rlmesh.jax
    >>> class Balance(rlmesh.jax.Model):
    ...     def predict_batch(self, obs):  # obs: a jax.Array [K, 4] (float32)
    ...         return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype("int32")
    >>> result = rlmesh.run(Balance(), "CartPole-v1", episodes=2, seed=0, num_envs=2)
    >>> [episode.steps > 0 for episode in result.episodes]
    [True, True]
    >>> rlmesh.jax.from_array(rlmesh.jax.asarray(np.arange(3, dtype=np.uint8))).tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as err:  # pragma: no cover - the jax extra is part of the test install
    raise ImportError(
        f"rlmesh.jax needs JAX, which does not import ({err}): pip install 'rlmesh[jax]'"
    ) from err

from .model import Model as _NumpyModel
from .model.tensors import TensorBridge, unsupported_dtype

__all__ = ["JaxBridge", "Model", "asarray", "device_of", "from_array"]

DeviceLike = str | jax.Device

# What a platform may be called in a device string: "gpu:0" and "cuda:0" both mean JAX's gpu.
_PLATFORMS = {"cuda": "gpu", "rocm": "gpu"}


class Model(_NumpyModel):
    """A model whose corners receive ``jax.Array`` inputs on ``device``.

    Args:
        fn: optional; ``Model(fn)`` makes ``fn(obs) -> action`` the ``predict`` corner.
        device: where the inputs go: ``"cpu"`` (the class attribute's default), ``"gpu"``,
            ``"gpu:1"``, ``"tpu:0"``, or a ``jax.Device``. Set it as a class attribute on a
            subclass, or pass it here (a string travels to worker processes and Ray workers; a
            ``jax.Device`` does not pickle).

    JAX arrays are immutable, so nothing a corner does to its inputs reaches rlmesh's buffers.

    Example:
        >>> import asyncio
        >>> import numpy as np
        >>> from rlmesh.model import ModelHandler
        >>> class Doubler(Model):
        ...     def predict_batch(self, obs):
        ...         return obs * 2  # obs is a jax.Array
        >>> handler = ModelHandler(Doubler())
        >>> asyncio.run(handler.predict(np.array([[1.0], [2.0]], np.float32), 2)).tolist()
        [[2.0], [4.0]]
    """

    device: DeviceLike = "cpu"

    def __init__(self, fn: Callable[[Any], Any] | None = None, *, device: DeviceLike | None = None):
        super().__init__(fn)
        if device is not None:
            self.device = device

    def tensor_bridge(self) -> JaxBridge:
        """The bridge to this model's ``device``."""
        return JaxBridge(self.device)


class JaxBridge(TensorBridge):
    """numpy payloads as ``jax.Array`` on ``device``, JAX outputs as numpy.

    Example:
        >>> import numpy as np
        >>> bridge = JaxBridge("cpu")
        >>> batch = bridge.to_model({"x": np.ones((2, 3), np.float32), "note": ["a", "b"]})
        >>> isinstance(batch["x"], jax.Array), batch["note"]
        (True, ['a', 'b'])
        >>> [lane["x"].shape for lane in bridge.lanes(batch, 2)]
        [(3,), (3,)]
    """

    framework = "jax"

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = device_of(device)
        self._cpu = self.device.platform == "cpu"

    def tensor(self, array: np.ndarray) -> jax.Array:
        _check_width(array.dtype)
        if self._cpu:
            try:
                # Shares the payload's memory: the cores start every payload array on the
                # 64-byte boundary XLA needs (it copies any other array), assemble a fresh one
                # per call and never write it afterwards.
                return jax.dlpack.from_dlpack(array)
            except (BufferError, TypeError, ValueError, RuntimeError):
                pass  # a layout DLPack does not take: device_put copies
        return jax.device_put(array, self.device)

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, jax.Array)

    def array(self, tensor: jax.Array) -> np.ndarray:
        return from_array(tensor)

    def split(self, tensor: jax.Array, count: int) -> Sequence[jax.Array]:
        # Indexing a jax.Array is one dispatch per lane (over 100 µs each); one compiled call
        # cuts every lane at once.
        return _unstack(tensor)

    def stack(self, tensors: list[jax.Array]) -> jax.Array | None:
        # On the CPU each array's host view is free; elsewhere one transfer of the stack.
        return None if self._cpu else jnp.stack(tensors)


@jax.jit
def _unstack(tensor: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(tensor[lane] for lane in range(tensor.shape[0]))


def device_of(device: DeviceLike) -> jax.Device:
    """A JAX device from a ``jax.Device`` or a string: ``"cpu"``, ``"gpu"``, ``"gpu:1"``,
    ``"cuda:0"``, ``"tpu:0"``.

    Raises:
        ValueError: a malformed string, or a platform or index this machine lacks (the
            message names what it has).

    Example:
        >>> device_of("cpu").platform
        'cpu'
        >>> device_of("cpu:7")
        Traceback (most recent call last):
        ...
        ValueError: device 'cpu:7': JAX has 1 cpu device(s) here (index 0 to 0)
    """
    if isinstance(device, jax.Device):
        return device
    if not isinstance(device, str):
        raise ValueError(f"device must be a jax.Device or a string like 'gpu:0', got {device!r}")
    name, _, index_text = device.partition(":")
    platform = _PLATFORMS.get(name.lower(), name.lower())
    try:
        index = int(index_text) if index_text else 0
    except ValueError:
        raise ValueError(
            f"device {device!r}: expected PLATFORM or PLATFORM:INDEX, e.g. 'cpu' or 'gpu:0'"
        ) from None
    try:
        devices = jax.devices(platform)
    except RuntimeError as err:
        present = sorted({each.platform for each in jax.devices()})
        raise ValueError(
            f"device {device!r}: JAX has no {platform} device here (platforms present: "
            f"{', '.join(present)}; {err})"
        ) from None
    if not 0 <= index < len(devices):
        raise ValueError(
            f"device {device!r}: JAX has {len(devices)} {platform} device(s) here (index 0 to "
            f"{len(devices) - 1})"
        )
    return devices[index]


def _check_width(dtype: np.dtype) -> None:
    """Refuse a 64-bit dtype while JAX would silently narrow it."""
    wide = dtype.kind in "iufc" and dtype.itemsize >= (16 if dtype.kind == "c" else 8)
    if wide and not jax.config.jax_enable_x64:
        raise unsupported_dtype(
            "jax",
            dtype,
            "jax_enable_x64 is off, so JAX would make it 32-bit",
            'call jax.config.update("jax_enable_x64", True) before the run, or cast the '
            "leaf in the model's ModelSpec (e.g. State(key, dtype='float32'))",
        )


def asarray(array: Any, *, device: DeviceLike | None = None) -> jax.Array:
    """``array`` (a numpy array, anything ``np.asarray`` takes, or a ``jax.Array``) as a
    ``jax.Array`` of the same dtype and shape on ``device`` (default: JAX's default device).
    A copy: changing the numpy array afterwards does not change it.

    Raises:
        TypeError: a dtype JAX cannot hold exactly: strings and objects, or a 64-bit dtype
            while ``jax_enable_x64`` is off (the message names the fix).

    Example:
        >>> import numpy as np
        >>> asarray(np.array([1, 2], np.int16)).dtype
        dtype('int16')
        >>> asarray(np.array([1.5]))  # float64 without jax_enable_x64
        Traceback (most recent call last):
        ...
        TypeError: jax cannot hold dtype float64 exactly: jax_enable_x64 is off, ...
    """
    target = None if device is None else device_of(device)
    if isinstance(array, jax.Array):
        return array if target is None else jax.device_put(array, target)
    array = np.asarray(array)
    if array.dtype.kind not in "biufc":
        raise unsupported_dtype(
            "jax", array.dtype, "an array holds numbers only", "keep text as lists of str"
        )
    _check_width(array.dtype)
    if (target or jax.devices()[0]).platform == "cpu":
        # device_put may alias an aligned numpy buffer on the CPU: copy it, so that changing
        # the array later leaves the (immutable) JAX array as it was.
        array = array.copy()
    return jax.device_put(array, target)


def from_array(array: Any) -> np.ndarray:
    """A ``jax.Array`` as a numpy array on the host, of the same dtype and shape; bfloat16
    and other float types numpy lacks as float32. On the CPU the result is a read-only view of
    the JAX buffer. Anything else goes through ``np.asarray``.

    Raises:
        TypeError: a dtype numpy cannot hold (e.g. int4), naming it.

    Example:
        >>> import jax.numpy as jnp
        >>> from_array(jnp.array([1.5, 2.0], dtype=jnp.bfloat16))
        array([1.5, 2. ], dtype=float32)
    """
    if not isinstance(array, jax.Array):
        return np.asarray(array)
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biufc":  # an ml_dtypes type: bfloat16, float8_*, int4, ...
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(
                f"numpy cannot hold JAX dtype {dtype} exactly: cast it (e.g. "
                f".astype('int8')) before returning it"
            )
        array = array.astype(jnp.float32)
    return np.asarray(array)
