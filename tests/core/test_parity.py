"""Parity: the Rust core and the pure-Python core, driven by the same random operations, agree.

The Python core is the executable specification. Each core's ``RoundRunner`` (and the episode
ledger it owns) is driven with the same calls; after every one both must have returned the same
values (or raised the same error with the same message, or warned alike) and must expose the
same state.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from rlmesh.adapters import compile_spec
from rlmesh.core import load_core

CORE_UNDER_TEST = "rust"
REFERENCE_CORE = "python"

STARTS_FIELDS = (
    "lanes",
    "episode_ids",
    "indices",
    "seeds",
    "trials",
    "surplus_lanes",
    "surplus_episode_ids",
)
PROPERTIES = ("num_lanes", "rounds", "done", "wasted_steps")
U64_MAX = 2**64 - 1
# The smallest plan: what is compared is the bookkeeping, not the envs.
PLAN = compile_spec(None, gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2))
OBSERVATION = np.zeros(1, np.float32)


def runner_of(core, *args, **kwargs):
    return core.RoundRunner(args[0], args[1], PLAN.observation, PLAN.action, *args[2:], **kwargs)


def normalize(value: Any) -> Any:
    """A comparable, type-strict form: arrays keep their dtype, ints never pass for bools."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tolist())
    kind = type(value).__name__
    if kind == "EpisodeStarts":
        return (kind, {field: normalize(getattr(value, field)) for field in STARTS_FIELDS})
    if kind == "EpisodeSummary":
        return (kind, normalize(value.to_dict()))
    if isinstance(value, dict):
        return ("dict", {key: normalize(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return (kind, [normalize(item) for item in value])
    return (kind, value)


def outcome(call) -> tuple:
    """What `call()` did: its normalized result or its exception, and the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = ("returned", normalize(call()))
        except Exception as exc:
            result = ("raised", type(exc), str(exc))
    return result, [(w.category, str(w.message)) for w in caught]


def observable(runner) -> dict:
    """Everything a caller can read off a runner without changing it."""
    lanes = np.arange(runner.num_lanes)
    return normalize(
        {
            "snapshot": runner.snapshot(),
            "properties": {name: getattr(runner, name) for name in PROPERTIES},
            "repr": repr(runner),
            "episode_ids": runner.episode_ids(lanes),
            "lane_episodes": runner.lane_episodes(lanes),
            "running": runner.running_lanes(),
            "summaries": runner.summaries(),
        }
    )


def as_lanes(values: list[int], form: str) -> Any:
    """Lanes the way different drivers hand them over: a list or an integer array."""
    if form == "list":
        return list(values)
    if form == "uint64" and any(value < 0 for value in values):
        form = "int64"
    return np.array(values, dtype=form)


def both_cores() -> tuple[Any, Any]:
    """The core under test and the reference core, in that order."""
    return load_core(CORE_UNDER_TEST), load_core(REFERENCE_CORE)


lane_forms = st.sampled_from(["int64", "int64", "list", "int32", "uint64"])
timings = st.integers(min_value=0, max_value=10**9)
rewards = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False),
    st.integers(min_value=-5, max_value=5).map(float),
)
outcomes = st.sampled_from([True, False, None])


def one_in(data, n: int) -> bool:
    """True about once in `n` draws: for rare deviations from the driver's usual calls."""
    return data.draw(st.integers(0, n - 1)) == 0


# Calls no driver should make: each core must refuse (or accept) them alike.
ODD_CALLS = [
    lambda runner: runner.start([0], now_ns=0.5),
    lambda runner: runner.start([0], now_ns=2**63),
    lambda runner: runner.start([0], now_ns=-(2**63) - 1),
    lambda runner: runner.start([0], now_ns="0"),
    lambda runner: runner.start([[0]], now_ns=0),
    lambda runner: runner.start(0, now_ns=0),
    lambda runner: runner.start([0.0], now_ns=0),
    lambda runner: runner.start(np.array([True]), now_ns=0),
    lambda runner: runner.start(["0"], now_ns=0),
    lambda runner: runner.start(np.array([], dtype=np.float32), now_ns=0),
    lambda runner: runner.finish([0], [None, None]),
    lambda runner: runner.finish([], []),
    lambda runner: runner.finish([0.5], [None]),
    lambda runner: runner.finish([0], 7),
    lambda runner: runner.observe_rolls([0], [0.5], now_ns=0),
    lambda runner: runner.observe_rolls([0], [[1]], now_ns=0),
    lambda runner: runner.observe_rolls([0, 1], [1], now_ns=0),
    lambda runner: runner.observe_rolls([], [], now_ns=0),
    lambda runner: runner.observe_rolls([0], [0], now_ns=1.5),
    lambda runner: runner.episode_ids([1.0]),
    lambda runner: runner.episode_ids(np.zeros((2, 1), dtype=np.int64)),
    lambda runner: runner.lane_episodes([-1]),
    lambda runner: runner.observations([0, 0]),
]


class RustPythonRunnerParity(RuleBasedStateMachine):
    """Drives one runner per core with identical calls and compares them after each one.

    Most rules make the calls a driver makes (so runs reach surplus, idle lanes, rolls and a
    spent budget); some deviate on purpose (finishing running, vacant or repeated lanes, wrong
    lanes, mismatched lengths, bad types, bad step results), and both cores must then refuse or
    ignore alike.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cores = both_cores()
        self.runners: tuple[Any, Any] = ()
        self.clock = 0

    # ------------------------------------------------------------------ plumbing

    def both(self, call) -> Any:
        """Run `call(runner)` on both runners: same result, error and warnings, same state."""
        under_test, reference = (
            outcome(lambda runner=runner: call(runner)) for runner in self.runners
        )
        assert under_test == reference
        assert observable(self.runners[0]) == observable(self.runners[1])
        return reference[0]

    @property
    def spec(self):
        """The reference runner, read to aim the next operation at interesting lanes."""
        return self.runners[1]

    def lanes_in(self, *states: str) -> list[int]:
        lanes = self.spec.snapshot()["lanes"]
        return [lane for lane, info in enumerate(lanes) if info["state"] in states]

    def subset(self, data, candidates: list[int], *, min_size: int = 0) -> list[int]:
        """A random subset of `candidates` in random order."""
        if not candidates:
            return []
        return data.draw(st.lists(st.sampled_from(candidates), unique=True, min_size=min_size))

    def maybe_intrude(self, data, lanes: list[int]) -> list[int]:
        """Now and then add a lane out of range, twice, or in the wrong state."""
        if one_in(data, 8):
            intruder = data.draw(st.integers(-1, self.spec.num_lanes))
            lanes = [*lanes]
            lanes.insert(data.draw(st.integers(0, len(lanes))), intruder)
        return lanes

    def tick(self, data) -> Any:
        self.clock += data.draw(st.integers(min_value=0, max_value=10**10))
        return data.draw(st.sampled_from([self.clock, np.int64(self.clock)]))

    def observe_first(self, result) -> None:
        """After a start or a roll that returned, the restarted lanes' first observations."""
        if result[0] != "returned":
            return
        starts = result[1][1]
        lanes = starts["lanes"][3] + starts["surplus_lanes"][3]
        self.both(lambda runner: runner.set_observations(lanes, [OBSERVATION] * len(lanes)))

    def successes(self, data, count: int) -> Any:
        if one_in(data, 10):
            return data.draw(st.lists(outcomes, max_size=3))  # maybe the wrong length
        return data.draw(st.lists(outcomes, min_size=count, max_size=count))

    # ------------------------------------------------------------------ setup

    @initialize(
        num_lanes=st.integers(1, 6),
        episodes=st.integers(1, 16),
        seeds=st.none() | st.lists(st.integers(0, U64_MAX), max_size=18),
        base_seed=st.none() | st.integers(0, U64_MAX),
        trial_index_base=st.none() | st.integers(0, 2**40),
        index_subset=st.none() | st.sets(st.integers(0, 15), min_size=1),
        overflow=st.sampled_from(["idle", "surplus"]),
    )
    def create(
        self, num_lanes, episodes, seeds, base_seed, trial_index_base, index_subset, overflow
    ):
        # A resumed run plays only some slots; keep the ones inside the budget.
        indices = None
        if index_subset is not None and any(index < episodes for index in index_subset):
            indices = sorted(index for index in index_subset if index < episodes)
        built = []
        for core in self.cores:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                runner = runner_of(
                    core,
                    num_lanes,
                    episodes,
                    seeds=seeds,
                    base_seed=base_seed,
                    trial_index_base=trial_index_base,
                    indices=indices,
                    overflow=overflow,
                )
            built.append((runner, [(w.category, str(w.message)) for w in caught]))
        (under_test, under_test_warnings), (reference, reference_warnings) = built
        assert under_test_warnings == reference_warnings
        self.runners = (under_test, reference)
        assert observable(under_test) == observable(reference)

    # ------------------------------------------------------------------ the driver's calls

    @precondition(lambda self: self.runners and len(self.lanes_in("vacant", "idle")) > 0)
    @rule(data=st.data())
    def start(self, data):
        candidates = self.lanes_in("vacant", "idle")
        if data.draw(st.booleans()):
            lanes = data.draw(st.permutations(candidates))  # restart every lane, like a driver
        else:
            lanes = self.subset(data, candidates)
        lanes = self.maybe_intrude(data, lanes)
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        now_ns = self.tick(data)
        self.observe_first(self.both(lambda runner: runner.start(lanes_arg, now_ns=now_ns)))

    @precondition(lambda self: self.runners and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def driver_round(self, data):
        """One round of the driver's loop: predict, step, finish what ended, restart it."""
        opened = self.both(lambda runner: runner.begin_round())
        running, predict_lanes = (len(opened[1][1][k][3]) for k in (0, 1))
        predict_ns = data.draw(timings)
        self.both(lambda runner: runner.take_actions(np.zeros(predict_lanes, np.int64), predict_ns))
        # Short and longer episodes: per-step means only show over several steps.
        ends = st.integers(0, data.draw(st.sampled_from([3, 8])) - 1).map(lambda draw: draw == 0)
        rewards_column = np.array(data.draw(st.lists(rewards, min_size=running, max_size=running)))
        terminated, truncated = (
            np.array(data.draw(st.lists(ends, min_size=running, max_size=running)), dtype=np.bool_)
            for _ in range(2)
        )
        step_ns, now_ns = data.draw(timings), self.tick(data)
        result = self.both(
            lambda runner: runner.end_round(rewards_column, terminated, truncated, step_ns, now_ns)
        )
        ended = result[1][1][0][3]
        if not ended or one_in(data, 4):
            return  # sometimes leave ended lanes for the finish rule
        successes = data.draw(st.lists(outcomes, min_size=len(ended), max_size=len(ended)))
        self.both(lambda runner: runner.finish(ended, successes))
        now_ns = self.tick(data)
        if data.draw(st.booleans()):
            # Lanes the driver resets itself.
            self.observe_first(self.both(lambda runner: runner.start(ended, now_ns=now_ns)))
        else:
            # An autoresetting vector: the ended lanes' env-side episode ids move on.
            snapshot = self.spec.snapshot()["lanes"]
            lanes = np.arange(self.spec.num_lanes)
            baseline = [info["env_episode_id"] or 0 for info in snapshot]
            env_ids = [baseline[lane] + 1 for lane in ended]
            self.both(lambda runner: runner.observe_rolls(lanes, baseline, now_ns=now_ns))
            self.observe_first(
                self.both(lambda runner: runner.observe_rolls(ended, env_ids, now_ns=now_ns))
            )

    @precondition(lambda self: self.runners and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def round(self, data):
        """One round: open it, the model's output (or none), the env's step results."""
        opened = self.both(lambda runner: runner.begin_round())
        running, predict_lanes = (len(opened[1][1][k][3]) for k in (0, 1))
        if data.draw(st.integers(0, 7)) > 0:  # now and then no model call at all
            output = np.zeros(predict_lanes, dtype=np.int64)
            if predict_lanes and one_in(data, 12):
                output[-1] = 5  # outside Discrete(2): refused, naming the lane
            predict_ns = data.draw(timings | st.just(-1)) if one_in(data, 6) else 0
            self.both(lambda runner: runner.take_actions(output, predict_ns))
        count = running + (1 if one_in(data, 12) else 0)  # sometimes a result too many
        ends = st.integers(0, data.draw(st.sampled_from([3, 8])) - 1).map(lambda draw: draw == 0)
        columns = [
            data.draw(st.lists(rewards, min_size=count, max_size=count)),
            data.draw(st.lists(ends, min_size=count, max_size=count)),
            data.draw(st.lists(ends, min_size=count, max_size=count)),
        ]
        if data.draw(st.booleans()):
            # The driver's form: typed numpy arrays.
            dtypes = [np.float64, np.bool_, np.bool_]
            columns = [
                np.array(column, dtype=dtype) for column, dtype in zip(columns, dtypes, strict=True)
            ]
        step_ns = -1 if one_in(data, 12) else data.draw(timings)
        now_ns = self.tick(data)
        self.both(lambda runner: runner.end_round(*columns, step_ns, now_ns))

    @precondition(lambda self: self.runners and len(self.lanes_in("ended")) > 0)
    @rule(data=st.data())
    def finish(self, data):
        """Finish ended episodes, sometimes alongside a running, vacant or idle lane."""
        lanes = self.subset(data, self.lanes_in("ended"), min_size=1)
        if one_in(data, 4):
            others = self.lanes_in("running", "vacant", "idle")
            lanes = [*lanes, *self.subset(data, others)]
        lanes = self.maybe_intrude(data, lanes)
        successes = self.successes(data, len(lanes))
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        self.both(lambda runner: runner.finish(lanes_arg, successes))

    @precondition(lambda self: self.runners)
    @rule(data=st.data())
    def observe_rolls(self, data):
        snapshot = self.spec.snapshot()["lanes"]
        lanes = self.maybe_intrude(data, self.subset(data, list(range(self.spec.num_lanes))))
        env_ids = []
        for lane in lanes:
            known = snapshot[lane] if 0 <= lane < self.spec.num_lanes else None
            previous = None if known is None else known["env_episode_id"]
            holds_episode = known is not None and known["state"] in ("running", "ended")
            # Lanes without an episode roll often; lanes holding one rarely (which is refused).
            rolls = one_in(data, 12 if holds_episode else 2)
            if previous is None:
                env_ids.append(data.draw(st.integers(0, 3)))
            else:
                env_ids.append(previous + 1 if rolls else previous)
        if lanes and one_in(data, 10):
            env_ids.pop()  # lengths that do not match
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        ids_arg = data.draw(st.sampled_from([list(env_ids), np.array(env_ids, dtype=np.int64)]))
        now_ns = self.tick(data)
        self.observe_first(
            self.both(lambda runner: runner.observe_rolls(lanes_arg, ids_arg, now_ns=now_ns))
        )

    @precondition(lambda self: self.runners)
    @rule(data=st.data())
    def take_all_model_ends(self, data):
        # Teardown; the runner may still be used afterwards and must stay consistent.
        if one_in(data, 4):
            self.both(lambda runner: runner.take_all_model_ends())

    @precondition(lambda self: self.runners)
    @rule(data=st.data())
    def query(self, data):
        lanes = self.maybe_intrude(data, self.subset(data, list(range(self.spec.num_lanes))))
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        self.both(lambda runner: runner.episode_ids(lanes_arg))
        self.both(lambda runner: runner.lane_episodes(lanes_arg))

    @precondition(lambda self: self.runners)
    @rule(call=st.sampled_from(ODD_CALLS))
    def odd_call(self, call):
        self.both(call)


RustPythonRunnerParity.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestRustRunnerMatchesPython = RustPythonRunnerParity.TestCase


# ---------------------------------------------------------------------------- construction

counts = st.one_of(
    st.integers(-2, 8),
    st.sampled_from([True, 2.0, "3", None, np.int64(3), np.uint8(2), 2**64, -(2**64)]),
)
budgets = st.one_of(st.integers(-2, 20), st.sampled_from([2**63, 2**63 + 1, 2**64, 1.0, None]))
u64_like = st.one_of(
    st.integers(0, U64_MAX),
    st.sampled_from([-1, 2**64, 0.5, "1", np.uint64(U64_MAX), np.int64(-1)]),
)
seed_lists = st.one_of(
    st.none(),
    st.lists(u64_like, max_size=6),
    st.lists(st.integers(0, U64_MAX), max_size=6).map(lambda s: np.array(s, dtype=np.uint64)),
)


@settings(max_examples=300, deadline=None)
@given(
    num_lanes=counts,
    episodes=budgets,
    seeds=seed_lists,
    base_seed=st.none() | u64_like,
    trial_index_base=st.none() | u64_like | st.sampled_from([2**63 - 1, 2**63 - 20, 2**63]),
    indices=st.none() | st.lists(st.integers(-2, 20), max_size=5) | st.just(7),
)
def test_rust_constructor_matches_python(
    num_lanes, episodes, seeds, base_seed, trial_index_base, indices
):
    def build(core):
        runner = runner_of(
            core,
            num_lanes,
            episodes,
            seeds=seeds,
            base_seed=base_seed,
            trial_index_base=trial_index_base,
            indices=indices,
        )
        # The first slots' seeds show which listed seeds were kept.
        starts = runner.start(np.arange(runner.num_lanes), now_ns=0)
        return observable(runner), normalize(starts)

    under_test, reference = (outcome(lambda core=core: build(core)) for core in both_cores())
    assert under_test == reference
