"""How steady this machine's CPUs are: a fixed pure-Python loop timed in short windows, on every
CPU at once, each in its own process pinned to that CPU.

A shared virtual machine's vCPU can run at one speed for a second and at half of it the next
(another tenant on the same physical core). A ratio measured side by side survives that only
when both sides saw the same phases, so the report prints this probe's spread beside its
table: the fastest and slowest window's loop time per CPU, and the share of windows more than
1.5x the fastest.

Usage (``report.py`` runs it before and after its sections):
    python benches/host.py [SECONDS]

Example:
    >>> windows = probe_cpu(None, seconds=0.2, window_s=0.05)
    >>> len(windows) >= 2 and min(windows) > 0
    True
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

LOOP = 5_000  # additions per timed loop: a few hundred µs
WINDOW_S = 0.1
SLOW = 1.5  # a window this many times the fastest counts as slow


def probe_cpu(cpu: int | None, seconds: float, window_s: float = WINDOW_S) -> list[float]:
    """The median time in µs of ``LOOP`` additions in each ``window_s`` window for
    ``seconds``, pinned to ``cpu`` (None: not pinned)."""
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    windows: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        until = time.perf_counter() + window_s
        times = []
        while time.perf_counter() < until:
            started = time.perf_counter_ns()
            total = 0
            for i in range(LOOP):
                total += i
            times.append((time.perf_counter_ns() - started) / 1e3)
        windows.append(statistics.median(times))
    return windows


def cpus() -> list[int | None]:
    """The CPUs this process may run on (``[None]`` where that cannot be asked)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return [None]


def probe(seconds: float) -> dict[str, dict[str, float]]:
    """Every CPU probed at once for ``seconds``, each in a fresh process: per CPU the fastest
    and slowest window (µs) and the share of slow windows."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from host import probe_cpu; "
        "cpu = None if sys.argv[2] == 'None' else int(sys.argv[2]); "
        "print(json.dumps(probe_cpu(cpu, float(sys.argv[3]))))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    children = {
        str(cpu): subprocess.Popen(
            [sys.executable, "-c", script, here, str(cpu), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for cpu in cpus()
    }
    out = {}
    try:
        for cpu, child in children.items():
            stdout, _ = child.communicate(timeout=seconds + 60)
            windows = json.loads(stdout)
            fastest = min(windows)
            out[cpu] = {
                "fastest_us": fastest,
                "slowest_us": max(windows),
                "slow_share": sum(w > SLOW * fastest for w in windows) / len(windows),
            }
    finally:  # a probe that failed or hung leaves no process behind
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return out


def describe(speeds: dict[str, dict[str, float]]) -> str:
    """One line per probe: each CPU's fastest and slowest window and its share of slow ones."""
    return "; ".join(
        f"CPU {cpu} {s['fastest_us']:.0f} to {s['slowest_us']:.0f} µs "
        f"({s['slowest_us'] / s['fastest_us']:.1f}x, {s['slow_share']:.0%} of windows slow)"
        for cpu, s in speeds.items()
    )


if __name__ == "__main__":
    print(describe(probe(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)))
