"""The model: the ``Model`` base class (``base``), the handler that calls it the way a run
needs (``handler``: ``ModelHandler``, which is the core's ``RoundModel``), and the probe that
refuses a model that keeps state across calls (``probe``), and ``TemporalEnsemble``
(``ensemble``), the setting that executes a model's chunks by temporal ensembling.

Example:
    >>> import asyncio
    >>> import numpy as np
    >>> handler = ModelHandler(lambda obs: obs * 2)  # a bare callable is a predict
    >>> handler.corner
    'predict'
    >>> asyncio.run(handler.predict(np.array([[1.0], [2.0]]), num_lanes=2)).tolist()
    [[2.0], [4.0]]
"""

from ..core import RoundModel
from .base import CHUNKED_ORDER, CORNERS, UNCHUNKED_ORDER, Model, Route, defined_corners
from .ensemble import TemporalEnsemble
from .handler import ModelHandler, resolved
from .probe import PROBE_ROUNDS, PROBE_SPLIT_THRESHOLD, PROBE_THRESHOLD, QUICK_PROBE_CALLS

__all__ = [
    "CHUNKED_ORDER",
    "CORNERS",
    "PROBE_ROUNDS",
    "PROBE_SPLIT_THRESHOLD",
    "PROBE_THRESHOLD",
    "QUICK_PROBE_CALLS",
    "UNCHUNKED_ORDER",
    "Model",
    "ModelHandler",
    "RoundModel",
    "Route",
    "TemporalEnsemble",
    "defined_corners",
    "resolved",
]
