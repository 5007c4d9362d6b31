"""Local worker processes (run_point(workers=N)): a request budget split between them, and a worker killed
mid-point named with the requests it lost, the point marked degraded and still ending by itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"


def test_budget_split_and_a_killed_worker(tmp_path):
    with start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=4"], ground_truth=tmp_path / "gt"
    ) as sim:
        # A request budget over two worker processes: each does its share, the point ends when both are done.
        p = LoadPoint(
            base_url=sim.base_url,
            model=MODEL,
            probe=False,
            concurrency=4,
            prompt_tokens=64,
            output_tokens=8,
            requests=61,
        )
        s = run_point(p, tmp_path / "ok", workers=2)
        recs = read_parquet(tmp_path / "ok" / "records.parquet").to_pylist()
        assert s["requests"]["measured"] == s["requests"]["ok"] == len(recs) == 61
        counts = sorted(row["records"] for row in s["workers"]["workers"])
        assert counts == [30, 31], s["workers"]
        assert all(
            row["issued"] == row["records"] and row["exit_code"] == 0 for row in s["workers"]["workers"]
        )
        assert not s["degraded"] and s["problems"] == []
        assert len(s["client_headroom"]["workers"]) == 2
        assert all(
            w["cpu_pct"] is not None and w["loop_lag_p99_ms"] is not None
            for w in s["client_headroom"]["workers"]
        )

        # The same with one worker SIGKILLed mid-point: a constant 40/s keeps both busy for ~5 s.
        before = {d["id"] for d in sim.read_ground_truth()}
        p = p.model_copy(
            update={"requests": 200, "arrival": "constant", "rate_rps": 40.0, "output_tokens": 32}
        )
        out = tmp_path / "kill"
        status = out / ".work" / "status"
        killed: list[int] = []

        def kill_one() -> None:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                files = sorted(status.glob("*.json")) if status.is_dir() else []
                if len(files) == 2 and all('"issued": 0,' not in f.read_text() for f in files):
                    break
                time.sleep(0.1)
            time.sleep(1.5)  # streams in flight and records not shipped yet (workers report every 3 s)
            pid = int(Path(files[0]).stem)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        t = threading.Thread(target=kill_one, daemon=True)
        t.start()
        t0 = time.monotonic()
        s = run_point(p, out, workers=2)
        took = time.monotonic() - t0
        t.join(5)
        served = {d["id"] for d in sim.stop_and_read_ground_truth()} - before

    assert killed, "the killer thread found the two workers"
    assert took < 45, f"the point ended by itself ({took:.1f} s)"
    got = {r["request_id"] for r in read_parquet(out / "records.parquet").to_pylist()}
    true_lost = served - got
    assert got <= served and true_lost, "the killed worker's requests in flight never reached the master"
    assert s["degraded"]
    rows = {row["worker"].split(":")[1]: row for row in s["workers"]["workers"]}
    victim, survivor = rows.pop(str(killed[0])), next(iter(rows.values()))
    assert victim["exit_code"] == 128 + signal.SIGKILL and victim["heartbeat_missing"], victim
    assert 1 <= victim["lost"] <= len(true_lost), (victim, len(true_lost))
    assert survivor["exit_code"] == 0 and survivor["lost"] == 0 and survivor["records"] == 100, survivor
    assert len(s["problems"]) == 1
    assert f":{killed[0]} on local" in s["problems"][0] and "exited with 137" in s["problems"][0], s[
        "problems"
    ]
    assert f"{victim['lost']} of its {victim['issued']} requests lost" in s["problems"][0]


def test_duration_point_on_workers_keeps_the_streams_running_at_the_end(tmp_path):
    """At the end of a duration point the workers finish their streams in flight and ship them before the master
    quits: every request the server saw has a record, some ended after the time was up, none lost."""
    with start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=2"], ground_truth=tmp_path / "gt"
    ) as sim:
        p = LoadPoint(
            base_url=sim.base_url,
            model=MODEL,
            probe=False,
            concurrency=6,
            prompt_tokens=64,
            output_tokens=160,
            duration_s=2.0,
        )
        s = run_point(p, tmp_path / "p", workers=2)
        served = {d["id"] for d in sim.stop_and_read_ground_truth()}
    recs = read_parquet(tmp_path / "p" / "records.parquet").to_pylist()
    assert {r["request_id"] for r in recs} == served
    assert all(r["error_class"] is None and r["completion_tokens"] == 160 for r in recs)
    # the point's stop came after its last request was sent: the users' streams in flight then were finished and
    # kept (an aborted one would have fewer tokens, a dropped one no record). Counted from the last send, not from
    # the first send + 2 s: on a loaded machine the users' spawn lags the master's clock by a second or more.
    last = max(r["scheduled_ns"] for r in recs)
    running = {(r["worker"], r["user"]) for r in recs if r["scheduled_ns"] <= last < r["end_ns"]}
    assert len(running) >= 4, f"streams running at the end, finished: {sorted(running)}"
    assert not s["degraded"] and s["workers"]["lost_requests"] == 0, s["problems"]
