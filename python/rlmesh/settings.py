"""A run's settings: the one home of what ``rlmesh.run`` is asked to do, checked once.

``run_settings`` takes ``rlmesh.run``'s keyword arguments (their one list, with their
defaults: ``rlmesh.api`` takes its signature from it) and returns a ``RunSettings`` in named
parts:

- ``episodes`` (``EpisodeSettings``): which episodes are scored and how each is seeded;
- ``limits`` (``LimitSettings``): the caps that end an episode and the calls' time limits;
- ``parallel`` (``ParallelSettings``): how this process runs its lanes (lanes, worker
  processes, their restarts, group pipelining);
- ``failures`` (``FailureSettings``): what an env failure does, and how often an episode is
  retried;
- ``placement`` (``ClusterSettings``, or None on this process alone): the Ray cluster's
  workers, windows and how often a lost window is dealt again;
- ``output`` (``OutputSettings``): the results file, its resumption and what its header
  records;
- ``video`` (``VideoSettings``, or None): which episodes are recorded, and where.

Everything below (the driver, the lanes, the core, a cluster's coordinator and its workers)
takes the object as checked. A Ray window's run gets ``RunSettings.for_window``: the same
object, placed on the worker.

Example:
    >>> settings = run_settings(episodes=4, num_envs=2, timeouts={"step": 2})
    >>> settings.episodes.base_seed, settings.limits.timeouts, settings.parallel.num_envs
    (0, {'step': 2.0}, 2)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .adapters import checked_env_tags
from .core import core_name
from .model.ensemble import TemporalEnsemble
from .provenance import PROVENANCE_KEY, check_provenance, collect_provenance
from .results import ResultsFile
from .stats.stopping import Precision
from .success import SuccessRule
from .utils import env_label, positive_int, positive_seconds
from .version import __version__
from .view.spec import ViewSpec, parse_view

TIMEOUT_OPS = ("reset", "step", "predict")
"""The operations ``timeouts=`` may limit."""

CLUSTERS = ("ray",)
"""What ``cluster=`` may name."""
RAY_MODES = ("tasks", "actors")
"""What ``ray_mode=`` may name: how a cluster run's workers run their windows."""
DEFAULT_RAY_MODE = "tasks"
"""``ray_mode`` when not given (``rlmesh.run``'s docstring says why)."""
ON_ERRORS = ("raise", "record", "retry")
"""What ``on_error=`` may name: what a run does when an env's ``reset`` or ``step`` raises."""
DEFAULT_MAX_RETRIES = 3
"""``max_retries`` when not given: the times a failed part of the run is run again."""


@dataclass(frozen=True)
class EpisodeSettings:
    """Which episodes a run scores and how each is seeded.

    Slot k (``0..count-1``) resets with ``seeds[k]`` when seeds are listed, else with
    ``episode_seed(base_seed, trial_index_base + k)``; ``indices`` (None: all) are the slots
    this run plays, with the seeds and trials they have in the full run.
    """

    count: int
    seeds: list[int] | None
    base_seed: int
    trial_index_base: int
    indices: list[int] | None = None

    @property
    def requested(self) -> int:
        """How many episodes this run was asked to play."""
        return self.count if self.indices is None else len(self.indices)

    @property
    def slots(self) -> Sequence[int]:
        """The slots this run plays: ``indices``, else every slot."""
        return range(self.count) if self.indices is None else self.indices


@dataclass(frozen=True)
class LimitSettings:
    """What ends an episode early and how long one call may take: an episode is truncated
    at ``max_episode_steps`` steps or ``max_episode_seconds`` from its reset (None: no cap);
    ``timeouts`` maps ``TIMEOUT_OPS`` to seconds, past which the call fails the run."""

    max_episode_steps: int | None = None
    max_episode_seconds: float | None = None
    timeouts: dict[str, float] = field(default_factory=dict)

    @property
    def caps(self) -> bool:
        """Whether a cap may end an episode on a step its env did not end."""
        return self.max_episode_steps is not None or self.max_episode_seconds is not None


@dataclass(frozen=True)
class ParallelSettings:
    """How this process runs its lanes: ``num_envs`` lanes (None: the env's own count, else
    1), stepped in ``process_workers`` worker processes (1: in this process), a dead worker
    restarted up to ``restart_workers`` times, and with ``pipeline`` each worker's lanes a
    group whose round goes on as soon as that worker has stepped."""

    num_envs: int | None = None
    process_workers: int = 1
    restart_workers: int = 0
    pipeline: bool = False


