"""From `servesweep observe up` to live series with no manual step: a standing Prometheus (the Debian package) on a
temporary results root, then a two-configuration matrix (`servesweep run`) and a `servesweep load --metrics-port`
point on the emulator, both writing into that root. While the points stream, Prometheus holds both runs' client
series (`servesweep_*`) and their servers' `sglang:*` series, found through the stack's one targets folder, and
the run's TTFT histogram count grows at least 3 times during one point (the exporter is fed from the Locust
process's live record feed, not at the point's end). Both commands run without a terminal, so their progress is
plain lines, at the interval SERVESWEEP_PROGRESS_EVERY_S sets.
"""

from __future__ import annotations

import json
import os
import re
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

pytestmark = [
    pytest.mark.timeout(300),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(url: str, expr: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def _run_id(runs: Path, prefix: str) -> str | None:
    for d in runs.glob(f"{prefix}*"):
        try:
            return json.loads((d / "manifest.json").read_text())["run_id"]
        except (FileNotFoundError, ValueError, KeyError):
            continue
    return None


def _experiment(tmp: Path) -> Path:
    text = emulator_experiment_head(tmp, "livestack", load_time=0.1).replace(
        "base: {context_length: 4096, max_running_requests: 8}",
        "base: {context_length: 4096, enable_metrics: true}\n  axes: {max_running_requests: [4, 8]}",
    ) + textwrap.dedent(
        """\
        load:
          concurrency: 2
          prompt_tokens: 200
          output_tokens: 48
          duration_s: 10
        flush_cache_between_points: false
        """
    )
    path = tmp / "live.yaml"
    path.write_text(text)
    return path


def _watch(url: str, runs: Path, procs: list[subprocess.Popen], timeout: float) -> dict:
    """Poll Prometheus every 0.5 s while either command runs: per run, whether client and sglang:* series were
    seen, and per point of the matrix the TTFT counts seen before its folder got its summary."""
    seen: dict = {"client": set(), "sglang": set(), "ttft": {}}
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        for rid in filter(None, (_run_id(runs, "livestack"), _run_id(runs, "load-"))):
            if _query(url, f'servesweep_ttft_seconds_count{{run_id="{rid}"}}'):
                seen["client"].add(rid)
            if _query(url, f'{{__name__=~"sglang:.+", run_id="{rid}"}}'):
                seen["sglang"].add(rid)
        run = next(runs.glob("livestack*"), None)
        if run is not None:
            for s in _query(url, 'sum by (point_id) (servesweep_ttft_seconds_count{job="servesweep"})'):
                pid = s["metric"].get("point_id", "")
                if (run / pid).is_dir() or not pid.startswith("s0"):
                    continue  # finished (or not the matrix's): only what was seen during the point counts
                seen["ttft"].setdefault(pid, []).append(float(s["value"][1]))
        time.sleep(0.5)
    return seen


def test_observe_up_then_a_matrix_and_a_load_point_are_live_in_prometheus(tmp_path, monkeypatch):
    monkeypatch.delenv(stack.ENV_DIR, raising=False)
    runs = tmp_path / "runs"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != stack.ENV_DIR}
    env.update(PYTHONUNBUFFERED="1", SERVESWEEP_PROGRESS_EVERY_S="3")
    up = subprocess.run([*SERVESWEEP, "observe", "up", "--root", str(runs), "--port", str(port),
                         "--scrape-interval", "1s", "--no-grafana"],
                        capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    logs = {"run": tmp_path / "run.log", "load": tmp_path / "load.log"}
    try:
        procs.append(subprocess.Popen([*SERVESWEEP, "run", str(_experiment(tmp_path)), "--out", str(runs)],
                                      stdout=open(logs["run"], "wb"), stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))  # fmt: skip
        procs.append(subprocess.Popen(
            [*SERVESWEEP, "load", "--concurrency", "2", "--prompt-tokens", "200", "--output-tokens", "48",
             "--duration", "25s", "--metrics-port", str(_free_port()), "--out", str(runs),
             "--sim-args", "--model-path Qwen/Qwen3.6-27B --sim-gpu H200 --enable-metrics"],
            stdout=open(logs["load"], "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True))  # fmt: skip
        seen = _watch(url, runs, procs, timeout=240)
        for p in procs:
            assert p.wait(timeout=60) == 0, {k: v.read_text()[-3000:] for k, v in logs.items()}
        # each command waited for the stack's Prometheus to read its last point's summary before it stopped
        # serving: every point of both runs has its summary gauges in Prometheus, the last ones included
        points = {
            run: {
                r["metric"]["point_id"]
                for r in _query(url, f'last_over_time(servesweep_point_requests{{run_id="{run}"}}[15m])')
            }
            for run in (_run_id(runs, "livestack"), _run_id(runs, "load-"))
        }
        expected = {run: {d.parent.name for d in (runs / run).glob("*/summary.json")} for run in points}
        assert points == expected and all(points.values()), (points, expected)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        stack.down(runs)
    run_id, load_id = _run_id(runs, "livestack"), _run_id(runs, "load-")
    assert seen["client"] == {run_id, load_id}, seen
    assert seen["sglang"] == {run_id, load_id}, seen
    # the histogram moved during a point: at least 3 increases seen before the point finished
    rises = {pid: sum(b > a for a, b in zip(v, v[1:], strict=False)) for pid, v in seen["ttft"].items()}
    assert len(rises) == 2 and max(rises.values()) >= 3, rises
    # both commands ran without a terminal: plain progress lines, a start, lines during, and an end
    load_log = logs["load"].read_text()
    assert "(concurrency 2): started" in load_log and "so far" in load_log, load_log[-2000:]
    assert "TTFT p50" in load_log and "done in" in load_log
    run_log = logs["run"].read_text()
    assert ": started" in run_log and "so far" in run_log, run_log[-2000:]
    # and the server's start, which shows no spinner without a terminal: a line at its start, then its task
    assert re.search(r"server s[\w-]+: starting \(Ansible role\)", run_log), run_log[-3000:]
    assert re.search(r"server s[\w-]+: [^\n]+ \(\d+ s\)", run_log), run_log[-3000:]
    # each run took its targets out of the stack's folder when it ended
    assert not list(Layout(stack_dir(runs)).targets.glob("*.json"))
