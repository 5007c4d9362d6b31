"""results/diagnosis.py: the verdict of a point and the knee of a sweep.

The fast tier checks each threshold on synthetic summaries and records (no process); the emulator tier (one
module-scoped fixture, several points on a few emulators) makes each cause happen for real and checks that the
verdict a user reads names it first, with its number."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from servesweep.results import diagnosis as dg


def _state(
    samples=10, running=(8.0, 8), queued=(0.0, 0), token=(0.3, 0.4), retracted=0, queue_s=0, queue_n=0
):
    return {
        "samples": samples,
        "interval_s": 1.0,
        "span_s": samples - 1.0,
        "gauges": {
            "token_usage": {"mean": token[0], "max": token[1]},
            "num_running_reqs": {"mean": running[0], "max": running[1]},
            "num_queue_reqs": {"mean": queued[0], "max": queued[1]},
            "mamba_usage": None,
        },
        "counters": {"retracted_requests": retracted, "queue_time_s": queue_s, "queue_time_count": queue_n},
    }


def _summary(state=None, slo_pass=False, **kw):
    s = {
        "point_id": "c8",
        "point": {
            "concurrency": 8,
            "labels": {},
            "endpoint": "chat",
            "prompt_tokens": 200,
            "output_tokens": 64,
        },
        "requests": {"measured": 100, "ok": 100},
        "error_rate": 0.0,
        "failures": {},
        "request_rate": 4.0,
        "ttft_ms": {"p50": 900.0, "mean": 1000.0},
        "itl_ms": {"p50": 15.0},
        "e2e_ms": {"p50": 2000.0},
        "slos": [{"slo": "ttft_p99<=500ms", "value": 1500.0, "pass": slo_pass}],
        "server_state": state,
        "diagnosis_evidence": None,
    }
    s.update(kw)
    return s


@pytest.mark.fast
def test_queueing_names_the_wait_and_the_share_of_the_point_above_the_cap():
    levels = [[6, 0.07], [20, 0.93]]
    s = _summary(
        _state(running=(7.9, 8), queued=(12.0, 20), queue_s=124.0, queue_n=10),
        diagnosis_evidence={"in_flight_levels": levels, "itl_spikes": None},
        point={"concurrency": 20, "labels": {"max_running_requests": "8"}},
    )
    d = dg.diagnose(s)
    assert d.first == "queueing"
    assert d.causes[0].line == (
        "queueing: 12.40 s mean wait, 12.0 queued on average, in flight above cap 8 for 93% of the point"
    )
    # without the scheduler's queue-time histogram: Little's law on the sampled queue (12 / 4 req/s = 3 s), which
    # a wait cannot exceed TTFT p50 (900 ms) by
    s["server_state"]["counters"].update(queue_time_s=0, queue_time_count=0)
    assert "0.90 s wait at most (TTFT p50; queue / rate says more)" in dg.diagnose(s).line
    s["ttft_ms"] = {"p50": 5000.0, "mean": 5200.0}
    assert "3.00 s mean wait (queue / rate)" in dg.diagnose(s).line
    s["ttft_ms"] = {"p50": 900.0, "mean": 1000.0}
    # with the configuration's lowest-load point: TTFT p50 over its queue-free TTFT (900 - 40 ms)
    base = _summary(_state(running=(1.0, 1)), slo_pass=True, ttft_ms={"p50": 40.0, "mean": 41.0})
    base["point"] = {"concurrency": 1, "labels": {"max_running_requests": "8"}}
    assert (
        "0.86 s median wait (TTFT p50 over the 40 ms at the lowest load)"
        in dg.diagnose_all([base, s])[1].line
    )
    # above the cap a minority of the time: not the server's queue
    s["diagnosis_evidence"]["in_flight_levels"] = [[6, 0.6], [20, 0.4]]
    assert dg.diagnose(s).first != "queueing"
    # at the cap but never above it: the client sent no more than the server ran, nothing waited for the cap
    s["diagnosis_evidence"]["in_flight_levels"] = [[6, 0.07], [8, 0.93]]
    assert dg.queueing(s, s["server_state"]) is None


@pytest.mark.fast
def test_a_closed_loop_the_server_runs_whole_is_not_queueing():
    """CI, roomy-c8: 8 users against a server without a running cap; SGLang ran all 8 (the cap read is the most it
    ran), one of ~7 one-second samples caught returning requests waiting for the step in flight (queue mean 0.57),
    the scheduler's queue time was not recorded, and Little's law (0.57 / 10 req/s = 57 ms) exceeded TTFT itself
    (40 ms): queueing outranked the client. The cap does not bind (never more in flight than it ran); with a cap
    of 2 the same figures are queueing."""

    def closed_loop_of_8(running_max: int) -> dict:
        return _summary(
            _state(samples=7, running=(running_max - 0.1, running_max), queued=(0.57, 2)),
            request_rate=10.0,
            ttft_ms={"p50": 40.0, "mean": 41.0},
            itl_ms={"p50": 10.0},
            diagnosis_evidence={"in_flight_levels": [[7, 0.05], [8, 0.95]], "itl_spikes": None},
        )

    roomy = closed_loop_of_8(8)
    assert dg.queueing(roomy, roomy["server_state"]) is None
    assert "queueing" not in [c.name for c in dg.diagnose(roomy).causes]
    # an older summary without the records' levels: the concurrency against the cap
    old = {**roomy, "diagnosis_evidence": None}
    assert dg.queueing(old, old["server_state"]) is None
    capped = closed_loop_of_8(2)
    q = dg.queueing(capped, capped["server_state"])
    assert q is not None and dg.diagnose(capped).first == "queueing"
    # the wait estimate is at most TTFT p50 (Little's law said 57 ms), so strength stays below 1
    assert q.evidence["mean_wait_s"] == pytest.approx(0.040) and q.strength < 1.0
    assert q.text.startswith("0.04 s wait at most (TTFT p50; queue / rate says more), 0.6 queued on average")
    assert dg.queueing({**capped, "diagnosis_evidence": None}, capped["server_state"]) is not None
    # the scheduler's own queue time says 5 ms, half an ITL: requests waited for a step, not for the cap
    capped["server_state"]["counters"].update(queue_time_s=0.4, queue_time_count=80)
    assert dg.queueing(capped, capped["server_state"]) is None


@pytest.mark.fast
def test_the_emulator_records_each_requests_queue_time_as_sglang_does():
    """sglang:queue_time_seconds: one observation per request, its first forward entry minus its queue entry (SGLang
    0.5.x req_time_stats.py set_forward_entry_time). 6 requests at once through 2 running slots: two start at once,
    the others wait whole waves."""
    import random

    from servesweep.sglang.serverargs import resolve_server
    from servesweep.sim.engine import Engine, EngineRequest

    eng = Engine(resolve_server({"model_path": "meta-llama/Llama-3.1-8B-Instruct", "sim_gpu": "H100",
                                 "max_running_requests": 2}))  # fmt: skip
    rng = random.Random(1)

    def req(i):
        return EngineRequest(f"r{i}", [rng.randrange(1, 100_000) for _ in range(500)], 32, lambda *a: None,
                             ignore_eos=True)  # fmt: skip

    reqs = [req(i) for i in range(6)]
    assert reqs[0].queue_time is None  # before its first forward
    eng.run_simulated(reqs)
    waits = [r.queue_time for r in reqs]
    assert waits[0] == waits[1] == 0.0 and all(w is not None for w in waits)
    assert 0 < waits[2] == waits[3] < waits[4] == waits[5]
    for r in reqs:  # the wait precedes the first token, the prefill after it
        assert r.first_token_time is not None and r.queue_time < r.first_token_time - r.queue_start


@pytest.mark.fast
def test_gauges_are_read_over_the_samples_under_load():
    """server_state's `load`: the idle samples the sampler takes before the first request and after the last are
    left out of the means the diagnosis reads; idle samples between busy ones stay in."""
    from servesweep.results.server_state import server_state

    def snap(running, queued, usage):
        return {
            "sglang:num_running_reqs": running,
            "sglang:num_queue_reqs": queued,
            "sglang:token_usage": usage,
        }

    samples = [
        snap(0, 0, 0.0),
        snap(4, 2, 0.9),
        snap(0, 0, 0.1),
        snap(4, 0, 0.7),
        snap(0, 0, 0.0),
        snap(0, 0, 0),
    ]
    st = server_state(list(enumerate(samples)))
    assert st["gauges"]["num_queue_reqs"]["mean"] == pytest.approx(2 / 6)
    assert st["load"]["samples"] == 3
    assert st["load"]["gauges"]["num_queue_reqs"]["mean"] == pytest.approx(2 / 3)
    assert st["load"]["gauges"]["token_usage"] == {"mean": pytest.approx(1.7 / 3), "max": 0.9}
    st["samples"] = 6
    assert dg._gauge(st, "num_queue_reqs", "mean") == pytest.approx(2 / 3)
    assert server_state([(0, snap(0, 0, 0)), (1, snap(0, 0, 0))])["load"] is None
    # speculative acceptance: 0 before the first verify step (and without speculative decoding) is no value
    spec = [{**snap(2, 0, 0.5), "sglang:spec_accept_length": v} for v in (0.0, 2.0, 3.0)]
    assert server_state(list(enumerate(spec)))["gauges"]["spec_accept_length"] == {"mean": 2.5, "max": 3.0}
    assert server_state(list(enumerate(samples)))["gauges"]["spec_accept_length"] is None


@pytest.mark.fast
def test_kv_pressure_from_usage_near_one_or_a_retraction():
    d = dg.diagnose(_summary(_state(token=(0.9, 0.97))))
    assert d.first == "KV pressure" and "token usage max 0.97 (mean 0.90)" in d.line
    d = dg.diagnose(_summary(_state(token=(0.5, 0.8), retracted=3)))
    assert d.line.startswith("KV pressure: 3 retractions")
    assert dg.kv_pressure(_state(token=(0.5, 0.94))) is None  # KV_USAGE_HIGH is 0.95
    # with the pool's size (sglang:max_total_num_tokens): named, and against the point's requests
    st = _state(token=(0.9, 0.97))
    st["gauges"]["kv_pool_tokens"] = {"mean": 3000, "max": 3000}
    s = _summary(st)  # 8 users of 200 + 64 tokens: 11 fit
    assert dg.diagnose(s).causes[0].text == "token usage max 0.97 (mean 0.90), KV pool 3,000 tokens"
    s["point"].update(concurrency=12, prompt_tokens=400, output_tokens=160)  # 5 fit: past the pool
    kv = dg.diagnose(s).causes[0]
    assert (
        kv.text
        == "KV pool 3,000 tokens holds 5 requests of 560 tokens, 12 in flight, token usage max 0.97 (mean 0.90)"
    )
    assert kv.strength == 1.0 and kv.evidence["requests_that_fit"] == 5


@pytest.mark.fast
def test_spec_acceptance_collapse_from_the_accept_rate_or_length():
    st = _state()
    st["gauges"].update(
        spec_accept_length={"mean": 1.06, "max": 1.1}, spec_accept_rate={"mean": 0.02, "max": 0.03}
    )
    s = _summary(st, slo_pass=True)
    d = dg.diagnose(s)
    assert d.line == "spec acceptance collapse: 1.06 tokens per verify step, 2% of drafts accepted (< 20%)"
    assert d.causes[0].strength == pytest.approx(0.98 * dg.SPEC_OTHER_WEIGHT)  # no ITL/TPOT SLO broke
    s["slos"] = [{"slo": "itl_p99<=50ms", "value": 80.0, "pass": False}]
    assert dg.diagnose(s).causes[0].strength == pytest.approx(0.98)
    st["gauges"]["spec_accept_rate"] = None  # an SGLang without the rate: the length alone
    assert dg.spec_collapse(s, st).text == "1.06 tokens per verify step (< 1.5)"
    st["gauges"].update(
        spec_accept_length={"mean": 2.9, "max": 3.2}, spec_accept_rate={"mean": 0.63, "max": 0.7}
    )
    assert dg.spec_collapse(s, st) is None
    st["gauges"].update(spec_accept_length=None, spec_accept_rate=None)  # no speculative decoding
    assert dg.spec_collapse(s, st) is None


@pytest.mark.fast
def test_errors_name_their_share_and_classes():
    s = _summary(_state(), error_rate=0.12, failures={"http_5xx": 10, "timeout_first_token": 2})
    d = dg.diagnose(s)
    assert d.first == "server errors"
    assert d.causes[0].text == "12% of 100 requests failed (http_5xx 10, timeout_first_token 2)"
    assert dg.server_errors(_summary(error_rate=0.005)) is None  # below ERROR_SHARE_MIN


@pytest.mark.fast
def test_client_bound_from_the_headroom_check_ranks_by_how_strong_it_is():
    head = {
        "reasons": ["vm:1: CPU 99% of a core > 90%"],
        "workers": [{"cpu_pct": 99.0, "loop_lag_p99_ms": 5.0}],
    }
    s = _summary(_state(token=(0.9, 0.97)), client_saturated=True, client_headroom=head)
    assert dg.diagnose(s).line.startswith("client-bound: vm:1: CPU 99% of a core > 90%; also KV pressure")
    # an event loop 30 ms late at p99 (flagged from 20 ms) explains less than a full KV pool
    head = {"reasons": ["vm:1: event-loop lag p99 30.0 ms > 20 ms"], "workers": [{"loop_lag_p99_ms": 30.0}]}
    s["client_headroom"] = head
    assert [c.name for c in dg.diagnose(s).causes] == ["KV pressure", "client-bound"]
    # merged ITL gaps alone (1.3% of them) are weak: a full KV pool ranks first
    head = {"reasons": ["1.3% of ITL gaps are chunks read together (> 1%; read lag p99 6.2 ms)"]}
    s.update(client_headroom=head, itl_zero_gap_share=0.013)
    assert [c.name for c in dg.diagnose(s).causes] == ["KV pressure", "client-bound"]
    # 12% merged gaps against an ITL SLO: they moved the very percentile that broke
    head = {"reasons": ["12.0% of ITL gaps are chunks read together (> 1%; read lag p99 30 ms)"]}
    s.update(client_headroom=head, itl_zero_gap_share=0.12)
    s["slos"] = [{"slo": "itl_p99<=50ms", "value": 80.0, "pass": False}]
    assert dg.diagnose(s).first == "client-bound"
    s["slos"] = [{"slo": "ttft_p99<=500ms", "value": 1500.0, "pass": False}]  # they cannot move a TTFT
    assert dg.diagnose(s).first == "KV pressure"


@pytest.mark.fast
def test_prefix_cache_misses_against_the_workloads_target():
    s = _summary(_state(), shared_prefix={"target_hit_ratio": 0.7, "measured_hit_ratio": 0.1})
    assert dg.diagnose(s).line.startswith(
        "prefix-cache misses: 10% of prompt tokens cached, the workload's target 70%"
    )
    # the server's usage without cached tokens: its own counters
    s["shared_prefix"] = {"target_hit_ratio": 0.7, "measured_hit_ratio": None, "server_cached_tokens": 0}
    s["server_state"]["counters"]["prompt_tokens"] = 32000
    assert "0% of prompt tokens cached (server)" in dg.diagnose(s).line
    s["shared_prefix"]["measured_hit_ratio"] = 0.6
    assert dg.prefix_cache_misses(s) is None


@pytest.mark.fast
def test_the_network_from_the_clients_ttft_against_the_servers_own():
    """The client sees TTFT 142 ms, SGLang's own histogram 38 ms over the point: 104 ms on the wire, more than
    NETWORK_GAP_MIN_MS and NETWORK_GAP_SHARE_MIN of the client's TTFT, ranked by the wire's share of it."""
    st = _state()
    st["latency"] = {"ttft": {"mean_s": 0.038, "count": 104}, "e2e": {"mean_s": 0.9, "count": 104}}
    head = {"reasons": [], "workers": [{"cpu_pct": 30.0, "loop_lag_p99_ms": 0.4}], "read_lag_ms": None}
    s = _summary(st, ttft_ms={"p50": 140.0, "mean": 142.0}, client_headroom=head, requests={"total": 100})
    d = dg.diagnose(s)
    assert (
        d.line == "network: the client sees TTFT 142 ms, the server 38 ms (104 ms between them on the wire)"
    )
    # the client's own loop lag (0.4 ms p99) is taken off: 103.6 ms on the wire, its share of the client's TTFT
    assert d.causes[0].evidence["wire_ms"] == pytest.approx(103.6)
    assert d.causes[0].strength == pytest.approx(103.6 / 142)
    # queueing behind it, ranked by the same measure (its wait's share of the client's TTFT): the wire's is larger
    s["server_state"] = q = {
        **_state(running=(7.9, 8), queued=(3.0, 6), queue_s=3.0, queue_n=100),
        "latency": st["latency"],
    }
    s.update(point={**s["point"], "labels": {"max_running_requests": "8"}, "concurrency": 12},
             diagnosis_evidence={"in_flight_levels": [[12, 1.0]], "itl_spikes": None})  # fmt: skip
    assert [c.name for c in dg.diagnose(s).causes] == ["network", "queueing"]
    # the client's own lag is taken off the gap, and said
    s["client_headroom"] = {**head, "workers": [{"cpu_pct": 60.0, "loop_lag_p99_ms": 30.0}]}
    assert dg.network(s, q).text == (
        "the client sees TTFT 142 ms, the server 38 ms (74 ms between them on the wire, 30 ms more in the client's own lag)"
    )
    # a small gap: the HTTP stack, no network (below 20 ms, or below 25% of a long TTFT)
    s["client_headroom"] = head
    assert dg.network({**s, "ttft_ms": {"p50": 50.0, "mean": 52.0}}, q) is None
    slow = {
        **q,
        "latency": {"ttft": {"mean_s": 0.38, "count": 104}},
    }  # the server's own TTFT 380 ms: 40 ms, 10%
    assert dg.network({**s, "ttft_ms": {"p50": 400.0, "mean": 420.0}}, slow) is None
    # a CPU-bound client: its delays are not measured, the gap cannot be told from the wire
    cpu = {**head, "reasons": ["vm:1: CPU 97% of a core > 90%"]}
    assert dg.network({**s, "client_headroom": cpu}, q) is None
    # another client's requests in the server's histogram: not the same requests
    assert dg.network({**s, "requests": {"total": 40}}, q) is None
    # no server histogram (an older summary, another server): no network cause, and nothing said
    assert dg.network(s, _state()) is None
    assert "network" not in dg.diagnose({**s, "server_state": _state()}).line


@pytest.mark.fast
def test_the_servers_own_ttft_and_e2e_over_a_point():
    """server_state's `latency`: SGLang's TTFT and E2E histograms' sum / count increase between the first sample
    (before the load) and the last; the `is_streaming` label sets summed; absent histograms: None."""
    from servesweep.results.server_state import read_exposition, server_state

    def text(ttft_sum, n, e2e_sum):
        rows = []
        for stream, share in (("true", 0.75), ("false", 0.25)):
            lab = f'engine_type="unified",is_streaming="{stream}",model_name="m"'
            rows += [
                f"sglang:time_to_first_token_seconds_sum{{{lab}}} {ttft_sum * share}",
                f"sglang:time_to_first_token_seconds_count{{{lab}}} {n * share}",
                f"sglang:e2e_request_latency_seconds_sum{{{lab}}} {e2e_sum * share}",
                f"sglang:e2e_request_latency_seconds_count{{{lab}}} {n * share}",
            ]
        return (
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            "# TYPE sglang:e2e_request_latency_seconds histogram\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{model_name="m"} 2\n' + "\n".join(rows) + "\n"
        )

    assert read_exposition(text(4.0, 8, 40.0))["sglang:time_to_first_token_seconds_count"] == 8
    st = server_state([(0.0, text(4.0, 8, 40.0)), (1.0, text(5.0, 12, 46.0)), (2.0, text(6.0, 28, 60.0))])
    assert st["latency"] == {"ttft": {"mean_s": pytest.approx(2.0 / 20), "count": 20},
                             "e2e": {"mean_s": pytest.approx(20.0 / 20), "count": 20}}  # fmt: skip
    bare = 'sglang:num_running_reqs{model_name="m"} 2\n'
    assert server_state([(0.0, bare), (1.0, bare)])["latency"] is None


def _records(chunks: list[list[int]], first: list[int]) -> pa.Table:
    return pa.table({"chunk_ns": pa.array(chunks, pa.list_(pa.int64())), "first_token_ns": first})


@pytest.mark.fast
def test_itl_spikes_that_span_other_requests_prefills():
    ms = 1_000_000
    # request 0 decodes every 10 ms; requests 1-3 get their first token inside its three 200 ms gaps
    times, t = [], 0
    for k in range(40):
        t += 200 * ms if k in (10, 20, 30) else 10 * ms
        times.append(t)
    firsts = [times[10] - 50 * ms, times[20] - 50 * ms, times[30] - 50 * ms]
    t_rec = _records([times] + [[f, f + 10 * ms] for f in firsts], [times[0], *firsts])
    ev = dg.itl_spikes(t_rec.column("chunk_ns"), np.sort(np.array([times[0], *firsts], dtype=float)))
    assert ev is not None and ev["spike_prefill_share"] == 1.0 and ev["spike_time_share"] > 0.5
    d = dg.diagnose(_summary(_state(), diagnosis_evidence={"itl_spikes": ev, "in_flight_levels": []}))
    assert d.first == "prefill interference"
    assert (
        "ITL spikes (p50 200 ms vs 10.0 ms typical) hold 61% of the decode time, 100% of it spans" in d.line
    )
    # the same spikes with no prefill inside: not this cause
    ev2 = dg.itl_spikes(t_rec.column("chunk_ns"), np.array([0.0]))
    assert ev2 is not None and ev2["spike_prefill_share"] == 0.0
    assert dg.prefill_interference({"diagnosis_evidence": {"itl_spikes": ev2}}) is None


@pytest.mark.fast
def test_in_flight_levels_and_the_share_at_the_cap():
    s = 1e9
    sent = np.array([0, 0, 0, 1 * s])
    end = np.array([4 * s, 4 * s, 2 * s, 3 * s])  # in flight: 3, then 4, 3 and 2, a second each
    levels = dg.in_flight_levels(sent, end, 0.0, 4 * s)
    assert levels == [[2, 0.25], [3, 0.5], [4, 0.25]]
    assert dg.share_at_least(levels, 3) == 0.75


@pytest.mark.fast
def test_decode_bound_against_the_lowest_load_point_while_nothing_queues():
    base = _summary(_state(running=(1.0, 1)), itl_ms={"p50": 10.0}, in_flight={"mean": 1.0}, slo_pass=True)
    base["point"]["concurrency"] = 1
    hot = _summary(_state(running=(32.0, 32)), itl_ms={"p50": 31.0}, in_flight={"mean": 32.0})
    hot["point"]["concurrency"] = 32
    got = dg.diagnose_all([base, hot])
    assert got[0].line == dg.NO_LIMIT
    assert (
        got[1].line
        == "decode-bound: ITL/chunk p50 31.0 ms at batch 32, 3.1× the 10.0 ms at batch 1; nothing queued"
    )
    hot["itl_ms"] = {"p50": 12.0}  # 1.2× is within DECODE_SLOWDOWN_MIN
    assert dg.diagnose_all([base, hot])[1].status == dg.NO_CLEAR_CAUSE


@pytest.mark.fast
def test_no_limit_no_clear_cause_and_not_enough_samples():
    assert dg.diagnose(_summary(_state(), slo_pass=True)).line == "no limit reached"
    assert dg.diagnose(_summary(_state())).line == "no clear cause"
    few = dg.diagnose(_summary(_state(samples=3, token=(0.99, 0.99))))
    assert few.line == "not enough samples (3 of /metrics over 2.0 s, 5 needed)"  # gauges unread, not a cause
    assert dg.diagnose(_summary(None)).status == dg.NOT_ENOUGH_SAMPLES
    assert json.dumps(dg.diagnose(_summary(_state(token=(1, 1)))).as_dict())  # JSON for gate --json, compare


def _sweep(loads, thr, lat):
    return dg.saturation_knee(loads, thr, lat)


@pytest.mark.fast
def test_the_knee_where_throughput_stops_growing_and_latency_grows():
    loads = [1, 2, 4, 8, 16, 32, 64]
    thr = [100, 200, 400, 780, 1000, 1030, 1040]  # flat past about 12
    lat = [1000, 1000, 1010, 1030, 1600, 3100, 6150]
    k = _sweep(loads, thr, lat)
    assert k.load is not None and 8 <= k.load <= 16 and k.interval == (8.0, 16.0), k
    assert k.text.startswith("knee at concurrency ≈ ") and "(between 8 and 16)" in k.text


@pytest.mark.fast
def test_a_long_context_sweep_with_long_ttft_everywhere_has_no_early_knee():
    """guidellm #606: a fixed TTFT threshold stops a long-context sweep at its first point. Here TTFT (and E2E)
    is 30 s at every load while throughput still scales: no knee."""
    loads = [1, 2, 4, 8, 16]
    k = _sweep(loads, [50, 99, 197, 390, 770], [30000, 30100, 30300, 30700, 31500])
    assert k.load is None and k.text.startswith("no knee up to 16: throughput still grows"), k.text
    # and a sweep too short to tell says so
    assert _sweep([1, 2, 4], [1, 2, 3], [1, 1, 2]).text == "3 loads measured, 4 needed for a knee"


@pytest.mark.fast
def test_knees_per_configuration_of_a_rate_sweep():
    pts = []
    for rate, got, e2e in [(1, 1.0, 900), (2, 2.0, 920), (4, 3.9, 1000), (8, 5.0, 4000), (16, 5.1, 9000)]:
        pts.append(
            {
                "point": {
                    "arrival": "poisson",
                    "rate_rps": rate,
                    "concurrency": 64,
                    "labels": {"config_id": "a"},
                },
                "output_tokens_per_s": got * 100,
                "e2e_ms": {"p50": e2e},
            }
        )
    ((key, knee),) = dg.knees(pts).items()
    assert knee.axis == "rate" and knee.load is not None and 4 <= knee.load <= 8, knee
    assert dg.config_label(key).startswith("config a")


# ---------------------------------------------------------------- each cause made on purpose by the emulator

MODEL = "Qwen/Qwen3.6-27B"
SIM = ["--model-path", MODEL, "--enable-metrics", "--sim-sglang-version", "0.5.23"]
SLO = "ttft_p99<=1s"
SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]  # fmt: skip
# emulator flags -> points measured against it: (folder, LoadPoint knobs)
SETUPS = {
    # a roomy server: a healthy point, long prefills among decodes, a shared prefix with the radix cache off, and
    # the queueing point's load on a server with room (compare's "what changed")
    "roomy": (
        ["--disable-radix-cache"],
        [
            ("healthy", dict(concurrency=2, duration_s=4)),
            ("prefill", dict(concurrency=8, duration_s=6, prompt_tokens=6000, output_tokens=100)),
            (
                "prefix",
                dict(
                    concurrency=4,
                    duration_s=5,
                    workload="shared_prefix",
                    shared_prefix_tokens=1500,
                    prompt_tokens=2000,
                    num_groups=1,
                    cache_bust=False,
                ),
            ),  # fmt: skip
            ("roomy-c8", dict(concurrency=8, duration_s=5)),
            # the same server reached through a link that holds every byte NETWORK_DELAY_S each way
            ("network", dict(concurrency=2, duration_s=4, output_tokens=32)),
        ],
    ),
    # a 2-slot server, speculative decoding calibrated to accept almost nothing: a queueing point, and a point that
    # fits the slots (its verdict: the acceptance collapse)
    "cap2": (
        ["--max-running-requests", "2", *SPEC, "--sim-calibration", "spec_accept_mean=1.05"],
        [("queue", dict(concurrency=8, duration_s=5)), ("spec", dict(concurrency=2, duration_s=4))],
    ),
    "small-kv": (
        ["--max-running-requests", "8", "--max-total-tokens", "3000", "--context-length", "4096"],
        [("kv", dict(concurrency=12, requests=24, prompt_tokens=400, output_tokens=160))],
    ),
    "faults": (["--sim-fault-rate", "500=0.3"], [("errors", dict(concurrency=4, duration_s=5))]),
    # a server 50 times an H200: tokens come faster than one Locust process can read and stamp them
    "too-fast": (
        ["--sim-calibration", "speedup=50"],
        [("client", dict(concurrency=16, duration_s=4, output_tokens=256))],
    ),
}


# the "network" point reaches its emulator through DelayLink: 30 ms each way, so a first token reaches the client
# about 60 ms after the server sent it, and the request arrives 30 ms after it left
NETWORK_DELAY_S = {"network": 0.03}


class DelayLink:
    """A TCP relay on 127.0.0.1 that holds every byte `delay_s` before passing it on, each way (netem's `delay`, in
    user space: this machine's kernel has no sch_netem, so `tc qdisc ... netem delay` is refused in a namespace as
    well). Order and bandwidth are kept; only time is added. A thread of its own runs its event loop."""

    def __init__(self, port: int, delay_s: float):
        import asyncio
        import threading

        self.upstream, self.delay_s = port, delay_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="delay-link", daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        import asyncio
        import contextlib

        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
        for w in (writer, up_w):
            w.close()

    async def _pipe(self, reader, writer) -> None:
        """reader -> writer, each read held until it is delay_s old (an end too: a FIN is late like the data)."""
        import asyncio

        loop, held = self.loop, asyncio.Queue()

        async def feed() -> None:
            try:
                while data := await reader.read(65536):
                    held.put_nowait((loop.time() + self.delay_s, data))
            finally:
                held.put_nowait((loop.time() + self.delay_s, b""))

        async def send() -> None:
            while True:
                due, data = await held.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(feed(), send())

    def close(self) -> None:
        import asyncio

        async def shut() -> None:
            self.server.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# the "kv" point is also a matrix point kept past the KV pool on purpose: the small-kv server's flags as an
# experiment with keep: [kv_overflow] (its 8 running × 560 tokens exceed the 3000-token pool: the planner would drop it)
KEPT = f"""\
name: kept
sglang_version: 0.5.23
target: {{inventory: local}}
model: {{path: {MODEL}}}
launcher: {{emulator: true, gpu: H200}}
server: {{base: {{max_running_requests: 8, max_total_tokens: 3000, context_length: 4096, enable_metrics: true}}}}
load: {{concurrency: 12, prompt_tokens: 400, output_tokens: 160, requests: 24}}
keep: [kv_overflow]
"""
KEPT_POINT = "kv"


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """One folder of points, each made against the emulator setup that causes its verdict (about a minute); the
    KEPT_POINT also runs as the point of a matrix run folder (`kept/`: planned and labelled by the planner)."""
    import shutil

    from servesweep.config.experiment import parse_experiment
    from servesweep.config.point import LoadPoint
    from servesweep.driver.point_run import run_point
    from servesweep.matrix.run_setup import create_run
    from servesweep.sim.launch import start_sim

    root = tmp_path_factory.mktemp("diagnosis")
    kept = create_run(parse_experiment(KEPT), root / "kept")  # plans it: the manifest holds the point's label
    ((kept_id, kept_entry),) = kept.data["points"].items()
    summaries = {}
    for flags, points in SETUPS.values():
        with start_sim(SIM + flags) as sim:
            for name, knobs in points:
                knobs = {"prompt_tokens": 200, "output_tokens": 64, **knobs}
                out = root / "run" / name
                if name == KEPT_POINT:
                    labels = {"config_id": kept_entry["config_id"], "run_id": kept.run_dir.name}
                    knobs.update(point_id=kept_id, labels=labels)
                    out = kept.run_dir / kept_id
                link = DelayLink(sim.port, NETWORK_DELAY_S[name]) if name in NETWORK_DELAY_S else None
                point = LoadPoint(
                    base_url=f"http://127.0.0.1:{link.port}" if link else sim.base_url, model=MODEL, probe=False,
                    template_overhead=0, continuous_usage=False, endpoint="chat", warmup_s=0, **knobs,
                )  # fmt: skip
                try:
                    summaries[name] = run_point(point, out, slos=SLO, max_failure_rate=0.6)
                finally:
                    if link is not None:
                        link.close()
                if name == KEPT_POINT:
                    kept_entry.update(status="done", dir=kept_id)
                    kept.save()
                    shutil.copytree(out, root / "run" / name)
    return root, summaries


def _verdict(summaries: dict, name: str) -> dg.Diagnosis:
    return dg.diagnose(summaries[name])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name, cause, evidence",
    [
        ("queue", "queueing", "in flight above cap 2 for"),
        ("kv", "KV pressure", "KV pool 3,000 tokens holds 5 requests of 560 tokens, 12 in flight"),
        ("spec", "spec acceptance collapse", "of drafts accepted (< 20%)"),
        ("errors", "server errors", "requests failed (http_5xx"),
        ("prefill", "prefill interference", "of it spans another request's prefill"),
        ("prefix", "prefix-cache misses", "of prompt tokens cached (server), the workload's target"),
        (
            "client",
            "client-bound",
            "> ",
        ),  # each reason names its figure and limit: "CPU 97% of a core > 90%", "chunks read together (> 1%; ..."
    ],
)
def test_each_emulated_cause_is_named_first_with_its_number(emulated, name, cause, evidence):
    _, summaries = emulated
    d = _verdict(summaries, name)
    print(name, "->", d.line)
    named = [c.name for c in d.causes]
    # a client that fell behind (this machine is shared) is said first when it went further past its limit; the
    # emulated cause then comes right after it
    if cause != "client-bound" and summaries[name]["client_saturated"] and named[0] == "client-bound":
        named, d.causes = named[1:], d.causes[1:]
    assert named[0] == cause and evidence in d.causes[0].text, d.line
    if name == "queue":  # the emulator observes SGLang's queue-time histogram: the wait read exactly
        assert summaries[name]["server_state"]["counters"]["queue_time_count"] > 0
        assert " s mean wait, " in d.causes[0].text, d.line


@pytest.mark.timeout(300)
def test_a_point_behind_a_slow_link_names_the_network_first(emulated):
    """The roomy emulator reached through DelayLink (30 ms each way): the client's TTFT holds about 60 ms the
    server's own TTFT (its histogram, request received to first token) does not; the verdict names the network
    first, with both figures and the gap. The same server reached directly has no network cause."""
    import re

    _, summaries = emulated
    s = summaries["network"]
    assert s["server_state"]["latency"]["ttft"]["count"] >= s["requests"]["ok"] > 0, s["server_state"]
    d = dg.diagnose(s)
    print("network ->", d.line)
    assert d.first == "network", d.line
    text = d.causes[0].text
    m = re.fullmatch(
        r"the client sees TTFT (\d+) ms, the server (\d+) ms \((\d+) ms between them on the wire.*\)", text
    )
    assert m, text
    client, server = int(m[1]), int(m[2])
    assert client == round(s["ttft_ms"]["mean"])
    assert server == round(s["server_state"]["latency"]["ttft"]["mean_s"] * 1000)
    # the two 30 ms holds (the request on its way in, the first token on its way out), a little more for the relay
    ev = d.causes[0].evidence
    assert 55 <= ev["wire_ms"] + ev["client_lag_ms"] <= 200, ev
    for direct in ("healthy", "roomy-c8"):
        assert "network" not in [c.name for c in dg.diagnose(summaries[direct]).causes], direct


@pytest.mark.timeout(300)
def test_a_point_kept_past_the_kv_pool_runs_labelled_and_named_kv_pressure(emulated):
    """keep: [kv_overflow]: the planner keeps the point (its manifest entry says why), it runs on the emulator
    against the 3000-token pool, the report badges it with the legend, and its verdict names KV pressure first
    with the pool."""
    from servesweep.results.report import write_report

    root, summaries = emulated
    (run,) = (root / "kept").iterdir()  # the run folder create_run made
    manifest = json.loads((run / "manifest.json").read_text())
    ((pid, entry),) = manifest["points"].items()
    assert entry["status"] == "done" and entry["warnings"][0].startswith("kv_overflow: kept past the KV pool")
    assert "KV capacity 3000 tokens < 8 running × 560 tokens" in entry["warnings"][0]
    assert manifest["plan"]["points_feasible"] == 1
    assert "kv_overflow" in [p["code"] for p in manifest["plan"]["pitfalls"]]
    s = summaries[KEPT_POINT]
    assert s["point_id"] == pid and s["requests"]["ok"] > 0
    assert s["server_state"]["gauges"]["kv_pool_tokens"]["max"] == 3000
    d = dg.diagnose(s)
    named = [c.name for c in d.causes]
    if s["client_saturated"] and named[0] == "client-bound":  # a shared machine's client said first
        named, d.causes = named[1:], d.causes[1:]
    assert named[0] == "KV pressure", d.line
    assert d.causes[0].text.startswith("KV pool 3,000 tokens holds 5 requests of 560 tokens, 12 in flight")
    assert "retraction" in d.causes[0].text, d.line
    html_path, md_path = write_report(run)
    html, md = html_path.read_text(), md_path.read_text()
    assert 'data-flag="KV overflow"' in html and "<dd>kept past the KV pool on purpose" in html
    assert "KV overflow: kept past the KV pool on purpose (keep kv_overflow); KV capacity 3000 tokens" in md
    section = md[md.index("### Diagnosis") :]
    assert f"| {dg.diagnose_all([s])[0].line} |" in section


@pytest.mark.timeout(300)
def test_a_healthy_emulated_point_reaches_no_limit(emulated):
    _, summaries = emulated
    s = summaries["healthy"]
    d = dg.diagnose(s)
    assert all(c["pass"] for c in s["slos"]), s["slos"]
    # on a machine whose client fell behind, the verdict says so; a server cause would be wrong
    assert d.line == dg.NO_LIMIT or (s["client_saturated"] and d.first == "client-bound"), d.line


@pytest.mark.timeout(300)
def test_the_table_report_gate_and_compare_show_the_verdict(emulated):
    from click.testing import CliRunner
    from rich.console import Console

    from servesweep.cli import main
    from servesweep.results.report import write_report
    from servesweep.results.table import results_table, table_notes

    root, summaries = emulated
    run = root / "run"
    order = ["healthy", "queue", "kv", "errors"]
    shown = [summaries[n] for n in order]
    in_table = dict(zip(order, dg.diagnose_all(shown), strict=True))
    con = Console(width=400, record=True)
    con.print(results_table(shown))
    text = con.export_text()
    header = next(line for line in text.splitlines() if "conc" in line)
    assert header.rstrip(" ┃│|").endswith("why")
    body = [line for line in text.splitlines() if line.startswith("│")]  # the data rows, in order
    cells = {n: line.rstrip(" │").rsplit("│", 1)[1].strip() for n, line in zip(order, body, strict=True)}
    assert cells["queue"] == in_table["queue"].first and cells["kv"] == in_table["kv"].first, cells
    assert "queueing" in [c.name for c in in_table["queue"].causes]
    notes = "\n".join(table_notes(shown))
    assert f"point {summaries['queue']['point_id']}: why: {in_table['queue'].line}" in notes

    verdicts = dict(zip(summaries, dg.diagnose_all(list(summaries.values())), strict=True))
    _, md_path = write_report(run)
    md = md_path.read_text()
    section = md[md.index("### Diagnosis") :]
    for name, d in verdicts.items():  # every point's verdict in its row, as diagnose says it
        assert f"| {d.line} |" in section, (name, d.line)
    html = (run / "report.html").read_text()
    assert f'class="l why" data-key="why" data-value="{verdicts["kv"].first}"' in html

    got = CliRunner().invoke(main, ["gate", str(run), "--slo", SLO])
    assert got.exit_code == 1, got.output
    assert f"why {summaries['queue']['point_id']}: {verdicts['queue'].line}" in got.output, got.output

    # compare: the queueing point's load against a server with room; the verdict changed, and compare says how
    base, new = root / "base", root / "new"
    (base / "p").mkdir(parents=True)
    (new / "p").mkdir(parents=True)
    for src, dst in ((run / "queue", base / "p"), (run / "roomy-c8", new / "p")):
        for f in ("summary.json", "records.parquet"):
            (dst / f).write_bytes((src / f).read_bytes())
    got = CliRunner().invoke(main, ["compare", str(base), str(new), "--resamples", "200"])
    assert got.exit_code == 0, got.output
    before, after = dg.diagnose(summaries["queue"]), dg.diagnose(summaries["roomy-c8"])  # each run: one point
    lines = [x.strip() for x in got.output.splitlines() if x.strip().startswith("cause ")]
    if before.first != after.first:  # the queueing server's point names queueing; the roomy one does not
        assert lines and f": {before.first} → {after.first or after.status} (run: " in lines[0], got.output
    assert "queueing" in [c.name for c in before.causes] and "queueing" not in [c.name for c in after.causes]


@pytest.mark.fast
def test_the_load_table_has_a_why_column_and_notes_with_the_verdict_and_the_knee():
    from rich.console import Console

    from servesweep.results.table import results_table, table_notes

    def point(c, thr, e2e, state, slo_pass):
        s = _summary(state, slo_pass=slo_pass, output_tokens_per_s=thr, e2e_ms={"p50": e2e})
        s.update(point_id=f"c{c}", point={**s["point"], "concurrency": c})
        s.update(prompt_tokens={"mean_deviation_pct": 0.0}, requests={"measured": 100, "ok": 100})
        q = {"p50": 1.0, "p99": 2.0, "mean": 1.5}
        s.update(ttft_ms=q, itl_ms=q, itl_per_token_ms=q, output_tokens_per_s=thr)
        return s

    pts = [
        point(1, 100, 1000, _state(), True),
        point(2, 200, 1000, _state(), True),
        point(4, 390, 1030, _state(), True),
        point(8, 420, 1900, _state(token=(0.9, 0.99)), False),
        point(16, 425, 3800, _state(token=(0.95, 1.0), retracted=4), False),
    ]
    con = Console(width=300, record=True)
    con.print(results_table(pts))
    body = [line for line in con.export_text().splitlines() if line.startswith("│")]
    assert [line.rstrip(" │").rsplit("│", 1)[1].strip() for line in body] == [
        "-",
        "-",
        "-",
        "KV pressure",
        "KV pressure",
    ]
    notes = table_notes(pts)
    assert "[yellow]point c16: why: KV pressure: token usage max 1.00 (mean 0.95), 4 retractions[/]" in notes
    knee = next(n for n in notes if n.startswith("saturation"))
    assert "knee at concurrency ≈ " in knee and "(between 4 and 8)" in knee, knee


@pytest.mark.fast
def test_knee_of_a_sweep_with_repeated_loads():
    """A capacity search probes a load several times (n1, n2, n3): the knee takes one point per load (their
    medians) instead of fitting a segment of one repeated load, which failed the report (SVD did not converge)."""
    from servesweep.results.diagnosis import saturation_knee

    loads = [1, 1, 1, 2, 2, 2, 4, 4, 8, 8, 16, 16]
    thr = [100, 101, 99, 200, 198, 202, 390, 392, 420, 421, 425, 424]
    lat = [50, 51, 49, 52, 52, 53, 55, 54, 110, 111, 230, 229]
    k = saturation_knee(loads, thr, lat)
    assert k.load is not None and 4 <= k.load <= 8, k.text
    few = saturation_knee([2, 2, 2, 4, 4], [10, 10, 10, 20, 20], [5, 5, 5, 5, 5])
    assert few.load is None and "2 loads measured" in few.text, few.text
