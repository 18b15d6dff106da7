"""The ``rlmesh`` command: evaluate a policy from the shell, with live progress and a summary.

Commands:

- ``rlmesh eval POLICY --env ID [...]``: run the evaluation, optionally into a results file
  (``--out``) that survives a crash and can be resumed (``--resume``), and with ``--ray
  [ADDRESS] --workers K`` across a Ray cluster (``rlmesh.cluster``);
- ``rlmesh demo``: ``eval`` of a built-in CartPole heuristic over 8 lanes and 100 episodes;
- ``rlmesh report FILE [--html OUT]``: the summary table and provenance of a results file
  alone, and with ``--html`` a self-contained HTML report of it (``rlmesh.report.html``);
- ``rlmesh compare A B``: policy B against policy A on the same seeded episodes, pair by pair
  (``rlmesh.report.compare``); exit 2 when the runs cannot be paired;
- ``rlmesh verify A B``: do the episodes two results files share have equal digests (the same
  episodes)? Exit 0 if so, 1 if not (naming the first that differs), 2 if they cannot be
  verified (``rlmesh.report.verify``);
- ``rlmesh ab A B --env ID --episodes MAX --out-dir DIR``: which of two policies is better?
  Both play the same seeded episodes in blocks until an anytime-valid paired test decides at
  ``--alpha``, or the cap (``rlmesh.ab``); ``DIR`` holds ``a.jsonl`` and ``b.jsonl``;
- ``rlmesh describe --env ID_OR_FACTORY [--tags FILE] --model POLICY``: the plan that pairs
  the policy's spec with the env (its tags, from FILE or the env's metadata) and its
  advisories, without running an episode;
- ``rlmesh serve env ID_OR_FACTORY``: serve an env over rlmesh-wire-v1 until SIGINT / SIGTERM.
- ``rlmesh serve model POLICY --address ADDR``: serve a policy over rlmesh-wire-v1 until
  SIGINT / SIGTERM (``rlmesh eval tcp://host:port --env ...`` evaluates it).

Exit codes: 0 done; 1 the run failed (the typed error's message, after the completed episodes
were written); 2 bad input (one line saying what was wrong and what was expected), or another
run is writing the ``--out`` file; 130 interrupted (Ctrl-C; completed episodes are on disk and
the message says how to resume); 141 stdout was closed early (``rlmesh eval ... | head``:
nothing printed, as ``cat`` does).

``POLICY`` and ``--env`` may name modules in the current directory, as ``python -m`` finds them.
A ``POLICY`` that is an address (``tcp://host:port``, ``host:port``, ``unix:///path``) is a
served model.

The package: ``main`` (the parser, its option groups and the dispatch), one module per command
(``evaluate`` with ``--suite``, ``demo``, ``report``, ``compare``, ``verify``, ``ab``,
``describe``, ``serve``),
``progress`` (the live display), ``argtypes`` (the options' types), ``inputs`` (env ids, seeds
and tags files) and ``exits`` (exit codes). Loading a ``POLICY`` and the built-in policies live
in ``rlmesh.policies``, below the CLI; they are re-exported here, where they were first
defined, so ``rlmesh.cli:observation_digest`` in a saved spec still imports.

Example:
    >>> main(["eval", "random", "--env", "CartPole-v1", "--episodes", "0"])  # a one-line error
    2
    >>> main(["demo", "--episodes", "2", "--no-progress", "--json"])  # doctest: +ELLIPSIS
    {"episodes": 2, ..., "mean_reward": 500.0, ..., "success_rate": 1.0, ...}
    0
"""

from __future__ import annotations

from ..policies import (
    BUILTIN_POLICIES,
    CartPoleHeuristic,
    RandomPolicy,
    UsageError,
    current_directory_on_path,
    load_object,
    load_policy,
    observation_digest,
    policy_identity,
)
from .evaluate import PER_TASK_OPTIONS
from .exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .inputs import check_env, load_env, read_seeds, read_tags
from .main import build_parser, main
from .progress import EpisodeSink, Progress, SuiteEpisodeSink, Throughput

# The progress display's names before it had a module of its own (tests import these).
_Progress = Progress
_EpisodeSink = EpisodeSink
_SuiteEpisodeSink = SuiteEpisodeSink
_Throughput = Throughput

__all__ = [
    "BUILTIN_POLICIES",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PER_TASK_OPTIONS",
    "CartPoleHeuristic",
    "EpisodeSink",
    "Progress",
    "RandomPolicy",
    "SuiteEpisodeSink",
    "Throughput",
    "UsageError",
    "build_parser",
    "check_env",
    "current_directory_on_path",
    "load_env",
    "load_object",
    "load_policy",
    "main",
    "observation_digest",
    "policy_identity",
    "read_seeds",
    "read_tags",
]
