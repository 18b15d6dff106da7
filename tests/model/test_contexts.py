"""PredictContext: the per-episode context a corner that declares ``context`` receives."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import rlmesh
from helpers import AUTORESET_MODES, CORES, AwaitEveryStep, cartpole_policy, comparable
from rlmesh.contexts import EpisodeContexts, accepts_context


def test_each_episode_has_its_own_counter_seed_and_state():
    contexts = EpisodeContexts()
    contexts.start([3, 4], seeds=[11, None])
    first = contexts.advance([3, 4])
    assert [c["episode_id"] for c in first] == [3, 4]
    assert [c["predict_index"] for c in first] == [0, 0]
    assert first[0]["predict_seed"] == rlmesh.episode_seed(11, 0)
    assert first[1]["episode_seed"] is None and first[1]["predict_seed"] is None
    first[0]["state"]["memory"] = [1]
    (again,) = contexts.advance([3])
    assert again["predict_index"] == 1
    assert again["predict_seed"] == rlmesh.episode_seed(11, 1)
    assert again["state"] is first[0]["state"]
    (other,) = contexts.advance([4])
    assert other["predict_index"] == 1 and other["state"] == {}
    contexts.end([3])
    assert len(contexts) == 1
    with pytest.raises(KeyError, match="episode 3 has no context"):
        contexts.advance([3])


def test_outside_an_episode_every_context_is_anonymous_and_fresh():
    anonymous = EpisodeContexts().advance(None, count=2)
    assert [c["episode_id"] for c in anonymous] == [None, None]
    assert [c["predict_index"] for c in anonymous] == [0, 0]
    assert anonymous[0]["state"] is not anonymous[1]["state"]


def test_a_corner_takes_a_context_only_when_it_names_a_parameter_so():
    def positional(obs, context):
        return 0

    def keyword_only(obs, *, context=None):
        return 0

    def chunk(obs, execution_horizon, context):
        return 0

    def other_name(obs, ctx):
        return 0

    assert accepts_context(positional) and accepts_context(keyword_only) and accepts_context(chunk)
    assert not accepts_context(other_name)
    assert not accepts_context(abs)  # a builtin
    assert not accepts_context(lambda obs, **kwargs: 0)


# ---------------------------------------------------------------------------------------------
# Through rlmesh.run


class Remembers(rlmesh.Model):
    """Keeps each episode's last pole angle in its context and pushes the way the pole moves.
    Without a context this would be a stateful model; with one, its output depends
    only on the episode's own observations. Records every context it was given and every
    episode end."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []
        self.ended: list[int] = []

    def predict(self, obs, context):
        state = context["state"]
        self.seen.append(
            (
                context["episode_id"],
                context["episode_seed"],
                context["predict_index"],
                context["predict_seed"],
                state.get("predictions", 0),
            )
        )
        state["predictions"] = state.get("predictions", 0) + 1
        # Push the way the pole is moving: its angle against the episode's previous angle.
        action = int(obs[2] - state.get("last_angle", 0.0) > 0)
        state["last_angle"] = obs[2]
        return action

    def on_episode_end(self, episode_id):
        self.ended.append(episode_id)


@pytest.mark.parametrize("core", CORES)
def test_a_context_aware_model_runs_the_same_episodes_on_any_lane_count(core):
    runs = {}
    for num_envs in (1, 3, 8):
        for awaited in (False, True):
            model = Remembers()
            result = rlmesh.run(
                model,
                "CartPole-v1",
                episodes=6,
                num_envs=num_envs,
                max_episode_steps=60,
                hooks=AwaitEveryStep() if awaited else None,
                core=core,
            )
            runs[num_envs, awaited] = (comparable(result), model)
    reference, _ = runs[1, False]
    for key, (episodes, _) in runs.items():
        assert episodes == reference, key
    # What each episode's predictions were told, on 3 lanes: ids, seeds and counters.
    episodes, model = runs[3, False]
    real = [seen for seen in model.seen if seen[0] is not None]  # past the probe's calls
    by_episode: dict[int, list[tuple]] = {}
    for seen in real:
        by_episode.setdefault(seen[0], []).append(seen)
    assert sorted(by_episode) == sorted(model.ended)  # on_episode_end got the same ids
    seeds = sorted(e["seed"] for e in episodes)
    assert sorted(calls[0][1] for calls in by_episode.values()) == seeds
    for calls in by_episode.values():
        seed = calls[0][1]
        assert [c[2] for c in calls] == list(range(len(calls)))  # predict_index
        assert [c[3] for c in calls] == [rlmesh.episode_seed(seed, i) for i in range(len(calls))]
        assert [c[4] for c in calls] == list(range(len(calls)))  # state carried, from empty
    assert sorted(len(calls) for calls in by_episode.values()) == sorted(
        e["steps"] for e in episodes
    )


