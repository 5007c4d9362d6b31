"""Exposure: the Locust web UI (servesweep's locustfile), the UI's extra metrics port and `servesweep exporter serve`
listen on 127.0.0.1 unless told otherwise (a load generator's UI starts and stops load on the server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from servesweep.sim.launch import start_sim

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(pid: int, ports: set[int], timeout: float = 60.0) -> dict[int, str]:
    """{port: bound address} for the ports of `ports` the process (or its children) listens on."""
    deadline = time.monotonic() + timeout
    found: dict[int, str] = {}
    while time.monotonic() < deadline and len(found) < len(ports):
        procs = [psutil.Process(pid)]
        try:
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.laddr.port in ports:
                        found[c.laddr.port] = c.laddr.ip
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    return found


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # noqa: SIM115
    )


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def test_locust_ui_and_metrics_bind_to_loopback_by_default(tmp_path):
    web, metrics = _free_port(), _free_port()
    sim = start_sim(["--model-path", "Qwen/Qwen3.6-27B"])  # the locustfile probes its server at start
    p = _start(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "locustfiles" / "llm.py"),
            "--host",
            sim.base_url,
            "--web-port",
            str(web),
            "--metrics-port",
            str(metrics),
        ],
        tmp_path / "locust.log",
    )
    try:
        bound = _listening(p.pid, {web, metrics})
    finally:
        _stop(p)
        sim.stop()
    log = (tmp_path / "locust.log").read_text()
    assert set(bound) == {web, metrics}, log[-2000:]
    assert bound == {web: "127.0.0.1", metrics: "127.0.0.1"}, (bound, log[-1000:])


def test_exporter_serves_on_loopback_by_default(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text('{"run_id": "r", "points": {}}')
    port = _free_port()
    p = _start(
        [sys.executable, str(ROOT / "exporters" / "exporter.py"), "serve", str(run), "--port", str(port)],
        tmp_path / "exp.log",
    )
    try:
        bound = _listening(p.pid, {port}, timeout=30)
    finally:
        _stop(p)
    assert bound == {port: "127.0.0.1"}, (tmp_path / "exp.log").read_text()[-2000:]
