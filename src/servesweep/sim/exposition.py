"""`/metrics`: SGLang's `sglang:*` series (reference sglang.md §5) for the emulated version.

The hot path never touches prometheus_client: requests bump plain Python counters and histogram arrays when they
finish (as SGLang updates its tokenizer-side metrics at finish), and scheduler gauges are read from the engine's
stats at scrape time. A custom collector turns that state into metric families and prometheus_client writes the
exposition text (labels sorted, no `_created` samples, counters as `..._total`), as SGLang's multiprocess mode does.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from . import events, gauges

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8]  # fmt: skip
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
QUEUE_BUCKETS = [
    0,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    900,
    1200,
    1800,
    3600,
]
TOKEN_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000,
                 15000, 20000, 22000, 25000, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
                 500000, 600000, 700000, 800000, 900000, 1000000, 1100000]  # fmt: skip

HELP = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "num_grammar_queue_reqs": "The number of requests in the grammar waiting queue.",
    "num_used_tokens": "The number of used tokens.",
    "token_usage": "The token usage.",
    "full_token_usage": "The full attention token usage.",
    "swa_token_usage": "The sliding window attention token usage.",
    "mamba_usage": "The mamba state cache usage.",
    "kv_available_tokens": "The number of available KV cache tokens.",
    "kv_evictable_tokens": "The number of evictable KV cache tokens.",
    "kv_used_tokens": "The number of used KV cache tokens.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    "spec_accept_rate": "Mean acceptance rate of speculative decoding.",
    "spec_num_steps": "The number of speculative decoding steps.",
    "spec_num_draft_tokens": "The number of speculative draft tokens.",
    "num_retracted_reqs": "The number of retracted requests.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "context_len": "The context length of the model.",
    "page_size": "The page size of the KV cache.",
    "weight_memory_usage_gb": "The weight memory usage in GB.",
    "kv_cache_memory_usage_gb": "The KV cache memory usage in GB.",
    "graph_memory_usage_gb": "The CUDA graph memory usage in GB.",
    "startup_time_seconds": "Startup time of each phase in seconds.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "generation_tokens": "Number of generation tokens processed.",
    "num_requests": "Number of requests processed.",
    "cached_tokens": "Number of cached prompt tokens.",
    "num_aborted_requests": "Number of requests aborted.",
    "spec_verify_calls": "Number of speculative verify calls.",
    "num_so_requests": "Number of structured output requests processed.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of request time per output token in seconds.",
    "e2e_request_latency_seconds": "Histogram of End-to-end request latency in seconds",
    "queue_time_seconds": "Histogram of queueing time in seconds.",
    "prompt_tokens_histogram": "Histogram of prompt token length.",
    "uncached_prompt_tokens_histogram": "Histogram of uncached prompt token length.",
    "generation_tokens_histogram": "Histogram of generation token length.",
    "http_requests": "Total number of HTTP requests by endpoint and method.",
    "http_responses": "Total number of HTTP responses by endpoint, status code and method.",
    "http_requests_active": "Number of currently active HTTP requests.",
}


class Hist:
    """A plain histogram: `observe(v, n)` counts value v n times (ITL spreads a multi-token chunk this way)."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: Sequence[float]):
        self.buckets = [float(b) for b in buckets]
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect_left(self.buckets, v)] += n
        self.sum += v * n
        self.count += n


