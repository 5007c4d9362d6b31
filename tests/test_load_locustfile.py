"""`locust -f locustfiles/llm.py` by hand / in CI: servesweep's options, Locust's own CSV with the LLM rows, the
records file, and the SLO exit code."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servesweep.sim.launch import start_sim

LOCUSTFILE = Path(__file__).resolve().parents[1] / "locustfiles" / "llm.py"


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"]) as s:
        yield s


def locust(sim, tmp_path, *extra):
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", sim.base_url, "--headless"]
    cmd += ["-u", "2", "-r", "2", "--max-requests", "4", "--prompt-tokens", "500", "--output-tokens", "8"]
    cmd += [
        "--records",
        str(tmp_path / "r.parquet"),
        "--csv",
        str(tmp_path / "stats"),
        "--only-summary",
        *extra,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, start_new_session=True, env=os.environ
    )


def test_ci_run_writes_records_and_locust_stats(sim, tmp_path):
    r = locust(sim, tmp_path, "--slo", "ttft_p99<=60s,error_rate<=0%")
    assert r.returncode == 0, r.stderr[-3000:]
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows == 4 and t.column("error_class").null_count == 4
    rows = {(row["Type"], row["Name"]): row for row in csv.DictReader(open(tmp_path / "stats_stats.csv"))}
    assert int(rows[("LLM", "TTFT")]["Request Count"]) == 4
    assert int(rows[("LLM", "E2E")]["Request Count"]) == 4
    assert int(rows[("POST", "/v1/chat/completions")]["Failure Count"]) == 0
    # the POST row is E2E, not time to headers
    assert float(rows[("POST", "/v1/chat/completions")]["Average Response Time"]) == pytest.approx(
        float(rows[("LLM", "E2E")]["Average Response Time"]), rel=0.01
    )


def test_ci_run_fails_on_a_breached_slo(sim, tmp_path):
    r = locust(sim, tmp_path, "--slo", "ttft_p99<=1ms")
    assert r.returncode == 1, r.stderr[-3000:]  # issue 8: 1 is a breach
    assert "BREACH" in r.stdout and "ttft_p99" in r.stdout, r.stdout[-2000:]
