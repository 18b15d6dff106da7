"""The numpy flavour of the model API: ``rlmesh.numpy.Model`` is ``rlmesh.Model``.

Models receive numpy arrays (and lists of strings for text) and may return anything
``np.asarray`` turns into actions, so the base class needs nothing numpy-specific; this alias
lets code name the flavour it is written for, beside framework flavours that may convert
tensors.

Example:
    >>> import rlmesh
    >>> import rlmesh.numpy
    >>> rlmesh.numpy.Model is rlmesh.Model
    True
"""

from __future__ import annotations

from .model import Model

__all__ = ["Model"]
