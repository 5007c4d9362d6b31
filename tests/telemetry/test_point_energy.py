"""Energy per point, end to end: the emulator, the GPU sampler beside it and run_point with gpu_telemetry write each
point's gpu.json: joules per output token at two concurrencies within what the power model says, the idle baseline
subtracted and shown, the counter and the integrated power agreeing, and a throttle fault flagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from servesweep.config.point import LoadPoint
from servesweep.driver.ansible import ansible_dir
from servesweep.driver.point_run import run_point
from servesweep.results.energy import summary_fields, throttle_flag
from servesweep.sim.launch import start_sim
from servesweep.sim.power import power_profile

SAMPLER = ansible_dir() / "roles" / "sglang_server" / "files" / "gpu_sampler.py"
MODEL = "Qwen/Qwen3.6-27B"


def start_sampler(work, sim) -> dict:
    r = subprocess.run(
        [
            sys.executable,
            str(SAMPLER),
            "--state",
            "started",
            "--workdir",
            str(work),
            "--interval",
            "0.25",
            "--sim-url",
            f"http://127.0.0.1:{sim.port}/sim/gpu",
            "--watch-pid",
            str(sim.proc.pid),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def point(sim, concurrency: int) -> LoadPoint:
    return LoadPoint(
        base_url=sim.base_url,
        model=MODEL,
        probe=False,
        concurrency=concurrency,
        prompt_tokens=1000,
        output_tokens=128,
        duration_s=3.0,
    )


def test_joules_per_token_at_two_concurrencies_and_a_throttled_point(tmp_path):
    h200 = power_profile("H200")
    with start_sim(["--model-path", MODEL, "--tp-size", "2"]) as sim:
        url = start_sampler(tmp_path / "sampler", sim)["url"]
        time.sleep(1.0)  # idle samples before the first point: its baseline
        res = {}
        for c in (1, 16):
            out = tmp_path / f"c{c}"
            s = run_point(point(sim, c), out, gpu_telemetry=[url])
            res[c] = (s, json.loads((out / "gpu.json").read_text()))
            assert (out / "gpu_samples.jsonl").stat().st_size > 0
        body = json.dumps({"throttle": "thermal"}).encode()
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{sim.port}/sim/gpu", data=body), timeout=5
        )
        st, hot = run_point(point(sim, 4), tmp_path / "hot", gpu_telemetry=[url]), None
        hot = json.loads((tmp_path / "hot" / "gpu.json").read_text())
    for s, g in res.values():
        t = g["total"]
        assert g["errors"] == [] and t["gpus"] == 2 and t["energy_sources"] == ["counter"]
        assert t["idle_w"] == pytest.approx(2 * h200.idle_w, rel=0.02), (
            "the baseline: idle power before the point"
        )
        assert t["energy_above_idle_j"] == pytest.approx(t["energy_j"] - t["idle_energy_j"])
        assert 2 * h200.idle_w < t["power_avg_w"] <= 2 * h200.tdp_w
        # what the model says: the GPUs' average power over the output rate, within the two bounds
        tps = s["output_tokens_per_s"]
        assert t["joules_per_output_token"] == pytest.approx(t["power_avg_w"] / tps, rel=0.01)
        assert 2 * h200.idle_w / tps < t["joules_per_output_token"] < 2 * h200.tdp_w / tps
        assert t["joules_per_token"] < t["joules_per_output_token"] / 5  # 1000 prompt tokens per 128 output
        # NVML's power reading (and the stand-in's) is a ~1 s trailing average: its integral misses about half a
        # second of the ramp at the window's start (the H200 showed the same, 3,762 J against the counter's 4,056 J
        # over 6 s); over a 3 s point that is ~10%, over a field point of minutes ~1% (tests/sim/test_power.py)
        assert -15 < t["counter_vs_integrated_pct_max"] < 2, "the integral lags the counter, never leads it"
        # the power model caps only the windows a compute-bound prefill fills (the H200 served at 280-440 W, its
        # prefill bursts at the cap: BENCHMARKS.md); power-capped is not throttled
        assert not t["throttled"] and throttle_flag(g) is None and 0 <= t["power_capped_fraction_max"] <= 1
        assert (
            s["gpu"] == summary_fields(g)
            and s["gpu"]["joules_per_output_token"] == t["joules_per_output_token"]
        )
    busy_decode_w = h200.idle_w + 0.5 * (h200.load_w - h200.idle_w)  # memory-bound decode: 0.30 of the range
    assert res[1][1]["total"]["power_avg_w"] < 2 * busy_decode_w, "one user's decode draws far below the cap"
    j1, j16 = (res[c][1]["total"]["joules_per_output_token"] for c in (1, 16))
    assert j16 < j1 / 3, f"batching shares the power: {j1:.2f} J/token at 1, {j16:.2f} at 16"
    assert res[16][1]["total"]["util_max_pct"] >= 90
    assert hot["total"]["throttled"] and hot["total"]["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert "GPU throttled (" in throttle_flag(hot) and "hw_thermal_slowdown" in throttle_flag(hot)
    assert throttle_flag(st["gpu"]) == throttle_flag(hot), "summary.json's gpu figures flag it too"
    assert all(g["temp_max_c"] == 90 and g["sm_clock_min_mhz"] < 1980 * 0.7 for g in hot["gpus"])
    assert st["requests"]["ok"] > 0
    report_gate_and_compare_the_points(tmp_path)


def report_gate_and_compare_the_points(tmp_path):
    """The three points above as one `servesweep load` run folder: the report shows the throttled point's badge
    (and, where results/report.py has ENERGY_COLUMNS, per-point energy columns and the tokens-per-joule plot), the
    gate judges an energy SLO on each point's gpu.json, and compare gives energy changes with intervals."""
    from servesweep.config.slo import parse_slos
    from servesweep.results import report
    from servesweep.results.compare import compare_runs, load_run
    from servesweep.results.gates import evaluate_run

    run = tmp_path
    pts = [
        {"point_id": n, "dir": n, "concurrency": c, "rate_rps": None}
        for n, c in (("c1", 1), ("c16", 16), ("hot", 4))
    ]
    manifest = {
        "run_id": "energy",
        "kind": "load",
        "base_url": "http://127.0.0.1:1",
        "points": pts,
        "argv": ["load"],
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    html, md = report.write_report(run)
    text = md.read_text()
    hot_row = next(line for line in text.splitlines() if line.startswith("| ") and "| 4 |" in line)
    assert "GPU throttled: GPU throttled (hw_thermal_slowdown)" in hot_row, hot_row
    assert "GPU throttled" not in next(
        line for line in text.splitlines() if line.startswith("| ") and "| 16 |" in line
    )
    if hasattr(report, "ENERGY_COLUMNS"):  # /tmp/issue31-patches/report-energy.patch
        assert "| GPU J/out tok | out tok/J | GPU J/tok | GPU avg W |" in text
        assert "output tokens per joule vs concurrency" in html.read_text()
    c1 = json.loads((run / "c1" / "gpu.json").read_text())["total"]["joules_per_output_token"]
    v = evaluate_run(load_run(run), parse_slos(f"joules_per_output_token<={c1 * 0.99}"))
    by_point = {r.point: r for r in v.results if r.kind == "slo"}
    assert by_point["c1"].passed is False and f"{c1:.4g} J/tok" in by_point["c1"].message
    assert by_point["c16"].passed is True, "16 users share the power: fewer joules per token"
    rc = compare_runs(load_run(run), load_run(run), resamples=200)
    ch = {c.metric.name: c for c in rc.points[0].changes}
    assert {"joules_per_output_token", "output_tokens_per_joule", "power_avg_w"} <= set(ch)
    j = ch["joules_per_output_token"]
    assert j.a == pytest.approx(j.b) and j.ci[0] <= 0 <= j.ci[1] and j.verdict != "worse"
