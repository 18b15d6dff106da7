"""The pure-Python core: the executable specification of ``rlmesh._core``.

Same classes, same methods, same results as the Rust core (``rust/src/``), file for file:
``seeding.py`` ~ ``seeding.rs``, ``args.py`` ~ ``args.rs``, ``ledger.py`` ~ ``ledger.rs``,
``actions.py`` ~ ``actions.rs``.
Selected with ``RLMESH_CORE=python``; the parity tests keep the two in lockstep.
"""

from .actions import ActionApplier
from .ledger import EpisodeStarts, EpisodeSummary, RouteLedger
from .seeding import episode_seed

__all__ = ["ActionApplier", "EpisodeStarts", "EpisodeSummary", "RouteLedger", "episode_seed"]
