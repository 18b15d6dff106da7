"""What the robot-simulator benchmarks (``test_bench_libero.py``, ``test_bench_robot_sims.py``)
share: seeded "random" policies, an env wrapper that ends episodes at different steps, the
hand-written loops rlmesh is measured against, and lanes kept alive across runs.

- ``ProjectionPolicy``: a seeded random projection of a benchmark's low-dimensional state to an
  action, squashed through ``sin`` of a large gain, so the actions look random from step to
  step yet are a pure function of the observation: every side of a comparison, given the same
  episode, takes the same actions (no draw order to keep in step). ``PolicyModel`` is it as an
  ``rlmesh.Model`` (a per-lane corner for one lane, a batched one for several).
- ``SeededLength``: a wrapper that ends each episode (``terminated``) after a number of steps
  drawn from its reset seed, so the lanes of a batch end at different steps, as real episodes
  do when a policy succeeds at different times.
- ``raw_episodes``: the plain loop over one env: reset with the episode's seed (and trial
  index), step with the policy until the episode ends or the cap.
- ``vector_batches``: how LeRobot evaluates: an ``AsyncVectorEnv`` of N lanes, reset with a
  batch of N seeds, stepped until every episode of the batch has ended (lanes already done keep
  stepping: their surplus steps are counted), then the next batch.
- ``RawProcesses``: processes that each build their own env once and then, when told, run
  their share of the episodes in the raw loop: the machine's ceiling for a workload, with no
  driver, pipe traffic or lockstep between them.
- ``KeptProcessLanes`` / ``KeptInProcessLanes``: rlmesh's own lanes whose ``close`` does
  nothing until ``shutdown``, so repeated ``rlmesh.run`` calls reuse their built envs and a
  measurement times the evaluation, not the simulator's build.

Example:
    >>> policy = ProjectionPolicy(3, 2, low=[-1, -1], high=[1, 1], seed=0)
    >>> actions = policy(np.zeros((4, 3)) + np.arange(4)[:, None])
    >>> actions.shape, actions.dtype, bool(np.all(np.abs(actions) <= 1))
    ((4, 2), dtype('float32'), True)
    >>> bool(np.array_equal(policy(np.ones((1, 3)))[0], policy(np.ones((5, 3)))[2]))
    True
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import rlmesh
from ratios import format_ratio
from rlmesh.lanes import InProcessLanes, ProcessLanes
from rlmesh.lanes.base import TRIAL_INDEX_FLAG, TRIAL_INDEX_OPTION

GAIN = 1000.0  # sin(GAIN * x): a change of a millimetre in the state turns the action around
ANSWER_TIMEOUT_S = 1800.0  # the longest a raw process may take for its share of one sample


class ProjectionPolicy:
    """``[K, inputs]`` states to ``[K, outputs]`` float32 actions in ``[low, high]``.

    Each action is ``low + (high - low) * (1 + sin(GAIN * state . w)) / 2`` with ``w`` drawn
    from ``seed``. The dot product is an elementwise product and a sum over the last axis,
    which numpy reduces in the same order for every row whatever ``K``: a lane gets bit for
    bit the same action alone or in a batch.
    """

    def __init__(
        self,
        inputs: int,
        outputs: int,
        *,
        low: Sequence[float],
        high: Sequence[float],
        seed: int,
    ) -> None:
        self.weights = np.random.default_rng(seed).normal(size=(inputs, outputs))
        self.low = np.asarray(low, dtype=np.float64)
        self.span = np.asarray(high, dtype=np.float64) - self.low

    def __call__(self, states: np.ndarray) -> np.ndarray:
        states = np.asarray(states, dtype=np.float64)
        projected = (states[:, :, None] * self.weights[None]).sum(axis=1)
        unit = (1.0 + np.sin(GAIN * projected)) / 2.0
        return (self.low + self.span * unit).astype(np.float32)


@dataclass(frozen=True)
class Controller:
    """A benchmark's policy: which observation leaves make its state, and the projection.

    ``keys`` None: the observation is the state itself (a Box); else the named leaves of a
    Dict observation, concatenated in that order.
    """

    keys: tuple[str, ...] | None
    policy: ProjectionPolicy

    def states(self, obs: Any) -> np.ndarray:
        """A batched observation (leading lane axis) as ``[K, inputs]`` states."""
        if self.keys is None:
            return np.asarray(obs, dtype=np.float64)
        return np.concatenate([np.asarray(obs[key], dtype=np.float64) for key in self.keys], 1)

    def batch(self, obs: Any) -> np.ndarray:
        return self.policy(self.states(obs))

    def one(self, obs: Any) -> np.ndarray:
        """One lane's observation (no lane axis) to its action."""
        if self.keys is None:
            state = np.asarray(obs, dtype=np.float64)[None]
        else:
            state = np.concatenate([np.asarray(obs[key], dtype=np.float64) for key in self.keys])
            state = state[None]
        return self.policy(state)[0]


