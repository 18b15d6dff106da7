"""The tensor bridge: how a model written in a framework (``rlmesh.torch``, ``rlmesh.jax``) gets
its inputs as the framework's tensors and gives its actions back as numpy.

A model that wants tensors returns a ``TensorBridge`` from ``Model.tensor_bridge()``; the base
``Model`` returns None (numpy in, numpy out). ``ModelHandler`` asks once, when it is made, and
then converts every call's payload once for the whole batch (``to_model``), hands a per-lane
corner each lane's part of that one converted batch (``lanes``), and turns what the model
returned into numpy once per call (``from_model``, ``from_lanes``). Nothing else in a run knows
of frameworks: the cores assemble numpy payloads and apply numpy actions as for any model.

What is converted: every array leaf of a numeric dtype (bool, signed and unsigned integers,
floats, complex). Text leaves (lists of strings), state leaves asked for as lists, and arrays
of other dtypes reach the model as they are. A framework subclass supplies the conversion of
one leaf (``tensor``, ``array``) and how a batch splits into lanes (``split``) or per-lane
outputs stack (``stack``); the tree walking is here, once.

Example:
    >>> import numpy as np
    >>> class Halves(TensorBridge):  # a toy framework: its "tensors" are float64 halves
    ...     def tensor(self, array):
    ...         return array.astype(np.float64) / 2
    ...     def is_tensor(self, value):
    ...         return False  # its outputs are numpy already
    >>> bridge = Halves()
    >>> batch = bridge.to_model({"x": np.array([2, 4]), "note": ["a", "b"]})
    >>> batch["x"].tolist(), batch["note"]
    ([1.0, 2.0], ['a', 'b'])
    >>> [float(lane["x"]) for lane in bridge.lanes(batch, 2)], bridge.lanes(batch, 2)[1]["note"]
    ([1.0, 2.0], 'b')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ModelDefinitionError, ModelOutputError
from ..utils import path_text

# The dtype kinds a framework tensor holds: bool, signed and unsigned integers, floats, complex.
NUMERIC_KINDS = frozenset("biufc")


class TensorBridge:
    """Converts a model's inputs to a framework's tensors and its outputs back to numpy.

    A subclass overrides ``tensor`` and ``is_tensor``, and ``array``, ``split`` and ``stack``
    when the defaults do not fit. ``to_model``, ``lanes``, ``from_model`` and ``from_lanes``
    walk the trees (dicts nest; anything else is a leaf) and are what ``ModelHandler`` calls.
    """

    framework = "numpy"

    # ------------------------------------------------------------------ one leaf

    def tensor(self, array: np.ndarray) -> Any:
        """One numeric array leaf, the whole batch ``[K, ...]``, as the framework's tensor on
        the model's device. Raises ``TypeError`` naming the dtype and the fix when the
        framework cannot hold it."""
        raise NotImplementedError(f"{type(self).__name__} does not define tensor()")

    def is_tensor(self, value: Any) -> bool:
        """Whether ``value`` is one of the framework's tensors (which ``array`` converts)."""
        raise NotImplementedError(f"{type(self).__name__} does not define is_tensor()")

    def array(self, tensor: Any) -> np.ndarray:
        """One of the framework's tensors as a numpy array on the host."""
        return np.asarray(tensor)

    def split(self, tensor: Any, count: int) -> Sequence[Any]:
        """A converted batch leaf as its ``count`` lanes' parts, in lane order."""
        return [tensor[lane] for lane in range(count)]

    def stack(self, tensors: list[Any]) -> Any | None:
        """Per-lane output tensors of one shape and dtype as one tensor ``[K, ...]``, where
        one transfer of the stack beats one per lane; None to convert each instead."""
        return None

    # ------------------------------------------------------------------ trees

    def to_model(self, payload: Any) -> Any:
        """A call's whole payload (an array ``[K, ...]`` or a dict of leaves) in the
        framework's tensors: one conversion per leaf for all lanes.

        Raises:
            ModelDefinitionError: a leaf's dtype the framework cannot hold; the message names
                the leaf, the dtype and the fix.
        """
        if isinstance(payload, np.ndarray):  # the common case: one array
            return self._leaf_in(payload, ())
        return self._tree_in(payload, ())

    def lanes(self, converted: Any, count: int) -> list[Any]:
        """Each lane's input, in lane order, from a converted batch: views (or parts) of the
        one conversion, never a conversion per lane."""
        return self._lane_values(converted, count)

    def from_model(self, output: Any) -> Any:
        """A batched corner's output with every framework tensor as a numpy array (in the
        output's structure: an array, or a dict of them)."""
        if self.is_tensor(output):
            return self._array_out(output, ())
        if isinstance(output, dict):
            return {key: self._tree_out(value, (str(key),)) for key, value in output.items()}
        return self._tree_out(output, ())

    def from_lanes(self, outputs: list[Any]) -> list[Any]:
        """Per-lane outputs in lane order, each as numpy: one transfer of their stack when
        every lane returned a tensor of one shape and dtype (and ``stack`` accepts), else one
        conversion per lane."""
        if outputs and all(self.is_tensor(output) for output in outputs):
            first = outputs[0]
            if all(
                output.shape == first.shape and output.dtype == first.dtype for output in outputs
            ):
                stacked = self.stack(outputs)
                if stacked is not None:
                    return list(self._array_out(stacked, ()))
        return [self.from_model(output) for output in outputs]

    def around(self, call: Callable[..., Any], *, context: bool = False) -> Callable[..., Any]:
        """A synchronous batched corner ``call(payload) -> output`` (``call(payload, context=
        contexts)`` with ``context=True``) as one that takes the numpy payload and returns
        numpy: ``to_model`` before, ``from_model`` after. A run calls a batched corner through
        this, once per call, so a subclass may override it with a closure that does both
        conversions in one Python frame (the common case's cost).

        Example:
            >>> import numpy as np
            >>> class Halves(TensorBridge):
            ...     def tensor(self, array):
            ...         return array / 2
            ...     def is_tensor(self, value):
            ...         return False
            >>> Halves().around(lambda obs: obs + 1)(np.array([2, 4])).tolist()
            [2.0, 3.0]
        """
        to_model, from_model = self.to_model, self.from_model

        def converted(payload: Any) -> Any:
            return from_model(call(to_model(payload)))

        def converted_with_context(payload: Any, context: Any) -> Any:
            return from_model(call(to_model(payload), context=context))

        return converted_with_context if context else converted

    # ------------------------------------------------------------------ helpers

    def _leaf_in(self, array: np.ndarray, path: tuple[str, ...]) -> Any:
        if array.dtype.kind not in NUMERIC_KINDS:
            return array  # strings, objects: nothing a tensor holds
        try:
            return self.tensor(array)
        except TypeError as err:
            raise ModelDefinitionError(
                f"the model's input {path_text('obs', path)} cannot become a {self.framework} "
                f"tensor: {err}"
            ) from None

    def _tree_in(self, node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {key: self._tree_in(value, (*path, str(key))) for key, value in node.items()}
        if isinstance(node, np.ndarray):
            return self._leaf_in(node, path)
        return node  # text (a list of strings), state as lists, anything else: as it is

    def _lane_values(self, node: Any, count: int) -> list[Any]:
        if isinstance(node, dict):
            columns = {key: self._lane_values(value, count) for key, value in node.items()}
            return [{key: column[lane] for key, column in columns.items()} for lane in range(count)]
        if self.is_tensor(node):
            return list(self.split(node, count))
        return [node[lane] for lane in range(count)]

    def _tree_out(self, node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {key: self._tree_out(value, (*path, str(key))) for key, value in node.items()}
        if self.is_tensor(node):
            return self._array_out(node, path)
        if isinstance(node, (list, tuple)) and any(self.is_tensor(item) for item in node):
            # A list of per-lane tensors: numpy stacks their host copies.
            return [self._tree_out(item, path) for item in node]
        return node

    def _array_out(self, tensor: Any, path: tuple[str, ...]) -> np.ndarray:
        try:
            return self.array(tensor)
        except TypeError as err:
            raise ModelOutputError(
                f"the model returned {path_text('output', path)} as a {self.framework} tensor "
                f"numpy cannot hold: {err}"
            ) from None


def unsupported_dtype(framework: str, dtype: Any, why: str, fix: str) -> TypeError:
    """The error a bridge raises for a dtype its framework cannot hold exactly: what, why and
    the fix, in one sentence.

    Example:
        >>> print(unsupported_dtype("jax", "int64", "64-bit types are off", "enable them"))
        jax cannot hold dtype int64 exactly: 64-bit types are off; enable them
    """
    return TypeError(f"{framework} cannot hold dtype {dtype} exactly: {why}; {fix}")
