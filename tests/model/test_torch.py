"""``rlmesh.torch``'s own: the conversion shares rlmesh's buffers on the CPU (a per-lane
corner's rows, a read-only payload), devices, every dtype round-trips exactly (copied or
shared), bfloat16 and what torch cannot hold, a run on Ray, CUDA. What torch and JAX share
(equal to the numpy model in every place a model goes) is test_tensor_models.py."""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the torch extra): pip install 'rlmesh[torch]'"
)

import rlmesh  # noqa: E402 - after the skip
import rlmesh.torch  # noqa: E402
import tensor_models as tm  # noqa: E402
from helpers import comparable  # noqa: E402
from rlmesh.model import ModelHandler  # noqa: E402

TORCH = tm.torch_ops()
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


# ------------------------------------------------------------------------ the conversion


def test_a_per_lane_corner_gets_views_of_one_zero_copy_conversion():
    handler = ModelHandler(tm.recording_model(TORCH)())
    payload = np.arange(12, dtype=np.float32).reshape(4, 3)
    asyncio.run(handler.load())
    handler.predict_now(payload, 4)
    seen = handler.model.seen
    # Every lane's tensor is a row of the payload's own memory: no copy, one buffer.
    for lane, tensor in enumerate(seen):
        assert tensor.data_ptr() == payload[lane].ctypes.data
    seen[1][0] = 99.0  # a lane writing into its row changes that row only
    assert payload[1, 0] == 99.0 and payload[0].tolist() == [0.0, 1.0, 2.0]
    assert payload[2].tolist() == [6.0, 7.0, 8.0]


def test_a_read_only_payload_is_shared_without_a_warning():
    class Batch(rlmesh.torch.Model):
        def predict_batch(self, obs):
            self.pointer = obs.data_ptr()
            return obs[:, 0]

    payload = np.arange(6, dtype=np.int16).reshape(3, 2)
    payload.flags.writeable = False
    handler = ModelHandler(Batch())
    asyncio.run(handler.load())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = handler.predict_now(payload, 3)
    assert out.tolist() == [0, 2, 4]
    assert handler.model.pointer == payload.ctypes.data


@pytest.mark.parametrize(
    "payload",
    [
        np.arange(6, dtype=np.float32).reshape(3, 2),
        np.arange(6, dtype=np.float32).reshape(3, 2)[::-1],  # negative strides: a copy
        {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "note": ["a", "b", "c"]},
    ],
    ids=["array", "reversed", "dict"],
)
@pytest.mark.parametrize("output", ["tensor", "grad", "bfloat16", "numpy", "list"])
@pytest.mark.parametrize("context", [False, True])
def test_a_batched_corner_takes_every_payload_and_returns_every_output(payload, output, context):
    """A synchronous batched corner runs inside one wrapper the bridge makes (its fast path
    for a writeable array in and a CPU tensor out); every other input and output takes the
    general path, with the same results."""
    rows = payload["x"] if isinstance(payload, dict) else payload
    forms = {
        "tensor": lambda x: x[:, 0] * 2,
        "grad": lambda x: (x[:, 0] * 2).requires_grad_(),
        "bfloat16": lambda x: (x[:, 0] * 2).to(torch.bfloat16),
        "numpy": lambda x: x[:, 0].numpy() * 2,
        "list": lambda x: [float(value) * 2 for value in x[:, 0]],
    }

    class Batch(rlmesh.torch.Model):
        if context:

            def predict_batch(self, obs, context):
                self.contexts = len(context)
                return forms[output](obs["x"] if isinstance(obs, dict) else obs)
        else:

            def predict_batch(self, obs):
                assert isinstance(obs["x"] if isinstance(obs, dict) else obs, torch.Tensor)
                return forms[output](obs["x"] if isinstance(obs, dict) else obs)

    handler = ModelHandler(Batch())
    asyncio.run(handler.load())
    handler.start_episodes([0, 1, 2], [10, 11, 12])
    out = handler.predict_now(payload, 3, [0, 1, 2])
    assert np.asarray(out, dtype=np.float64).tolist() == (rows[:, 0] * 2).tolist()
    if context:
        assert handler.model.contexts == 3


def test_without_a_bridge_nothing_changes_for_numpy_models():
    handler = ModelHandler(tm.cartpole_models(tm.NumpyOps)["predict"]())
    assert handler.lane_corner is not None and handler._bridge is None


def test_the_device_is_a_class_attribute_or_an_argument():
    class OnCpu(rlmesh.torch.Model):
        device = torch.device("cpu")

    assert OnCpu().tensor_bridge().device == torch.device("cpu")
    assert rlmesh.torch.Model(abs, device="cpu").tensor_bridge().device.type == "cpu"
    assert rlmesh.Model().tensor_bridge() is None


# ------------------------------------------------------------------------ round trips

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("copy", [False, True])
def test_every_dtype_round_trips_exactly(dtype, copy):
    array = tm.extremes(dtype)
    back = tm.round_trip(
        lambda values: rlmesh.torch.as_tensor(values, copy=copy), rlmesh.torch.from_tensor, array
    )
    assert np.shares_memory(back, array) is not copy


def test_bfloat16_comes_back_as_float32_and_strings_are_refused():
    back = rlmesh.torch.from_tensor(torch.tensor([0.5, -3.0], dtype=torch.bfloat16))
    assert back.dtype == np.float32 and back.tolist() == [0.5, -3.0]
    with pytest.raises(TypeError, match="torch cannot hold dtype <U2 exactly"):
        rlmesh.torch.as_tensor(np.array(["ab"]))
    # A reversed view is copied, not refused.
    array = np.arange(4, dtype=np.int32)[::-1]
    assert rlmesh.torch.from_tensor(rlmesh.torch.as_tensor(array)).tolist() == [3, 2, 1, 0]


# ------------------------------------------------------------------------ Ray


@pytest.mark.usefixtures("ray_cluster", "bounded_in_time")
# Ray starts its processes by fork and exec; JAX, when another test imported it, warns of any
# fork, though an exec that follows at once runs none of its threads' code.
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_torch_model_on_ray():
    pytest.importorskip("ray", reason="Ray is not installed (the ray extra)")
    reference = rlmesh.run(
        tm.cartpole_models(tm.NumpyOps)["predict_batch"](), "CartPole-v1", num_envs=2, **tm.RUN
    )
    result = rlmesh.run(
        tm.cartpole_models(TORCH)["predict_batch"](),
        "CartPole-v1",
        num_envs=2,
        cluster="ray",
        workers=2,
        **tm.RUN,
    )
    assert comparable(result) == comparable(reference)


# ------------------------------------------------------------------------ GPU


@CUDA
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_on_cuda_equals_the_numpy_model(corner):
    cuda = tm.torch_ops("cuda:0")
    tm.runs_equal(
        tm.chase_models(tm.NumpyOps)[corner](),
        tm.chase_models(cuda)[corner](),
        tm.make_chase,
        num_envs=4,
    )


@CUDA
def test_cuda_round_trips():
    array = tm.extremes(np.float64)
    tensor = rlmesh.torch.as_tensor(array, device="cuda:0")
    assert tensor.device.type == "cuda"
    np.testing.assert_array_equal(rlmesh.torch.from_tensor(tensor), array)
