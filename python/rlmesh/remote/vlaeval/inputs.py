"""How a vla-eval observation becomes a model's input on rlmesh's vla-eval server:
``ObservationInputs``, the shared reading (``rlmesh.remote.websocket.inputs``) with vla-eval's
error and its array kinds (booleans, integers and floats, the kinds its codec carries).

A model whose spec has a dict input gets the spec's slots, each read from the observation
under the slot's name (nested slots in nested dicts, or under the flat key ``"a/b"``); a spec
of one leaf gets the value under the leaf's key; a model without a spec gets the observation
dict as it is. Text stays ``str`` (a list of one per lane), numbers and lists become arrays.

Example:
    >>> import numpy as np
    >>> lane = ObservationInputs(None).lane({"state": [1.0, 2.0], "task_description": "go"})
    >>> lane["state"].shape, lane["task_description"], batching_key(lane)
    ((1, 2), ['go'], ((('state',), '<f8', (2,)), (('task_description',), 'text')))
    >>> ObservationInputs(None).lane({"names": ["a", "b"]})
    Traceback (most recent call last):
    ...
    rlmesh.remote.vlaeval.codec.VlaEvalWireError: observation['names'] is a list that makes ...
"""

from __future__ import annotations

from ..websocket import inputs
from ..websocket.inputs import batching_key
from .codec import ALLOWED_KINDS, VlaEvalWireError


class ObservationInputs(inputs.ObservationInputs):
    """How a vla-eval observation becomes one lane's model input: a bad one raises
    ``VlaEvalWireError``, and only numeric arrays are taken.

    Example:
        >>> import numpy as np
        >>> from rlmesh.adapters import ModelSpec, State, Text
        >>> spec = ModelSpec(input={"state": State("s"), "task_description": Text("t")})
        >>> lane = ObservationInputs(spec).lane({"state": np.zeros(2), "task_description": "go"})
        >>> lane["state"].shape, lane["task_description"]
        ((1, 2), ['go'])
    """

    protocol = "vla-eval"
    wire_error = VlaEvalWireError
    kinds = ALLOWED_KINDS
    kinds_text = "numeric array"


__all__ = ["ObservationInputs", "batching_key"]