@dataclass(frozen=True)
class FailureSettings:
    """What an env failure does (``on_error``, one of ``ON_ERRORS``) and, with
    ``on_error="retry"``, how many times an episode whose env failed is played again."""

    on_error: str = "raise"
    episode_retries: int = DEFAULT_MAX_RETRIES


@dataclass(frozen=True)
class OutputSettings:
    """Where the episodes go: the results file (None: none) and whether to continue it,
    the extra header fields (``run_info``) a resumption must match, whether a changed policy
    hash may resume, and what the header's provenance record says of the caller
    (``rlmesh.provenance.check_provenance``)."""

    results_path: str | os.PathLike[str] | None = None
    resume: bool = False
    run_info: dict[str, Any] | None = None
    allow_changed_policy: bool = False
    provenance: dict[str, Any] | None = None
    view: ViewSpec | None = None  # the live view (rlmesh.view): its page, its table


@dataclass(frozen=True)
class VideoSettings:
    """The checked video arguments of a run (``rlmesh.video``): record the episodes whose
    index is below ``episodes``, into ``directory``, from ``render()`` (``key`` None) or from
    the observation's image ``key``; files are named ``{prefix}_ep{index:05d}_seed{seed}.mp4``
    (``prefix`` None: the env's name). ``links_from`` is the results file's directory, which
    ``EpisodeResult.video`` is relative to (None without a results file: the path as made)."""

    episodes: int
    directory: Path
    key: str | None = None
    prefix: str | None = None
    links_from: Path | None = None

    @property
    def render_mode(self) -> str | None:
        """The render mode the envs are built with: ``rgb_array`` when frames come from
        ``render()``."""
        return "rgb_array" if self.key is None else None


def check_video_settings(
    *,
    record_video: int | None,
    video_dir: str | os.PathLike[str] | None,
    video_key: str | None,
    video_prefix: str | None,
    results_path: str | os.PathLike[str] | None,
) -> VideoSettings | None:
    """The video arguments checked: None when nothing is recorded; ValueError otherwise, and
    ImportError naming the ``video`` extra when imageio or imageio-ffmpeg is missing.

    ``video_dir`` defaults to ``<results stem>_videos/`` beside the results file (a suite's
    file, for its tasks).

    Example:
        >>> check_video_settings(record_video=2, video_dir=None, video_key=None,
        ...     video_prefix=None, results_path="out/run.jsonl").directory.as_posix()
        'out/run_videos'
    """
    if record_video is None or record_video == 0:
        extras = {"video_dir": video_dir, "video_key": video_key, "video_prefix": video_prefix}
        named = [name for name, value in extras.items() if value is not None]
        if named:
            raise ValueError(
                f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} for recording "
                f"videos: pass record_video=K (the first K episode indices) too"
            )
        return None
    if isinstance(record_video, bool) or not isinstance(record_video, (int, np.integer)):
        raise ValueError(
            f"record_video must be a non-negative integer (how many of the first episode "
            f"indices to record), got {record_video!r}"
        )
    if record_video < 0:
        raise ValueError(f"record_video must be a non-negative integer, got {record_video}")
    for name, value in (("video_key", video_key), ("video_prefix", video_prefix)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
    # A suite's task runs into its part of the suite's file (results.TaskResults): its path.
    results_path = getattr(results_path, "path", results_path)
    links_from = None if results_path is None else Path(results_path).parent
    if video_dir is not None:
        directory = Path(video_dir)
    elif results_path is not None:
        results = Path(results_path)
        directory = results.with_name(f"{results.stem}_videos")
    else:
        raise ValueError(
            f"record_video={record_video} needs somewhere to write the videos: pass "
            f"video_dir=DIR, or results_path= (the videos then go beside it, in "
            f"<results stem>_videos/)"
        )
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"record_video writes mp4 files through imageio and imageio-ffmpeg ({err}): "
            f'install them with pip install "rlmesh[video]"'
        ) from err
    return VideoSettings(
        episodes=int(record_video),
        directory=directory,
        key=video_key,
        prefix=video_prefix,
        links_from=links_from,
    )