class PolicyModel(rlmesh.Model):
    """A ``Controller`` as a model: ``predict`` on one lane, ``predict_batch`` on several."""

    stateless = True

    def __init__(self, controller: Controller) -> None:
        super().__init__()
        self.controller = controller

    def predict(self, obs):
        return self.controller.one(obs)

    def predict_batch(self, obs):
        return self.controller.batch(obs)


class SeededLength(gym.Wrapper):
    """Ends each episode reset with a seed of at least ``from_seed`` (``terminated``) after
    ``shortest`` to ``longest`` steps, drawn from that seed: the same episode lasts as long on
    every side of a comparison. Episodes with smaller seeds (or none) are left as they are, so
    one built env serves runs of both kinds."""

    def __init__(self, env: gym.Env, shortest: int, longest: int, from_seed: int) -> None:
        super().__init__(env)
        self.shortest, self.longest, self.from_seed = shortest, longest, from_seed
        self.length: int | None = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        drawn = seed is not None and seed >= self.from_seed
        self.length = length_of(seed, self.shortest, self.longest) if drawn else None
        self.steps = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        ends = self.length is not None and self.steps >= self.length
        return obs, reward, terminated or ends, truncated, info


def length_of(seed: int, shortest: int, longest: int) -> int:
    """The length ``SeededLength`` gives the episode reset with ``seed``."""
    return int(np.random.default_rng([seed, 104729]).integers(shortest, longest + 1))


def seeded_length(
    factory: Callable[[], gym.Env], shortest: int, longest: int, from_seed: int
) -> gym.Env:
    """``factory()`` wrapped in ``SeededLength`` (a picklable factory with functools.partial)."""
    return SeededLength(factory(), shortest, longest, from_seed)


def reset_options(env: gym.Env, trial: int) -> dict[str, Any] | None:
    """The trial-index option rlmesh gives an env that declares it, as rlmesh gives it."""
    if (getattr(env, "metadata", None) or {}).get(TRIAL_INDEX_FLAG) is True:
        return {TRIAL_INDEX_OPTION: trial}
    return None


def raw_episodes(
    env: gym.Env,
    act: Callable[[Any], Any],
    seeds: Sequence[int],
    trials: Sequence[int],
    cap: int,
    timing: dict[str, float] | None = None,
) -> list[int]:
    """The plain loop: each episode reset with its seed (and trial index, if the env takes
    one), stepped with ``act(obs)`` until it ends or reaches ``cap`` steps. Its lengths; with
    ``timing``, the seconds spent in resets and in steps are added to its ``"reset"`` and
    ``"step"``."""
    lengths = []
    reset_s = step_s = 0.0
    for seed, trial in zip(seeds, trials, strict=True):
        started = time.perf_counter()
        obs, _ = env.reset(seed=seed, options=reset_options(env, trial))
        stepped = time.perf_counter()
        reset_s += stepped - started
        steps = 0
        while steps < cap:
            obs, _, terminated, truncated, _ = env.step(act(obs))
            steps += 1
            if terminated or truncated:
                break
        step_s += time.perf_counter() - stepped
        lengths.append(steps)
    if timing is not None:
        timing["reset"] = timing.get("reset", 0.0) + reset_s
        timing["step"] = timing.get("step", 0.0) + step_s
    return lengths


@dataclass
class Sample:
    """One timed side of a comparison: its scored lane-steps and their rate."""

    scored_steps: int
    rate: float  # scored lane-steps per second
    lane_steps: int = 0  # every lane-step taken, surplus included (vector loops)
    lengths: tuple[int, ...] = ()  # each scored episode's steps, by episode index
    parts: tuple[float, ...] = ()  # the rate of each process, where rates are summed
    detail: dict[str, Any] = field(default_factory=dict)  # where the time went, if known

    @property
    def surplus_steps(self) -> int:
        return max(self.lane_steps - self.scored_steps, 0)


