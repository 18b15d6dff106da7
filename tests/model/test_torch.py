"""``rlmesh.torch``: a torch model gets tensors and gives the same per-episode results as the
numpy model of the same function, in every place a model goes (every corner, frame stacks,
chunks, a Dict observation with text, worker processes, a served model, Ray, suites, the
probe); the conversion is one per call for the whole batch and shares rlmesh's buffers on the
CPU; dtypes round-trip exactly."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the torch extra): pip install 'rlmesh[torch]'"
)

import rlmesh  # noqa: E402 - after the skip
import rlmesh.torch  # noqa: E402
import tensor_models as tm  # noqa: E402
from helpers import CORES, AwaitEveryStep, comparable  # noqa: E402
from rlmesh import StatefulModelError  # noqa: E402
from rlmesh.model import ModelHandler  # noqa: E402

TORCH = tm.torch_ops()
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def runs_equal(numpy_model, torch_model, env, **options):
    """Both models' runs, and their per-episode results (rewards, steps, digests) compared."""
    reference = rlmesh.run(numpy_model, env, **tm.RUN, **options)
    result = rlmesh.run(torch_model, env, **tm.RUN, **options)
    assert len(reference.episodes) == tm.EPISODES
    assert comparable(result) == comparable(reference)
    return result


# ------------------------------------------------------------------------ equal to numpy


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize(
    "corner", ["predict", "predict_batch", "predict_chunk", "predict_chunk_batch"]
)
def test_every_corner_equals_the_numpy_model(core, num_envs, corner):
    horizon = tm.HORIZON if "chunk" in corner else 1
    result = runs_equal(
        tm.cartpole_models(tm.NumpyOps)[corner](),
        tm.cartpole_models(TORCH)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
        execution_horizon=horizon,
    )
    assert len({episode.steps for episode in result.episodes}) > 1  # not all at the cap


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_dict_observation_with_text_equals_the_numpy_model(core, num_envs, corner):
    # The models check they get tensors for arrays and str / lists of str for the text leaf.
    runs_equal(
        tm.chase_models(tm.NumpyOps)[corner](),
        tm.chase_models(TORCH)[corner](),
        tm.make_chase,
        core=core,
        num_envs=num_envs,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_writing_into_its_frame_stacks_changes_nothing(core, num_envs, corner):
    """The batched model zeroes its whole input after acting, the per-lane one overwrites
    its lane's row: neither reaches another lane's stack, a later round or the episode."""
    runs_equal(
        tm.stacked_models(tm.NumpyOps)[corner](),
        tm.stacked_models(TORCH, write_input=True)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("corner", ["predict", "predict_chunk_batch"])
def test_the_awaited_path_and_async_corners_convert_alike(core, corner):
    """With step hooks the driver awaits every round (``ModelHandler.predict``, not the
    core's ``predict_now``); an ``async`` corner goes that way too."""
    models = tm.cartpole_models(TORCH)

    class AsyncPredict(models["predict"]):
        async def predict(self, obs):
            return super().predict(obs)

    class AsyncChunkBatch(models["predict_chunk_batch"]):
        async def predict_chunk_batch(self, obs, execution_horizon=None):
            return super().predict_chunk_batch(obs, execution_horizon)

    asynchronous = AsyncPredict if corner == "predict" else AsyncChunkBatch

    horizon = tm.HORIZON if "chunk" in corner else 1
    reference = tm.cartpole_models(tm.NumpyOps)[corner]()
    for model in (models[corner](), asynchronous()):
        runs_equal(reference, model, "CartPole-v1", core=core, num_envs=4,
                   execution_horizon=horizon, hooks=AwaitEveryStep())  # fmt: skip


def test_outputs_may_be_tensors_numpy_numbers_or_bfloat16():
    class Mixed(rlmesh.torch.Model):
        def predict_batch(self, obs):
            return {
                "tensor": obs[:, 0] * 2,
                "bf16": obs[:, 0].to(torch.bfloat16),
                "numpy": np.ones(obs.shape[0]),
                "ints": [int(row.sum()) for row in obs],
            }

    handler = ModelHandler(Mixed())
    out = asyncio.run(handler.predict(np.array([[1.5, 2.0], [3.0, 4.0]], np.float32), 2))
    assert out["tensor"].tolist() == [3.0, 6.0] and out["tensor"].dtype == np.float32
    assert out["bf16"].tolist() == [1.5, 3.0] and out["bf16"].dtype == np.float32
    assert out["numpy"].tolist() == [1.0, 1.0] and out["ints"].tolist() == [3, 7]


# ------------------------------------------------------------------------ the conversion


class Recorder(rlmesh.torch.Model):
    """Records what each call of its per-lane corner got."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def predict(self, obs):
        self.seen.append(obs)
        return obs.sum()


def test_a_per_lane_corner_gets_views_of_one_zero_copy_conversion():
    handler = ModelHandler(Recorder())
    assert handler.lane_corner is None  # the cores call predict_now, which converts once
    payload = np.arange(12, dtype=np.float32).reshape(4, 3)
    asyncio.run(handler.load())
    out = handler.predict_now(payload, 4)
    seen = handler.model.seen
    assert out.tolist() == payload.sum(axis=1).tolist()
    assert all(isinstance(lane, torch.Tensor) and lane.shape == (3,) for lane in seen)
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


def extremes(dtype):
    """Values that lose bits on any narrowing: the dtype's limits and an awkward fraction."""
    if dtype == np.bool_:
        return np.array([[True, False], [False, True]])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max], [info.max - 1, 1]], dtype=dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (np.array([[1 / 3, -2.5], [1e30, 0]]) * (1 + 1j / 7)).astype(dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, info.max], [info.tiny, 1 / 3]], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("copy", [False, True])
