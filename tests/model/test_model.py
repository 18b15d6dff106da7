"""The model API: corners and how the handler derives the missing ones, the lifecycle, and the
stateful-model probe."""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest
import rlmesh
import rlmesh.numpy
import rlmesh.stats
from helpers import CORES
from rlmesh import Model, ModelOutputError, StatefulModelError
from rlmesh.model import ModelHandler, defined_corners

K = 3


def payload(num_lanes: int = K) -> dict:
    """A fused input: an array leaf [K, 2], a nested array leaf and a text leaf (K strings)."""
    return {
        "state": np.arange(num_lanes * 2, dtype=np.float64).reshape(num_lanes, 2),
        "extra": {"bias": np.linspace(0.5, 1.5, num_lanes)},
        "prompt": ["go", "stop", "pick up"][:num_lanes],
    }


def act(obs: dict) -> np.ndarray:
    """The reference policy for one lane: depends on every leaf, text included."""
    return obs["state"] * 2 + obs["extra"]["bias"] + len(obs["prompt"])


def chunk(obs: dict, horizon: int) -> np.ndarray:
    return np.stack([act(obs) + step for step in range(horizon)])


def lanes(fused: dict) -> list[dict]:
    """The per-lane inputs a fused payload holds (the reference side of the tests)."""
    return [
        {
            "state": fused["state"][k],
            "extra": {"bias": fused["extra"]["bias"][k]},
            "prompt": fused["prompt"][k],
        }
        for k in range(len(fused["prompt"]))
    ]


class OnlyPredict(Model):
    def predict(self, obs):
        return act(obs)


class OnlyBatch(Model):
    def predict_batch(self, obs):
        return np.stack([act(lane) for lane in lanes(obs)])


class OnlyChunk(Model):
    def predict_chunk(self, obs, execution_horizon=None):
        return chunk(obs, execution_horizon)


class OnlyChunkBatch(Model):
    def predict_chunk_batch(self, obs, execution_horizon=None):
        return np.stack([chunk(lane, execution_horizon) for lane in lanes(obs)])


ALONE = [OnlyPredict, OnlyBatch, OnlyChunk, OnlyChunkBatch]
CHUNKY = [OnlyChunk, OnlyChunkBatch]


def run_predict(handler: ModelHandler, fused=None, num_lanes: int = K):
    return asyncio.run(handler.predict(payload(num_lanes) if fused is None else fused, num_lanes))


# ----------------------------------------------------------------------------------------------
# Corners


@pytest.mark.parametrize("model_class", ALONE, ids=lambda cls: cls.__name__)
def test_each_corner_alone_gives_one_action_per_lane(model_class):
    handler = ModelHandler(model_class())
    assert handler.corner == defined_corners(handler.model)[0]
    assert not handler.chunked
    out = run_predict(handler)
    expected = np.stack([act(lane) for lane in lanes(payload())])
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("model_class", CHUNKY, ids=lambda cls: cls.__name__)
def test_each_chunk_corner_alone_gives_chunks_of_the_execution_horizon(model_class):
    handler = ModelHandler(model_class(), execution_horizon=4)
    assert handler.chunked
    out = run_predict(handler)
    expected = np.stack([chunk(lane, 4) for lane in lanes(payload())])
    assert out.shape == (K, 4, 2)
    np.testing.assert_array_equal(out, expected)


def test_derived_corners_agree_with_the_defined_one():
    outputs = [run_predict(ModelHandler(cls())) for cls in ALONE]
    for out in outputs[1:]:
        np.testing.assert_array_equal(out, outputs[0])
    chunked = [run_predict(ModelHandler(cls(), execution_horizon=3)) for cls in CHUNKY]
    np.testing.assert_array_equal(chunked[0], chunked[1])


def test_the_most_specific_corner_is_chosen():
    class Everything(OnlyPredict, OnlyBatch, OnlyChunk, OnlyChunkBatch):
        pass

    assert ModelHandler(Everything()).corner == "predict_batch"
    assert ModelHandler(Everything(), execution_horizon=2).corner == "predict_chunk_batch"

    class PerLane(OnlyPredict, OnlyChunk):
        pass

    assert ModelHandler(PerLane()).corner == "predict"
    assert ModelHandler(PerLane(), execution_horizon=2).corner == "predict_chunk"


