"""The observe stack's Prometheus dies in the middle of a matrix (issue 35): `servesweep run` does not fail, does not
hang, measures every point as it would have, and `servesweep observe backfill` puts the run into the restarted
Prometheus's history afterwards.

Real parts: `servesweep observe up` (the Debian package's Prometheus, scraping every second), a two-point matrix on
the emulator, the Prometheus SIGKILLed by the pid and start time its stack recorded (never a command-line match)
while the first point streams; then `observe up` again and `observe backfill` of the run. The run reads nothing
from Prometheus: its figures come from its own records and the server's /metrics, so a Prometheus that is down
costs only its live view (the run's end waits for a last scrape only while the stack's Prometheus runs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support import SERVESWEEP, emulator_experiment_head

from servesweep.observe import stack
from servesweep.observe.stack import Layout, stack_dir
from servesweep.observe.stackdir import running

pytestmark = [pytest.mark.timeout(400)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(url: str, expr: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
            return json.load(r)["data"]["result"]
    except OSError:
        return []


def _manifest(runs: Path) -> dict | None:
    for m in runs.glob("promdown*/manifest.json"):
        try:
            return json.loads(m.read_text())
        except ValueError:
            return None
    return None


def test_prometheus_killed_mid_run_costs_no_point_and_backfill_recovers_the_history(tmp_path, monkeypatch):
    monkeypatch.delenv(stack.ENV_DIR, raising=False)
    runs = tmp_path / "runs"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != stack.ENV_DIR}
    env.update(PYTHONUNBUFFERED="1")
    up_cmd = [*SERVESWEEP, "observe", "up", "--root", str(runs), "--port", str(port), "--scrape-interval", "1s",
              "--no-grafana"]  # fmt: skip
    up = subprocess.run(up_cmd, capture_output=True, text=True, timeout=60, env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    url = f"http://127.0.0.1:{port}"
    exp = tmp_path / "promdown.yaml"
    exp.write_text(
        emulator_experiment_head(tmp_path, "promdown", load_time=0.1)
        + textwrap.dedent(
            """\
            load:
              concurrency: [1, 2]
              prompt_tokens: 200
              output_tokens: 32
              duration_s: 6
            flush_cache_between_points: false
            """
        )
    )
    log = tmp_path / "run.log"
    killed: dict = {}
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([*SERVESWEEP, "run", str(exp), "--out", str(runs)], stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        try:
            while proc.poll() is None and time.monotonic() - t0 < 200:
                m = _manifest(runs)
                if m and any(p["status"] == "running" for p in m["points"].values()):
                    time.sleep(2.0)  # the point streams; Prometheus has scraped it live
                    rec = running(Layout(stack_dir(runs)).record("prometheus"))
                    assert rec is not None, "the stack's Prometheus is not running"
                    os.kill(int(rec["pid"]), signal.SIGKILL)
                    killed["at"] = time.monotonic() - t0
                    break
                time.sleep(0.2)
            rc = proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        took = time.monotonic() - t0
        out = log.read_text(errors="replace")
        assert "at" in killed, out[-3000:]
        assert rc == 0, out[-3000:]
        m = _manifest(runs)
        assert m["status"] == "finished" and all(p["status"] == "done" for p in m["points"].values()), m[
            "points"
        ]
        run_dir = next(runs.glob("promdown*"))
        for pid in m["points"]:
            s = json.loads((run_dir / pid / "summary.json").read_text())
            assert s["requests"]["ok"] > 0 and s["requests"]["failed"] == 0 and not s["degraded"], s[
                "requests"
            ]
            assert 5.0 <= s["window_s"] <= 9.0, s["window_s"]
        assert "waiting up to" not in out, "no wait for a scrape by a Prometheus that is gone"
        assert took < 200, f"the run took {took:.0f} s"

        # the history: Prometheus back up (the same data dir), the run imported with promtool; on a port of its own
        # again (the first one may have gone to another process's connection meanwhile: a full suite runs beside)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        up_cmd[up_cmd.index("--port") + 1] = str(port)
        up = subprocess.run(up_cmd, capture_output=True, text=True, timeout=60, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        bf = subprocess.run([*SERVESWEEP, "observe", "backfill", str(run_dir), "--root", str(runs)],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert bf.returncode == 0, bf.stdout + bf.stderr
        run_id = m["run_id"]
        expr = f'count by (point_id) (last_over_time(servesweep_point_requests{{run_id="{run_id}"}}[2h]))'
        deadline = (
            time.monotonic() + 150
        )  # Prometheus picks up new blocks at its next reload (about a minute)
        got: set[str] = set()
        while time.monotonic() < deadline:
            got = {r["metric"].get("point_id", "") for r in _query(url, expr)}
            if got >= set(m["points"]):
                break
            time.sleep(2.0)
        assert got >= set(m["points"]), (got, sorted(m["points"]), bf.stdout[-1500:])
    finally:
        stack.down(runs)
    print(f"\nPrometheus SIGKILLed {killed['at']:.1f} s into the run; run exit 0 in {took:.1f} s, "
          f"{len(m['points'])} points done; backfill: every point in the restarted Prometheus")  # fmt: skip
