"""Temporal ensembling's traffic in the core: one env step of N = 16 lanes whose model
returns a chunk of H = 50 actions of 14 floats at every step (an ALOHA-sized ACT).

One step pushes the lanes' new ``[16, 50, 14]`` float32 chunks and pops each lane's average
over the 50 chunks that cover its step (the steady state: every buffer is full). Both cores
run the same steps; the Rust core's average is the same to the bit.

Run: ``pytest benches/test_bench_ensembles.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np

NUM_LANES = 16
HORIZON = 50
ACTION_SIZE = 14
M = 0.01


class EnsembleStep:
    """Drives one ``TemporalEnsembles`` through steps of every lane, its buffers full."""

    def __init__(self, core) -> None:
        self.ensembles = core.TemporalEnsembles(NUM_LANES, M)
        self.lanes = np.arange(NUM_LANES, dtype=np.int64)
        rng = np.random.default_rng(0)
        self.chunks = [
            rng.standard_normal((NUM_LANES, HORIZON, ACTION_SIZE)).astype(np.float32)
            for _ in range(4)
        ]
        self.steps = 0
        for _ in range(HORIZON):  # fill the buffers: the steady state
            self.step()

    def step(self) -> np.ndarray:
        chunk = self.chunks[self.steps % len(self.chunks)]
        self.ensembles.push(self.lanes, self.lanes, chunk)
        self.steps += 1
        return self.ensembles.pop(self.lanes, self.lanes)


def test_temporal_ensemble_step(benchmark, core):
    loop = EnsembleStep(core)
    benchmark.group = f"temporal ensemble step, N={NUM_LANES} H={HORIZON} A={ACTION_SIZE}"
    action = benchmark(loop.step)
    assert action.shape == (NUM_LANES, ACTION_SIZE) and action.dtype == np.float32
    # Full buffers: each lane holds the H chunks that cover its next step.
    assert loop.ensembles.held().tolist() == [HORIZON - 1] * NUM_LANES
