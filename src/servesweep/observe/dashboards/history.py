"""History: point summaries across runs (months), and two runs side by side."""

from __future__ import annotations

from servesweep.observe.dashboards import grafana as g
from servesweep.observe.dashboards.matrix import points_table
from servesweep.observe.dashboards.queries import EPS, summ, with_axes

SEL = 'run_id=~"$run_id", model=~"$model", config=~"$config"'
KEY = (
    "config, concurrency, prompt_tokens, output_tokens"  # what makes a point of run A comparable to one of B
)


def _side(metric: str, run_var: str, stat: str | None = None) -> str:
    sel = f'run_id="${run_var}", model=~"$model", config=~"$config"'
    return f"max by ({KEY}) ({with_axes(summ(metric, sel, stat), sel)})"


# (title, metric, stat, unit)
COMPARE: tuple[tuple[str, str, str | None, str], ...] = (
    ("output tok/s", "servesweep_point_output_tokens_per_second", None, "short"),
    ("TTFT p99", "servesweep_point_ttft_seconds", "p99", "s"),
    ("ITL per chunk p50", "servesweep_point_itl_seconds", "p50", "s"),
    ("ITL per token p50", "servesweep_point_itl_per_token_seconds", "p50", "s"),
    ("E2E p99", "servesweep_point_e2e_seconds", "p99", "s"),
    ("GPU J per output token", "servesweep_point_gpu_joules_per_output_token", None, "joule"),
)


def build() -> dict:
    L = g.Layout()
    L.row("Runs")
    runs = [
        g.target(f"count by (run_id, model) (max by (run_id, point_id, model) "
                 f"(last_over_time(servesweep_point_info{{{SEL}}}[$__range])))", table=True),
        g.target(f"min by (run_id) (last_over_time(servesweep_point_start_timestamp_seconds{{{SEL}}}[$__range]))"
                 " * 1000", table=True),
        g.target(f"max by (run_id) (last_over_time(servesweep_point_output_tokens_per_second{{{SEL}}}[$__range]))",
                 table=True),
        g.target(f'min by (run_id) (last_over_time(servesweep_point_ttft_seconds{{{SEL}, stat="p50"}}[$__range]))',
                 table=True),
        g.target(f"sum by (run_id) (last_over_time(servesweep_point_failed_requests{{{SEL}}}[$__range]))",
                 table=True),
    ]  # fmt: skip
    L.add(g.table("Runs in range", runs, rename={
        "Value #A": "points", "Value #B": "started", "Value #C": "peak output tok/s",
        "Value #D": "best TTFT p50", "Value #E": "failures"},
        units={"started": "dateTimeAsIso", "best TTFT p50": "s"}), w=24, h=8)  # fmt: skip
    L.add(g.timeseries("Peak output tok/s per run and configuration", [
        g.target(f"max by (run_id, config) (max_over_time(servesweep_point_output_tokens_per_second{{{SEL}}}"
                 "[$__interval]))", "{{run_id}} {{config}}"),
    ], desc="Each run appears at the time it ran."), w=12)  # fmt: skip
    L.add(g.timeseries("TTFT p99 per run and configuration (worst point)", [
        g.target(f'max by (run_id, config) (max_over_time(servesweep_point_ttft_seconds{{{SEL}, stat="p99"}}'
                 "[$__interval]))", "{{run_id}} {{config}}"),
    ], unit="s"), w=12)  # fmt: skip
    L.add(points_table("All points of the selected runs", SEL, "Summaries kept by the exporter or backfilled."),
          w=24, h=12)  # fmt: skip

    L.row("Run A vs run B")
    for title, metric, stat, unit in COMPARE:
        a, b = _side(metric, "run_a", stat), _side(metric, "run_b", stat)
        L.add(g.xychart(f"{title} vs concurrency: A and B",
                        [g.target(a, table=True), g.target(b, table=True)],
                        x="concurrency", y_unit=unit, series_by="prompt_tokens", x_label="concurrency",
                        y_label=title), w=12, h=8)  # fmt: skip
    cmp_targets: list[dict] = []
    rename = {}
    units = {}
    for title, metric, stat, unit in COMPARE:
        a, b = _side(metric, "run_a", stat), _side(metric, "run_b", stat)
        n = len(cmp_targets)
        cmp_targets += [g.target(a, table=True), g.target(b, table=True),
                        g.target(f"({b}) / clamp_min({a}, {EPS})", table=True)]  # fmt: skip
        for i, suffix in enumerate(("A", "B", "B/A")):
            rename[f"Value #{chr(ord('A') + n + i)}"] = f"{title} {suffix}"
            units[f"{title} {suffix}"] = "percentunit" if suffix == "B/A" else unit
    L.add(g.table("A vs B by point shape", cmp_targets, rename=rename, units=units,
                  desc="Matched on configuration, concurrency, prompt and output length; B/A > 1 means B is higher."),
          w=24, h=12)  # fmt: skip
    variables = [
        g.datasource_var(),
        g.query_var("model", "label_values(servesweep_point_info, model)", label="Model"),
        g.query_var("config", 'label_values(servesweep_point_info{model=~"$model"}, config)',
                    label="Server configuration"),
        g.query_var("run_id", 'label_values(servesweep_point_info{model=~"$model"}, run_id)', label="Runs", sort=2),
        g.query_var("run_a", 'label_values(servesweep_point_info{model=~"$model"}, run_id)', label="Run A",
                    multi=False, include_all=False, sort=2),
        g.query_var("run_b", 'label_values(servesweep_point_info{model=~"$model"}, run_id)', label="Run B",
                    multi=False, include_all=False, sort=2),
    ]  # fmt: skip
    return g.dashboard(
        "servesweep-history",
        "servesweep / History",
        L.panels,
        variables,
        desc="Point summaries across runs, live or backfilled (servesweep prom backfill); compare two runs.",
        time_from="now-90d",
    )