def _fmt_le(b: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(b)


class SimMetrics:
    """All the `sglang:*` state of one emulator; `render()` is the scrape."""

    def __init__(self, *, model_name: str, version: tuple[int, ...], resolved, engine, args):
        self.v = version
        self.engine = engine
        self.resolved = resolved
        self.args = args
        self.model_name = model_name
        self.sched_labels = {
            "engine_type": "unified",
            "model_name": model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        if getattr(args, "dp_size", 1) > 1:
            self.sched_labels["dp_rank"] = "0"
        self.tok_labels = {"model_name": model_name}
        if version >= (0, 5, 12):
            self.tok_labels["engine_type"] = "unified"
        self.streaming_split = version >= (0, 5, 20)
        self.has_tpot = version >= (0, 5, 23)
        self.constants = version >= (0, 5, 12)
        tb = args.bucket_time_to_first_token or TTFT_BUCKETS
        ib = args.bucket_inter_token_latency or ITL_BUCKETS
        eb = args.bucket_e2e_request_latency or E2E_BUCKETS
        keys = ("true", "false") if self.streaming_split else ("",)
        self.prompt_tokens = dict.fromkeys(keys, 0)
        self.generation_tokens = dict.fromkeys(keys, 0)
        self.num_requests = dict.fromkeys(keys, 0)
        self.ttft = {k: Hist(tb) for k in keys}
        self.e2e = {k: Hist(eb) for k in keys}
        self.tpot = {k: Hist(ib) for k in keys}
        self.itl = Hist(ib)
        self.queue = Hist(QUEUE_BUCKETS)
        self.prompt_hist = Hist(TOKEN_BUCKETS)
        self.uncached_hist = Hist(TOKEN_BUCKETS)
        self.gen_hist = Hist(TOKEN_BUCKETS)
        self.cached_tokens = 0
        self.aborted = 0
        self.verify_calls = 0
        self.http_requests: dict[tuple[str, str], int] = {}
        self.http_responses: dict[tuple[str, str, str], int] = {}
        self.active_fn = lambda: 0  # set by the server: generation requests in flight
        self.gauge_state = gauges.GaugeState()
        # families SGLang sets on an event (sim/events.py): request stages observed by the engine, CPU time
        self.stage_hists: dict[str, Hist] = {}
        self.cpu = events.CpuMonitor()
        engine.on_stage = self._on_stage
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ------------------------------------------------------------ updates (at request finish)

    def on_finish(
        self,
        *,
        streaming: bool,
        prompt: int,
        completion: int,
        cached: int,
        ttft: float | None,
        e2e: float,
        queue_time: float | None,
        itl: list[tuple[float, int]],
        finish_reason: str | None,
        verify_ct: int,
    ) -> None:
        k = ("true" if streaming else "false") if self.streaming_split else ""
        self.prompt_tokens[k] += prompt
        self.generation_tokens[k] += completion
        self.num_requests[k] += 1
        self.cached_tokens += cached
        self.verify_calls += verify_ct
        if finish_reason == "abort":
            self.aborted += 1
        if ttft is not None:
            self.ttft[k].observe(ttft)
        self.e2e[k].observe(e2e)
        if queue_time is not None:
            self.queue.observe(queue_time)
        for dt, n in itl:
            self.itl.observe(dt / n, n)
        if finish_reason in ("stop", "length") and completion > 1 and ttft is not None:
            self.tpot[k].observe((e2e - ttft) / (completion - 1))
        self.prompt_hist.observe(prompt)
        self.uncached_hist.observe(max(0, prompt - cached))
        self.gen_hist.observe(completion)

    def _on_stage(self, stage: str, seconds: float) -> None:
        h = self.stage_hists.get(stage)
        if h is None:
            h = self.stage_hists[stage] = Hist(events.STAGE_BUCKETS)
        h.observe(max(0.0, seconds))

    def http(self, endpoint: str, method: str, status: int) -> None:
        key = (endpoint, method)
        self.http_requests[key] = self.http_requests.get(key, 0) + 1
        rkey = (endpoint, str(status), method)
        self.http_responses[rkey] = self.http_responses.get(rkey, 0) + 1

    # ------------------------------------------------------------ scrape

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _gauge(self, name: str, value: float, labels: dict | None = None, extra: dict | None = None):
        lab = dict(labels if labels is not None else self.sched_labels)
        if extra:
            lab.update(extra)
        g = GaugeMetricFamily("sglang:" + name, HELP[name], labels=list(lab))
        g.add_metric(list(lab.values()), float(value))
        return g

    def _counter(self, name: str, per: dict[str, int] | int, labels: dict | None = None):
        lab = dict(labels if labels is not None else self.tok_labels)
        if isinstance(per, dict) and self.streaming_split:
            c = CounterMetricFamily("sglang:" + name, HELP[name], labels=[*lab, "is_streaming"])
            for k, val in per.items():
                c.add_metric([*lab.values(), k], float(val))
            return c
        total = sum(per.values()) if isinstance(per, dict) else per
        c = CounterMetricFamily("sglang:" + name, HELP[name], labels=list(lab))
        c.add_metric(list(lab.values()), float(total))
        return c

    def _hist(self, name: str, hists: dict[str, Hist] | Hist, labels: dict | None = None):
        return self.hist_family(name, hists, labels)

    def hist_family(
        self,
        name: str,
        hists: dict[str, Hist] | Hist,
        labels: dict | None = None,
        *,
        key: str = "is_streaming",
        help: str | None = None,
    ):
        """A histogram family; `hists` per value of the label `key` (a single Hist: no such label)."""
        lab = dict(labels if labels is not None else self.tok_labels)
        m = Metric("sglang:" + name, help or HELP[name], "histogram")
        items = hists.items() if isinstance(hists, dict) else [("", hists)]
        for k, h in items:
            base = dict(lab)
            if k:
                base[key] = k
            # sample order as SGLang's multiprocess exposition: _sum, the buckets, _count
            m.add_sample(m.name + "_sum", base, float(h.sum))
            acc = 0
            for b, c in zip(h.buckets, h.counts, strict=False):
                acc += c
                m.add_sample(m.name + "_bucket", {**base, "le": _fmt_le(b)}, float(acc))
            m.add_sample(m.name + "_bucket", {**base, "le": "+Inf"}, float(h.count))
            m.add_sample(m.name + "_count", base, float(h.count))
        return m

    def collect(self):
        """One scrape, in SGLang's order: the scheduler's gauges, its constants (when exposed), the tokenizer's
        counters and histograms, the HTTP server's counters."""
        yield from self._scheduler_gauges()
        if self.constants:
            yield from self._constant_gauges()
        yield from gauges.collect(self, self.gauge_state)  # the rest of SGLang's unconditional gauges
        yield from events.collect(self, self.cpu, self.stage_hists)  # the families set on an event, once set
        yield from self._tokenizer_metrics()
        yield from self._http_metrics()

    def _scheduler_gauges(self):
        st = self.engine.stats()
        r = self.resolved
        spec = bool(getattr(r, "spec_algorithm", None))
        yield self._gauge("num_running_reqs", st.num_running_reqs)
        yield self._gauge("num_queue_reqs", st.num_queue_reqs)
        yield self._gauge("num_grammar_queue_reqs", 0)
        yield self._gauge("num_used_tokens", st.num_used_tokens)
        yield self._gauge("token_usage", round(st.token_usage, 2))
        yield self._gauge("full_token_usage", round(st.token_usage, 2))
        yield self._gauge("swa_token_usage", 0)
        yield self._gauge("mamba_usage", round(getattr(st, "mamba_usage", 0.0) or 0.0, 2))
        cap = st.max_total_num_tokens
        yield self._gauge("kv_used_tokens", st.num_used_tokens)
        yield self._gauge("kv_available_tokens", max(0, cap - st.num_used_tokens))
        yield self._gauge("kv_evictable_tokens", getattr(st, "evictable_tokens", 0) or 0)
        yield self._gauge("gen_throughput", st.gen_throughput)
        yield self._gauge("cache_hit_rate", st.cache_hit_rate)
        acc = st.spec_accept_length if spec else 0.0
        yield self._gauge("spec_accept_length", acc)
        ndraft = getattr(r, "spec_num_draft_tokens", None) or 0
        yield self._gauge("spec_accept_rate", getattr(st, "spec_accept_rate", 0.0) if spec else 0.0)
        yield self._gauge("spec_num_steps", (getattr(r, "spec_num_steps", None) or 0) if spec else 0)
        yield self._gauge("spec_num_draft_tokens", ndraft if spec else 0)
        yield self._gauge(
            "num_retracted_reqs", getattr(st, "num_retracted_reqs", 0), extra={"pid": str(os.getpid())}
        )

    def _constant_gauges(self):
        r = self.resolved
        mu = getattr(r, "memory_usage", {}) or {}
        mu = mu if isinstance(mu, dict) else vars(mu)
        yield self._gauge("max_total_num_tokens", r.max_total_num_tokens)
        yield self._gauge("context_len", r.context_len)
        yield self._gauge("page_size", getattr(r, "page_size", None) or 1)
        yield self._gauge("weight_memory_usage_gb", mu.get("weight", 0) or 0)
        yield self._gauge("kv_cache_memory_usage_gb", mu.get("kvcache", 0) or 0)
        graph = mu.get("graph") or {}
        g = GaugeMetricFamily(
            "sglang:graph_memory_usage_gb",
            HELP["graph_memory_usage_gb"],
            labels=[*self.sched_labels, "phase"],
        )
        for phase, val in graph.items() if isinstance(graph, dict) else [("decode", graph)]:
            g.add_metric([*self.sched_labels.values(), phase], float(val or 0))
        yield g
        # SGLang's tokenizer manager writes it (labels model_name, engine_type and phase, no ranks), one sample per
        # start-up phase it timed; the emulator's start-up is its --sim-load-time, KV allocation takes no time
        lab = {k: self.sched_labels[k] for k in ("engine_type", "model_name")}
        s = GaugeMetricFamily("sglang:startup_time_seconds", HELP["startup_time_seconds"], labels=[*lab, "phase"])
        load = float(self.args.sim_load_time)
        for phase, val in (("load_weight", load), ("kv_cache_allocation", 0.0), ("scheduler_e2e", load),
                           ("tokenizer_e2e", load)):  # fmt: skip
            s.add_metric([*lab.values(), phase], val)
        yield s

    def _tokenizer_metrics(self):
        """Tokenizer-side: updated when a request finishes."""
        yield self._counter("prompt_tokens", self.prompt_tokens)
        yield self._counter("generation_tokens", self.generation_tokens)
        yield self._counter("num_requests", self.num_requests)
        c = CounterMetricFamily(
            "sglang:cached_tokens", HELP["cached_tokens"], labels=[*self.tok_labels, "cache_source"]
        )
        c.add_metric([*self.tok_labels.values(), "device"], float(self.cached_tokens))
        yield c
        yield self._counter("num_aborted_requests", self.aborted)
        yield self._counter("spec_verify_calls", self.verify_calls)
        yield self._counter("num_so_requests", 0)
        yield self._hist("time_to_first_token_seconds", self.ttft)
        yield self._hist("inter_token_latency_seconds", self.itl)
        if self.has_tpot:
            yield self._hist("request_time_per_output_token_seconds", self.tpot)
        yield self._hist("e2e_request_latency_seconds", self.e2e)
        yield self._hist("queue_time_seconds", self.queue, self.sched_labels)
        yield self._hist("prompt_tokens_histogram", self.prompt_hist)
        yield self._hist("uncached_prompt_tokens_histogram", self.uncached_hist)
        yield self._hist("generation_tokens_histogram", self.gen_hist)

    def _http_metrics(self):
        hr = CounterMetricFamily("sglang:http_requests", HELP["http_requests"], labels=["endpoint", "method"])
        for (ep, meth), val in self.http_requests.items():
            hr.add_metric([ep, meth], float(val))
        yield hr
        hs = CounterMetricFamily(
            "sglang:http_responses", HELP["http_responses"], labels=["endpoint", "status_code", "method"]
        )
        for (ep, code, meth), val in self.http_responses.items():
            hs.add_metric([ep, code, meth], float(val))
        yield hs
        # SGLang's HTTP middleware keeps one gauge per (endpoint, method) it has seen; the emulator knows how
        # many generation requests are in flight, not on which endpoint: they are counted on the first
        # generation endpoint seen, every other endpoint reads 0
        ha = GaugeMetricFamily(
            "sglang:http_requests_active", HELP["http_requests_active"], labels=["endpoint", "method"]
        )
        active = float(self.active_fn())
        for ep, meth in self.http_requests:
            gen = active and ep in GENERATION_ENDPOINTS
            ha.add_metric([ep, meth], active if gen else 0.0)
            active = 0.0 if gen else active
        yield ha


GENERATION_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/generate")

# every name a 0.5.23 scrape must hold, with its type (tests check against this and the reference)
EXPECTED_0_5_23 = {
    **{
        f"sglang:{n}": "gauge"
        for n in (
            "num_running_reqs num_queue_reqs num_grammar_queue_reqs gen_throughput token_usage num_used_tokens "
            "cache_hit_rate spec_accept_length spec_accept_rate spec_num_steps spec_num_draft_tokens "
            "max_total_num_tokens context_len page_size weight_memory_usage_gb kv_cache_memory_usage_gb "
            "graph_memory_usage_gb startup_time_seconds http_requests_active"
        ).split()
    },
    **{
        f"sglang:{n}": "counter"
        for n in (
            "prompt_tokens generation_tokens num_requests cached_tokens num_aborted_requests spec_verify_calls "
            "num_so_requests http_requests http_responses"
        ).split()
    },
    **{
        f"sglang:{n}": "histogram"
        for n in (
            "time_to_first_token_seconds inter_token_latency_seconds request_time_per_output_token_seconds "
            "e2e_request_latency_seconds queue_time_seconds prompt_tokens_histogram "
            "uncached_prompt_tokens_histogram generation_tokens_histogram"
        ).split()
    },
}
