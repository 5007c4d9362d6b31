"""Live run: client TTFT/ITL per chunk/ITL per token/TPOT/E2E, throughput, errors and users beside the SGLang server's own
panels and the GPU sampler's (power, energy per output token, utilization, clocks, throttling); each point that missed
its SLO marked with its verdict."""

from __future__ import annotations

from servesweep.observe.dashboards import gpu, server_state
from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.queries import (
    CLIENT,
    EPS,
    SERVER,
    hist_mean,
    quantile,
    rate_sum,
    run_variables,
)

FAILED = CLIENT + ', outcome="failure"'
_Q = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


def _latency(title: str, hist: str, sel: str, desc: str) -> dict:
    ts = [g.target(quantile(q, hist, sel), name) for q, name in _Q]
    ts.append(g.target(hist_mean(hist, sel), "mean"))
    return g.timeseries(title, ts, unit="s", desc=desc)


def _client_latencies(L: g.Layout) -> None:
    L.add(
        _latency("Client TTFT", "servesweep_ttft_seconds", CLIENT, "Send to first token-bearing chunk."), w=8
    )
    L.add(
        _latency(
            "Client ITL per chunk",
            "servesweep_itl_seconds",
            CLIENT,
            "Gap between token-bearing chunks (summary itl_ms, the CLI's ITL/chunk; vLLM's ITL). With speculative "
            "decoding a chunk carries several tokens: see ITL per token.",
        ),
        w=8,
    )
    L.add(
        _latency(
            "Client ITL per token",
            "servesweep_itl_per_token_seconds",
            CLIENT,
            "Each chunk gap divided by its chunk's tokens, once per token (summary itl_per_token_ms; the "
            "definition of SGLang's own histogram, beside it in Server ITL per token).",
        ),
        w=8,
    )
    L.add(
        _latency("Client TPOT", "servesweep_tpot_seconds", CLIENT, "(end - first token) / (tokens - 1)."), w=8
    )
    L.add(_latency("Client E2E latency", "servesweep_e2e_seconds", CLIENT, "Send to end of stream."), w=8)


def _client_traffic(L: g.Layout) -> None:
    """Tokens, requests, errors, users and the load generator's own lag."""
    L.add(g.timeseries("Client tokens/s", [
        g.target(rate_sum("servesweep_completion_tokens_total", CLIENT), "output tok/s"),
        g.target(rate_sum("servesweep_prompt_tokens_total", CLIENT), "prompt tok/s"),
    ], unit="short", desc="From the server's usage of finished requests."), w=8)  # fmt: skip
    L.add(g.timeseries("Client requests/s by outcome", [
        g.target(rate_sum("servesweep_requests_total", CLIENT, "outcome"), "{{outcome}}"),
    ], unit="reqps"), w=8)  # fmt: skip
    L.add(g.timeseries("Errors by class", [
        g.target(rate_sum("servesweep_requests_total", FAILED, "error_class"),
                 "{{error_class}}"),
    ], unit="reqps", stack=True, desc="Failed requests per second by error class (docs/metrics.md)."), w=8)  # fmt: skip
    L.add(g.timeseries("Error ratio", [
        g.target(f"{rate_sum('servesweep_requests_total', FAILED)} / "
                 f"clamp_min({rate_sum('servesweep_requests_total', CLIENT)}, {EPS})", "failed / all"),
    ], unit="percentunit"), w=8)  # fmt: skip
    L.add(g.timeseries("Users and target rate", [
        g.target('sum by (run_id) (servesweep_users_active{run_id=~"$run_id"})', "users {{run_id}}"),
        g.target('sum by (run_id) (servesweep_target_requests_per_second{run_id=~"$run_id"})', "target req/s {{run_id}}"),
    ], desc="Closed-loop points have users and no target rate."), w=8)  # fmt: skip
    L.add(g.timeseries("Schedule lag p99", [
        g.target(quantile(0.99, "servesweep_schedule_lag_seconds", CLIENT), "p99"),
        g.target(hist_mean("servesweep_schedule_lag_seconds", CLIENT), "mean"),
    ], unit="s", desc="Send minus scheduled time: the load generator falling behind."), w=8)  # fmt: skip
    L.add(g.timeseries("TTFT p50: client vs server", [
        g.target(quantile(0.5, "servesweep_ttft_seconds", CLIENT), "client"),
        g.target(quantile(0.5, "sglang:time_to_first_token_seconds", SERVER), "server"),
    ], unit="s", desc="The gap is network, HTTP and client overhead."), w=8)  # fmt: skip


