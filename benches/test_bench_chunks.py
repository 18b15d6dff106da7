"""The chunk queues' traffic: what the driver asks of them while N lanes replay H-step chunks.

One round = 8 env steps of N = 256 lanes with ``execution_horizon`` H = 8 and a Box (7,) float32
action: every step asks ``lanes_needing_predict`` for all lanes and pops one action per lane;
on the first step every lane needs a chunk, so one ``[256, 8, 7]`` batch is pushed (checked
by ``split_chunk``, split along H into the lanes' queues) before the pop.

Run: ``pytest benches/test_bench_chunks.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np

NUM_LANES = 256
HORIZON = 8
ACTION_SHAPE = (7,)


class ChunkRound:
    """Drives one ChunkQueues through push-then-replay rounds, as the driver's loop does."""

    def __init__(self, core) -> None:
        self.queues = core.ChunkQueues(NUM_LANES, HORIZON)
        self.lanes = np.arange(NUM_LANES, dtype=np.int64)
        self.episode_ids = np.arange(NUM_LANES, dtype=np.int64)
        rng = np.random.default_rng(0)
        self.chunk = rng.standard_normal((NUM_LANES, HORIZON, *ACTION_SHAPE)).astype(np.float32)
        self.rounds = 0
        self.pushes = 0

    def round(self) -> np.ndarray:
        queues, lanes, episode_ids = self.queues, self.lanes, self.episode_ids
        action = None
        for _ in range(HORIZON):
            needing = queues.lanes_needing_predict(lanes)
            if len(needing):
                # The model ran for `needing` (all lanes on the first step) and returned a chunk.
                queues.push(needing, episode_ids, self.chunk)
                self.pushes += 1
            action = queues.pop(lanes, episode_ids)
        self.rounds += 1
        return action


def test_chunk_split_and_queue(benchmark, core):
    loop = ChunkRound(core)
    benchmark.group = f"chunk split + queue, N={NUM_LANES} H={HORIZON}"
    last = benchmark(loop.round)
    # Each round pushed exactly once, replayed the chunk in order and left every queue empty.
    assert loop.pushes == loop.rounds >= 1
    assert last.dtype == np.float32
    np.testing.assert_array_equal(last, loop.chunk[:, HORIZON - 1])
    assert loop.queues.lanes_needing_predict(loop.lanes).tolist() == loop.lanes.tolist()
