"""The wall clock steps by an hour, forward or back, in the middle of a point (an NTP step, a VM resumed, a person
with `date -s`): every duration servesweep reports still comes from the monotonic clock, so the point measures
what it measured without the step (issue 35).

The step is process-local and needs no LD_PRELOAD: a `sitecustomize.py` on PYTHONPATH (every servesweep process of
the run imports it: the CLI, the Locust process) adds the step to `time.time()` and `time.time_ns()` from the
CLOCK_MONOTONIC instant the test writes into a file. Why not a real step: `unshare --time` namespaces offset only
CLOCK_MONOTONIC and CLOCK_BOOTTIME, never CLOCK_REALTIME (time_namespaces(7)), and `date -s` would step the clock
of the whole machine, which other suites share. The kernel's receive stamps (SO_TIMESTAMPNS, on CLOCK_REALTIME) do
not see a process-local step, so the Locust process stamps chunks in user space here (client/rxstamp.py converts
a kernel stamp with the wall-to-monotonic offset of the very read, which a real step moves with it).

The emulator runs without the fake: its ground truth is the yardstick. A duration point (8 s) is the sharp case:
a deadline on the wall clock would end it at once (forward) or never (back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow.parquet as pq
import pytest

from servesweep.sim.launch import read_ground_truth, start_sim

MODEL = "Qwen/Qwen3.6-27B"
DURATION_S = 8.0
STEP_S = 3600.0

SITECUSTOMIZE = textwrap.dedent(
    """\
    # the test's faked wall clock (tests/driver/test_faults_clock.py): time.time() and time.time_ns() jump by
    # SERVESWEEP_TEST_WALL_STEP_S from the CLOCK_MONOTONIC instant written in SERVESWEEP_TEST_WALL_STEP_FILE
    import os as _os
    import socket as _socket
    import time as _time

    _FILE = _os.environ.get("SERVESWEEP_TEST_WALL_STEP_FILE")
    if _FILE:
        _STEP = float(_os.environ["SERVESWEEP_TEST_WALL_STEP_S"])
        _t, _tns, _mono = _time.time, _time.time_ns, _time.monotonic
        _state = [None, -1.0]  # the step's monotonic instant, when the file was last read

        def _offset():
            now = _mono()
            if _state[0] is None and now - _state[1] > 0.05:
                _state[1] = now
                try:
                    with open(_FILE) as f:
                        _state[0] = float(f.read())
                except (OSError, ValueError):
                    pass
            return _STEP if _state[0] is not None and now >= _state[0] else 0.0

        _time.time = lambda: _t() + _offset()
        _time.time_ns = lambda: _tns() + int(_offset() * 1e9)
        # the kernel's receive stamps are on the real CLOCK_REALTIME: stamp in user space (client/rxstamp.py)
        _socket.SO_TIMESTAMPNS = None
    """
)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clock")
    s = start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=2"],
        ground_truth=tmp / "gt.jsonl",
        env={"SERVESWEEP_TEST_WALL_STEP_FILE": ""},  # the emulator keeps the real clock
    )
    yield s
    s.stop()


def _served(sim) -> set[str]:
    return {d["id"] for d in read_ground_truth(sim.ground_truth_path)}


@pytest.mark.parametrize("step", [STEP_S, -STEP_S], ids=["forward", "back"])
def test_wall_clock_step_mid_point_changes_no_duration(sim, tmp_path, step):
    fake = tmp_path / "fakeclock"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    step_file = tmp_path / "step_at"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])),
        "SERVESWEEP_TEST_WALL_STEP_FILE": str(step_file),
        "SERVESWEEP_TEST_WALL_STEP_S": str(step),
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }
    before = _served(sim)
    cmd = [sys.executable, "-m", "servesweep.cli", "load", "--base-url", sim.base_url, "--model", MODEL,
           "--concurrency", "2", "--duration", f"{DURATION_S:g}s", "--prompt-tokens", "64",
           "--output-tokens", "24", "--out", str(tmp_path / "runs")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stepped: dict[str, float] = {}

    def step_mid_point() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end and proc.poll() is None:
            if (
                len(_served(sim) - before) >= 6
            ):  # the point streams (the ground truth is flushed every second)
                step_file.write_text(repr(time.monotonic()))
                stepped["at"] = time.monotonic()
                return
            time.sleep(0.2)

    t = threading.Thread(target=step_mid_point, daemon=True)
    t.start()
    t_start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=DURATION_S + 150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        t.join(5)
    elapsed = time.monotonic() - t_start
    assert proc.returncode == 0, out[-4000:]
    assert "at" in stepped, "the step never happened"
    assert elapsed < DURATION_S + 90, out[-2000:]
    [summary_path] = (tmp_path / "runs").glob("*/*/summary.json")
    s = json.loads(summary_path.read_text())
    # the step happened while the point ran, and the point still lasted its 8 s (the window of its records)
    t0_real = time.time() - elapsed  # this process's clock is the real one
    assert s["started_unix"] == pytest.approx(t0_real, abs=60), "stamped before the step: the real time"
    assert DURATION_S - 1.0 <= s["window_s"] <= DURATION_S + 4.0, s["window_s"]
    assert 0 < s["wall_s"] < elapsed + 1, f"wall_s {s['wall_s']}: taken on the wall clock across the step"
    assert s["requests"]["failed"] == 0 and s["requests"]["ok"] >= 6, s["requests"]
    # every record's durations are monotonic ones: none negative, none an hour long, and each request's end to
    # end time matches the emulator's own (real clock) within the network and scheduling slack
    t = pq.read_table(summary_path.parent / "records.parquet").to_pylist()
    gt = {d["id"]: d for d in read_ground_truth(sim.ground_truth_path)}
    for r in t:
        e2e = (r["end_ns"] - r["sent_ns"]) / 1e9
        assert 0 < e2e < 30, (r["request_id"], e2e)
        assert r["first_token_ns"] is None or r["sent_ns"] <= r["first_token_ns"] <= r["end_ns"]
        assert r["chunk_ns"] == sorted(r["chunk_ns"])
        wall_sent = (r["sent_ns"] + r["mono_to_wall_ns"]) / 1e9
        assert abs(wall_sent - t0_real) < 120, "a record's wall stamp follows the clock it started with"
    spans = _gt_spans(gt, [r["request_id"] for r in t])
    if spans:
        errs = sorted(
            abs((r["end_ns"] - r["sent_ns"]) / 1e9 - spans[r["request_id"]])
            for r in t
            if r["request_id"] in spans
        )
        assert errs[len(errs) // 2] < 0.25, errs[-5:]
    print(f"\nwall clock stepped {step:+g} s mid-point: window {s['window_s']:.2f} s, wall_s {s['wall_s']:.1f} s, "
          f"{s['requests']['ok']} ok, command {elapsed:.1f} s")  # fmt: skip


def _gt_spans(gt: dict[str, dict], ids: list[str]) -> dict[str, float]:
    """The emulator's own duration of each request (its first to its last stamp), where its ground truth has them."""
    out = {}
    for i in ids:
        d = gt.get(i)
        if not d:
            continue
        if isinstance(d.get("recv_ns"), int) and isinstance(d.get("end_ns"), int):
            out[i] = (d["end_ns"] - d["recv_ns"]) / 1e9
    return out


