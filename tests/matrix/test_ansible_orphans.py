"""`servesweep run` SIGKILLed while a playbook runs (a server starting): no Ansible process outlives it. The playbook
runs in a session of its own (ansible-runner's pty), so neither a process group signal nor the end of servesweep
reached it: it went on starting the server, then blocked on a pipe nobody reads, for good (seen on the developers'
machine after a kill test). The processes are those servesweep recorded in processes.json (pid and start time)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from support import emulator_experiment_head, start_servesweep
from test_reliability_server import cleanup, run_dir_of

from servesweep.processes import owned_now

pytestmark = pytest.mark.timeout(300)
# ansible-playbook is told (SIGTERM) the moment its parent dies; it stops its task workers and exits: a second or
# two, more on a loaded machine; the readiness wait it was in would have gone on for the server's whole load time (6 s here, minutes for a real model)
BOUND_S = 4.0


def _recorded_ansible(run_dir) -> list[dict]:
    try:
        d = json.loads((run_dir / "processes.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    return [r for r in d.get("processes") or [] if r.get("kind") == "ansible"]


def test_no_ansible_process_outlives_a_sigkilled_run(tmp_path):
    exp = tmp_path / "orphans.yaml"
    # the emulator takes 6 s to load: the playbook is in its longest task (waiting for readiness) when it is killed
    exp.write_text(
        emulator_experiment_head(tmp_path, "orphans", load_time=6)
        + "load: {concurrency: [1], prompt_tokens: [100], output_tokens: 16, requests: 2}\n"
    )
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    proc = start_servesweep(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        refs: list[dict] = []
        t_end = time.monotonic() + 120
        while time.monotonic() < t_end and proc.poll() is None:
            run_dir = run_dir or run_dir_of(runs)
            refs = [r for r in _recorded_ansible(run_dir) if owned_now(r)] if run_dir else []
            if len(refs) >= 2 and list(srv.glob("*/server.pid")):  # the server launched: the wait has begun
                break
            time.sleep(0.1)
        assert refs, (
            "no playbook process was recorded while the run started its server: "
            + (tmp_path / "run.log").read_text()[-2000:]
        )
        os.kill(proc.pid, signal.SIGKILL)  # servesweep alone, as the OOM killer or `kill -9` would
        proc.wait(30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < BOUND_S and any(owned_now(r) for r in refs):
            time.sleep(0.2)
        left = [p.cmdline()[:3] for r in refs for p in owned_now(r)]
        assert not left, (
            f"Ansible processes outlived the SIGKILLed run by {time.monotonic() - t0:.0f} s: {left}"
        )
    finally:
        cleanup(proc, run_dir, srv)
        for r in _recorded_ansible(run_dir) if run_dir else []:
            for p in owned_now(r):
                p.kill()
