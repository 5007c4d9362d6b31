"""Issue 18, item 5: plain `locust --headless` (no servesweep around it) never ends with 0 records, or with every
request failed, and exit 0 without saying why.

Without -s, the locustfile takes the point's stop timeout itself, so the streams running at -t finish and are
measured; a run that still has no successful request prints why and exits 3 (as does one above --max-failure-rate).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servesweep.sim.launch import start_sim

LOCUSTFILE = Path(__file__).resolve().parents[2] / "locustfiles" / "llm.py"
MODEL = "Qwen/Qwen3.6-27B"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # Real timing: a 300-token stream lasts about 4.5 s, longer than the runs' -t.
    d = tmp_path_factory.mktemp("sim")
    with start_sim(
        ["--model-path", MODEL, "--context-length", "4096"],
        ground_truth=d / "gt.jsonl",
        log_path=d / "sim.log",
    ) as s:
        yield s


def locust(sim, tmp_path, *extra, timeout=120):
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", sim.base_url, "--headless"]
    cmd += ["-u", "2", "-r", "2", "--records", str(tmp_path / "r.parquet"), "--only-summary", *extra]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True, env=os.environ
    )


def completed_by_emulator(sim, prompt_tokens: int) -> set[str]:
    """Request ids (X-Request-Id) whose stream the emulator finished, of the requests with this prompt length."""
    time.sleep(1.5)  # the emulator flushes its ground truth once a second
    return {
        d["id"]
        for d in sim.read_ground_truth()
        if d.get("prompt_tokens")
        and abs(d["prompt_tokens"] - prompt_tokens) <= 3
        and d.get("status") == 200
        and d.get("completion_tokens")
    }


def test_without_stop_timeout_the_streams_running_at_the_end_are_measured(sim, tmp_path):
    r = locust(sim, tmp_path, "-t", "3s", "--prompt-tokens", "310", "--output-tokens", "300")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no -s/--stop-timeout" in r.stderr, r.stderr[-3000:]
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows >= 2, r.stderr[-3000:]  # at ba9c018: 0 records (every stream was cut at -t)
    assert t.column("error_class").null_count == t.num_rows
    assert set(t.column("completion_tokens").to_pylist()) == {300}
    done = completed_by_emulator(sim, 310)
    assert done == set(t.column("request_id").to_pylist()), (len(done), t.num_rows)


def test_an_explicit_zero_stop_timeout_says_why_there_are_no_records(sim, tmp_path):
    r = locust(sim, tmp_path, "-t", "2s", "-s", "0", "--prompt-tokens", "350", "--output-tokens", "300")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "servesweep: 0 records" in r.stderr and "--stop-timeout is 0" in r.stderr, r.stderr[-3000:]
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 0


def test_every_request_failed_exits_non_zero_naming_the_error_class(sim, tmp_path):
    # Locust's own rule (any failure: exit 1) switched off, as servesweep load does: the run still fails.
    r = locust(
        sim,
        tmp_path,
        "-t",
        "2s",
        "--prompt-tokens",
        "5000",
        "--output-tokens",
        "8",
        "--exit-code-on-error",
        "0",
    )
    assert r.returncode == 3, r.stderr[-3000:]
    assert "no request succeeded" in r.stderr and "http_400_context" in r.stderr, r.stderr[-3000:]


def test_max_failure_rate_judges_the_failure_share():
    """The verdict on a records table (in a subprocess: the locustfile imports Locust)."""
    code = r"""
import json
from servesweep.client.locustfile import failure_verdict
import pyarrow as pa
def table(classes, warm=None):
    return pa.table({"error_class": pa.array(classes, pa.string()),
                     "warmup": pa.array(warm or [False] * len(classes), pa.bool_())})
t = table([None] * 9 + ["http_500"])
out = {
    "default": failure_verdict(t, None),
    "above": failure_verdict(t, 0.05),
    "within": failure_verdict(t, 0.1),
    "all_failed": failure_verdict(table(["http_429", "http_429"]), 1.0),
    "only_warmup": failure_verdict(table([None], [True]), None, 30.0),
    "none": failure_verdict(table([]), None, 0.0),
}
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["default"][0] is False and "9 of 10" in v["default"][1]
    assert v["above"][0] is True and "10.0%" in v["above"][1] and "http_500 1" in v["above"][1]
    assert v["within"][0] is False
    assert v["all_failed"][0] is True and "http_429 2" in v["all_failed"][1]
    assert v["only_warmup"][0] is True and "warmup" in v["only_warmup"][1]
    assert v["none"][0] is True and "--stop-timeout is 0" in v["none"][1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_run_time_keeps_the_streams_running_at_the_end(sim, tmp_path):
    """A master and a worker by hand, -t shorter than a stream, no -s: the master ends the run the way a servesweep
    duration point ends (the worker finishes its streams and ships every record before the master quits)."""
    port = _free_port()
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    opts = ["--prompt-tokens", "390", "--output-tokens", "300"]
    master = subprocess.Popen(
        [*base, "--master", "--headless", "--host", sim.base_url, "--master-bind-host", "127.0.0.1"]
        + ["--master-bind-port", str(port), "--expect-workers", "1", "-u", "2", "-r", "2", "-t", "3s"]
        + ["--records", str(tmp_path / "r.parquet"), "--only-summary", *opts],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *opts],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = master.communicate(timeout=90)
        worker.wait(timeout=30)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert master.returncode == 0, out[-3000:]
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows >= 2 and t.column("error_class").null_count == t.num_rows, out[-3000:]
    done = completed_by_emulator(sim, 390)
    assert done == set(t.column("request_id").to_pylist()), (len(done), t.num_rows)
