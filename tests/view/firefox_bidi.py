"""A small WebDriver BiDi client for Firefox, for the tests only: no geckodriver (Debian has
no package of it, and nothing is downloaded at run time), Firefox's own remote agent instead.

``launch`` starts Debian's ``firefox-esr`` headless in a fresh profile of its own with
``--remote-debugging-port=0`` (Firefox picks a free port and prints
``WebDriver BiDi listening on ws://...`` to stderr), connects to ``ws://.../session`` with the
``websockets`` package, opens a session, subscribes to ``log.entryAdded`` (every console
message and uncaught error of the page) and takes the top-level browsing context. Firefox and
its profile are removed on the way out, also when the test fails: the browser is asked to
close, and its whole process group is killed if it has not within a few seconds.

Every wait is bounded: starting, each command (``COMMAND_TIMEOUT_S``). ``Firefox`` is a
``viewing.Page``: the live view's page checks drive it.
Messages are JSON: ``{"id", "method", "params"}`` out; ``{"type": "success" | "error", "id"}``
or ``{"type": "event", "method", "params"}`` back.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0
VIEWPORT = {"width": 1280, "height": 2400}
_LISTENING = re.compile(r"WebDriver BiDi listening on (ws://\S+)")

# Written to the fresh profile's user.js. Firefox's remote agent already sets its recommended
# automation prefs (updates, first-run pages, telemetry off); these add the rest: no
# background fetches, and any fetch from outside the machine goes to a proxy that refuses it,
# so a page that tried one would fail to load it (localhost is never proxied).
PREFS: dict[str, Any] = {
    "app.update.disabledForTesting": True,
    "app.normandy.enabled": False,
    "messaging-system.rsexperimentloader.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.safebrowsing.update.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.allow_hijacking_localhost": False,
    "media.autoplay.default": 0,
}


class BidiError(RuntimeError):
    """A command Firefox answered with an error, or a script that threw."""


class Firefox:
    """One BiDi session on a running Firefox and its top-level browsing context.

    ``log`` holds every ``log.entryAdded`` event's params seen so far (events arrive on the
    socket between command answers, so they are read while commands wait).
    """

    def __init__(self, socket: Any, context: str) -> None:
        self.socket = socket
        self.context = context
        self.log: list[dict[str, Any]] = []
        self._next_id = 0

    @classmethod
    def open(cls, socket: Any) -> Firefox:
        """A new session on ``socket``, subscribed to the log, on the first top-level tab."""
        browser = cls(socket, "")
        browser.command("session.new", capabilities={})
        browser.command("session.subscribe", events=["log.entryAdded"])
        contexts = browser.command("browsingContext.getTree", maxDepth=0)["contexts"]
        if not contexts:
            raise BidiError("browsingContext.getTree: Firefox has no top-level context")
        browser.context = contexts[0]["context"]
        browser.command("browsingContext.setViewport", context=browser.context, viewport=VIEWPORT)
        return browser

    def command(self, method: str, timeout: float = COMMAND_TIMEOUT_S, **params: Any) -> Any:
        """Send ``method`` with ``params``; its result, read within ``timeout`` seconds."""
        self._next_id += 1
        ident = self._next_id
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{method}: Firefox did not answer within {timeout} s")
            try:
                message = json.loads(self.socket.recv(timeout=remaining))
            except TimeoutError:
                continue  # the deadline check above reports it
            if message.get("type") == "event":
                if message.get("method") == "log.entryAdded":
                    self.log.append(message["params"])
                continue
            if message.get("id") != ident:
                continue  # an answer to a command abandoned after its timeout
            if message.get("type") == "error":
                raise BidiError(f"{method}: {message.get('error')}: {message.get('message')}")
            return message["result"]

    def navigate(self, url: str) -> None:
        """Load ``url`` in the tab, returning once its ``load`` event fired."""
        self.command("browsingContext.navigate", context=self.context, url=url, wait="complete")

    def reload(self) -> None:
        """Reload the tab, returning once the page's ``load`` event fired."""
        self.command("browsingContext.reload", context=self.context, wait="complete")

    def evaluate(self, expression: str) -> Any:
        """The value of the JavaScript ``expression`` in the page, through JSON."""
        answer = self.command(
            "script.evaluate",
            expression=f"JSON.stringify({expression})",
            target={"context": self.context},
            awaitPromise=False,
        )
        if answer["type"] == "exception":
            details = answer["exceptionDetails"]
            raise BidiError(f"the page's script threw: {details.get('text')} in {expression!r}")
        value = answer["result"]
        return None if value["type"] == "undefined" else json.loads(value["value"])

    def screenshot(self) -> bytes:
        """The tab's viewport as PNG bytes."""
        answer = self.command("browsingContext.captureScreenshot", context=self.context)
        return base64.b64decode(answer["data"])

    def console_errors(self) -> list[str]:
        """The log entries of level ``error`` so far (console errors and uncaught exceptions),
        described, after a round trip, so that every entry logged before this call was read."""
        self.evaluate("0")
        errors = [entry for entry in self.log if entry.get("level") == "error"]
        return [f"{entry.get('type')}: {entry.get('text')}" for entry in errors]


