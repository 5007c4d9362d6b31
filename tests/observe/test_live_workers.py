"""The live feed with worker processes: `servesweep run` of one 10 s point with `workers: 2` against the emulator.
The workers' records reach the master only with Locust's reports (every 3 s), so each worker also writes its own
feed files (client/feed.py): the run's exporter must count TTFT samples in many small steps during the point, not
in three or four report-sized jumps."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

from servesweep.net import free_port
from servesweep.sim.launch import start_sim

pytestmark = pytest.mark.timeout(300)  # a 2-core machine under the whole suite (five workers)

SIM = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", "2048", "--sim-load-time", "0"]


def _ttft_count(url: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(float(v) for v in re.findall(r"^servesweep_ttft_seconds_count\{[^}]*\} (\S+)$", text, re.M))


def test_exporter_counts_rise_every_second_or_two_with_two_workers(tmp_path):
    port = free_port()
    with start_sim(SIM, log_path=tmp_path / "sim.log") as sim:
        exp = tmp_path / "workers.yaml"
        exp.write_text(textwrap.dedent(f"""\
            name: liveworkers
            sglang_version: "0.5.23"
            target: {{base_url: "{sim.base_url}"}}
            model: {{path: Qwen/Qwen3.6-27B}}
            launcher: {{emulator: true, gpu: H200}}
            server: {{base: {{context_length: 2048}}}}
            exporter: {{port: {port}}}
            load:
              workload: chat
              concurrency: 4
              prompt_tokens: 200
              output_tokens: 24
              duration_s: 10
              warmup_s: 0
              workers: 2
            flush_cache_between_points: false
            """))  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "servesweep.cli", "run", str(exp), "--out", str(tmp_path / "runs")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        counts = []
        while proc.poll() is None:
            c = _ttft_count(f"http://127.0.0.1:{port}/metrics")
            if c is not None and (not counts or c != counts[-1]):
                counts.append(c)
            time.sleep(0.2)
        out = proc.stdout.read()
    assert proc.returncode == 0, out
    rises = [b for a, b in zip(counts, counts[1:], strict=False) if b > a]
    # a feed once a second gives about ten rises in the 10 s point; the master's reports alone give three or four
    assert len(rises) >= 6, (counts, out[-2000:])
    assert counts == sorted(counts)  # counters only grow: no request is counted twice or taken back
