"""Where in-process lanes lived: the code is now in ``rlmesh/lanes/in_process.py``
(``InProcessLanes``, formerly ``LaneVector``) and ``checked_reset`` in ``lanes/base.py``; the
old names stay importable from here.

Example:
    >>> from rlmesh.lanes.in_process import InProcessLanes
    >>> LaneVector is InProcessLanes
    True
"""

from __future__ import annotations

from .base import checked_reset
from .in_process import InProcessLanes

LaneVector = InProcessLanes
"""The former name of ``InProcessLanes``."""

__all__ = ["LaneVector", "checked_reset"]
