"""Trace replay through the Locust user against the emulator (issue 30): a generated Mooncake trace replayed by
`servesweep load --workload trace`, and a session trace by `run_point` with two Locust worker processes.

The fidelity verdict in summary.json agrees with the trace within 1 point, the emulator's ground truth confirms
every request's cached tokens and its arrival at its slot, each session stays on one worker with its turns in order
and its delays kept, and a start that found every user busy is stated as the concurrency cap binding.

One emulator for the module; a few seconds of traffic."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from servesweep.cli.load import command
from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim
from servesweep.workload.build import load_point_trace
from servesweep.workload.trace import synth
from servesweep.workload.trace.cache import ideal_cached_tokens

SIM_ARGS = ["--model-path", "Qwen/Qwen3.6-27B", "--enable-cache-report", "--enable-metrics"]
SIM_ARGS += ["--sim-calibration", "speedup=4"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("sim") / "ground_truth.jsonl"
    with start_sim(SIM_ARGS, ground_truth=gt) as s:
        yield s


def ground_truth_for(sim, ids: set[str]) -> dict[str, dict]:
    return {d["id"]: d for d in sim.ground_truth_so_far() if d["id"] in ids}


def test_servesweep_load_replays_a_mooncake_trace_cache_faithfully(sim, tmp_path):
    s = synth.shared_prefix_requests(16, groups=4, prefix_blocks=2, own_blocks=1, rate_rps=4.0, seed=5)
    path = synth.write_mooncake(tmp_path / "mooncake.jsonl", s.trace)
    args = ["--base-url", sim.base_url, "--workload", "trace", "--trace", str(path), "--trace-speedup", "2"]
    args += ["--concurrency", "8", "--json", "--out", str(tmp_path / "runs")]
    r = CliRunner().invoke(command, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (summary,) = json.loads(r.stdout)["points"]
    f = summary["trace_fidelity"]
    print(f["verdict"])
    assert f["verdict"] in r.stderr and f["verdict"].startswith("replay faithful: cache hits ")
    assert f["faithful"] and f["cache_flushed"] and f["requests_measured"] == f["requests_sent"] == 16
    assert abs(f["expected_hit_ratio"] - f["measured_hit_ratio"]) * 100 <= 1.0, f["verdict"]
    assert f["expected_hit_ratio"] == pytest.approx(s.expected_hit_ratio)
    assert f["requests_cache_off"] == 0 and f["prompt_length_mismatches"] == 0
    assert f["cap_bound_starts"] == 0 and "cap bound" not in f["verdict"] and f["short_outputs"] == 0
    # the server's own counter moved by the cached tokens the requests reported
    assert f["server_cached_tokens"] == f["measured_cached_tokens"] == s.expected_cached
    assert (
        f["cache_tokens"] and f["cache_tokens"] > 16 * 2048
    )  # the emulator's KV pool, read from /server_info

    run_dir = next((tmp_path / "runs").iterdir())
    recs = read_parquet(run_dir / summary["point_id"] / "records.parquet").to_pylist()
    assert sorted(x["trace_index"] for x in recs) == list(range(16))
    assert all(x["workload"] == "trace" and x["error_class"] is None for x in recs)
    by_index = {x["trace_index"]: x for x in recs}
    trace = load_point_trace(LoadPoint.model_validate(summary["point"]))
    expected = ideal_cached_tokens(trace)
    # the emulator's ground truth, per request: its cached tokens are the trace's expected ones (a group's requests
    # come a second apart on the trace's clock, half a second at 2x: long after the first one's prefill) ...
    gt = ground_truth_for(sim, {x["request_id"] for x in recs})
    assert len(gt) == 16
    assert {i: gt[x["request_id"]]["cached_tokens"] for i, x in by_index.items()} == dict(enumerate(expected))
    assert {i: x["cached_tokens"] for i, x in by_index.items()} == dict(enumerate(expected))
    # ... and it arrived at its slot: the trace's timestamps halved, each received within 50 ms after its slot
    t0 = by_index[0]["scheduled_ns"]
    for i, x in by_index.items():
        assert (x["scheduled_ns"] - t0) / 1e6 == pytest.approx(trace.requests[i].timestamp_ms / 2, abs=0.01)
        late_ms = (gt[x["request_id"]]["recv_ns"] - x["scheduled_ns"]) / 1e6
        assert -1.0 < late_ms < 50, (i, late_ms)
        assert x["prompt_tokens"] == trace.requests[i].input_length
        assert x["completion_tokens"] == trace.requests[i].output_length


def test_two_workers_keep_each_session_on_one_worker_in_turn_order(sim, tmp_path):
    # 4 sessions of 3 turns, 40 ms apart, each turn 30 ms after the previous one ended: s0, s1 hash to worker 1,
    # s2, s3 to worker 0 (arrivals.session_worker); with one user per worker, s1 and s3 find it busy (the cap binds)
    s = synth.session_requests(sessions=4, turns=3, first_blocks=2, grow_blocks=1, delay_ms=30.0, gap_ms=40.0)
    path = synth.write_sessions(tmp_path / "sessions.jsonl", s.trace)
    point = LoadPoint(
        base_url=sim.base_url, concurrency=2, requests=12, workload="trace", trace=str(path), probe=False,
        model="Qwen/Qwen3.6-27B",
    )  # fmt: skip
    summary = run_point(point, tmp_path / "pt", workers=2)
    f = summary["trace_fidelity"]
    print(f["verdict"])
    assert f["faithful"], f["verdict"]
    assert f["expected_hit_ratio"] == pytest.approx(s.expected_hit_ratio) and f["requests_cache_off"] == 0
    assert f["cap_bound_starts"] == 2 and "concurrency cap bound: 2 starts" in f["verdict"]
    recs = read_parquet(tmp_path / "pt" / "records.parquet").to_pylist()
    assert sorted(x["trace_index"] for x in recs) == list(range(12))
    sessions: dict[str, list[dict]] = {}
    for x in recs:
        sessions.setdefault(x["session_id"], []).append(x)
    assert sorted(sessions) == ["s0", "s1", "s2", "s3"]
    workers = {sid: {x["worker"] for x in turns} for sid, turns in sessions.items()}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers["s0"] == workers["s1"] != workers["s2"] == workers["s3"]
    assert {sid: sum(bool(x["cap_bound"]) for x in turns) for sid, turns in sessions.items()} == {
        "s0": 0, "s1": 1, "s2": 0, "s3": 1,
    }  # fmt: skip
    gt = ground_truth_for(sim, {x["request_id"] for x in recs})
    expected = ideal_cached_tokens(load_point_trace(point))
    for turns in sessions.values():
        turns.sort(key=lambda x: x["turn"])
        assert [x["turn"] for x in turns] == [0, 1, 2]
        for a, b in zip(turns, turns[1:], strict=False):
            # each turn 30 ms after the previous one's end (its record's end: the last chunk's arrival)
            gap_ms = (b["sent_ns"] - a["end_ns"]) / 1e6
            # never early; late only by the loaded machine's scheduling (98 ms seen under five pytest workers), far
            # from a delay read in the wrong unit or counted from the wrong turn
            assert 30.0 <= gap_ms < 1000, gap_ms
        for x in turns:
            assert gt[x["request_id"]]["cached_tokens"] == x["cached_tokens"] == expected[x["trace_index"]]
