"""report.py: the target logic marks the rows that miss, and ``--quick --json`` runs end to end."""

from __future__ import annotations

import json

import host
import report
from report import Row, format_table


def test_rows_that_miss_their_target_are_marked():
    faster = Row("core", "twice as fast", "python", 2e-6, "rust", 1e-6, "s", target=2.0)
    slower = Row("run", "half the rate", "loop", 100.0, "rlmesh", 50.0, "steps/s", target=0.7)
    untargeted = Row("run", "no target", "loop", 100.0, "rlmesh", 50.0, "steps/s")
    skipped = Row("peer", "skipped", "0.1.0", None, "rlmesh", None, "steps/s", note="no pip")
    assert (faster.ratio, faster.status) == (2.0, "ok")
    assert (slower.ratio, slower.status) == (0.5, "MISSED")
    assert (untargeted.status, skipped.ratio, skipped.status) == ("", None, "skipped")
    lines = format_table([faster, slower, untargeted, skipped]).splitlines()
    marked = [line.split()[0] for line in lines if line.endswith("MISSED")]
    assert marked == ["half"] and lines[-1].strip() == "no pip"


def test_quick_report_runs_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert report.main(["--quick", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    rows = written["rows"]
    # 11 core (the temporal ensemble's step among them), 2 adapters, 5 end to end, 3 chunked,
    # 8 process lanes (the same work over bare pipes, and it and Hopper's lanes in independent
    # processes, among them), 2 group pipelining, 2 summary budget, 1 suite summary, 1 HTML
    # report budget, 2 videos, 3 scale-out (Ray: the test extra), 2 served env, a served env
    # in worker processes and the transport's echo, 1 served model
    assert len(rows) == 45
    assert any(row["workload"].startswith("the same work over bare pipes") for row in rows)
    ceilings = [row for row in rows if row["workload"].startswith("the machine's ceiling")]
    assert len(ceilings) == 2
    assert any("model with predict and predict_batch" in row["workload"] for row in rows)
    assert any(row["section"].startswith("served model") for row in rows)
    (served_workers,) = [row for row in rows if "in 2 worker processes" in row["workload"]]
    assert served_workers["note"].startswith("per-episode results of the two servers equal")
    assert all(row["ratio"] > 0 for row in rows)
    # The host's speed, probed on every CPU this process may use, before and after the rows.
    speeds = written["host_speed"]
    assert sorted(speeds) == ["after", "before"]
    for speed in speeds.values():
        assert len(speed) == len(host.cpus())
        assert all(0 < cpu["fastest_us"] <= cpu["slowest_us"] for cpu in speed.values())
        assert all(0 <= cpu["slow_share"] <= 1 for cpu in speed.values())
    printed = capsys.readouterr().out
    assert "miss their target" in printed and "before the sections: CPU" in printed
