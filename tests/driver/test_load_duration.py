"""A duration point with warmup: streams still running when the time is up are finished and counted, never
dropped; warmup requests are kept in the file and left out of the summary."""

from __future__ import annotations

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"


def test_duration_point_finishes_running_streams(tmp_path):
    with start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=2"], ground_truth=tmp_path / "gt"
    ) as sim:
        p = LoadPoint(
            base_url=sim.base_url,
            model=MODEL,
            probe=False,  # only the point's own requests reach the emulator: its ground truth is exactly them
            concurrency=4,
            prompt_tokens=500,
            output_tokens=96,
            duration_s=1.5,
            warmup_s=0.5,
        )
        s = run_point(p, tmp_path / "p")
        gt = {d["id"]: d for d in sim.stop_and_read_ground_truth()}
    recs = read_parquet(tmp_path / "p" / "records.parquet").to_pylist()
    assert {r["request_id"] for r in recs} == set(gt), (
        "every request the server saw has a record, none dropped"
    )
    assert all(r["error_class"] is None and r["completion_tokens"] == 96 for r in recs)
    assert all(g["status"] == 200 and g["completion_tokens"] == 96 for g in gt.values())

    start = min(r["scheduled_ns"] for r in recs)
    limit = start + int(2.0e9)  # warmup + duration
    assert max(r["scheduled_ns"] for r in recs) < limit + int(0.5e9)
    finished_late = [r for r in recs if r["end_ns"] > limit]
    assert finished_late, "some streams were running at the time limit and still finished"
    assert all(r["end_ns"] - r["first_token_ns"] > 0 for r in finished_late)

    warm = [r for r in recs if r["warmup"]]
    assert warm and all(r["scheduled_ns"] < start + int(0.5e9) + int(0.3e9) for r in warm)
    assert s["requests"]["warmup"] == len(warm)
    assert s["requests"]["measured"] == len(recs) - len(warm) == s["requests"]["ok"]
    assert s["window_s"] >= 1.5 - 0.3
