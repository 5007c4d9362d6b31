"""SGLang's metric families that appear only after an event, with values from the emulator's engine.

SGLang runs prometheus_client in multiprocess mode: a labelled family has no sample, and so no place in `/metrics`,
until a child of it is set. These are set on events only (SGLang 0.5.11 and 0.5.23 alike):

- `num_retracted_{requests,input_tokens,output_tokens}_total`: `Scheduler.update_running_batch` calls
  `increment_retracted_reqs` when `retract_decode` retracted at least one request (all three at once: requests, their
  prompt tokens, their output tokens so far). The emulator's engine retracts when decode runs out of KV.
- `realtime_tokens_total{mode}`: `increment_realtime_tokens` after each prefill batch (`prefill_compute`: input tokens
  computed, replays after a retraction included; `prefill_cache`: prefix-cache hits) and each decode batch
  (`decode`: tokens generated); a mode whose delta is 0 is skipped, so each mode appears with its first token.
- `per_stage_req_latency_seconds{stage}`: `RequestTimeStats` observes, outside disaggregation, `request_process`
  (scheduler receive to waiting queue: 0 in the emulator, which queues at once), `prefill_forward` (first forward
  entry to the end of the request's first prefill) and `chunked_prefill` (each middle chunk of a chunked prefill).
  Each stage appears with its first observation. Buckets: `exponential_buckets(0.001, 1.62, 30)`.
- `process_cpu_seconds_total{component}`: `cpu_monitor.start_cpu_monitor_thread`, started with `--enable-metrics`
  by the tokenizer manager (and the detokenizer), adds the process's CPU seconds every 5 s: the family appears 5 s
  after start-up. The emulator is one process doing the tokenizer manager's work: its CPU time under
  `component="tokenizer"`, read at each 5 s boundary (no detokenizer process, so no detokenizer series).
"""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily

# SGLang's HELP text (the same in 0.5.11 and 0.5.23)
HELP = {
    "num_retracted_requests": "Total number of retracted requests.",
    "num_retracted_input_tokens": "Total number of retracted input tokens.",
    "num_retracted_output_tokens": "Total number of retracted output tokens.",
    "realtime_tokens": "Total number of tokens processed (updated on each log interval). "
    "mode: prefill_compute, prefill_cache, decode.",
    "per_stage_req_latency_seconds": "The latency of each stage of requests.",
    "process_cpu_seconds": "Total CPU time consumed by this process (user + system)",
}
# SGLang: exponential_buckets(start=0.001, width=1.62, length=30)
STAGE_BUCKETS = [0.001 * 1.62**i for i in range(30)]
CPU_INTERVAL_S = 5.0  # cpu_monitor's interval


class CpuMonitor:
    """sglang:process_cpu_seconds_total as cpu_monitor.py counts it: CPU seconds since start-up, added at each
    CPU_INTERVAL_S boundary; None before the first one."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), time.process_time()
        self.ticks = 0
        self.value: float | None = None

    def read(self) -> float | None:
        ticks = int((time.monotonic() - self.t0) // CPU_INTERVAL_S)
        if ticks > self.ticks:
            self.ticks, self.value = ticks, time.process_time() - self.cpu0
        return self.value


def collect(metrics, cpu: CpuMonitor, stages: dict):
    """The families whose event has happened (metrics: sim.exposition.SimMetrics; stages: {stage: Hist})."""
    eng, lab = metrics.engine, metrics.sched_labels
    if eng.c_retractions:
        for name, value in (
            ("num_retracted_requests", eng.c_retractions),
            ("num_retracted_input_tokens", eng.c_retracted_input_tokens),
            ("num_retracted_output_tokens", eng.c_retracted_output_tokens),
        ):
            c = CounterMetricFamily("sglang:" + name, HELP[name], labels=list(lab))
            c.add_metric(list(lab.values()), float(value))
            yield c
    modes = {m: n for m, n in eng.c_realtime.items() if n}
    if modes:
        c = CounterMetricFamily("sglang:realtime_tokens", HELP["realtime_tokens"], labels=[*lab, "mode"])
        for mode, n in modes.items():
            c.add_metric([*lab.values(), mode], float(n))
        yield c
    if stages:
        name = "per_stage_req_latency_seconds"
        yield metrics.hist_family(name, stages, lab, key="stage", help=HELP[name])
    cpu_s = cpu.read()
    if cpu_s is not None:
        c = CounterMetricFamily(
            "sglang:process_cpu_seconds", HELP["process_cpu_seconds"], labels=["component"]
        )
        c.add_metric(["tokenizer"], cpu_s)
        yield c
