"""What a sandbox's virtual environment must hold: rlmesh's own runtime requirements, and the
requirements of an rlmesh extra (a built-in benchmark's simulator, say).

The server side of a sandbox runs this very rlmesh, from its package directory (read-only, on
the sandboxed interpreter's path; ``server_process.py``); so the environment needs only the
packages rlmesh imports to serve: its dependencies and its ``remote`` extra (gRPC and
protobuf). They are read from rlmesh's own project file when rlmesh runs from a checkout
(``pyproject.toml`` beside ``python/rlmesh``, which an editable install's metadata may lag
behind), else from the installed distribution's metadata. Markers stay on the requirements
(``tomli; python_version < '3.11'``): the installer evaluates them for the sandbox's Python.

Example:
    >>> any(line.startswith("grpcio") for line in runtime_requirements())
    True
    >>> extra_requirements("pusht")
    ['gym-pusht>=0.1.8,<0.2']
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, a dependency of rlmesh before 3.11
    import tomli as tomllib

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""The directory of the ``rlmesh`` package this process runs (what a sandbox puts on its
interpreter's path)."""

SERVER_EXTRAS = ("remote",)
"""The extras the server side of a sandbox needs beside rlmesh's dependencies."""

_EXTRA_MARKER = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")
_SELF = re.compile(r"^rlmesh\s*\[([^\]]+)\]\s*$")


def runtime_requirements() -> list[str]:
    """rlmesh's dependencies and those of ``SERVER_EXTRAS``: what the server side of a sandbox
    imports. Sorted, without duplicates."""
    project = _project()
    found = list(project["dependencies"])
    for extra in SERVER_EXTRAS:
        found += _expand(extra, project["extras"], ())
    return sorted(dict.fromkeys(found))


def extra_requirements(extra: str) -> list[str]:
    """The requirements of rlmesh's extra ``extra`` (its references to other extras, such as
    ``rlmesh[openpi]``, expanded), in the project's order.

    Raises:
        ValueError: rlmesh has no such extra; the message lists those it has.
    """
    extras = _project()["extras"]
    if extra not in extras:
        raise ValueError(
            f"rlmesh has no extra {extra!r}; its extras are {', '.join(sorted(extras))}"
        )
    return list(dict.fromkeys(_expand(extra, extras, ())))


def _expand(extra: str, extras: dict[str, list[str]], seen: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for line in extras.get(extra, ()):
        nested = _SELF.match(line)
        if nested is None:
            found.append(line)
            continue
        for name in nested.group(1).split(","):
            name = name.strip()
            if name not in seen and name != extra:
                found += _expand(name, extras, (*seen, extra))
    return found


@cache
def _project() -> dict[str, Any]:
    """``{"dependencies": [...], "extras": {name: [...]}}`` of the rlmesh that runs here."""
    pyproject = PACKAGE_DIR.parent.parent / "pyproject.toml"
    if pyproject.is_file():
        data = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        if data.get("name") == "rlmesh":
            return {
                "dependencies": list(data.get("dependencies", [])),
                "extras": {k: list(v) for k, v in data.get("optional-dependencies", {}).items()},
            }
    try:
        lines = importlib.metadata.requires("rlmesh") or []
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"cannot tell which packages rlmesh needs: no pyproject.toml beside {PACKAGE_DIR} "
            f"and no installed rlmesh distribution; install rlmesh with pip"
        ) from None
    return _from_metadata(lines)


def _from_metadata(lines: list[str]) -> dict[str, Any]:
    """Requires-Dist lines as the project file's two tables: a line whose marker names an
    extra goes to that extra, its marker without the extra clause."""
    dependencies: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in lines:
        requirement, _, marker = (part.strip() for part in line.partition(";"))
        match = _EXTRA_MARKER.search(marker)
        if match is None:
            dependencies.append(line.strip())
            continue
        rest = _EXTRA_MARKER.sub("", marker)
        rest = re.sub(r"^\s*(and|or)\s+|\s+(and|or)\s*$", "", rest.strip()).strip()
        extras.setdefault(match.group(1), []).append(
            f"{requirement}; {rest}" if rest else requirement
        )
    return {"dependencies": dependencies, "extras": extras}


__all__ = ["PACKAGE_DIR", "SERVER_EXTRAS", "extra_requirements", "runtime_requirements"]
