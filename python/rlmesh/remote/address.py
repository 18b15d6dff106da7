"""Where a server listens and a client dials: the address forms rlmesh accepts.

- ``tcp://host:port`` or ``host:port``: TCP; port 0 (when serving) picks a free port;
- ``unix:///absolute/path`` (or ``unix:relative/path``): a unix socket.

A bare ``host:port`` is told apart from a Gymnasium id (``"CartPole-v1"``, ``"ale_py:Pong-v5"``)
by its all-digit port, so ``rlmesh.run(model, "127.0.0.1:50051")`` drives a served env.

Example:
    >>> parse_address("127.0.0.1:0")
    Address(scheme='tcp', host='127.0.0.1', port=0, path=None)
    >>> parse_address("unix:///tmp/env.sock").target
    'unix:///tmp/env.sock'
    >>> is_address("CartPole-v1"), is_address("tcp://10.0.0.5:7000"), is_address("localhost:7000")
    (False, True, True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Address:
    """One parsed address: ``scheme`` ``"tcp"`` (with ``host`` and ``port``) or ``"unix"``
    (with ``path``)."""

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


__all__ = ["LOOPBACK", "Address", "is_address", "parse_address"]
