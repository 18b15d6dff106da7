"""How an observation from a WebSocket policy client becomes a model's input on rlmesh's
servers: ``ObservationInputs`` (one lane of input, as the model's ``spec`` reads it) and
``batching_key`` (which observations may share a model call).

A model whose spec has a dict input gets the spec's slots, each read from the observation
under the slot's name (nested slots in nested dicts, or under the flat key ``"a/b"``); other
keys of the observation are dropped. A spec of one leaf gets the value under the leaf's key;
a model without a spec (or whose spec has no input) gets the observation dict as it is. Text
stays ``str`` (a list of one per lane), numbers and lists become arrays; each leaf gains a
leading lane axis of 1. Nothing is converted or copied: sizes, layouts and dtypes are the
client's.

Example:
    >>> import numpy as np
    >>> from rlmesh.adapters import ModelSpec, State, Text
    >>> inputs = ObservationInputs(ModelSpec(input={"state": State("s"), "prompt": Text("p")}))
    >>> lane = inputs.lane({"state": np.zeros(2), "prompt": "go", "extra": 1})
    >>> lane["state"].shape, lane["prompt"], sorted(lane)
    ((1, 2), ['go'], ['prompt', 'state'])
    >>> batching_key(lane)
    ((('state',), '<f8', (2,)), (('prompt',), 'text'))
    >>> inputs.read({"state": np.ones(2), "prompt": "stop"})[1] == inputs.read(
    ...     {"state": np.zeros(2), "prompt": "go on"}
    ... )[1]
    True
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...adapters.inputs import input_leaves
from ...utils import leaves


class ObservationInputs:
    """How an observation becomes one lane's model input. A protocol's subclass names the
    protocol (``protocol``), the error a bad observation raises (``wire_error``, called with
    the text) and the array kinds an input may have (``kinds``, numpy's kind codes; by default
    any but object), named ``kinds_text`` in that error.

    Raises:
        ValueError: the spec has one input leaf that names a role, not an observation key.
    """

    protocol: ClassVar[str] = "a WebSocket policy"
    wire_error: ClassVar[type[ValueError]] = ValueError
    kinds: ClassVar[str] = "biufcmMSUV"
    kinds_text: ClassVar[str] = "array"

    def __init__(self, spec: Any) -> None:
        tree = None if spec is None else spec.input
        self.slots: list[tuple[str, ...]] | None = None
        self.single = False
        if tree is None:
            return
        found = list(input_leaves(tree))
        if len(found) == 1 and found[0][0] == ():
            key = found[0][1].key
            if not key:
                raise ValueError(
                    "the model's spec has one input leaf that names a role, not an observation "
                    f"key: an observation over {self.protocol}'s protocol cannot say which value "
                    "plays it; give the spec a dict input whose slots name the observation's keys"
                )
            self.slots = [tuple(key)]
            self.single = True
        else:
            self.slots = [slot for slot, _ in found]

    def lane(self, observation: dict[str, Any]) -> Any:
        """One lane of input (each leaf with a leading axis of 1), from ``observation``.

        Raises:
            wire_error: the observation lacks a key the spec names, or holds a value that is
                no array (of ``kinds``), number or text.
        """
        return self.read(observation)[0]

    def read(self, observation: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        """``lane(observation)`` and its ``batching_key``, in one walk of the observation.

        Raises:
            wire_error: as ``lane``.
        """
        key: list[Any] = []
        if self.slots is None:
            return self._as_dict(observation, key), tuple(key)
        if self.single:
            slot = self.slots[0]
            return self._as_lane(self._lookup(observation, slot), slot, key), tuple(key)
        payload: dict[str, Any] = {}
        for slot in self.slots:
            target = payload
            for name in slot[:-1]:
                target = target.setdefault(name, {})
            target[slot[-1]] = self._as_lane(self._lookup(observation, slot), slot, key)
        return payload, tuple(key)

    def _lookup(self, observation: dict[str, Any], slot: tuple[str, ...]) -> Any:
        value: Any = observation
        for name in slot:
            if not isinstance(value, dict) or name not in value:
                break
            value = value[name]
        else:
            return value
        flat = "/".join(slot)
        if flat in observation:
            return observation[flat]
        raise self.wire_error(
            f"the observation has no {flat!r}, which the model's spec reads; it holds "
            f"{sorted(map(str, observation))}"
        )

    def _as_dict(self, observation: dict[str, Any], key: list[Any]) -> dict[str, Any]:
        """``_as_lane`` of a whole observation, its arrays taken in one loop (the usual
        observation: a flat dict of arrays and text)."""
        lane: dict[str, Any] = {}
        kinds = self.kinds
        for name, value in observation.items():
            if type(value) is np.ndarray and value.dtype.kind in kinds:
                key.append((name, value.dtype, value.shape))
                lane[name] = value[None]
            else:
                lane[name] = self._as_lane(value, (str(name),), key)
        return lane

    def _as_lane(self, value: Any, path: tuple[str, ...], key: list[Any]) -> Any:
        """``value`` with a lane axis; each leaf's part of the batching key added to ``key``."""
        if type(value) is np.ndarray:  # what the codecs decode arrays to: no conversion
            array = value
        elif isinstance(value, dict):
            return {
                name: self._as_lane(item, (*path, str(name)), key) for name, item in value.items()
            }
        elif isinstance(value, str):
            key.append((path, "text"))
            return [value]
        else:
            array = np.asarray(value)
        if array.dtype.kind not in self.kinds:
            raise self.wire_error(
                f"observation[{'/'.join(path)!r}] is a {type(value).__name__} that makes no "
                f"{self.kinds_text}: expected arrays, numbers or text"
            )
        key.append((path, array.dtype, array.shape))
        return array[None]


def batching_key(payload: Any) -> tuple[Any, ...]:
    """Which lanes of input may share a model call: one structure, dtype and shape per leaf.
    (``ObservationInputs.read`` gives a key of its own form beside the lane: equal for two
    observations whenever this one is.)"""
    return tuple(
        (path, "text") if isinstance(leaf, list) else (path, leaf.dtype.str, leaf.shape[1:])
        for path, leaf in leaves(payload)
    )


__all__ = ["ObservationInputs", "batching_key"]
