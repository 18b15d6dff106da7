"""What ``view=`` asks for, parsed once: ``ViewSpec`` and ``parse_view``.

The forms: ``"http"`` (the page on 127.0.0.1, on a free port), ``"http:PORT"``,
``"http:HOST:PORT"`` (another interface, only when named), ``"terminal"`` (a live table on
stdout) and ``"both"`` / ``"both:PORT"`` (the page and the table). None means no view.

Example:
    >>> parse_view("http:9000")
    ViewSpec(http=True, host='127.0.0.1', port=9000, terminal=False)
    >>> parse_view("both").terminal, parse_view("terminal").http
    (True, False)
    >>> try:
    ...     parse_view("html")
    ... except ViewError as exc:
    ...     print(str(exc).split(":")[0])
    view='html' is not a view
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RlmeshError

LOOPBACK = "127.0.0.1"
FORMS = "'http', 'http:PORT', 'http:HOST:PORT', 'terminal', 'both' or 'both:PORT'"


class ViewError(RlmeshError, ValueError):
    """A ``view=`` value that is no view, or a page that cannot be served (its port is in
    use): the message names the value and what to pass instead."""


@dataclass(frozen=True)
class ViewSpec:
    """A parsed ``view=``: serve the page (``http``) on ``host:port`` (port 0: any free
    one), and show the live table in the terminal (``terminal``)."""

    http: bool = False
    host: str = LOOPBACK
    port: int = 0
    terminal: bool = False


def parse_view(value: str | ViewSpec | None) -> ViewSpec | None:
    """``view=`` as a ``ViewSpec`` (None for no view); a ``ViewError`` for anything else.

    Example:
        >>> parse_view("http:0.0.0.0:8080")
        ViewSpec(http=True, host='0.0.0.0', port=8080, terminal=False)
        >>> parse_view(None) is None
        True
    """
    if value is None or isinstance(value, ViewSpec):
        return value
    if not isinstance(value, str):
        raise ViewError(f"view= takes a str, got {type(value).__name__}: expected {FORMS}")
    kind, _, rest = value.strip().partition(":")
    if kind == "terminal" and not rest:
        return ViewSpec(terminal=True)
    if kind not in ("http", "both"):
        raise ViewError(f"view={value!r} is not a view: expected {FORMS}")
    host, port = LOOPBACK, 0
    if rest:
        named_host, colon, port_text = rest.rpartition(":")
        if colon:
            host = named_host.strip("[]")
            if not host:
                raise ViewError(f"view={value!r} names an empty host: expected {FORMS}")
        port = _port(value, port_text)
    return ViewSpec(http=True, host=host, port=port, terminal=kind == "both")


def _port(value: str, text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ViewError(
            f"view={value!r}: {text!r} is not a port: expected a number in 0..65535 (0: any "
            f"free port)"
        )
    return port
