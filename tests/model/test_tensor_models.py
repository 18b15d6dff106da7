"""``rlmesh.torch`` and ``rlmesh.jax`` alike: a framework model gets the framework's tensors and
gives the same per-episode results as the numpy model of the same function, in every place a
model goes (every corner, the awaited path and ``async`` corners, frame stacks, chunks, a Dict
observation with text, worker processes, a served model, suites, the probe); a per-lane corner
gets parts of one conversion; outputs may mix tensors, numpy, numbers and bfloat16; importing
rlmesh imports no framework.

Each test runs once per framework (the ``framework`` fixture: the flavour's ``tensor_models``
ops), and skips, naming the extra, where that framework is not installed. What only one
framework has (dtypes, x64, devices, memory sharing, GPUs, Ray) is in test_torch.py and
test_jax.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys

import numpy as np
import pytest
import rlmesh
import tensor_models as tm
from helpers import CORES, AwaitEveryStep, comparable
from rlmesh import StatefulModelError
from rlmesh.model import ModelHandler

FRAMEWORKS = {"torch": ("PyTorch", tm.torch_ops), "jax": ("JAX", tm.jax_ops)}
CORNERS = ["predict", "predict_batch", "predict_chunk", "predict_chunk_batch"]
MODELS = {"cartpole": tm.cartpole_models, "stacked": tm.stacked_models, "chase": tm.chase_models}
ENVS = {"cartpole": "CartPole-v1", "stacked": "CartPole-v1", "chase": tm.make_chase}


@pytest.fixture(params=list(FRAMEWORKS))
def framework(request):
    """The framework's ``tensor_models`` ops (its Model, its operations), on the CPU."""
    name = request.param
    title, ops = FRAMEWORKS[name]
    pytest.importorskip(
        name, reason=f"{title} is not installed (the {name} extra): pip install 'rlmesh[{name}]'"
    )
    return ops()


def horizon_of(corner: str) -> int:
    return tm.HORIZON if "chunk" in corner else 1


def inputs_for(framework, kind: str):
    """What the models of ``kind`` need of the framework: 64-bit inputs for the chase env's
    float64 and int64 leaves (JAX refuses them without x64)."""
    return tm.wide_inputs(framework) if kind == "chase" else contextlib.nullcontext()


# ------------------------------------------------------------------------ equal to numpy


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", CORNERS)
def test_every_corner_equals_the_numpy_model(framework, core, num_envs, corner):
    result = tm.runs_equal(
        tm.cartpole_models(tm.NumpyOps)[corner](),
        tm.cartpole_models(framework)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
        execution_horizon=horizon_of(corner),
    )
    assert len({episode.steps for episode in result.episodes}) > 1  # not all at the cap


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_a_dict_observation_with_text_equals_the_numpy_model(framework, core, num_envs, corner):
    # The models check they get tensors for arrays and str / lists of str for the text leaf.
    with tm.wide_inputs(framework):
        tm.runs_equal(
            tm.chase_models(tm.NumpyOps)[corner](),
            tm.chase_models(framework)[corner](),
            tm.make_chase,
            core=core,
            num_envs=num_envs,
        )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("corner", ["predict", "predict_batch"])
def test_frame_stacks_equal_the_numpy_model_even_written_into(framework, core, num_envs, corner):
    """Where the framework lets a model write into its input (torch), the batched model zeroes
    its whole input after acting and the per-lane one overwrites its lane's row: neither
    reaches another lane's stack, a later round or the episode."""
    tm.runs_equal(
        tm.stacked_models(tm.NumpyOps)[corner](),
        tm.stacked_models(framework, write_input=framework.writable)[corner](),
        "CartPole-v1",
        core=core,
        num_envs=num_envs,
    )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("corner", ["predict", "predict_chunk_batch"])
def test_the_awaited_path_and_async_corners_convert_alike(framework, core, corner):
    """With step hooks the driver awaits every round (``ModelHandler.predict``, not the
    core's ``predict_now``); an ``async`` corner goes that way too."""
    models = tm.cartpole_models(framework)

    class AsyncPredict(models["predict"]):
        async def predict(self, obs):
            return super().predict(obs)

    class AsyncChunkBatch(models["predict_chunk_batch"]):
        async def predict_chunk_batch(self, obs, execution_horizon=None):
            return super().predict_chunk_batch(obs, execution_horizon)

    asynchronous = AsyncPredict if corner == "predict" else AsyncChunkBatch
    reference = tm.cartpole_models(tm.NumpyOps)[corner]()
    for model in (models[corner](), asynchronous()):
        tm.runs_equal(reference, model, "CartPole-v1", core=core, num_envs=4,
                      execution_horizon=horizon_of(corner), hooks=AwaitEveryStep())  # fmt: skip


