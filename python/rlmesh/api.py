"""The entry point: ``rlmesh.run`` / ``rlmesh.arun`` take a model, an env and keyword
arguments, map the arguments once into a ``RunSettings`` (``rlmesh.settings``), and evaluate:
on this process (``EvaluationRun``, ``rlmesh.driver``) or, with ``cluster="ray"``, across a
Ray cluster (``rlmesh.cluster``). Everything below takes the settings as checked.

Example:
    >>> import rlmesh
    >>> result = rlmesh.run(lambda obs: int(obs[2] > 0), "CartPole-v1", episodes=4, num_envs=2)
    >>> [episode.index for episode in result.episodes]
    [0, 1, 2, 3]
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

from .driver import EvaluationRun
from .results import RunResult
from .settings import RunSettings, check_argument_names, run_settings
from .success import rule_for
from .view import LiveView, hooks_with, open_view


def run(model: Any, env: Any, **kwargs: Any) -> RunResult:
    """Evaluate ``model`` on ``env`` and return exactly the episodes asked for.

    Takes the arguments of ``arun``. Inside a running event loop, ``await arun(...)`` instead.
    """
    return run_to_end("run", lambda: arun(model, env, **kwargs))


def run_to_end(name: str, start: Callable[[], Awaitable[Any]]) -> Any:
    """What the coroutine ``start()`` returns, run on a new event loop: the blocking form of
    ``rlmesh.a<name>``; a RuntimeError inside a running event loop (await it there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            f"rlmesh.{name}() was called inside a running event loop; use `await "
            f"rlmesh.a{name}(...)` there"
        )
    returned: list[Any] = []

    async def evaluate() -> None:
        returned.append(await start())

    # The result is handed out of the task rather than returned by it: closing asyncio.run's
    # runner can format its task's repr, result included, which for a long run means a repr
    # of every episode.
    asyncio.run(evaluate())
    return returned[0]


