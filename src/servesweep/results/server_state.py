"""The server's own state during a point: SGLang's Prometheus `/metrics`, sampled about once a second while the
point runs (driver/point_run.py), reduced to what a user reads (summary.json `server_state`, the report's "Server state"
table). Pure functions: exposition text in, numbers out; nothing here does I/O.

Gauges (SGLang sets them at every log interval: each prefill batch and every `--decode-log-interval` decode steps)
get the mean and the max over the samples; counters get their increase over the point, and SGLang's own TTFT
and E2E histograms their mean over it (`latency`: the sum's increase over the count's). Where a family has several
label sets (one per DP rank, or per scheduler process with `--enable-metrics-for-all-schedulers`), the label sets
are combined as follows: usages and utilization (fractions of one pool) take the max over every label set, the
busiest rank; counts of requests are summed over `dp_rank` (each DP rank has its own requests) after the max within
one rank (its TP/PP/EP ranks report the same batch); counters are summed over every label set (`is_streaming`,
`dp_rank`, ... partition the requests), except the scheduler's queue-time histogram (`sglang:queue_time_seconds`,
its `_sum` and `_count`: one observation per request, when it leaves the waiting queue for its first forward),
whose label sets are ranks only: the max within a DP rank, summed over DP ranks, like the counts of requests.

SGLang runs prometheus_client in multiprocess mode: a labelled family has no sample until it is first set, so a
counter absent from an SGLang exposition counts as 0 (`sglang:num_retracted_requests_total` appears with the first
retraction). `sglang:mamba_usage` and `sglang:swa_token_usage` are written by every SGLang (0 without such a
pool): they are kept only when the server has the pool (a value above 0 in some sample, or a pool size in
`mamba_{available,used}_tokens` / `swa_{available,used}_tokens`), else None: hybrid models only for mamba. Likewise
`sglang:spec_accept_length` and `spec_accept_rate` (0 without speculative decoding): kept when a sample is above 0,
and a sample at 0 (before the first verify step) is left out of their mean and max.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# key in server_state["gauges"] -> (sample name, how label sets combine: "max" or "sum" over dp_rank)
GAUGES: dict[str, tuple[str, str]] = {
    "utilization": ("sglang:utilization", "max"),
    "token_usage": ("sglang:token_usage", "max"),
    "num_running_reqs": ("sglang:num_running_reqs", "sum"),
    "num_queue_reqs": ("sglang:num_queue_reqs", "sum"),
    "num_paused_reqs": ("sglang:num_paused_reqs", "sum"),
    "num_retracted_reqs": ("sglang:num_retracted_reqs", "sum"),
    "mamba_usage": ("sglang:mamba_usage", "max"),
    "swa_token_usage": ("sglang:swa_token_usage", "max"),
    # the KV pool in tokens (a constant SGLang 0.5.12+ emits at start-up; None before): what KV pressure names
    "kv_pool_tokens": ("sglang:max_total_num_tokens", "max"),
    # speculative decoding: tokens per verify step (accepted drafts + the bonus token) and the share of drafts
    # accepted, over each decode log interval; 0 without speculative decoding (None here) and before the first
    # verify step (left out of the mean and max)
    "spec_accept_length": ("sglang:spec_accept_length", "max"),
    "spec_accept_rate": ("sglang:spec_accept_rate", "max"),
}
# gauges whose 0 means "not measured yet", not a value: a sample at 0 is left out of their mean and max
NONZERO_GAUGES = {"spec_accept_length", "spec_accept_rate"}
# gauges kept only when the server has the pool: key -> the samples that size it
POOL_GAUGES: dict[str, tuple[str, ...]] = {
    "mamba_usage": ("sglang:mamba_available_tokens", "sglang:mamba_used_tokens"),
    "swa_token_usage": ("sglang:swa_available_tokens", "sglang:swa_used_tokens"),
    "spec_accept_length": (),  # kept when some sample is above 0: the server decodes speculatively
    "spec_accept_rate": (),
}
# key in server_state["counters"] -> sample name (SGLang 0.5.11 to 0.5.23 alike)
COUNTERS: dict[str, str] = {
    "retracted_requests": "sglang:num_retracted_requests_total",
    "aborted_requests": "sglang:num_aborted_requests_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    # the time requests spent in SGLang's waiting queue (arrival at the scheduler to its first forward), and how
    # many requests it measured (each one that reached its first forward, a wait of 0 s included)
    "queue_time_s": "sglang:queue_time_seconds_sum",
    "queue_time_count": "sglang:queue_time_seconds_count",
}
# counters whose label sets are the scheduler's ranks (every TP/PP rank of a DP rank observes the same requests
# with --enable-metrics-for-all-schedulers): combined like the counts of requests, not summed over label sets
PER_RANK_COUNTERS = {"sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count"}
# the server's own latency of the point's requests: SGLang's tokenizer histograms (`is_streaming` label sets, which
# partition the requests: summed), their _sum's and _count's increase over the point -> server_state's `latency`
# (the mean; the diagnosis compares it with the client's: the network between them)
LATENCY: dict[str, tuple[str, str]] = {
    "ttft": ("sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count"),
    "e2e": ("sglang:e2e_request_latency_seconds_sum", "sglang:e2e_request_latency_seconds_count"),
}
# counters followed but not shown in server_state's `counters`: prefix-cache hits (the shared_prefix check and agent
# points read them through StateAccumulator.increase), the latency histograms' sums and counts (`latency`)
TRACKED: dict[str, str] = {
    **COUNTERS,
    "cached_tokens": "sglang:cached_tokens_total",
    **{
        f"{k}_{part}": name
        for k, names in LATENCY.items()
        for part, name in zip(("s", "count"), names, strict=True)
    },
}
WANTED = (
    {name for name, _ in GAUGES.values()}
    | {n for names in POOL_GAUGES.values() for n in names}
    | set(TRACKED.values())
)
SAMPLE_INTERVAL_S = 1.0  # how often the driver asks for /metrics while a point runs
SAMPLE_TIMEOUT_S = 2.0  # one request at a time, this long at most


class NotSGLang(ValueError):
    """The exposition holds no `sglang:*` sample (another server, or metrics not enabled)."""


def read_exposition(text: str) -> dict[str, float]:
    """One /metrics answer reduced to the samples server_state needs: {sample name: value, label sets combined}.
    Parsed by prometheus_client's own parser. ValueError: not Prometheus text; NotSGLang: no `sglang:*` sample."""
    from prometheus_client.parser import text_string_to_metric_families

    by_name: dict[str, list[tuple[dict, float]]] = {}
    any_sglang = False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("sglang:"):
                any_sglang = True
            if s.name in WANTED and not math.isnan(s.value):
                by_name.setdefault(s.name, []).append((s.labels, float(s.value)))
    if not any_sglang:
        raise NotSGLang("/metrics holds no sglang:* series (another server, or --enable-metrics is off)")
    counters = (set(COUNTERS.values()) - PER_RANK_COUNTERS) | {n for names in LATENCY.values() for n in names}
    maxed = {name for name, how in GAUGES.values() if how == "max"}
    out: dict[str, float] = {}
    for name, rows in by_name.items():
        if name in counters:
            out[name] = sum(v for _, v in rows)
        elif name in maxed:
            out[name] = max(v for _, v in rows)
        else:  # counts of requests, pool sizes, queue time: the max within a DP rank, summed over DP ranks
            ranks: dict[str, float] = {}
            for labels, v in rows:
                r = labels.get("dp_rank", "")
                ranks[r] = max(ranks.get(r, v), v)
            out[name] = sum(ranks.values())
    return out


