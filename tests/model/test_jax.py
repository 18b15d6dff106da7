"""``rlmesh.jax``: a JAX model gets ``jax.Array`` inputs and gives the same per-episode results
as the numpy model of the same function (every corner, frame stacks, chunks, a Dict
observation with text, worker processes, a served model, the probe); 64-bit inputs are refused
unless ``jax_enable_x64`` is on; dtypes round-trip exactly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

jax = pytest.importorskip(
    "jax", reason="JAX is not installed (the jax extra): pip install 'rlmesh[jax]'"
)

import jax.numpy as jnp  # noqa: E402 - after the skip
import rlmesh  # noqa: E402
import rlmesh.jax  # noqa: E402
import tensor_models as tm  # noqa: E402
from helpers import CORES, comparable  # noqa: E402
from rlmesh import ModelDefinitionError, StatefulModelError  # noqa: E402
from rlmesh.model import ModelHandler  # noqa: E402

JAX = tm.jax_ops()


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


GPU = pytest.mark.skipif(not _has_gpu(), reason="no JAX GPU")


@pytest.fixture
def x64():
    """64-bit types on for the test, off again after it (JAX's default)."""
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


def runs_equal(numpy_model, jax_model, env, **options):
    reference = rlmesh.run(numpy_model, env, **tm.RUN, **options)
    result = rlmesh.run(jax_model, env, **tm.RUN, **options)
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
        tm.cartpole_models(JAX)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
        execution_horizon=horizon,
    )
    assert len({episode.steps for episode in result.episodes}) > 1


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_frame_stacks_equal_the_numpy_model(core, num_envs, corner):
    runs_equal(
        tm.stacked_models(tm.NumpyOps)[corner](),
        tm.stacked_models(JAX)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
    )


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_dict_observation_with_text_equals_the_numpy_model(core, num_envs, corner):
    runs_equal(
        tm.chase_models(tm.NumpyOps)[corner](),
        tm.chase_models(JAX)[corner](),
        tm.make_chase,
        core=core,
        num_envs=num_envs,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 2])
def test_64_bit_inputs_without_x64_are_refused_naming_the_leaf_and_the_fix(core, num_envs):
    assert not jax.config.jax_enable_x64
    with pytest.raises(ModelDefinitionError) as caught:
        rlmesh.run(tm.chase_models(JAX)["predict_batch"](), tm.make_chase, episodes=2,
                   num_envs=num_envs, core=core)  # fmt: skip
    message = str(caught.value)
    assert 'obs["mode"]' in message and "int64" in message
    assert 'jax.config.update("jax_enable_x64", True)' in message and "ModelSpec" in message


# ------------------------------------------------------------------------ the conversion


def test_a_per_lane_corner_gets_parts_of_one_conversion():
    class Recorder(rlmesh.jax.Model):
        def __init__(self):
            super().__init__()
            self.seen = []

        def predict(self, obs):
            self.seen.append(obs)
            return obs.sum()

    handler = ModelHandler(Recorder())
    assert handler.lane_corner is None  # the cores call predict_now, which converts once
    payload = np.arange(12, dtype=np.float32).reshape(4, 3)
    asyncio.run(handler.load())
    out = handler.predict_now(payload, 4)
    assert out.tolist() == payload.sum(axis=1).tolist()
    seen = handler.model.seen
    assert all(isinstance(lane, jax.Array) and lane.shape == (3,) for lane in seen)
    assert [lane.tolist() for lane in seen] == payload.tolist()