async def arun(model: Any, env: Any, *, hooks: Any = None, **arguments: Any) -> RunResult:
    """Evaluate ``model`` on ``env``: the coroutine behind ``rlmesh.run``.

    The keyword arguments are ``rlmesh.settings.run_settings``'s (their one list), checked
    there into one ``RunSettings``.

    Args:
        model: a ``rlmesh.Model`` (corners ``predict``, ``predict_batch``, ``predict_chunk``,
            ``predict_chunk_batch``), a ``Model(callable)``, or a bare callable (a ``predict``).
        env: a Gymnasium id, a ``gymnasium.Env`` (one lane), a zero-argument factory of envs,
            a ``gymnasium.vector.VectorEnv`` (its lanes, in lockstep), or ``rlmesh.lanes.Lanes``
            of any kind.
        seeds: slot k resets with ``seeds[k]``; ``episodes`` defaults to ``len(seeds)``.
        episodes: how many episodes to score, M (default: ``len(seeds)``, else 1). The
            ``rlmesh eval`` command defaults to 100 instead: from the shell a run is an
            evaluation, while from Python one episode is the smallest run, and an evaluation
            says how many it wants.
        seed: the base seed (default 0): slot k without a listed seed resets with
            ``episode_seed(seed, trial_index_base + k)``.
        num_envs: lanes to build from an id or a factory (default 1).
        execution_horizon: actions replayed per chunk (needs a chunk corner).
        ensemble: a ``rlmesh.TemporalEnsemble(m=0.01)`` executes chunks by temporal
            ensembling instead: the chunk corner is called at every step of every running
            lane (with ``execution_horizon=None``: its whole chunk), and each lane executes
            the ``exp(-m * i)``-weighted average of its episode's chunks covering the step
            (``rlmesh.model.ensemble``). Needs float (Box) actions and
            ``execution_horizon=1``; recorded in the results file's header.
        max_episode_steps, max_episode_seconds: truncate an episode at this many steps or
            seconds of wall clock.
        hooks: ``RunHooks``, ``RuntimeHooks`` or a list of them.
        trial_index_base: the global index of slot 0 (a shard of a larger evaluation).
        telemetry_window: seconds between telemetry snapshots.
        timeouts: per-operation limits in seconds: ``{"reset": .., "step": .., "predict": ..}``.
            An operation past its limit raises ``OperationTimeout`` at the limit; the call is
            abandoned on its thread (an env stuck in C code keeps that thread until it
            returns or the process exits).
        close_env: also close an env instance or vector the caller passed in (rlmesh always
            closes the envs it made).
        core: ``"rust"`` or ``"python"``; default the active core (``RLMESH_CORE``).
        indices: run only these episode indices (strictly increasing, in ``0..M-1``), with the
            seeds and trials they have in the full run: a shard, or the rest of a run.
        results_path: write a JSONL results file: a header line with the run's configuration
            (and ``run_info``), then one line per episode as it completes, flushed.
        resume: with ``results_path``, continue that file: its header must match this run;
            the episodes it holds are skipped, the missing ones run and are appended.
        run_info: extra header fields (e.g. the policy's name), checked on resume too.
        allow_changed_policy: on resume, accept a ``run_info["policy_sha256"]`` other than
            the file's (with a warning; the new one is recorded) instead of refusing it.
        success: how an episode whose env's final info reports no ``is_success`` /
            ``success`` is judged (``rlmesh.success``): a callable ``fn(EpisodeResult) ->
            bool``, or a number R (success iff the episode's reward >= R). Default: reward
            >= the env spec's ``reward_threshold``, else success is not available (None).
            Recorded in the results file header, checked on resume.
        workers: run the lanes in this many worker processes (``rlmesh.lanes.ProcessLanes``;
            ``env`` an id or a picklable factory). The default (None, 1) keeps them in this
            process. Results are the same for any number of workers. With ``cluster="ray"``
            it counts Ray workers instead (see below).
        restart_workers: with ``workers > 1``, restart a worker that dies up to this many
            times, replaying its episodes in flight, so the results equal an uninterrupted
            run; 0 (default): a dead worker raises ``EnvError``.
        pipeline: with ``workers > 1``, overlap the model with the envs (group pipelining):
            each worker's lanes are a group whose round goes on as soon as that worker has
            stepped, so the model predicts for one group while the other workers step. The
            results are those of plain rounds for a model whose per-lane output depends only
            on that lane's input (the determinism contract); a batched model sees one group
            at a time. Which lane plays which episode then depends on timing (the episodes
            and their results do not). It pays when the model is slow beside the envs.
        cluster: ``"ray"`` runs the episodes across a Ray cluster (``rlmesh.cluster``, the
            ``ray`` extra): windows of episode indices, each run by this driver on a worker,
            merged by index, equal to this run on one process. ``model`` may then also be a
            ``"path/to/file.py:Name"`` or ``"package.module:Name"`` the workers load, and
            ``env`` must be a Gymnasium id, a picklable factory, or a
            ``rlmesh.sandbox.SandboxEnv`` (each Ray worker starts one like it, held across
            its windows, on actors).
        workers (with ``cluster="ray"``): the Ray workers, windows run at once, each a task
            of one CPU (default: one per CPU of the cluster).
        ray_address: the Ray cluster to join (``"auto"``, ``"host:6379"``, ``"ray://..."``);
            None starts a local Ray instance with this machine's CPUs, or uses the one this
            process already started (``ray.init``).
        max_retries: the times a failed part of the run is run again (default 3): with
            ``on_error="retry"``, an episode whose env failed (then it is recorded failed);
            with ``cluster="ray"``, a window whose worker was lost, elsewhere, with the same
            seeds (then the run fails with ``rlmesh.cluster.WorkerLostError``). Given without
            either, it is refused.
        window_episodes: episodes per window (default: half a worker's share of the episodes
            not yet dealt, shrinking toward the end so the workers finish together).
        processes_per_worker: each worker's local run steps its lanes in this many processes
            (its ``workers=``; needs process lanes); its task then takes as many CPUs.
        ray_mode (with ``cluster="ray"``): how the workers run their windows. ``"tasks"``
            (the default): each window is a Ray task whose run loads the model
            (``Model.load``) and closes it. ``"actors"``: ``workers`` long-lived Ray actors
            each load the model once (on_route, load, then every window dealt to it), and
            close it once at the end; an actor that dies is replaced by a fresh one. Actors
            pay off when loading the model costs more than starting an actor (a fresh
            process, about a second) over many windows: with a ``load`` of 0.5 s on 32
            windows of 2 episodes, 12.1 s against 17.8 s on tasks (BENCHMARKS.md). For a
            cheap model, or a few windows, they gain nothing or lose, and they hold their
            CPUs for the whole run: hence tasks by default.
        env_tags: the env's ``rlmesh.adapters.EnvTags`` (or their v1 dict), for a model spec
            that pairs by role; default: the env's
            ``metadata["rlmesh.adapters.v1.env_io_spec"]``, if any.
        provenance: with ``results_path``, what the header's auditable record
            (``rlmesh.provenance``) should say of ``policy`` (its spec string; default
            the model's ``module:qualname``) and ``command`` (the command line, a list of str;
            default None). The record is not checked on resume.
        record_video: record the episodes whose index is below this (``rlmesh.video``) to
            mp4 files of ``steps + 1`` frames each (the reset's, then one per step), linked
            from their ``EpisodeResult.video``. Recording changes no result. With
            ``cluster="ray"`` the workers write them into ``video_dir``: on a cluster of
            several machines, a directory they all reach.
        video_dir: where the videos go (default: ``<results stem>_videos/`` beside
            ``results_path``; one of the two is needed).
        video_key: take the frames from this image key of a Dict observation (or
            ``"observation"``: the whole Box observation), ``[H, W, 3]`` or ``[H, W]`` uint8;
            default: from ``render()``, the envs built with ``render_mode="rgb_array"``.
        video_prefix: what the file names start with (a suite's task name); default the
            env's name: ``CartPole-v1_ep00003_seed3.mp4``.
        view: watch the run live (``rlmesh.view``): ``"http"`` serves a page on 127.0.0.1
            (a free port, printed; ``"http:PORT"``, ``"http:HOST:PORT"``), ``"terminal"``
            shows a live table, ``"both"`` does both. The page shows progress, per-task
            success with its interval, failures and each lane's latest frame, and stays up
            after the run. Watching changes no result.
        on_error: what an env failure (a lane's env raised in ``reset`` or ``step``, in this
            process, in a worker process, or on a served env) does to the run. ``"raise"``
            (default): the run fails with ``EnvError``. ``"record"``: the episode is kept as
            a result with ``EpisodeResult.error`` (``"<ExceptionType>: <message>"``; its steps
            and reward up to the failing call), the lane's env is rebuilt, and the run goes on
            with the next index. ``"retry"``: the same index is played again from its reset,
            with its seed, up to ``max_retries`` times, then recorded as with ``"record"``
            (hooks hear of each attempt's start, and of the index's end once). Failed
            episodes count as results (a resumed run keeps them) and stay out of the
            reward and success statistics. A model error (``predict`` raising, a wrong-shaped
            action) stays fatal, and so does an operation past its ``timeouts=`` limit.
            Needs lanes that can rebuild their envs (an id, a factory, a served env: not a
            ``gymnasium.Env`` instance or a ``VectorEnv``); a served env's error ends its
            session, so every episode in flight there fails with it.
        until: stop early once the answer is known: ``rlmesh.Precision(success=0.05)`` stops
            at the first n where the anytime-valid 95% confidence sequence of the success
            rate over episodes ``0..n-1`` is within +/-0.05 (``Precision(reward=E,
            reward_bounds=(lo, hi))``: the mean return's, within +/-E). ``episodes`` is the
            cap. The decision reads only the contiguous prefix of indices, never whichever
            episodes finished first; episodes past the stop are cancelled (or, finished,
            left out), so the result holds exactly the first n episodes of the unstopped run.
            A results file then holds those n alone (each written once every lower index is
            in), and its header records the rule, so a resumed file stops on the same rule
            (``RunResult.stop``; docs/semantics.md, "Stopping on precision"). Not with
            ``indices=`` or ``cluster=``.

    Returns:
        The ``RunResult``: M episodes sorted by index (with ``results_path``, every episode in
        the file), wasted steps and telemetry.

    Raises:
        RlmeshError: a typed error (model output, env, hook, timeout, spec); it carries the
            episodes completed before it as ``err.partial_result``.
    """
    check_argument_names(arguments, "rlmesh.run")
    return await evaluate(model, env, run_settings(**arguments), hooks=hooks)


