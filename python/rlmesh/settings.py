"""A run's arguments, checked once: ``check_settings`` is the only validator of ``run``'s
arguments, and everything below it (the model handler, the lanes, the core) takes them as
given.

Example:
    >>> settings = check_settings(
    ...     seeds=None, episodes=4, seed=None, num_envs=2, execution_horizon=1,
    ...     max_episode_steps=None, max_episode_seconds=None, trial_index_base=0,
    ...     telemetry_window=1.0, timeouts={"step": 2}, close_env=False)
    >>> settings.base_seed, settings.timeouts
    (0, {'step': 2.0})
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .adapters import checked_env_tags
from .utils import positive_int, positive_seconds

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
class RunSettings:
    """The checked arguments of one run."""

    seeds: list[int] | None
    episodes: int
    base_seed: int
    num_envs: int | None
    execution_horizon: int
    max_episode_steps: int | None
    max_episode_seconds: float | None
    trial_index_base: int
    telemetry_window: float
    timeouts: dict[str, float]
    close_env: bool
    indices: list[int] | None = None
    workers: int = 1
    restart_workers: int = 0
    env_tags: Any = None  # rlmesh.adapters.EnvTags
    video: VideoSettings | None = None  # record_video=K > 0
    on_error: str = "raise"
    max_retries: int = DEFAULT_MAX_RETRIES
    pipeline: bool = False


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


def check_settings(
    *,
    seeds: Sequence[int] | None,
    episodes: int | None,
    seed: int | None,
    num_envs: int | None,
    execution_horizon: int,
    max_episode_steps: int | None,
    max_episode_seconds: float | None,
    trial_index_base: int,
    telemetry_window: float,
    timeouts: dict[str, float] | None,
    close_env: bool,
    indices: Sequence[int] | None = None,
    workers: int = 1,
    restart_workers: int = 0,
    env_tags: Any = None,
    video: VideoSettings | None = None,
    on_error: str = "raise",
    max_retries: int | None = None,
    cluster: str | None = None,
    pipeline: bool = False,
) -> RunSettings:
    """The run's arguments checked, with the defaults DESIGN.md gives; ValueError otherwise.

    The one check of ``run``'s arguments: everything below it (the model handler, the lanes,
    the core) takes them as checked. ``max_retries`` is one concept with two uses, the times a
    failed part of the run is run again: an episode whose env failed (``on_error="retry"``)
    and a window whose Ray worker was lost (``cluster="ray"``); ``cluster`` is given only to
    check that one of them reads it.
    """
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
    workers = positive_int("workers", workers)
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, (int, np.integer)):
        raise ValueError(f"restart_workers must be a non-negative integer, got {restart_workers!r}")
    if restart_workers < 0:
        raise ValueError(f"restart_workers must be a non-negative integer, got {restart_workers}")
    if restart_workers and workers == 1:
        raise ValueError(
            f"restart_workers={restart_workers} restarts worker processes, but workers=1 runs "
            f"the envs in this process: pass workers=2 or more"
        )
    if not isinstance(pipeline, bool):
        raise ValueError(f"pipeline must be True or False, got {pipeline!r}")
    if pipeline and cluster is not None and workers == 1:
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
    return RunSettings(
        seeds=seeds,
        episodes=positive_int("episodes", episodes),
        base_seed=0 if seed is None else int(seed),
        num_envs=None if num_envs is None else positive_int("num_envs", num_envs),
        execution_horizon=positive_int("execution_horizon", execution_horizon),
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
        trial_index_base=trial_index_base,
        telemetry_window=positive_seconds("telemetry_window", telemetry_window),
        timeouts={
            op: positive_seconds(f"timeouts[{op!r}]", limit)
            for op, limit in (timeouts or {}).items()
        },
        close_env=bool(close_env),
        indices=None if indices is None else list(indices),
        workers=workers,
        restart_workers=int(restart_workers),
        env_tags=None if env_tags is None else checked_env_tags("env_tags", env_tags),
        video=video,
        on_error=on_error,
        max_retries=DEFAULT_MAX_RETRIES if max_retries is None else int(max_retries),
        pipeline=pipeline,
    )


@dataclass(frozen=True)
class ClusterSettings:
    """The checked scale-out arguments of a run with ``cluster=`` (``rlmesh.cluster``).

    ``workers`` is how many windows run at once, each a Ray task on one worker (None: one per
    CPU of the cluster); ``processes_per_worker`` is handed to each worker's local run as its
    ``workers=`` (process lanes); ``window_episodes`` is the episodes per window (None: the
    coordinator picks); ``max_retries`` is the run's (``RunSettings.max_retries``, checked
    there): the times a window whose worker was lost is dealt again; ``ray_mode`` is how the
    workers run their windows: ``"tasks"`` (a Ray task a window) or ``"actors"`` (``workers``
    long-lived Ray actors, each holding the model for every window dealt to it).
    """

    cluster: str
    workers: int | None
    ray_address: str | None
    max_retries: int
    window_episodes: int | None
    processes_per_worker: int | None
    ray_mode: str = DEFAULT_RAY_MODE


def check_cluster_settings(
    *,
    cluster: str | None,
    workers: int | None,
    ray_address: str | None,
    max_retries: int,
    window_episodes: int | None,
    processes_per_worker: int | None,
    ray_mode: str | None = None,
) -> ClusterSettings | None:
    """The scale-out arguments checked: None for a run on this process alone; ValueError
    otherwise.

    With ``cluster="ray"``, ``workers`` counts Ray workers (windows in flight at once); the
    local process lanes of each worker are ``processes_per_worker``. ``max_retries`` comes
    checked from ``check_settings`` (``RunSettings.max_retries``). ``ray_mode`` is one of
    ``RAY_MODES`` (None: ``DEFAULT_RAY_MODE``).

    Example:
        >>> placement = check_cluster_settings(cluster="ray", workers=2, ray_address=None,
        ...     max_retries=3, window_episodes=None, processes_per_worker=None,
        ...     ray_mode="actors")
        >>> placement.max_retries, placement.ray_mode
        (3, 'actors')
    """
    if cluster is None:
        # Without a cluster, workers= is the run's process lanes (check_settings checks it).
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
        workers=None if workers is None else positive_int("workers", workers),
        ray_address=ray_address,
        max_retries=int(max_retries),
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
