"""Print a pytest-benchmark JSON file as a Markdown table: medians per core and their ratio.

Usage:
    pytest benches --benchmark-enable --benchmark-json=bench.json
    python benches/ratios.py bench.json

One row per benchmark group: the Python core's median, the Rust core's median, and how many
times faster the Rust core is (Python median / Rust median). A group may also hold a physical
floor (a benchmark with ``extra_info["floor"]``, e.g. a plain copy of the same bytes); then the
Rust core's throughput is given as a fraction of the floor's (floor median / Rust median).
Medians from one run on one machine are what compare; absolute times drift between runs on a
shared machine.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def core_of(bench: dict) -> str:
    if bench.get("extra_info", {}).get("floor"):
        return "floor"
    return (bench.get("params") or {}).get("core", "?")


def format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_ratio(ratio: float, target: float | None = None) -> str:
    """``ratio`` to 2 decimals, or 3 where 2 would round a ratio short of ``target`` up to it.

    Example:
        >>> format_ratio(0.998, 1.0), format_ratio(1.03, 1.0), format_ratio(0.998)
        ('0.998x', '1.03x', '1.00x')
    """
    shown = f"{ratio:.2f}"
    if target is not None and ratio < target <= float(shown):
        shown = f"{ratio:.3f}"
    return f"{shown}x"


def ratio_table(report: dict) -> str:
    medians: dict[str, dict[str, float]] = defaultdict(dict)
    for bench in report["benchmarks"]:
        medians[bench["group"] or bench["name"]][core_of(bench)] = bench["stats"]["median"]
    with_floor = any("floor" in by_core for by_core in medians.values())
    header = "| workload | Python core (median) | Rust core (median) | Rust speed-up |"
    rule = "|---|---:|---:|---:|"
    if with_floor:
        header += " floor (median) | Rust throughput vs floor |"
        rule += "---:|---:|"
    lines = [header, rule]
    for group, by_core in medians.items():
        python, rust, floor = (by_core.get(name) for name in ("python", "rust", "floor"))
        cells = [format_time(t) if t else "n/a" for t in (python, rust)]
        cells.append(f"{python / rust:.1f}x" if python and rust else "n/a")
        if with_floor:
            cells.append(format_time(floor) if floor else "n/a")
            cells.append(f"{floor / rust:.0%}" if floor and rust else "n/a")
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as handle:
        print(ratio_table(json.load(handle)))
