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
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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
    "itl_seconds": "Inter-token latency: each gap between token-bearing chunks divided by the chunk's tokens, "
    "counted once per token (SGLang's definition).",
    "tpot_seconds": "Time per output token: (end - first token) / (completion tokens - 1), per successful request.",
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

# Summary gauges: metric name -> (help, path into the summary dict). Latency stats get a `stat` label.
LATENCY_STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")
SUMMARY_LATENCIES: dict[str, str] = {
    "ttft": "time to first token",
    "itl": "inter-token latency (per token)",
    "tpot": "time per output token",
    "e2e": "end-to-end latency",
}
SUMMARY_SCALARS: dict[str, tuple[str, str]] = {
    # metric suffix -> (summary key, help)
    "output_tokens_per_second": (
        "output_tok_s",
        "Aggregate output tokens per second over the measurement window.",
    ),
    "request_rate_per_second": ("request_rate", "Completed requests per second over the measurement window."),
    "goodput_requests_per_second": ("goodput", "Requests per second that met every SLO of the point."),
    "requests": ("requests", "Measured requests of the point (successes and failures, warmup excluded)."),
    "failed_requests": ("failures", "Failed measured requests of the point."),
    "error_ratio": ("error_rate", "Failed / measured requests of the point."),
}

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
        self._server = None
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
                h["schedule_lag_seconds"].one(max(0.0, (sent - sched) / 1e9))
            if err or sent is None:
                return
            if first is not None:
                h["ttft_seconds"].one((first - sent) / 1e9)
            if end is not None:
                h["e2e_seconds"].one((end - sent) / 1e9)
            ntok = int(_num(record, "completion_tokens") or 0)
            if first is not None and end is not None and ntok > 1:
                h["tpot_seconds"].one((end - first) / 1e9 / (ntok - 1))
            chunks = record.get("chunk_ns")
            if chunks is not None and len(chunks) > 1:
                t = np.asarray(chunks, dtype=np.int64)
                gaps = np.diff(t).astype(np.float64) / 1e9
                toks = record.get("chunk_tokens")
                if toks is not None and len(toks) == len(t):
                    w = np.asarray(toks, dtype=np.float64)[1:]
                    w[w < 1] = 1
                    h["itl_seconds"].many(gaps / w, w)
                else:
                    h["itl_seconds"].many(gaps)

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
            if self._current == point_id:
                self._current = None

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

    def collect(self):  # called by the registry at scrape time
        with self._lock:
            points = list(self._points.values())
            users = self._users_fn() if self._users_fn else self._users
            rate = self._target_rate
            yield from _families(self.run_id, points, float(users), rate)

    def describe(self):
        return []


def summary_values(summary: Mapping) -> tuple[dict[str, float], dict[str, float]]:
    """Flatten a summary dict into {metric/stat: value} and {error_class: failures}.

    Accepts latency blocks as `{"ttft": {"p50": s, ...}}` or `{"ttft_s": {...}}` (seconds), or `..._ms` blocks
    (converted), and scalars by the keys of SUMMARY_SCALARS; missing ones are left out, never invented.
    """
    out: dict[str, float] = {}
    for name in SUMMARY_LATENCIES:
        for key, scale in ((name, 1.0), (f"{name}_s", 1.0), (f"{name}_ms", 1e-3)):
            block = summary.get(key)
            if isinstance(block, Mapping):
                for stat in LATENCY_STATS:
                    v = block.get(stat)
                    if isinstance(v, int | float) and not math.isnan(v):
                        out[f"{name}/{stat}"] = float(v) * scale
                break
    for metric, (key, _help) in SUMMARY_SCALARS.items():
        v = summary.get(key)
        if isinstance(v, Mapping):  # e.g. goodput: {"requests_per_s": x, ...}
            v = next((x for x in v.values() if isinstance(x, int | float)), None)
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, int | float) and not math.isnan(v):
            out[metric] = float(v)
    fails: dict[str, float] = {}
    fb = summary.get("failures_by_class") or summary.get("failures_by")
    if isinstance(fb, Mapping):
        fails = {str(k): float(v) for k, v in fb.items() if isinstance(v, int | float)}
    return out, fails


