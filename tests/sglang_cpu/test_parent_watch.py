"""A CPU SGLang server does not outlive the process that started it (issue 29): `start_server` from a process that is
then SIGKILLed (no stop, no atexit) leaves no launcher, scheduler or detokenizer behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from servesweep.processes import WATCH_GRACE_S, group_members, stop_group


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_server_whose_starter_is_sigkilled_is_stopped_with_its_children(sglang_cpu_env, tmp_path):
    out = tmp_path / "server.json"
    script = textwrap.dedent(
        f"""
        import json, time
        from servesweep.sglang.cpu import local_server
        srv = local_server.start_server(model={str(sglang_cpu_env.model)!r}, log_path={str(tmp_path / "server.log")!r})
        open({str(out)!r}, "w").write(json.dumps({{"ref": srv.group.ref, "url": srv.base_url}}))
        time.sleep(600)
        """
    )
    starter = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    ref = None
    try:
        deadline = time.monotonic() + 240
        while not (out.exists() and out.stat().st_size):
            assert starter.poll() is None, (tmp_path / "server.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "SGLang did not get ready within 240 s"
            time.sleep(0.5)
        ref = json.loads(out.read_text())["ref"]
        leader = psutil.Process(ref["pid"])
        family = [leader, *leader.children(recursive=True)]
        assert len(family) >= 3, (
            f"expected the launcher, scheduler and detokenizer: {[p.name() for p in family]}"
        )

        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        bound = (
            WATCH_GRACE_S + 15
        )  # SIGTERM, SGLang's own stop (3-7 s) or SIGKILL after the grace, a loaded CPU
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and any(map(_running, family)):
            time.sleep(0.2)
        left = [(p.pid, p.name()) for p in family if _running(p)]
        assert left == [], f"still running {bound:g} s after the starter's SIGKILL: {left}"
        assert group_members(ref) == []
    finally:
        starter.kill()
        if ref is not None:
            stop_group(ref, 0)
