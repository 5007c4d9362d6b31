"""Trace replay against real SGLang (issue 30): a generated trace with shared prefix blocks, and a session trace
through two Locust workers, replayed by `run_point` against SGLang 0.5.23 on the CPU (its radix cache, its
`cached_tokens`, its `sglang:cached_tokens_total`). The fidelity verdict's expected and measured hit rates agree
within 1 point (the prompts are exact in the tiny model's own tokenizer), the server's counter agrees with the
responses, and each session stays on one worker.

The server is the one test_vs_emulator.py uses (the same flags): no SGLang start of its own when this file runs
before test_server.py, which stops it (conftest.FILE_ORDER)."""

from __future__ import annotations

import pytest

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.workload.trace import synth
from servesweep.workload.trace.readers import read_trace

FLAGS = {"enable_cache_report": True}  # test_vs_emulator.py's: one server for both


@pytest.mark.timeout(300)
def test_real_sglang_serves_a_replayed_trace_its_expected_cache_hits(sglang_server, sglang_cpu_env, tmp_path):
    srv = sglang_server(FLAGS)
    # 16 requests in 4 groups sharing two 64-token prefix blocks (the native format keeps the block size)
    s = synth.shared_prefix_requests(16, groups=4, prefix_blocks=2, own_blocks=1, block_size=64, rate_rps=8.0)
    path = tmp_path / "shared.trace.jsonl"
    s.trace.save(path)
    point = LoadPoint(
        base_url=srv.base_url, concurrency=16, requests=1, workload="trace", trace=str(path),
        tokenizer=str(sglang_cpu_env.tokenizer_json), first_token_s=120,
    )  # fmt: skip
    summary = run_point(point, tmp_path / "shared")
    f = summary["trace_fidelity"]
    print(f["verdict"])
    assert f["faithful"] and f["cache_flushed"], f["verdict"]
    assert abs(f["expected_hit_ratio"] - f["measured_hit_ratio"]) * 100 <= 1.0, f["verdict"]
    assert f["expected_hit_ratio"] == pytest.approx(s.expected_hit_ratio)  # 16k KV tokens: nothing evicted
    assert f["prompt_length_mismatches"] == 0 and f["requests_measured"] == 16
    assert f["server_cached_tokens"] == f["measured_cached_tokens"]  # SGLang's counter and its responses agree
    assert f["cache_tokens"] == 16384  # max_total_num_tokens from /server_info


@pytest.mark.timeout(300)
def test_real_sglang_replay_of_sessions_through_two_workers(sglang_server, sglang_cpu_env, tmp_path):
    srv = sglang_server(FLAGS)
    s = synth.session_requests(sessions=4, turns=3, first_blocks=2, grow_blocks=1, block_size=64, delay_ms=30.0)
    path = tmp_path / "sessions.trace.jsonl"
    synth.write_sessions(tmp_path / "sessions.jsonl", s.trace)
    read_trace(tmp_path / "sessions.jsonl", block_size=64).save(path)  # the native format keeps the block size
    point = LoadPoint(
        base_url=srv.base_url, concurrency=4, requests=1, workload="trace", trace=str(path),
        tokenizer=str(sglang_cpu_env.tokenizer_json), first_token_s=120,
    )  # fmt: skip
    summary = run_point(point, tmp_path / "sessions", workers=2)
    f = summary["trace_fidelity"]
    print(f["verdict"])
    assert f["faithful"] and abs(f["expected_hit_ratio"] - f["measured_hit_ratio"]) * 100 <= 1.0, f["verdict"]
    assert f["expected_hit_ratio"] == pytest.approx(s.expected_hit_ratio)
    recs = read_parquet(tmp_path / "sessions" / "records.parquet").to_pylist()
    workers: dict[str, set[str]] = {}
    for r in recs:
        workers.setdefault(r["session_id"], set()).add(r["worker"])
    assert len(workers) == 4 and all(len(w) == 1 for w in workers.values()), workers
