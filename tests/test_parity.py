"""Parity: the Rust core and the pure-Python core, driven by the same random operations, agree.

The Python core is the executable specification. After every operation both ledgers must have
returned the same values (or raised the same error with the same message, or warned alike) and
must expose the same state.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
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
    "idle_lanes",
)
PROPERTIES = (
    "num_lanes",
    "episodes",
    "base_seed",
    "trial_index_base",
    "slots_claimed",
    "slots_remaining",
    "completed",
    "done",
    "wasted_steps",
    "ignored_completions",
)
U64_MAX = 2**64 - 1


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


def observable(ledger) -> dict:
    """Everything a caller can read off a ledger without changing it."""
    return normalize(
        {
            "snapshot": ledger.snapshot(),
            "properties": {name: getattr(ledger, name) for name in PROPERTIES},
            "repr": repr(ledger),
            "episode_ids": ledger.episode_ids(),
            "running": ledger.running_lanes(),
            "vacant": ledger.vacant_lanes(),
            "idle": ledger.idle_lanes(),
            "summaries": ledger.summaries(),
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
    lambda ledger: ledger.start_episodes([0], now_ns=0, overflow="drop"),
    lambda ledger: ledger.start_episodes([0], now_ns=0.5),
    lambda ledger: ledger.start_episodes([0], now_ns=2**63),
    lambda ledger: ledger.start_episodes([0], now_ns=-(2**63) - 1),
    lambda ledger: ledger.start_episodes([0], now_ns="0"),
    lambda ledger: ledger.start_episodes([[0]], now_ns=0),
    lambda ledger: ledger.start_episodes(0, now_ns=0),
    lambda ledger: ledger.start_episodes([0.0], now_ns=0),
    lambda ledger: ledger.start_episodes(np.array([True]), now_ns=0),
    lambda ledger: ledger.start_episodes(["0"], now_ns=0),
    lambda ledger: ledger.start_episodes(np.array([], dtype=np.float32), now_ns=0),
    lambda ledger: ledger.record_step([0], [True], [False], [False], [1], [1]),
    lambda ledger: ledger.record_step([0], [1.0], [0.5], [False], [1], [1]),
    lambda ledger: ledger.record_step([0], [1.0], [False], [None], [1], [1]),
    lambda ledger: ledger.record_step([0], [1.0], [False], [False], [1.5], [1]),
    lambda ledger: ledger.record_step([0], [1.0], [False], [False], [1], [[1]]),
    lambda ledger: ledger.record_step([], [], [], [], [], []),
    lambda ledger: ledger.complete_episodes([0], [0.0], now_ns=0),
    lambda ledger: ledger.complete_episodes([0], [0], [True, True], now_ns=0),
    lambda ledger: ledger.complete_episodes([], [], now_ns=0),
    lambda ledger: ledger.complete_episodes([0], [0], None, now_ns=1.5),
    lambda ledger: ledger.observe_rolls([0], [0.5], now_ns=0),
    lambda ledger: ledger.observe_rolls([0], [[1]], now_ns=0),
    lambda ledger: ledger.observe_rolls([0, 1], [1], now_ns=0),
    lambda ledger: ledger.observe_rolls([], [], now_ns=0),
    lambda ledger: ledger.mark_predicted(np.zeros((2, 1), dtype=np.int64)),
    lambda ledger: ledger.mark_predicted([]),
    lambda ledger: ledger.take_model_ends([0.5]),
    lambda ledger: ledger.take_model_ends(7),
    lambda ledger: ledger.episode_ids([1.0]),
    lambda ledger: ledger.seed_for_slot(-1),
    lambda ledger: ledger.seed_for_slot(2**64),
    lambda ledger: ledger.seed_for_slot(1.5),
    lambda ledger: ledger.seed_for_slot(2**64 - 1),
    lambda ledger: ledger.seed_for_slot(np.int64(3)),
]


class RustPythonLedgerParity(RuleBasedStateMachine):
    """Drives one ledger per core with identical calls and compares them after each one.

    Most rules make the calls a driver makes (so runs reach surplus, idle lanes, rolls and a
    spent budget); some deviate on purpose (stale and duplicate completions, wrong lanes,
    mismatched lengths, bad types), and both cores must then refuse or ignore alike.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cores = both_cores()
        self.ledgers: tuple[Any, Any] = ()
        self.clock = 0
        self.completed_pairs: list[tuple[int, int]] = []  # (lane, episode id) completed before

    # ------------------------------------------------------------------ plumbing

    def both(self, call) -> Any:
        """Run `call(ledger)` on both ledgers: same result, error and warnings, same state."""
        under_test, reference = (
            outcome(lambda ledger=ledger: call(ledger)) for ledger in self.ledgers
        )
        assert under_test == reference
        assert observable(self.ledgers[0]) == observable(self.ledgers[1])
        return reference[0]

    @property
    def spec(self):
        """The reference ledger, read to aim the next operation at interesting lanes."""
        return self.ledgers[1]

    def lanes_in(self, *states: str) -> list[int]:
        lanes = self.spec.snapshot()["lanes"]
        return [lane for lane, info in enumerate(lanes) if info["state"] in states]

    def held(self, lane: int) -> int:
        return self.spec.episode_ids([lane]).tolist()[0]

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

    def step_columns(self, data, count: int, *, end_one_in: int) -> list[Any]:
        ends = st.integers(0, end_one_in - 1).map(lambda draw: draw == 0)
        columns = [
            data.draw(st.lists(rewards, min_size=count, max_size=count)),
            data.draw(st.lists(ends, min_size=count, max_size=count)),
            data.draw(st.lists(ends, min_size=count, max_size=count)),
            data.draw(st.lists(timings, min_size=count, max_size=count)),
            data.draw(st.lists(timings, min_size=count, max_size=count)),
        ]
        if count and one_in(data, 12):
            columns[data.draw(st.sampled_from([3, 4]))][-1] = -1  # a negative timing
        if data.draw(st.booleans()):
            # The driver's form: typed numpy arrays.
            dtypes = [np.float64, np.bool_, np.bool_, np.int64, np.int64]
            columns = [
                np.array(column, dtype=dtype) for column, dtype in zip(columns, dtypes, strict=True)
            ]
        return columns

    def successes(self, data, count: int) -> Any:
        if one_in(data, 10):
            return data.draw(st.lists(outcomes, max_size=3))  # maybe the wrong length
        return data.draw(st.none() | st.lists(outcomes, min_size=count, max_size=count))

    # ------------------------------------------------------------------ setup

    @initialize(
        num_lanes=st.integers(1, 6),
        episodes=st.integers(1, 16),
        seeds=st.none() | st.lists(st.integers(0, U64_MAX), max_size=18),
        base_seed=st.none() | st.integers(0, U64_MAX),
        trial_index_base=st.none() | st.integers(0, 2**40),
        index_subset=st.none() | st.sets(st.integers(0, 15), min_size=1),
    )
    def create(self, num_lanes, episodes, seeds, base_seed, trial_index_base, index_subset):
        # A resumed run's ledger runs only some slots; keep the ones inside the budget.
        indices = None
        if index_subset is not None and any(index < episodes for index in index_subset):
            indices = sorted(index for index in index_subset if index < episodes)
        built = []
        for core in self.cores:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ledger = core.RouteLedger(
                    num_lanes,
                    episodes,
                    seeds=seeds,
                    base_seed=base_seed,
                    trial_index_base=trial_index_base,
                    indices=indices,
                )
            built.append((ledger, [(w.category, str(w.message)) for w in caught]))
        (under_test, under_test_warnings), (reference, reference_warnings) = built
        assert under_test_warnings == reference_warnings
        self.ledgers = (under_test, reference)
        assert observable(under_test) == observable(reference)

    # ------------------------------------------------------------------ the driver's calls

    @precondition(lambda self: self.ledgers and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def driver_round(self, data):
        """One round of the loop: predict, step, complete what ended, restart those lanes."""
        running = self.lanes_in("running")
        predicted = self.subset(data, running)
        self.both(lambda ledger: ledger.mark_predicted(as_lanes(predicted, "int64")))

        stepped = self.subset(data, running, min_size=1)
        # Short and longer episodes: per-step means only show over several steps.
        columns = self.step_columns(
            data, len(stepped), end_one_in=data.draw(st.sampled_from([3, 8]))
        )
        result = self.both(lambda ledger: ledger.record_step(np.array(stepped), *columns))
        ended = self.lanes_in("ended")
        if result[0] != "returned" or not ended or one_in(data, 4):
            return  # sometimes leave ended lanes for complete_ended / complete_anything

        ids = self.spec.episode_ids(ended)
        success = data.draw(st.lists(outcomes, min_size=len(ended), max_size=len(ended)))
        now_ns = self.tick(data)
        self.both(lambda ledger: ledger.complete_episodes(ended, ids, success, now_ns=now_ns))
        self.completed_pairs.extend(zip(ended, ids.tolist(), strict=True))
        self.both(lambda ledger: ledger.take_model_ends(ids))

        now_ns = self.tick(data)
        if data.draw(st.booleans()):
            # A lane vector the driver resets itself.
            exact = data.draw(st.booleans())
            overflow = data.draw(st.sampled_from(["idle", "surplus"]))
            self.both(
                lambda ledger: ledger.start_episodes(
                    ended, now_ns=now_ns, exact=exact, overflow=overflow
                )
            )
        else:
            # An autoresetting vector: the ended lanes' env-side episode ids move on.
            snapshot = self.spec.snapshot()["lanes"]
            env_ids = [(snapshot[lane]["env_episode_id"] or 0) + 1 for lane in ended]
            lanes = np.arange(self.spec.num_lanes)
            baseline = [info["env_episode_id"] or 0 for info in snapshot]
            self.both(lambda ledger: ledger.observe_rolls(lanes, baseline, now_ns=now_ns))
            self.both(lambda ledger: ledger.observe_rolls(ended, env_ids, now_ns=now_ns))

    @precondition(lambda self: self.ledgers and len(self.lanes_in("vacant", "idle")) > 0)
    @rule(data=st.data())
    def start_episodes(self, data):
        candidates = self.lanes_in("vacant", "idle")
        if data.draw(st.booleans()):
            lanes = data.draw(st.permutations(candidates))  # restart every lane, like a driver
        else:
            lanes = self.subset(data, candidates)
        lanes = self.maybe_intrude(data, lanes)
        form = data.draw(lane_forms)
        exact = data.draw(st.booleans())
        overflow = data.draw(st.sampled_from(["idle", "surplus"]))
        now_ns = self.tick(data)
        self.both(
            lambda ledger: ledger.start_episodes(
                as_lanes(lanes, form), now_ns=now_ns, exact=exact, overflow=overflow
            )
        )

    @precondition(lambda self: self.ledgers and len(self.lanes_in("running")) > 0)
    @rule(data=st.data())
    def record_step(self, data):
        lanes = self.maybe_intrude(data, self.subset(data, self.lanes_in("running")))
        columns = self.step_columns(data, len(lanes), end_one_in=4)
        if lanes and one_in(data, 10):
            short = data.draw(st.integers(0, 4))
            columns[short] = columns[short][:-1]  # a column that does not match the lanes
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        self.both(lambda ledger: ledger.record_step(lanes_arg, *columns))

    @precondition(lambda self: self.ledgers and len(self.lanes_in("ended")) > 0)
    @rule(data=st.data())
    def complete_ended(self, data):
        """Complete ended episodes, sometimes alongside a stale or repeated completion."""
        pairs = [(lane, self.held(lane)) for lane in self.subset(data, self.lanes_in("ended"))]
        others = [pair for pair in self.completed_pairs if pair[0] not in dict(pairs)]
        if others and data.draw(st.booleans()):
            repeated = data.draw(st.sampled_from(others))
            if self.held(repeated[0]) != repeated[1]:  # not the lane's current episode
                pairs.insert(data.draw(st.integers(0, len(pairs))), repeated)
        lanes = [lane for lane, _ in pairs]
        ids = [episode_id for _, episode_id in pairs]
        success = self.successes(data, len(pairs))
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        ids_arg = data.draw(st.sampled_from([ids, np.array(ids, dtype=np.int64)]))
        now_ns = self.tick(data)
        result = self.both(
            lambda ledger: ledger.complete_episodes(lanes_arg, ids_arg, success, now_ns=now_ns)
        )
        if result[0] == "returned":
            self.completed_pairs.extend(pairs)

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def complete_anything(self, data):
        """Completions aimed anywhere: running lanes (refused), stale ids, vacant lanes."""
        snapshot = self.spec.snapshot()
        lanes = self.maybe_intrude(data, self.subset(data, list(range(self.spec.num_lanes))))
        ids = []
        for lane in lanes:
            own = self.held(lane) if 0 <= lane < self.spec.num_lanes else -1
            other = data.draw(st.integers(-1, snapshot["next_episode_id"]))
            ids.append(own if data.draw(st.booleans()) else other)
        success = self.successes(data, len(lanes))
        now_ns = self.tick(data)
        self.both(lambda ledger: ledger.complete_episodes(lanes, ids, success, now_ns=now_ns))

    @precondition(lambda self: self.ledgers)
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
        self.both(lambda ledger: ledger.observe_rolls(lanes_arg, ids_arg, now_ns=now_ns))

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def mark_predicted(self, data):
        lanes = self.maybe_intrude(data, self.subset(data, self.lanes_in("running")))
        lanes_arg = as_lanes(lanes, data.draw(lane_forms))
        self.both(lambda ledger: ledger.mark_predicted(lanes_arg))

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def take_model_ends(self, data):
        if one_in(data, 6):
            # Teardown; the ledger may still be used afterwards and must stay consistent.
            self.both(lambda ledger: ledger.take_all_model_ends())
            return
        snapshot = self.spec.snapshot()
        known = snapshot["untold_model_ends"] + list(range(-1, snapshot["next_episode_id"] + 1))
        ids = data.draw(st.lists(st.sampled_from(known), max_size=6))
        ids_arg = data.draw(st.sampled_from([ids, np.array(ids, dtype=np.int64)]))
        self.both(lambda ledger: ledger.take_model_ends(ids_arg))

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def query(self, data):
        if data.draw(st.booleans()):
            slot = data.draw(st.integers(0, self.spec.episodes + 3))
            self.both(lambda ledger: ledger.seed_for_slot(slot))
        else:
            lanes = self.maybe_intrude(data, self.subset(data, list(range(self.spec.num_lanes))))
            lanes_arg = None if one_in(data, 4) else lanes
            self.both(lambda ledger: ledger.episode_ids(lanes_arg))

    @precondition(lambda self: self.ledgers)
    @rule(call=st.sampled_from(ODD_CALLS))
    def odd_call(self, call):
        self.both(call)


RustPythonLedgerParity.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestRustLedgerMatchesPython = RustPythonLedgerParity.TestCase


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
        ledger = core.RouteLedger(
            num_lanes,
            episodes,
            seeds=seeds,
            base_seed=base_seed,
            trial_index_base=trial_index_base,
            indices=indices,
        )
        # Slot seeds show which listed seeds were kept; slots past the budget must be refused.
        slot_seeds = [outcome(lambda slot=slot: ledger.seed_for_slot(slot)) for slot in range(8)]
        return observable(ledger), slot_seeds

    under_test, reference = (outcome(lambda core=core: build(core)) for core in both_cores())
    assert under_test == reference
