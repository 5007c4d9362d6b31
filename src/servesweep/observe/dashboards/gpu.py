"""GPU telemetry and energy panels (issue 31; docs/gpu-telemetry.md), and the points' diagnosis (issue 32).

Live: the GPU sampler's own series (`servesweep_gpu_*`, ansible/roles/sglang_server/files/gpu_sampler.py, scraped
where the run registers the sampler beside its server, labelled `run_id` and `config` like the server): power
against the limit, utilization, SM clock, throttling, temperature, and joules per output token as the GPUs' energy
counter rate over the client's output token rate, per configuration. Matrix and History: the points' summary gauges
(`servesweep_point_gpu_*`, observe/exporter.py from summary.json's `gpu`), tokens per joule against concurrency per
configuration, the energy frontier (output tokens per joule against output tok/s per GPU), and each point's verdict
(`servesweep_point_diagnosis_info`, results/diagnosis.py) as a table and as annotations at the point's end.
"""

from __future__ import annotations

from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.capacity import frontier_chart
from servesweep.observe.dashboards.queries import CLIENT, EPS, SERVER, summ, with_axes

GPU = SERVER  # the sampler's series carry the labels its scrape target gives it: run_id, config
BY = "instance, gpu"

# (column title, metric, unit): one row per point with GPU telemetry
ENERGY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("J per output token", "servesweep_point_gpu_joules_per_output_token", "joule"),
    ("output tok per J", "servesweep_point_gpu_output_tokens_per_joule", "short"),
    ("J per token", "servesweep_point_gpu_joules_per_token", "joule"),
    ("energy", "servesweep_point_gpu_energy_joules", "joule"),
    ("energy above idle", "servesweep_point_gpu_energy_above_idle_joules", "joule"),
    ("avg power", "servesweep_point_gpu_power_average_watts", "watt"),
    ("peak power", "servesweep_point_gpu_power_peak_watts", "watt"),
    ("idle power", "servesweep_point_gpu_idle_watts", "watt"),
    ("utilization", "servesweep_point_gpu_utilization_mean_ratio", "percentunit"),
    ("throttled", "servesweep_point_gpu_throttled", "bool_yes_no"),
    ("power capped", "servesweep_point_gpu_power_capped_ratio", "percentunit"),
)


def add_live_panels(L: g.Layout) -> None:
    """The sampler's series while load runs, beside SGLang's panels on one time axis."""
    L.add(g.timeseries("GPU power", [
        g.target(f"max by ({BY}) (servesweep_gpu_power_watts{{{GPU}}})", "{{instance}} GPU {{gpu}}"),
        g.target(f"max by ({BY}) (servesweep_gpu_power_limit_watts{{{GPU}}})", "limit {{instance}} GPU {{gpu}}"),
    ], unit="watt", desc="NVML's power draw (a ~1 s trailing average) against the enforced power limit, per GPU of "
       "the configuration's server."), w=8)  # fmt: skip
    energy = f"sum by (config) (rate(servesweep_gpu_energy_joules_total{{{GPU}}}[$__rate_interval]))"
    tokens = f"sum by (config) (rate(servesweep_completion_tokens_total{{{CLIENT}}}[$__rate_interval]))"
    L.add(g.timeseries("GPU energy per output token", [
        g.target(f"{energy} / clamp_min({tokens}, {EPS})", "{{config}}"),
    ], unit="joule", desc="The GPUs' energy counter rate (W) over the output tokens per second of finished requests, "
       "idle power included; tokens count when a request ends, so short windows jump. The point's exact figure "
       "(its window, the idle baseline shown) is in the Matrix dashboard's GPU energy table."), w=8)  # fmt: skip
    L.add(g.timeseries("GPU utilization", [
        g.target(f"max by ({BY}) (servesweep_gpu_utilization_ratio{{{GPU}}})", "busy {{instance}} GPU {{gpu}}"),
        g.target(f"max by ({BY}) (servesweep_gpu_memory_utilization_ratio{{{GPU}}})",
                 "memory {{instance}} GPU {{gpu}}"),
    ], unit="percentunit", desc="NVML utilization.gpu (a kernel ran in the sample period: not how full the SMs are) "
       "and utilization.memory (the memory controller's busy share)."), w=8)  # fmt: skip
    L.add(g.timeseries("GPU SM clock", [
        g.target(f"max by ({BY}) (servesweep_gpu_sm_clock_hertz{{{GPU}}})", "{{instance}} GPU {{gpu}}"),
    ], unit="hertz", desc="Falls when the power cap or a throttle reason holds the clocks."), w=8)  # fmt: skip
    L.add(g.timeseries("GPU throttling", [
        g.target(f"max by ({BY}) (servesweep_gpu_throttled{{{GPU}}})", "throttled {{instance}} GPU {{gpu}}"),
        g.target(f"max by ({BY}) (servesweep_gpu_power_capped{{{GPU}}})", "power capped {{instance}} GPU {{gpu}}"),
    ], desc="1 while a thermal, HW slowdown or power brake reason is active (the report's badge); power capped: "
       "the power limit holds the clocks, a busy GPU working as configured, not throttling."), w=8)  # fmt: skip
    L.add(g.timeseries("GPU temperature", [
        g.target(f"max by ({BY}) (servesweep_gpu_temperature_celsius{{{GPU}}})", "{{instance}} GPU {{gpu}}"),
    ], unit="celsius"), w=8)  # fmt: skip