@dataclass(frozen=True)
class ClusterSettings:
    """The checked scale-out arguments of a run with ``cluster=`` (``rlmesh.cluster``).

    ``ray_workers`` is how many windows run at once, each a Ray task on one worker (None: one
    per CPU of the cluster); ``processes_per_worker`` is each worker's local run's process
    lanes; ``window_episodes`` is the episodes per window (None: the coordinator picks);
    ``window_retries`` (the run's ``max_retries``): the times a window whose worker was lost is
    dealt again; ``ray_mode`` is how the
    workers run their windows: ``"tasks"`` (a Ray task a window) or ``"actors"`` (``workers``
    long-lived Ray actors, each holding the model for every window dealt to it).
    """

    cluster: str
    ray_workers: int | None
    ray_address: str | None
    window_retries: int
    window_episodes: int | None
    processes_per_worker: int | None
    ray_mode: str = DEFAULT_RAY_MODE


def check_cluster_settings(
    *,
    cluster: str | None,
    ray_workers: int | None,
    ray_address: str | None,
    window_retries: int = DEFAULT_MAX_RETRIES,
    window_episodes: int | None,
    processes_per_worker: int | None,
    ray_mode: str | None = None,
) -> ClusterSettings | None:
    """The scale-out arguments checked: None for a run on this process alone; ValueError
    otherwise.

    With ``cluster="ray"``, ``ray_workers`` (``rlmesh.run``'s ``workers=``) counts Ray workers
    (windows in flight at once); the local process lanes of each worker are
    ``processes_per_worker``. ``window_retries`` comes checked from ``run_settings`` (the
    run's ``max_retries``). ``ray_mode`` is one of ``RAY_MODES`` (None: ``DEFAULT_RAY_MODE``).

    Example:
        >>> placement = check_cluster_settings(cluster="ray", ray_workers=2, ray_address=None,
        ...     window_retries=3, window_episodes=None, processes_per_worker=None,
        ...     ray_mode="actors")
        >>> placement.window_retries, placement.ray_mode
        (3, 'actors')
    """
    if cluster is None:
        # Without a cluster, workers= is the run's process lanes (run_settings checks it).
        given = {
            "ray_address": ray_address,
            "window_episodes": window_episodes,
            "processes_per_worker": processes_per_worker,
            "ray_mode": ray_mode,
        }
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise ValueError(
                f"{', '.join(named)} {'needs' if len(named) == 1 else 'need'} a cluster: pass "
                f"cluster='ray'"
            )
        return None
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {list(CLUSTERS)} or None, got {cluster!r}")
    if ray_address is not None and (not isinstance(ray_address, str) or not ray_address):
        raise ValueError(
            f"ray_address must be a Ray cluster's address such as 'auto', '10.0.0.5:6379' or "
            f"'ray://head:10001', or None to start a local Ray instance; got {ray_address!r}"
        )
    if ray_mode is not None and ray_mode not in RAY_MODES:
        raise ValueError(
            f"ray_mode must be one of {list(RAY_MODES)} (a Ray task a window, or long-lived "
            f"actors that load the model once each) or None for {DEFAULT_RAY_MODE!r}; got "
            f"{ray_mode!r}"
        )
    return ClusterSettings(
        cluster=cluster,
        ray_workers=None if ray_workers is None else positive_int("workers", ray_workers),
        ray_address=ray_address,
        window_retries=int(window_retries),
        window_episodes=(
            None if window_episodes is None else positive_int("window_episodes", window_episodes)
        ),
        processes_per_worker=(
            None
            if processes_per_worker is None
            else positive_int("processes_per_worker", processes_per_worker)
        ),
        ray_mode=DEFAULT_RAY_MODE if ray_mode is None else ray_mode,
    )