def _families(run_id: str, points: list[_Point], users: float, rate: float):
    run = [run_id]
    g = GaugeMetricFamily(PREFIX + "users_active", "Locust users running now.", labels=["run_id"])
    g.add_metric(run, users)
    yield g
    g = GaugeMetricFamily(
        PREFIX + "target_requests_per_second",
        "Target request rate of an open-loop point (0: closed loop).",
        labels=["run_id"],
    )
    g.add_metric(run, rate)
    yield g

    axis_names = list(AXES) + sorted({k for p in points for k in p.info} - set(AXES))
    info = GaugeMetricFamily(
        PREFIX + "point_info",
        "One series per matrix point with its axes as labels (value 1); join on (run_id, point_id).",
        labels=["run_id", "point_id", *axis_names],
    )
    running = GaugeMetricFamily(
        PREFIX + "point_running", "1 while the point is being measured, 0 after.", labels=list(POINT_LABELS)
    )
    start = GaugeMetricFamily(
        PREFIX + "point_start_timestamp_seconds", "Unix time the point started.", labels=list(POINT_LABELS)
    )
    end = GaugeMetricFamily(
        PREFIX + "point_end_timestamp_seconds", "Unix time the point finished.", labels=list(POINT_LABELS)
    )
    req = CounterMetricFamily(
        PREFIX + "requests",
        "Measured requests by outcome (success|failure) and error class (none for successes).",
        labels=[*POINT_LABELS, "outcome", "error_class"],
    )
    warm = CounterMetricFamily(
        PREFIX + "warmup_requests",
        "Requests scheduled during warmup (not measured).",
        labels=list(POINT_LABELS),
    )
    tok = {
        k: CounterMetricFamily(PREFIX + f"{k}_tokens", f"{k.capitalize()} tokens of measured requests, "
                               "from the server's usage.", labels=list(POINT_LABELS))
        for k in ("prompt", "completion", "cached")
    }  # fmt: skip
    hists = {
        k: HistogramMetricFamily(PREFIX + k, h, labels=list(POINT_LABELS)) for k, h in HISTOGRAMS.items()
    }
    lat = {
        k: GaugeMetricFamily(
            PREFIX + f"point_{k}_seconds",
            f"Point summary: {h} in seconds (exact, from raw records), by stat p50|p90|p99|mean.",
            labels=[*POINT_LABELS, "stat"],
        )
        for k, h in SUMMARY_LATENCIES.items()
    }
    scal = {
        k: GaugeMetricFamily(PREFIX + f"point_{k}", f"Point summary: {h}", labels=list(POINT_LABELS))
        for k, (_key, h) in SUMMARY_SCALARS.items()
    }
    fails = GaugeMetricFamily(
        PREFIX + "point_failures",
        "Point summary: failed requests by error class.",
        labels=[*POINT_LABELS, "error_class"],
    )
    for p in points:
        lv = list(p.labels)
        info.add_metric([run_id, p.labels[1], *(p.info.get(a, "") for a in axis_names)], 1.0)
        running.add_metric(lv, 0.0 if p.finished else 1.0)
        start.add_metric(lv, p.started)
        if p.finished:
            end.add_metric(lv, p.finished)
        for (outcome, err), n in sorted(p.requests.items()):
            req.add_metric([*lv, outcome, err], float(n))
        warm.add_metric(lv, float(p.warmup_requests))
        tok["prompt"].add_metric(lv, float(p.prompt_tokens))
        tok["completion"].add_metric(lv, float(p.completion_tokens))
        tok["cached"].add_metric(lv, float(p.cached_tokens))
        for k, fam in hists.items():
            hh = p.hists[k]
            cum = np.cumsum(hh.counts)
            fam.add_metric(lv, list(zip(_LE, (float(c) for c in cum), strict=True)), hh.sum)
        for key, v in p.summary.items():
            if "/" in key:
                name, stat = key.split("/")
                lat[name].add_metric([*lv, stat], v)
            else:
                scal[key].add_metric(lv, v)
        for err, n in sorted(p.failures_by_class.items()):
            fails.add_metric([*lv, err], n)
    yield info
    yield running
    yield start
    yield end
    yield req
    yield warm
    yield from tok.values()
    yield from hists.values()
    yield from lat.values()
    yield from scal.values()
    yield fails
