"""Issue 18, item 3: SIGINT, SIGTERM and SIGHUP to `servesweep load` or `servesweep run` stop the load within seconds
(no Locust process it recorded in processes.json is alive, the emulator gets no new request), keep what finished
(the interrupted point's records as records.partial.parquet, listed), say how to resume (run), and exit 128 + the
signal's number. And a SIGKILLed `servesweep load`: its Locust child notices that its parent is gone and stops."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from support import emulator_experiment_head, start_servesweep

from servesweep.sim.launch import start_sim

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
STOP_S = 12  # SIGTERM, 5 s of grace, SIGKILL, with room for a loaded 2-core machine


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics"], log_path=log) as s:
        yield s


def counters(base_url: str) -> tuple[float, float]:
    """(requests the server counted as finished or rejected, requests running now)."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()

    def get(name):
        return sum(float(m[1]) for m in re.finditer(rf"^sglang:{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))

    return get("num_requests_total"), get("num_running_reqs")


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _alive(ref: dict) -> bool:
    try:
        p = psutil.Process(ref["pid"])
        return p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - ref["create_time"]) < 0.05
    except psutil.NoSuchProcess:
        return False


def _group_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return out


def _wait_recorded_locust(run_dir_of, proc, log: Path, *, completed: int, timeout: float = 180) -> dict:
    """The recorded Locust group of the point that streams now, once `completed` requests of it finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        run_dir = run_dir_of()
        owned = _json(run_dir / "processes.json") if run_dir else None
        refs = [r for r in (owned or {}).get("processes", []) if r.get("kind") == "locust"]
        if refs and _alive(refs[0]):
            done = sum(
                (_json(f) or {}).get("completed", 0) for f in run_dir.glob("*/.work/progress.json")
            ) + sum((_json(f) or {}).get("completed", 0) for f in run_dir.glob(".tmp-*/.work/progress.json"))
            if done >= completed:
                return refs[0]
        time.sleep(0.1)
    raise AssertionError("no recorded Locust process with finished requests: " + log.read_text()[-3000:])


def _assert_load_stopped(ref: dict, base_url: str | None) -> None:
    """Within STOP_S no process of the recorded group lives, and then the server gets no new request."""
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline and (_alive(ref) or _group_alive(ref["pid"])):
        time.sleep(0.1)
    assert not _alive(ref) and not _group_alive(ref["pid"]), "Locust still alive after the signal"
    if base_url is None:
        return
    time.sleep(1.0)  # the server counts the streams the stop cut (aborts) when it notices them
    try:
        total, _ = counters(base_url)
        time.sleep(2.0)
        total2, running = counters(base_url)
    except urllib.error.URLError as e:
        # `servesweep run` stops its server once Locust is gone; a server that no longer listens gets no requests
        assert isinstance(e.reason, ConnectionRefusedError), e
        return
    assert total2 == total and running == 0, (total, total2, running)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_signal_to_load_stops_locust_keeps_partial_records_and_exits_128_plus_n(sim, tmp_path, sig):
    runs = tmp_path / "runs"
    log = tmp_path / "load.log"
    proc = start_servesweep(
        ["load", "--base-url", sim.base_url, "--concurrency", "2,4", "--requests", "40"]
        + ["--prompt-tokens", "200", "--output-tokens", "150", "--out", str(runs)],
        tmp_path,
        log,
    )
    try:

        def run_dir_of():
            dirs = list(runs.glob("*")) if runs.exists() else []
            return dirs[0] if dirs else None

        ref = _wait_recorded_locust(run_dir_of, proc, log, completed=2)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        _assert_load_stopped(ref, sim.base_url)
        rc = proc.wait(timeout=30)
        out = log.read_text()
        assert rc == 128 + sig, out[-3000:]
        assert time.monotonic() - t0 < 30
        flat = " ".join(out.split())
        assert f"stopped by {sig.name}" in flat and "not measured: c2, c4" in flat, out[-3000:]
        run_dir = run_dir_of()
        m = _json(run_dir / "manifest.json")
        assert m["status"] == "interrupted" and m["interrupted"]["signal"] == sig.name
        (pt,) = m["points"]
        assert pt["point_id"] == "c2" and pt["status"] == "interrupted"
        d = run_dir / "c2"
        info = _json(d / "interrupted.json")
        assert info == pt["partial"] and not (d / ".work").exists() and not (d / "summary.json").exists()
        # what finished before the signal: its records, readable, listed and named on stderr
        rows = pq.read_table(d / info["records"]).num_rows
        assert rows >= 2 and info["rows"] == rows
        assert f"{rows} finished requests in {d / 'records.partial.parquet'}" in flat, out[-3000:]
        assert _json(run_dir / "processes.json")["processes"] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _experiment(tmp: Path) -> Path:
    f = tmp / "sig.yaml"
    f.write_text(
        emulator_experiment_head(tmp, "sig", load_time=0.1).replace(
            "base: {context_length: 4096, max_running_requests: 8}",
            "base: {context_length: 4096, max_running_requests: 8, enable_metrics: true}",
        )
        + textwrap.dedent(
            """\
            load:
              concurrency: [2]
              prompt_tokens: [200]
              output_tokens: 150
              requests: 40
            flush_cache_between_points: false
            """
        )
    )
    return f


# `servesweep run` takes the three signals through one handler (matrix/orchestrator.py Runner._on_signal), so two of
# them here (Ctrl-C's and a closed terminal's); `servesweep load`'s test above takes all three
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_to_run_stops_locust_keeps_partial_records_says_resume(tmp_path, sig):
    runs = tmp_path / "runs"
    log = tmp_path / "run.log"
    proc = start_servesweep(["run", str(_experiment(tmp_path)), "--out", str(runs)], tmp_path, log)
    try:

        def run_dir_of():
            dirs = list(runs.glob("sig-*")) if runs.exists() else []
            return dirs[0] if dirs else None

        ref = _wait_recorded_locust(run_dir_of, proc, log, completed=2)
        run_dir = run_dir_of()
        base_url = f"http://127.0.0.1:{_json(run_dir / 'manifest.json')['port']}"
        os.kill(proc.pid, sig)
        _assert_load_stopped(ref, base_url)
        rc = proc.wait(timeout=120)  # then it stops the server through Ansible
        out = log.read_text()
        assert rc == 128 + sig, out[-3000:]
        flat = " ".join(out.split())
        assert f"interrupted by {sig.name}" in flat and f"servesweep run --resume {run_dir}" in flat, out[
            -3000:
        ]
        m = _json(run_dir / "manifest.json")
        assert m["status"] == "interrupted"
        ((pid, p),) = m["points"].items()
        assert p["status"] == "pending" and p["records_aside"] == f"interrupted/{pid}.1", p
        rows = pq.read_table(run_dir / p["records_aside"] / "records.partial.parquet").num_rows
        assert rows >= 2 and _json(run_dir / p["records_aside"] / "interrupted.json")["rows"] == rows
        assert not list(run_dir.glob(".tmp-*")) and not (run_dir / pid).exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for pidfile in (tmp_path / "srv").glob("*/server.pid"):
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


def test_sigkilled_load_its_locust_child_stops_by_itself(sim, tmp_path):
    """The parent cannot stop anything when it is SIGKILLed: the Locust child watches its parent (locustfile) and
    quits when it is gone."""
    runs = tmp_path / "runs"
    log = tmp_path / "load.log"
    proc = start_servesweep(
        ["load", "--base-url", sim.base_url, "--concurrency", "2", "--requests", "40"]
        + ["--prompt-tokens", "200", "--output-tokens", "150", "--out", str(runs)],
        tmp_path,
        log,
    )
    ref = None
    try:

        def run_dir_of():
            dirs = list(runs.glob("*")) if runs.exists() else []
            return dirs[0] if dirs else None

        ref = _wait_recorded_locust(run_dir_of, proc, log, completed=1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5 + 3  # ~5 s, with room for a loaded machine
        while time.monotonic() < deadline and _group_alive(ref["pid"]):
            time.sleep(0.1)
        assert not _group_alive(ref["pid"]), "the Locust child outlived its SIGKILLed parent"
        time.sleep(1.0)
        total, _ = counters(sim.base_url)
        time.sleep(2.0)
        assert counters(sim.base_url) == (total, 0)
    finally:
        if ref is not None:
            for pid in _group_alive(ref["pid"]):
                os.kill(pid, signal.SIGKILL)


def test_load_resume_measures_what_a_signal_left_and_keeps_what_it_had(sim, tmp_path):
    """`servesweep load --resume RUN` after a SIGINT in the second of two points: the first point is kept as it
    was (not measured again), the interrupted one moves aside with its partial records and is measured whole, and
    the table lists both; a resume with another option, or of a folder that is not a load run, is a usage error."""
    runs = tmp_path / "runs"
    log = tmp_path / "load.log"
    proc = start_servesweep(
        ["load", "--base-url", sim.base_url, "--concurrency", "1,2", "--requests", "4"]
        + ["--prompt-tokens", "200", "--output-tokens", "150", "--out", str(runs)],
        tmp_path,
        log,
    )
    try:

        def run_dir_of():
            dirs = list(runs.glob("*")) if runs.exists() else []
            return dirs[0] if dirs and (dirs[0] / "c1" / "summary.json").is_file() else None

        _wait_recorded_locust(run_dir_of, proc, log, completed=1)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 128 + signal.SIGINT, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    run_dir = run_dir_of()
    assert f"measure them with: servesweep load --resume {run_dir}" in " ".join(log.read_text().split())
    c1_summary = (run_dir / "c1" / "summary.json").read_bytes()
    c1_records = (run_dir / "c1" / "records.parquet").stat().st_mtime_ns

    r = subprocess_run([*SERVESWEEP, "load", "--resume", str(run_dir)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    assert f"resuming {run_dir}: 1 point(s) measured before are kept, 1 to measure (c2)" in err, r.stderr
    m = _json(run_dir / "manifest.json")
    assert [(p["point_id"], p.get("status")) for p in m["points"]] == [("c1", None), ("c2", None)], m["points"]
    assert "status" not in m and m["finished_unix"] and len(m["resumed"]) == 1
    (stop,) = m["interruptions"]
    assert stop["signal"] == "SIGINT" and [p["dir"] for p in stop["points"]] == ["c2.interrupted"]
    # the first point untouched; the interrupted one's partial records kept aside; the second measured whole
    assert (run_dir / "c1" / "summary.json").read_bytes() == c1_summary
    assert (run_dir / "c1" / "records.parquet").stat().st_mtime_ns == c1_records
    assert pq.read_table(run_dir / "c2.interrupted" / "records.partial.parquet").num_rows >= 1
    assert _json(run_dir / "c2" / "summary.json")["requests"]["ok"] == 4
    rows = [line.split("│")[1].strip() for line in r.stdout.splitlines() if line.startswith("│")]
    assert rows == ["1", "2"], r.stdout  # the table's concurrency column: both points, in the sweep's order

    # nothing left: a second resume measures nothing and says so
    again = subprocess_run([*SERVESWEEP, "load", "--resume", str(run_dir)], cwd=tmp_path)
    assert again.returncode == 0 and "2 point(s) measured before are kept, 0 to measure" in " ".join(
        again.stderr.split()
    )
    bad = subprocess_run([*SERVESWEEP, "load", "--resume", str(run_dir), "--concurrency", "4"], cwd=tmp_path)
    assert bad.returncode == 2 and "--resume takes no other option" in bad.stderr and "--concurrency" in bad.stderr
    alien = subprocess_run([*SERVESWEEP, "load", "--resume", str(tmp_path)], cwd=tmp_path)
    assert alien.returncode == 2 and "not a servesweep load run folder" in alien.stderr, alien.stderr


def subprocess_run(cmd: list[str], cwd: Path):
    import subprocess

    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180)
