"""The worker side of process lanes: one process owning a fixed set of lanes.

A worker builds its envs, reports their spaces, maps the shared buffer and then serves the
driver's requests one at a time, in order, until it is told to close or its pipe closes (the
driver went away). Requests and replies are small tuples through the pipe:

- ``("reset", lanes, seeds, options)`` -> ``("ok", infos, loose, ns, failed)``
- ``("step", lanes, actions or None, every_info)`` -> ``("ok", infos, loose, ns, failed)``:
  actions None means they are in the buffer; without ``every_info`` a lane whose episode goes
  on answers an empty info; ``ns`` is the time spent inside the envs' ``step`` calls;
  ``failed`` maps each lane whose env raised to ``(message, traceback)`` (its info and loose
  entries are None), the other lanes having gone on;
- ``("render", lanes)`` -> ``("ok", frames, loose, ns, {})``: what each lane's ``render()``
  returns (the frames travel pickled; only lanes being recorded are rendered);
- ``("rebuild", lanes)`` -> ``("ok",)``: the lanes' envs closed and built anew;
- ``("replay", [(lane, seed, options, actions), ...])`` -> ``("ok",)``: a restarted worker
  brings its lanes back to where the dead one left them;
- ``("close",)`` -> ``("closed", error or None)``, then the process exits.

An env that raises is reported in ``failed`` (a request that fails as a whole, such as a
reply that does not pickle, is answered ``("error", lane, method, message, traceback)``) and
the worker goes on serving: what happens next is the driver's call, as with in-process lanes.

The worker ignores SIGINT: a Ctrl-C in the terminal reaches the whole process group, and the
driver, not each worker, decides how the run ends (it closes the workers).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
import traceback
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import gymnasium

from ...adapters import env_tags_metadata
from ...utils import env_label
from ..base import declares_trial_index
from ..build import build_envs
from .layout import SharedLayout

BELL_CHECK_S = 0.5
"""How often a worker waiting for its bell looks whether the driver is gone."""
POLL_S = 0.002
"""How long a worker that has answered polls its bell before it sleeps on it.

Waking a process that sleeps costs the waker an interrupt to another CPU: on a virtual
machine about 0.15 ms of its CPU, and as long again before the sleeper runs. The driver's next
request usually comes within a millisecond (the model's call and the round's bookkeeping), and
a ring that finds the worker polling costs nothing. A polling worker yields its CPU between
polls, so a driver or model that needs that CPU runs first."""
yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # sched_yield: not on Windows


def build_env_factory(source: tuple[str, Any, Any]) -> Any:
    """The zero-argument env factory a worker calls once per lane, from what the driver sent:
    ``("id", env_id, kwargs)`` or ``("factory", pickled factory, None)``."""
    kind, payload, kwargs = source
    if kind == "id":
        return lambda: gymnasium.make(payload, **kwargs)
    return pickle.loads(payload)


def serve(
    conn: Connection, bell: Any, source: tuple[str, Any, Any], lanes: list[int], worker: int
) -> None:
    """The worker's main function: build ``lanes``' envs from ``source``, then serve ``conn``,
    reading a request once ``bell`` (a semaphore the driver releases per request) rings."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    envs: dict[int, gymnasium.Env[Any, Any]] = {}
    try:
        try:
            envs = _build(source, lanes)
        except Exception as err:
            conn.send(("failed", _describe(err), traceback.format_exc()))
            return
        first = envs[lanes[0]]
        spaces = [(lane, env.observation_space, env.action_space) for lane, env in envs.items()]
        conn.send(
            (
                "ready",
                {
                    "name": env_label(first),
                    "spaces": spaces,
                    "spec": _picklable_spec(first.spec),
                    "accepts_trial_index": declares_trial_index(first),
                    "metadata": env_tags_metadata(getattr(first, "metadata", None)),
                    "render_mode": first.render_mode,
                    "render_fps": (first.metadata or {}).get("render_fps"),
                },
            )
        )
        message = conn.recv()
        if message[0] != "attach":
            return
        _, memory_name, layout = message
        memory = shared_memory.SharedMemory(name=memory_name)
        try:
            _Server(conn, bell, envs, layout.views(memory.buf), layout, source).run()
        finally:
            with contextlib.suppress(BufferError):  # a view still referenced: it goes with us
                memory.close()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the driver is gone: nothing left to answer
    finally:
        for env in envs.values():
            with contextlib.suppress(Exception):  # the driver is gone: no one to report to
                env.close()


