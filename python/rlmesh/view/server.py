"""The page's server: a small threaded HTTP server, on 127.0.0.1 unless another host is named.

Routes (GET only):

- ``/``: the page (``rlmesh.view.page``), self-contained;
- ``/events``: server-sent events, one ``data:`` line of the snapshot's JSON
  (``LiveState.snapshot_json``) whenever it changed, at most every ``push_every`` seconds
  (while a run is running, that often anyway: the lanes' steps move), a comment line as a
  keep-alive otherwise;
- ``/state``: the snapshot, once;
- ``/frame/<lane>``: the lane's latest frame (JPEG or PNG);
- ``/video/<id>``: a recorded episode's mp4, one the snapshot lists (nothing else on disk is
  ever served), with byte ranges for seeking.

Bounds: at most ``max_clients`` connections at once (the next one gets a 503 and is closed
without a thread); every connection's socket has a send buffer of ``SEND_BUFFER_BYTES`` and a
``write_timeout``, so a client that stops reading is dropped once those buffers are full and a
write stalls that long. A client
costs a thread and nothing queued: each update is the one shared snapshot, so a slow reader
skips versions rather than piling them up, and the run never waits for a client.

Example:
    >>> import json, urllib.request
    >>> from rlmesh.view.state import LiveState
    >>> server = ViewServer(LiveState("doc"))
    >>> with urllib.request.urlopen(server.url + "state", timeout=5) as response:
    ...     json.loads(response.read())["title"]
    'doc'
    >>> server.close()
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .page import PAGE
from .spec import LOOPBACK, ViewError
from .state import LiveState

MAX_CLIENTS = 64
"""Connections served at once; more are refused with a 503."""
PUSH_EVERY_S = 0.5
"""The least time between two updates sent to one page."""
KEEPALIVE_S = 15.0
"""A comment line this often when nothing changed, so proxies and the page see the stream."""
SEND_BUFFER_BYTES = 1 << 17
"""Each connection's socket send buffer (the kernel may double it): room for several updates
and frames, and the most a client that stopped reading holds up in this process."""
_LOOK_S = 1.0  # a stream with nothing to send looks whether its client hung up this often
WRITE_TIMEOUT_S = 10.0
"""A write to a client that stalls this long drops the client."""
_CHUNK = 1 << 16
_FRAME = re.compile(r"^/frame/(\d+)$")
_VIDEO = re.compile(r"^/video/(\d+)$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], view: ViewServer) -> None:
        self.view = view
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        view = self.view
        with view._lock:
            refused = view.connections >= view.max_clients or view.closing.is_set()
            if not refused:
                view.connections += 1
                view._sockets.add(request)
            else:
                view.refused += 1
        if refused:  # answered here, without a thread
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: 31\r\n\r\ntoo many clients of this view\r\n"
                )
            self.shutdown_request(request)
            return
        with contextlib.suppress(OSError):
            # A small send buffer: a client that stops reading stalls a write (and is dropped)
            # after this many bytes, rather than after megabytes of the kernel's autotuning.
            request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.view._lock:
                self.view.connections -= 1
                self.view._sockets.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away: nothing to report


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "rlmesh-view"

    def setup(self) -> None:
        self.timeout = self.server.view.write_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        view = self.server.view
        path = self.path.split("?", 1)[0]
        try:
            if path == "/":
                self._send(200, view.page, "text/html; charset=utf-8")
            elif path == "/events":
                self._events()
            elif path == "/state":
                self._send(200, view.state.snapshot_json(), "application/json")
            elif path == "/favicon.ico":
                self._send(204, b"", "image/x-icon")
            elif (match := _FRAME.match(path)) is not None:
                frame = view.state.frame(int(match.group(1)))
                if frame is None:
                    self._send(404, b"no frame of this lane yet", "text/plain")
                else:
                    self._send(200, frame[0], frame[1])
            elif (match := _VIDEO.match(path)) is not None:
                self._video(int(match.group(1)))
            else:
                self._send(404, b"not found", "text/plain")
        except (OSError, ValueError):  # the client went away, or stalled past the timeout
            view.dropped += 1

    def _send(
        self, status: int, body: bytes, mime: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", mime)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _events(self) -> None:
        view = self.server.view
        state = view.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        with state.watching(), view._stream():
            self.wfile.write(b"retry: 2000\n\n")
            seen, sent_at, alive_at = -1, -view.push_every, time.monotonic()
            while not view.closing.is_set():
                version = state.wait(seen, view.push_every if state.running else _LOOK_S)
                if view.closing.is_set() or self._hung_up():
                    return
                if version == seen and not state.running:
                    if time.monotonic() - alive_at < KEEPALIVE_S:
                        continue
                    self.wfile.write(b": keep-alive\n\n")
                    alive_at = time.monotonic()
                    continue
                wait = sent_at + view.push_every - time.monotonic()
                if wait > 0 and view.closing.wait(wait):
                    return
                data = state.snapshot_json()
                seen = version
                self.wfile.write(b"data: " + data + b"\n\n")
                sent_at = alive_at = time.monotonic()

    def _hung_up(self) -> bool:
        """Whether the client closed its end (a stream waiting for a change would otherwise
        learn it only at its next write)."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _video(self, video_id: int) -> None:
        path = self.server.view.state.video_path(video_id)
        if path is None:
            self._send(404, b"no such video", "text/plain")
            return
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            self._send(404, b"the video's file is gone", "text/plain")
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            start, stop = 0, size - 1
            wanted = _RANGE.match(self.headers.get("Range", "") or "")
            status = 200
            if wanted and size:
                first, last = wanted.groups()
                if first:
                    start, stop = int(first), min(int(last), size - 1) if last else size - 1
                elif last:
                    start = max(0, size - int(last))
                if start > stop or start >= size:
                    self._send(416, b"", "text/plain", {"Content-Range": f"bytes */{size}"})
                    return
                status = 206
            self.send_response(status)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(stop - start + 1))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop}/{size}")
            self.end_headers()
            handle.seek(start)
            remaining = stop - start + 1
            while remaining > 0:
                chunk = handle.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)


