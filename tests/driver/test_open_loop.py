"""Open-loop arrivals: constant and Poisson schedules at a rate, split across worker processes, with the
concurrency as a cap; the schedule lag and latency from the scheduled time show what a closed loop would hide."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim
from servesweep.workload.arrivals import Arrivals, split_budget

MODEL = "Qwen/Qwen3.6-27B"


def _point(sim, **kw) -> LoadPoint:
    base = dict(base_url=sim.base_url, model=MODEL, probe=False, prompt_tokens=32, output_tokens=4)
    return LoadPoint(**{**base, **kw})


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--model-path", MODEL, "--sim-calibration", "speedup=8"]) as s:
        yield s


def test_poisson_arrivals_over_two_workers_match_the_rate(sim, tmp_path):
    """1,000 requests at 100/s over two worker processes (each 50/s on its own seeded stream): the achieved rate,
    from the schedule and from when requests were actually sent, is within 5 % of the asked one."""
    p = _point(sim, concurrency=16, requests=1000, arrival="poisson", rate_rps=100.0, seed=7)
    s = run_point(p, tmp_path / "p", workers=2)
    recs = read_parquet(tmp_path / "p" / "records.parquet").to_pylist()
    assert s["requests"]["ok"] == s["requests"]["measured"] == len(recs) == 1000, s["requests"]
    by_worker = {}
    for r in recs:
        by_worker[r["worker"]] = by_worker.get(r["worker"], 0) + 1
    assert sorted(by_worker.values()) == [500, 500], "the budget is split evenly between the two workers"

    # The seed fixes the draw (1,000 Poisson arrivals scatter their rate by ~3 %); what is checked is that the
    # schedule is Poisson at the rate and that requests really left when it said.
    a = s["arrivals"]
    assert a["n"] == 1000 and a["processes"] == 2 and abs(a["rate_rps"] - 100.0) / 100.0 < 0.05, a
    assert 0.85 < a["interarrival_cv"] < 1.15, "exponential gaps: CV about 1"
    sent_rate = 0.0
    for w in by_worker:  # each worker's own stream is Poisson at half the rate, and sent at that rate
        t = np.sort([r["sent_ns"] for r in recs if r["worker"] == w]) / 1e9
        sent_rate += (len(t) - 1) / (t[-1] - t[0])
        assert abs((len(t) - 1) / (t[-1] - t[0]) - 50.0) / 50.0 < 0.1
    assert abs(sent_rate - 100.0) / 100.0 < 0.05, sent_rate
    # the cap (16 streams of a few ms) never binds: requests leave at their slot
    assert s["schedule_lag_ms"]["p50"] < 20, s["schedule_lag_ms"]
    assert s["ttft_from_scheduled_ms"]["p50"] >= s["ttft_ms"]["p50"]
    assert not s["degraded"] and s["problems"] == []
    assert [w["worker"] for w in s["client_headroom"]["workers"]] == sorted(by_worker)


def test_constant_rate_is_evenly_spaced_and_the_lag_shows_when_the_cap_binds(sim, tmp_path):
    # A constant rate the cap can carry: slots every 10 ms, sent on time.
    p = _point(sim, concurrency=8, requests=150, arrival="constant", rate_rps=100.0)
    s = run_point(p, tmp_path / "even")
    assert s["requests"]["ok"] == 150
    assert abs(s["arrivals"]["rate_rps"] - 100.0) < 0.5 and s["arrivals"]["interarrival_cv"] < 0.01
    assert s["schedule_lag_ms"]["p50"] < 20

    # The same rate with a cap of 2 streams of ~100 ms each (capacity ~20/s): requests wait for a free stream and
    # keep their slot, so the lag grows through the point and latency from the schedule dwarfs the usual one.
    p = _point(sim, concurrency=2, requests=40, output_tokens=48, arrival="constant", rate_rps=100.0)
    s = run_point(p, tmp_path / "capped")
    recs = sorted(
        read_parquet(tmp_path / "capped" / "records.parquet").to_pylist(), key=lambda r: r["scheduled_ns"]
    )
    assert s["requests"]["ok"] == 40
    assert abs(s["arrivals"]["rate_rps"] - 100.0) < 0.5, "the schedule is the asked one ..."
    assert s["request_rate"] < 60, "... but the server-bound cap completes far fewer"
    lags = [(r["sent_ns"] - r["scheduled_ns"]) / 1e6 for r in recs]
    assert lags[-1] > lags[0] + 100 and s["schedule_lag_ms"]["p99"] > 100, s["schedule_lag_ms"]
    assert s["e2e_from_scheduled_ms"]["p99"] > 2 * s["e2e_ms"]["p99"]
    assert s["ttft_from_scheduled_ms"]["p50"] > s["ttft_ms"]["p50"] + 50


@pytest.mark.fast
def test_schedules_are_seeded_deterministic_and_split_exactly():
    a = Arrivals("poisson", 100.0, seed=3, index=1, count=2).offsets_s(2000)
    assert a == Arrivals("poisson", 100.0, seed=3, index=1, count=2).offsets_s(2000), "same seed, same slots"
    assert a != Arrivals("poisson", 100.0, seed=3, index=0, count=2).offsets_s(2000), "each worker its own"
    long = Arrivals("poisson", 100.0, seed=3, index=1, count=2).offsets_s(100_000)
    assert abs(100_000 / long[-1] - 50.0) / 50.0 < 0.01, "worker 1 of 2 runs at rate/2"
    gaps = np.diff(long)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02, "exponential gaps"
    both = np.sort(
        Arrivals("constant", 100.0, index=0, count=2).offsets_s(50)
        + Arrivals("constant", 100.0, index=1, count=2).offsets_s(50)
    )
    assert np.allclose(np.diff(both), 0.01), "two constant-rate workers interleave into one even stream"
    assert [split_budget(1001, i, 3) for i in range(3)] == [334, 334, 333]
    with pytest.raises(ValueError, match="rate_rps must be a positive number"):
        Arrivals("poisson", 0.0)
    with pytest.raises(ValidationError, match="rate_rps: arrival 'poisson' needs a rate"):
        LoadPoint(
            base_url="http://h",
            concurrency=1,
            prompt_tokens=1,
            output_tokens=1,
            requests=1,
            arrival="poisson",
        )
    with pytest.raises(ValidationError, match="a rate needs arrival 'constant' or 'poisson'"):
        LoadPoint(
            base_url="http://h", concurrency=1, prompt_tokens=1, output_tokens=1, requests=1, rate_rps=2
        )
