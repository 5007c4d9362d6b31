"""Client-side Prometheus metrics of a run: what the load generator saw, per run and per matrix point.

One `ClientMetrics` per run, on its own `CollectorRegistry` (never the global one, so a process can hold several
runs and the emulator's `sglang:*` metrics never mix in). It is a single custom collector: the request path only
bumps plain numbers and numpy bucket arrays, and the Prometheus families are built at scrape time.

    m = ClientMetrics(run_id)
    m.point_started(point_id, {"model": ..., "config": ..., "concurrency": 8, ...})
    m.observe(record)            # one finished request (a records.py row as a dict); cheap, once per request
    m.set_users(n); m.set_target_rate(r)
    m.point_finished(point_id, summary)   # the point's summary.json dict: kept as gauges for the run's life
    m.serve(host="127.0.0.1", port=9464)  # or m.push(gateway_url, job) for a headless run that ends first

Metric names follow Prometheus conventions (prefix `servesweep_`, seconds, `_total` counters). Labels are
`run_id`, `point_id` and the point's `model` and `config` (server configuration); every other axis of a point is a
label of `servesweep_point_info` only, joined with `on (run_id, point_id) group_left (...)`.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from servesweep.observe.capacity_metrics import capacity_families, frontier_families
from servesweep.results import metrics
from servesweep.results.capacity import load_capacity
from servesweep.results.degraded import degradation
from servesweep.results.pergpu import LABEL as GPU_LABEL
from servesweep.results.pergpu import point_gpus
from servesweep.results.runfolder import SUMMARY, PointInfo, iso_unix, load_run

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

PREFIX = "servesweep_"

# 1 ms ... 10 min, roughly 1-2-3-5 per decade plus the steps where LLM latencies cluster (ITL 5-50 ms, TTFT 0.1-5 s).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 450.0, 600.0,
)  # fmt: skip

# name -> help; all in seconds, all on LATENCY_BUCKETS.
HISTOGRAMS: dict[str, str] = {
    "ttft_seconds": "Time to first token: first token-bearing chunk minus send time, per successful request.",
    "itl_seconds": "Inter-token latency per chunk: every gap between token-bearing chunks of a successful request "
    "(summary itl_ms; vLLM bench serve's ITL).",
    "itl_per_token_seconds": "Inter-token latency per token: each gap between token-bearing chunks divided by the "
    "later chunk's tokens, counted once per token (summary itl_per_token_ms; sglang:inter_token_latency_seconds).",
    "tpot_seconds": "Time per output token: (last chunk - first chunk) / (completion tokens - tokens of the first chunk), per successful request.",
    "e2e_seconds": "End-to-end latency: end of stream minus send time, per successful request.",
    "schedule_lag_seconds": "Schedule lag: send time minus scheduled time, per request.",
}

# The axes a point's info metric carries (matrix axes); `model` and `config` also label every per-point metric.
AXES: tuple[str, ...] = (
    "model",
    "config",
    "tp",
    "speculative_method",
    "context_length",
    "prompt_tokens",
    "output_tokens",
    "concurrency",
    "workload",
)
POINT_LABELS: tuple[str, ...] = ("run_id", "point_id", "model", "config")

# Summary gauges, from the point's summary dict (servesweep.results.summary.summarize; docs/metrics.md defines each).
# Latencies: metric name -> (help, summary keys in order of preference; blocks of p50/p90/p99/mean in ms).
LATENCY_STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")
SUMMARY_LATENCIES: dict[str, str] = {
    "ttft": "time to first token",
    "itl": "inter-token latency per chunk (gap between token-bearing chunks)",
    "itl_per_token": "inter-token latency per token (each chunk gap divided by its tokens)",
    "tpot": "time per output token",
    "e2e": "end-to-end latency",
}
_LATENCY_KEYS: dict[str, tuple[str, ...]] = {
    "ttft": ("ttft_ms",),
    "itl": ("itl_ms",),
    "itl_per_token": ("itl_per_token_ms",),
    "tpot": ("tpot_ms",),
    "e2e": ("e2e_ms",),
}
SUMMARY_SCALARS: dict[str, tuple[tuple[str, ...], str]] = {
    # metric suffix -> (path into the summary dict, help)
    "output_tokens_per_second": (
        ("output_tokens_per_s",),
        "Aggregate output tokens per second over the window.",
    ),
    "request_rate_per_second": (
        ("request_rate",),
        "Successful requests per second over the measurement window.",
    ),
    "goodput_requests_per_second": (
        ("goodput", "per_s"),
        "Requests per second that met every per-request SLO.",
    ),
    "goodput_ratio": (("goodput", "ratio"), "Share of measured requests that met every per-request SLO."),
    "requests": (("requests", "measured"), "Measured requests of the point (warmup excluded)."),
    "failed_requests": (("requests", "failed"), "Failed measured requests of the point."),
    "error_ratio": (("error_rate",), "Failed / measured requests of the point."),
    "cache_hit_ratio": (("cache_hit_ratio",), "Cached / prompt tokens reported by the server."),
    "degenerate_ratio": (
        ("degenerate_rate",),
        "Share of the point's judged responses whose text is degenerate.",
    ),
    "needle_accuracy_ratio": (
        ("needle_accuracy",),
        "Needle probes of the point's configuration answered right, at the point's prompt length.",
    ),
    "window_seconds": (("window_s",), "Length of the measurement window."),
    # a point measured at a lower load than asked (a Locust worker lost: results/degraded.py); its figures are
    # those of the load it held, its reason is servesweep_point_degraded_info's
    "degraded": (
        ("degraded",),
        "1 when the point ran at a lower load than asked (a Locust worker lost): its figures describe the load it "
        "held, not its label; 0 when it ran as asked.",
    ),
    "concurrency_held": (
        ("in_flight", "mean"),
        "Mean requests in flight over the point's measured requests (closed loop: the concurrency it held; below "
        "the point's concurrency axis when degraded, and in its last round).",
    ),
    "lost_requests": (
        ("workers", "lost_requests"),
        "Requests a lost Locust worker sent whose records never reached the master (a degraded point).",
    ),
    "decode_tokens_per_second_p50": (
        ("decode_tokens_per_s", "p50"),
        "Per-request output speed (decode tok/s, the interactivity axis), median over the point's requests.",
    ),
    # the GPUs of the point's server over its window, where a GPU sampler measured (summary.json's `gpu`,
    # results/energy.summary_fields; docs/gpu-telemetry.md defines each)
    "gpu_energy_joules": (
        ("gpu", "energy_j"),
        "Energy the point's GPUs drew over its window, idle included (J).",
    ),
    "gpu_energy_above_idle_joules": (
        ("gpu", "energy_above_idle_j"),
        "Energy over the window less the GPUs' idle baseline times its length (J).",
    ),
    "gpu_joules_per_output_token": (
        ("gpu", "joules_per_output_token"),
        "GPU energy per measured output token, idle included (J).",
    ),
    "gpu_joules_per_token": (("gpu", "joules_per_token"), "GPU energy per token, prompt + output (J)."),
    "gpu_output_tokens_per_joule": (("gpu", "output_tokens_per_joule"), "Measured output tokens per joule."),
    "gpu_power_average_watts": (
        ("gpu", "power_avg_w"),
        "The GPUs' average power over the window (W), summed.",
    ),
    "gpu_power_peak_watts": (
        ("gpu", "power_peak_w"),
        "The GPUs' peak power samples added (W): an upper bound.",
    ),
    "gpu_idle_watts": (("gpu", "idle_w"), "The GPUs' idle baseline before the point (W), summed."),
    "gpu_utilization_mean_ratio": (
        ("gpu", "util_mean_pct"),
        "GPU busy fraction, mean over samples and GPUs.",
    ),
    "gpu_throttled": (
        ("gpu", "throttled"),
        "1 when a GPU throttled (thermal, HW slowdown, power brake), else 0.",
    ),
    "gpu_power_capped_ratio": (
        ("gpu", "power_capped_fraction_max"),
        "Share of samples the power cap held the clocks, the most of any GPU.",
    ),
}
# SUMMARY_SCALARS whose summary value is in another unit than the metric's (a percent as a ratio, a flag as 0/1)
_SCALES: dict[str, float] = {"gpu_utilization_mean_ratio": 0.01}
_FLAGS: frozenset[str] = frozenset({"gpu_throttled", "degraded"})
# Per-GPU gauges: metric suffix -> (the SUMMARY_SCALARS total, help); the total over the point's `gpu_count` axis
# (its server's GPUs: tp × dp × pp or launcher.gpus, results/pergpu.py), absent when the count is unknown.
PER_GPU_SCALARS: dict[str, tuple[str, str]] = {
    "output_tokens_per_second_per_gpu": (
        "output_tokens_per_second",
        "Aggregate output tokens per second over the window, per GPU of the point's server (gpu_count).",
    ),
    "request_rate_per_second_per_gpu": (
        "request_rate_per_second",
        "Successful requests per second over the measurement window, per GPU of the point's server (gpu_count).",
    ),
}

DIAGNOSIS_TEXT_MAX = 300  # a verdict label's length: the first cause's evidence and the others' names fit

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_BOUNDS = np.asarray(LATENCY_BUCKETS, dtype=np.float64)
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]


class _Hist:
    """Bucket counts of one histogram series. Bucket i counts values <= bound i (non-cumulative; +Inf last)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64)
        self.sum = 0.0

    def one(self, v: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, v)] += 1
        self.sum += v

    def many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        if values.size == 0:
            return
        idx = np.searchsorted(_BOUNDS, values, side="left")
        n = len(self.counts)
        if weights is None:
            self.counts += np.bincount(idx, minlength=n)
            self.sum += float(values.sum())
        else:
            self.counts += np.bincount(idx, weights=weights, minlength=n).astype(np.int64)
            self.sum += float((values * weights).sum())