def test_a_batched_corner_is_called_once_per_step_with_only_the_lanes_given():
    calls = []

    class Recorder(Model):
        def predict_batch(self, obs):
            calls.append(obs)
            return obs["state"].sum(axis=1)

    handler = ModelHandler(Recorder())
    fused = payload(2)  # two of three lanes need an action
    out = run_predict(handler, fused, num_lanes=2)
    assert len(calls) == 1
    assert calls[0] is fused
    assert out.tolist() == [1.0, 5.0]


def test_a_per_lane_corner_is_called_once_per_lane_with_that_lanes_slice():
    seen = []

    class Recorder(Model):
        def predict(self, obs):
            seen.append(obs)
            return act(obs)

    run_predict(ModelHandler(Recorder()))
    assert [lane["prompt"] for lane in seen] == ["go", "stop", "pick up"]
    assert [lane["state"].tolist() for lane in seen] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert [float(lane["extra"]["bias"]) for lane in seen] == [0.5, 1.0, 1.5]


def test_a_bare_callable_and_model_of_a_callable_are_predict():
    for model in (act, Model(act)):
        handler = ModelHandler(model)
        assert handler.corner == "predict"
        assert isinstance(handler.model, Model)
        np.testing.assert_array_equal(run_predict(handler), run_predict(ModelHandler(OnlyBatch())))


def test_a_dict_output_keeps_its_structure_as_arrays():
    class Arm(Model):
        def predict(self, obs):
            return {"arm": list(obs["state"]), "grip": {"open": obs["prompt"] == "go"}}

    out = run_predict(ModelHandler(Arm()))
    assert out["arm"].shape == (K, 2)
    assert out["grip"]["open"].tolist() == [True, False, False]

    class ArmChunks(Model):
        def predict_chunk_batch(self, obs, execution_horizon):
            return {"arm": np.zeros((K, execution_horizon, 2)), "grip": [[1] * 5] * K}

    out = run_predict(ModelHandler(ArmChunks()))  # un-chunked: first action of each leaf
    assert out["arm"].shape == (K, 2)
    assert out["grip"].tolist() == [1] * K


def test_a_chunk_corner_in_an_unchunked_run_is_asked_for_one_action_and_cut_to_the_first():
    horizons = []

    class LongChunks(Model):
        def predict_chunk(self, obs, execution_horizon=None):
            horizons.append(execution_horizon)
            return chunk(obs, 5)  # more than asked: only the first is used

    out = run_predict(ModelHandler(LongChunks()))
    assert horizons == [1] * K
    np.testing.assert_array_equal(out, np.stack([act(lane) for lane in lanes(payload())]))


def test_per_lane_chunks_of_different_lengths_are_cut_to_the_shortest():
    class Ragged(Model):
        def predict_chunk(self, obs, execution_horizon=None):
            return chunk(obs, {"go": 6, "stop": 2, "pick up": 4}[obs["prompt"]])

    out = run_predict(ModelHandler(Ragged(), execution_horizon=5))
    assert out.shape == (K, 2, 2)
    np.testing.assert_array_equal(out, np.stack([chunk(lane, 2) for lane in lanes(payload())]))


def test_the_horizon_is_passed_only_to_chunk_corners_that_accept_it():
    received = {}

    class NoHorizon(Model):
        def predict_chunk(self, obs):
            received["none"] = True
            return chunk(obs, 2)

    class Keyword(Model):
        def predict_chunk_batch(self, obs, *, execution_horizon):
            received["keyword"] = execution_horizon
            return np.zeros((K, execution_horizon, 2))

    class Kwargs(Model):
        def predict_chunk(self, obs, **options):
            received["kwargs"] = options
            return chunk(obs, 2)

    class OtherName(Model):
        def predict_chunk(self, obs, horizon):
            received["positional"] = horizon
            return chunk(obs, horizon)

    for model in (NoHorizon(), Keyword(), Kwargs(), OtherName()):
        assert run_predict(ModelHandler(model, execution_horizon=3)).shape[0] == K
    assert received == {
        "none": True,
        "keyword": 3,
        "kwargs": {"execution_horizon": 3},
        "positional": 3,
    }