def _listening(process: subprocess.Popen, stderr: Path) -> str:
    """The BiDi WebSocket's address once Firefox printed it, within ``START_TIMEOUT_S``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = stderr.read_text(errors="replace")
        found = _LISTENING.search(text)
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise RuntimeError(
                f"Firefox exited with {process.returncode} before listening; stderr: {text[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Firefox did not listen within {START_TIMEOUT_S} s; stderr: {text[-2000:]}"
            )
        time.sleep(0.1)


def _close(firefox: Firefox) -> bool:
    """Ask Firefox to close; whether it is closing (it may drop the socket before answering)."""
    try:
        firefox.command("browser.close", timeout=CLOSE_TIMEOUT_S)
    except TimeoutError:
        return False  # hung: killed below without waiting
    except Exception:
        return True
    return True


def _stop(process: subprocess.Popen, grace: float) -> None:
    """Firefox's whole process group ended (its content processes too) after at most
    ``grace`` seconds to exit by itself, and reaped."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace)
    # The group (started as a session of its own) outlives its leader while a content process
    # is left; it cannot be another's while any member remains.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(CLOSE_TIMEOUT_S)


@contextlib.contextmanager
def launch(binary: str) -> Iterator[Firefox]:
    """A headless ``binary`` (Firefox) in a fresh profile, driven over BiDi; closed, killed if
    need be, and its profile removed on the way out.

    Example (not run: it needs Firefox):
        with launch("/usr/bin/firefox-esr") as firefox:
            firefox.navigate("data:text/html,<p>hi</p>")
            assert firefox.evaluate("document.body.textContent") == "hi"
    """
    from websockets.sync.client import connect  # the openpi extra; the test skips without it

    home = Path(tempfile.mkdtemp(prefix="rlmesh-firefox-"))
    try:
        profile = home / "profile"
        profile.mkdir()
        (profile / "user.js").write_text(
            "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in PREFS.items())
        )
        stderr = home / "stderr.log"
        command = [binary, "-headless", "-no-remote", "-profile", str(profile)]
        with open(stderr, "wb") as errors:
            process = subprocess.Popen(
                [*command, "--remote-debugging-port=0", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,  # one process group, to end all of it
                env={**os.environ, "MOZ_CRASHREPORTER_DISABLE": "1"},
            )
        closing = False
        try:
            address = _listening(process, stderr)
            with connect(
                address + "/session", open_timeout=START_TIMEOUT_S, close_timeout=1.0,
                max_size=None,
            ) as socket:  # fmt: skip
                firefox = Firefox.open(socket)
                try:
                    yield firefox
                finally:
                    closing = _close(firefox)
        finally:
            _stop(process, grace=CLOSE_TIMEOUT_S if closing else 0.0)
    finally:
        shutil.rmtree(home, ignore_errors=True)