def aligned(values: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A copy of ``values`` whose buffer starts on an ``alignment``-byte boundary."""
    raw = np.empty(values.nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start : start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


def test_a_batched_corner_shares_an_aligned_payloads_memory_on_the_cpu():
    """JAX's CPU buffers take a numpy payload as it is when it starts on a 64-byte boundary
    (it copies any other)."""

    class Batch(rlmesh.jax.Model):
        def predict_batch(self, obs):
            self.pointer = obs.unsafe_buffer_pointer()
            return obs[:, 0]

    payload = aligned(np.arange(64, dtype=np.float32).reshape(16, 4))
    handler = ModelHandler(Batch())
    asyncio.run(handler.load())
    assert handler.predict_now(payload, 16).tolist() == payload[:, 0].tolist()
    assert handler.model.pointer == payload.ctypes.data


def test_outputs_may_be_arrays_numpy_or_bfloat16():
    class Mixed(rlmesh.jax.Model):
        def predict_batch(self, obs):
            return {
                "array": obs[:, 0] * 2,
                "bf16": obs[:, 0].astype(jnp.bfloat16),
                "numpy": np.ones(obs.shape[0]),
            }

    handler = ModelHandler(Mixed())
    out = asyncio.run(handler.predict(np.array([[1.5, 2.0], [3.0, 4.0]], np.float32), 2))
    assert out["array"].tolist() == [3.0, 6.0] and out["array"].dtype == np.float32
    assert out["bf16"].tolist() == [1.5, 3.0] and out["bf16"].dtype == np.float32
    assert out["numpy"].tolist() == [1.0, 1.0]


def test_devices_by_name_or_object():
    cpu = jax.devices("cpu")[0]
    assert rlmesh.jax.device_of("cpu") == cpu == rlmesh.jax.device_of("cpu:0")
    assert rlmesh.jax.device_of(cpu) is cpu
    assert rlmesh.jax.Model(abs, device="cpu").tensor_bridge().device == cpu
    with pytest.raises(ValueError, match="expected PLATFORM or PLATFORM:INDEX"):
        rlmesh.jax.device_of("cpu:first")
    if not _has_gpu():
        with pytest.raises(ValueError, match="JAX has no gpu device here"):
            rlmesh.jax.device_of("cuda:0")


# ------------------------------------------------------------------------ round trips

NARROW = [np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32]
NARROW += [np.float16, np.float32, np.complex64]
WIDE = [np.int64, np.uint64, np.float64, np.complex128]


def extremes(dtype):
    if dtype == np.bool_:
        return np.array([[True, False], [False, True]])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max], [info.max - 1, 1]], dtype=dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (np.array([[1 / 3, -2.5], [1e30, 0]]) * (1 + 1j / 7)).astype(dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, info.max], [info.tiny, 1 / 3]], dtype=dtype)


def round_trip(dtype):
    array = extremes(dtype)
    back = rlmesh.jax.from_array(rlmesh.jax.asarray(array))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert rlmesh.jax.from_array(rlmesh.jax.asarray(array[0, 0])).shape == ()
    assert rlmesh.jax.from_array(rlmesh.jax.asarray(array[:0])).shape == (0, 2)


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: np.dtype(d).name)
def test_every_narrow_dtype_round_trips_exactly(dtype):
    round_trip(dtype)


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("dtype", NARROW + WIDE, ids=lambda d: np.dtype(d).name)
def test_with_x64_every_dtype_round_trips_exactly(dtype):
    round_trip(dtype)


@pytest.mark.parametrize("dtype", WIDE, ids=lambda d: np.dtype(d).name)
def test_without_x64_64_bit_dtypes_are_refused_naming_the_fix(dtype):
    with pytest.raises(TypeError, match=f"jax cannot hold dtype {np.dtype(dtype).name} exactly"):
        rlmesh.jax.asarray(extremes(dtype))


def test_asarray_copies_and_bfloat16_comes_back_as_float32():
    for array in (np.arange(4, dtype=np.int32), aligned(np.arange(4, dtype=np.int32))):
        converted = rlmesh.jax.asarray(array)  # device_put alone would share an aligned one
        array[0] = 9
        assert converted.tolist() == [0, 1, 2, 3]
    back = rlmesh.jax.from_array(jnp.array([0.5, -3.0], dtype=jnp.bfloat16))
    assert back.dtype == np.float32 and back.tolist() == [0.5, -3.0]
    with pytest.raises(TypeError, match="jax cannot hold dtype <U1"):
        rlmesh.jax.asarray(np.array(["a"]))


# ------------------------------------------------------------------------ every place a model goes


@pytest.mark.parametrize("core", CORES)
def test_worker_processes(core):
    runs_equal(
        tm.cartpole_models(tm.NumpyOps)["predict"](),
        tm.cartpole_models(JAX)["predict"](),
        "CartPole-v1",
        core=core,
        num_envs=4,
        workers=2,
    )


@pytest.mark.parametrize("core", CORES)
def test_a_served_jax_model(core):
    with rlmesh.serve_model(tm.stacked_models(JAX)["predict_batch"](), core=core) as server:
        runs_equal(
            tm.stacked_models(tm.NumpyOps)["predict_batch"](),
            rlmesh.RemoteModel(server.address),
            "CartPole-v1",
            core=core,
            num_envs=4,
        )


def test_a_stateful_jax_model_is_refused():
    class Counting(rlmesh.jax.Model):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def predict_batch(self, obs):  # Pendulum: [K, 3] -> [K, 1]
            self.calls += 1
            return 0.01 * self.calls - obs[:, :1]

    with pytest.raises(StatefulModelError, match=r"Counting\.predict_batch keeps state"):
        rlmesh.run(Counting(), "Pendulum-v1", episodes=2, num_envs=2, seed=0)


# ------------------------------------------------------------------------ GPU


@GPU
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_on_the_gpu_equals_the_numpy_model(corner):
    runs_equal(
        tm.cartpole_models(tm.NumpyOps)[corner](),
        tm.cartpole_models(tm.jax_ops("gpu:0"))[corner](),
        "CartPole-v1",
        num_envs=4,
    )


@GPU
def test_gpu_round_trips():
    array = extremes(np.float32)
    converted = rlmesh.jax.asarray(array, device="gpu")
    assert converted.devices() == {rlmesh.jax.device_of("gpu")}
    np.testing.assert_array_equal(rlmesh.jax.from_array(converted), array)
