"""servesweep.results.metrics on hand-made records: each per-request metric against a value worked out by hand from
docs/metrics.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_summary import MS, rec  # the same hand-made record

from servesweep.results import metrics
from servesweep.results.records import to_table

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def test_one_request_functions():
    assert metrics.ttft(150 * MS, 100 * MS) == 50.0
    assert metrics.ttft(150 * MS, 100 * MS, metrics.NS_PER_S) == 0.05
    assert metrics.e2e(400 * MS, 100 * MS) == 300.0
    assert metrics.schedule_lag(100 * MS, 90 * MS) == 10.0
    ch = [100 * MS, 130 * MS, 190 * MS]
    assert metrics.itl_gaps(ch).tolist() == [30.0, 60.0]
    # per-chunk tokens [1, 3, 2]: 30 ms / 3 counted 3 times, 60 ms / 2 counted twice; TPOT 90 ms / (6 - 1)
    v, k = metrics.itl_per_token(metrics.itl_gaps(ch), ch, [1, 3, 2], 6)
    assert v.tolist() == [10.0, 30.0] and k.tolist() == [3, 2]
    assert metrics.tpot(ch, [1, 3, 2], 6) == 18.0
    # first chunk of 2 tokens: TPOT 90 / (6 - 2)
    assert metrics.tpot(ch, [2, 2, 2], 6) == 22.5
    # no per-chunk tokens: each of the 2 gaps carries (5 - 1) / 2 = 2 tokens; TPOT 90 / (5 - 1)
    v, k = metrics.itl_per_token(metrics.itl_gaps(ch), ch, None, 5)
    assert v.tolist() == [15.0, 30.0] and k.tolist() == [1, 1]
    assert metrics.tpot(ch, None, 5) == 22.5
    # a 0-token chunk's gap is left out
    v, k = metrics.itl_per_token(metrics.itl_gaps(ch), ch, [1, 0, 2], 3)
    assert v.tolist() == [30.0] and k.tolist() == [2]
    # none: one chunk, unknown or too few tokens
    assert math.isnan(metrics.tpot([100 * MS], None, 5))
    assert math.isnan(metrics.tpot(ch, None, None))
    assert math.isnan(metrics.tpot(ch, [3, 0, 0], 3))
    assert metrics.itl_per_token(metrics.itl_gaps(ch), ch, None, 1)[0].size == 0
    assert metrics.decode_tokens_per_s([20.0, 0.0, math.nan])[0] == 50.0
    assert np.isnan(metrics.decode_tokens_per_s([20.0, 0.0, math.nan])[1:]).all()


@pytest.fixture
def table():
    return to_table(
        [
            # ok: ttft 20, gaps 30, 60 (per chunk tokens 1, 3, 2), e2e 100, tpot 90 / 5 = 18
            rec(0, sched=0, sent=10, chunks=[30, 60, 120], end=110, tokens=[1, 3, 2], completion=6),
            # failed: no latencies, but its schedule lag counts
            rec(1, sched=5, sent=25, chunks=[], end=40, err="http_429"),
            # ok, no per-chunk tokens: ttft 5, one gap 40 carrying (3 - 1) / 1 = 2 tokens, tpot 40 / 2 = 20
            rec(2, sched=50, sent=60, chunks=[65, 105], end=110, completion=3),
            # ok, one chunk: ttft 10, no gaps, no tpot
            rec(3, sched=70, sent=70, chunks=[80], end=90, completion=1),
        ]
    )


def test_request_metrics_over_a_table(table):
    ok = np.array([True, False, True, True])
    rm = metrics.request_metrics(table, ok)
    nan = math.nan

    def same(a, b):
        np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))

    same(rm.ttft_ms, [20, nan, 5, 10])
    same(rm.ttft_from_scheduled_ms, [30, nan, 15, 10])
    same(rm.e2e_ms, [100, nan, 50, 20])
    same(rm.e2e_from_scheduled_ms, [110, nan, 60, 20])
    same(rm.tpot_ms, [18, nan, 20, nan])
    same(rm.decode_tokens_per_s, [1000 / 18, nan, 50, nan])
    same(rm.schedule_lag_ms, [10, 20, 10, 0])
    same(rm.max_itl_ms, [60, 0, 40, 0])
    same(rm.itl_ms, [30, 60, 40])
    same(rm.itl_owner, [0, 0, 2])
    # row 2 has no per-chunk tokens: its one gap counts once, at 40 / 2
    same(rm.itl_per_token_ms, [10, 10, 10, 30, 30, 20])
    same(rm.itl_per_token_owner, [0, 0, 0, 0, 0, 2])
    # every row counts when no mask is given
    assert metrics.request_metrics(table.slice(0, 1)).ttft_ms.tolist() == [20.0]


def test_goodput(table):
    ok = np.array([True, False, True, True])
    rm = metrics.request_metrics(table, ok)
    values = rm.per_request_slo_values()
    # ttft <= 10: rows 2 and 3; itl <= 50 (largest gap): rows 2, 3 (row 3 has no gap: 0); the failed row never
    good = metrics.good_requests(values, ok, [("ttft", "<=", 10.0), ("itl", "<=", 50.0)])
    assert good.tolist() == [False, False, True, True]
    # tpot < 19: row 0 only (row 3 has no TPOT, so it cannot meet a TPOT SLO)
    good = metrics.good_requests(values, ok, [("tpot", "<", 19.0)])
    assert good.tolist() == [True, False, False, False]
    assert metrics.goodput(good, 4, 2.0) == (1, 0.25, 0.5)
    assert metrics.meets_slos({"ttft": 5.0, "tpot": 20.0}, [("ttft", "<=", 10.0), ("tpot", "<=", 20.0)])
    assert not metrics.meets_slos({"ttft": 5.0, "tpot": math.nan}, [("tpot", "<=", 20.0)])
