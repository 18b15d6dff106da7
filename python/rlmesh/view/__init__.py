"""The live view: watch a run (or a results file another process writes) as it goes, in the
browser and in the terminal.

The page shows the progress (episodes done of requested, lane-steps per second, the ETA),
per task the running success rate with its Wilson interval and the mean return with its
interval, the failures with their errors, each lane's latest frame with its episode, step
and return, the recorded videos as they complete, and the latency percentiles; it updates
itself through server-sent events and fetches nothing from outside the machine. The terminal
view is a rich live table of the same figures.

The package, one part a module:

- ``spec``: what ``view=`` asks for (``parse_view``, ``ViewSpec``, ``ViewError``);
- ``state``: the live figures (``LiveState``), thread-safe snapshots, bounded memory;
- ``lanes``: the run's lanes, watched (``ViewLanes``): steps, returns and frames per lane;
- ``frames``: when a lane's frame is due, and its encoding off the run's thread
  (``FrameSampler``);
- ``hooks``: ``LiveView``, the runtime hook that feeds the state and opens the rest;
- ``server`` and ``page``: the page and its small HTTP server (127.0.0.1 by default);
- ``terminal``: the rich live table, or a plain progress line off a terminal;
- ``watch``: following a results file through the one reader (``ResultsFollower``).

Example:
    >>> import rlmesh
    >>> from rlmesh.view import LiveView
    >>> with LiveView("http", announce=False) as view:
    ...     result = rlmesh.run(lambda obs: int(obs[2] > 0), view.lanes("CartPole-v1"),
    ...                         episodes=2, hooks=[view])
    ...     view.state.snapshot()["done"]
    2
"""

from .hooks import LiveView, hooks_with, open_view
from .lanes import ViewLanes
from .server import ViewServer
from .spec import ViewError, ViewSpec, parse_view
from .state import LiveState
from .terminal import TerminalView, format_progress
from .watch import ResultsFollower

__all__ = [
    "LiveState",
    "LiveView",
    "ResultsFollower",
    "TerminalView",
    "ViewError",
    "ViewLanes",
    "ViewServer",
    "ViewSpec",
    "format_progress",
    "hooks_with",
    "open_view",
    "parse_view",
]
