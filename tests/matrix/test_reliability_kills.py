"""`servesweep run` SIGKILLed at random moments, many times; `--resume` always finishes the matrix with every point
exactly once, every result file readable, a manifest that never claims what is not on disk, no byte of a finished
point lost or rewritten, and nothing left running that breaks the next resume (port in use).

More kills (a figure for docs/reliability.md): SERVESWEEP_KILL_CYCLES=30 SERVESWEEP_KILL_POINTS=8
pytest tests/matrix/test_reliability_kills.py -s (bench/bench_reliability.py runs it so)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
from test_reliability_server import cleanup, manifest, run_dir_of, start, write_experiment

CYCLES = int(os.environ.get("SERVESWEEP_KILL_CYCLES", "6"))
# Points of the matrix (concurrency 1..N): more points, more moments to kill before the matrix is done
# (bench/bench_reliability.py: 8 points, 30 cycles for the >= 20 kills of issue 35)
POINTS = int(os.environ.get("SERVESWEEP_KILL_POINTS", "3"))
REQUESTS = 2


def _files(d: Path) -> dict[str, tuple[int, str]]:
    return {
        str(f.relative_to(d)): (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
        for f in sorted(d.rglob("*"))
        if f.is_file()
    }


def _check_consistent(run_dir: Path, finished: dict[str, dict]) -> None:
    """What a killed run leaves: a whole manifest; every point it calls done has a complete, readable folder; every
    point folder is complete (none half-written); files of points seen finished before are byte-identical."""
    m = manifest(run_dir)
    assert m is not None, "manifest.json missing or torn"
    for pid, p in m["points"].items():
        d = run_dir / pid
        if p["status"] == "done":
            assert d.is_dir(), f"manifest says {pid} is done, its folder is missing"
        if d.is_dir():
            s = json.loads((d / "summary.json").read_text())
            assert s["point_id"] == pid and s["requests"]["measured"] == REQUESTS
            assert pq.read_table(d / "records.parquet").num_rows == s["requests"]["total"]
            files = _files(d)
            if pid in finished:
                assert files == finished[pid], f"finished point {pid} was rewritten or lost bytes"
            else:
                finished[pid] = files


def _wait_for_phase(proc, runs: Path, run_dir: Path | None, phase: str, rng: random.Random) -> float:
    """Return (seconds since start) at the moment to kill, or when the run ended by itself."""
    t0 = time.monotonic()
    # "start": within Python's and Ansible's start (the server's start role ends ~5-8 s in here); up to 20 s, on a
    # quiet machine a resumed run of one point had often finished first, and too few kills landed (a cold run)
    start_s = rng.uniform(0.5, 8.0)
    grace = rng.uniform(0.0, 2.0)
    seen_done = None
    stale = _mtime(run_dir)  # the manifest the previous (killed) process left: not this process's state
    while proc.poll() is None and time.monotonic() - t0 < 240:
        el = time.monotonic() - t0
        if phase == "start" and el >= start_s:
            break
        run_dir = run_dir or run_dir_of(runs)
        m = manifest(run_dir) if run_dir and _mtime(run_dir) != stale else None
        if m:
            st = [p["status"] for p in m["points"].values()]
            if phase == "point" and "running" in st:
                time.sleep(grace)
                break
            n_done = st.count("done")
            if seen_done is None:
                seen_done = n_done
            if phase == "finish" and n_done > seen_done:
                break
        time.sleep(0.02)
    return time.monotonic() - t0


def _mtime(run_dir: Path | None) -> int | None:
    try:
        return (run_dir / "manifest.json").stat().st_mtime_ns if run_dir else None
    except FileNotFoundError:
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_random_sigkills_then_resume_finish_every_point_exactly_once(tmp_path):
    rng = random.Random(int(os.environ.get("SERVESWEEP_KILL_SEED", "1")))
    exp = write_experiment(tmp_path, retries=0, name="kills")
    conc = ", ".join(str(c) for c in range(1, POINTS + 1))
    text = exp.read_text().replace("concurrency: [1, 2]", f"concurrency: [{conc}]")
    exp.write_text(
        text.replace("output_tokens: 160", "output_tokens: 8").replace("requests: 3", f"requests: {REQUESTS}")
    )
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    run_dir: Path | None = None
    proc = None
    finished: dict[str, dict] = {}
    kills = []
    try:
        for cycle in range(CYCLES + 1):
            args = ["run", "--resume", str(run_dir)] if run_dir else ["run", str(exp), "--out", str(runs)]
            proc = start(args, tmp_path, tmp_path / f"cycle{cycle}.log")
            if cycle == CYCLES:
                rc = proc.wait(timeout=600)
                break
            # a random moment of a random phase: while Python or Ansible starts, while a point streams, or right
            # as a point is finished (its folder renamed, the manifest rewritten)
            phase = rng.choice(["start", "point", "point", "finish"])
            kill_at = _wait_for_phase(proc, runs, run_dir, phase, rng)
            killed = proc.poll() is None
            if killed:
                os.kill(
                    proc.pid, signal.SIGKILL
                )  # the orchestrator alone: Locust, Ansible, the server live on
                proc.wait(timeout=30)
                kills.append(f"{phase}@{kill_at:.1f}s")
            run_dir = run_dir or run_dir_of(runs)
            if run_dir:
                m = manifest(run_dir)
                _check_consistent(run_dir, finished)
                if not killed and m and all(p["status"] == "done" for p in m["points"].values()):
                    rc = proc.returncode  # finished on its own before the kill landed
                    break
        else:
            rc = None
        out = (tmp_path / f"cycle{cycle}.log").read_text()
        assert rc == 0, out[-3000:]
        m = manifest(run_dir)
        assert m["status"] == "finished" and len(m["points"]) == POINTS
        _check_consistent(run_dir, finished)
        for pid, p in m["points"].items():
            assert p["status"] == "done", (pid, p)
            s = json.loads((run_dir / pid / "summary.json").read_text())
            # exactly once: one folder, its requests measured once (no duplicate rows from an earlier attempt)
            assert s["requests"] == {
                "total": REQUESTS,
                "warmup": 0,
                "measured": REQUESTS,
                "ok": REQUESTS,
                "failed": 0,
            }
            assert pq.read_table(run_dir / pid / "records.parquet").num_rows == REQUESTS
        assert sorted(d.name for d in run_dir.iterdir() if d.is_dir() and d.name.startswith("s01")) == sorted(
            m["points"]
        ), "a stray point folder (half-written or duplicated)"
        assert not list(run_dir.glob(".tmp-*"))
        # every resume that got past its start-up recorded itself (one killed during start-up may not have)
        assert len(m["resumed"]) >= len([k for k in kills if not k.startswith("start@")]) - 1, (
            m["resumed"],
            kills,
        )
        # nothing left behind: the server stopped, no load generator, no Ansible of the run
        assert _port_free(m["port"])
        assert not [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(str(run_dir) in a for a in (p.info["cmdline"] or []))
        ]
        lost = sum(
            size
            for pid, files in finished.items()
            for name, (size, _) in files.items()
            if not (run_dir / pid / name).is_file()
        )
        assert lost == 0
        print(f"\n{len(kills)} SIGKILLs at {kills} s survived; {len(finished)} points, 0 bytes lost")
        assert len(kills) >= min(CYCLES, 4), (
            kills
        )  # most kills must really land (the run takes longer than 25 s)
    finally:
        cleanup(proc, run_dir, srv)
