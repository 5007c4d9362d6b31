"""Issue 18: no Locust process outlives the servesweep process that started it, even when that one is SIGKILLed.

A small parent starts Locust the way `driver.point_run.run_point` does (`driver.command.locust_command`, its own session, output to a
log file), the load runs, the parent is SIGKILLed: the Locust process (and the workers `--processes` forked) must be
gone within seconds, and the emulator must see no request after that."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"

# The parent: what run_point does up to its wait (resolve, bodies, point.json, Popen in a new session), then it
# writes the Locust pid and waits, bounded, for a SIGKILL.
PARENT = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from servesweep.workload.build import build_bodies
from servesweep.driver.command import locust_command
from servesweep.target.probes import resolve_point
from servesweep.config.point import LoadPoint

base_url, work, workers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
point = resolve_point(LoadPoint(base_url=base_url, model=sys.argv[4], probe=False, concurrency=2, prompt_tokens=200,
                                output_tokens=400, duration_s=60))
build_bodies(point)
(work / "status").mkdir(parents=True, exist_ok=True)
(work / "point.json").write_text(point.model_dump_json())
env = dict(os.environ, PYTHONUNBUFFERED="1")
if workers:
    env["SERVESWEEP_STATUS_DIR"] = str(work / "status")
with open(work / "locust.log", "wb") as log:
    proc = subprocess.Popen(locust_command(point, work, workers=workers), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
(work / "locust.pid").write_text(str(proc.pid))
time.sleep(120)
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with start_sim(["--model-path", MODEL, "--enable-metrics"], log_path=log) as s:
        yield s


def _chat_requests(sim) -> tuple[int, int]:
    """(requests the emulator received on /v1/chat/completions, HTTP requests active now)."""
    with urllib.request.urlopen(sim.base_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = sum(
        float(m.group(1))
        for m in re.finditer(
            r'^sglang:http_requests_total\{[^}]*endpoint="/v1/chat/completions"[^}]*\} (\S+)$', text, re.M
        )
    )
    # one line per endpoint and method (as SGLang 0.5.23 labels it): the requests in flight are their sum
    active = sum(
        float(m.group(1))
        for m in re.finditer(r"^sglang:http_requests_active(?:\{[^}]*\})? (\S+)$", text, re.M)
    )
    return int(total), int(active)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("workers", [0, 2], ids=["single", "processes2"])
def test_locust_stops_when_its_parent_is_sigkilled(sim, tmp_path, workers):
    work = tmp_path / "work"
    work.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, sim.base_url, str(work), str(workers), MODEL],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        # Load flows: the emulator has requests in flight from Locust (and, with workers, both workers are up).
        deadline = time.monotonic() + 90
        while True:
            assert parent.poll() is None, parent.stderr.read().decode()[-3000:]
            pid_file = work / "locust.pid"
            if pid_file.is_file() and pid_file.read_text():
                pid = int(pid_file.read_text())
                kids = [p.pid for p in psutil.Process(pid).children()] if _alive(pid) else []
                status = list((work / "status").glob("*.json"))
                if _chat_requests(sim)[1] >= 2 and (
                    not workers or (len(kids) >= workers and len(status) >= workers)
                ):
                    pids = [pid, *kids]
                    break
            assert time.monotonic() < deadline, (work / "locust.log").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - killed < 5.0:
            time.sleep(0.1)
        left = [p for p in pids if _alive(p)]
        log = (work / "locust.log").read_text(errors="replace")
        assert not left, (
            f"still alive {time.monotonic() - killed:.1f} s after the parent's SIGKILL: {left}\n{log[-3000:]}"
        )
        assert "parent process" in log and "is gone" in log, log[-3000:]
        # The emulator hears nothing more: no stream in flight, no new request.
        time.sleep(0.5)
        total, active = _chat_requests(sim)
        time.sleep(2.0)
        assert _chat_requests(sim) == (total, 0), (total, active)
        # What finished was written (the master's records file), and the exit said why.
        if not workers:
            assert re.search(r"Shutting down \(exit code 4\)", log), log[-3000:]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
