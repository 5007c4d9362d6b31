"""The generated Grafana dashboards: committed JSON equals the code's output, every metric they name is one the
exporter emits or one of SGLang's own (reference sglang.md §5), ratios are guarded, and the JSON is well formed.
Every query is also run against a real Prometheus in test_prometheus_e2e.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servesweep.observe.dashboards import build_all, check, expressions, metric_names, render
from servesweep.observe.exporter import ClientMetrics
from servesweep.results.degeneration import degeneration_summary
from servesweep.results.records import to_table
from servesweep.results.summary import summarize

ROOT = Path(__file__).resolve().parents[2]
DASH_DIR = ROOT / "grafana" / "dashboards"

# SGLang 0.5.23's metric families (reference sglang.md §5), written out here, not taken from the emulator's code.
SGLANG_NAMES = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:num_grammar_queue_reqs": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:spec_accept_length": "gauge",
    "sglang:spec_accept_rate": "gauge",
    "sglang:max_total_num_tokens": "gauge",
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
    "sglang:num_requests": "counter",
    "sglang:cached_tokens": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
    "sglang:queue_time_seconds": "histogram",
    # set at every log interval by SGLang 0.5.23's SchedulerMetricsCollector.log_stats (tests/sim/test_metric_families.py)
    "sglang:utilization": "gauge",
    "sglang:fwd_occupancy": "gauge",
    "sglang:num_retracted_reqs": "gauge",
    "sglang:num_paused_reqs": "gauge",
    "sglang:new_token_ratio": "gauge",
    "sglang:mamba_usage": "gauge",
    "sglang:full_token_usage": "gauge",
}
_SUFFIX = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def family_of(name: str, families: dict[str, str]) -> str | None:
    """The family a sample name belongs to, given {family: type}; None if it is no sample of any of them."""
    for fam, typ in families.items():
        for suf in _SUFFIX[typ]:
            if name == fam + suf:
                return fam
    return None


# a capacity.json row as matrix/capacity_run.py writes it (every value present, so every capacity column has data)
CAPACITY_ROW = {
    "search": "s01-chat-p64-o8", "config": "c", "workload": "chat", "prompt_tokens": 64, "output_tokens": 8,
    "gpus": 2, "axis": "concurrency", "tier": "fast", "capacity": 7, "bracket": [7, 8], "stop": "resolution",
    "binding": "decode_tokens_per_s_p50>=100", "probes": 5,
    "at_capacity": {"output_tokens_per_s": 500.0, "output_tokens_per_s_per_gpu": 250.0, "request_rate": 4.0,
                    "request_rate_per_gpu": 2.0, "ttft_p99_ms": 80.0, "itl_p99_ms": 9.0,
                    "decode_tokens_per_s_p50": 110.0, "requests": 40},
    # results/capacity.add_energy: the probe's GPU telemetry at capacity
    "energy": {"output_tokens_per_joule": 2.5, "joules_per_output_token": 0.4, "power_avg_w": 650.0,
               "capacity_per_kw": 10.8, "throttled": False},
}  # fmt: skip


# a packed run's isolation result as matrix/isolation_rerun.py keeps it in the manifest
ISOLATION = {
    "threshold": 0.1,
    "configs": [
        {"config": "c", "flagged": ["ttft_p50"],
         "changes": [{"metric": "ttft_p50", "change": 0.25}, {"metric": "output_tok_s", "change": -0.02}]},
    ],
}  # fmt: skip


# capacity.json's frontier (matrix/capacity_run.py): every probe, the Pareto ones marked
FRONTIER = [
    {"config": "c", "load": 7, "tokens_per_s_per_gpu": 250.0, "user_tokens_per_s": 110.0, "search": "s01-chat-p64-o8",
     "pareto": True, "output_tokens_per_joule": 2.5, "energy_pareto": True},
    {"config": "c", "load": 8, "tokens_per_s_per_gpu": 240.0, "user_tokens_per_s": 90.0, "search": "s01-chat-p64-o8",
     "pareto": False, "output_tokens_per_joule": 2.0, "energy_pareto": False},
]  # fmt: skip

# summary.json's gpu (results/energy.summary_fields), as run_point writes it where a GPU sampler measured
GPU_SUMMARY = {"energy_j": 900.0, "energy_above_idle_j": 300.0, "idle_w": 120.0, "power_avg_w": 180.0,
               "power_peak_w": 400.0, "util_mean_pct": 40.0, "util_max_pct": 99.0, "joules_per_output_token": 0.9,
               "joules_per_token": 0.3, "joules_per_output_token_above_idle": 0.3, "output_tokens_per_joule": 1.11,
               "throttled": False, "throttle_reasons": [], "throttled_gpus": [], "power_capped_fraction_max": 0.0,
               "energy_sources": ["counter"], "errors": []}  # fmt: skip


def sampler_families() -> dict[str, str]:
    """Families the GPU sampler's /metrics exposes (its own exposition code, fed one sample of one GPU)."""
    import importlib.util

    from prometheus_client.parser import text_string_to_metric_families

    from servesweep.driver.ansible import ansible_dir

    spec = importlib.util.spec_from_file_location(
        "gpu_sampler", ansible_dir() / "roles/sglang_server/files/gpu_sampler.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "util_pct": 50, "mem_util_pct": 20, "mem_used_bytes": 1,
           "mem_total_bytes": 2, "sm_clock_mhz": 1500, "mem_clock_mhz": 3200, "power_w": 300.0, "power_limit_w": 700,
           "temp_c": 50, "throttle_reasons": 0x20, "energy_mj": 5e6, "energy_source": "counter"}  # fmt: skip
    text = mod.exposition({"t": 1.0, "gpus": [gpu]}, 1, "nvml")
    return {f.name: f.type for f in text_string_to_metric_families(text) if f.samples}


