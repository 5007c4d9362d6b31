"""summary.summarize on hand-made records: every metric against a value computed by hand from the definitions."""

from __future__ import annotations

import pytest

from servesweep.config.slo import parse_slos
from servesweep.results.records import read_parquet, to_table, write_parquet
from servesweep.results.summary import check_slos, summarize

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

MS = 1_000_000


def rec(
    i, *, sched, sent, chunks, end, tokens=None, completion=None, prompt=1000, cached=0, err=None, warm=False
):
    return {
        "request_id": f"r{i}",
        "point_id": "p",
        "worker": "w",
        "user": 0,
        "warmup": warm,
        "scheduled_ns": sched * MS,
        "sent_ns": sent * MS,
        "headers_ns": sent * MS,
        "first_token_ns": chunks[0] * MS if chunks else None,
        "chunk_ns": [c * MS for c in chunks],
        "chunk_tokens": tokens,
        "end_ns": end * MS,
        "prompt_tokens": prompt if err is None else None,
        "completion_tokens": completion if completion is not None else (len(chunks) if err is None else None),
        "cached_tokens": cached if err is None else None,
        "reasoning_tokens": None,
        "target_prompt_tokens": 1000,
        "target_output_tokens": 4,
        "finish_reason": "length" if err is None else None,
        "http_status": 200 if err is None else 429,
        "error_class": err,
        "error_message": None if err is None else "x",
        "mono_to_wall_ns": 0,
    }


@pytest.fixture
def table():
    rows = [
        # warmup: must not count anywhere
        rec(0, sched=0, sent=0, chunks=[5, 6, 7, 8], end=9, warm=True),
        # a: TTFT 100, gaps 10,10,10, 4 tokens, e2e 131
        rec(1, sched=100, sent=100, chunks=[200, 210, 220, 230], end=231, prompt=1010, cached=10),
        # b: scheduled 2 ms before sending; TTFT 50, gaps 20, 40 with per-chunk tokens 1,2,2 (5 tokens)
        rec(
            2, sched=98, sent=100, chunks=[150, 170, 210], end=300, tokens=[1, 2, 2], completion=5, prompt=990
        ),
        # c: failed (429), counted in the error rate, not in latencies
        rec(3, sched=250, sent=250, chunks=[], end=260, err="http_429"),
    ]
    return to_table(rows)


def test_latencies_match_the_definitions(table):
    s = summarize(table)
    assert s["requests"] == {"total": 4, "warmup": 1, "measured": 3, "ok": 2, "failed": 1}
    assert s["ttft_ms"]["mean"] == pytest.approx(75.0)
    assert s["ttft_ms"]["max"] == pytest.approx(100.0)
    assert s["ttft_from_scheduled_ms"]["max"] == pytest.approx(100.0)
    assert s["ttft_from_scheduled_ms"]["min"] == pytest.approx(52.0)
    # chunk gaps pooled: 10,10,10,20,40
    assert s["itl_ms"]["n"] == 5
    assert s["itl_ms"]["p50"] == pytest.approx(10.0)
    assert s["itl_ms"]["max"] == pytest.approx(40.0)
    # per token: a -> 10,10,10 (1 token per gap); b -> 20/2 twice, 40/2 twice
    assert s["itl_per_token_ms"]["n"] == 7
    assert sorted([s["itl_per_token_ms"]["min"], s["itl_per_token_ms"]["max"]]) == pytest.approx([10.0, 20.0])
    # TPOT: a (230-200)/(4-1) = 10; b (210-150)/(5-1) = 15
    assert s["tpot_ms"]["min"] == pytest.approx(10.0)
    assert s["tpot_ms"]["max"] == pytest.approx(15.0)
    assert s["decode_tokens_per_s"]["max"] == pytest.approx(100.0)
    assert s["e2e_ms"]["min"] == pytest.approx(131.0)
    assert s["e2e_ms"]["max"] == pytest.approx(200.0)
    assert s["schedule_lag_ms"]["max"] == pytest.approx(2.0)


def test_throughput_window_failures_accuracy_cache(table):
    s = summarize(table)
    # window: first measured schedule (98 ms) to last measured end (300 ms) = 0.202 s
    assert s["window_s"] == pytest.approx(0.202)
    assert s["output_tokens"] == 9
    assert s["output_tokens_per_s"] == pytest.approx(9 / 0.202)
    assert s["request_rate"] == pytest.approx(2 / 0.202)
    assert s["error_rate"] == pytest.approx(1 / 3)
    assert s["failures"] == {"http_429": 1}
    assert s["prompt_tokens"]["mean_deviation_pct"] == pytest.approx(0.0)
    assert s["prompt_tokens"]["max_abs_deviation_pct"] == pytest.approx(1.0)
    assert s["cache_hit_ratio"] == pytest.approx(10 / 2000)


def test_slos_and_goodput(table):
    s = summarize(table, slos="ttft_p99<=2s,error_rate<=10%,ttft<=80ms")
    checks = {c["slo"]: c["pass"] for c in s["slos"]}
    assert checks == {"ttft_p99<=2s": True, "error_rate<=10%": False}
    assert check_slos(s)["pass"] is False
    # only request b has TTFT <= 80 ms: 1 good of 3 measured
    assert s["goodput"]["requests"] == 1
    assert s["goodput"]["ratio"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("ttft_p98<=1s", "ttft_p98"),
        ("error_rate<=5ms", "not a latency"),
        ("ttft<=5%", "latency"),
        ("tok<=1", "tok"),
    ],
)
def test_bad_slo_names_the_problem(bad, needle):
    with pytest.raises(ValueError, match=needle):
        parse_slos(bad)


def test_parquet_round_trip(tmp_path, table):
    p = tmp_path / "r.parquet"
    write_parquet(table, p, metadata={"point_id": "p"})
    back = read_parquet(p)
    assert back.num_rows == 4
    assert back.column("chunk_ns").to_pylist()[1] == [200 * MS, 210 * MS, 220 * MS, 230 * MS]
    assert back.schema.metadata[b"servesweep.point_id"] == b"p"
    assert summarize(back)["ttft_ms"] == summarize(table)["ttft_ms"]


def test_empty_and_all_failed():
    s = summarize(to_table([rec(1, sched=0, sent=0, chunks=[], end=5, err="no_done")]))
    assert s["requests"]["ok"] == 0 and s["error_rate"] == 1.0
    assert s["ttft_ms"] is None and s["output_tokens_per_s"] == 0.0
    assert summarize(to_table([]))["requests"]["total"] == 0


def test_merged_chunks_and_stamp_sources_are_counted():
    # two chunks read together share one kernel stamp (gap 0): one of the five gaps
    rows = [
        rec(1, sched=0, sent=0, chunks=[100, 110, 110, 120], end=121) | {"rx_clock": "kernel"},
        rec(2, sched=0, sent=0, chunks=[50, 70, 90], end=91) | {"rx_clock": "user"},
    ]
    s = summarize(to_table(rows))
    assert s["itl_zero_gap_share"] == pytest.approx(1 / 5)
    assert s["rx_clock"] == {"kernel": 1, "user": 1}
    assert summarize(to_table([rec(1, sched=0, sent=0, chunks=[1], end=2)]))["itl_zero_gap_share"] is None