def test_outputs_may_be_tensors_numpy_numbers_or_bfloat16(framework):
    class Mixed(framework.Model):
        def predict_batch(self, obs):
            return {
                "tensor": obs[:, 0] * 2,
                "bf16": framework.bf16(obs[:, 0]),
                "numpy": np.ones(obs.shape[0]),
                "ints": [int(row.sum()) for row in obs],
            }

    handler = ModelHandler(Mixed())
    out = asyncio.run(handler.predict(np.array([[1.5, 2.0], [3.0, 4.0]], np.float32), 2))
    assert out["tensor"].tolist() == [3.0, 6.0] and out["tensor"].dtype == np.float32
    assert out["bf16"].tolist() == [1.5, 3.0] and out["bf16"].dtype == np.float32
    assert out["numpy"].tolist() == [1.0, 1.0] and out["ints"].tolist() == [3, 7]


# ------------------------------------------------------------------------ the conversion


def test_a_per_lane_corner_gets_parts_of_one_conversion(framework):
    handler = ModelHandler(tm.recording_model(framework)())
    assert handler.lane_corner is None  # the cores call predict_now, which converts once
    payload = np.arange(12, dtype=np.float32).reshape(4, 3)
    asyncio.run(handler.load())
    out = handler.predict_now(payload, 4)
    assert out.tolist() == payload.sum(axis=1).tolist()
    seen = handler.model.seen
    assert all(framework.is_input(lane) and tuple(lane.shape) == (3,) for lane in seen)
    assert [lane.tolist() for lane in seen] == payload.tolist()


# ------------------------------------------------------------------------ imports


def test_importing_rlmesh_imports_no_framework(framework):
    other = next(name for name in FRAMEWORKS if name != framework.name)
    code = (
        "import sys, rlmesh, rlmesh.numpy, rlmesh.model.tensors\n"
        "loaded = {'torch', 'jax'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        f"import rlmesh.{framework.name}\n"
        f"assert {framework.name!r} in sys.modules and {other!r} not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_a_missing_framework_names_the_extra(name):
    # No ``framework`` fixture: this holds where the framework is not installed too.
    code = f"import sys; sys.modules[{name!r}] = None; import rlmesh.{name}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"pip install 'rlmesh[{name}]'" in done.stderr
    assert "ImportError" in done.stderr


# ------------------------------------------------------------------------ every place a model goes


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("kind", "corner"), [("chase", "predict"), ("chase", "predict_batch"), ("cartpole", "predict")]
)
def test_worker_processes(framework, core, kind, corner):
    with inputs_for(framework, kind):
        tm.runs_equal(
            MODELS[kind](tm.NumpyOps)[corner](),
            MODELS[kind](framework)[corner](),
            ENVS[kind],
            core=core,
            num_envs=4,
            workers=2,
        )


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("kind", "corner"),
    [("cartpole", "predict"), ("cartpole", "predict_chunk_batch"), ("stacked", "predict_batch")],
)
def test_a_served_model(framework, core, kind, corner):
    """The server's handler converts: a framework model served through rlmesh's model server
    gives the run the numpy model's episodes."""
    with rlmesh.serve_model(MODELS[kind](framework)[corner](), core=core) as server:
        tm.runs_equal(
            MODELS[kind](tm.NumpyOps)[corner](),
            rlmesh.RemoteModel(server.address),
            ENVS[kind],
            core=core,
            num_envs=4,
            execution_horizon=horizon_of(corner),
        )
        assert server.stats().rows > 0


@pytest.mark.parametrize("core", CORES)
def test_a_suite(framework, core):
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

    with tm.wide_inputs(framework):
        reference, result = suite(tm.NumpyOps), suite(framework)
    for task in tasks:
        assert comparable(result[task.name]) == comparable(reference[task.name])


def test_a_stateful_model_is_refused_as_a_numpy_one_is(framework):
    refused = []
    for model in (tm.CountingNumpy(), tm.counting_model(framework)()):
        with pytest.raises(StatefulModelError, match="keeps state across calls") as caught:
            rlmesh.run(model, "Pendulum-v1", episodes=2, num_envs=2, seed=0)
        refused.append(str(caught.value).split(":")[0])
    assert re.search(r"Counting\.predict_batch keeps state", refused[1]), refused[1]
    assert refused[0].replace("CountingNumpy", "X") == refused[1].replace("Counting", "X")
