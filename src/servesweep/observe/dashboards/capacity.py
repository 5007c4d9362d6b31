"""The Matrix dashboard's capacity panels: the frontier (output tok/s per GPU against per-user output speed at
every finished point, one series per server configuration: a grid's loads or a search's probes; the Pareto
frontier across configurations one more series, from observe/capacity_metrics.py's frontier gauges) and the
capacity-at-SLO table (observe/capacity_metrics.py's gauges; docs/capacity.md)."""

from __future__ import annotations

from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.queries import summ, with_axes

X, Y = "per-user output tok/s", "output tok/s per GPU"
CAP_BY = "run_id, search, config, tier, axis, stop, binding"

# (column title, gauge suffix of servesweep_capacity, unit)
CAPACITY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("capacity", "", "short"),
    ("bracket pass", "_bracket_low", "short"),
    ("bracket fail", "_bracket_high", "short"),
    ("GPUs", "_gpus", "short"),
    ("tok/s per GPU", "_output_tokens_per_second_per_gpu", "short"),
    ("req/s per GPU", "_request_rate_per_second_per_gpu", "reqps"),
    ("TTFT p99", "_ttft_p99_seconds", "s"),
    ("ITL per chunk p99", "_itl_p99_seconds", "s"),
    ("per-user tok/s p50", "_decode_tokens_per_second_p50", "short"),
    ("probes", "_probes", "short"),
    # energy at capacity, where a GPU sampler measured the probes (results/capacity.add_energy)
    ("output tok per J", "_output_tokens_per_joule", "short"),
    ("J per output token", "_joules_per_output_token", "joule"),
    ("avg GPU power", "_gpu_power_average_watts", "watt"),
    ("capacity per kW", "_per_kilowatt", "short"),
)


PARETO = "Pareto frontier"
FRONTIER_BY = "run_id, search, config, load"


def _on_frontier(metric: str, cap_sel: str, flag: str, label: str) -> str:
    """A servesweep_frontier_* gauge at the probes on a frontier (the gauge `flag` == 1), its config label set to
    `label`: after the panel's partition by config they are one series of their own."""
    last = f"max by ({FRONTIER_BY}) (last_over_time({{m}}{{{{{cap_sel}}}}}[$__range]))"
    on = f"{last.format(m=metric)} * on ({FRONTIER_BY}) ({last.format(m=flag)} == 1)"
    return f'label_replace({on}, "config", "{label}", "", "")'


def frontier_chart(
    title: str,
    pairs: tuple[tuple[str, str], tuple[str, str]],
    sel: str,
    cap_sel: str,
    *,
    axes: tuple[str, str],
    flag: str,
    label: str,
    desc: str,
) -> dict:
    """An XY chart of the finished points, one series per configuration, and a frontier of the searches' probes as
    one more series drawn over them (black, thicker). `pairs`: (the points' gauge, the frontier's gauge) for y,
    then x; `axes`: the (x, y) names; `flag`: the frontier's 0/1 gauge; `label`: its series' name. Each query is
    the points' values `or` the frontier's: the frontier rows differ in their labels (config, search, load), so
    `or` keeps both and the merge pairs each row's x and y."""
    x, y = axes
    targets = [g.target(f"{with_axes(summ(pt, sel), sel)} or {_on_frontier(fr, cap_sel, flag, label)}", table=True)
               for pt, fr in pairs]  # fmt: skip
    p = g.xychart(title, targets, x=x, series_by="config", x_label=x, y_label=y, desc=desc)
    # the two queries' values side by side in one row per point, named for the axes
    p["transformations"][1:1] = [
        {"id": "organize", "options": {"renameByName": {"Value #A": y, "Value #B": x},
                                       "excludeByName": {"Time": True}}},
    ]  # fmt: skip
    # the frontier drawn over the configurations' lines: black, thicker, larger points
    p["fieldConfig"]["overrides"].append(
        {"matcher": {"id": "byRegexp", "options": f".*{label}.*"},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "black"}},
                        {"id": "custom.lineWidth", "value": 2}, {"id": "custom.pointSize", "value": {"fixed": 9}}]}
    )  # fmt: skip
    return p


def frontier(sel: str, cap_sel: str) -> dict:
    """Throughput per GPU (y) against the median per-request decode speed (x), one series per configuration, and
    the Pareto frontier across configurations as one more series (`cap_sel` selects the servesweep_frontier_*
    gauges, which carry no model label)."""
    return frontier_chart(
        "Frontier: output tok/s per GPU vs per-user output tok/s",
        (("servesweep_point_output_tokens_per_second_per_gpu", "servesweep_frontier_output_tokens_per_second_per_gpu"),
         ("servesweep_point_decode_tokens_per_second_p50", "servesweep_frontier_decode_tokens_per_second_p50")),
        sel, cap_sel, axes=(X, Y), flag="servesweep_frontier_pareto", label=PARETO,
        desc="Every finished point (a grid's loads, a search's probes), one line per server configuration; "
        "up and to the right is better on both. Pareto frontier (black): the searches' probes no other probe beats "
        "on both (capacity.json's frontier, as the report draws it).",
    )  # fmt: skip


def capacity_table(sel: str) -> dict:
    """One row per search × tier: capacity with its bracket, GPUs, per-GPU throughput and latency at capacity."""
    targets = [
        g.target(f"max by ({CAP_BY}) (last_over_time(servesweep_capacity{suffix}{{{sel}}}[$__range]))", table=True)
        for _t, suffix, _u in CAPACITY_COLUMNS
    ]
    rename = {f"Value #{chr(ord('A') + i)}": t for i, (t, _s, _u) in enumerate(CAPACITY_COLUMNS)}
    return g.table(
        "Capacity at SLO", targets, rename=rename, units={t: u for t, _s, u in CAPACITY_COLUMNS},
        desc="Runs with a search: block. Capacity: the largest load (concurrency, or req/s for axis rate) at which "
        "every SLO of the tier held; bracket: last pass, first fail; binding: the SLO that failed first. Energy at "
        "capacity (GPU sampler): the probe's GPU energy per output token, idle included, every call at that load pooled.",
    )  # fmt: skip
