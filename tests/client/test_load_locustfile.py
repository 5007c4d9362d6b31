"""`locust -f locustfiles/llm.py` by hand / in CI, as real processes: the SLO exit status of a `locust` process, and
a master with a worker process. The logic of one process (options, Locust's CSV with the LLM rows, the records file,
the SLO gate) is checked in process: tests/inlocust/test_headless.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servesweep.sim.launch import start_sim

LOCUSTFILE = Path(__file__).resolve().parents[2] / "locustfiles" / "llm.py"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("sim") / "ground_truth.jsonl"
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"], ground_truth=gt
    ) as s:
        yield s


def locust(sim, tmp_path, *extra):
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", sim.base_url, "--headless"]
    cmd += ["-u", "2", "-r", "2", "--requests", "4", "--prompt-tokens", "500", "--output-tokens", "8"]
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


def test_ci_run_fails_on_a_breached_slo(sim, tmp_path):
    """The process's exit status from the gate: the gate's logic and the other runs of one process are checked in
    process (tests/inlocust/test_headless.py); this one checks that a real `locust` exits with what it decided."""
    r = locust(sim, tmp_path, "--slo", "ttft_p99<=1ms")
    assert r.returncode == 1, r.stderr[-3000:]  # issue 8: 1 is a breach
    assert "BREACH" in r.stdout and "ttft_p99" in r.stdout, r.stdout[-2000:]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_without_host_and_every_record_at_the_end(sim, tmp_path):
    """A worker started without --host gets it from the master; the master's records file has every request the
    workers made, including those that finished during the stop (shipped with the workers' last reports)."""
    import signal

    port = free_port()
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    opts = ["--prompt-tokens", "400", "--output-tokens", "40", "--endpoint", "completions"]
    master = subprocess.Popen(
        [*base, "--master", "--headless", "--host", sim.base_url, "--master-bind-host", "127.0.0.1"]
        + ["--master-bind-port", str(port), "--expect-workers", "1", "-u", "2", "-r", "2", "-t", "8s"]
        + ["-s", "30", "--records", str(tmp_path / "r.parquet"), *opts],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *opts],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = master.communicate(timeout=90)
        wout, _ = worker.communicate(timeout=30)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert "--host" not in wout, wout[-2000:]
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows >= 4 and t.column("error_class").null_count == t.num_rows, out[-2000:]
    assert set(t.column("point_id").to_pylist()) == {"locust-synthetic-p400-o40-completions"}
    ids = {r["request_id"] for r in t.to_pylist()}
    # every request the worker sent (the emulator saw it under its X-Request-Id) is in the master's file
    sent = {
        d["id"]
        for d in sim.ground_truth_so_far()
        if d.get("prompt_tokens")
        and abs(d["prompt_tokens"] - 400) <= 3
        and d["endpoint"] == "/v1/completions"
    }
    assert sent and sent <= ids, (len(sent), len(ids), len(sent - ids))
