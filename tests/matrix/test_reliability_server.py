"""The server dies under a point (the emulator's process group killed): the point is marked failed with the server
log attached to its kept-aside records, the server is restarted through Ansible, the point is retried up to
`retries` times, and the matrix goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
from support import emulator_experiment_head
from support import start_servesweep as start


def write_experiment(
    tmp: Path, *, retries: int, name: str = "crash", extra: str = "", needle_probes: bool = False
) -> Path:
    f = tmp / f"{name}.yaml"
    f.write_text(
        emulator_experiment_head(tmp, name, load_time=0.1, needle_probes=needle_probes)
        + textwrap.dedent(
            f"""\
            load:
              concurrency: [1, 2]
              prompt_tokens: [100]
              output_tokens: 160
              requests: 3
            flush_cache_between_points: false
            retries: {retries}
            """
        )
        + extra
    )
    return f


def manifest(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def run_dir_of(runs: Path) -> Path | None:
    dirs = [d for d in runs.glob("*") if (d / "manifest.json").exists()] if runs.exists() else []
    return dirs[0] if dirs else None


def server_pid(srv: Path) -> int | None:
    for f in srv.glob("*/server.pid"):
        try:
            pid = int(f.read_text())
        except ValueError:
            continue
        if psutil.pid_exists(pid):
            return pid
    return None


def cleanup(proc: subprocess.Popen | None, run_dir: Path | None, srv: Path) -> None:
    """Whatever a failed test left: the orchestrator's group, load generators naming the run folder, the emulator."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    if run_dir is not None:
        needle = str(run_dir.resolve())
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(needle in a for a in (p.info["cmdline"] or [])):
                    p.kill()
            except psutil.NoSuchProcess:
                continue
    for pidfile in srv.glob("*/server.pid"):
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


def test_server_killed_mid_point_is_restarted_and_the_point_retried(tmp_path):
    exp = write_experiment(tmp_path, retries=1)
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    kills: list[tuple[str, int]] = []
    try:
        # kill the server twice under the first point: attempt 1 and its one retry (retries: 1)
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and len(kills) < 2:
            run_dir = run_dir or run_dir_of(runs)
            m = manifest(run_dir) if run_dir else None
            if m:
                first = next(iter(m["points"]))
                p = m["points"][first]
                if p["status"] == "running" and p["attempts"] == len(kills) + 1:
                    time.sleep(1.0)  # well inside the point (3 requests of 160 tokens, one at a time)
                    pid = server_pid(srv)
                    assert pid, "no live server pidfile while a point runs"
                    os.killpg(pid, signal.SIGKILL)
                    kills.append((first, pid))
            time.sleep(0.1)
        assert len(kills) == 2, (tmp_path / "run.log").read_text()[-3000:]
        rc = proc.wait(timeout=600)  # a loaded 2-core machine; ~100 s idle
        out = (tmp_path / "run.log").read_text()
        assert rc == 2, out[-3000:]  # one point could not be measured (servesweep.exit_codes)
        m = manifest(run_dir)
        first, second = list(m["points"])
        p1, p2 = m["points"][first], m["points"][second]
        # the crashed point: failed after 1 + retries attempts, each crash with the server's log attached
        assert p1["status"] == "failed" and p1["attempts"] == 2, p1
        assert "server died during this point" in p1["reason"]
        for attempt in (1, 2):
            aside = run_dir / "crashed" / f"{first}.{attempt}"
            log = (aside / "server.log").read_text()
            assert "Uvicorn running" in log or "server is fired up" in log.lower() or "GET /health" in log, (
                log[-500:]
            )
            # what the dead server answered, when the kill came after Locust started (else the probe failed)
            if (aside / "records.parquet").exists():
                assert pq.read_table(aside / "records.parquet").num_rows >= 1
        assert p1["server_log"] == str(run_dir / "crashed" / f"{first}.2" / "server.log")
        cfg = next(iter(m["configs"].values()))
        assert [c["point"] for c in cfg["crashes"]] == [first, first]
        assert (
            cfg["restarts"] == 2 and cfg["status"] == "done"
        )  # restarted after each crash; the matrix went on
        # the next point ran on the restarted server, measured cleanly
        assert p2["status"] == "done" and p2["attempts"] == 1
        s = json.loads((run_dir / second / "summary.json").read_text())
        assert s["requests"]["ok"] == 3 and s["requests"]["failed"] == 0
        assert not (run_dir / first).exists(), "a crashed attempt is never presented as the point's result"
        assert "retrying" in out and "crashed" in out
        # two different server processes were killed, and the last one was stopped at the end
        assert kills[0][1] != kills[1][1]
        assert server_pid(srv) is None
    finally:
        cleanup(proc, run_dir, srv)