class ForgetsContext(rlmesh.Model):
    """The same decisions, but the last angle is kept on the model: one state for all lanes."""

    def __init__(self):
        super().__init__()
        self.last_angle = 0.0

    def predict(self, obs):
        action = int(obs[2] - self.last_angle > 0)
        self.last_angle = obs[2]
        return action


def test_the_probe_accepts_state_kept_in_the_context_and_refuses_it_on_the_model():
    assert rlmesh.run(Remembers(), "CartPole-v1", episodes=3, num_envs=2).num_episodes == 3
    with pytest.raises(rlmesh.StatefulModelError):
        rlmesh.run(ForgetsContext(), "CartPole-v1", episodes=3, num_envs=2)


class BatchedWithContext(rlmesh.Model):
    def __init__(self):
        super().__init__()
        self.batches: list[list] = []

    def predict_batch(self, obs, context):
        assert isinstance(context, list) and len(context) == len(obs)
        self.batches.append([c["episode_id"] for c in context])
        return (obs[:, 2] > 0).astype(np.int64)


class ChunkWithContext(rlmesh.Model):
    def __init__(self):
        super().__init__()
        self.indices: dict[int, list[int]] = {}

    def predict_chunk(self, obs, execution_horizon, context):
        if context["episode_id"] is not None:
            self.indices.setdefault(context["episode_id"], []).append(context["predict_index"])
        return np.full(execution_horizon, int(obs[2] > 0))


@pytest.mark.parametrize("core", CORES)
def test_batched_corners_get_a_context_per_row_and_chunks_count_predictions(core):
    model = BatchedWithContext()
    rlmesh.run(model, "CartPole-v1", episodes=4, num_envs=2, core=core)
    rows = [ids for ids in model.batches if None not in ids]
    assert rows and all(len(set(ids)) == len(ids) for ids in rows)  # one episode per row
    chunky = ChunkWithContext()
    result = rlmesh.run(
        chunky, "CartPole-v1", episodes=3, num_envs=2, execution_horizon=4, core=core
    )
    assert len(chunky.indices) == 3
    steps = sorted(e.steps for e in result.episodes)
    counts = sorted(len(indices) for indices in chunky.indices.values())
    assert counts == [-(-s // 4) for s in steps]  # one prediction per chunk of 4
    assert all(ix == list(range(len(ix))) for ix in chunky.indices.values())


class EndWithoutId(rlmesh.Model):
    def __init__(self):
        super().__init__()
        self.ends = 0

    def predict(self, obs):
        return cartpole_policy(obs)

    def on_episode_end(self):
        self.ends += 1


@pytest.mark.parametrize("core", CORES)
def test_on_episode_end_may_take_no_episode_id(core):
    model = EndWithoutId()
    rlmesh.run(model, "CartPole-v1", episodes=3, num_envs=2, core=core)
    assert model.ends == 3


def test_a_plain_function_may_take_a_context():
    seen = []

    def policy(obs, context):
        seen.append(context["predict_index"])
        return cartpole_policy(obs)

    result = rlmesh.run(policy, gym.make("CartPole-v1"), episodes=1)
    assert seen == list(range(result.total_steps))


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("mode", AUTORESET_MODES)
def test_a_lockstep_vector_gives_every_episode_its_context_surplus_included(core, mode):
    vector = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=50) for _ in range(3)],
        autoreset_mode=mode,
    )
    model = Remembers()
    result = rlmesh.run(model, vector, episodes=7, core=core, close_env=True)
    assert result.num_episodes == 7 and result.wasted_steps > 0
    seen = {episode_id for episode_id, *_ in model.seen if episode_id is not None}
    # Surplus episodes are predicted for too, each with its own context, and ended like any.
    assert len(seen) > 7 and seen == set(model.ended)
