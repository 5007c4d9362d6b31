"""Issue 18, item 5: plain `locust --headless` (no servesweep around it) never ends with 0 records, or with every
request failed, and exit 0 without saying why.

Without -s, the locustfile takes the point's stop timeout itself, so the streams running at -t finish and are
measured; a run that still has no successful request prints why and exits 3 (as does one above --max-failure-rate).
Here: a real master and worker process. The runs of one process and the verdict are checked in process
(tests/inlocust/test_headless.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import completed_by_emulator

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
