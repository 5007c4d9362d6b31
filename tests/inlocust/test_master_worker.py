"""A master and two workers of servesweep's locustfile (`locust -f locustfiles/llm.py --master/--worker`) in this
process, over loopback ZeroMQ (locustrun.DistributedRun), checked as a user checks a distributed point: every
request's record exactly once at the master, as the emulator served it; the request budget split between the
workers; the master's LLM statistics (Locust's rows and servesweep's live ones) the sum of what the workers sent; the
streams running at the end of a duration point recorded; a worker that dies mid-point named, with what it lost.

The master runs servesweep's own command line (driver/command.master_command, what run_point starts for worker
hosts) and the workers the locust_worker role's (`--worker --point-json`), or both are typed by hand as the README
shows. They replace two subprocess tests that checked only this logic (tests/client/test_locust_headless.py, a
master and a worker typed by hand with -t; test_load_duration's records shipped from --processes workers). Beside them, tests/driver/test_local_workers.py and test_multihost.py keep what needs real processes: Locust's
--processes fork, exit statuses and signals, status files per pid, the parent's summary, hosts and networks.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import locust.runners
import pytest
from locustrun import DistributedRun, wait_until
from support import completed_by_emulator

from servesweep.client.clients import counters as _counters
from servesweep.client.live_stats import LiveStats
from servesweep.client.locust_internals import send_stats_now
from servesweep.client.messages import LIVE_REPORT_KEY, RECORDS_REPORT_KEY
from servesweep.config.point import LoadPoint
from servesweep.driver.command import master_command
from servesweep.driver.workers import WorkerState, account
from servesweep.results.records import read_parquet
from servesweep.workload.arrivals import split_budget

MODEL = "Qwen/Qwen3.6-27B"


def _messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def servesweep_master(point: LoadPoint, work) -> list[str]:
    """servesweep's own master command line for this point (driver/command.master_command, what run_point starts for
    worker hosts), from its options on: the locustfile is locustfiles/llm.py's (this session's), the bind port free."""
    (work / "point.json").write_text(point.model_dump_json())
    cmd = master_command(point, work, expect_workers=2, bind_host="127.0.0.1", bind_port=0)
    return cmd[cmd.index("-f") + 2 :]


def role_worker(work) -> list[str]:
    """A worker as the locust_worker role starts it (templates/worker.sh.j2): --worker, the master, the point file."""
    return ["--worker", "--point-json", str(work / "point.json")]


def ground_truth(sim, ids) -> dict[str, dict]:
    return {d["id"]: d for d in sim.ground_truth_so_far() if d["id"] in ids}


def _stats_rows(reports) -> dict[tuple[str, str], dict]:
    """Locust's stats rows as the reports carried them, summed: (name, method) -> count, total time, histogram."""
    out: dict[tuple[str, str], dict] = {}
    for data in reports:
        for e in data["stats"]:
            row = out.setdefault(
                (e["name"], e["method"]), {"n": 0, "fail": 0, "total": 0.0, "hist": Counter()}
            )
            row["n"] += e["num_requests"]
            row["fail"] += e["num_failures"]
            row["total"] += e["total_response_time"]
            row["hist"].update(e["response_times"])
    return out


def _live(payloads) -> LiveStats:
    s = LiveStats()
    for p in payloads:
        s.merge_payload(p)
    return s


def _same_live(a: LiveStats, b: LiveStats) -> None:
    """Every merged number equal (sums of floats to rounding: they were added in another order)."""
    pa_, pb = a.payload(), b.payload()
    for k in ("ok", "failed", "warmup", "errors", "out", "prompt", "prompt_n", "good", "t0", "t1", "bins"):
        assert pa_[k] == pb[k], (k, pa_[k], pb[k])
    assert pa_["sk"].keys() == pb["sk"].keys()
    for k, x in pa_["sk"].items():
        y = pb["sk"][k]
        assert (x["b"], x["n"], x["z"], x["lo"], x["hi"]) == (y["b"], y["n"], y["z"], y["lo"], y["hi"]), k
        assert x["s"] == pytest.approx(y["s"], rel=1e-9), k