def test_every_dtype_round_trips_exactly(dtype, copy):
    array = extremes(dtype)
    tensor = rlmesh.torch.as_tensor(array, copy=copy)
    back = rlmesh.torch.from_tensor(tensor)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert np.shares_memory(back, array) is not copy
    # A 0-d array and an empty one too.
    assert rlmesh.torch.from_tensor(rlmesh.torch.as_tensor(array[0, 0])).shape == ()
    assert rlmesh.torch.from_tensor(rlmesh.torch.as_tensor(array[:0])).shape == (0, 2)


def test_bfloat16_comes_back_as_float32_and_strings_are_refused():
    back = rlmesh.torch.from_tensor(torch.tensor([0.5, -3.0], dtype=torch.bfloat16))
    assert back.dtype == np.float32 and back.tolist() == [0.5, -3.0]
    with pytest.raises(TypeError, match="torch cannot hold dtype <U2 exactly"):
        rlmesh.torch.as_tensor(np.array(["ab"]))
    # A reversed view is copied, not refused.
    array = np.arange(4, dtype=np.int32)[::-1]
    assert rlmesh.torch.from_tensor(rlmesh.torch.as_tensor(array)).tolist() == [3, 2, 1, 0]


# ------------------------------------------------------------------------ imports


def test_importing_rlmesh_imports_no_framework():
    code = (
        "import sys, rlmesh, rlmesh.numpy, rlmesh.model.tensors\n"
        "loaded = {'torch', 'jax'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        "import rlmesh.torch\n"
        "assert 'torch' in sys.modules and 'jax' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_missing_framework_names_the_extra(framework):
    code = f"import sys; sys.modules[{framework!r}] = None; import rlmesh.{framework}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"pip install 'rlmesh[{framework}]'" in done.stderr
    assert "ImportError" in done.stderr


# ------------------------------------------------------------------------ every place a model goes


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_worker_processes(core, corner):
    runs_equal(
        tm.chase_models(tm.NumpyOps)[corner](),
        tm.chase_models(TORCH)[corner](),
        tm.make_chase,
        core=core,
        num_envs=4,
        workers=2,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("corner", ["predict", "predict_chunk_batch"])
def test_a_served_torch_model(core, corner):
    """The server's handler converts: a torch model served through rlmesh's model server
    gives the run the numpy model's episodes."""
    horizon = tm.HORIZON if "chunk" in corner else 1
    with rlmesh.serve_model(tm.cartpole_models(TORCH)[corner](), core=core) as server:
        runs_equal(
            tm.cartpole_models(tm.NumpyOps)[corner](),
            rlmesh.RemoteModel(server.address),
            "CartPole-v1",
            core=core,
            num_envs=4,
            execution_horizon=horizon,
        )
        assert server.stats().rows > 0


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


@pytest.mark.parametrize("core", CORES)
def test_a_suite(core):
    tasks = [
        rlmesh.Task("pole", "CartPole-v1", episodes=4, seed=1, max_episode_steps=50),
        rlmesh.Task("chase", tm.CHASE_ID, episodes=3, seed=2),
    ]

    def suite(ops):
        class Both(ops.Model):
            stateless = True
            pole = tm.cartpole_models(ops)["predict_batch"]()
            chase = tm.chase_models(ops)["predict_batch"]()

            def predict_batch(self, obs):
                return (self.chase if isinstance(obs, dict) else self.pole).predict_batch(obs)

        return rlmesh.run_suite(Both(), tasks, num_envs=2, core=core)

    reference, result = suite(tm.NumpyOps), suite(TORCH)
    for task in tasks:
        assert comparable(result[task.name]) == comparable(reference[task.name])


def test_a_stateful_torch_model_is_refused_as_a_numpy_one_is():
    class Counting(rlmesh.torch.Model):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def predict_batch(self, obs):  # Pendulum: [K, 3] -> [K, 1]
            self.calls += 1
            return 0.01 * self.calls - obs[:, :1]

    refused = []
    for model in (tm.CountingNumpy(), Counting()):
        with pytest.raises(StatefulModelError, match="keeps state across calls") as caught:
            rlmesh.run(model, "Pendulum-v1", episodes=2, num_envs=2, seed=0)
        refused.append(str(caught.value).split(":")[0])
    assert refused[0].replace("CountingNumpy", "X") == refused[1].replace("Counting", "X")


# ------------------------------------------------------------------------ GPU


@CUDA
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_on_cuda_equals_the_numpy_model(corner):
    cuda = tm.torch_ops("cuda:0")
    runs_equal(
        tm.chase_models(tm.NumpyOps)[corner](),
        tm.chase_models(cuda)[corner](),
        tm.make_chase,
        num_envs=4,
    )


@CUDA
def test_cuda_round_trips():
    array = extremes(np.float64)
    tensor = rlmesh.torch.as_tensor(array, device="cuda:0")
    assert tensor.device.type == "cuda"
    np.testing.assert_array_equal(rlmesh.torch.from_tensor(tensor), array)
