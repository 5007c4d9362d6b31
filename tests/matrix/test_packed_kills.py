"""Stopping a packed run: a SIGTERM while two placements stream stops every placement's server (not only one),
keeps the points that finished byte for byte and says how to resume; `--resume` after SIGKILLs at random moments
(while Python or Ansible starts, while points stream, as a point finishes) restarts every placement where it stood
(same GPUs and port) and ends with every point done exactly once, nothing lost or repeated, no server left.

More kills: SERVESWEEP_PACKED_KILL_CYCLES=10 pytest tests/matrix/test_packed_kills.py -s"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml
from packed_experiment import EXPERIMENT
from test_reliability_kills import REQUESTS, _check_consistent, _port_free, _wait_for_phase
from test_reliability_server import cleanup, manifest, run_dir_of, start

CYCLES = int(os.environ.get("SERVESWEEP_PACKED_KILL_CYCLES", "1"))


def _experiment(tmp: Path, tp_sizes=(1, 4, 8), concurrency=(1, 2, 3)) -> Path:
    exp = json.loads(json.dumps(EXPERIMENT))
    exp["name"] = "packed-kills"
    exp["launcher"].update(workdir=str(tmp / "srv"), stop_timeout_s=20)
    exp["server"]["axes"] = {"tp_size": list(tp_sizes)}
    exp["load"].update(concurrency=list(concurrency), requests=REQUESTS)
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    return f


def _servers_alive(srv: Path) -> list[int]:
    """The emulators whose pidfile names a live process (one work folder per placement's port)."""
    alive = []
    for f in srv.glob("*/server.pid"):
        try:
            p = psutil.Process(int(f.read_text()))
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ValueError, psutil.Error):
            continue
    return alive


def _check_done_once(run_dir: Path, points: int = 9, twins: int = 3) -> dict:
    m = manifest(run_dir)
    alone = [p for p in m["points"].values() if p.get("isolation_of")]  # the isolation sample, run alone
    assert m["status"] == "finished" and len(m["points"]) == points + twins and len(alone) == twins
    assert len(m.get("isolation", {}).get("configs", [])) == twins
    for pid, p in m["points"].items():
        assert p["status"] == "done", (pid, p)
        s = json.loads((run_dir / pid / "summary.json").read_text())
        assert s["requests"]["measured"] == REQUESTS and s["requests"]["ok"] == REQUESTS, (pid, s["requests"])
        assert pq.read_table(run_dir / pid / "records.parquet").num_rows == REQUESTS
    folders = sorted(d.name for d in run_dir.iterdir() if (d / "summary.json").is_file())
    assert folders == sorted(m["points"]), "a stray point folder (half-written or duplicated)"
    assert not list(run_dir.glob(".tmp-*"))
    return m


def _wait_two_streaming(proc, runs: Path, timeout_s: float = 180) -> Path:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        run_dir = run_dir_of(runs)
        m = manifest(run_dir) if run_dir else None
        if m:
            running = {p["config_id"] for p in m["points"].values() if p["status"] == "running"}
            if len(running) >= 2:
                return run_dir
        time.sleep(0.05)
    raise AssertionError("two placements never streamed at the same time")


def test_sigterm_stops_every_placements_server_and_resume_finishes(tmp_path):
    # two configurations, no isolation sample: the signal needs two placements streaming, nothing more (the
    # random kills below keep three configurations and the isolation sample)
    exp = _experiment(tmp_path, tp_sizes=(1, 4), concurrency=(1, 2))
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    args = ["run", str(exp), "--out", str(runs), "--max-parallel", "2", "--no-isolation-sample"]
    proc = start(args, tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        run_dir = _wait_two_streaming(proc, runs)
        assert len(_servers_alive(srv)) >= 2
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
        out = (tmp_path / "run.log").read_text()
        assert rc == 128 + signal.SIGTERM, out[-3000:]
        assert f"servesweep run --resume {run_dir}" in out
        assert "stopped the servers of 2 of 2 placement(s)" in out, out[-3000:]
        assert _servers_alive(srv) == [], "a placement's server outlived the SIGTERM"
        m = manifest(run_dir)
        assert m["status"] == "interrupted" and "running" not in {p["status"] for p in m["points"].values()}
        finished: dict[str, dict] = {}
        _check_consistent(run_dir, finished)  # the points done before the signal, kept byte for byte
        proc = start(["run", "--resume", str(run_dir)], tmp_path, tmp_path / "resume.log")
        assert proc.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text()[-3000:]
        _check_consistent(run_dir, finished)
        m = _check_done_once(run_dir, points=4, twins=0)
        assert m["packing"]["isolation_sample"] is False, "the resume kept the choice"
        assert _servers_alive(srv) == []
    finally:
        cleanup(proc, run_dir, srv)


def test_random_sigkills_of_a_packed_run_then_resume_finish_every_point_exactly_once(tmp_path):
    rng = random.Random(int(os.environ.get("SERVESWEEP_KILL_SEED", "3")))
    exp = _experiment(tmp_path)
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    run_dir: Path | None = None
    proc = None
    finished: dict[str, dict] = {}
    kills: list[str] = []
    placements_seen = None
    try:
        for cycle in range(CYCLES + 1):
            args = ["run", "--resume", str(run_dir)] if run_dir else ["run", str(exp), "--out", str(runs)]
            proc = start([*args, "--max-parallel", "2"], tmp_path, tmp_path / f"cycle{cycle}.log")
            if cycle == CYCLES:
                rc = proc.wait(timeout=600)
                break
            phase = rng.choice(["start", "point", "point", "finish"])
            kill_at = _wait_for_phase(proc, runs, run_dir, phase, rng)
            killed = proc.poll() is None
            if killed:
                os.kill(
                    proc.pid, signal.SIGKILL
                )  # the orchestrator alone: its lanes' Locust and servers live on
                proc.wait(timeout=30)
                kills.append(f"{phase}@{kill_at:.1f}s")
            run_dir = run_dir or run_dir_of(runs)
            if run_dir:
                _check_consistent(run_dir, finished)
                m = manifest(run_dir)
                if m and m.get("packing"):  # a resume keeps every placement where it stood
                    placements_seen = placements_seen or m["packing"]["placements"]
                    assert m["packing"]["placements"] == placements_seen
                if not killed and m and all(p["status"] == "done" for p in m["points"].values()):
                    rc = proc.returncode
                    break
        out = (tmp_path / f"cycle{cycle}.log").read_text()
        assert rc == 0, out[-3000:]
        _check_consistent(run_dir, finished)
        m = _check_done_once(run_dir)
        assert m["packing"]["placements"] == placements_seen
        for p in m["points"].values():  # each point ran where its placement put it
            pl = next(x for x in placements_seen if x["config"] == p["config_id"])
            assert p["point"]["labels"]["gpus"] == pl["gpus"] and p["point"]["base_url"].endswith(
                f":{pl['port']}"
            )
        assert _servers_alive(srv) == [], "a server the killed runs left is still running"
        assert all(_port_free(pl["port"]) for pl in placements_seen)
        assert not [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(str(run_dir) in a for a in (p.info["cmdline"] or []))
        ]
        print(
            f"\n{len(kills)} SIGKILLs of a packed run at {kills} survived; {len(finished)} points, 0 bytes lost"
        )
        assert len(kills) >= min(CYCLES, 2), kills
    finally:
        cleanup(proc, run_dir, srv)
