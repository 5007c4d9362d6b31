"""GPU telemetry, energy and diagnosis in Prometheus and Grafana (issues 31, 32): the exporter's per-point GPU gauges
and verdicts, the capacity and frontier energy gauges, the backfill's, and the panels that query them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.observe.capacity_metrics import capacity_families, frontier_families
from servesweep.observe.dashboards import build_all, expressions, metric_names
from servesweep.observe.exporter import ClientMetrics
from servesweep.results.diagnosis import diagnose

pytestmark = pytest.mark.fast

GPU = {"energy_j": 900.0, "energy_above_idle_j": 300.0, "idle_w": 120.0, "power_avg_w": 180.0, "power_peak_w": 400.0,
       "util_mean_pct": 40.0, "joules_per_output_token": 0.9, "joules_per_token": 0.3, "output_tokens_per_joule": 1.11,
       "throttled": True, "throttle_reasons": ["hw_thermal_slowdown"], "power_capped_fraction_max": 0.25}  # fmt: skip


def _summary(**extra) -> dict:
    return {"output_tokens_per_s": 100.0, "requests": {"measured": 20, "failed": 0}, "itl_ms": {"p50": 10.0},
            "point": {"concurrency": 4, "labels": {"config_id": "c"}}, **extra}  # fmt: skip


def _samples(m: ClientMetrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in text_string_to_metric_families(m.text().decode()):
        for s in f.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_point_gpu_gauges_come_from_the_summarys_gpu_block():
    m = ClientMetrics("r")
    m.point_started("hot", {"model": "m", "config": "c"})
    m.point_finished("hot", _summary(gpu=GPU))
    m.point_started("none", {"model": "m", "config": "c"})
    m.point_finished("none", _summary())  # no sampler: no GPU gauge at all, never a 0
    s = _samples(m)
    val = {n: {x.labels["point_id"]: x.value for x in s[n]} for n in s if n.startswith("servesweep_point_gpu_")}
    assert val["servesweep_point_gpu_joules_per_output_token"] == {"hot": 0.9}
    assert val["servesweep_point_gpu_output_tokens_per_joule"] == {"hot": 1.11}
    assert val["servesweep_point_gpu_power_average_watts"] == {"hot": 180.0}
    assert val["servesweep_point_gpu_energy_above_idle_joules"] == {"hot": 300.0}
    assert val["servesweep_point_gpu_utilization_mean_ratio"] == {"hot": pytest.approx(0.4)}  # percent as a ratio
    assert val["servesweep_point_gpu_throttled"] == {"hot": 1.0}  # the flag as 1
    assert val["servesweep_point_gpu_power_capped_ratio"] == {"hot": 0.25}


def test_point_diagnosis_info_carries_the_verdict():
    m = ClientMetrics("r")
    ok = _summary()
    bad = _summary(slos=[{"slo": "ttft_p99<=1ms", "pass": False}], requests={"measured": 20, "failed": 10},
                   failures={"http_5xx": 10}, error_rate=0.5)  # fmt: skip
    for pid, s in (("ok", ok), ("bad", bad)):
        m.point_started(pid, {"model": "m", "config": "c"})
        m.point_finished(pid, s)
    info = {x.labels["point_id"]: x.labels for x in _samples(m)["servesweep_point_diagnosis_info"]}
    assert info["ok"]["cause"] == "no limit reached" and info["ok"]["breached"] == "false"
    assert info["bad"]["breached"] == "true"
    assert info["bad"]["cause"] == "server errors", info["bad"]
    assert info["bad"]["verdict"] == diagnose(bad, ok).line[:300]


def test_capacity_and_frontier_energy_gauges():
    row = {"search": "s", "config": "c", "tier": "fast", "capacity": 8, "bracket": [8, 9],
           "energy": {"output_tokens_per_joule": 2.5, "joules_per_output_token": 0.4, "power_avg_w": 650.0,
                      "capacity_per_kw": 12.3}}  # fmt: skip
    bare = {"search": "t", "config": "d", "tier": "fast", "capacity": 4, "bracket": [4, 5], "energy": None}
    fams = {f.name: f for f in capacity_families("r", [row, bare])}
    for name, want in [("servesweep_capacity_output_tokens_per_joule", 2.5),
                       ("servesweep_capacity_joules_per_output_token", 0.4),
                       ("servesweep_capacity_gpu_power_average_watts", 650.0),
                       ("servesweep_capacity_per_kilowatt", 12.3)]:  # fmt: skip
        assert [(s.labels["search"], s.value) for s in fams[name].samples] == [("s", want)], name
    pts = [{"search": "s", "config": "c", "load": 8, "tokens_per_s_per_gpu": 1.0, "user_tokens_per_s": 1.0,
            "pareto": True, "output_tokens_per_joule": 2.5, "energy_pareto": True},
           {"search": "t", "config": "d", "load": 4, "tokens_per_s_per_gpu": 1.0, "user_tokens_per_s": 1.0,
            "pareto": True, "output_tokens_per_joule": None, "energy_pareto": False}]  # fmt: skip
    fr = {f.name: f for f in frontier_families("r", pts)}
    # the probe without telemetry is neither on nor off the energy frontier
    assert [(s.labels["search"], s.value) for s in fr["servesweep_frontier_energy_pareto"].samples] == [("s", 1.0)]
    assert [s.value for s in fr["servesweep_frontier_output_tokens_per_joule"].samples] == [2.5]


def test_backfill_carries_the_gpu_gauges(tmp_path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    from servesweep.observe.promconfig import run_openmetrics

    run = tmp_path / "r-20260101T000000Z"
    (run / "p1").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": run.name, "points": {"p1": {
        "config_id": "c", "status": "done", "started": "2026-01-01T00:00:10+00:00",
        "finished": "2026-01-01T00:00:40+00:00"}}}))  # fmt: skip
    real = json.loads((Path(__file__).parents[1] / "results" / "summary_v0_point.json").read_text())
    real["point"]["labels"] = {"config_id": "c"}
    (run / "p1" / "summary.json").write_text(json.dumps({**real, "gpu": GPU, "point_id": "p1"}))
    fams = {f.name: f for f in parse_openmetrics(run_openmetrics(run))}
    assert {s.value for s in fams["servesweep_point_gpu_joules_per_output_token"].samples} == {0.9}


def _names(dash: dict) -> set[str]:
    return {m for e in expressions(dash) for m in metric_names(e["expr"])}


def test_dashboards_show_gpu_energy_and_the_diagnosis():
    d = build_all()
    live = _names(d["live.json"])
    for needed in ("servesweep_gpu_power_watts", "servesweep_gpu_power_limit_watts",
                   "servesweep_gpu_energy_joules_total", "servesweep_gpu_utilization_ratio",
                   "servesweep_gpu_sm_clock_hertz", "servesweep_gpu_throttled", "servesweep_gpu_power_capped"):  # fmt: skip
        assert needed in live, needed
    # live joules per output token: the energy counter's rate over the client's output token rate, per configuration
    (jpt,) = [e for e in expressions(d["live.json"]) if e["title"] == "GPU energy per output token"]
    assert "servesweep_gpu_energy_joules_total" in jpt["expr"] and "servesweep_completion_tokens_total" in jpt["expr"]
    ann = [a for a in d["live.json"]["annotations"]["list"] if "servesweep_point_diagnosis_info" in a.get("expr", "")]
    assert ann and 'breached="true"' in ann[0]["expr"] and ann[0]["textFormat"] == "{{verdict}}"
    matrix = _names(d["matrix.json"])
    for needed in ("servesweep_point_gpu_joules_per_output_token", "servesweep_point_gpu_output_tokens_per_joule",
                   "servesweep_point_gpu_power_average_watts", "servesweep_point_gpu_throttled",
                   "servesweep_capacity_output_tokens_per_joule", "servesweep_frontier_energy_pareto",
                   "servesweep_point_diagnosis_info"):  # fmt: skip
        assert needed in matrix, needed
    titles = {p["title"] for p in d["matrix.json"]["panels"]}
    assert {"GPU energy per point", "Why: each point's diagnosis",
            "Output tokens per joule vs concurrency ($config)"} <= titles  # fmt: skip
    assert "servesweep_point_gpu_joules_per_output_token" in _names(d["history.json"])
