"""``rlmesh benchmarks [NAME]``: the built-in suites, or one suite's tasks.

Each suite's row says how many tasks it has, its episodes per task and step cap (the
benchmark's standard protocol), the extra that installs it and whether it is installed here.

Example:
    >>> from rlmesh.cli import main
    >>> main(["benchmarks", "aloha"])  # doctest: +ELLIPSIS
    aloha: ALOHA, 2 tasks, ... episodes per task, step cap 400, extra 'aloha' (...)
    options (--suite-options): obs_type=...
    protocol: ...
    tasks:
      insertion
      transfer_cube
    0
"""

from __future__ import annotations

import argparse
from typing import Any

from ..benchmarks import SUITES, info
from ..results import dumps
from .exits import EXIT_OK, UsageError


def benchmarks_command(args: argparse.Namespace) -> int:
    """``rlmesh benchmarks``: every built-in suite, or with NAME that suite and its tasks."""
    if args.name is not None:
        try:
            chosen = [info(args.name)]
        except ValueError as exc:
            raise UsageError(f"rlmesh benchmarks: error: {exc}") from None
    else:
        chosen = list(SUITES.values())
    rows = [_row(facts) for facts in chosen]
    if args.json:
        print(dumps(rows if args.name is None else rows[0]))
        return EXIT_OK
    if args.name is not None:
        row = rows[0]
        print(
            f"{row['name']}: {row['benchmark']}, {len(row['tasks'])} tasks, {row['episodes']} "
            f"episodes per task, step cap {row['max_episode_steps']}, extra {row['extra']!r} "
            f"({'installed' if row['installed'] else 'not installed'})"
        )
        options = ", ".join(f"{key}={value!r}" for key, value in row["options"].items())
        print(f"options (--suite-options): {options or 'none'}")
        print(f"protocol: {row['source']}")
        print("tasks:")
        for task in row["tasks"]:
            print(f"  {task}")
        return EXIT_OK
    header = ("suite", "benchmark", "tasks", "episodes", "step cap", "extra", "installed")
    table = [
        (
            row["name"],
            row["benchmark"],
            str(len(row["tasks"])),
            str(row["episodes"]),
            str(row["max_episode_steps"]),
            row["extra"],
            "yes" if row["installed"] else f"no: pip install 'rlmesh[{row['extra']}]'",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (header, *table)) for i in range(len(header))]
    for line in (header, *table):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    return EXIT_OK


def _row(facts: Any) -> dict[str, Any]:
    return {
        "name": facts.name,
        "benchmark": facts.benchmark,
        "tasks": list(facts.tasks),
        "episodes": facts.episodes,
        "max_episode_steps": facts.max_episode_steps,
        "extra": facts.extra,
        "installed": facts.installed(),
        "options": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in facts.options.items()
        },
        "source": facts.source,
    }
