"""Matrix: one row per finished point of a run with its diagnosis, the GPUs' energy per point and its frontier,
capacity at SLO, and the charts people draw by hand, per server configuration."""

from __future__ import annotations

from servesweep.observe.dashboards import capacity, gpu
from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.queries import run_variables, summ, with_axes

SEL = 'run_id="$run_id", model=~"$model", config=~"$config"'

# (column title, metric, stat or None, unit)
COLUMNS: tuple[tuple[str, str, str | None, str], ...] = (
    ("output tok/s", "servesweep_point_output_tokens_per_second", None, "short"),
    ("output tok/s per GPU", "servesweep_point_output_tokens_per_second_per_gpu", None, "short"),
    ("req/s", "servesweep_point_request_rate_per_second", None, "reqps"),
    ("req/s per GPU", "servesweep_point_request_rate_per_second_per_gpu", None, "reqps"),
    ("goodput req/s", "servesweep_point_goodput_requests_per_second", None, "reqps"),
    ("TTFT p50", "servesweep_point_ttft_seconds", "p50", "s"),
    ("TTFT p99", "servesweep_point_ttft_seconds", "p99", "s"),
    ("ITL per chunk p50", "servesweep_point_itl_seconds", "p50", "s"),
    ("ITL per chunk p99", "servesweep_point_itl_seconds", "p99", "s"),
    ("ITL per token p50", "servesweep_point_itl_per_token_seconds", "p50", "s"),
    ("TPOT p50", "servesweep_point_tpot_seconds", "p50", "s"),
    ("TPOT p99", "servesweep_point_tpot_seconds", "p99", "s"),
    ("E2E p50", "servesweep_point_e2e_seconds", "p50", "s"),
    ("E2E p99", "servesweep_point_e2e_seconds", "p99", "s"),
    ("requests", "servesweep_point_requests", None, "short"),
    ("failures", "servesweep_point_failed_requests", None, "short"),
    ("degenerate", "servesweep_point_degenerate_ratio", None, "percentunit"),
    ("needle", "servesweep_point_needle_accuracy_ratio", None, "percentunit"),
    ("degraded", "servesweep_point_degraded", None, "short"),
    ("concurrency held", "servesweep_point_concurrency_held", None, "short"),
)


def points_table(title: str, sel: str, desc: str) -> dict:
    targets = [g.target(with_axes(summ(m, sel, stat), sel), table=True) for _t, m, stat, _u in COLUMNS]
    rename = {f"Value #{chr(ord('A') + i)}": t for i, (t, _m, _s, _u) in enumerate(COLUMNS)}
    units = {t: u for t, _m, _s, u in COLUMNS}
    return g.table(title, targets, desc=desc, rename=rename, units=units)


def degraded_stat(sel: str) -> dict:
    """How many points of the run ran at a lower load than asked (a Locust worker lost): red from 1."""
    expr = f"count(max by (run_id, point_id) (last_over_time(servesweep_point_degraded{{{sel}}}[$__range])) == 1)"
    p = g.stat(
        "Degraded points", [g.target(f"{expr} or vector(0)")],
        desc="Points measured at a lower load than asked: a Locust worker was lost mid-point, so their figures "
        "describe the load they held (the points table's 'concurrency held' against its concurrency), not their "
        "label; the diagnosis table says what happened. servesweep run exits 2 for them, gate fails them unless "
        "--allow-degraded (docs/reliability.md).",
    )  # fmt: skip
    p["fieldConfig"]["defaults"]["thresholds"] = {
        "mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
    }  # fmt: skip
    p["options"].update(colorMode="background", graphMode="none")
    return p


def isolation_table(sel: str) -> dict:
    """A packed run's isolation sample: per configuration and metric, the change from alone to packed."""
    expr = f"max by (config, metric, flagged) (last_over_time(servesweep_isolation_change_ratio{{{sel}}}[$__range]))"
    title = "change alone → packed"
    return g.table(
        "Isolation: packed vs alone", [g.target(expr, table=True)],
        rename={"Value": title, "Value #A": title}, units={title: "percentunit"},
        desc="Packed runs (servesweep run --max-parallel N): the first point of each configuration run again alone "
        "after the packed phase; TTFT p50 and output tok/s packed against alone. flagged: a change above 10 %, "
        "where the neighbours on the host moved the numbers (docs/experiments.md).",
    )  # fmt: skip


def build() -> dict:
    L = g.Layout()
    L.row("Finished points")
    L.add(points_table("Points of the run", SEL, "One row per finished point: exact percentiles from raw records; "
                       "degraded 1: measured at a lower load than asked (concurrency held)."),
          w=21, h=12)  # fmt: skip
    L.add(degraded_stat(SEL), w=3, h=12)
    L.add(gpu.diagnosis_table(SEL), w=24, h=8)
    L.row("GPU energy (points a GPU sampler measured)")
    L.add(gpu.energy_table(SEL), w=14, h=10)
    L.add(gpu.energy_frontier(SEL, 'run_id="$run_id", config=~"$config"'), w=10, h=10)
    L.row("Capacity at SLO and the frontier")
    L.add(capacity.capacity_table('run_id="$run_id", config=~"$config"'), w=14, h=10)
    L.add(capacity.frontier(SEL, 'run_id="$run_id", config=~"$config"'), w=10, h=10)
    L.row("Isolation: packed vs alone")
    L.add(isolation_table('run_id="$run_id", config=~"$config"'), w=24, h=6)
    L.row("Per server configuration")
    tput = g.xychart(
        "Output tok/s vs concurrency ($config)",
        [g.target(with_axes(summ("servesweep_point_output_tokens_per_second", SEL), SEL), table=True)],
        x="concurrency", series_by="prompt_tokens", x_label="concurrency", y_label="output tok/s",
        desc="One line per prompt length.",
    )  # fmt: skip
    ttft = g.xychart(
        "TTFT p99 vs prompt length ($config)",
        [g.target(with_axes(summ("servesweep_point_ttft_seconds", SEL, "p99"), SEL), table=True)],
        x="prompt_tokens", series_by="concurrency", y_unit="s", x_label="prompt tokens", y_label="TTFT p99",
        desc="One line per concurrency.",
    )  # fmt: skip
    itl = g.xychart(
        "ITL per chunk p50 vs concurrency ($config)",
        [g.target(with_axes(summ("servesweep_point_itl_seconds", SEL, "p50"), SEL), table=True)],
        x="concurrency", series_by="prompt_tokens", y_unit="s", x_label="concurrency", y_label="ITL per chunk p50",
        desc="The gap between token-bearing chunks; the points table also has ITL per token.",
    )  # fmt: skip
    needle = g.xychart(
        "Needle accuracy vs prompt length ($config)",
        [g.target(with_axes(summ("servesweep_point_needle_accuracy_ratio", SEL), SEL), table=True)],
        x="prompt_tokens", series_by="concurrency", y_unit="percentunit", x_label="prompt tokens",
        y_label="needle accuracy", desc="The configuration's needle probes answered right (docs/answers.md).",
    )  # fmt: skip
    for p in (tput, ttft, itl, needle, gpu.tokens_per_joule_chart(SEL)):
        p.update(repeat="config", repeatDirection="h", maxPerRow=3)
        L.add(p, w=8, h=9)
    variables = run_variables(one_run=True)
    return g.dashboard(
        "servesweep-matrix",
        "servesweep / Matrix",
        L.panels,
        variables,
        desc="Summaries of every finished point of one run; pick the run's time range (or wider).",
        time_from="now-24h",
    )