# ---------------------------------------------------------------- a remote worker's watch of its master


def _master_and_worker(sim, tmp_path, *, duration_s: float, silence_s: float, step: float):
    """A headless master (servesweep's own command: driver/command.master_command) and one worker started as the
    locust_worker role starts it (`--worker --point-json`, its parent watched, SERVESWEEP_MASTER_SILENCE_S), the
    worker alone on the faked wall clock. Returns (master, worker, step_file, worker log path)."""
    from servesweep.config.point import LoadPoint
    from servesweep.driver.command import LOCUSTFILE, master_command
    from servesweep.net import free_port

    fake = tmp_path / "fakeclock"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    work = tmp_path / "work"
    work.mkdir()
    point = LoadPoint(base_url=sim.base_url, model=MODEL, probe=False, concurrency=2, prompt_tokens=64,
                      output_tokens=24, duration_s=duration_s)  # fmt: skip
    (work / "point.json").write_text(point.model_dump_json())
    port = free_port()
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base.pop("SERVESWEEP_WATCH_PARENT", None)
    master = subprocess.Popen(
        master_command(point, work, expect_workers=1, bind_host="127.0.0.1", bind_port=port, max_wait_s=60),
        env={**base, "SERVESWEEP_WATCH_PARENT": "0"},
        stdout=(work / "master.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    step_file = tmp_path / "step_at"
    wlog = work / "worker.log"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--worker",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--point-json",
            str(work / "point.json"),
        ],  # fmt: skip
        env={
            **base,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])),
            "SERVESWEEP_TEST_WALL_STEP_FILE": str(step_file),
            "SERVESWEEP_TEST_WALL_STEP_S": str(step),
            "SERVESWEEP_MASTER_SILENCE_S": str(silence_s),
        },
        stdout=wlog.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return master, worker, step_file, wlog