def vector_batches(
    vector: gym.vector.VectorEnv,
    act: Callable[[Any], Any],
    seeds: Sequence[int],
    cap: int,
) -> Sample:
    """LeRobot's evaluation loop over ``vector``: episodes in batches of ``num_envs``, each
    batch reset with its seeds and stepped until every lane's episode has ended or ``cap``
    steps passed; lanes already done keep stepping (with Gymnasium's default autoreset, their
    next step restarts them unseeded) and those surplus steps score nothing.

    ``len(seeds)`` must be a multiple of the lanes (LeRobot runs the last batch whole too).
    """
    lanes = vector.num_envs
    if len(seeds) % lanes:
        raise ValueError(
            f"vector_batches: {len(seeds)} seeds for {lanes} lanes; expected a multiple of {lanes}"
        )
    lengths: list[int] = []
    lane_steps = 0
    started = time.perf_counter()
    for first in range(0, len(seeds), lanes):
        obs, _ = vector.reset(seed=list(seeds[first : first + lanes]))
        done = np.zeros(lanes, dtype=bool)
        batch_lengths = np.zeros(lanes, dtype=np.int64)
        for _ in range(cap):
            obs, _, terminated, truncated, _ = vector.step(act(obs))
            lane_steps += lanes
            batch_lengths[~done] += 1
            done |= terminated | truncated
            if done.all():
                break
        lengths += batch_lengths.tolist()
    seconds = time.perf_counter() - started
    scored = sum(lengths)
    return Sample(scored, scored / seconds, lane_steps, tuple(lengths))


# ---------------------------------------------------------------------------------- raw processes


def _raw_process(conn, factory: Callable[[], gym.Env], controller: Controller, warm: int) -> None:
    """A ceiling process: build the env, reset it once with seed ``warm`` (the build of a lazy
    simulator), say so; then run each ``(seeds, trials, cap)`` asked in the raw loop and answer
    ``(lengths, seconds, {"reset": s, "step": s})``, until told None."""
    env = factory()
    try:
        env.reset(seed=warm, options=reset_options(env, warm))
        conn.send("ready")
        while (asked := conn.recv()) is not None:
            seeds, trials, cap = asked
            timing: dict[str, float] = {}
            started = time.perf_counter()
            lengths = raw_episodes(env, controller.one, seeds, trials, cap, timing)
            conn.send((lengths, time.perf_counter() - started, timing))
    finally:
        env.close()


class RawProcesses:
    """``count`` processes, each with its own env from ``factory``, built once; ``run`` splits
    episodes between them (process p takes every ``count``-th one from p), starts them
    together and sums their lane-steps/s: what the machine gives this work in ``count``
    processes that never wait on each other.

    Use as a context manager; the processes are told to stop, then joined (killed after 30 s).
    """

    def __init__(self, factory: Callable[[], gym.Env], controller: Controller, count: int = 2):
        self.factory, self.controller, self.count = factory, controller, count
        self._stack = contextlib.ExitStack()
        self.pipes: list[Any] = []

    def __enter__(self) -> RawProcesses:
        context = multiprocessing.get_context("forkserver")
        children = []

        def stop() -> None:
            for pipe in self.pipes:
                with contextlib.suppress(OSError):
                    pipe.send(None)
                pipe.close()
            for child in children:
                child.join(30)
                if child.is_alive():
                    child.kill()
                    child.join()

        self._stack.callback(stop)
        try:
            for p in range(self.count):
                ours, theirs = context.Pipe()
                args = (theirs, self.factory, self.controller, 10_000 + p)
                child = context.Process(target=_raw_process, args=args, daemon=True)
                child.start()
                theirs.close()
                self.pipes.append(ours)
                children.append(child)
            for pipe in self.pipes:
                if _answer(pipe) != "ready":
                    raise RuntimeError("a raw process did not build its env")
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def run(self, seeds: Sequence[int], trials: Sequence[int], cap: int) -> Sample:
        """The episodes of ``seeds`` (with ``trials``), shared out and run at once: the summed
        rate of the processes, each its lane-steps over its own time."""
        for p, pipe in enumerate(self.pipes):
            pipe.send((list(seeds[p :: self.count]), list(trials[p :: self.count]), cap))
        answers = [_answer(pipe) for pipe in self.pipes]
        lengths = [0] * len(seeds)
        for p, (share_lengths, _, _) in enumerate(answers):
            lengths[p :: self.count] = share_lengths
        parts = tuple(sum(share) / seconds for share, seconds, _ in answers)
        detail = {
            "seconds": [seconds for _, seconds, _ in answers],
            "reset_s": [timing["reset"] for _, _, timing in answers],
            "step_s": [timing["step"] for _, _, timing in answers],
            "steps": [sum(share) for share, _, _ in answers],
        }
        return Sample(sum(lengths), math.fsum(parts), sum(lengths), tuple(lengths), parts, detail)


