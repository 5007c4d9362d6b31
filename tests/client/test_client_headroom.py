"""Client headroom in summary.json: a load-generating process that used more than 90 % of a core, or whose event
loop woke up late (p99 above 20 ms), flags the point as measured by a saturated client, naming which and why."""

from __future__ import annotations

import pytest

from servesweep.results.summary import CPU_SATURATED_PCT, LOOP_LAG_SATURATED_MS, ClientEntry, client_headroom

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def _client(name, cpu_s, wall_s, lags, role=None):
    d = {
        "client_id": name,
        "worker": name,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "lags_ms": lags,
        "cpu_pct_max": 0.0,
    }
    if role:
        d["role"] = role
    return ClientEntry.model_validate(d)  # an entry of clients.json


def test_saturation_is_flagged_with_the_process_and_the_reason():
    calm = [0.5] * 199 + [3.0]
    h = client_headroom([_client("h:1", 2.0, 10.0, calm), _client("h:2", 3.0, 10.0, calm)])
    assert not h["client_saturated"] and h["reasons"] == []
    assert [round(w["cpu_pct"]) for w in h["workers"]] == [20, 30]
    assert h["workers"][0]["loop_lag_p99_ms"] < 3.0 and h["workers"][0]["loop_lag_max_ms"] == 3.0

    busy = _client("h:3", 9.5, 10.0, calm)  # 95 % of a core
    late = _client("h:4", 1.0, 10.0, [0.5] * 90 + [60.0] * 10)  # one wake-up in ten 60 ms late
    master = _client("master h:9", 1.0, 10.0, [80.0] * 100, role="master")  # stamps nothing: lag not counted
    h = client_headroom([busy, late, master])
    assert h["client_saturated"]
    assert h["reasons"] == [
        f"h:3: CPU 95% of a core > {CPU_SATURATED_PCT:g}%",
        f"h:4: event-loop lag p99 60.0 ms > {LOOP_LAG_SATURATED_MS:g} ms",
    ]
    assert [w["worker"] for w in h["workers"]] == ["h:3", "h:4"] and h["master"]["worker"] == "master h:9"
    assert (
        h["workers"][0]["cpu_pct_max_3s"] == 0.0
        and client_headroom([_client("s", 1, 2, [])])["workers"][0]["cpu_pct_max_3s"] is None
    ), "no full 3-s window in a 2-s point"
    h = client_headroom([_client("master h:9", 9.9, 10.0, [], role="master")])
    assert h["reasons"] == ["master h:9: CPU 99% of a core > 90%"], "a master near a full core is a limit too"


def test_merged_chunks_flag_the_client_read_lag_alone_does_not():
    import pyarrow as pa

    from servesweep.results.summary import MERGED_GAPS_SATURATED_SHARE

    # 8-13 ms of read lag is harmless with kernel stamps while chunks are still read one by one (stamps exact) ...
    recs = pa.table({"read_lag_ns": [8_000_000] * 98 + [13_000_000] * 2})
    h = client_headroom([_client("h:1", 1.0, 10.0, [0.5])], recs, itl_zero_gap_share=0.004)
    assert not h["client_saturated"] and h["read_lag_ms"]["p99"] == 13.0
    assert h["limits"]["merged_itl_gaps_share"] == MERGED_GAPS_SATURATED_SHARE
    # ... but once the reader falls a chunk gap behind, chunks of a stream are read together and share a stamp
    h = client_headroom([_client("h:1", 1.0, 10.0, [0.5])], recs, itl_zero_gap_share=0.03)
    assert h["client_saturated"] and h["reasons"] == [
        "3.0% of ITL gaps are chunks read together (> 1%; read lag p99 13.0 ms)"
    ]