@dataclass(frozen=True)
class RunSettings:
    """One run's checked settings, in parts (the module docstring names each), and what
    belongs to no part: the actions replayed per chunk, the env's role tags, the success
    rule as given, the telemetry window, whether to close an env passed in, the core, the
    stopping rule (``until``: a ``rlmesh.Precision``, or None to play every episode), and how
    chunks are executed (``ensemble``: a ``rlmesh.TemporalEnsemble``, or None to replay
    ``execution_horizon`` actions of each)."""

    episodes: EpisodeSettings
    limits: LimitSettings = LimitSettings()
    parallel: ParallelSettings = ParallelSettings()
    failures: FailureSettings = FailureSettings()
    placement: ClusterSettings | None = None
    output: OutputSettings = OutputSettings()
    video: VideoSettings | None = None
    execution_horizon: int = 1
    env_tags: Any = None  # rlmesh.adapters.EnvTags
    success: Any = None  # as given: rlmesh.success.rule_for makes the run's rule of it
    telemetry_window: float = 1.0
    close_env: bool = False
    core: str | None = None
    until: Precision | None = None
    ensemble: TemporalEnsemble | None = None

    def for_window(self, indices: list[int] | None = None) -> RunSettings:
        """The settings of one window of a cluster run, run on a Ray worker: the same
        episodes (``indices`` of them) and limits, no placement and no results file (the
        coordinator writes it), the worker's own process lanes, videos written straight into
        the run's directory.

        Example:
            >>> settings = run_settings(episodes=8, cluster="ray", workers=4,
            ...                         processes_per_worker=2)
            >>> window = settings.for_window([3, 5])
            >>> window.placement, window.parallel.process_workers, window.episodes.indices
            (None, 2, [3, 5])
        """
        video = self.video
        if video is not None:
            video = replace(video, directory=video.directory.resolve(), links_from=None)
        return replace(
            self,
            episodes=replace(self.episodes, indices=indices),
            placement=None,
            output=OutputSettings(),
            video=video,
            core=self.core or core_name(),
        )

    def results_header(self, env: Any, model: Any) -> dict[str, Any]:
        """What a results file records of the run, and what a resumed run must match: the
        env, the episodes and their seeds, the caps, the version and core, the caller's
        ``run_info`` and the auditable provenance record (``PROVENANCE_KEY``, which a
        resumption does not check)."""
        core = self.core or core_name()
        episodes, limits = self.episodes, self.limits
        header = {
            "env": env_label(env),
            "episodes": episodes.count,
            "seed": episodes.base_seed,
            "seeds": episodes.seeds,
            "execution_horizon": self.execution_horizon,
            "max_episode_steps": limits.max_episode_steps,
            "max_episode_seconds": limits.max_episode_seconds,
            "trial_index_base": episodes.trial_index_base,
            "rlmesh_version": __version__,
            "core": core,
            # Only when set, so a file without a stopping rule reads as before; a resumption
            # must stop on the same rule.
            **({} if self.until is None else {"until": self.until.to_json()}),
            **({} if self.ensemble is None else {"ensemble": self.ensemble.to_json()}),
            **(self.output.run_info or {}),
        }
        stated = self.output.provenance or {}
        header[PROVENANCE_KEY] = collect_provenance(model=model, env=env, core=core, **stated)
        return header

    def open_results(self, env: Any, model: Any, success_rule: SuccessRule) -> ResultsFile | None:
        """The run's results file, opened (and on resume checked against its header), or
        None without ``results_path``: its header is ``results_header`` and the run's success
        rule."""
        output = self.output
        if output.results_path is None:
            return None
        header = self.results_header(env, model)
        header["success_rule"] = success_rule.to_json()
        return ResultsFile.open(
            output.results_path,
            header,
            resume=output.resume,
            allow_changed_policy=output.allow_changed_policy,
        )