def _answer(pipe, timeout_s: float = ANSWER_TIMEOUT_S) -> Any:
    if not pipe.poll(timeout_s):
        raise TimeoutError(f"a raw process did not answer within {timeout_s:g} s")
    return pipe.recv()


# ---------------------------------------------------------------------------------- kept lanes


class KeptProcessLanes(ProcessLanes):
    """``ProcessLanes`` that a run cannot close: ``close`` waits for ``shutdown``, so the
    workers and their built envs serve run after run."""

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        super().close()


class KeptInProcessLanes(InProcessLanes):
    """``InProcessLanes`` that a run cannot close (see ``KeptProcessLanes``)."""

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        super().close()


class TimedProcessLanes(KeptProcessLanes):
    """``KeptProcessLanes`` that keep every timing: the workers' time in their envs' steps
    (``worker{w}.step``) and the driver's wait for them (``driver.wait``), a round each (what
    ``record_latency`` hears), and each reset call's time (``reset``), in ns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.times: dict[str, list[int]] = defaultdict(list)
        super().__init__(*args, record_latency=self._note, **kwargs)

    def _note(self, op: str, ns: int) -> None:
        self.times[op].append(ns)

    def reset(self, lanes, seeds, trials):
        started = time.perf_counter_ns()
        try:
            return super().reset(lanes, seeds, trials)
        finally:
            self.times["reset"].append(time.perf_counter_ns() - started)


@contextlib.contextmanager
def kept(lanes: KeptProcessLanes | KeptInProcessLanes) -> Iterator[Any]:
    """``lanes``, shut down at the end of the block however it ends."""
    try:
        yield lanes
    finally:
        lanes.shutdown()


def warm(lanes: Any, seed: int = 10_000) -> None:
    """Reset every lane once (a lazy simulator builds at its first reset)."""
    every = np.arange(lanes.num_lanes, dtype=np.int64)
    seeds = [seed + lane for lane in range(lanes.num_lanes)]
    lanes.reset(every, seeds, seeds)


def run_rlmesh(
    model: rlmesh.Model, env: Any, seeds: Sequence[int], cap: int, **options: Any
) -> tuple[Sample, rlmesh.RunResult]:
    """``rlmesh.run`` of the episodes of ``seeds`` (episode k: seed ``seeds[k]``, trial k),
    timed around the call: the scored lane-steps/s, and the result."""
    started = time.perf_counter()
    result = rlmesh.run(model, env, seeds=list(seeds), max_episode_steps=cap, **options)
    seconds = time.perf_counter() - started
    lengths = tuple(e.steps for e in sorted(result.episodes, key=lambda e: e.index))
    sample = Sample(sum(lengths), sum(lengths) / seconds, result.total_steps, lengths)
    return sample, result


# ---------------------------------------------------------------------------------- memory


def available_gb() -> float | None:
    """The memory the kernel says new processes can have (``MemAvailable``), None elsewhere."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as meminfo:
            line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        return int(line.split()[1]) / 2**20
    return None


