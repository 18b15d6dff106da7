"""The hooks: a failing RuntimeHooks observer is logged once with its traceback, counted on
every raise, and its count reported at the end of the run and in the result."""

from __future__ import annotations

import logging

import pytest
import rlmesh
from helpers import CORES, cartpole_policy


class BrokenStepObserver(rlmesh.RuntimeHooks):
    """Raises on every step it observes; counts them."""

    def __init__(self):
        self.steps = 0

    def step_completed(self, event):
        self.steps += 1
        raise RuntimeError(f"observer broke at step {event.step}")


class BrokenEpisodeObserver(rlmesh.RuntimeHooks):
    def episode_completed(self, result):
        raise ValueError("no episodes today")


def observer_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rlmesh" and "observer" in r.getMessage()]


@pytest.mark.parametrize("core", CORES)
def test_an_observer_raising_every_step_is_logged_once_then_counted(core, caplog):
    observer = BrokenStepObserver()
    with caplog.at_level(logging.ERROR, logger="rlmesh"):
        result = rlmesh.run(
            cartpole_policy, "CartPole-v1", episodes=2, num_envs=2, hooks=observer, core=core
        )
    assert result.num_episodes == 2
    assert observer.steps == result.total_steps > 100  # the run went on to its end
    assert result.observer_errors == observer.steps  # each raise counted
    first, summary = observer_records(caplog)
    assert "BrokenStepObserver.step_completed raised; the run goes on" in first.getMessage()
    assert first.exc_info is not None and "observer broke at step 1" in first.exc_text
    assert summary.exc_info is None
    assert (
        f"observer BrokenStepObserver.step_completed raised {observer.steps} times in this run"
        in summary.getMessage()
    )


def test_each_failing_observer_method_is_logged_and_counted_on_its_own(caplog):
    hooks = [BrokenStepObserver(), BrokenEpisodeObserver()]
    with caplog.at_level(logging.ERROR, logger="rlmesh"):
        result = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=3, hooks=hooks)
    steps = hooks[0].steps
    assert result.observer_errors == steps + 3
    messages = [r.getMessage() for r in observer_records(caplog)]
    tracebacks = [r for r in observer_records(caplog) if r.exc_info is not None]
    assert len(tracebacks) == 2  # one per failing method
    assert any(f"step_completed raised {steps} times" in m for m in messages)
    assert any("BrokenEpisodeObserver.episode_completed raised 3 times" in m for m in messages)
    assert len(messages) == 4


def test_an_observer_that_raised_once_is_not_reported_twice(caplog):
    class RaisesOnce(rlmesh.RuntimeHooks):
        def session_started(self, context):
            raise RuntimeError("once")

    with caplog.at_level(logging.ERROR, logger="rlmesh"):
        result = rlmesh.run(cartpole_policy, "CartPole-v1", episodes=1, hooks=RaisesOnce())
    assert result.observer_errors == 1
    (record,) = observer_records(caplog)
    assert record.exc_info is not None