def _wait_streaming(sim, before: set[str], procs, n: int = 4) -> None:
    end = time.monotonic() + 90
    while len(_served(sim) - before) < n:
        assert time.monotonic() < end, "the worker never streamed"
        assert all(p.poll() is None for p in procs), "a Locust process ended before the point streamed"
        time.sleep(0.2)


def _reap(*procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_wall_clock_step_forward_is_no_master_silence(sim, tmp_path):
    """The worker's wall clock jumps an hour ahead mid-point while its master keeps sending heartbeats: the worker
    must not take the jump for an hour of silence (neither servesweep's 3 s watch nor Locust's own 60 s check, both
    of which read the wall clock before): it runs the point to its end and ships its records."""
    before = _served(sim)
    master, worker, step_file, wlog = _master_and_worker(
        sim, tmp_path, duration_s=8.0, silence_s=3.0, step=STEP_S
    )
    try:
        _wait_streaming(sim, before, (master, worker))
        step_file.write_text(repr(time.monotonic()))
        master.wait(120)
        worker.wait(30)
    finally:
        _reap(master, worker)
    log = wlog.read_text()
    assert "no heartbeat from the master" not in log, log[-3000:]
    assert "Didn't get heartbeat" not in log, log[-3000:]
    assert worker.returncode == 0, log[-3000:]
    assert master.returncode == 0, (tmp_path / "work" / "master.log").read_text()[-3000:]
    t = pq.read_table(tmp_path / "work" / "records.parquet").to_pylist()
    assert t and all(r["error_class"] is None for r in t), t[:3]
    # the worker kept streaming after the step: the point's 8 s hold records from its second half
    first = min(r["sent_ns"] for r in t)
    assert max(r["end_ns"] for r in t) - first > 6e9


def test_wall_clock_step_back_then_master_dies_worker_stops(sim, tmp_path):
    """The master host dies (SIGKILL, no goodbye), then the worker's wall clock steps an hour back: its last
    heartbeat now lies an hour in the future of the wall clock. The worker still notices the silence within its
    SERVESWEEP_MASTER_SILENCE_S (3 s) and stops (exit 4), instead of streaming at a dead master for an hour."""
    before = _served(sim)
    master, worker, step_file, wlog = _master_and_worker(
        sim, tmp_path, duration_s=300.0, silence_s=3.0, step=-STEP_S
    )
    try:
        _wait_streaming(sim, before, (master, worker))
        os.killpg(master.pid, 9)
        master.wait(10)
        step_file.write_text(repr(time.monotonic()))
        t0 = time.monotonic()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker still runs 30 s after its master died: " + wlog.read_text()[-3000:])
        took = time.monotonic() - t0
    finally:
        _reap(master, worker)
    log = wlog.read_text()
    assert worker.returncode == 4, log[-3000:]
    assert "no heartbeat from the master" in log, log[-3000:]
    assert took < 3.0 + 8.0, took