def _build(source: tuple[str, Any, Any], lanes: list[int]) -> dict[int, gymnasium.Env[Any, Any]]:
    kind, payload, _ = source
    what = f"gymnasium.make({payload!r})" if kind == "id" else "the env factory"
    try:
        factory = build_env_factory(source)
    except Exception as err:
        raise TypeError(
            f"the env factory could not be loaded in the worker process ({_describe(err)}): "
            f"define it at module level in a module the workers can import (not in an "
            f"interactive session), or pass a Gymnasium id"
        ) from err
    expected = (
        "env= as a str must be an id registered with Gymnasium in the worker processes too: "
        "use 'module:EnvId' so each worker imports the module that registers it"
        if kind == "id"
        else "env= as a callable must build a gymnasium.Env when called with no arguments"
    )
    envs = build_envs(factory, len(lanes), what, expected, first_lane=lanes[0])
    return dict(zip(lanes, envs, strict=True))


def _picklable_spec(spec: Any) -> Any:
    """The env's spec if it pickles; else the spec without what does not (its entry point and
    kwargs), keeping the id and ``reward_threshold`` the driver reads."""
    if spec is None:
        return None
    try:
        pickle.dumps(spec)
        return spec
    except Exception:
        from dataclasses import replace

        return replace(spec, entry_point=str(spec.entry_point), kwargs={})


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class _Server:
    """The request loop of a worker whose envs are built and whose buffer is mapped."""

    def __init__(
        self,
        conn: Connection,
        bell: Any,
        envs: dict[int, gymnasium.Env[Any, Any]],
        views: Any,
        layout: SharedLayout,
        source: tuple[str, Any, Any],
    ) -> None:
        self.conn = conn
        self.bell = bell
        self.envs = envs
        self.views = views
        self.layout = layout
        self.source = source

    def run(self) -> None:
        conn = self.conn
        conn.send(("attached",))
        handlers = {
            "step": self.step,
            "reset": self.reset,
            "render": self.render,
            "replay": self.replay,
            "rebuild": self.rebuild,
        }
        while True:
            self._await_request()
            message = conn.recv()
            kind = message[0]
            if kind == "close":
                conn.send(("closed", self.close()))
                return
            reply = handlers[kind](*message[1:])
            try:
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as err:  # what the env returned does not pickle
                data = pickle.dumps(
                    (
                        "error",
                        message[1][0] if message[1] else None,
                        kind,
                        f"what it returned cannot be pickled to reach the driver "
                        f"({_describe(err)}): process lanes send infos, and observation leaves "
                        f"that do not fit the space's slots, through a pipe",
                        traceback.format_exc(),
                    )
                )
            conn.send_bytes(data)

    def _await_request(self) -> None:
        """Wait for the bell: poll it for ``POLL_S``, then sleep on it, every ``BELL_CHECK_S``
        looking at the pipe, so that a driver that died (its end closed) or a request whose
        ring is still on its way is not missed. The pipe is the source of truth: a ring more or
        less only changes how the worker wakes."""
        bell = self.bell
        polling_until = time.perf_counter() + POLL_S
        while time.perf_counter() < polling_until:
            if bell.acquire(False):
                return
            yield_cpu()
        while not bell.acquire(timeout=BELL_CHECK_S):
            if self.conn.poll():
                return

    def step(
        self, lanes: list[int], actions: list[Any] | None, every_info: bool = True
    ) -> tuple[Any, ...]:
        """Step ``lanes``; without ``every_info``, a lane whose episode goes on answers an empty
        info (only final infos travel)."""
        views, envs = self.views, self.envs
        infos, loose = [], []
        failed: dict[int, tuple[str, str]] = {}
        spent_ns = 0
        for k, lane in enumerate(lanes):
            action = views.take_action(lane) if actions is None else actions[k]
            started = time.perf_counter_ns()
            try:
                observation, reward, terminated, truncated, info = envs[lane].step(action)
                spent_ns += time.perf_counter_ns() - started
                loose.append(views.put_observation(lane, observation))
            except Exception as err:
                failed[lane] = (_describe(err), traceback.format_exc())
                infos.append(None)
                loose.append(None)
                continue
            views.rewards[lane] = reward
            views.terminated[lane] = terminated
            views.truncated[lane] = truncated
            infos.append(info if every_info or terminated or truncated else {})
        return ("ok", infos, loose, spent_ns, failed)

    def reset(
        self, lanes: list[int], seeds: list[int | None], options: list[dict[str, Any] | None]
    ) -> tuple[Any, ...]:
        infos, loose = [], []
        failed: dict[int, tuple[str, str]] = {}
        started = time.perf_counter_ns()
        for lane, seed, option in zip(lanes, seeds, options, strict=True):
            try:
                observation, info = self.envs[lane].reset(seed=seed, options=option)
                loose.append(self.views.put_observation(lane, observation))
            except Exception as err:
                failed[lane] = (_describe(err), traceback.format_exc())
                infos.append(None)
                loose.append(None)
                continue
            infos.append(info)
        return ("ok", infos, loose, time.perf_counter_ns() - started, failed)

    def rebuild(self, lanes: list[int]) -> tuple[Any, ...]:
        factory = build_env_factory(self.source)
        lane = None
        try:
            for lane in lanes:
                old = self.envs[lane]
                # The env failed, so its close may fail too; the new env does not need it.
                with contextlib.suppress(Exception):
                    old.close()
                env = factory()
                if not isinstance(env, gymnasium.Env):
                    raise TypeError(f"the env factory returned {type(env).__name__}")
                if (env.observation_space, env.action_space) != (
                    old.observation_space,
                    old.action_space,
                ):
                    env.close()
                    raise ValueError(
                        f"the rebuilt env has observation space {env.observation_space} and "
                        f"action space {env.action_space}, the lane had {old.observation_space} "
                        f"and {old.action_space}"
                    )
                self.envs[lane] = env
        except Exception as err:
            return ("error", lane, "rebuild", _describe(err), traceback.format_exc())
        return ("ok",)

    def render(self, lanes: list[int]) -> tuple[Any, ...]:
        frames = []
        lane = None
        started = time.perf_counter_ns()
        try:
            for lane in lanes:
                frames.append(self.envs[lane].render())
        except Exception as err:
            return ("error", lane, "render", _describe(err), traceback.format_exc())
        return ("ok", frames, [None] * len(frames), time.perf_counter_ns() - started, {})

    def replay(self, episodes: list[tuple[int, int | None, Any, list[Any]]]) -> tuple[Any, ...]:
        lane = None
        method = "reset"
        try:
            for lane, seed, option, actions in episodes:
                method = "reset"
                env = self.envs[lane]
                env.reset(seed=seed, options=option)
                method = "step"
                for action in actions:
                    env.step(action)
        except Exception as err:
            return ("error", lane, f"{method} (replaying its episode)", _describe(err), "")
        return ("ok",)

    def close(self) -> str | None:
        failure = None
        for lane, env in self.envs.items():
            try:
                env.close()
            except Exception as err:
                failure = failure or f"lane {lane}: close() raised {_describe(err)}"
        self.envs = {}
        return failure
