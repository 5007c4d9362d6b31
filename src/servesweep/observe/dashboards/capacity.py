"""The Matrix dashboard's capacity panels: the frontier (output tok/s per GPU against per-user output speed at
every finished point, one series per server configuration: a grid's loads or a search's probes) and the
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
    ("ITL p99", "_itl_p99_seconds", "s"),
    ("per-user tok/s p50", "_decode_tokens_per_second_p50", "short"),
    ("probes", "_probes", "short"),
)


def frontier(sel: str) -> dict:
    """Throughput per GPU (y) against the median per-request decode speed (x), one series per configuration."""
    targets = [
        g.target(with_axes(summ("servesweep_point_output_tokens_per_second_per_gpu", sel), sel), table=True),
        g.target(with_axes(summ("servesweep_point_decode_tokens_per_second_p50", sel), sel), table=True),
    ]
    p = g.xychart(
        "Frontier: output tok/s per GPU vs per-user output tok/s",
        targets, x=X, series_by="config", x_label=X, y_label=Y,
        desc="Every finished point (a grid's loads, a search's probes), one line per server configuration; "
        "up and to the right is better on both. The report marks the Pareto frontier across configurations.",
    )  # fmt: skip
    # the two queries' values side by side in one row per point, named for the axes
    p["transformations"][1:1] = [
        {"id": "organize", "options": {"renameByName": {"Value #A": Y, "Value #B": X},
                                       "excludeByName": {"Time": True}}},
    ]  # fmt: skip
    return p


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
        "every SLO of the tier held; bracket: last pass, first fail; binding: the SLO that failed first.",
    )  # fmt: skip