@dataclass
class _Point:
    labels: tuple[str, ...]  # values of POINT_LABELS
    info: dict[str, str]
    started: float
    finished: float | None = None
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (outcome, error_class) -> n
    warmup_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    hists: dict[str, _Hist] = field(default_factory=lambda: {k: _Hist() for k in HISTOGRAMS})
    summary: dict[str, float] = field(default_factory=dict)  # metric name + stat -> value
    failures_by_class: dict[str, float] = field(default_factory=dict)
    diagnosis: dict[str, str] | None = (
        None  # cause, verdict, breached: results/diagnosis.py at the point's end
    )
    degraded: str | None = (
        None  # why the point is degraded and the load it held (results/degraded.py), or None
    )


def _num(record: Mapping, key: str) -> float | None:
    v = record.get(key)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


class ClientMetrics(Collector):
    """Client metrics of one run. Thread-safe: the Locust master's greenlets and the scrape thread share it."""

    def __init__(self, run_id: str, *, registry: CollectorRegistry | None = None) -> None:
        if not run_id or not isinstance(run_id, str):
            raise ValueError(f"ClientMetrics: run_id must be a non-empty string, got {run_id!r}")
        self.run_id = run_id
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._points: dict[str, _Point] = {}
        self._current: str | None = None
        self._users: float = 0.0
        self._users_fn: Callable[[], float] | None = None
        self._target_rate: float = 0.0
        self._capacity: list[dict] = []  # capacity.json rows of a run with a search: block
        self._frontier: list[dict] = []  # ... and its frontier: every probe, the Pareto points marked
        self._isolation: dict[str, Any] = {}  # a packed run's isolation sample (manifest `isolation`)
        self._baselines: dict[
            tuple, dict
        ] = {}  # each configuration's lowest-load summary: what diagnosis compares
        self._server: WSGIServer | None = None
        self.reads = 0  # how many times the metrics were read (scrapes, pushes): see wait_read
        self.registry.register(self)

    # -- the API the load generator and orchestrator call --

    def point_started(self, point_id: str, axes: Mapping[str, object] | None = None) -> None:
        """A point begins: its info metric appears, and records without a known point_id go to it."""
        if not point_id or not isinstance(point_id, str):
            raise ValueError(f"point_started: point_id must be a non-empty string, got {point_id!r}")
        info = {}
        for k, v in (axes or {}).items():
            if not isinstance(k, str) or not _LABEL_NAME.match(k) or k in ("run_id", "point_id", "le"):
                raise ValueError(
                    f"point_started({point_id!r}): axis name {k!r} is not a usable Prometheus label name "
                    "(letters, digits, _; not run_id/point_id/le)"
                )
            info[k] = "" if v is None else str(v)
        for k in AXES:
            info.setdefault(k, "")
        labels = (self.run_id, point_id, info["model"], info["config"])
        with self._lock:
            old = self._points.get(point_id)
            if old is not None and old.labels == labels:
                old.info, old.finished = info, None  # a resumed point keeps its counters
            else:
                self._points[point_id] = _Point(labels=labels, info=info, started=time.time())
            self._current = point_id

    def observe(self, record: Mapping) -> None:
        """One finished request (a records.py row as a mapping). Called once per request, never per chunk."""
        pid = record.get("point_id") or self._current
        p = self._points.get(pid) if pid else None
        if p is None:
            raise ValueError(
                f"observe: record for point {pid!r} but no point_started({pid!r}) was called "
                f"(known points: {sorted(self._points)})"
            )
        err = record.get("error_class") or ""
        sent = _num(record, "sent_ns")
        sched = _num(record, "scheduled_ns")
        first = _num(record, "first_token_ns")
        end = _num(record, "end_ns")
        with self._lock:
            if record.get("warmup"):
                p.warmup_requests += 1
                return
            key = ("failure", str(err)) if err else ("success", "none")
            p.requests[key] = p.requests.get(key, 0) + 1
            p.prompt_tokens += int(_num(record, "prompt_tokens") or 0)
            p.completion_tokens += int(_num(record, "completion_tokens") or 0)
            p.cached_tokens += int(_num(record, "cached_tokens") or 0)
            h = p.hists
            if sent is not None and sched is not None:
                h["schedule_lag_seconds"].one(max(0.0, metrics.schedule_lag(sent, sched, metrics.NS_PER_S)))
            if err or sent is None:
                return
            if first is not None:
                h["ttft_seconds"].one(metrics.ttft(first, sent, metrics.NS_PER_S))
            if end is not None:
                h["e2e_seconds"].one(metrics.e2e(end, sent, metrics.NS_PER_S))
            # one answer's tokens: with n > 1 the lead choice's, whose chunks chunk_ns holds (results/metrics.py)
            ntok = metrics.record_lead_tokens(record)
            chunks = record.get("chunk_ns")
            if chunks is None or len(chunks) < 2:
                return
            # The definitions of servesweep.results.metrics (docs/metrics.md), so live and final figures agree.
            toks = record.get("chunk_tokens")
            gaps = metrics.itl_gaps(chunks, metrics.NS_PER_S)
            h["itl_seconds"].many(gaps)
            values, counts = metrics.itl_per_token(gaps, chunks, toks, ntok)
            h["itl_per_token_seconds"].many(
                values, counts if metrics.has_chunk_tokens(chunks, toks) else None
            )
            tpot = metrics.tpot(chunks, toks, ntok, metrics.NS_PER_S)
            if not math.isnan(tpot):
                h["tpot_seconds"].one(tpot)

    def observe_many(self, records: Iterable[Mapping]) -> None:
        for r in records:
            self.observe(r)

    def set_users(self, n: float | Callable[[], float]) -> None:
        """Active users now, or a function read at scrape time (e.g. `lambda: runner.user_count`)."""
        if callable(n):
            self._users_fn = n
        else:
            self._users_fn, self._users = None, float(n)

    def set_target_rate(self, requests_per_second: float) -> None:
        """Target request rate of an open-loop point (0 for closed loops)."""
        self._target_rate = float(requests_per_second)

    def point_finished(self, point_id: str, summary: Mapping | None = None) -> None:
        """A point ends: its summary becomes gauges, exposed for the rest of the run."""
        with self._lock:
            p = self._points.get(point_id)
            if p is None:
                raise ValueError(f"point_finished: unknown point {point_id!r}; call point_started first")
            p.finished = time.time()
            if summary:
                p.summary, p.failures_by_class = summary_values(summary)
                p.summary |= per_gpu_values(p.summary, p.info.get(GPU_LABEL))
                p.diagnosis = self._diagnose(summary)
                deg = degradation({"point_id": point_id, **summary})
                p.degraded = None if deg is None else deg.text[:DIAGNOSIS_TEXT_MAX]
            if self._current == point_id:
                self._current = None

    def _diagnose(self, summary: Mapping) -> dict[str, str] | None:
        """The point's verdict as `servesweep_point_diagnosis_info` labels, against the lowest-load point of its
        configuration seen so far (as the table judges it against the run's; results/diagnosis.diagnose_all)."""
        from servesweep.results import diagnosis as dg

        s = dict(summary)
        try:
            key = dg.config_key(s)
            self._baselines = dg.baselines([*self._baselines.values(), s])
            d = dg.diagnose(s, self._baselines.get(key))
        except Exception as e:  # a summary of another shape must not lose the point's other gauges
            return {
                "cause": "diagnosis failed",
                "verdict": f"{type(e).__name__}: {e}"[:300],
                "breached": "false",
            }
        return {
            "cause": d.first or d.status,
            "verdict": d.line[:DIAGNOSIS_TEXT_MAX],
            "breached": "true" if dg.breached(s) else "false",
        }

    def set_capacity(self, rows: Iterable[Mapping], frontier: Iterable[Mapping] = ()) -> None:
        """The run's capacity-at-SLO rows (capacity.json's `rows`), exposed as servesweep_capacity* gauges, and its
        frontier (capacity.json's `frontier`, the Pareto points marked) as servesweep_frontier* gauges."""
        with self._lock:
            self._capacity = [dict(r) for r in rows]
            self._frontier = [dict(p) for p in frontier]

    def set_isolation(self, iso: Mapping[str, Any]) -> None:
        """A packed run's isolation result (matrix/isolation_rerun.py, the manifest's `isolation`), exposed as
        servesweep_isolation_change_ratio{config, metric, flagged}."""
        with self._lock:
            self._isolation = dict(iso)

    def load_run(self, run_dir) -> int:
        """Expose a finished run folder's point summaries (for a run nobody scraped: serve or push them)."""
        run_id, points = finished_points(run_dir)
        if run_id != self.run_id:
            raise ValueError(
                f"load_run: {run_dir} is run {run_id!r}, these metrics are for run {self.run_id!r}"
            )
        for pt in points:
            self.point_started(pt["point_id"], pt["axes"])
            self.point_finished(pt["point_id"], pt["summary"])
            with self._lock:
                self._points[pt["point_id"]].started = pt["start"]
                self._points[pt["point_id"]].finished = pt["end"]
        cap = load_capacity(run_dir)  # a run with a search: block
        if cap is not None:
            self.set_capacity(cap.get("rows") or [], cap.get("frontier") or [])
        return len(points)

    def has_point(self, point_id: str) -> bool:
        return point_id in self._points

    # -- exposition --

    def serve(self, host: str = "127.0.0.1", port: int = 9464) -> int:
        """Serve /metrics over HTTP in a background thread; returns the bound port (port 0: a free one)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_address[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def push(self, gateway_url: str, job: str = "servesweep", timeout: float = 10.0) -> None:
        """Push everything to a Pushgateway, grouped by job and run_id (replaces that group)."""
        from prometheus_client import push_to_gateway

        push_to_gateway(
            gateway_url,
            job=job,
            registry=self.registry,
            grouping_key={"run_id": self.run_id},
            timeout=timeout,
        )

    def text(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4), as /metrics serves it."""
        return generate_latest(self.registry)

    def wait_read(self, after: int, timeout: float, poll: float = 0.1) -> bool:
        """Wait until the metrics were read more than `after` times (a scrape since the caller took `reads`), at
        most `timeout` s; True if they were. A process about to exit calls it so the gauges it set last reach the
        Prometheus that scrapes it (a short headless run ends before its next scrape otherwise)."""
        deadline = time.monotonic() + timeout
        while self.reads <= after:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)  # under Locust's monkey-patching, a gevent sleep: the HTTP server keeps serving
        return True

    def collect(self):  # called by the registry at scrape time
        self.reads += 1
        with self._lock:
            points = list(self._points.values())
            users = self._users_fn() if self._users_fn else self._users
            rate = self._target_rate
            yield from _families(self.run_id, points, float(users), rate)
            yield from capacity_families(self.run_id, self._capacity)
            yield from frontier_families(self.run_id, self._frontier)
            if self._isolation:
                yield isolation_family(self.run_id, self._isolation)

    def describe(self):
        return []


