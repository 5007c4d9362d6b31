"""PromQL shared by the dashboards: selectors, quantiles with guards, and the join with the point info metric."""

from __future__ import annotations

from servesweep.observe.dashboards import grafana as g

# Client series carry run_id, point_id, model, config; SGLang series get run_id and config from file_sd labels.
CLIENT = 'run_id=~"$run_id", model=~"$model", config=~"$config"'
SERVER = 'run_id=~"$run_id", config=~"$config"'
AXES = "concurrency, prompt_tokens, output_tokens, tp, speculative_method, context_length, workload"
POINT = "run_id, point_id, model, config"
EPS = "1e-9"  # ratio guard: clamp_min(denominator, EPS) keeps idle periods at 0 instead of NaN/Inf


def quantile(q: float, hist: str, sel: str, by: str = "") -> str:
    by_ = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({by_}) (rate({hist}_bucket{{{sel}}}[$__rate_interval])))"


def hist_mean(hist: str, sel: str, by: str = "") -> str:
    b = f" by ({by})" if by else ""
    return (
        f"sum{b} (rate({hist}_sum{{{sel}}}[$__rate_interval])) / "
        f"clamp_min(sum{b} (rate({hist}_count{{{sel}}}[$__rate_interval])), {EPS})"
    )


def rate_sum(counter: str, sel: str, by: str = "") -> str:
    b = f" by ({by})" if by else ""
    return f"sum{b} (rate({counter}{{{sel}}}[$__rate_interval]))"


def summ(metric: str, sel: str, stat: str | None = None) -> str:
    """A point summary gauge as the last value seen in the dashboard's range, one series per point."""
    s = f'{sel}, stat="{stat}"' if stat else sel
    return f"max by ({POINT}) (last_over_time({metric}{{{s}}}[$__range]))"


def with_axes(expr: str, sel: str, axes: str = AXES) -> str:
    """Attach the point's matrix axes (from servesweep_point_info) to a per-point series."""
    return (
        f"{expr} * on (run_id, point_id) group_left ({axes}) "
        f"max by (run_id, point_id, {axes}) (last_over_time(servesweep_point_info{{{sel}}}[$__range]))"
    )


def run_variables(*, one_run: bool) -> list[dict]:
    """The data source, then Run, Model and Server configuration from servesweep_point_info, each narrowing the
    next: one run (Matrix: `run_id="$run_id"`) or any runs chosen (Live: `run_id=~"$run_id"`)."""
    run = 'run_id="$run_id"' if one_run else 'run_id=~"$run_id"'
    pick = {"multi": False, "include_all": False} if one_run else {}
    return [
        g.datasource_var(),
        g.query_var("run_id", "label_values(servesweep_point_info, run_id)", label="Run", **pick, sort=2),
        g.query_var("model", f"label_values(servesweep_point_info{{{run}}}, model)", label="Model"),
        g.query_var("config", f'label_values(servesweep_point_info{{{run}, model=~"$model"}}, config)',
                    label="Server configuration"),
    ]  # fmt: skip
