"""The torch flavour of the model API: ``rlmesh.torch.Model``, whose corners get torch tensors
on the model's ``device``, and the conversions ``as_tensor`` / ``from_tensor``.

A corner receives what the numpy model gets, with every numeric array a tensor: a Dict
observation as a dict of tensors, text leaves still lists of strings, frame stacks and chunks
of the same shapes. It may return tensors on any device, numpy arrays or numbers. A run
converts once per model call for the whole batch: on the CPU the tensors are views of the
numpy payload rlmesh assembled for that call (no copy); toward a GPU the batch goes through
pinned host memory and one ``non_blocking`` copy per leaf. A per-lane corner (``predict``,
``predict_chunk``) gets its lane's row of that one converted batch. Outputs come back to numpy
once per call; bfloat16 (and other float types numpy lacks) come back as float32.

Each call's payload is a fresh array that nothing reads once the model has answered, so a
model may write into its input tensors: it cannot change another lane's frame stack or a
later call's input. A tensor from ``as_tensor(array)`` (``copy=False``) shares the array's
memory: writing into one changes the other.

Dtypes: bool, int8 to int64, uint8, float16, float32, float64 and complex map one to one.
uint16, uint32 and uint64 need torch 2.3 or later (older torch has no such tensors and
refuses them, naming the fix), and torch implements few operations on them: cast them (e.g.
``.long()``) before computing.

Importing ``rlmesh`` never imports torch; importing this module does, and without it raises
an ``ImportError`` naming the extra to install.

Example:
    >>> import numpy as np
    >>> import rlmesh
    >>> import rlmesh.torch
    >>> class Balance(rlmesh.torch.Model):
    ...     def predict_batch(self, obs):  # obs: a torch.Tensor [K, 4] on self.device
    ...         return (obs[:, 2] + 0.3 * obs[:, 3] > 0).long()
    >>> result = rlmesh.run(Balance(), "CartPole-v1", episodes=2, seed=0, num_envs=2)
    >>> [episode.steps > 0 for episode in result.episodes]
    [True, True]
    >>> rlmesh.torch.from_tensor(rlmesh.torch.as_tensor(np.arange(3, dtype=np.uint8))).tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as err:  # pragma: no cover - the torch extra is part of the test install
    raise ImportError(
        f"rlmesh.torch needs PyTorch, which does not import ({err}): pip install 'rlmesh[torch]'"
    ) from err

from .model import Model as _NumpyModel
from .model.tensors import TensorBridge, unsupported_dtype

__all__ = ["Model", "TorchBridge", "as_tensor", "from_tensor"]

DeviceLike = str | torch.device

# Float types numpy has; any other torch float (bfloat16, the float8 types) returns as float32.
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


class Model(_NumpyModel):
    """A model whose corners receive torch tensors on ``device``.

    Args:
        fn: optional; ``Model(fn)`` makes ``fn(obs) -> action`` the ``predict`` corner.
        device: where the inputs go: ``"cpu"`` (the class attribute's default), ``"cuda:0"``,
            a ``torch.device``. Set it as a class attribute on a subclass, or pass it here.

    The tensors a corner receives are views of the numpy payload rlmesh assembled for this
    call (on the CPU) or copies of it (on a GPU). Each call's payload is fresh, so writing into
    them cannot reach another lane or a later call; but they are not a copy of the env's
    observation to keep: clone what you keep beyond the call.

    Example:
        >>> import asyncio
        >>> import numpy as np
        >>> from rlmesh.model import ModelHandler
        >>> class Doubler(Model):
        ...     def predict_batch(self, obs):
        ...         return obs * 2  # obs is a torch.Tensor
        >>> handler = ModelHandler(Doubler())
        >>> asyncio.run(handler.predict(np.array([[1.0], [2.0]]), num_lanes=2)).tolist()
        [[2.0], [4.0]]
        >>> Model(abs, device="cpu").device
        'cpu'
    """

    device: DeviceLike = "cpu"

    def __init__(self, fn: Callable[[Any], Any] | None = None, *, device: DeviceLike | None = None):
        super().__init__(fn)
        if device is not None:
            self.device = device

    def tensor_bridge(self) -> TorchBridge:
        """The bridge to this model's ``device``."""
        return TorchBridge(self.device)


class TorchBridge(TensorBridge):
    """numpy payloads as torch tensors on ``device``, torch outputs as numpy.

    On the CPU a leaf is ``torch.from_numpy`` of the payload (a view; a read-only array goes
    through DLPack, which shares it without the warning ``from_numpy`` gives for those). For
    CUDA a leaf is copied once into pinned host memory (torch's caching host allocator keeps
    each block until its copy has run) and sent with ``non_blocking=True``, so the copy
    overlaps whatever the host does next until the model uses it.

    Example:
        >>> import numpy as np
        >>> bridge = TorchBridge("cpu")
        >>> batch = bridge.to_model({"x": np.ones((2, 3), np.float32), "note": ["a", "b"]})
        >>> type(batch["x"]).__name__, batch["note"]
        ('Tensor', ['a', 'b'])
        >>> [row.tolist() for row in bridge.from_lanes([torch.tensor(1), torch.tensor(2)])]
        [1, 2]
    """

    framework = "torch"

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = torch.device(device)
        self._cpu = self.device.type == "cpu"
        self._pinned = self.device.type == "cuda"

    def to_model(self, payload: Any) -> Any:
        if self._cpu and type(payload) is np.ndarray and payload.flags.writeable:
            try:  # the common case (one writeable array, as the cores assemble it) in one call
                return torch.from_numpy(payload)
            except (TypeError, ValueError):
                pass  # not numbers, or a reversed view: the general path says or copies
        return super().to_model(payload)

    def from_model(self, output: Any) -> Any:
        if type(output) is torch.Tensor:
            try:  # the common case (one CPU tensor numpy can hold) in one call
                return output.numpy()
            except (TypeError, RuntimeError):
                pass  # another device, grad, bfloat16...: the general path converts
        return super().from_model(output)

    def around(self, call: Callable[..., Any], *, context: bool = False) -> Callable[..., Any]:
        if context or not self._cpu:
            return super().around(call, context=context)
        # The common case (a writeable array in, a CPU tensor out) costs about what a
        # hand-written ``torch.from_numpy(obs)`` and ``.numpy()`` in the model cost: one frame,
        # local names, no keyword arguments; the read-only check is what it adds.
        from_numpy, tensor_type, numpy = torch.from_numpy, torch.Tensor, torch.Tensor.numpy
        to_model, from_model = self.to_model, self.from_model

        def converted(payload: Any) -> Any:
            try:
                inputs = from_numpy(payload) if payload.flags.writeable else to_model(payload)
            except (AttributeError, TypeError, ValueError):  # a dict, text, a reversed view
                inputs = to_model(payload)
            output = call(inputs)
            if type(output) is tensor_type:
                try:
                    return numpy(output)
                except (TypeError, RuntimeError):
                    pass  # needs grad, bfloat16, on a GPU: the general path converts
            return from_model(output)

        return converted

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        host = _host_tensor(array)
        if self._cpu:
            return host
        if self._pinned:
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def array(self, tensor: torch.Tensor) -> np.ndarray:
        return from_tensor(tensor)

    def split(self, tensor: torch.Tensor, count: int) -> Sequence[torch.Tensor]:
        return tensor.unbind(0)  # K views in one call

    def stack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(tensors)  # on their device: then one transfer, not one per lane


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """``array`` as a CPU tensor sharing its memory; ``TypeError`` naming the fix for a dtype
    this torch lacks."""
    try:
        if array.flags.writeable:
            return torch.from_numpy(array)
        # from_numpy warns on a read-only array; DLPack shares it as well, silently.
        return torch.from_dlpack(array)
    except ValueError:  # a negative stride (a reversed view), which tensors cannot have
        return _host_tensor(np.ascontiguousarray(array))
    except (TypeError, RuntimeError, BufferError) as err:
        if array.dtype.kind == "u" and array.dtype.itemsize > 1:
            why, fix = (
                f"torch {torch.__version__} has no {array.dtype} tensors ({err})",
                "upgrade to torch>=2.3, or cast the leaf in the model's ModelSpec (e.g. "
                "State(key, dtype='int64'))",
            )
        else:
            why, fix = str(err), "cast the leaf to another dtype in the model's ModelSpec"
        raise unsupported_dtype("torch", array.dtype, why, fix) from None


def as_tensor(array: Any, *, copy: bool = False, device: DeviceLike | None = None) -> torch.Tensor:
    """``array`` (a numpy array, anything ``np.asarray`` takes, or a tensor) as a torch tensor
    of the same dtype and shape, on ``device`` (default: where it is; the CPU for numpy).

    With ``copy=False`` a CPU tensor shares the array's memory (writing into either changes
    both); ``copy=True`` gives memory of its own.

    Raises:
        TypeError: a dtype torch cannot hold (strings, objects; uint16/32/64 before torch
            2.3), naming the fix.

    Example:
        >>> import numpy as np
        >>> array = np.array([1, 2], np.int16)
        >>> tensor = as_tensor(array)
        >>> tensor.dtype, np.shares_memory(array, tensor.numpy())
        (torch.int16, True)
        >>> as_tensor(np.array(["a"]))
        Traceback (most recent call last):
        ...
        TypeError: torch cannot hold dtype <U1 exactly: ...
    """
    if isinstance(array, torch.Tensor):
        tensor = array.clone() if copy else array
        return tensor if device is None else tensor.to(device)
    array = np.asarray(array)
    if array.dtype.kind not in "biufc":
        raise unsupported_dtype(
            "torch", array.dtype, "a tensor holds numbers only", "keep text as lists of str"
        )
    tensor = _host_tensor(array.copy() if copy else array)
    return tensor if device is None else tensor.to(device)


def from_tensor(tensor: Any) -> np.ndarray:
    """A torch tensor as a numpy array on the host, of the same dtype and shape; bfloat16 and
    other float types numpy lacks as float32. A CPU tensor's array shares its memory.
    Anything else goes through ``np.asarray``.

    Raises:
        TypeError: a dtype numpy cannot hold (a quantized or complex32 tensor).

    Example:
        >>> from_tensor(torch.tensor([1.5, 2.0], dtype=torch.bfloat16))
        array([1.5, 2. ], dtype=float32)
    """
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    try:
        # The common case in one call: a CPU tensor of a dtype numpy has, without grad.
        return tensor.numpy()
    except (TypeError, RuntimeError):
        pass  # on another device, needs grad, bfloat16, a lazy conjugate or negation
    tensor = tensor.detach()
    if tensor.dtype.is_floating_point and tensor.dtype not in _NUMPY_FLOATS:
        tensor = tensor.to(torch.float32)
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return tensor.resolve_conj().resolve_neg().numpy()