def run_settings(
    *,
    seeds: Sequence[int] | None = None,
    episodes: int | None = None,
    seed: int | None = None,
    num_envs: int | None = None,
    execution_horizon: int = 1,
    max_episode_steps: int | None = None,
    max_episode_seconds: float | None = None,
    trial_index_base: int = 0,
    telemetry_window: float = 1.0,
    timeouts: dict[str, float] | None = None,
    close_env: bool = False,
    core: str | None = None,
    indices: Sequence[int] | None = None,
    results_path: str | os.PathLike[str] | None = None,
    resume: bool = False,
    run_info: dict[str, Any] | None = None,
    allow_changed_policy: bool = False,
    success: Any = None,
    workers: int | None = None,
    restart_workers: int = 0,
    pipeline: bool = False,
    cluster: str | None = None,
    ray_address: str | None = None,
    max_retries: int | None = None,
    window_episodes: int | None = None,
    processes_per_worker: int | None = None,
    ray_mode: str | None = None,
    env_tags: Any = None,
    provenance: dict[str, Any] | None = None,
    record_video: int = 0,
    video_dir: str | os.PathLike[str] | None = None,
    video_key: str | None = None,
    video_prefix: str | None = None,
    on_error: str = "raise",
    view: str | None = None,
    until: Precision | None = None,
    ensemble: TemporalEnsemble | None = None,
) -> RunSettings:
    """``rlmesh.run``'s keyword arguments (documented there) checked into a ``RunSettings``;
    ValueError or TypeError naming the argument, what it was and what was expected.

    ``workers`` is the run's worker processes on this machine, or with ``cluster="ray"`` its
    Ray workers (then ``processes_per_worker`` are each worker's processes); ``max_retries``
    is the times a failed part of the run is run again: an episode whose env failed
    (``on_error="retry"``) and a window whose Ray worker was lost (``cluster="ray"``). Inside,
    each has its own name (``process_workers`` / ``ray_workers``, ``episode_retries`` /
    ``window_retries``).

    Example:
        >>> settings = run_settings(episodes=2, cluster="ray", workers=3, max_retries=1)
        >>> settings.placement.ray_workers, settings.parallel.process_workers
        (3, 1)
        >>> run_settings(max_retries=1)
        Traceback (most recent call last):
        ...
        ValueError: max_retries=1 counts the times a failed part of the run is run again: ...
    """
    # The video arguments are checked first, as the ones a run reads before any other.
    video = check_video_settings(
        record_video=record_video,
        video_dir=video_dir,
        video_key=video_key,
        video_prefix=video_prefix,
        results_path=results_path,
    )
    if seeds is not None:
        seeds = list(seeds)
        if not seeds and episodes is None:
            raise ValueError("seeds is empty: give at least one seed, or episodes=")
    if episodes is None:
        episodes = len(seeds) if seeds is not None else 1
    unknown = sorted(set(timeouts or {}) - set(TIMEOUT_OPS))
    if unknown:
        raise ValueError(f"timeouts has unknown operations {unknown}; expected {list(TIMEOUT_OPS)}")
    if isinstance(trial_index_base, bool) or not isinstance(trial_index_base, int):
        raise ValueError(
            f"trial_index_base must be a non-negative integer, got {trial_index_base!r}"
        )
    if trial_index_base < 0:
        raise ValueError(f"trial_index_base must be a non-negative integer, got {trial_index_base}")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64
    ):
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    # With a cluster, workers= counts Ray workers, and each one's processes are its own.
    local = processes_per_worker if cluster is not None else workers
    process_workers = positive_int("workers", 1 if local is None else local)
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, (int, np.integer)):
        raise ValueError(f"restart_workers must be a non-negative integer, got {restart_workers!r}")
    if restart_workers < 0:
        raise ValueError(f"restart_workers must be a non-negative integer, got {restart_workers}")
    if restart_workers and process_workers == 1:
        raise ValueError(
            f"restart_workers={restart_workers} restarts worker processes, but workers=1 runs "
            f"the envs in this process: pass workers=2 or more"
        )
    if not isinstance(pipeline, bool):
        raise ValueError(f"pipeline must be True or False, got {pipeline!r}")
    if pipeline and cluster is not None and process_workers == 1:
        raise ValueError(
            "pipeline=True overlaps the model with a window's worker processes stepping: with "
            "cluster='ray', pass processes_per_worker=2 or more"
        )
    if on_error not in ON_ERRORS:
        raise ValueError(f"on_error must be one of {list(ON_ERRORS)}, got {on_error!r}")
    if max_retries is not None:
        if (
            isinstance(max_retries, bool)
            or not isinstance(max_retries, (int, np.integer))
            or max_retries < 0
        ):
            raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        if on_error != "retry" and cluster is None:
            raise ValueError(
                f"max_retries={max_retries} counts the times a failed part of the run is run "
                f"again: an episode whose env failed, with on_error='retry', or a window whose "
                f"Ray worker was lost, with cluster='ray'; this run has on_error={on_error!r} "
                f"and no cluster: pass one of them, or omit max_retries"
            )
    retries = DEFAULT_MAX_RETRIES if max_retries is None else int(max_retries)
    episode_settings = EpisodeSettings(
        count=positive_int("episodes", episodes),
        seeds=seeds,
        base_seed=0 if seed is None else int(seed),
        trial_index_base=trial_index_base,
        indices=None if indices is None else list(indices),
    )
    parallel = ParallelSettings(
        num_envs=None if num_envs is None else positive_int("num_envs", num_envs),
        process_workers=process_workers,
        restart_workers=int(restart_workers),
        pipeline=pipeline,
    )
    execution_horizon = positive_int("execution_horizon", execution_horizon)
    _check_ensemble(ensemble, execution_horizon)
    limits = LimitSettings(
        max_episode_steps=(
            None
            if max_episode_steps is None
            else positive_int("max_episode_steps", max_episode_steps)
        ),
        max_episode_seconds=(
            None
            if max_episode_seconds is None
            else positive_seconds("max_episode_seconds", max_episode_seconds)
        ),
        timeouts={
            op: positive_seconds(f"timeouts[{op!r}]", limit)
            for op, limit in (timeouts or {}).items()
        },
    )
    telemetry_window = positive_seconds("telemetry_window", telemetry_window)
    env_tags = None if env_tags is None else checked_env_tags("env_tags", env_tags)
    placement = check_cluster_settings(
        cluster=cluster,
        ray_workers=workers,
        ray_address=ray_address,
        window_retries=retries,
        window_episodes=window_episodes,
        processes_per_worker=processes_per_worker,
        ray_mode=ray_mode,
    )
    stated = check_provenance(provenance)
    _check_until(until, cluster=cluster, indices=indices)
    return RunSettings(
        episodes=episode_settings,
        limits=limits,
        parallel=parallel,
        failures=FailureSettings(on_error=on_error, episode_retries=retries),
        placement=placement,
        output=OutputSettings(
            results_path=results_path,
            resume=resume,
            run_info=run_info,
            allow_changed_policy=allow_changed_policy,
            provenance=stated,
            view=parse_view(view),
        ),
        video=video,
        execution_horizon=execution_horizon,
        env_tags=env_tags,
        success=success,
        telemetry_window=telemetry_window,
        close_env=bool(close_env),
        core=core,
        until=until,
        ensemble=ensemble,
    )