def test_async_corners_are_awaited():
    class AsyncBatch(Model):
        async def predict_batch(self, obs):
            await asyncio.sleep(0)
            return np.stack([act(lane) for lane in lanes(obs)])

    class AsyncChunk(Model):
        async def predict_chunk(self, obs, execution_horizon=None):
            await asyncio.sleep(0)
            return chunk(obs, execution_horizon)

    expected = run_predict(ModelHandler(OnlyPredict()))
    np.testing.assert_array_equal(run_predict(ModelHandler(AsyncBatch())), expected)
    np.testing.assert_array_equal(
        run_predict(ModelHandler(AsyncChunk(), execution_horizon=2)),
        run_predict(ModelHandler(OnlyChunk(), execution_horizon=2)),
    )

    async def coroutine_fn(obs):
        return act(obs)

    np.testing.assert_array_equal(run_predict(ModelHandler(coroutine_fn)), expected)


def test_a_horizon_without_a_chunk_corner_warns_once_and_runs_unchunked():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handler = ModelHandler(OnlyBatch(), execution_horizon=8)
        for _ in range(3):
            out = run_predict(handler)
    assert len(caught) == 1
    assert caught[0].category is UserWarning
    assert "execution_horizon=8" in str(caught[0].message)
    assert "OnlyBatch" in str(caught[0].message)
    assert not handler.chunked
    assert out.shape == (K, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ModelHandler(OnlyChunk(), execution_horizon=8)  # a chunk corner: no warning
        ModelHandler(OnlyBatch(), execution_horizon=1)


# ----------------------------------------------------------------------------------------------
# Lifecycle


class Lifecycle(Model):
    def __init__(self):
        super().__init__()
        self.events = []

    def load(self):
        self.events.append("load")

    def predict(self, obs):
        self.events.append("predict")
        return 0

    async def on_episode_end(self, episode_id):
        self.events.append(f"end {episode_id}")

    def reset(self):
        self.events.append("reset")

    async def close(self):
        self.events.append("close")


def test_lifecycle_order_load_once_episode_end_then_reset_close_once():
    model = Lifecycle()
    handler = ModelHandler(model)

    async def run():
        await handler.load()
        await handler.predict(np.zeros((1, 2)), 1)
        await handler.load()
        await handler.predict(np.zeros((1, 2)), 1)
        await handler.episode_end(7)
        await handler.close()
        await handler.close()

    asyncio.run(run())
    assert model.events == ["load", "predict", "predict", "end 7", "reset", "close"]


def test_predict_loads_a_model_that_was_not_loaded():
    model = Lifecycle()
    asyncio.run(ModelHandler(model).predict(np.zeros((2, 1)), 2))
    assert model.events == ["load", "predict", "predict"]


def test_the_default_lifecycle_is_a_no_op_for_a_wrapped_callable():
    handler = ModelHandler(act)

    async def run():
        await handler.load()
        out = await handler.predict(payload(), K)
        await handler.episode_end(0)
        await handler.close()
        return out

    assert run_predict(ModelHandler(OnlyPredict())).tolist() == asyncio.run(run()).tolist()
    model = Model(act)
    assert [model.load(), model.on_episode_end(3), model.reset(), model.close()] == [None] * 4


def test_spec_is_the_models_spec_attribute():
    class WithSpec(OnlyPredict):
        spec = rlmesh.ModelSpec(input=rlmesh.State("state"))

    assert ModelHandler(WithSpec()).spec is WithSpec.spec
    assert ModelHandler(OnlyPredict()).spec is None
    assert ModelHandler(act).spec is None


# ----------------------------------------------------------------------------------------------
# Bad models and bad outputs


def test_a_class_instead_of_an_instance_is_refused():
    with pytest.raises(
        TypeError, match=r"the class OnlyBatch, not an instance: pass OnlyBatch\(\)"
    ):
        ModelHandler(OnlyBatch)


@pytest.mark.parametrize("model", [object(), Model(), 42], ids=["object", "bare Model", "int"])
def test_an_object_without_corners_is_refused(model):
    with pytest.raises(TypeError, match="predict_chunk_batch"):
        ModelHandler(model)


def test_model_of_a_non_callable_is_refused():
    with pytest.raises(TypeError, match="fn must be a callable"):
        Model(42)


def test_a_batched_corner_with_the_wrong_row_count_is_a_model_output_error():
    class OneTooMany(Model):
        def predict_batch(self, obs):
            return {"arm": np.zeros((len(obs) + 1, 2))}

    with pytest.raises(
        ModelOutputError, match=r'predict_batch returned 4 rows for 3 lanes: output\["arm"\]'
    ):
        run_predict(ModelHandler(OneTooMany()), np.zeros((K, 2)))

    class Scalar(Model):
        def predict_chunk_batch(self, obs, execution_horizon):
            return 0.0

    with pytest.raises(ModelOutputError, match="predict_chunk_batch returned 0 rows for 3 lanes"):
        run_predict(ModelHandler(Scalar(), execution_horizon=2), np.zeros((K, 2)))


def test_per_lane_outputs_that_do_not_stack_are_a_model_output_error():
    class Ragged(Model):
        def predict(self, obs):
            return np.zeros(int(obs[0]) + 1)

    with pytest.raises(ModelOutputError, match="predict returned outputs that cannot be stacked"):
        run_predict(ModelHandler(Ragged()), np.arange(K)[:, None])


def test_an_error_in_a_per_lane_corner_propagates_unchanged():
    class Broken(Model):
        def predict(self, obs):
            raise KeyError("camera")

    with pytest.raises(KeyError, match="camera"):
        run_predict(ModelHandler(Broken()))


def test_numpy_model_is_rlmesh_model():
    assert rlmesh.numpy.Model is rlmesh.Model
    assert issubclass(rlmesh.StatefulModelError, rlmesh.RlmeshError)


# ----------------------------------------------------------------------------------------------
# The stateful-model probe

SAMPLE_A = np.array([[0.25, -1.0, 3.0]])
SAMPLE_B = np.array([[2.0, 0.5, -4.0]])


def probe(model, execution_horizon: int = 1) -> None:
    handler = ModelHandler(model, execution_horizon=execution_horizon)
    asyncio.run(handler.check_stateless(SAMPLE_A, SAMPLE_B))


class Counter(Model):
    """Counts its calls: lanes sharing it would count each other's steps."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict(self, obs):
        self.calls += 1
        return obs * 0.1 + self.calls


class RemembersLast(Model):
    """A recurrent-like policy: the action mixes in the previous observation."""

    last = None

    def predict_batch(self, obs):
        previous = obs if self.last is None else self.last
        self.last = obs
        return obs + 0.5 * previous


class NoisyCounter(Model):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict_chunk(self, obs, execution_horizon=None):
        self.calls += 1
        return np.stack([obs + self.calls + np.random.normal(0, 0.1, obs.shape)] * 4)


@pytest.mark.parametrize(
    ("model", "horizon", "what"),
    [
        (Counter(), 1, "the number of earlier calls"),
        (RemembersLast(), 1, "which input came just before it"),
        (NoisyCounter(), 4, "the number of earlier calls"),
    ],
    ids=["counter", "remembers the last input", "noisy counter"],
)
def test_the_probe_rejects_a_model_with_state_and_says_what_to_do(model, horizon, what):
    np.random.seed(0)
    with pytest.raises(StatefulModelError) as caught:
        probe(model, execution_horizon=horizon)
    message = str(caught.value)
    assert type(model).__name__ in message
    assert what in message
    assert "stack=" in message and "context['state']" in message
    assert "num_envs=1" in message


def test_the_probe_accepts_a_deterministic_pure_model():
    probe(lambda obs: np.tanh(obs) * 2)

    class Chunks(Model):
        def predict_chunk_batch(self, obs, execution_horizon):
            return np.stack([obs * step for step in range(execution_horizon)], axis=1)

    probe(Chunks(), execution_horizon=8)
    probe(Model(lambda obs: {"arm": obs, "grip": obs.sum() > 0}))


@pytest.mark.parametrize("seed", range(50))
def test_the_probe_accepts_noisy_pure_models(seed):
    np.random.seed(seed)
    # Continuous noise, heavy-tailed noise, and rare discrete noise (epsilon-greedy).
    probe(lambda obs: obs + np.random.normal(0, 0.3, obs.shape))
    probe(lambda obs: obs + np.random.standard_cauchy(obs.shape))

    def epsilon_greedy(obs):
        greedy = np.argmax(obs, axis=-1)
        explore = np.random.random(greedy.shape) < 0.1
        return np.where(explore, np.random.randint(0, 3, greedy.shape), greedy)

    probe(epsilon_greedy)


class CallCounter(Model):
    """A deterministic pure policy that counts the calls it receives (its output never
    depends on them)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict(self, obs):
        self.calls += 1
        return np.tanh(obs) * 2


class NoisyRemembersLast(Model):
    """Recurrent and noisy: the action mixes in the previous observation, plus noise."""

    last = None

    def predict(self, obs):
        previous = obs if self.last is None else self.last
        self.last = obs
        return obs + 0.5 * previous + np.random.normal(0, 0.05, obs.shape)


def test_a_deterministic_pure_model_is_probed_in_at_most_five_calls():
    model = CallCounter()
    probe(model)
    assert model.calls <= 5

    class Batched(CallCounter):
        def predict_batch(self, obs):
            self.calls += 1
            return obs * 3

    batched = Batched()
    probe(batched)
    assert batched.calls <= 5


def test_a_noisy_pure_model_gets_the_longer_check_and_passes():
    np.random.seed(1)
    calls = []

    def noisy(obs):
        calls.append(obs)
        return obs + np.random.normal(0, 0.3, obs.shape)

    probe(noisy)
    assert len(calls) > 5  # its first calls disagree: the statistical check ran too


@pytest.mark.parametrize(
    "model", [Counter, RemembersLast, NoisyCounter, NoisyRemembersLast], ids=lambda m: m.__name__
)
def test_a_stateful_model_is_refused_deterministic_or_noisy(model):
    np.random.seed(0)
    with pytest.raises(StatefulModelError, match="keeps state across calls"):
        probe(model(), execution_horizon=4 if model is NoisyCounter else 1)


class Promised(CallCounter):
    stateless = True


class WithContext(CallCounter):
    def predict(self, obs, context):
        self.calls += 1
        return np.tanh(obs) * 2


@pytest.mark.parametrize("model_class", [Promised, WithContext])
def test_stateless_true_and_a_context_corner_skip_the_probe(model_class):
    model = model_class()
    probe(model)
    assert model.calls == 0


def run_counted(model, core, num_envs, **kwargs):
    return rlmesh.run(
        model, "CartPole-v1", episodes=4, num_envs=num_envs, seed=3, core=core, **kwargs
    )


class CartPoleCounter(Model):
    """A deterministic CartPole policy counting its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def predict(self, obs):
        self.calls += 1
        return int(obs[2] + 0.3 * obs[3] > 0)


@pytest.mark.parametrize("core", CORES)
def test_the_probe_costs_a_run_five_calls_and_never_counts_in_telemetry(core):
    model = CartPoleCounter()
    result = run_counted(model, core, num_envs=3)
    (predict,) = [row for row in result.telemetry if row.op == "model.predict"]
    # Un-chunked, per-lane: one call per lane-step, and the probe's 5 on top, uncounted.
    assert predict.count == result.total_steps == model.calls - 5
    summary = rlmesh.stats.summarize(result, core=core)
    assert summary["predicts_per_episode"] == result.total_steps / result.num_episodes


class PromisedCartPole(CartPoleCounter):
    stateless = True


class CartPoleWithContext(CartPoleCounter):
    def predict(self, obs, context):
        self.calls += 1
        return int(obs[2] + 0.3 * obs[3] > 0)


@pytest.mark.parametrize("model_class", [PromisedCartPole, CartPoleWithContext])
@pytest.mark.parametrize("core", CORES)
def test_a_run_skips_the_probe_of_a_stateless_or_context_model(core, model_class):
    model = model_class()
    result = run_counted(model, core, num_envs=3)
    assert model.calls == result.total_steps  # not one call more


class FailsOnFirstCall(Model):
    def predict(self, obs):
        raise ValueError(f"expected obs of shape (7,), got {obs.shape}")


class TooManyRows(Model):
    def predict_batch(self, obs):
        return np.zeros(4, np.int64)  # always 4 rows, whatever the lanes


@pytest.mark.parametrize(
    ("model", "error", "said"),
    [
        (FailsOnFirstCall(), rlmesh.ModelError, "model.predict raised ValueError"),
        (TooManyRows(), ModelOutputError, "predict_batch returned 4 rows for 1 lanes"),
    ],
    ids=["model raises", "wrong row count"],
)
@pytest.mark.parametrize("core", CORES)
def test_an_error_during_the_probe_says_it_came_from_the_probe(core, model, error, said):
    with pytest.raises(error) as caught:
        run_counted(model, core, num_envs=4)
    message = str(caught.value)
    assert said in message
    assert "during the statefulness probe (before the first round" in message
    assert "stateless = True" in message


# ----------------------------------------------------------------------------------------------
# Choosing the corner for the lanes, and a model without one


class BothCorners(Model):
    """The same pure policy through both corners, counting which one is called."""

    def __init__(self):
        super().__init__()
        self.calls = {"predict": 0, "predict_batch": 0}

    def predict(self, obs):
        self.calls["predict"] += 1
        return int(obs[2] + 0.3 * obs[3] > 0)

    def predict_batch(self, obs):
        self.calls["predict_batch"] += 1
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


@pytest.mark.parametrize("core", CORES)
def test_one_lane_runs_the_per_lane_corner_and_several_lanes_the_batched_one(core):
    one, several = BothCorners(), BothCorners()
    single = run_counted(one, core, num_envs=1)
    shared = run_counted(several, core, num_envs=3)
    assert one.calls == {"predict": single.total_steps, "predict_batch": 0}
    assert several.calls["predict"] == 0 and several.calls["predict_batch"] > 0
    # The same pure policy either way: the same episodes.
    drop = {"env_index", "duration_s", "predict_ms", "step_ms"}
    assert [{k: v for k, v in e.to_dict().items() if k not in drop} for e in single.episodes] == [
        {k: v for k, v in e.to_dict().items() if k not in drop} for e in shared.episodes
    ]


def test_fit_lanes_picks_the_per_lane_corner_of_the_same_kind_for_one_lane():
    class Chunks(Model):
        def predict_chunk(self, obs, execution_horizon=None):
            return np.stack([obs] * 3)

        def predict_chunk_batch(self, obs, execution_horizon=None):
            return np.stack([obs] * 3, axis=1)

    chunked = ModelHandler(Chunks(), execution_horizon=3)
    chunked.fit_lanes(4)
    assert chunked.corner == "predict_chunk_batch"
    chunked.fit_lanes(1)
    assert chunked.corner == "predict_chunk"
    assert asyncio.run(chunked.predict(np.ones((1, 2)), 1)).shape == (1, 3, 2)
    only_batch = ModelHandler(OnlyBatch())
    only_batch.fit_lanes(1)  # nothing else to pick
    assert only_batch.corner == "predict_batch"


class NoCorner(Model):
    def act(self, obs):  # a name rlmesh does not call
        return 0


@pytest.mark.parametrize("core", CORES)
def test_a_model_without_a_corner_is_a_typed_error_naming_the_four_and_the_fix(core):
    with pytest.raises(rlmesh.ModelDefinitionError) as caught:
        run_counted(NoCorner(), core, num_envs=1)
    assert isinstance(caught.value, rlmesh.RlmeshError) and isinstance(caught.value, TypeError)
    message = str(caught.value)
    assert "NoCorner defines none of the four predict corners" in message
    assert "(predict, predict_batch, predict_chunk, predict_chunk_batch)" in message
    assert "override at least one" in message and "Model(fn)" in message


def test_the_command_line_refuses_a_model_without_a_corner_in_one_line(tmp_path, capsys):
    from rlmesh.cli import main

    policy = tmp_path / "no_corner.py"
    policy.write_text("import rlmesh\n\nclass Policy(rlmesh.Model):\n    pass\n")
    argv = ["eval", f"{policy}:Policy", "--env", "CartPole-v1", "--episodes", "2"]
    assert main([*argv, "--no-progress"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("rlmesh: error: policy ")
    assert "Policy defines none of the four predict corners" in line
    assert "Traceback" not in captured.err and captured.out == ""
