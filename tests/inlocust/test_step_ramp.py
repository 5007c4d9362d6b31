"""A step ramp chosen on the command line of a Locust with its web UI and no workers (`--autostart --load-shape
step-ramp`), driven in this process; the web UI's JSON is read from its Flask app.

Moved from tests/client/test_webui.py (test_local_runner_step_ramp_from_the_command_line, a `locust` subprocess
polled over HTTP). An emulator that refuses or breaks some requests, so errors by class show: the live aggregate
(`/servesweep/live.json`) agrees with the records, the steps follow the ramp, and the per-step CSV rows are the load
table's rows of the records scheduled in each step.
"""

from __future__ import annotations

import csv

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from locustrun import LocalRun, wait_until

from servesweep.client.live_stats import Sketch
from servesweep.results.records import read_parquet
from servesweep.results.summary import summarize
from servesweep.results.table import results_table

LOAD_COLUMNS = [c.header for c in results_table([]).columns]  # `servesweep load`'s table
# Held 2 s each (about 6 s in all, hence `slow`): with 20% of requests faulted, each step must see failures
# (check_steps) and a shorter step would too often see none.
STEPS, HOLD_S = (2, 1), 2.0


# (latencies, order_stat, close, in_window, check_steps: the same checks as tests/client/test_webui.py's)
def latencies(table: pa.Table) -> dict[str, np.ndarray]:
    """TTFT, every chunk gap, TPOT and E2E (ms) of the successful requests, computed here from the records."""
    out: dict[str, list[float]] = {"ttft_ms": [], "itl_ms": [], "tpot_ms": [], "e2e_ms": []}
    for r in table.to_pylist():
        if r["error_class"] is not None or r["warmup"]:
            continue
        ch = r["chunk_ns"]
        out["ttft_ms"].append((r["first_token_ns"] - r["sent_ns"]) / 1e6)
        out["e2e_ms"].append((r["end_ns"] - r["sent_ns"]) / 1e6)
        out["itl_ms"].extend((np.diff(np.asarray(ch, dtype=np.float64)) / 1e6).tolist())
        # one token per chunk: the emulator without spec decoding
        if len(ch) > 1 and r["completion_tokens"] > 1:
            out["tpot_ms"].append((ch[-1] - ch[0]) / 1e6 / (r["completion_tokens"] - 1))
    return {k: np.sort(np.asarray(v)) for k, v in out.items()}


def order_stat(sorted_values: np.ndarray, q: float) -> float:
    return float(sorted_values[int(q * (sorted_values.size - 1))])


def close(a: float, b: float, rel: float, abs_: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * abs(b), abs_)


def in_window(table: pa.Table, start_ns: int, end_ns: int) -> pa.Table:
    wall = pc.add(table.column("scheduled_ns"), table.column("mono_to_wall_ns")).to_numpy()
    return table.filter(pa.array((wall >= start_ns) & (wall < end_ns)))


def check_steps(rows: list[dict[str, str]], windows: list[dict], records: pa.Table, failures=False) -> None:
    """Each CSV row is the load table's row of the records scheduled inside its step, summarized here."""
    assert len(rows) == len(windows)
    for r, w in zip(rows, windows, strict=True):
        mine = summarize(in_window(records, w["start_ns"], w["end_ns"]))
        mine["point"] = {"concurrency": w["concurrency"]}
        assert mine["requests"]["ok"] > 0 and bool(mine["failures"]) == failures, mine["requests"]
        assert mine["prompt_tokens"]["max_abs_deviation_pct"] == 0.0  # the server counted the form's length
        t = results_table([mine])
        assert {k: r[k] for k in LOAD_COLUMNS} == {c.header: str(next(iter(c.cells))) for c in t.columns}
        assert float(r["duration_s"]) == pytest.approx((w["end_ns"] - w["start_ns"]) / 1e9, abs=0.002)


@pytest.mark.slow
def test_local_runner_step_ramp_from_the_command_line(sim_faults, tmp_path):
    run = LocalRun(
        *("--host", sim_faults.base_url, "--autostart", "-s", "3"),
        *("--load-shape", "step-ramp", "--ramp-steps", ",".join(map(str, STEPS)), "--ramp-hold", str(HOLD_S)),
        *("--prompt-tokens", "300", "--output-tokens", "16", "--slo", "ttft<=40ms"),
        *("--records", str(tmp_path / "records.parquet"), "--steps-csv", str(tmp_path / "steps.csv")),
        web_ui=True,
    )
    run.start()
    # the runner's state is what /stats/requests shows (Locust's UI caches that JSON for a few seconds)
    wait_until(lambda: run.runner.state == "running", 10, "the ramp runs")
    run.wait_shape(timeout=30)  # the shape ends the test after its last step
    assert run.runner.state == "stopped"
    live = run.get("/servesweep/live.json").json
    assert live["shape"] == "StepRamp"
    assert run.shutdown() == 1  # Locust's rule when any request failed: no servesweep gate overrides it here

    records = read_parquet(tmp_path / "records.parquet")
    s = summarize(records, slos="ttft<=40ms")
    snap = live["live"]
    assert snap["requests"]["ok"] == s["requests"]["ok"] > 10
    assert snap["requests"]["failed"] == s["requests"]["failed"] > 0
    assert snap["errors"] == s["failures"] and set(s["failures"]) <= {
        "http_429",
        "http_5xx",
        "connection_reset",
        "no_done",
    }
    assert snap["output_tokens"] == s["output_tokens"] == 16 * s["requests"]["ok"]
    assert snap["goodput"]["requests"] == s["goodput"]["requests"]
    lat = latencies(records)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        for q in ("p50", "p90", "p99"):
            want = order_stat(lat[key], float(q[1:]) / 100)
            assert close(snap["latency"][key][q], want, Sketch.ALPHA * 1.0001), (key, q)
    steps = list(csv.DictReader((tmp_path / "steps.csv").open()))
    assert [int(r[LOAD_COLUMNS[0]]) for r in steps] == list(STEPS)
    check_steps(steps, live["steps"], records, failures=True)
