"""The openpi benchmarks' workload, and openpi's reference server serving it.

The workload (``benches/test_bench_openpi.py``): a request of a 224x224x3 uint8 image and 8
float32 state values, answered by a 10x7 float32 chunk computed from the state; the costed
variant sleeps ``CALL_S`` per model call plus ``ROW_S`` per row, as a batched GPU policy
roughly does. The reference server is ``openpi-server`` on PyPI (openpi's
``WebsocketPolicyServer``) in a virtual environment of its own (``openpi_server_python``,
cached under ``$RLMESH_OPENPI_SERVER_VENV``, default ``~/.cache/rlmesh-tests/peer-openpi-server``,
the tests' venv). This file is also that venv's script (``python openpi_peer.py serve
chunk|costed``), so it imports nothing of rlmesh.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import numpy as np

IMAGE_SHAPE = (224, 224, 3)
STATE_SIZE = 8
CHUNK_SHAPE = (10, 7)
CALL_S, ROW_S = 0.002, 0.0001  # the costed model: 2 ms a call, 0.1 ms a row
HERE = Path(__file__).resolve()
# openpi-server declares openpi-client, which pins numpy<2; both install without their declared
# dependencies, beside what they import (msgpack, websockets, typing_extensions, numpy).
INSTALLS = [
    ["--no-deps", "openpi-server", "openpi-client"],
    ["msgpack", "websockets", "typing_extensions", "numpy"],
]
_ADDRESS = re.compile(r"(ws://\S+)")


def observation(seed: int = 0) -> dict[str, np.ndarray]:
    """One request's observation: ``image`` (224x224x3 uint8) and ``state`` (8 float32)."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, IMAGE_SHAPE, dtype=np.uint8),
        "state": rng.random(STATE_SIZE, dtype=np.float32),
    }


def chunks(states: np.ndarray) -> np.ndarray:
    """``[N, 10, 7]`` float32 chunks from ``[N, 8]`` states: cheap, and each row its own."""
    steps = np.arange(CHUNK_SHAPE[0], dtype=np.float32)[None, :, None] * np.float32(0.01)
    return states[:, None, : CHUNK_SHAPE[1]] + steps


def cost(rows: int) -> None:
    """The costed model's time for one call of ``rows`` rows."""
    time.sleep(CALL_S + ROW_S * rows)


# ---------------------------------------------------------------------------------- the venv


def openpi_server_venv_dir() -> Path:
    default = Path.home() / ".cache" / "rlmesh-tests" / "peer-openpi-server"
    return Path(os.environ.get("RLMESH_OPENPI_SERVER_VENV", default))


def openpi_server_python() -> str:
    """The Python of a venv holding ``openpi-server``, made on first use and kept.

    Raises:
        RuntimeError: pip could not install it (the message names the step and pip's error).
    """
    root = openpi_server_venv_dir()
    python, marker = root / "bin" / "python", root / ".installed"
    if marker.exists() and python.exists():
        return str(python)
    root.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    for step in INSTALLS:
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *step],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if install.returncode != 0:
            raise RuntimeError(
                f"cannot install openpi's server ({' '.join(step)}) into {root}: "
                f"{install.stderr.strip().splitlines()[-1:]}"
            )
    marker.write_text("openpi's server")
    return str(python)


@contextlib.contextmanager
def reference_server(kind: str, ready_timeout: float = 60.0) -> Iterator[str]:
    """openpi-server serving the ``chunk`` or ``costed`` policy in its own process (and
    session) until the block ends; yields its ``ws://`` address."""
    process = subprocess.Popen(
        [openpi_server_python(), str(HERE), "serve", kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": ""},  # the peer's packages, not this checkout's
    )
    try:
        yield _read_address(process, ready_timeout)
    finally:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        process.stdout.close()


def _read_address(process: subprocess.Popen[str], timeout: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and selector.select(deadline - time.monotonic()):
            line = process.stdout.readline()
            if not line:
                break
            match = _ADDRESS.search(line)
            if match:
                return match.group(1)
    finally:
        selector.close()
    raise RuntimeError(
        f"openpi-server ({' '.join(process.args)}) printed no address in {timeout} s"
    )


# ---------------------------------------------------------------------------------- the peer's side


def _serve(kind: str) -> None:
    """Serve ``kind`` with openpi's ``WebsocketPolicyServer`` on a free loopback port."""
    from openpi_client import base_policy
    from openpi_server import websocket_policy_server as reference

    class Policy(base_policy.BasePolicy):
        def infer(self, obs: dict) -> dict:
            if kind == "costed":
                cost(1)  # the reference server calls the policy once per request
            return {"actions": chunks(obs["state"][None])[0]}

    real_serve = reference._server.serve

    class AnnouncedServe:
        """websockets' ``serve``, printing the port it bound (the reference server binds port
        0 without saying which port it got)."""

        def __init__(self, *args, **kwargs) -> None:
            self._serving = real_serve(*args, **kwargs)

        async def __aenter__(self):
            server = await self._serving.__aenter__()
            host, port = server.sockets[0].getsockname()[:2]
            print(f"openpi-server at ws://{host}:{port}", flush=True)
            return server

        async def __aexit__(self, *exc_info):
            return await self._serving.__aexit__(*exc_info)

    reference._server = type("Shim", (), {"serve": AnnouncedServe})
    server = reference.WebsocketPolicyServer(Policy(), host="127.0.0.1", port=0)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve" or sys.argv[2] not in ("chunk", "costed"):
        sys.exit("usage: python openpi_peer.py serve chunk|costed")
    _serve(sys.argv[2])
