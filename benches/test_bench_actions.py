"""Applying the model's batched action: one ``apply_actions`` call for N = 256 Box lanes.

The action space is a 7-DoF arm, ``Box(-1, 1, (7,), float32)``; the model returns float32
``[256, 7]`` in roughly its ``(-1, 1)`` head range (a few values past it, so clipping does
work), and the plan rescales and clips (``Action(rescale=(-1, 1), clip=True)``). The call checks
every value is finite, maps and clips it in float64 and writes a new float32 ``[256, 7]``.

Run: ``pytest benches/test_bench_actions.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from rlmesh.adapters import Action, ModelSpec, compile_spec

NUM_LANES = 256
ARM = spaces.Box(-1.0, 1.0, (7,), np.float32)


def actions_workload():
    """The plan, a model output of 256 lanes, and the lane indices: one ``apply_actions`` call."""
    plan = compile_spec(ModelSpec(output=Action(rescale=(-1, 1), clip=True)), ARM, ARM)
    rng = np.random.default_rng(0)
    model_output = rng.uniform(-1.1, 1.1, (NUM_LANES, 7)).astype(np.float32)
    lanes = np.arange(NUM_LANES, dtype=np.int64)
    return plan, model_output, lanes


@pytest.fixture
def workload():
    return actions_workload()


def test_apply_actions_box(benchmark, core, workload):
    plan, model_output, lanes = workload
    applier = core.ActionApplier(plan.action)
    benchmark.group = f"apply_actions, N={NUM_LANES} Box"
    action = benchmark(applier.apply_actions, model_output, lanes)
    assert action.dtype == np.float32 and action.shape == (NUM_LANES, 7)
    x = model_output.astype(np.float64)
    expected = np.clip(-1.0 + (x - -1.0) * 2.0 / 2.0, -1.0, 1.0).astype(np.float32)
    np.testing.assert_array_equal(action, expected)
