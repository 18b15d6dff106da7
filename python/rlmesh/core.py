"""Picks the core that does the per-lane bookkeeping: Rust (``rlmesh._core``) or pure Python,
and states what the core calls of the Python side (``RoundModel``).

``RLMESH_CORE=rust`` demands the Rust core and fails at import if it is missing;
``RLMESH_CORE=python`` selects the pure-Python core (``rlmesh._pycore``); unset means the Rust
core when it imports, else the Python core with a one-line warning. Both expose the same
classes and functions with the same results.

Example:
    >>> from rlmesh.core import active, load_core
    >>> active.episode_seed(0, 0) == load_core("python").episode_seed(0, 0)
    True
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

CORE_NAMES = ("rust", "python")
_MODULES = {"rust": "rlmesh._core", "python": "rlmesh._pycore"}


def load_core(name: str) -> ModuleType:
    """The core module called ``name`` (``"rust"`` or ``"python"``), whatever is active.

    Raises:
        ValueError: an unknown name.
        ImportError: the Rust core is not built into this installation.
    """
    if name not in _MODULES:
        raise ValueError(f"core must be one of {CORE_NAMES}, got {name!r}")
    return importlib.import_module(_MODULES[name])


def _select_core() -> tuple[str, ModuleType]:
    requested = os.environ.get("RLMESH_CORE", "").strip().lower()
    if requested == "python":
        return "python", load_core("python")
    if requested == "rust":
        try:
            return "rust", load_core("rust")
        except ImportError as exc:
            raise ImportError(
                f"RLMESH_CORE=rust but the Rust core rlmesh._core does not import ({exc}); "
                f"reinstall rlmesh with `pip install .` from a checkout with a Rust toolchain, "
                f"or set RLMESH_CORE=python"
            ) from exc
    if requested:
        raise ValueError(f"RLMESH_CORE must be 'rust' or 'python', got {requested!r}")
    try:
        return "rust", load_core("rust")
    except ImportError as exc:
        warnings.warn(
            f"rlmesh: the Rust core does not import ({exc}); using the slower pure-Python core",
            RuntimeWarning,
            stacklevel=2,
        )
        return "python", load_core("python")


_ACTIVE_NAME, active = _select_core()


def core_name() -> str:
    """Which core is active: ``"rust"`` or ``"python"``.

    Example:
        >>> import rlmesh
        >>> rlmesh.core_name() in ("rust", "python")
        True
    """
    return _ACTIVE_NAME


@runtime_checkable
class RoundModel(Protocol):
    """The model as the core's ``RoundRunner.run_rounds`` calls it (``ModelHandler`` is one).

    Attributes:
        lane_corner: a per-lane function ``predict(lane_input) -> action`` the core may call on
            each lane's input itself (a row of an array payload, or an array of the lane's
            own; then ``combine`` stacks the outputs); None when the model must be called
            through ``predict_now``.
        wants_episode_ids: when true, ``predict_now`` takes the predict lanes' episode ids
            (``[P]``), and ``lane_corner`` is not used.
        calls_per_lane: a prediction for ``P`` lanes is ``P`` calls of a per-lane corner (for
            the telemetry's count of model calls).
    """

    lane_corner: Callable[[Any], Any] | None
    wants_episode_ids: bool
    calls_per_lane: bool

    def predict_now(
        self, payload: Any, num_lanes: int, episode_ids: Sequence[int] | None = None
    ) -> Any:
        """The model's output for the ``P = num_lanes`` lanes of ``payload`` (``[P, ...]``, or
        chunks ``[P, H, ...]``), without an event loop."""
        ...

    def combine(self, outputs: list[Any], num_lanes: int) -> Any:
        """``P`` per-lane outputs of ``lane_corner``, in lane order, as one batch."""
        ...

    def failure(self, error: Exception, rounds: int) -> Exception:
        """What the run raises (``from error``) when calling the model raised ``error`` after
        ``rounds`` rounds."""
        ...