def _server(L: g.Layout) -> None:
    L.add(g.timeseries("Running and queued requests", [
        g.target(f"sum by (instance) (sglang:num_running_reqs{{{SERVER}}})", "running {{instance}}"),
        g.target(f"sum by (instance) (sglang:num_queue_reqs{{{SERVER}}})", "queued {{instance}}"),
    ]), w=8)  # fmt: skip
    L.add(g.timeseries("KV token usage", [
        g.target(f"max by (instance) (sglang:token_usage{{{SERVER}}})", "{{instance}}"),
    ], unit="percentunit"), w=8)  # fmt: skip
    L.add(g.timeseries("Generation throughput", [
        g.target(f"sum by (instance) (sglang:gen_throughput{{{SERVER}}})", "gen_throughput {{instance}}"),
        g.target(rate_sum("sglang:generation_tokens_total", SERVER, "instance"), "generated tok/s {{instance}}"),
    ], desc="gen_throughput is the server's own last-interval figure; the counter rate covers finished requests."),
        w=8)  # fmt: skip
    L.add(g.timeseries("Prefix cache hit rate", [
        g.target(f"max by (instance) (sglang:cache_hit_rate{{{SERVER}}})", "last batch {{instance}}"),
        g.target(f'{rate_sum("sglang:cached_tokens_total", SERVER, "instance")} / '
                 f'clamp_min({rate_sum("sglang:prompt_tokens_total", SERVER, "instance")}, {EPS})',
                 "cached / prompt tokens {{instance}}"),
    ], unit="percentunit", desc="With cache busting on, this should stay near 0."), w=8)  # fmt: skip
    L.add(g.timeseries("Speculative accept length", [
        g.target(f"max by (instance) (sglang:spec_accept_length{{{SERVER}}})", "{{instance}}"),
    ], desc="Tokens per verify step (0 without speculative decoding)."), w=8)  # fmt: skip
    server_state.add_panels(L)
    L.add(
        _latency("Server TTFT", "sglang:time_to_first_token_seconds", SERVER, "SGLang's own histogram."), w=8
    )
    L.add(
        _latency(
            "Server ITL per token",
            "sglang:inter_token_latency_seconds",
            SERVER,
            "SGLang's own histogram: each interval divided by its new tokens, counted once per token.",
        ),
        w=8,
    )
    L.add(
        _latency(
            "Server E2E latency", "sglang:e2e_request_latency_seconds", SERVER, "SGLang's own histogram."
        ),
        w=8,
    )


def build() -> dict:
    L = g.Layout()
    L.row("Client (servesweep exporter): what users saw")
    _client_latencies(L)
    _client_traffic(L)
    L.row("Server (SGLang /metrics)")
    _server(L)
    L.row("GPUs (the GPU sampler beside the server)")
    gpu.add_live_panels(L)
    annotations = [{
        "name": "Matrix points", "datasource": g.DS, "enable": True, "hide": False, "iconColor": "orange",
        "expr": 'max by (run_id, point_id) (servesweep_point_running{run_id=~"$run_id"}) > 0',
        "step": "5s", "titleFormat": "{{point_id}}", "textFormat": "run {{run_id}}", "tagKeys": "run_id,point_id",
        "useValueForTime": False,
    }, gpu.diagnosis_annotation(CLIENT)]  # fmt: skip
    variables = run_variables(one_run=False)
    return g.dashboard(
        "servesweep-live",
        "servesweep / Live run",
        L.panels,
        variables,
        desc="Client-side and server-side views of a running benchmark on one time axis.",
        annotations=annotations,
        time_from="now-30m",
        refresh="5s",
    )
