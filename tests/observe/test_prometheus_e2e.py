"""End to end with real parts: the emulator (speculative decoding on, some injected 500s), real Locust points through
run_point, the exporter, a real Prometheus scraping both through file_sd, a real Pushgateway, and promtool backfill.

One module fixture builds the world once (about 30 s):
  1. an "old" run (1 point) is done while no Prometheus is watching; its clock is set 40 days back, so it is
     history, and it is imported with servesweep.observe.promconfig.backfill into a fresh Prometheus data dir;
  2. Prometheus starts on that data dir and scrapes (every second) the exporter, the emulator and the GPU sampler
     beside it (reading the emulator's NVML-shaped /sim/gpu; both runs' points get gpu.json through it);
  3. a live run (3 points) feeds the exporter with the records of each point, then its summary.
Then every query of every dashboard panel, annotation and variable runs against that Prometheus and must return
finite data; the History queries must show the old run next to the live one.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.config.point import LoadPoint
from servesweep.driver.ansible import ansible_dir
from servesweep.driver.point_run import run_point
from servesweep.observe.dashboards import build_all, expressions, metric_names
from servesweep.observe.exporter import ClientMetrics
from servesweep.observe.promconfig import (
    backfill,
    run_openmetrics,
    start_prometheus,
    start_pushgateway,
    write_prometheus_config,
    write_targets,
)
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

MODEL = "qwen3.6-35b-a3b"
CONFIG = "tp1-nextn"
OLD_RUN, LIVE_RUN = "e2e-old", "e2e-live"
DAY = 86400.0
REAL_SUMMARY = Path(__file__).parents[1] / "results" / "summary_v0_point.json"  # a real point's summary.json
SIM_ARGS = ["--model-path", MODEL, "--enable-metrics", "--enable-cache-report",
            "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--sim-fault-rate", "500=0.2", "--sim-seed", "7"]  # fmt: skip
# (concurrency, prompt tokens): shapes shared by both runs so A vs B can match them
OLD_POINTS = [(4, 200)]
LIVE_POINTS = [(1, 200), (4, 200), (4, 600)]


SAMPLER = ansible_dir() / "roles" / "sglang_server" / "files" / "gpu_sampler.py"


def _start_sampler(work: Path, sim) -> str:
    """The GPU sampler the role starts beside a server, on the emulator's /sim/gpu; it exits with the emulator."""
    r = subprocess.run(
        [sys.executable, str(SAMPLER), "--state", "started", "--workdir", str(work), "--interval", "0.25",
         "--sim-url", f"http://127.0.0.1:{sim.port}/sim/gpu", "--watch-pid", str(sim.proc.pid)],
        capture_output=True, text=True, timeout=60, env=os.environ.copy(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["url"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _point(base_url: str, c: int, p: int) -> LoadPoint:
    return LoadPoint(
        base_url=base_url,
        model=MODEL,
        concurrency=c,
        prompt_tokens=p,
        output_tokens=24,
        requests=2 * c + 2,
        point_id=f"c{c}-p{p}",
        labels={"config": CONFIG},
        # The emulator injects 500s at a rate; the template probe would hit them too, so give its result here.
        template_overhead=9,
        continuous_usage=True,
    )


# a capacity.json row (matrix/capacity_run.py), every value present so every capacity column has data
CAPACITY_ROW = {
    "search": "s01-chat-p200-o24", "config": CONFIG, "workload": "chat", "prompt_tokens": 200, "output_tokens": 24,
    "gpus": 1, "axis": "concurrency", "tier": "fast", "capacity": 4, "bracket": [4, 5], "stop": "resolution",
    "binding": "ttft_p99<=2s", "probes": 5,
    "at_capacity": {"output_tokens_per_s_per_gpu": 250.0, "request_rate_per_gpu": 2.0, "ttft_p99_ms": 80.0,
                    "itl_p99_ms": 9.0, "decode_tokens_per_s_p50": 110.0},
    "energy": {"output_tokens_per_joule": 2.5, "joules_per_output_token": 0.4, "power_avg_w": 650.0,
               "capacity_per_kw": 6.2},  # results/capacity.add_energy: the probe's GPU telemetry
}  # fmt: skip


# a packed run's isolation result (matrix/isolation_rerun.py), one configuration flagged
ISOLATION = {
    "threshold": 0.1,
    "configs": [
        {"config": CONFIG, "flagged": ["ttft_p50"],
         "changes": [{"metric": "ttft_p50", "change": 0.25}, {"metric": "output_tok_s", "change": -0.02}]},
    ],
}  # fmt: skip


# capacity.json's frontier (matrix/capacity_run.py): the search's probes, the Pareto ones marked
FRONTIER = [
    {"config": CONFIG, "load": 4, "tokens_per_s_per_gpu": 250.0, "user_tokens_per_s": 110.0,
     "search": "s01-chat-p200-o24", "pareto": True, "output_tokens_per_joule": 2.5, "energy_pareto": True},
    {"config": CONFIG, "load": 5, "tokens_per_s_per_gpu": 240.0, "user_tokens_per_s": 90.0,
     "search": "s01-chat-p200-o24", "pareto": False, "output_tokens_per_joule": 2.0, "energy_pareto": False},
]  # fmt: skip


def _axes(c: int, p: int) -> dict:
    return {"model": MODEL, "config": CONFIG, "tp": 1, "speculative_method": "NEXTN", "context_length": 262144,
            "prompt_tokens": p, "output_tokens": 24, "concurrency": c, "workload": "chat",
            "gpu_count": 1}  # fmt: skip


class World:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list = []  # LocalService handles
        self.sim = None
        self.metrics: ClientMetrics | None = None

    def prom(self, path: str, **params) -> dict:
        url = f"{self.prom_url}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def close(self):
        if self.metrics is not None:
            self.metrics.stop()
        for p in self.procs:
            p.stop()
        if self.sim is not None:
            self.sim.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom-e2e")
    w = World(tmp)
    try:
        _build(w)
        yield w
    finally:
        w.close()


def _build(w: World) -> None:
    tmp = w.tmp
    w.sim = start_sim(SIM_ARGS, log_path=tmp / "sim.log")
    base = w.sim.base_url
    w.sampler_url = _start_sampler(tmp / "sampler", w.sim)
    gpu = [w.sampler_url]
    time.sleep(1.0)  # idle samples before the first point: its baseline

    # 1. an old run nobody scraped, moved 40 days into the past, imported with promtool
    old_dir = tmp / "runs" / OLD_RUN
    for c, p in OLD_POINTS:
        run_point(_point(base, c, p), old_dir / f"c{c}-p{p}", slos="ttft<=10s", gpu_telemetry=gpu)
    for sp in old_dir.glob("*/summary.json"):
        s = json.loads(sp.read_text())
        s["started_unix"] -= 40 * DAY
        s["needle_accuracy"] = 1.0  # as a run's needle probes set it (matrix/answer_probes.py)
        s["point"]["labels"].update(
            {k: str(v) for k, v in _axes(s["point"]["concurrency"], s["point"]["prompt_tokens"]).items()}
        )
        sp.write_text(json.dumps(s))
    (old_dir / "manifest.json").write_text(json.dumps({"run_id": OLD_RUN}))
    w.old_openmetrics = run_openmetrics(old_dir)
    data = tmp / "prom-data"
    w.old_blocks = backfill(old_dir, data)

    # 2. exporter, Pushgateway and Prometheus (file_sd targets written before it starts)
    w.metrics = ClientMetrics(LIVE_RUN)
    exp_port = w.metrics.serve("127.0.0.1", 0)
    w.exporter_url = f"http://127.0.0.1:{exp_port}"
    pg_port, prom_port = _free_port(), _free_port()
    w.pushgateway_url = f"http://127.0.0.1:{pg_port}"
    pg = start_pushgateway(tmp / "pushgateway", port=pg_port)
    w.procs.append(pg)
    sd = tmp / "targets"
    write_targets(sd, LIVE_RUN, exporters=[f"127.0.0.1:{exp_port}"],
                  servers=[{"target": f"127.0.0.1:{w.sim.port}", "config": CONFIG},
                           {"target": w.sampler_url.split("//", 1)[1], "config": CONFIG}])  # fmt: skip
    cfg = write_prometheus_config(tmp / "prometheus.yml", sd_dir=sd, scrape_interval="1s",
                                  pushgateway=f"127.0.0.1:{pg_port}")  # fmt: skip
    check = subprocess.run(
        ["promtool", "check", "config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr
    prom = start_prometheus(cfg, data, port=prom_port)
    w.procs.append(prom)
    w.prom_url = prom.url
    _wait_targets_up(w)

    # 3. the live run: each point's records feed the exporter as the point ends, then its summary
    w.live_start = time.time()
    live_dir = tmp / "runs" / LIVE_RUN
    for c, p in LIVE_POINTS:
        pid = f"c{c}-p{p}"
        w.metrics.point_started(pid, _axes(c, p))
        w.metrics.set_users(c)
        time.sleep(1.2)  # a scrape sees the point start (counters at 0) before the records land
        summary = run_point(_point(base, c, p), live_dir / pid, slos="ttft<=10s", gpu_telemetry=gpu)
        # what `servesweep run` adds from its configuration's needle probes (matrix/answer_probes.py)
        summary["needle_accuracy"] = 1.0
        w.metrics.observe_many(read_parquet(live_dir / pid / "records.parquet").to_pylist())
        time.sleep(1.2)
        w.metrics.point_finished(pid, summary)
        w.metrics.set_users(0)
    w.metrics.set_capacity([CAPACITY_ROW], FRONTIER)  # what a run with a search: block exposes
    w.metrics.set_isolation(ISOLATION)  # what a packed run exposes after its isolation sample
    time.sleep(2.5)  # two more scrapes: the last summaries and the final counters are in
    w.live_end = time.time()


def _wait_targets_up(w: World, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        active = w.prom("/api/v1/targets")["activeTargets"]
        up = {t["labels"]["job"] for t in active if t["health"] == "up"}
        if {"servesweep", "sglang", "pushgateway"} <= up:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"targets not up: {[(t['scrapeUrl'], t['health'], t['lastError']) for t in active]}"
            )
        time.sleep(0.3)


def _subst(expr: str, dash: str, w: World, step: int) -> str:
    if dash == "history.json":
        values = {"run_id": ".*", "run_a": OLD_RUN, "run_b": LIVE_RUN, "__range": "60d"}
    else:
        values = {"run_id": LIVE_RUN, "__range": "1h"}
    values.update({"model": ".*", "config": ".*", "__rate_interval": "10s", "__interval": f"{step}s"})
    for k in sorted(values, key=len, reverse=True):
        expr = expr.replace("$" + k, values[k])
    assert "$" not in expr, expr
    return expr


def _finite(result: list[dict]) -> bool:
    for r in result:
        vals = r.get("values") or ([r["value"]] if "value" in r else [])
        if any(math.isfinite(float(v)) for _t, v in vals):
            return True
    return False


def _run(w: World, dash: str, e: dict) -> list[dict]:
    """Run one dashboard expression the way Grafana would (variables substituted), return its series."""
    if e["kind"] == "variable":
        # label_values(selector, label): the values Grafana would offer
        inner = e["expr"][len("label_values(") : -1]
        sel, _, label = inner.rpartition(",")
        sel = _subst(sel.strip(), dash, w, 60)
        series = w.prom(
            "/api/v1/series", **{"match[]": sel, "start": time.time() - 60 * DAY, "end": time.time()}
        )
        return [{"value": [0, "1"]} for s in series if s.get(label.strip())]
    if dash == "history.json" and not e["instant"]:
        step = 3600
        q = _subst(e["expr"], dash, w, step)
        return w.prom(
            "/api/v1/query_range", query=q, start=time.time() - 45 * DAY, end=time.time(), step=step
        )["result"]
    if e["instant"]:
        return w.prom("/api/v1/query", query=_subst(e["expr"], dash, w, 1), time=time.time())["result"]
    q = _subst(e["expr"], dash, w, 1)
    return w.prom("/api/v1/query_range", query=q, start=w.live_start - 5, end=w.live_end, step=1)["result"]


CASES = [(name, i) for name, d in build_all().items() for i in range(len(expressions(d)))]


@pytest.mark.parametrize("dash,index", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_every_dashboard_query_returns_data(world, dash, index):
    e = expressions(build_all()[dash])[index]
    result = _run(world, dash, e)
    assert _finite(result), f"{dash} / {e['kind']} {e['title']!r}: no data for {e['expr']}"


def test_frontier_panel_marks_the_pareto_points(world):
    """The frontier panel's queries return the points and, as a series of its own, the Pareto probe (load 4) but
    not the dominated one (load 5)."""
    exprs = [e for e in expressions(build_all()["matrix.json"]) if e["title"].startswith("Frontier")]
    assert len(exprs) == 2  # y, x
    for e in exprs:
        series = [r["metric"] for r in _run(world, "matrix.json", e)]
        pareto = [m for m in series if m.get("config") == "Pareto frontier"]
        assert [m["load"] for m in pareto] == ["4"], series
        assert any(m.get("point_id") for m in series), series  # the points themselves


def test_every_dashboard_metric_is_exposed_and_sglang_names_are_sglangs(world):
    def names(url: str) -> set[str]:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        return {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    exposed_sim = names(world.sim.base_url)
    exposed_exp = names(world.exporter_url) | names(world.sampler_url)  # servesweep_gpu_*: the GPU sampler's
    for dash, d in build_all().items():
        for e in expressions(d):
            for m in metric_names(e["expr"]):
                where = exposed_sim if m.startswith("sglang:") else exposed_exp
                assert m in where, (
                    f"{dash} / {e['title']}: {m} is not in the {'emulator' if m.startswith('sglang:') else 'exporter'} /metrics"
                )


def test_backfilled_old_run_shows_up_in_history(world):
    assert world.old_blocks, "promtool created no block"
    now = time.time()
    # the Runs table lists both runs; the old one at its own (old) start time
    q = "min by (run_id) (last_over_time(servesweep_point_start_timestamp_seconds[60d]))"
    starts = {
        r["metric"]["run_id"]: float(r["value"][1])
        for r in world.prom("/api/v1/query", query=q, time=now)["result"]
    }
    assert set(starts) == {OLD_RUN, LIVE_RUN}
    assert now - 41 * DAY < starts[OLD_RUN] < now - 39 * DAY
    assert abs(starts[LIVE_RUN] - world.live_start) < 120
    # A vs B: every shape of the old run is matched in the live run, with a finite ratio
    hist = build_all()["history.json"]
    ratio = next(
        e for e in expressions(hist) if e["title"] == "A vs B by point shape" and "clamp_min" in e["expr"]
    )
    res = _run(world, "history.json", ratio)
    shapes = {(r["metric"]["concurrency"], r["metric"]["prompt_tokens"]) for r in res}
    assert shapes == {(str(c), str(p)) for c, p in OLD_POINTS}
    assert all(0 < float(r["value"][1]) < 100 for r in res)
    # old values are the summaries' own (exact percentiles), not re-derived
    s = json.loads((world.tmp / "runs" / OLD_RUN / "c4-p200" / "summary.json").read_text())
    q = f'last_over_time(servesweep_point_ttft_seconds{{run_id="{OLD_RUN}", point_id="c4-p200", stat="p99"}}[60d])'
    (v,) = world.prom("/api/v1/query", query=q, time=now)["result"]
    assert math.isclose(float(v["value"][1]), s["ttft_ms"]["p99"] / 1e3, rel_tol=1e-9)


def test_live_client_counts_match_the_records(world):
    """What Prometheus scraped from the exporter equals the records: successes and failures by class."""
    live = world.tmp / "runs" / LIVE_RUN
    want: dict[str, int] = {}
    for c, p in LIVE_POINTS:
        for row in read_parquet(live / f"c{c}-p{p}" / "records.parquet").to_pylist():
            if not row["warmup"]:
                k = row["error_class"] or "none"
                want[k] = want.get(k, 0) + 1
    assert want.get("http_5xx", 0) > 0, "the emulator injected no 500: the errors panel would be empty"
    q = f'sum by (error_class) (servesweep_requests_total{{run_id="{LIVE_RUN}", job="servesweep"}})'
    got = {
        r["metric"]["error_class"]: int(float(r["value"][1]))
        for r in world.prom("/api/v1/query", query=q, time=time.time())["result"]
    }
    assert got == want
    # and the server saw the same number of finished streams as the client counted successes (+ old run's)
    assert world.prom("/api/v1/query", query="sglang:num_requests_total", time=time.time())["result"]


def test_pushgateway_push_is_scraped(world):
    """A headless CI run that ends before a scrape pushes its metrics; Prometheus scrapes them from the gateway."""
    ci = ClientMetrics("e2e-ci")
    ci.point_started("c2-p100", {"model": MODEL, "config": CONFIG, "concurrency": 2})
    ci.point_finished("c2-p100", {"output_tokens_per_s": 123.5, "requests": {"measured": 4, "failed": 0}})
    ci.push(world.pushgateway_url, job="servesweep-ci")
    text = urllib.request.urlopen(world.pushgateway_url + "/metrics", timeout=10).read().decode()
    assert (
        'servesweep_point_output_tokens_per_second{config="tp1-nextn",instance="",job="servesweep-ci"' in text
    )
    deadline = time.monotonic() + 10
    q = 'servesweep_point_output_tokens_per_second{run_id="e2e-ci"}'
    while True:
        res = world.prom("/api/v1/query", query=q, time=time.time())["result"]
        if res:
            break
        assert time.monotonic() < deadline, "Prometheus did not scrape the pushed metrics"
        time.sleep(0.3)
    (r,) = res
    assert r["metric"]["job"] == "servesweep-ci"  # honor_labels kept the pushed job
    assert float(r["value"][1]) == 123.5


@pytest.mark.fast
def test_backfill_reads_orchestrator_run_folders(tmp_path):
    """A `servesweep run` folder: axes come from the manifest's configuration flags and labels and the point's
    LoadPoint; the summary's own result fields (e.g. its output_tokens total) never become labels."""
    run = tmp_path / "quick-20260101T000000Z"
    (run / "c2-p256").mkdir(parents=True)
    manifest = {
        "run_id": run.name,
        "configs": {"cfg1-mtp": {"flags": {"tp_size": 2, "speculative_algorithm": "NEXTN", "context_length": 32768,
                                           "enable_metrics": True}, "labels": {"bundle": "mtp"}}},
        "points": {"c2-p256": {"config_id": "cfg1-mtp", "workload": "chat", "concurrency": 2, "prompt_tokens": 256,
                               "output_tokens": 32, "status": "done", "started": "2026-01-01T00:00:10+00:00",
                               "finished": "2026-01-01T00:00:40+00:00"}},
    }  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    # a real point's summary.json (tests/results/summary_v0_point.json), its point and figures set for this run
    summary = {**json.loads(REAL_SUMMARY.read_text()), "point_id": "c2-p256", "output_tokens": 256.0,
               "output_tokens_per_s": 99.5, "started_unix": 1767225610.0, "wall_s": 30.0,
               "point": {"model": "qwen", "concurrency": 2, "prompt_tokens": 256, "output_tokens": 32,
                         "endpoint": "chat", "labels": {"config_id": "cfg1-mtp", "run_id": run.name, "bundle": "mtp"}},
               "ttft_ms": {"p50": 10.0, "p90": 20.0, "p95": 25.0, "p99": 30.0, "mean": 12.0, "min": 5.0, "max": 31.0,
                           "n": 40}}  # fmt: skip
    (run / "c2-p256" / "summary.json").write_text(json.dumps(summary))
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    fams = {f.name: f for f in parse_openmetrics(run_openmetrics(run))}  # strict OpenMetrics: seconds, # EOF
    (info,) = fams["servesweep_point_info"].samples[:1]
    assert info.labels == {"run_id": run.name, "point_id": "c2-p256", "model": "qwen", "config": "cfg1-mtp",
                           "tp": "2", "speculative_method": "NEXTN", "context_length": "32768", "prompt_tokens": "256",
                           "output_tokens": "32", "concurrency": "2", "workload": "chat", "bundle": "mtp",
                           "gpu_count": "2"}  # fmt: skip  (tp_size 2 in the manifest: results/pergpu.py)
    tput = fams["servesweep_point_output_tokens_per_second_per_gpu"].samples
    assert [s.value for s in tput] and all(s.value == pytest.approx(99.5 / 2) for s in tput)
    # the summary's start and wall time (the manifest's ISO times say the same) bound the samples
    times = [float(s.timestamp) for s in fams["servesweep_point_info"].samples]
    assert min(times) == 1767225610.0 and max(times) == 1767225640.0
    ttft = {s.labels["stat"]: s.value for s in fams["servesweep_point_ttft_seconds"].samples}
    assert ttft == {"p50": 0.01, "p90": 0.02, "p99": 0.03, "mean": 0.012}


@pytest.mark.fast
def test_promconfig_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"servers\[1\]: target must be host:port"):
        write_targets(tmp_path, "r1", servers=["127.0.0.1:30000", "http://10.0.0.1:30000"])
    with pytest.raises(ValueError, match=r"servers\[0\]: label name 'bad-label'"):
        write_targets(tmp_path, "r1", servers=[{"target": "h:1", "bad-label": "x"}])
    with pytest.raises(ValueError, match="pushgateway must be host:port"):
        write_prometheus_config(tmp_path / "p.yml", sd_dir=tmp_path, pushgateway="http://h:9091")
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(ValueError, match="holds no finished point"):
        run_openmetrics(tmp_path / "empty-run")
    (tmp_path / "bad-run" / "p1").mkdir(parents=True)
    (tmp_path / "bad-run" / "p1" / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"p1/summary.json: not valid JSON"):
        run_openmetrics(tmp_path / "bad-run")


def test_exporter_entry_point_pushes_a_finished_run(world):
    """`python exporters/exporter.py push runs/<run_id>`: a run folder's summaries reach Prometheus via the gateway."""
    import sys

    root = Path(__file__).resolve().parents[2]
    run_dir = world.tmp / "runs" / LIVE_RUN
    r = subprocess.run(
        [sys.executable, str(root / "exporters" / "exporter.py"), "push", str(run_dir),
         "--gateway", world.pushgateway_url, "--job", "servesweep-cli"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"pushed run {LIVE_RUN}: {len(LIVE_POINTS)} point(s)" in r.stdout
    q = f'servesweep_point_ttft_seconds{{job="servesweep-cli", run_id="{LIVE_RUN}", stat="p99"}}'
    deadline = time.monotonic() + 10
    while len(res := world.prom("/api/v1/query", query=q, time=time.time())["result"]) < len(LIVE_POINTS):
        assert time.monotonic() < deadline, f"pushed summaries not scraped: {res}"
        time.sleep(0.3)
    for row in res:
        s = json.loads((run_dir / row["metric"]["point_id"] / "summary.json").read_text())
        assert math.isclose(float(row["value"][1]), s["ttft_ms"]["p99"] / 1e3, rel_tol=1e-9)


@pytest.mark.fast
def test_a_server_metrics_path_other_than_metrics_becomes_prometheus_reserved_label(tmp_path):
    write_targets(
        tmp_path,
        "r1",
        servers=[{"target": "h:1", "config": "c1", "metrics_path": "/v2/metrics"}, {"target": "h:2"}],
    )
    groups = json.loads((tmp_path / "sglang-r1.json").read_text())
    assert groups[0]["labels"] == {"run_id": "r1", "config": "c1", "__metrics_path__": "/v2/metrics"}
    assert groups[1]["labels"] == {"run_id": "r1"}
    with pytest.raises(ValueError, match=r"servers\[0\]: metrics_path 'metrics' must start with '/'"):
        write_targets(tmp_path, "r1", servers=[{"target": "h:1", "metrics_path": "metrics"}])
