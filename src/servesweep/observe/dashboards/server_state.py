"""The SGLang server's state panels a user reads while load runs: utilization, retractions, and the mamba state
pool of hybrid models (Qwen3.5/3.6, Qwen3-Next), whose slots, not the KV pool, cap the running requests."""

from __future__ import annotations

from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.queries import SERVER


def add_panels(L: g.Layout) -> None:
    L.add(g.timeseries("Utilization", [
        g.target(f"max by (instance) (sglang:utilization{{{SERVER}}})", "utilization {{instance}}"),
        g.target(f"max by (instance) (sglang:token_usage{{{SERVER}}})", "token usage {{instance}}"),
        g.target(f"max by (instance) (sglang:fwd_occupancy{{{SERVER}}}) * 0.01", "forward occupancy {{instance}}"),
    ], unit="percentunit", desc="SGLang's utilization is max(running / max_running_requests_under_SLO, token usage "
       "/ 0.9); 0.5.11 to 0.5.23 leave it at 0 (nothing sets the SLO cap). Forward occupancy: share of wall time "
       "in forward passes (0.5.23)."), w=8)  # fmt: skip
    L.add(g.timeseries("Retractions", [
        g.target(f"max by (instance) (sglang:num_retracted_reqs{{{SERVER}}})", "retracted {{instance}}"),
        g.target(f"max by (instance) (sglang:num_paused_reqs{{{SERVER}}})", "paused {{instance}}"),
        g.target(f"max by (instance) (sglang:new_token_ratio{{{SERVER}}})", "new token ratio {{instance}}"),
    ], desc="Requests retracted (KV pool full: they re-prefill later) in the last interval; the new-token ratio "
       "resets to its start value on a retraction."), w=8)  # fmt: skip
    L.add(g.timeseries("Mamba state usage (hybrid models)", [
        g.target(f"max by (instance) (sglang:mamba_usage{{{SERVER}}})", "mamba usage {{instance}}"),
        g.target(f"max by (instance) (sglang:full_token_usage{{{SERVER}}})", "full-attention KV {{instance}}"),
    ], unit="percentunit", desc="State slots in use: a running request of a hybrid model holds several; when "
       "this reaches 1 the server queues the rest, whatever the KV usage."), w=8)  # fmt: skip
