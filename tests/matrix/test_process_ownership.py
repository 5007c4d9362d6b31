"""Issue 18, item 2: servesweep kills only processes it started and recorded (processes.json: pid + start time), never
a process found by its command line.

`servesweep run` is SIGKILLed mid-point; then `timeout 300 servesweep run --resume /ABS/run_dir` runs beside a
`tail -f` of the manifest and a planted process that names the run folder on its command line. The resume must
finish the run, and the timeout wrapper, `tail -f` and the planted process must survive; what the interrupted run
recorded as its Locust group must be stopped (one of them planted by the test as a recorded group, so the stop is
seen whatever the Locust child did by itself), and a record whose pid now names another process (the start time
differs) must leave that process alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
from support import emulator_experiment_head, start_servesweep

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]


def _experiment(tmp: Path) -> Path:
    f = tmp / "own.yaml"
    f.write_text(
        emulator_experiment_head(tmp, "own", load_time=0.1)
        + textwrap.dedent(
            """\
            load:
              concurrency: [1, 2]
              prompt_tokens: [100]
              output_tokens: 400
              requests: 2
            flush_cache_between_points: false
            """
        )
    )
    return f


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        p.kill()
        p.wait(timeout=10)


def test_resume_under_timeout_stops_only_what_the_interrupted_run_recorded(tmp_path):
    runs = tmp_path / "runs"
    first = start_servesweep(
        ["run", str(_experiment(tmp_path)), "--out", str(runs)], tmp_path, tmp_path / "first.log"
    )
    started: list[subprocess.Popen] = []
    resume = None
    run_dir = None
    try:
        # a point streaming, and its Locust group recorded
        deadline = time.monotonic() + 180
        locust_refs: list[dict] = []
        while time.monotonic() < deadline and first.poll() is None:
            dirs = list(runs.glob("own-*")) if runs.exists() else []
            if dirs:
                run_dir = dirs[0]
                owned = _json(run_dir / "processes.json") or {}
                locust_refs = [r for r in owned.get("processes", []) if r.get("kind") == "locust"]
                if locust_refs and _alive(locust_refs[0]["pid"]):
                    break
            time.sleep(0.1)
        assert locust_refs, (tmp_path / "first.log").read_text()[-3000:]
        assert owned["owner"]["pid"] == first.pid

        # while its owner runs, a resume is refused (it would fight the live run), and the run goes on
        r = subprocess.run(
            [*SERVESWEEP, "run", "--resume", str(run_dir)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and "is still running" in r.stderr, r.stdout + r.stderr
        assert first.poll() is None and _alive(locust_refs[0]["pid"])

        os.kill(first.pid, signal.SIGKILL)  # the orchestrator alone
        first.wait(timeout=30)

        # beside the resume: a tail -f of the manifest, a process naming the run folder, and a recorded group of the
        # interrupted run (planted: the real Locust child may have noticed its parent's death and quit already)
        tail = subprocess.Popen(["tail", "-f", str(run_dir / "manifest.json")], stdout=subprocess.DEVNULL)
        started.append(tail)
        namer = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", str(run_dir.resolve())],
            start_new_session=True,
        )
        started.append(namer)
        recorded = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        started.append(recorded)
        time.sleep(0.3)
        owned = _json(run_dir / "processes.json")
        owned["processes"].append(
            {
                "pid": recorded.pid,
                "create_time": psutil.Process(recorded.pid).create_time(),
                "kind": "locust",
                "group": True,
            }
        )
        # a stale record: the pid of tail -f with another start time (as when a recorded pid is reused)
        owned["processes"].append(
            {
                "pid": tail.pid,
                "create_time": psutil.Process(tail.pid).create_time() - 1000,
                "kind": "locust",
                "group": True,
            }
        )
        (run_dir / "processes.json").write_text(json.dumps(owned))

        resume = subprocess.Popen(
            ["timeout", "300", *SERVESWEEP, "run", "--resume", str(run_dir.resolve())],
            stdout=open(tmp_path / "resume.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        rc = resume.wait(timeout=330)
        out = (tmp_path / "resume.log").read_text()
        # the wrapper was not killed (that would be -9 or 137) and the run finished
        assert rc == 0, out[-3000:]
        m = _json(run_dir / "manifest.json")
        assert m["status"] == "finished" and all(p["status"] == "done" for p in m["points"].values())
        assert "stopped what the interrupted run left running" in out, out[-3000:]
        # what it did not start lives on; what the interrupted run recorded is gone
        assert tail.poll() is None, "tail -f of the manifest was killed"
        assert namer.poll() is None, "a process naming the run folder was killed"
        assert recorded.wait(timeout=10) == -signal.SIGTERM  # stopped with SIGTERM (it had no handler)
        for ref in locust_refs:
            assert not _alive(ref["pid"]) or psutil.Process(ref["pid"]).create_time() != ref["create_time"]
        # the finished run records no process any more
        assert _json(run_dir / "processes.json")["processes"] == []
    finally:
        _kill(first)
        _kill(resume)
        for p in started:
            _kill(p)
        for pidfile in (tmp_path / "srv").glob("*/server.pid"):
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass
