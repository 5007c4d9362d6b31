"""Replay capacity (issue 30): a capacity search over a trace replay's speed-up factor, on the emulator, lands on the
answer the emulator's own engine computes in virtual time.

The emulator runs `--sim-calibration per_seq_s=0.1,speedup=20`: every step takes about a + b·c with c the running
sequences (b = 100 ms / 20 = 5 ms). The trace: 40 requests evenly spaced at λ0 = 2 req/s, 100 prompt tokens (no
shared block), 17 output tokens (16 decode steps). Replayed at speed-up s they arrive at λ = s·λ0; by Little's law
c = λ·E2E, so TPOT ≈ a / (1 − 16·λ·b) climbs steeply towards λ = 1 / (16·b) = 12.5 req/s: the SLO tpot_p50 <= 16 ms
holds up to about s = 5.9 (closed form, a ≈ 0.8 ms). The exact answer is the engine's: `Engine.run_simulated`, the
emulator's discrete-event loop in virtual time, replays the same 40 requests at any s in milliseconds, and a
bisection over s gives the largest speed-up whose TPOT p50 holds: 5.68× (the replays through Locust measured the
engine's TPOT p50 at each probe's speed-up to within 0.8 ms). The search (start 4.5, so its probes
land 15% or more of TPOT away from the SLO; 5% resolution; one replay per probe) must bracket that answer: last pass
≤ s* < first fail."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from servesweep.config.point import LoadPoint
from servesweep.config.search_block import SearchBlock
from servesweep.matrix.capacity_run import probe_tag, replay_probe, set_load
from servesweep.matrix.capacity_search import SearchSpec, parse_tier, search
from servesweep.results.capacity import table_rows
from servesweep.results.trace_fidelity import trace_fidelity
from servesweep.sglang.serverargs import resolve_server
from servesweep.sim.cli import parse_args
from servesweep.sim.engine import Engine, EngineRequest
from servesweep.sim.launch import start_sim
from servesweep.workload.trace import synth
from servesweep.workload.trace.cache import ideal_cached_tokens
from servesweep.workload.trace.model import Trace, TraceRequest
from servesweep.workload.trace.replay_estimate import replay_plan

SIM = ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "per_seq_s=0.1,speedup=20"]
N, PROMPT, STEPS, RATE0, TPOT_SLO_MS = 40, 100, 16, 2.0, 16.0


def engine_tpot_p50_ms(speed: float) -> float:
    """The trace's TPOT p50 at `speed`, from the emulator's engine in virtual time (its own step model)."""
    args = parse_args(SIM)
    eng = Engine(resolve_server({k: v for k, v in vars(args).items() if k != "launch_command"}, {}),
                 calibration=args.sim_calibration)  # fmt: skip
    rng = random.Random(0)
    done: list[EngineRequest] = []

    def emit(r: EngineRequest, _n: int, finished: bool) -> None:
        if finished:
            done.append(r)

    eng.run_simulated(
        (i / (RATE0 * speed), EngineRequest(f"r{i}", [rng.randrange(1, 150000) for _ in range(PROMPT)], STEPS + 1,
                                            emit, ignore_eos=True))
        for i in range(N)
    )  # fmt: skip
    assert len(done) == N
    tpot = [(r.finish_time - r.first_token_time) / (r.completion_tokens - 1) * 1000 for r in done]
    return float(np.percentile(tpot, 50))


def known_capacity(lo: float = 1.0, hi: float = 16.0) -> float:
    """The largest speed-up whose TPOT p50 holds the SLO (bisection to 0.1%; monotone in the speed-up)."""
    assert engine_tpot_p50_ms(lo) <= TPOT_SLO_MS < engine_tpot_p50_ms(hi)
    while hi - lo > 0.001 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if engine_tpot_p50_ms(mid) <= TPOT_SLO_MS else (lo, mid)
    return lo


@pytest.mark.timeout(300)
def test_speedup_search_finds_the_replay_capacity_the_engine_computes(tmp_path):
    want = known_capacity()
    reqs = [
        TraceRequest(
            timestamp_ms=i * 1000 / RATE0, input_length=PROMPT, output_length=STEPS + 1, hash_ids=[i]
        )
        for i in range(N)
    ]
    path = tmp_path / "trace.jsonl"
    Trace(block_size=512, source="test:constant", requests=reqs).save(path)
    with start_sim([*SIM, "--enable-cache-report"]) as sim:
        point = LoadPoint(
            base_url=sim.base_url, model="Qwen/Qwen3.6-27B", probe=False, concurrency=64, requests=N,
            workload="trace", trace=str(path),
        )  # fmt: skip
        spec = SearchSpec(
            axis="speedup", start=4.5, lower=1.0, upper=16.0, rel=0.05, max_probes=8, max_requests=N
        )
        result = search(
            replay_probe(point, tmp_path / "probes"), {"decode": parse_tier("tpot_p50<=16ms")}, spec
        )
    tier = result.tiers["decode"]
    lo, hi = tier.bracket
    print(
        f"\nreplay capacity at tpot_p50<=16ms: {tier.capacity:.3g}x (bracket {lo:.3g}-{hi:.3g}, {tier.stop}, "
        f"{result.probes_used} replays), the engine's {want:.4g}x"
    )
    for p in result.probes:
        est = p.judgements["decode"][0].estimate
        print(
            f"  {p.load:.3g}x: {p.verdicts['decode']} tpot p50 {est:.2f} ms (engine {engine_tpot_p50_ms(p.load):.2f})"
        )
    assert tier.stop == "resolution" and tier.binding == "tpot_p50<=16ms"
    assert lo is not None and hi is not None and (hi - lo) <= 0.05 * lo + 1e-9
    assert lo <= want < hi, (lo, want, hi)  # within the search's resolution of the known answer


@pytest.mark.fast
def test_the_speedup_axis_from_block_to_probe_to_table():
    block = SearchBlock(
        axis="speedup", tiers={"t": ["ttft_p95<=5s"]}, lower=0.25, upper=8, start=1, resolution="10%"
    )
    assert block.load_value(2) == 2.0
    dry = block.dry_run(20)  # the dry run's emulator, 20x faster, keeps up with a 20x faster trace
    assert (dry["lower"], dry["upper"], dry["start"]) == (5.0, 160.0, 20.0) and dry["tiers"]["t"] == [
        "ttft_p95<=250ms"
    ]
    point = {"concurrency": 32, "trace_speedup": 1.0, "requests": 60}
    set_load(point, "speedup", 3.2)
    assert point == {"concurrency": 32, "trace_speedup": 3.2, "requests": 60}
    assert [probe_tag(a, x) for a, x in (("concurrency", 8), ("rate", 2.5), ("speedup", 3.2))] == [
        "c8",
        "r2.5",
        "x3.2",
    ]
    row = {
        "config": "s01", "workload": "production", "prompt_tokens": 2100, "output_tokens": 200, "gpus": 2,
        "tier": "t", "capacity": 3.2, "bracket": [3.2, 3.5], "stop": "resolution", "binding": "ttft_p95<=5s",
        "probes": 5, "load_unit": "x trace", "at_capacity": {},
    }  # fmt: skip
    assert table_rows({"rows": [row]})[0][6] == "3.2× (1.6×/GPU)"
    with pytest.raises(ValueError, match="a speedup search needs a resolution"):
        SearchSpec(axis="speedup", start=1.0, lower=1.0, upper=2.0, rel=0.0)


@pytest.mark.fast
def test_a_replay_plan_and_the_cap_bound_starts_in_the_verdict(tmp_path):
    s = synth.shared_prefix_requests(16, groups=4, prefix_blocks=2, own_blocks=1, rate_rps=4.0, seed=5)
    path = synth.write_mooncake(tmp_path / "t.jsonl", s.trace)
    rp = replay_plan({"trace": str(path), "trace_speedup": 2.0})
    assert (rp.requests, rp.duration_s, rp.rate_rps) == (16, 1.875, 8.0)
    assert rp.ideal_hit_ratio == pytest.approx(s.expected_hit_ratio)
    assert rp.seconds(0.25, 4) == 2.125 and rp.seconds(1.0, 2) == 9.0  # the schedule, else the server's pace
    assert rp.running(0.5, 64) == 4.0 and rp.running(0.5, 2) == 2.0
    t = s.trace
    recs = [
        {"trace_index": i, "prompt_tokens": r.input_length, "cached_tokens": c, "cap_bound": i in (3, 7)}
        for i, (r, c) in enumerate(zip(t.requests, ideal_cached_tokens(t), strict=True))
    ]
    f = trace_fidelity(t, recs)
    assert f.faithful and f.cap_bound_starts == 2 and f.short_outputs is None  # no completion_tokens: unknown
    assert f.verdict.endswith(
        "; concurrency cap bound: 2 starts waited for a free user (raise the concurrency)"
    )


@pytest.mark.fast
def test_answers_shorter_than_the_trace_are_stated():
    s = synth.shared_prefix_requests(8, groups=2, prefix_blocks=1, own_blocks=1, output_length=16, seed=1)
    t = s.trace
    recs = [
        {"trace_index": i, "prompt_tokens": r.input_length, "cached_tokens": c, "completion_tokens": 16 - (i == 5)}
        for i, (r, c) in enumerate(zip(t.requests, ideal_cached_tokens(t), strict=True))
    ]
    f = trace_fidelity(t, recs)
    assert f.faithful and f.short_outputs == 1
    assert f.verdict.endswith("; 1 answers shorter than the trace's output length (stopped at EOS: ignore_eos off?)")


@pytest.mark.fast
def test_gate_and_compare_take_a_replay_capacity(tmp_path):
    import json

    from servesweep.results.capacity import CAPACITY_JSON, compare, gate

    def run(name: str, lo: float, hi: float) -> Path:
        row = {
            "search": "s01.production-chat-p2100-o200-c32", "config": "s01", "workload": "production",
            "prompt_tokens": 2100, "output_tokens": 200, "gpus": 2, "axis": "speedup", "tier": "t",
            "slos": ["ttft_p95<=5s"], "capacity": lo, "bracket": [lo, hi], "stop": "resolution", "binding": "ttft_p95<=5s", "probes": 5,
            "load_unit": "x trace", "at_capacity": {},
        }  # fmt: skip
        d = tmp_path / name
        d.mkdir()
        cap = {"run_id": name, "axis": "speedup", "rows": [row], "frontier": [], "probes": 5, "grid_points": 9}
        (d / CAPACITY_JSON).write_text(json.dumps(cap))  # as capacity_run writes it (results/capacity.py CapacityFile)
        return d

    old, new = run("old", 3.2, 3.5), run("new", 2.4, 2.6)
    (row,) = gate(new, "2", None)  # every capacity at least 2x the trace
    assert row[2], row
    (row,) = gate(new, "90%", old)  # 90% of the baseline's 3.2x: the new first fail (2.6x) is below 2.88x
    assert not row[2], row
    (c,) = compare(json.loads((old / CAPACITY_JSON).read_text()), json.loads((new / CAPACITY_JSON).read_text()))
    assert c["verdict"] == "lower" and c["ratio"] == pytest.approx(0.75)
