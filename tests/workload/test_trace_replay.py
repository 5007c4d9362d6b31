"""Trace replay against the emulator (issue 30): a generated Mooncake trace and a session trace, their point's bodies
(`build_workload(point, trace_replay=True)`) sent open loop at their `TraceSchedule` slots by a small sender in this
test (the Locust user does not replay traces yet). The fidelity verdict's expected and measured hit rates agree
within 1 point, and the emulator's ground truth confirms every request's cached tokens and its arrival time.

One emulator for the module; a few seconds of traffic."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from servesweep.config.point import LoadPoint
from servesweep.results.trace_fidelity import trace_fidelity
from servesweep.sim.launch import start_sim
from servesweep.workload.build import build_workload
from servesweep.workload.trace import synth
from servesweep.workload.trace.cache import ideal_cached_tokens

SIM_ARGS = ["--model-path", "Qwen/Qwen3.6-27B", "--enable-cache-report", "--sim-calibration", "speedup=4"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("sim") / "ground_truth.jsonl"
    with start_sim(SIM_ARGS, ground_truth=gt) as s:
        yield s


def model_of(sim) -> str:
    with urllib.request.urlopen(sim.base_url + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def send(url: str, body: bytes, rid: str) -> dict:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", "X-Request-Id": rid})
    usage, first, sent = None, None, time.monotonic_ns()
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode()
            if line.startswith("data: {"):
                obj = json.loads(line[6:])
                if first is None and obj.get("choices"):
                    first = time.monotonic_ns()
                usage = obj.get("usage") or usage
    assert usage is not None, "the stream ended without usage"
    return {**usage, "sent_ns": sent, "first_token_ns": first}


def replay(sim, trace_path, *, speed_up=1.0, prefix="t"):
    """Send the point's bodies at their slots, a session's turns in order (each its delay after the last ended);
    returns (workload, records, {trace index: scheduled monotonic ns})."""
    point = LoadPoint(
        base_url=sim.base_url, concurrency=16, requests=1, workload="trace", trace=str(trace_path),
        trace_speedup=speed_up, model=model_of(sim), probe=False,
    )  # fmt: skip
    w = build_workload(point, trace_replay=True)
    assert w.trace is not None and w.nonce_digits == 0
    sched = w.trace.schedule(start_ns=time.monotonic_ns() + 200_000_000)
    url = sim.base_url + w.path
    records: list[dict] = []
    due: dict[int, int] = {}
    lock = threading.Lock()

    def run(slot_ns, start):
        t = slot_ns
        for k, i in enumerate(start.indices):
            if k:
                d = start.delays_ms[k]
                t = time.monotonic_ns() + int(d * 1e6) if d is not None else max(time.monotonic_ns(), sched.start_ns + start.offsets_ns[k])
            time.sleep(max(0.0, (t - time.monotonic_ns()) / 1e9))
            with lock:
                due[i] = t
            head, tail = w.bodies[i]
            u = send(url, head + tail, f"{prefix}-{i}")
            details = u.get("prompt_tokens_details") or {}
            with lock:
                records.append({
                    "trace_index": i, "prompt_tokens": u["prompt_tokens"],
                    "cached_tokens": details.get("cached_tokens", 0), "sent_ns": u["sent_ns"],
                    "first_token_ns": u["first_token_ns"],
                })  # fmt: skip

    threads = []
    while (nxt := sched.next_start()) is not None:
        slot, start = nxt
        time.sleep(max(0.0, (slot - time.monotonic_ns()) / 1e9 - 0.002))
        th = threading.Thread(target=run, args=(slot, start))
        th.start()
        threads.append(th)
    for th in threads:
        th.join(120)
    return w, records, due


def test_replayed_mooncake_trace_is_cache_faithful(sim, tmp_path):
    s = synth.shared_prefix_requests(16, groups=4, prefix_blocks=2, own_blocks=1, rate_rps=4.0, seed=5)
    path = synth.write_mooncake(tmp_path / "mooncake.jsonl", s.trace)
    w, records, due = replay(sim, path, speed_up=2.0, prefix="mc")
    assert len(records) == 16
    f = trace_fidelity(w.trace.trace, records)
    print(f.verdict)
    assert f.prompt_length_mismatches == 0, f
    assert abs(f.expected_hit_ratio - f.measured_hit_ratio) * 100 <= 1.0, f.verdict
    assert f.faithful and f.verdict.startswith("replay faithful: cache hits ")
    assert f.expected_hit_ratio == pytest.approx(s.expected_hit_ratio) and f.least_hit_ratio is not None
    # the emulator's ground truth: every request's cached tokens are the expected ones (a group's requests come a
    # second apart on the trace's clock, half a second at 2x: long after the first one's prefill)
    gt = {d["id"]: d for d in sim.ground_truth_so_far() if d["id"].startswith("mc-")}
    assert {int(k[3:]): d["cached_tokens"] for k, d in gt.items()} == dict(enumerate(ideal_cached_tokens(w.trace.trace)))
    assert f.requests_cache_off == 0
    late_ms = [(gt[f"mc-{i}"]["recv_ns"] - due[i]) / 1e6 for i in range(16)]
    assert max(late_ms) < 100, late_ms  # a thread woken on a loaded 2-core machine
    ts = [w.trace.trace.requests[i].timestamp_ms / 2 for i in range(16)]
    sent = [(due[i] - due[0]) / 1e6 for i in range(16)]
    assert sent == pytest.approx(ts, abs=1.0)


def test_replayed_sessions_keep_their_order_and_share_each_turns_prefix(sim, tmp_path):
    s = synth.session_requests(sessions=3, turns=3, first_blocks=2, grow_blocks=1, delay_ms=30.0, gap_ms=40.0)
    path = synth.write_sessions(tmp_path / "sessions.jsonl", s.trace)
    w, records, due = replay(sim, path, prefix="ss")
    t = w.trace.trace
    f = trace_fidelity(t, records)
    assert f.faithful, f.verdict
    assert f.expected_hit_ratio == pytest.approx(s.expected_hit_ratio)
    for idx in t.sessions().values():
        times = [due[i] for i in idx]
        assert times == sorted(times) and len(set(times)) == len(times)