class StateAccumulator:
    """server_state's figures kept as the samples come (count, sum and max per gauge, each counter's increase, the
    pool flags, first and last time): a point of hours holds a few dozen numbers, not one dict per second."""

    def __init__(self) -> None:
        self.n = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._gauge: dict[str, list[float]] = {}  # key -> [count, sum, max]
        # the same over the samples under load only (`load`): from the first busy sample to the last one, so the
        # idle samples the sampler takes before the first request and after the last are left out
        self._load: dict[str, list[float]] = {}
        self._idle: dict[str, list[float]] = {}  # idle samples since the last busy one: load's if one comes
        self.n_load = 0
        self._n_idle = 0
        self._sized: set[str] = set()  # pool gauges whose pool showed a size or a value above 0
        self._inc = dict.fromkeys(TRACKED, 0.0)
        self._prev: dict[str, float] = {}
        self._exposed: set[str] = set()  # counters some sample held (the others read 0: never incremented)

    def add(self, t: float, snap: dict[str, float]) -> None:
        """One sample (read_exposition's dict at monotonic time t), in time order."""
        self.n += 1
        self.first_t = float(t) if self.first_t is None else self.first_t
        self.last_t = float(t)
        busy = _busy(snap)
        if busy and self._n_idle:  # idle samples between two busy ones: under load after all
            if self.n_load:
                for key, g in self._idle.items():
                    _fold(self._load, key, g)
                self.n_load += self._n_idle
            self._idle.clear()
            self._n_idle = 0
        if busy:
            self.n_load += 1
        else:
            self._n_idle += 1
        for key, (name, _how) in GAUGES.items():
            if name not in snap:
                continue
            v = snap[name]
            if key in NONZERO_GAUGES and v <= 0:
                continue
            _fold(self._gauge, key, [1.0, v, v])
            _fold(self._load if busy else self._idle, key, [1.0, v, v])
            if v > 0:
                self._sized.add(key)
        for key, names in POOL_GAUGES.items():
            if any(snap.get(n, 0) > 0 for n in names):
                self._sized.add(key)
        for key, name in TRACKED.items():
            if name in snap:
                self._exposed.add(key)
            v = snap.get(name, 0.0)  # multiprocess mode: no sample until the first event
            prev = self._prev.get(key)
            if prev is not None:
                self._inc[key] += v - prev if v >= prev else v  # a reset counts from 0, as increase() does
            self._prev[key] = v

    def increase(self, key: str) -> float | None:
        """One counter's increase over the samples; None when no sample held it (not exposed by this server, or
        never incremented: SGLang's multiprocess mode has no sample before the first event)."""
        return _tidy(self._inc[key]) if key in self._exposed else None

    def result(self, interval_s: float | None = None) -> dict | None:
        if not self.n:
            return None
        assert self.first_t is not None and self.last_t is not None  # set by the first add()
        span = self.last_t - self.first_t
        return {
            "samples": self.n,
            "interval_s": span / (self.n - 1) if self.n > 1 else interval_s,
            "span_s": span,
            "gauges": self._means(self._gauge),
            "counters": {key: _tidy(self._inc[key]) for key in COUNTERS},
            # the gauges over the samples under load (first to last sample with a request running or queued);
            # None when no sample was busy. The diagnosis reads these (results/diagnosis.py)
            "load": {"samples": self.n_load, "gauges": self._means(self._load)} if self.n_load else None,
            "latency": self._latency(),
        }

    def _latency(self) -> dict[str, dict] | None:
        """The server's own TTFT and E2E of the point's requests: {"ttft": {"mean_s", "count"}, "e2e": {...}}, from
        the histograms' increase over the samples (the first sample is taken before the load and the last after
        it: every request of the point, its warmup's too). A histogram the server does not expose, or that observed
        no request, is left out; None when neither is there (or from a single sample)."""
        if self.n < 2:
            return None
        out = {}
        for key in LATENCY:
            total, count = self.increase(f"{key}_s"), self.increase(f"{key}_count")
            if total is not None and count:
                out[key] = {"mean_s": total / count, "count": _tidy(count)}
        return out or None

    def _means(self, acc: dict[str, list[float]]) -> dict[str, dict | None]:
        gauges: dict[str, dict | None] = {}
        for key, (_name, how) in GAUGES.items():
            g = acc.get(key)
            if g is None or (key in POOL_GAUGES and key not in self._sized):
                gauges[key] = None
                continue
            gauges[key] = {"mean": g[1] / g[0], "max": _tidy(g[2]) if how == "sum" else g[2]}
        return gauges