# rlmesh.run's keyword arguments are listed once, by run_settings: its signature is arun's.
arun.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *list(inspect.signature(arun).parameters.values())[:3],
        *inspect.signature(run_settings).parameters.values(),
    ],
    return_annotation=inspect.signature(arun).return_annotation,
)
run.__signature__ = arun.__signature__  # type: ignore[attr-defined]


async def evaluate(
    model: Any,
    env: Any,
    settings: RunSettings,
    *,
    hooks: Any = None,
    view: LiveView | None = None,
) -> RunResult:
    """Run the evaluation ``settings`` describe: on this process, or with a placement on a
    Ray cluster (``rlmesh.cluster``, imported only by runs that ask for it).

    Example:
        >>> from rlmesh.settings import run_settings
        >>> result = run_to_end("run", lambda: evaluate(
        ...     lambda obs: 0, "CartPole-v1", run_settings(episodes=2)))
        >>> len(result.episodes)
        2
    """
    # The live view, if asked for (``view``: a suite's, opened once for all its tasks): its
    # page binds now, so a port in use fails before any env is made.
    if view is None and settings.output.view is not None:
        view = open_view(settings.output.view, **view_options(settings))
    hooks = hooks_with(view, hooks)
    if settings.placement is not None:
        from .cluster import run_on_cluster

        return await run_on_cluster(model, env, settings, hooks=hooks)
    success_rule = rule_for(settings.success, env)
    results = settings.open_results(env, model, success_rule)
    try:
        run = EvaluationRun(
            model,
            env,
            settings,
            hooks=hooks,
            results=results,
            success_rule=success_rule,
            view=view,
        )
    except BaseException:
        if results is not None:
            results.close()  # releases the file's writer lock
        raise
    return await run.execute()


def view_options(settings: RunSettings) -> dict[str, Any]:
    """What a run's live view takes from its settings: the image key its videos are recorded
    from (the lanes' frames then come from it too), and the results file's directory, which
    the videos' links are relative to."""
    video, path = settings.video, settings.output.results_path
    if not isinstance(path, (str, os.PathLike)):  # none, or a suite task's part of its file
        path = None
    return {
        "video_key": None if video is None else video.key,
        "videos_from": None if path is None else os.path.dirname(os.path.abspath(path)),
    }