class ViewServer:
    """Serves the page of ``state`` on ``host:port`` (port 0: a free one) from a thread of
    its own, started at once.

    Raises:
        ViewError: the port is in use, or the host cannot be bound (the message names both
            and what to pass instead).

    Attributes:
        url: ``http://host:port/``.
        connections, streams: the connections open now, and of them the event streams.
        refused, dropped: connections refused (too many), and dropped (gone or stalled).
    """

    def __init__(
        self,
        state: LiveState,
        host: str = LOOPBACK,
        port: int = 0,
        *,
        max_clients: int = MAX_CLIENTS,
        push_every: float = PUSH_EVERY_S,
        write_timeout: float = WRITE_TIMEOUT_S,
        page: bytes = PAGE,
    ) -> None:
        self.state = state
        self.max_clients = max_clients
        self.push_every = push_every
        self.write_timeout = write_timeout
        self.page = page
        self.connections = self.streams = self.refused = self.dropped = 0
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        try:
            self._httpd = _Server((host, port), self)
        except OSError as exc:
            raise ViewError(_bind_error(host, port, exc)) from None
        self.host = host
        self.port = int(self._httpd.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"rlmesh-view-http-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @contextlib.contextmanager
    def _stream(self) -> Any:
        with self._lock:
            self.streams += 1
        try:
            yield
        finally:
            with self._lock:
                self.streams -= 1

    def stats(self) -> dict[str, int]:
        """The connections open now, the event streams among them, those refused and those
        dropped so far."""
        with self._lock:
            return {
                "connections": self.connections,
                "streams": self.streams,
                "refused": self.refused,
                "dropped": self.dropped,
            }

    def close(self) -> None:
        """Stop serving: the listening socket is closed and every open connection ended."""
        if self.closing.is_set():
            return
        self.closing.set()
        self.state.wake()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:  # a stream blocked in a write, or waiting: end it now
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"the live view cannot serve on {host}:{port}: port {port} is in use (another view "
            f"or server listens there); pass view='http' for any free port, or another port "
            f"(view='http:PORT', rlmesh watch --http PORT)"
        )
    return (
        f"the live view cannot serve on {host}:{port}: {exc.strerror or exc}; pass a host this "
        f"machine has (view='http:HOST:PORT'; the default is {LOOPBACK})"
    )