def _busy(snap: dict[str, float]) -> bool:
    """A sample under load: a request running or queued. Neither gauge in it (SGLang's multiprocess mode has no
    sample of a gauge before it is first set): idle; a server that never exposes them has no `load` at all, and its
    readers take every sample."""
    return any(snap.get(GAUGES[k][0], 0.0) > 0 for k in ("num_running_reqs", "num_queue_reqs"))


def _fold(acc: dict[str, list[float]], key: str, g: list[float]) -> None:
    """Adds [count, sum, max] g into acc[key]."""
    have = acc.get(key)
    if have is None:
        acc[key] = list(g)
    else:
        have[0] += g[0]
        have[1] += g[1]
        have[2] = max(have[2], g[2])


def server_state(samples: Iterable[tuple[float, str | dict]], interval_s: float | None = None) -> dict | None:
    """summary.json's `server_state` from the samples of a point: (monotonic seconds, exposition text or what
    read_exposition made of it), in time order. None when no sample is an SGLang exposition.

    {"samples": N, "interval_s": mean gap between samples, "span_s": first to last,
     "gauges": {key: {"mean", "max"} or None (the server does not have it)},
     "counters": {key: increase over the point (a reset counts from 0, as Prometheus' increase() does)},
     "load": {"samples": N, "gauges": {...}}: the gauges over the samples under load only, from the first sample
       with a request running or queued to the last one (the sampler's samples before the first request and after
       the last are idle, and would pull a short point's means toward 0); None when no sample was busy,
     "latency": {"ttft": {"mean_s", "count"}, "e2e": {...}}: the server's own mean TTFT and E2E of the requests
       over the point (SGLang's time_to_first_token_seconds and e2e_request_latency_seconds histograms: their sum's
       increase / their count's); None without them}"""
    acc = StateAccumulator()
    for t, s in samples:
        if isinstance(s, str):
            try:
                s = read_exposition(s)
            except ValueError:
                continue
        acc.add(t, s)
    return acc.result(interval_s)


def _tidy(x: float) -> float | int:
    """A whole number as an int (counts read as counts in summary.json)."""
    return int(x) if math.isfinite(x) and float(x).is_integer() else x
