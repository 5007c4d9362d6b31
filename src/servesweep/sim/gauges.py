"""The rest of SGLang's scheduler gauges: every family its `/metrics` holds whatever the configuration, beyond the
core set `metrics.py` writes, per emulated version.

Which families are unconditional comes from SGLang's own code: `observability/metrics_collector.py`
(`SchedulerMetricsCollector.log_stats`, called at every log interval with `--enable-metrics`, and `emit_constants`,
called once at start-up) sets them outside any `if`. SGLang runs prometheus_client in multiprocess mode, so a family
appears once a value is set and there are no `_created` samples. Checked against 0.5.11 and 0.5.23 by
`tests/sim/test_metric_families.py`, which reads those two functions from SGLang's source; versions between them get
0.5.11's set plus what both have, and 0.5.23's additions from 0.5.23 on.

Values follow the engine: `new_token_ratio`, `num_retracted_reqs` (metrics.py), `decode_sum_seq_lens` (prompt +
output of every running request), `fwd_occupancy` (share of wall time the engine spent in steps since the previous
scrape, in %; NaN before, as SGLang starts it), `is_cuda_graph` (1 while a decode batch runs), the hybrid models'
mamba state slots (`mamba_*_tokens`: a running request holds `mamba_ratio` slots). What the emulator has no
counterpart of is SGLang's idle value: paused requests (async weight sync), disaggregation queues, SWA pools of
sliding-window models, routing keys, DSpark's capped verify window. `utilization` is SGLang's formula,
`max(running / max_running_requests_under_SLO, token_usage / 0.9)`, which both versions leave at 0 (nothing sets
`max_running_requests_under_SLO`).
"""

from __future__ import annotations

import os
import time

from prometheus_client.core import GaugeMetricFamily

# HELP text of each family, SGLang's own (0.5.23 where the versions differ)
HELP = {
    "decode_sum_seq_lens": "The sum of all sequence lengths in decode.",
    "new_token_ratio": "The new token ratio.",
    "num_paused_reqs": "The number of paused requests by async weight sync.",
    "utilization": "The utilization.",
    "is_cuda_graph": "Whether the batch is using CUDA graph.",
    "num_unique_running_routing_keys": "Number of unique routing keys in running batch.",
    "num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
    "num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "num_prefill_prealloc_queue_reqs": "The number of requests in the prefill prealloc queue.",
    "pending_prealloc_token_usage": "The token usage for pending preallocated tokens (not preallocated yet).",
    "num_pages": "Number of KV cache pages.",
    "startup_available_gpu_memory_gb": "Available GPU memory in GB at startup.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "context_len": "Maximum context length.",
    "page_size": "KV cache page size in tokens.",
    "engine_startup_time": "The time taken for the engine to start up.",
    "engine_load_weights_time": "The time taken for the engine to load weights.",
    "fwd_occupancy": "Forward pass GPU occupancy percentage.",
    "mamba_available_tokens": "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
    "mamba_evictable_tokens": "Number of evictable (radix-cached) state slots in the mamba SSM pool.",
    "mamba_used_tokens": "Number of actively used state slots in the mamba SSM pool.",
    "swa_available_tokens": "Number of free token slots in the SWA pool (hybrid-SWA only).",
    "swa_evictable_tokens": "Number of evictable (radix-cached) token slots in the SWA pool.",
    "swa_used_tokens": "Number of actively used token slots in the SWA pool.",
    "spec_cap_length": "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when "
    "no cap is scheduled).",
    "spec_block_accept_length": "Mean uncapped full-block accept length per verify step (accept + cap-trimmed "
    "drafts; exact only in DSpark cap-accept mode).",
    "num_decode_deferred_kv_release_reqs": "The number of failed decode requests whose KV allocations are held "
    "pending transfer drain acknowledgement or timeout.",
    "num_decode_host_receive_queue_reqs": "Requests in the decode transfer queue receiving into host memory or "
    "waiting for device admission.",
    "num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "prealloc_full_token_usage": "Share of the full-attention KV pool held by decode requests whose KV transfer is "
    "pending (preallocated, not yet running); same capacity basis as sglang:full_token_usage.",
    "prealloc_swa_token_usage": "Share of the SWA KV pool held by decode requests whose KV transfer is pending; "
    "same capacity basis as sglang:swa_token_usage.",
}
# idle in the emulator (no counterpart): SGLang's default value
IDLE = (
    "num_paused_reqs num_unique_running_routing_keys num_decode_prealloc_queue_reqs num_decode_transfer_queue_reqs "
    "num_prefill_inflight_queue_reqs pending_prealloc_token_usage num_prefill_prealloc_queue_reqs "
    "swa_available_tokens swa_evictable_tokens swa_used_tokens spec_block_accept_length "
    "num_decode_deferred_kv_release_reqs num_decode_host_receive_queue_reqs num_prefill_bootstrap_queue_reqs "
    "prealloc_full_token_usage prealloc_swa_token_usage"
).split()
BOTH = (
    "decode_sum_seq_lens new_token_ratio num_paused_reqs utilization is_cuda_graph num_unique_running_routing_keys "
    "num_decode_prealloc_queue_reqs num_decode_transfer_queue_reqs num_prefill_inflight_queue_reqs "
    "pending_prealloc_token_usage num_pages startup_available_gpu_memory_gb"
).split()
# before 0.5.12: emit_constants wrote these (metrics.py writes its constants from 0.5.12 on)
UNTIL_0_5_12 = (
    "num_prefill_prealloc_queue_reqs max_total_num_tokens context_len page_size engine_startup_time "
    "engine_load_weights_time"
).split()
FROM_0_5_23 = (
    "fwd_occupancy mamba_available_tokens mamba_evictable_tokens mamba_used_tokens swa_available_tokens "
    "swa_evictable_tokens swa_used_tokens spec_cap_length spec_block_accept_length "
    "num_decode_deferred_kv_release_reqs num_decode_host_receive_queue_reqs num_prefill_bootstrap_queue_reqs "
    "prealloc_full_token_usage prealloc_swa_token_usage"
).split()