def wait_for_memory(gb: float, timeout_s: float, log: Callable[[str], None] = print) -> None:
    """Wait until ``gb`` GiB are available (others share this machine), polling every 10 s;
    ``MemoryError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    said = False
    while (free := available_gb()) is not None and free < gb:
        if time.monotonic() > deadline:
            raise MemoryError(f"{gb:.1f} GiB needed, {free:.1f} GiB available after {timeout_s} s")
        if not said:
            log(f"  waiting for {gb:.1f} GiB of memory ({free:.1f} GiB available)")
            said = True
        time.sleep(10)


def worker_run_profile(
    factory: Callable[[], gym.Env],
    model: rlmesh.Model,
    num_envs: int,
    seeds: Sequence[int],
    cap: int,
) -> dict[str, Any]:
    """Where a ``workers=2`` run's wall time goes (``TimedProcessLanes``, built and warmed
    first): the driver's reset calls, its waits for each round's workers (the slower worker's
    steps: the other idles for the difference, ``barrier_idle_s`` when every round steps
    both), and the rest, the driver's own time (the model, the core's round, the pipes); and
    a lane-step's mean time inside the workers' envs."""
    lanes = TimedProcessLanes(factory, num_envs=num_envs, workers=2)
    try:
        warm(lanes)
        lanes.times.clear()
        sample, _ = run_rlmesh(model, lanes, seeds, cap)
    finally:
        lanes.shutdown()
    wall = sample.scored_steps / sample.rate
    s = {op: np.array(ns, dtype=np.float64) / 1e9 for op, ns in lanes.times.items()}
    waits, resets = s["driver.wait"], s["reset"]
    busy = [s.get(f"worker{w}.step", np.zeros(0)) for w in (0, 1)]
    figures: dict[str, Any] = {
        "wall_s": wall,
        "rate": sample.rate,
        "resets_s": float(resets.sum()),
        "round_waits_s": float(waits.sum()),
        "driver_own_s": wall - float(resets.sum()) - float(waits.sum()),
        "rounds": len(waits),
        "worker_busy_s": [float(b.sum()) for b in busy],
        "step_s_in_workers": float(sum(b.sum() for b in busy)) / sample.scored_steps,
    }
    if len(busy[0]) == len(busy[1]) == len(waits):
        figures["barrier_idle_s"] = float(np.abs(busy[0] - busy[1]).sum())
    return figures


# ---------------------------------------------------------------------------------- sampling


def interleaved_samples(
    sides: dict[str, Callable[[], Sample]],
    repeats: int,
    on_sample: Callable[[str, Sample], None],
    *,
    warm_up: bool = False,
) -> dict[str, list[Sample]]:
    """Each side called ``repeats`` times, A B C A B C ...: drift on a shared machine hits
    every side alike. ``on_sample`` hears of each sample as it is taken. With ``warm_up``,
    each side is called once first, untimed (imports, caches, first-call costs)."""
    if warm_up:
        for side in sides.values():
            side()
    samples: dict[str, list[Sample]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, side in sides.items():
            sample = side()
            samples[name].append(sample)
            on_sample(name, sample)
    return samples


def median_rate(samples: Sequence[Sample]) -> float:
    return statistics.median(sample.rate for sample in samples)


@dataclass
class Row:
    """One comparison, with the fields of ``benches/report.py``'s rows: the subject's rate
    over the baseline's is the ratio, and the target is the issue's."""

    section: str
    workload: str
    baseline: str
    baseline_value: float
    subject: str
    subject_value: float
    unit: str = "steps/s"
    target: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.subject_value / self.baseline_value

    @property
    def status(self) -> str:
        if self.target is None:
            return ""
        return "ok" if self.ratio >= self.target else "MISSED"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "status": self.status}


def format_rows(rows: Sequence[Row]) -> str:
    """The rows under their sections, a row's note on the line below it."""
    lines, section = [], None
    for row in rows:
        if row.section != section:
            section = row.section
            lines.append(f"\n[{section}]")
        target = f">= {row.target:g}x" if row.target is not None else "-"
        lines.append(
            f"{row.workload}: {row.baseline} {row.baseline_value:,.2f}, {row.subject} "
            f"{row.subject_value:,.2f} {row.unit}, {format_ratio(row.ratio, row.target)} "
            f"(target {target}) {row.status}"
        )
        if row.note:
            lines.append(f"    {row.note}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- timers


class PhaseTimer:
    """Wraps methods to add up their time; a method wrapped as a phase names the time of the
    methods called inside it (``"render in step"``)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._phase: str | None = None

    def wrap(self, fn: Callable[..., Any], key: str, phase: bool) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            outer = self._phase
            name = key if phase or outer is None else f"{key} in {outer}"
            if phase:
                self._phase = key
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - started
                self.calls[name] += 1
                self._phase = outer

        return timed

    @contextlib.contextmanager
    def patched(
        self, classes: list[tuple[type, str, str]], objects: list[tuple[Any, str]]
    ) -> Iterator[PhaseTimer]:
        """Time ``(class, method, key)`` in every instance, and ``(object, method)`` phases
        (keyed by the method's name) on one object; everything is put back at the end."""
        originals = []
        try:
            for owner, name, key in classes:
                original = owner.__dict__[name]
                originals.append((owner, name, original))
                setattr(owner, name, self.wrap(original, key, phase=False))
            for target, name in objects:
                setattr(target, name, self.wrap(getattr(target, name), name, phase=True))
            yield self
        finally:
            for target, name in objects:
                with contextlib.suppress(AttributeError):
                    delattr(target, name)  # the instance attribute; the class's shows again
            for owner, name, original in originals:
                setattr(owner, name, original)
