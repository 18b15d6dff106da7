"""``HeldLanes``, the lanes a Ray actor holds across its windows: released from the actor's
second thread while a window may be using or releasing them (no Ray needed to test it)."""

from __future__ import annotations

import threading
import time

import pytest
from rlmesh.cluster.worker import HeldLanes


class SlowToClose:
    """Lanes whose ``close`` takes ``seconds`` (a sandbox's server stopping)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.closing = threading.Event()
        self.closed = threading.Event()
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        self.closing.set()
        time.sleep(self.seconds)
        self.closed.set()


def test_a_close_from_another_thread_returns_once_a_release_in_progress_is_done():
    # A window's own release stops the sandbox; the coordinator's close, on the actor's
    # second thread, must not return before that (the actor is ended right after).
    held = HeldLanes()
    lanes = held.get(lambda: SlowToClose(0.5))
    releasing = threading.Thread(target=held.release)
    releasing.start()
    try:
        assert lanes.closing.wait(5)
        held.close()
        assert lanes.closed.is_set()
    finally:
        releasing.join(5)
    assert lanes.closes == 1 and held.lanes is None


def test_runs_do_not_close_held_lanes_and_a_closed_holder_builds_none():
    held = HeldLanes()
    lanes = held.get(lambda: SlowToClose(0.0))
    lanes.close()  # what each run's end does: the held lanes stay open
    assert lanes.closes == 0 and held.get(None) is lanes
    held.close()
    assert lanes.closes == 1
    with pytest.raises(RuntimeError, match="builds no more lanes"):
        held.get(lambda: SlowToClose(0.0))
