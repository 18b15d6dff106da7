"""``rlmesh.jax``'s own: 64-bit inputs are refused unless ``jax_enable_x64`` is on, naming the
leaf and the fix; a batched corner shares the cores' payload memory on the CPU; devices by
name or object; dtypes round-trip exactly (the 64-bit ones with x64), ``asarray`` copies,
bfloat16 and what JAX cannot hold; the GPU. What JAX and torch share (equal to the numpy model
in every place a model goes) is test_tensor_models.py."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest

jax = pytest.importorskip(
    "jax", reason="JAX is not installed (the jax extra): pip install 'rlmesh[jax]'"
)

import jax.numpy as jnp  # noqa: E402 - after the skip
import rlmesh  # noqa: E402
import rlmesh.jax  # noqa: E402
import tensor_models as tm  # noqa: E402
from helpers import CORES  # noqa: E402
from rlmesh import ModelDefinitionError  # noqa: E402
from rlmesh._pycore.assembly import aligned_empty  # noqa: E402
from rlmesh.adapters import Image, ModelSpec  # noqa: E402
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
    with tm.wide_inputs(JAX):
        yield


# ------------------------------------------------------------------------ x64


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


def test_a_batched_corner_shares_the_cores_payload_on_the_cpu(core):
    """JAX's CPU buffers take a numpy array as it is only when it starts on a 64-byte boundary
    (they copy any other); the cores assemble payloads so, so the model's input is the
    payload itself."""

    class Batch(rlmesh.jax.Model):
        def predict_batch(self, obs):
            self.pointer = obs.unsafe_buffer_pointer()
            return obs[:, 0, 0, 0]

    space = gym.spaces.Box(0, 255, (8, 6, 3), np.uint8)
    plan = ModelSpec(input=Image(layout="chw")).compile(space, gym.spaces.Discrete(2))
    assembler = core.ObservationAssembler(plan.observation)
    handler = ModelHandler(Batch())
    asyncio.run(handler.load())
    for lanes in (1, 3, 16):
        frames = [space.sample() for _ in range(lanes)]
        payload = assembler.assemble(frames, list(range(lanes)))
        actions = handler.predict_now(payload, lanes)
        assert actions.tolist() == [int(frame[0, 0, 0]) for frame in frames]
        assert handler.model.pointer == payload.ctypes.data


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


def round_trip(dtype):
    tm.round_trip(rlmesh.jax.asarray, rlmesh.jax.from_array, tm.extremes(dtype))


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
        rlmesh.jax.asarray(tm.extremes(dtype))


def test_asarray_copies_and_bfloat16_comes_back_as_float32():
    aligned = aligned_empty((4,), np.int32)
    aligned[...] = np.arange(4)
    for array in (np.arange(4, dtype=np.int32), aligned):
        converted = rlmesh.jax.asarray(array)  # device_put alone would share an aligned one
        array[0] = 9
        assert converted.tolist() == [0, 1, 2, 3]
    back = rlmesh.jax.from_array(jnp.array([0.5, -3.0], dtype=jnp.bfloat16))
    assert back.dtype == np.float32 and back.tolist() == [0.5, -3.0]
    with pytest.raises(TypeError, match="jax cannot hold dtype <U1"):
        rlmesh.jax.asarray(np.array(["a"]))


# ------------------------------------------------------------------------ GPU


@GPU
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_model_on_the_gpu_equals_the_numpy_model(corner):
    tm.runs_equal(
        tm.cartpole_models(tm.NumpyOps)[corner](),
        tm.cartpole_models(tm.jax_ops("gpu:0"))[corner](),
        "CartPole-v1",
        num_envs=4,
    )


@GPU
def test_gpu_round_trips():
    array = tm.extremes(np.float32)
    converted = rlmesh.jax.asarray(array, device="gpu")
    assert converted.devices() == {rlmesh.jax.device_of("gpu")}
    np.testing.assert_array_equal(rlmesh.jax.from_array(converted), array)