def family_names(version: tuple[int, ...]) -> list[str]:
    """The families this module adds for a version, in exposition order."""
    names = list(BOTH)
    if version < (0, 5, 12):
        names += UNTIL_0_5_12
    if version >= (0, 5, 23):
        names += FROM_0_5_23
    return names


class GaugeState:
    """What the gauges need between scrapes (the busy time at the previous scrape, for fwd_occupancy)."""

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None  # (wall seconds, engine busy seconds) at the previous scrape


def values(metrics, state: GaugeState) -> dict[str, float]:
    """Every value this module's families hold now, from the engine and the resolved server."""
    eng, r, st = metrics.engine, metrics.resolved, metrics.engine.stats()
    running = list(getattr(eng, "running", ()))
    slots = int(getattr(r, "state_slots", 0) or 0)
    used = min(slots, st.num_running_reqs * max(1, int(getattr(r, "mamba_ratio", 0) or 0))) if slots else 0
    page = int(getattr(r, "page_size", None) or 1)
    mu = getattr(r, "memory_usage", {}) or {}
    mu = mu if isinstance(mu, dict) else vars(mu)
    now, busy = time.monotonic(), float(getattr(eng, "c_busy_s", 0.0))
    occupancy = float("nan")
    if state.last is not None and now > state.last[0]:
        occupancy = min(100.0, max(0.0, (busy - state.last[1]) / (now - state.last[0]) * 100))
    state.last = (now, busy)
    dspark = (getattr(r, "spec_algorithm", None) or "") == "DSPARK"
    v = dict.fromkeys(IDLE, 0.0)
    v.update(
        decode_sum_seq_lens=sum(len(q.prompt_ids) + q.completion_tokens for q in running),
        new_token_ratio=st.new_token_ratio,
        utilization=0.0,
        is_cuda_graph=1.0 if running and getattr(eng, "_chunked", None) is None else 0.0,
        num_pages=st.max_total_num_tokens // page,
        startup_available_gpu_memory_gb=mu.get("startup_available", 0) or 0,
        max_total_num_tokens=r.max_total_num_tokens,
        context_len=r.context_len,
        page_size=page,
        engine_startup_time=float(metrics.args.sim_load_time),
        engine_load_weights_time=float(metrics.args.sim_load_time),
        fwd_occupancy=occupancy,
        mamba_used_tokens=used,
        mamba_available_tokens=max(0, slots - used),
        mamba_evictable_tokens=0,
        spec_cap_length=float(getattr(r, "spec_num_draft_tokens", 0) or 0) if dspark else 0.0,
    )
    return v


def collect(metrics, state: GaugeState):
    """The families, with the scheduler's labels (SGLang's `_log_gauge`)."""
    v = values(metrics, state)
    lab = metrics.sched_labels
    for name in family_names(metrics.v):
        # real SGLang 0.5.23 writes num_paused_reqs with a pid label, as num_retracted_reqs (seen on its /metrics)
        extra = {"pid": str(os.getpid())} if name == "num_paused_reqs" else {}
        g = GaugeMetricFamily("sglang:" + name, HELP[name], labels=[*lab, *extra])
        g.add_metric([*lab.values(), *extra.values()], float(v[name]))
        yield g