def _check_ensemble(ensemble: Any, execution_horizon: int) -> None:
    """Refuse an ``ensemble=`` that is not a ``TemporalEnsemble``, or that goes with a replay
    of several actions per chunk."""
    if ensemble is None:
        return
    if not isinstance(ensemble, TemporalEnsemble):
        raise ValueError(
            f"ensemble must be rlmesh.TemporalEnsemble(m=...) or None, got {ensemble!r}"
        )
    if execution_horizon > 1:
        raise ValueError(
            f"ensemble= executes one averaged action per step, and "
            f"execution_horizon={execution_horizon} replays several actions of one chunk: "
            f"pass one of them"
        )


def _check_until(until: Any, *, cluster: str | None, indices: Sequence[int] | None) -> None:
    """Refuse an ``until=`` that is not a ``Precision``, or that goes with what plays other
    episodes than a prefix (``indices=``) or merges windows (``cluster=``)."""
    if until is None:
        return
    if not isinstance(until, Precision):
        raise ValueError(
            f"until must be rlmesh.Precision(success=...) or Precision(reward=..., "
            f"reward_bounds=(lo, hi)), or None to play every episode; got {until!r}"
        )
    if indices is not None:
        raise ValueError(
            "until= stops on the prefix 0..n-1 of a run's episodes, and indices= plays chosen "
            "ones: pass one of them (a resumed results file continues a stopped run by itself)"
        )
    if cluster is not None:
        raise ValueError(
            f"until= decides after each episode of this process's run; cluster={cluster!r} "
            f"runs windows of episodes on other workers: drop cluster= (workers= gives this "
            f"machine's processes) or until="
        )


RUN_ARGUMENTS = tuple(inspect.signature(run_settings).parameters)
"""The names of ``rlmesh.run``'s keyword arguments (but ``hooks``), in their order."""


def check_argument_names(names: Iterable[str], caller: str) -> None:
    """TypeError naming what ``caller`` (``"rlmesh.run"``) was given that is not one of
    ``rlmesh.run``'s keyword arguments, and what those are.

    Example:
        >>> check_argument_names(["episodes", "episodez"], "rlmesh.run")
        Traceback (most recent call last):
        ...
        TypeError: rlmesh.run() got unexpected keyword arguments ['episodez']; it takes ...
    """
    unknown = sorted(set(names) - set(RUN_ARGUMENTS))
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword arguments {unknown}; it takes hooks and "
            f"{', '.join(RUN_ARGUMENTS)}"
        )
