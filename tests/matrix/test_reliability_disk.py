"""Disk trouble: a results folder that cannot be written, or has no room for the run, is refused before any server
starts, with a message naming the folder and what is wrong; one that fills up mid-run stops the run cleanly (exit
4) without harming the points already finished, and leaves the server stopped; once space is back, `--resume`
measures the rest into the same folder."""

from __future__ import annotations

import errno
import hashlib
import json
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
from support import SERVESWEEP
from test_reliability_server import cleanup, manifest, run_dir_of, start, write_experiment


def _mount_tmpfs(where: Path, size: str, *, ro: bool = False) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if ro else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], check=True)
    return where


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(SERVESWEEP + args, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_unwritable_or_too_small_results_folder_is_refused_before_the_run(tmp_path):
    exp = write_experiment(tmp_path, retries=0, name="disk")
    ro = _mount_tmpfs(tmp_path / "ro", "1m", ro=True)
    small = _mount_tmpfs(tmp_path / "small", "1m")
    try:
        r = _run(["run", str(exp), "--out", str(ro / "runs")], tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr  # could not run
        assert f"results folder {ro / 'runs'}: cannot create it (Read-only file system)" in r.stderr, r.stderr
        r = _run(["run", str(exp), "--out", str(small)], tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr  # could not run
        msg = " ".join(r.stderr.split())
        assert f"results folder {small}: 1.0 MiB free, the run needs about" in msg, msg
        assert "choose another folder with --out" in msg
        assert list(small.iterdir()) == [], "nothing written into a folder that was refused"
        assert not list((tmp_path / "srv").glob("*/server.pid")), "no server started"
    finally:
        _umount(ro)
        _umount(small)


def _fill(folder: Path) -> int:
    """Fill the file system to the last byte; returns the bytes written."""
    n = 0
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                n += 65536
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return n


def test_results_folder_filling_up_mid_run_stops_cleanly_and_keeps_finished_points(tmp_path):
    exp = write_experiment(tmp_path, retries=0, name="disk")
    disk = _mount_tmpfs(tmp_path / "disk", "16m")
    runs, srv = disk / "runs", tmp_path / "srv"
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        deadline = time.monotonic() + 180
        first = None
        while time.monotonic() < deadline and proc.poll() is None:
            run_dir = run_dir or run_dir_of(runs)
            m = manifest(run_dir) if run_dir else None
            if m:
                pts = list(m["points"].items())
                if pts[0][1]["status"] == "done" and pts[1][1]["status"] == "running":
                    first = pts[0][0]
                    break
            time.sleep(0.1)
        assert first, (tmp_path / "run.log").read_text()[-3000:]
        kept = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in (run_dir / first).iterdir()}
        time.sleep(1.0)  # the second point is streaming
        _fill(disk)
        rc = proc.wait(timeout=180)
        out = " ".join((tmp_path / "run.log").read_text().split())
        assert rc == 4, out[-3000:]
        assert "stopped:" in out and "finished points are kept" in out and "--resume" in out, out[-2000:]
        assert "Traceback" not in out, out[-3000:]
        # the finished point is untouched and readable; the manifest is whole; no half-written point folder
        assert {
            f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in (run_dir / first).iterdir()
        } == kept
        assert pq.read_table(run_dir / first / "records.parquet").num_rows == 3
        m = manifest(run_dir)
        assert m is not None and m["points"][first]["status"] == "done"
        second = list(m["points"])[1]
        assert m["points"][second]["status"] in ("pending", "running")  # never "done" without its folder
        assert not (run_dir / second).exists() and not list(run_dir.glob(".tmp-*"))
        # the server was stopped (Ansible's artifacts went elsewhere: the disk is full)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", m["port"])) != 0
        assert json.loads((run_dir / first / "summary.json").read_text())["requests"]["ok"] == 3
        # space is back: the resume measures the rest into the same folder, the finished point still untouched
        (disk / "filler").unlink()
        r = subprocess.run(SERVESWEEP + ["run", "--resume", str(run_dir)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=240)  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        m = manifest(run_dir)
        assert m["status"] == "finished" and all(p["status"] == "done" for p in m["points"].values()), m[
            "points"
        ]
        assert {
            f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in (run_dir / first).iterdir()
        } == kept
        assert pq.read_table(run_dir / second / "records.parquet").num_rows == 3
        assert m["points"][first]["attempts"] == 1, "the finished point was not measured again"
    finally:
        cleanup(proc, run_dir, srv)
        _umount(disk)
