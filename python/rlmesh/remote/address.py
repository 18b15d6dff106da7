"""Where a server listens and a client dials: the address forms rlmesh accepts.

- ``tcp://host:port`` or ``host:port``: TCP; port 0 (when serving) picks a free port;
- ``unix:///absolute/path`` (or ``unix:relative/path``): a unix socket;
- ``openpi://host:port``: a policy server speaking openpi's WebSocket protocol (not
  rlmesh-wire-v1), for ``rlmesh.remote.OpenPIModel`` and ``rlmesh eval openpi://...``;
  ``is_address`` leaves it out, since no env is served over it;
- ``vlaeval://host:port``: a model server speaking vla-eval's WebSocket protocol, for
  ``rlmesh.remote.VlaEvalModel`` and ``rlmesh eval vlaeval://...``; left out of ``is_address``
  too.

A bare ``host:port`` is told apart from a Gymnasium id (``"CartPole-v1"``, ``"ale_py:Pong-v5"``)
by its all-digit port, so ``rlmesh.run(model, "127.0.0.1:50051")`` drives a served env.

Example:
    >>> parse_address("127.0.0.1:0")
    Address(scheme='tcp', host='127.0.0.1', port=0, path=None)
    >>> parse_address("unix:///tmp/env.sock").target
    'unix:///tmp/env.sock'
    >>> is_address("CartPole-v1"), is_address("tcp://10.0.0.5:7000"), is_address("localhost:7000")
    (False, True, True)
    >>> str(parse_openpi_address("openpi://gpu-box:8000")), is_openpi_address("gpu-box:8000")
    ('openpi://gpu-box:8000', False)
    >>> str(parse_vlaeval_address("ws://gpu-box:8000")), is_vlaeval_address("vlaeval://h:1")
    ('vlaeval://gpu-box:8000', True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")

LOOPBACK = "127.0.0.1"
OPENPI_SCHEME = "openpi://"
VLAEVAL_SCHEME = "vlaeval://"


@dataclass(frozen=True)
class Address:
    """One parsed address: ``scheme`` ``"tcp"``, ``"openpi"`` or ``"vlaeval"`` (with ``host``
    and ``port``), or ``"unix"`` (with ``path``)."""

    scheme: str
    host: str | None = None
    port: int | None = None
    path: str | None = None

    @property
    def target(self) -> str:
        """The address in gRPC's form, for ``grpc.insecure_channel`` and ``add_insecure_port``."""
        if self.scheme == "unix":
            return f"unix://{self.path}" if self.path.startswith("/") else f"unix:{self.path}"
        return f"{self.host}:{self.port}"

    def with_port(self, port: int) -> Address:
        """The same TCP address on ``port`` (the one a server bound for port 0)."""
        return Address("tcp", self.host, port)

    def __str__(self) -> str:
        if self.scheme == "openpi":
            return f"{OPENPI_SCHEME}{self.host}:{self.port}"
        if self.scheme == "vlaeval":
            return f"{VLAEVAL_SCHEME}{self.host}:{self.port}"
        return self.target if self.scheme == "unix" else f"tcp://{self.host}:{self.port}"


def is_address(text: str) -> bool:
    """Whether ``text`` names a server rather than a Gymnasium id."""
    return text.startswith(("tcp://", "unix:")) or _HOST_PORT.match(text) is not None


def parse_address(text: str) -> Address:
    """The ``Address`` ``text`` names.

    Raises:
        ValueError: ``text`` is none of the forms above, or its port is out of range.
    """
    if text.startswith("unix:"):
        path = text[len("unix://") :] if text.startswith("unix://") else text[len("unix:") :]
        if not path:
            raise ValueError(
                f"address {text!r}: a unix address needs a path, e.g. unix:///tmp/x.sock"
            )
        return Address("unix", path=path)
    rest = text[len("tcp://") :] if text.startswith("tcp://") else text
    match = _HOST_PORT.match(rest)
    if match is None:
        raise ValueError(f"address {text!r} is not tcp://host:port, host:port or unix:///path")
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"address {text!r}: port {port} is out of range (0..65535)")
    return Address("tcp", match["host"], port)


def is_openpi_address(text: str) -> bool:
    """Whether ``text`` names an openpi policy server (``openpi://host:port``)."""
    return text.startswith(OPENPI_SCHEME)


def parse_openpi_address(text: str) -> Address:
    """The ``Address`` (scheme ``"openpi"``) of an openpi policy server: ``openpi://host:port``,
    or, where an openpi server is all that can be meant, ``ws://host:port`` (openpi's own
    clients' spelling) or a bare ``host:port``.

    Raises:
        ValueError: ``text`` is none of these forms, or its port is out of range.
    """
    rest = text
    for prefix in (OPENPI_SCHEME, "ws://"):
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            break
    match = _HOST_PORT.match(rest.rstrip("/"))
    if match is None:
        raise ValueError(f"address {text!r} is not openpi://host:port, ws://host:port or host:port")
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"address {text!r}: port {port} is out of range (0..65535)")
    return Address("openpi", match["host"], port)


def is_vlaeval_address(text: str) -> bool:
    """Whether ``text`` names a vla-eval model server (``vlaeval://host:port``)."""
    return text.startswith(VLAEVAL_SCHEME)


def parse_vlaeval_address(text: str) -> Address:
    """The ``Address`` (scheme ``"vlaeval"``) of a vla-eval model server:
    ``vlaeval://host:port``, or, where a vla-eval server is all that can be meant,
    ``ws://host:port`` (vla-eval's own spelling, a trailing ``/`` allowed) or a bare
    ``host:port``.

    Raises:
        ValueError: ``text`` is none of these forms, or its port is out of range.
    """
    rest = text
    for prefix in (VLAEVAL_SCHEME, "ws://"):
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            break
    match = _HOST_PORT.match(rest.rstrip("/"))
    if match is None:
        raise ValueError(
            f"address {text!r} is not vlaeval://host:port, ws://host:port or host:port"
        )
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"address {text!r}: port {port} is out of range (0..65535)")
    return Address("vlaeval", match["host"], port)


__all__ = [
    "LOOPBACK",
    "OPENPI_SCHEME",
    "VLAEVAL_SCHEME",
    "Address",
    "is_address",
    "is_openpi_address",
    "is_vlaeval_address",
    "parse_address",
    "parse_openpi_address",
    "parse_vlaeval_address",
]