def merged_stats_are_the_workers_sum(run: DistributedRun, table) -> None:
    """What the master merged from its workers' reports, Locust's stats rows (with servesweep's LLM TTFT and E2E
    rows) and servesweep's live LLM stats (the web UI's LLM tab), is the sum of what each worker sent, and agrees
    with the records (every request succeeded)."""
    recs = table.to_pylist()
    n = len(recs)
    assert all(r["error_class"] is None for r in recs)  # below: every request has its TTFT and E2E rows
    assert all(any(d.get("stats") for d in w.reports) for w in run.workers), "both workers sent stats"
    # Locust's own rows: the master's are the sum of the workers' reports, and the LLM rows are the records'
    rows = _stats_rows(data for w in run.workers for data in w.reports)
    for key, row in rows.items():
        got = run.master.runner.stats.entries[key]
        assert (got.num_requests, got.num_failures) == (row["n"], row["fail"]), key
        assert got.total_response_time == pytest.approx(row["total"], rel=1e-9), key
        assert Counter(got.response_times) == row["hist"], key
    assert {k: r["n"] for k, r in rows.items()} == {
        ("TTFT", "LLM"): n,
        ("E2E", "LLM"): n,
        ("/v1/chat/completions", "POST"): n,
    }
    ttft = sum((r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in recs)
    e2e = sum((r["end_ns"] - r["sent_ns"]) / 1e6 for r in recs)
    assert rows[("TTFT", "LLM")]["total"] == pytest.approx(ttft, rel=1e-9)
    assert rows[("E2E", "LLM")]["total"] == pytest.approx(e2e, rel=1e-9)
    assert run.master.runner.stats.total.num_requests == n, "the LLM rows stay out of the Aggregated row"

    # servesweep's live LLM stats (the web UI's LLM tab): the master's merge = the workers' deltas summed = records
    sent = [
        data[LIVE_REPORT_KEY]["stats"] for w in run.workers for data in w.reports if LIVE_REPORT_KEY in data
    ]
    master_live = run.master.env.servesweep.live.stats
    assert master_live.ok == n
    _same_live(master_live, _live(sent))
    from_records = LiveStats()
    from_records.add_columns(table.to_pydict())
    _same_live(master_live, from_records)


def test_a_budget_point_on_two_workers_has_every_record_once_at_the_master(sim_fast, tmp_path, caplog):
    """A request budget over two workers (servesweep's master command, the role's workers): each worker does its
    share and quits, the master ends with the last one, and its records file has every request exactly once, as the
    emulator served it; its LLM stats are the sum of the workers'."""
    point = LoadPoint(
        base_url=sim_fast.base_url,
        model=MODEL,
        probe=False,
        concurrency=4,
        prompt_tokens=420,
        output_tokens=8,
        requests=61,
        point_id="mw-budget",
    )
    with DistributedRun(servesweep_master(point, tmp_path), [role_worker(tmp_path)] * 2) as run:
        code = run.run(timeout=60)
    log = _messages(caplog)
    assert code == 0, log[-3000:]
    assert [w.exit_code for w in run.workers] == [0, 0]

    table = read_parquet(tmp_path / "records.parquet")
    recs = table.to_pylist()
    ids = [r["request_id"] for r in recs]
    assert len(recs) == 61 and len(set(ids)) == 61
    assert all(r["error_class"] is None and not r["warmup"] for r in recs)
    gt = ground_truth(sim_fast, set(ids))
    assert set(gt) == set(ids), "every record is a request the emulator served"
    for r in recs:
        d = gt[r["request_id"]]
        assert d["status"] == 200
        assert (r["prompt_tokens"], r["completion_tokens"]) == (d["prompt_tokens"], d["completion_tokens"]), r

    # the budget split: 31 + 30 by worker index, each worker's records all at the master
    per_worker = Counter(r["worker"] for r in recs)
    shares = {w.ctx.worker: w.ctx.budget for w in run.workers}
    assert sorted(shares.values()) == [split_budget(61, 1, 2), split_budget(61, 0, 2)] == [30, 31]
    assert per_worker == shares
    assert all(w.ctx.issued == w.ctx.completed == w.ctx.budget for w in run.workers)
    assert "worker 0 of 2: budget 31" in log and "worker 1 of 2: budget 30" in log

    clients = json.loads((tmp_path / "clients.json").read_text())["clients"]
    workers = {c["worker"]: c for c in clients if c.get("role") != "master"}
    assert set(workers) == set(shares)
    for name, c in workers.items():
        assert c["issued"] == c["completed"] == c["shipped"] == per_worker[name], c
        assert not c.get("missing")

    merged_stats_are_the_workers_sum(run, table)


@pytest.mark.slow  # about 5 s: each worker probes the server when its first spawn brings the point
def test_by_hand_master_and_workers_without_host_split_the_budget(sim_fast, tmp_path, caplog):
    """`locust -f locustfiles/llm.py --master --headless --expect-workers 2 --requests 40 ...` and two `--worker`s
    without --host or any point option (README: the master sends them with the first spawn, and each worker builds its
    prompt bodies then): the budget is split by --expect-workers, every request is recorded once, and the master's
    LLM stats are the sum of the workers'."""
    master = [
        *("--master", "--headless", "--expect-workers", "2", "-u", "4", "-r", "4", "--requests", "40"),
        *("--host", sim_fast.base_url, "--prompt-tokens", "460", "--output-tokens", "16"),
        *("--records", str(tmp_path / "r.parquet"), "--only-summary"),
    ]
    with DistributedRun(master, [["--worker"]] * 2) as run:
        code = run.run(timeout=60)
    log = _messages(caplog)
    assert code == 0, log[-3000:]
    assert [w.exit_code for w in run.workers] == [0, 0]
    assert "worker 0 of 2: budget 20" in log and "worker 1 of 2: budget 20" in log
    table = read_parquet(tmp_path / "r.parquet")
    recs = table.to_pylist()
    assert len(recs) == len({r["request_id"] for r in recs}) == 40
    assert all(r["error_class"] is None and r["completion_tokens"] == 16 for r in recs)
    assert {r["request_id"] for r in recs} == completed_by_emulator(sim_fast, 460)
    assert Counter(r["worker"] for r in recs) == {w.ctx.worker: 20 for w in run.workers}

    merged_stats_are_the_workers_sum(run, table)


def _ended_with_streams_running(run: DistributedRun, recs: list[dict], end: int) -> None:
    """Nothing was sent after the end reached its worker (each stops when the master's end arrives: a message's trip
    after the master's timer at `end`), and streams that were running at `end` finished and were recorded."""
    got_end = {w.ctx.worker: w.end_ns for w in run.workers}
    assert all(got_end.values()), got_end
    assert all(r["sent_ns"] < got_end[r["worker"]] for r in recs), (
        "nothing sent after the end reached its worker"
    )
    assert any(r["end_ns"] > end for r in recs), "streams were running at the end and finished"


def test_a_duration_point_on_two_workers_records_the_streams_running_at_its_end(sim_fast, tmp_path, caplog):
    """A duration point over two workers (servesweep's master command): at its end the master tells the workers,
    they finish their streams in flight, ship every record and say so; then the master quits. Every stream the
    emulator served has its record, some ended after the time was up, none lost."""
    point = LoadPoint(
        base_url=sim_fast.base_url,
        model=MODEL,
        probe=False,
        concurrency=4,
        prompt_tokens=380,
        output_tokens=100,
        duration_s=1.0,
        point_id="mw-duration",
    )
    with DistributedRun(servesweep_master(point, tmp_path), [role_worker(tmp_path)] * 2) as run:
        code = run.run(timeout=60)
    log = _messages(caplog)
    assert code == 0 and [w.exit_code for w in run.workers] == [0, 0], log[-3000:]
    recs = read_parquet(tmp_path / "records.parquet").to_pylist()
    assert sorted(r["request_id"] for r in recs) == sorted(completed_by_emulator(sim_fast, 380))
    assert all(r["error_class"] is None and r["completion_tokens"] == 100 for r in recs)
    # the end: the master's test start + the duration (the records' clock is this process's monotonic one)
    _ended_with_streams_running(run, recs, run.master.test_start_ns + int(1e9))
    assert run.master.env.servesweep.drained == {w.runner.client_id for w in run.workers}
    by_worker = Counter(r["worker"] for r in recs)
    assert by_worker == {w.ctx.worker: w.ctx.issued for w in run.workers}, (
        "each worker's requests all arrived"
    )
    assert "did not finish in time" not in log


@pytest.mark.slow  # about 6 s: -t 3 (host-less workers probe the server and build their bodies first)
def test_by_hand_run_time_on_a_master_ends_like_a_duration_point(sim_fast, tmp_path, caplog):
    """`locust -f locustfiles/llm.py --master --headless -t 3 ...` and two host-less `--worker`s: at -t the master
    ends the run as a servesweep duration point ends (the workers finish their streams and ship every record, then it
    quits); Locust's own -t, which would quit before those records arrive, is left as a backstop."""
    master = [
        *("--master", "--headless", "--expect-workers", "2", "-u", "4", "-r", "4", "-t", "3"),
        *("--host", sim_fast.base_url, "--prompt-tokens", "440", "--output-tokens", "100"),
        *("--records", str(tmp_path / "r.parquet"), "--only-summary"),
    ]
    with DistributedRun(master, [["--worker"]] * 2) as run:
        assert run.master.opts.run_time > 3 + run.master.env.stop_timeout, "Locust's -t: a backstop"
        code = run.run(timeout=60)
    log = _messages(caplog)
    assert code == 0 and [w.exit_code for w in run.workers] == [0, 0], log[-3000:]
    recs = read_parquet(tmp_path / "r.parquet").to_pylist()
    assert sorted(r["request_id"] for r in recs) == sorted(completed_by_emulator(sim_fast, 440))
    assert all(r["error_class"] is None and r["completion_tokens"] == 100 for r in recs)
    _ended_with_streams_running(run, recs, run.master.test_start_ns + int(3e9))
    assert run.master.env.servesweep.drained == {w.runner.client_id for w in run.workers}
    assert set(Counter(r["worker"] for r in recs)) == {w.ctx.worker for w in run.workers}


@pytest.mark.slow  # about 5 s: the survivor's share at a constant rate, then Locust's heartbeat check
def test_a_worker_killed_mid_point_is_named_with_the_requests_it_lost(
    sim_fast, tmp_path, caplog, monkeypatch
):
    """One of two workers stops dead mid-point (as a SIGKILL looks to the master: no last report, no quit, its
    heartbeats stop) while a constant rate keeps both busy. The master marks it missing and, once the other has done
    its share, ends the point by itself; what reached it is kept, each record once; the parent's accounting (from
    clients.json and the workers' last counters) names the lost worker with the requests it lost.

    Locust's master calls a worker missing after HEARTBEAT_LIVENESS + 1 heartbeat ticks without one (4 to 5 s);
    here after 2 to 3, patched as Locust's own runner tests patch its heartbeat constants: that it is noticed is
    the point, not how long Locust waits."""
    monkeypatch.setattr(locust.runners, "HEARTBEAT_LIVENESS", 1)
    point = LoadPoint(
        base_url=sim_fast.base_url,
        model=MODEL,
        probe=False,
        concurrency=4,
        prompt_tokens=340,
        output_tokens=32,
        requests=40,
        arrival="constant",
        rate_rps=24.0,
        point_id="mw-kill",
    )
    with DistributedRun(servesweep_master(point, tmp_path), [role_worker(tmp_path)] * 2) as run:
        survivor, victim = run.workers
        run.start()
        t0 = time.monotonic()
        # a few of its records reach the master with a report (its regular one, every 3 s, made now), then it
        # dies with streams in flight and finished records not shipped yet
        wait_until(
            lambda: getattr(victim.env, "servesweep", None) and victim.ctx.completed >= 3, 20, "3 done"
        )
        send_stats_now(victim.runner)
        wait_until(lambda: victim.ctx.in_flight > 0, 20, "the victim has requests in flight", 0.01)
        in_flight, status = victim.ctx.in_flight, _counters(victim.ctx)  # what its status file has last
        victim.kill()
        run.wait(timeout=60)
        took = time.monotonic() - t0
    log = _messages(caplog)
    assert run.master.exit_code == 0 and survivor.exit_code == 0, log[-3000:]
    assert "failed to send heartbeat, setting state to missing" in log
    assert took < 15, f"the point ended by itself ({took:.1f} s)"

    table = read_parquet(tmp_path / "records.parquet")
    recs = table.to_pylist()
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids))
    served = completed_by_emulator(sim_fast, 340)
    assert set(ids) <= served
    by_worker = Counter(r["worker"] for r in recs)
    assert by_worker[survivor.ctx.worker] == survivor.ctx.budget == 20
    shipped = sum(len(d.get(RECORDS_REPORT_KEY, {}).get("request_id", ())) for d in victim.reports)
    assert 3 <= by_worker[victim.ctx.worker] == shipped, "what it shipped before it died is kept"
    assert shipped + in_flight <= status["issued"], "its requests in flight never arrived"
    assert in_flight > 0

    clients = {c["worker"]: c for c in json.loads((tmp_path / "clients.json").read_text())["clients"]}
    assert clients[victim.ctx.worker]["missing"] and clients[victim.ctx.worker]["last_state"] == "missing"
    assert not clients[survivor.ctx.worker].get("missing")

    # driver/point._point_summary's accounting: `missing` from clients.json, each worker's last counters (its status
    # file), the survivor's exit status 0, the victim's unknown (what a vanished local worker leaves)
    missing = {c["worker"] for c in clients.values() if c.get("missing")}
    states = [
        WorkerState("local", w.name, i, os.getpid(), code, False, st, None, note)
        for i, (w, code, st, note) in enumerate(
            [
                (survivor, 0, _counters(survivor.ctx), None),
                (victim, None, status, "stopped without quitting or an exit status"),
            ]
        )
    ]
    acc = account(states, table, log, missing=missing)
    lost = status["issued"] - shipped
    assert acc["degraded"] and acc["lost_requests"] == lost > 0
    assert acc["problems"] == [
        f"worker {victim.ctx.worker} on local (#1) stopped without quitting or an exit status (its heartbeat went"
        f" missing): {lost} of its {status['issued']} requests lost"
    ]
