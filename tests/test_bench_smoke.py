"""Smoke of the peers benchmark harness (bench/run_all.py --smoke): servesweep alone against a real emulator, one
small point, real processes pinned as in the full run. Checks that the harness measures what it claims, figure 6
(1 and 2 Locust worker processes, 3 s each) included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_harness_smoke_measures_cpu_and_accuracy(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "raw" / "smoke.json").read_text())
    (run,) = res["runs"]
    assert run["tool"] == "servesweep" and run["exit_code"] == 0 and "error" not in run, run
    # every request the client finished reached the emulator and was paired with its ground truth by id
    assert run["client_requests"] == run["requests"] == 16
    assert run["acc_id"]["paired"] == 16 and run["acc_id"]["unpaired"] == 0
    # 24 output tokens, one chunk each: the emulator wrote them all, at ~20 ms spacing
    assert run["server_chunks"] >= 16 * 24
    assert 10 < run["emulator_gap_ms"]["p50"] < 40, run["emulator_gap_ms"]
    # CPU per chunk is measured over a steady window and is a plausible figure (tens to a few hundred us)
    assert run["steady_chunks"] > 0 and 5 < run["cpu_us_per_chunk"] < 2000, run
    # accuracy: errors are finite, and the pattern pairing never does worse than the exact (id) pairing by much
    acc = run["acc_id"]
    assert acc["chunk_err_ms"]["p50"] is not None and acc["chunk_err_ms"]["p50"] < 50
    assert run["acc_pattern"]["chunk_err_ms"]["p50"] <= acc["chunk_err_ms"]["p50"] + 1.0
    assert acc["abs_chunk_err_ms"]["p50"] < 50
    # the records say which clock stamped each chunk, and the report shows it
    assert sum(run["clock"].values()) == 16 and set(run["clock"]) <= {"kernel", "user"}, run["clock"]
    md = (tmp_path / "peers-smoke.md").read_text()
    assert "| 8 | servesweep |" in md and "servesweep (by id, exact)" in md and "pinning" in md
    # figure 6: one and two Locust worker processes; with two, both sent load and shipped records to the master
    w = {r["workers"]: r for r in res["workers"]}
    assert set(w) == {1, 2} and all(r["exit_code"] == 0 and "error" not in r for r in w.values()), w
    assert w[2]["client_processes_with_records"] == 2 and w[2]["max_open_streams"] == 8, w[2]
    assert w[2]["acc_id"]["paired"] == w[2]["client_requests"] > 0 and w[2]["acc_id"]["unpaired"] == 0
    # the master's CPU and the workers' are measured apart (the CLI, Locust master, two forked workers)
    assert w[2]["processes_by_depth"] == {"0": 1, "1": 1, "2": 2}, w[2]
    assert "## 6. Scaling: 1 vs 2 worker processes" in md and "servesweep-w2 (master + 2 workers)" in md


def test_soak_smoke_checks_records_against_ground_truth_and_samples_locust(tmp_path):
    """bench/bench_soak.py, cut to seconds: one matrix point through `servesweep load` and a web-UI step ramp
    started through POST /swarm, each against its own emulator at real timing. The harness pairs every record with
    the emulator's ground truth and samples RSS/fds of each Locust process it started."""
    cmd = [
        sys.executable, str(ROOT / "bench" / "bench_soak.py"), "--minutes", "0.3", "--webui-minutes", "0.2",
        "--points", "1000x2", "--output-tokens", "32", "--webui-prompt-tokens", "1000", "--ramp-steps", "1,2",
        "--sample-s", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    v = doc["verdict"]
    assert v["passed"] and v["false_failures"] == 0 and v["failed"] == 0 and v["counts_equal"], v
    for part in ("matrix", "webui"):
        c = doc["checks"][part]
        assert c["client_records"] == c["ok"] == c["emulator_requests_with_client_id"] > 0, c
        assert c["emulator_completed"] == c["client_records"] and c["records_missing_from_emulator"] == 0, c
    webui = doc["parts"]["webui"]
    assert webui["swarm_response"]["success"] and webui["ramp_steps"] == [1, 2], webui
    labels = sorted(p["label"] for p in doc["processes"])
    assert labels == ["matrix p1000 c2", "webui step-ramp"], labels
    assert all(p["samples"] >= 3 and p["rss_max_mib"] > 0 and p["fds_max"] > 0 for p in doc["processes"])
    assert "| webui step-ramp |" in r.stdout and "| matrix p1000 c2 |" in r.stdout