def isolation_family(run_id: str, iso: Mapping[str, Any]) -> GaugeMetricFamily:
    """Per configuration and metric (TTFT p50, output tok/s), the change from the point run alone to the same point
    run packed, as a fraction; `flagged` says it is above the isolation threshold (results/isolation_analysis.py)."""
    g = GaugeMetricFamily(
        "servesweep_isolation_change_ratio",
        "Change of a metric from the point run alone to the same point run packed (fraction)",
        labels=["run_id", "config", "metric", "flagged"],
    )
    for row in iso.get("configs") or []:
        for c in row.get("changes") or []:
            if c.get("change") is not None:
                flagged = "true" if c["metric"] in (row.get("flagged") or []) else "false"
                g.add_metric([run_id, row["config"], c["metric"], flagged], float(c["change"]))
    return g


def _path(d: Mapping, path: tuple[str, ...]) -> Any:
    v: Any = d
    for k in path:
        if not isinstance(v, Mapping):
            return None
        v = v.get(k)
    return v


def _finite(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def summary_values(summary: Mapping) -> tuple[dict[str, float], dict[str, float]]:
    """Flatten a point summary into {"ttft/p99": seconds, "output_tokens_per_second": x, ...} and
    {error_class: failures}. Values the summary lacks (or holds as null) are left out, never invented."""
    out: dict[str, float] = {}
    for name, keys in _LATENCY_KEYS.items():
        block = next((summary[k] for k in keys if isinstance(summary.get(k), Mapping)), None)
        if not block:
            continue
        for stat in LATENCY_STATS:
            v = _finite(block.get(stat))
            if v is not None:
                out[f"{name}/{stat}"] = v / 1e3
    for metric, (path, _help) in SUMMARY_SCALARS.items():
        raw = _path(summary, path)
        if metric == "degraded":  # a summary that does not say so ran as asked (before issue 35: unknown)
            raw = bool(raw)
        v = float(raw) if metric in _FLAGS and isinstance(raw, bool) else _finite(raw)
        if v is not None:
            out[metric] = v * _SCALES.get(metric, 1.0)
    fails = summary.get("failures")
    failures = (
        {str(k): float(v) for k, v in fails.items() if _finite(v) is not None}
        if isinstance(fails, Mapping)
        else {}
    )
    return out, failures


def per_gpu_values(values: Mapping[str, float], gpu_count: str | None) -> dict[str, float]:
    """PER_GPU_SCALARS from a point's flattened summary and its `gpu_count` axis ({} when the count is unknown)."""
    try:
        n = int(gpu_count or 0)
    except ValueError:
        return {}
    if n < 1:
        return {}
    return {k: values[total] / n for k, (total, _h) in PER_GPU_SCALARS.items() if total in values}


def _families(run_id: str, points: list[_Point], users: float, rate: float):
    g = GaugeMetricFamily(PREFIX + "users_active", "Locust users running now.", labels=["run_id"])
    g.add_metric([run_id], users)
    yield g
    g = GaugeMetricFamily(
        PREFIX + "target_requests_per_second",
        "Target request rate of an open-loop point (0: closed loop).",
        labels=["run_id"],
    )
    g.add_metric([run_id], rate)
    yield g
    fams = _PointFamilies(list(AXES) + sorted({k for p in points for k in p.info} - set(AXES)))
    for p in points:
        fams.add(run_id, p)
    yield from fams.all()


class _PointFamilies:
    """The per-point families of one scrape: the point's info and times, its request and token counters, its
    histograms, and its summary gauges once it finished."""

    def __init__(self, axis_names: list[str]) -> None:
        labels = list(POINT_LABELS)
        self.axis_names = axis_names
        self.info = GaugeMetricFamily(
            PREFIX + "point_info",
            "One series per matrix point with its axes as labels (value 1); join on (run_id, point_id).",
            labels=["run_id", "point_id", *axis_names],
        )
        self.running = GaugeMetricFamily(
            PREFIX + "point_running", "1 while the point is being measured, 0 after.", labels=labels
        )
        self.start = GaugeMetricFamily(
            PREFIX + "point_start_timestamp_seconds", "Unix time the point started.", labels=labels
        )
        self.end = GaugeMetricFamily(
            PREFIX + "point_end_timestamp_seconds", "Unix time the point finished.", labels=labels
        )
        self.requests = CounterMetricFamily(
            PREFIX + "requests",
            "Measured requests by outcome (success|failure) and error class (none for successes).",
            labels=[*labels, "outcome", "error_class"],
        )
        self.warmup = CounterMetricFamily(
            PREFIX + "warmup_requests", "Requests scheduled during warmup (not measured).", labels=labels
        )
        self.tokens = {
            k: CounterMetricFamily(PREFIX + f"{k}_tokens", f"{k.capitalize()} tokens of measured requests, "
                                   "from the server's usage.", labels=labels)
            for k in ("prompt", "completion", "cached")
        }  # fmt: skip
        self.hists = {k: HistogramMetricFamily(PREFIX + k, h, labels=labels) for k, h in HISTOGRAMS.items()}
        self.latencies = {
            k: GaugeMetricFamily(
                PREFIX + f"point_{k}_seconds",
                f"Point summary: {h} in seconds (exact, from raw records), by stat p50|p90|p99|mean.",
                labels=[*labels, "stat"],
            )
            for k, h in SUMMARY_LATENCIES.items()
        }
        self.scalars = {
            k: GaugeMetricFamily(PREFIX + f"point_{k}", f"Point summary: {h}", labels=labels)
            for k, (_key, h) in (SUMMARY_SCALARS | PER_GPU_SCALARS).items()
        }
        self.diagnosis = GaugeMetricFamily(
            PREFIX + "point_diagnosis_info",
            "Point summary: why the point missed its SLO (results/diagnosis.py): the first cause (or no limit "
            "reached, no clear cause, not enough samples), the verdict with its evidence, and whether the point "
            "broke an SLO or was flagged (value 1).",
            labels=[*labels, "cause", "verdict", "breached"],
        )
        self.degraded = GaugeMetricFamily(
            PREFIX + "point_degraded_info",
            "Point summary: why a degraded point's load was not the asked one, and the load it held "
            "(results/degraded.py; value 1, degraded points only).",
            labels=[*labels, "reason"],
        )
        self.failures = GaugeMetricFamily(
            PREFIX + "point_failures",
            "Point summary: failed requests by error class.",
            labels=[*labels, "error_class"],
        )

    def add(self, run_id: str, p: _Point) -> None:
        lv = list(p.labels)
        self.info.add_metric([run_id, p.labels[1], *(p.info.get(a, "") for a in self.axis_names)], 1.0)
        self.running.add_metric(lv, 0.0 if p.finished else 1.0)
        self.start.add_metric(lv, p.started)
        if p.finished:
            self.end.add_metric(lv, p.finished)
        for (outcome, err), n in sorted(p.requests.items()):
            self.requests.add_metric([*lv, outcome, err], float(n))
        self.warmup.add_metric(lv, float(p.warmup_requests))
        self.tokens["prompt"].add_metric(lv, float(p.prompt_tokens))
        self.tokens["completion"].add_metric(lv, float(p.completion_tokens))
        self.tokens["cached"].add_metric(lv, float(p.cached_tokens))
        for k, fam in self.hists.items():
            hh = p.hists[k]
            cum = np.cumsum(hh.counts)
            fam.add_metric(lv, list(zip(_LE, (float(c) for c in cum), strict=True)), hh.sum)
        for key, v in p.summary.items():
            if "/" in key:
                name, stat = key.split("/")
                self.latencies[name].add_metric([*lv, stat], v)
            else:
                self.scalars[key].add_metric(lv, v)
        if p.diagnosis is not None:
            d = p.diagnosis
            self.diagnosis.add_metric([*lv, d["cause"], d["verdict"], d["breached"]], 1.0)
        if p.degraded is not None:
            self.degraded.add_metric([*lv, p.degraded], 1.0)
        for err, failed in sorted(p.failures_by_class.items()):
            self.failures.add_metric([*lv, err], failed)

    def all(self) -> list:
        """Every family, in exposition order."""
        return [
            self.info,
            self.running,
            self.start,
            self.end,
            self.requests,
            self.warmup,
            *self.tokens.values(),
            *self.hists.values(),
            *self.latencies.values(),
            *self.scalars.values(),
            self.failures,
            self.diagnosis,
            self.degraded,
        ]


# ---------------------------------------------------------------- Locust


# Names other parts use for the matrix axes -> the info metric's label.
AXIS_ALIASES: dict[str, str] = {
    "tp_size": "tp",
    "tensor_parallel_size": "tp",
    "speculative_algorithm": "speculative_method",
    "speculative_algo": "speculative_method",
    "context_len": "context_length",
    "config_id": "config",
    "served_model_name": "model",
    "users": "concurrency",
    "endpoint": "workload",
}


def normalize_axes(*sources: Mapping | None, extras: Mapping | None = None) -> dict[str, str]:
    """Merge axis sources (later wins) into info-metric labels: from `sources` only the matrix axes (AXES, after
    AXIS_ALIASES), from `extras` (e.g. a server configuration's varying labels) every scalar with a usable name.

        m.point_started(pid, normalize_axes(config["flags"], point_fields, {"config": cid},
                                            extras=config["labels"]))
    """
    out: dict[str, str] = {}

    def put(d: Mapping | None, any_name: bool) -> None:
        for k, v in (d or {}).items():
            if v is None or isinstance(v, bool) or not isinstance(v, str | int | float):
                continue
            k = AXIS_ALIASES.get(str(k), str(k))
            if k in ("run_id", "point_id", "le") or not _LABEL_NAME.match(k):
                continue
            if k in AXES or any_name:
                out[k] = str(v)

    put(extras, True)
    for src in sources:
        put(src, False)
    return out


def loadpoint_axes(point) -> dict[str, str]:
    """Axes of a servesweep LoadPoint: its labels (the orchestrator's axes: config_id, tp_size, bundle...) and its
    own fields (model, concurrency, prompt and output tokens, endpoint as workload)."""
    if point is None:
        return {}
    fields = {
        k: getattr(point, k, None)
        for k in ("model", "concurrency", "prompt_tokens", "output_tokens", "endpoint")
    }
    return normalize_axes(fields, extras=getattr(point, "labels", None) or {})


# ---------------------------------------------------------------- finished run folders


def _point_axes(p: PointInfo, configs: Mapping) -> dict[str, str]:
    """Lowest to highest precedence: the server configuration's flags and labels (manifest), the manifest's point
    entry, the LoadPoint's labels, then the LoadPoint's own fields (what was measured). Top-level summary keys are
    results, never axes."""
    cid = p.entry.get("config_id")
    cfg = (configs.get(cid) or {}) if cid is not None else {}
    point = (p.summary or {}).get("point") or {}
    return normalize_axes(
        cfg.get("flags"),
        p.entry,
        {"config": cid} if cid is not None else None,
        point,
        extras={**(cfg.get("labels") or {}), **(point.get("labels") or {})},
    )


def _point_times(p: PointInfo) -> tuple[float, float]:
    """(start, end) in Unix seconds: the summary's `started_unix` + `wall_s` (what run_point writes), else the
    manifest entry's ISO `started` / `finished`, else the summary's modification time less the window."""
    s = p.summary or {}
    start = s.get("started_unix")
    end = start + s["wall_s"] if start is not None and s.get("wall_s") is not None else None
    if start is None:
        start, end = iso_unix(p.entry.get("started")), iso_unix(p.entry.get("finished"))
    if end is None:
        assert p.dir is not None  # a done point (Run.done_points) has its folder
        end = (p.dir / SUMMARY).stat().st_mtime
    if start is None:
        start = end - float(s.get("window_s") or 0)
    return min(start, end), end


def _records_point(p: PointInfo) -> tuple[str, PointInfo]:
    """A bare records file's point (`locust ... --headless --records r.parquet`) as a finished point: its summary
    computed from the records (as `report` computes its table), its times from the requests' own wall clock, and the
    run id `<file stem>-<UTC start>` (two runs both written to r.parquet stay two runs in History)."""
    from servesweep.results.records import read_parquet
    from servesweep.results.summary import summarize

    assert p.records_path is not None  # a records-kind run's one point names its file
    table = read_parquet(p.records_path)
    if table.num_rows == 0:
        raise ValueError(f"{p.records_path}: the records file holds no request")
    offset = table.column("mono_to_wall_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    sent = table.column("sent_ns").to_numpy(zero_copy_only=False).astype(np.int64) + offset
    ended = table.column("end_ns").to_numpy(zero_copy_only=False).astype(np.int64) + offset
    start, end = float(sent.min()) / 1e9, float(ended.max()) / 1e9
    summary = {**summarize(table), **(p.summary or {}), "started_unix": start, "wall_s": end - start}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start))
    return f"{p.records_path.stem}-{stamp}", replace(p, summary=summary)


def finished_points(run_dir: str | Path) -> tuple[str, list[dict]]:
    """(run_id, [{"point_id", "axes", "summary", "start", "end"}]) of a run folder's done points
    (servesweep.results.runfolder.load_run: run and point folders, and a bare records file, whose summary is
    computed from its records); ValueError naming what cannot be read."""
    run = load_run(run_dir)
    if run.kind == "records":
        run.run_id, point = _records_point(run.points[0])
        run.points = [point]
    out = []
    for p in run.done_points():
        start, end = _point_times(p)
        axes = _point_axes(p, run.configs)
        gpus = point_gpus(
            p.summary, p.config_id, run.manifest
        )  # runs planned before points carried the label
        if gpus is not None:
            axes.setdefault(GPU_LABEL, str(gpus))
        out.append({"point_id": p.point_id, "axes": axes, "summary": p.summary, "start": start, "end": end})
    return run.run_id, out
