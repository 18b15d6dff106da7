"""The pure-Python core: the executable specification of ``rlmesh._core``.

Same classes, same methods, same results as the Rust core (``rust/src/``), file for file:
``seeding.py`` ~ ``seeding.rs``, ``args.py`` ~ ``args.rs``, ``digests.py`` ~ ``digests.rs`` (each
episode's determinism evidence), ``ledger.py`` ~ ``ledger.rs``,
``assembly.py`` ~ ``assembly.rs``, ``resize.py`` ~ ``resize.rs``, ``rotations.py`` ~
``rotations.rs``, ``actions.py`` ~ ``actions.rs``, ``chunks.py`` ~ ``chunks.rs``,
``ensembles.py`` ~ ``ensembles.rs`` (temporal ensembling),
``telemetry.py`` ~ ``telemetry.rs``, ``rounds.py`` ~ ``rounds.rs``, and the wire part in its own
package, ``wire/`` ~ ``wire/``: ``wire/served.py`` ~ ``wire/served.rs`` (a served env's steps
and episode tallies), ``wire/transport.py`` ~ ``wire/transport.rs`` (the raw-bytes gRPC
transport; grpcio is imported only when it is used).
Selected with ``RLMESH_CORE=python``; the parity tests keep the two in lockstep. What is
exported here is what the Rust core exports; ``ledger.RouteLedger`` is internal to the
``RoundRunner`` in both.
"""

from .actions import ActionApplier
from .assembly import ObservationAssembler
from .chunks import ChunkQueues, split_chunk
from .digests import value_digest
from .ensembles import TemporalEnsembles
from .ledger import EpisodeStarts, EpisodeSummary
from .rounds import RoundRunner
from .seeding import episode_seed
from .telemetry import LatencyStats
from .wire import (
    ServedEpisodes,
    ServedSteps,
    ServerCall,
    ServerRequests,
    WireChannel,
    WireServer,
    WireStatusError,
    WireStream,
)

__all__ = [
    "ActionApplier",
    "ChunkQueues",
    "EpisodeStarts",
    "EpisodeSummary",
    "LatencyStats",
    "ObservationAssembler",
    "RoundRunner",
    "ServedEpisodes",
    "ServedSteps",
    "ServerCall",
    "ServerRequests",
    "TemporalEnsembles",
    "WireChannel",
    "WireServer",
    "WireStatusError",
    "WireStream",
    "episode_seed",
    "split_chunk",
    "value_digest",
]
