"""The errors of a cluster run. Each is an ``RlmeshError``; the run's completed episodes travel
with it as ``err.partial_result`` (and are on disk, with a results file).

Example:
    >>> from rlmesh import RlmeshError
    >>> issubclass(WorkerLostError, RlmeshError), issubclass(MergeIncompleteError, RlmeshError)
    (True, True)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RlmeshError


class ClusterError(RlmeshError):
    """The base of the errors ``rlmesh.run(..., cluster="ray")`` raises about the cluster."""


class NotPicklableError(ClusterError, TypeError):
    """The model, env factory or success rule cannot be sent to the workers (it does not
    pickle). The message names which, why, and the form to pass instead."""


class WorkerLostError(ClusterError):
    """A window lost its worker more often than ``max_retries`` allows.

    Attributes:
        window: the window's number; ``indices``: the episode indices it still had to run;
        attempts: how many times it was run.
    """

    def __init__(self, message: str, *, window: int, indices: Sequence[int], attempts: int):
        super().__init__(message)
        self.window = window
        self.indices = tuple(indices)
        self.attempts = attempts

    def __reduce__(self):  # keyword arguments survive pickling (Ray, multiprocessing)
        return _rebuild_worker_lost, (str(self), self.window, self.indices, self.attempts)


def _rebuild_worker_lost(message: str, window: int, indices: Sequence[int], attempts: int):
    return WorkerLostError(message, window=window, indices=indices, attempts=attempts)


class MergeIncompleteError(ClusterError):
    """Every window reported done, yet the merged results lack episodes that were asked for.

    Attributes:
        missing: the episode indices the merge lacks.
    """

    def __init__(self, message: str, *, missing: Sequence[int]):
        super().__init__(message)
        self.missing = tuple(missing)

    def __reduce__(self):
        return _rebuild_merge_incomplete, (str(self), self.missing)


def _rebuild_merge_incomplete(message: str, missing: Sequence[int]):
    return MergeIncompleteError(message, missing=missing)


class WindowFailedError(ClusterError):
    """A window's run failed on its worker with an error that could not travel back as it was
    (it does not pickle); the message keeps its type, text and where it happened."""