def energy_table(sel: str) -> dict:
    """One row per point with GPU telemetry: energy, per token, power, utilization, throttling."""
    targets = [g.target(with_axes(summ(m, sel), sel), table=True) for _t, m, _u in ENERGY_COLUMNS]
    rename = {f"Value #{chr(ord('A') + i)}": t for i, (t, _m, _u) in enumerate(ENERGY_COLUMNS)}
    return g.table(
        "GPU energy per point", targets, rename=rename, units={t: u for t, _m, u in ENERGY_COLUMNS},
        desc="Points a GPU sampler measured (summary.json's gpu; docs/gpu-telemetry.md): energy over the point's "
        "window (the counter's, or integrated power where the GPU has none), idle included unless said; the idle "
        "baseline is the median power at 0 % utilization in the 30 s before the point.",
    )  # fmt: skip


def tokens_per_joule_chart(sel: str) -> dict:
    """Output tokens per joule against concurrency, one line per prompt length (repeated per configuration)."""
    return g.xychart(
        "Output tokens per joule vs concurrency ($config)",
        [g.target(with_axes(summ("servesweep_point_gpu_output_tokens_per_joule", sel), sel), table=True)],
        x="concurrency", series_by="prompt_tokens", x_label="concurrency", y_label="output tokens per joule",
        desc="GPU energy of each point (idle included) per output token, inverted; higher is better.",
    )  # fmt: skip


ENERGY_PARETO = "energy frontier"
X, Y = "output tok/s per GPU", "output tokens per joule"


def energy_frontier(sel: str, cap_sel: str) -> dict:
    """Output tokens per joule (y) against output tok/s per GPU (x) at every point with GPU telemetry, one series
    per configuration, and the energy frontier of the searches' probes (capacity.json) as one more series."""
    return frontier_chart(
        "Energy frontier: output tokens per joule vs output tok/s per GPU",
        (("servesweep_point_gpu_output_tokens_per_joule", "servesweep_frontier_output_tokens_per_joule"),
         ("servesweep_point_output_tokens_per_second_per_gpu", "servesweep_frontier_output_tokens_per_second_per_gpu")),
        sel, cap_sel, axes=(X, Y), flag="servesweep_frontier_energy_pareto", label=ENERGY_PARETO,
        desc="Every finished point a GPU sampler measured, one line per server configuration; up and to the right is "
        "better on both. Energy frontier (black): the searches' probes no other probe beats on both (the report's "
        "energy_frontier.svg).",
    )  # fmt: skip


DIAGNOSIS_BY = "run_id, point_id, config, cause, verdict, breached"


def diagnosis_table(sel: str) -> dict:
    """Each point's verdict: its first cause and the evidence (results/diagnosis.py), with its load and shape."""
    expr = f"max by ({DIAGNOSIS_BY}) (last_over_time(servesweep_point_diagnosis_info{{{sel}}}[$__range]))"
    return g.table(
        "Why: each point's diagnosis", [g.target(with_axes(expr, sel), table=True)],
        hide=("Time", "Value", "run_id"),
        desc="The first cause of each point and its evidence numbers, the others' names after 'also' "
        "(docs/reports.md, 'Diagnosis'); breached: the point broke an SLO or was flagged. Judged as the exporter saw "
        "the points: against the lowest-load point of the configuration finished before it.",
    )  # fmt: skip


def diagnosis_annotation(sel: str) -> dict:
    """A marker at the end of each point that broke an SLO or was flagged, its verdict as the text."""
    value = f'max by ({DIAGNOSIS_BY}) (servesweep_point_diagnosis_info{{{sel}, breached="true"}})'
    at = f"max by (run_id, point_id) (servesweep_point_end_timestamp_seconds{{{sel}}})"
    return {
        "name": "Why a point missed its SLO", "datasource": g.DS, "enable": True, "hide": False, "iconColor": "red",
        "expr": f"{value} * on (run_id, point_id) group_left () {at} * 1000",
        "step": "5s", "titleFormat": "{{point_id}}: {{cause}}", "textFormat": "{{verdict}}",
        "tagKeys": "run_id,config,cause", "useValueForTime": True,
    }  # fmt: skip
