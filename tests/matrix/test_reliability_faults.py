"""Faults at concurrency 100: the emulator injects every kind at 1-20 % rates; every fault lands in its class with
exactly the count the emulator's ground truth records, no Locust user dies (every request ends in a record), and
the healthy requests' measurements still match the ground truth. A probe request hit by a fault is retried."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.faults import FaultPicker, parse_fault_rates
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"
# 1-20 %, every kind; 51 % of requests fail in all
RATES = (
    "429=0.08,500=0.05,503=0.04,disconnect=0.06,error_event=0.05,malformed=0.05,"
    "stall:5=0.03,slow_first_byte:6=0.04,slow_first_byte:0.3=0.01"
)
SIM_ARGS = [
    "--model-path",
    MODEL,
    "--context-length",
    "4096",
    "--max-running-requests",
    "128",
    "--sim-calibration",
    "speedup=8",
]
EXPECTED = {
    "429": "http_429",
    "500": "http_5xx",
    "503": "http_5xx",
    "disconnect": "connection_reset",
    "error_event": "stream_error_event",
    "malformed": "malformed_chunk",
    "stall": "timeout_stall",  # 5 s without a byte > stall_s 2.5 s
    "slow_first_byte": "timeout_first_token",  # headers 6 s late > first_token_s 3 s
}
N = 400


def _expected_class(fault: str | None) -> str | None:
    if fault is None or fault == "slow_first_byte:0.3":  # late, but inside the first-token timeout: healthy
        return None
    return EXPECTED[fault.split(":")[0]]


def _ground_truth(sim, ids: set[str], timeout: float = 15.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        got = {d["id"]: d for d in sim.read_ground_truth() if d["id"] in ids}
        if len(got) == len(ids) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def test_every_fault_at_concurrency_100_lands_in_its_class(tmp_path):
    with start_sim(
        SIM_ARGS + ["--sim-fault-rate", RATES, "--sim-seed", "11"], ground_truth=tmp_path / "gt.jsonl"
    ) as sim:
        point = LoadPoint(
            base_url=sim.base_url,
            model=MODEL,
            probe=False,  # the probe is the subject of the test below
            continuous_usage=True,
            concurrency=100,
            prompt_tokens=200,
            output_tokens=8,
            requests=N,
            first_token_s=3.0,  # margins: a loaded 2-core machine must not fake a timeout
            stall_s=2.5,
        )
        t0 = time.monotonic()
        s = run_point(point, tmp_path / "p")
        took = time.monotonic() - t0
        records = read_parquet(tmp_path / "p" / "records.parquet").to_pylist()
        gt = _ground_truth(sim, {r["request_id"] for r in records})
    # no user died: every request it started ended in a record (a user that dies stops sending)
    assert len(records) >= N and s["requests"]["measured"] == len(records)
    assert len({r["user"] for r in records}) == 100
    # a client that leaves before slow_first_byte's late headers leaves no ground truth line: those, and only
    # those, may be missing, and they must be first-token timeouts
    missing = [r for r in records if r["request_id"] not in gt]
    assert all(r["error_class"] == "timeout_first_token" for r in missing), missing[:3]
    injected: Counter = Counter()
    classified: Counter = Counter(r["error_class"] for r in records if r["error_class"])
    for r in records:
        fault = gt[r["request_id"]]["fault"] if r["request_id"] in gt else "slow_first_byte:6"
        want = _expected_class(fault)
        assert r["error_class"] == want, (fault, r["error_class"], r["error_message"])
        if want:
            injected[want] += 1
    assert classified == injected
    assert s["failures"] == dict(injected)
    assert len(injected) == 7 and sum(injected.values()) >= 0.3 * len(records), injected
    assert s["requests"]["ok"] == len(records) - sum(injected.values())
    # healthy requests measured right: tokens exactly, every chunk's arrival against its write on one clock
    ok = [r for r in records if r["error_class"] is None]
    lag = []
    for r in ok:
        g = gt[r["request_id"]]
        assert r["completion_tokens"] == g["completion_tokens"] == 8
        assert r["chunk_tokens"] == [c[1] for c in g["chunks"]]
        lag.extend(np.subtract(r["chunk_ns"], [c[0] for c in g["chunks"]]))
    lag_ms = np.asarray(lag) / 1e6
    assert np.percentile(lag_ms, 1) > -1.0, lag_ms.min()
    assert np.percentile(lag_ms, 50) < 10.0, np.percentile(lag_ms, 50)
    log = (tmp_path / "p" / "locust.log").read_text()
    assert "Traceback" not in log, log[-2000:]
    print(
        f"\nfaults: {dict(injected)} of {len(records)} requests in {took:.1f} s; healthy chunk lag p50 "
        f"{np.percentile(lag_ms, 50):.2f} ms, p99 {np.percentile(lag_ms, 99):.2f} ms"
    )


def _seed_whose_first_requests_fail(rates: str, n_fail: int) -> int:
    """A seed for which the emulator's fault picker hands 500 to the first `n_fail` requests it sees, then nothing:
    the point's probe requests are the first the emulator gets."""
    table = parse_fault_rates(rates)
    for seed in range(200_000):
        p = FaultPicker(table, seed)
        picks = [p.pick(None) for _ in range(n_fail + 2)]
        if all(f is not None and f.kind == "500" for f in picks[:n_fail]) and picks[n_fail] is None:
            return seed
    raise AssertionError("no seed found")


def test_a_500_on_the_probe_does_not_fail_the_point(tmp_path):
    rates = "500=0.3"
    seed = _seed_whose_first_requests_fail(rates, 1)
    with start_sim(
        SIM_ARGS + ["--sim-fault-rate", rates, "--sim-seed", str(seed)], ground_truth=tmp_path / "gt.jsonl"
    ) as sim:
        point = LoadPoint(
            base_url=sim.base_url, model=MODEL, concurrency=4, prompt_tokens=200, output_tokens=8, requests=8
        )
        s = run_point(point, tmp_path / "p")
        gt = sim.read_ground_truth()
    assert gt[0]["fault"] == "500", "the first request the emulator saw (a probe) got the injected 500"
    assert s["requests"]["measured"] == 8
