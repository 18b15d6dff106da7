"""The pure-Python core: the executable specification of ``rlmesh._core``.

Same classes, same methods, same results as the Rust core (``rust/src/``), file for file:
``seeding.py`` ~ ``seeding.rs``, ``args.py`` ~ ``args.rs``, ``ledger.py`` ~ ``ledger.rs``,
``assembly.py`` ~ ``assembly.rs``, ``chunks.py`` ~ ``chunks.rs``.
Selected with ``RLMESH_CORE=python``; the parity tests keep the two in lockstep.
"""

from .assembly import ObservationAssembler
from .chunks import ChunkQueues, split_chunk
from .ledger import EpisodeStarts, EpisodeSummary, RouteLedger
from .seeding import episode_seed

__all__ = [
    "ChunkQueues",
    "EpisodeStarts",
    "EpisodeSummary",
    "ObservationAssembler",
    "RouteLedger",
    "episode_seed",
    "split_chunk",
]
