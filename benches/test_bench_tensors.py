"""A torch model's input conversion: rlmesh's tensor bridge against a hand-written
``torch.from_numpy`` in a numpy model, on the CPU.

The workload: one model call for 16 lanes of 3x224x224 uint8 images (a [16, 3, 224, 224]
payload, 2.4 MB), through ``ModelHandler.predict_now`` as the cores call it. Both models
compute the same small function of the pixels, so the figures are the conversion and the
handler around it, not the model:

- ``rlmesh``: an ``rlmesh.torch.Model`` whose corner receives tensors (the bridge converts the
  payload once per call, and the output back once);
- ``from_numpy``: an ``rlmesh.Model`` (numpy) that calls ``torch.from_numpy`` itself on each
  call and returns numpy.

Copies: neither side copies the images (both tensors are views of the payload; the benchmark
checks it). Per-lane corners (``predict``) are the second group: the bridge converts the batch
once and gives each lane a view, the hand-written model converts each lane's row.

A third group is a JAX model on the CPU, batched: the bridge against a numpy model that calls
``jnp.asarray`` itself (what a hand-written JAX model does; it copies), and against one that
calls ``jax.dlpack.from_dlpack`` itself. The payload starts on a 64-byte boundary as the cores
assemble it, so the bridge's input is the payload's own memory (checked).

Run: ``pytest benches/test_bench_tensors.py --benchmark-enable``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import rlmesh
from rlmesh.model import ModelHandler

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
import rlmesh.torch  # noqa: E402 - after the skip

LANES = 16
IMAGE = (3, 224, 224)


def act(images):
    """The same small function in both flavours: a class from one pixel's channels (read
    first, then widened, so the model's own work stays small beside the conversion)."""
    pixel = images[..., 112, 112]
    return (pixel.long() if isinstance(pixel, torch.Tensor) else pixel.astype(np.int64)).sum(-1) % 3


class TorchBatch(rlmesh.torch.Model):
    def predict_batch(self, obs):
        self.seen = obs
        return act(obs)


class HandBatch(rlmesh.Model):
    def predict_batch(self, obs):
        tensor = torch.from_numpy(obs)
        self.seen = tensor
        return act(tensor).numpy()


class TorchLane(rlmesh.torch.Model):
    def predict(self, obs):
        self.seen = obs
        return act(obs)


class HandLane(rlmesh.Model):
    def predict(self, obs):
        tensor = torch.from_numpy(obs)
        self.seen = tensor
        return act(tensor).numpy()


SIDES = {
    "batch": {"rlmesh": TorchBatch, "from_numpy": HandBatch},
    "per-lane": {"rlmesh": TorchLane, "from_numpy": HandLane},
}


def loaded(model: rlmesh.Model) -> ModelHandler:
    handler = ModelHandler(model)
    asyncio.run(handler.load())
    return handler


def jax_sides() -> dict[str, type]:
    jax = pytest.importorskip("jax", reason="JAX is not installed (the jax extra)")
    import jax.numpy as jnp
    import rlmesh.jax

    def jax_act(images):
        return images[..., 112, 112].astype("int32").sum(-1) % 3

    class JaxBatch(rlmesh.jax.Model):
        def predict_batch(self, obs):
            self.pointer = obs.unsafe_buffer_pointer()
            return jax_act(obs)

    class AsArray(rlmesh.Model):
        def predict_batch(self, obs):
            return np.asarray(jax_act(jnp.asarray(obs)))

    class FromDlpack(rlmesh.Model):
        def predict_batch(self, obs):
            return np.asarray(jax_act(jax.dlpack.from_dlpack(obs)))

    return {"rlmesh": JaxBatch, "asarray": AsArray, "from_dlpack": FromDlpack}


@pytest.mark.parametrize("side", ["rlmesh", "asarray", "from_dlpack"])
def test_jax_input_conversion(benchmark, side):
    from rlmesh._pycore.assembly import aligned_empty

    payload = aligned_empty((LANES, *IMAGE), np.uint8)
    payload[...] = np.random.default_rng(0).integers(0, 256, (LANES, *IMAGE), dtype=np.uint8)
    handler = loaded(jax_sides()[side]())
    benchmark.group = f"jax model input, batch, {LANES} lanes of uint8 {IMAGE}"
    benchmark.extra_info["copies of the images"] = 1 if side == "asarray" else 0
    out = benchmark(handler.predict_now, payload, LANES)
    np.testing.assert_array_equal(out, act(payload))
    if side == "rlmesh":
        assert handler.model.pointer == payload.ctypes.data  # the payload itself, no copy


@pytest.mark.parametrize("side", ["rlmesh", "from_numpy"])
@pytest.mark.parametrize("corner", list(SIDES))
def test_torch_input_conversion(benchmark, corner, side):
    payload = np.random.default_rng(0).integers(0, 256, (LANES, *IMAGE), dtype=np.uint8)
    handler = loaded(SIDES[corner][side]())
    benchmark.group = f"torch model input, {corner}, {LANES} lanes of uint8 {IMAGE}"
    benchmark.extra_info["copies of the images"] = 0
    out = benchmark(handler.predict_now, payload, LANES)
    expected = act(payload)
    np.testing.assert_array_equal(out, expected)
    # Zero copies: the tensor the model saw (the last lane's, for a per-lane corner) is a
    # view of the payload's own memory.
    seen = handler.model.seen
    assert seen.data_ptr() == payload[-1 if corner == "per-lane" else 0].ctypes.data