def exporter_families() -> dict[str, str]:
    """Families a fed ClientMetrics exposes, by type (as the real exposition says)."""
    from prometheus_client.parser import text_string_to_metric_families

    ms = 1_000_000
    rec = {"request_id": "r", "point_id": "p1", "worker": "h:1", "user": 0, "warmup": False,
           "scheduled_ns": 0, "sent_ns": ms, "first_token_ns": 50 * ms, "chunk_ns": [50 * ms, 60 * ms, 75 * ms],
           "chunk_tokens": [1, 1, 2], "end_ns": 80 * ms, "prompt_tokens": 100, "completion_tokens": 4,
           "cached_tokens": 0, "target_prompt_tokens": 100, "target_output_tokens": 4, "http_status": 200,
           "mono_to_wall_ns": 0}  # fmt: skip
    failed = {**rec, "request_id": "f", "error_class": "http_5xx", "first_token_ns": None, "chunk_ns": None}
    m = ClientMetrics("r")
    m.point_started("p1", {"model": "m", "config": "c", "gpu_count": 2})  # per-GPU gauges need the count
    m.observe_many([rec, failed])
    table = to_table([{**rec, "response_text": "falcon-4812"}, failed])
    summary = summarize(table, slos="ttft<=1s", answers=degeneration_summary(table))
    # the orchestrator adds the probes' accuracy; run_point the GPU sampler's figures; a tight SLO breaks (diagnosis)
    summary = {**summary, "needle_accuracy": 1.0, "gpu": GPU_SUMMARY}
    summary["slos"] = [{"slo": "ttft_p99<=1ms", "pass": False}]
    m.point_finished("p1", summary)
    m.set_capacity([CAPACITY_ROW], FRONTIER)
    m.set_isolation(ISOLATION)
    # only families with samples count: a name with no series would leave its panel empty
    return {f.name: f.type for f in text_string_to_metric_families(m.text().decode()) if f.samples}


def test_committed_json_equals_generated():
    assert check(DASH_DIR) == [], "run: python -m servesweep.observe.dashboards"
    # and the CLI's --check agrees
    r = subprocess.run(
        [sys.executable, "-m", "servesweep.observe.dashboards", "--check", "--out", str(DASH_DIR)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.fast
def test_check_detects_a_stale_file(tmp_path):
    for name, d in build_all().items():
        (tmp_path / name).write_text(render(d))
    assert check(tmp_path) == []
    d = json.loads((tmp_path / "live.json").read_text())
    d["panels"][1]["targets"][0]["expr"] = "up"
    (tmp_path / "live.json").write_text(json.dumps(d, indent=2) + "\n")
    assert check(tmp_path) == [str(tmp_path / "live.json")]


@pytest.mark.fast
def test_every_named_metric_exists():
    ours = exporter_families() | sampler_families()
    for name, d in build_all().items():
        for e in expressions(d):
            for metric in metric_names(e["expr"]):
                if metric.startswith("sglang:"):
                    assert family_of(metric, SGLANG_NAMES), f"{name} / {e['title']}: {metric} is not SGLang's"
                else:
                    assert family_of(metric, ours), f"{name} / {e['title']}: the exporter has no {metric}"


@pytest.mark.fast
def test_dashboards_cover_what_users_watch():
    d = build_all()
    live = {m for e in expressions(d["live.json"]) for m in metric_names(e["expr"])}
    for needed in [
        "servesweep_ttft_seconds_bucket",
        "servesweep_itl_seconds_bucket",
        "servesweep_tpot_seconds_bucket",
        "servesweep_completion_tokens_total",
        "servesweep_requests_total",
        "servesweep_users_active",
        "servesweep_target_requests_per_second",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
        "sglang:utilization",
        "sglang:num_retracted_reqs",
        "sglang:mamba_usage",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
    ]:
        assert needed in live, needed
    assert any(a.get("expr") for a in d["live.json"]["annotations"]["list"]), "no point-boundary annotations"
    for name, dash in d.items():
        names = {v["name"] for v in dash["templating"]["list"]}
        assert {"datasource", "model", "config"} <= names, name
        assert "run_id" in names, name
    matrix = {m for e in expressions(d["matrix.json"]) for m in metric_names(e["expr"])}
    assert "servesweep_isolation_change_ratio" in matrix, "no isolation panel for packed runs"
    hist_vars = {v["name"] for v in d["history.json"]["templating"]["list"]}
    assert {"run_a", "run_b"} <= hist_vars


_DIV = re.compile(r"\s/\s")


@pytest.mark.fast
def test_every_ratio_is_guarded():
    """Division by a rate that is 0 when idle gives NaN/Inf: every denominator is clamp_min(...) or filtered > 0."""
    for name, d in build_all().items():
        for e in expressions(d):
            for m in _DIV.finditer(e["expr"]):
                rhs = e["expr"][m.end() :]
                assert rhs.startswith("clamp_min(") or re.match(r"\(.*>\s*0\)", rhs), (
                    f"{name} / {e['title']}: unguarded division in {e['expr']}"
                )


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(build_all()))
def test_json_is_well_formed(name):
    d = json.loads((DASH_DIR / name).read_text())
    assert d["id"] is None and d["uid"].startswith("servesweep-")
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    for v in d["templating"]["list"]:
        if (
            v["type"] == "query"
        ):  # the string form Grafana parses itself: label_values(metric{filters}, label)
            assert re.fullmatch(r"label_values\(servesweep_point_info(\{[^}]*\})?, [a-z_]+\)", v["query"]), v
            assert v["definition"] == v["query"]
    # no overlapping panels
    cells = set()
    for p in d["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))


@pytest.mark.fast
def test_provisioning_points_at_the_generated_dashboards():
    prov = (ROOT / "grafana/provisioning/dashboards/servesweep.yaml").read_text()
    compose = (ROOT / "exporters/docker-compose.yml").read_text()
    m = re.search(r"path:\s*(\S+)", prov)
    assert m and f"../grafana/dashboards:{m.group(1)}" in compose
    ds = (ROOT / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    assert "type: prometheus" in ds


def test_compose_and_prometheus_template_are_valid():
    from ruamel.yaml import YAML

    r = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "exporters/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    compose = YAML(typ="safe").load((ROOT / "exporters/docker-compose.yml").read_text())
    assert set(compose["services"]) == {"prometheus", "pushgateway", "grafana"}
    for svc in compose["services"].values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):  # bind mounts must point at files in the repository
                assert (ROOT / "exporters" / src).exists(), vol
    flags = " ".join(compose["services"]["prometheus"]["command"])
    assert "--storage.tsdb.retention.time" in flags  # history needs a long retention
