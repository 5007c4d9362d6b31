"""`servesweep report runs/<id>`: a self-contained HTML report and a Markdown summary of a run folder.

Per server configuration: the tables people make today (by concurrency, and by prompt length), the plots they would
rather look at, the resolved server configuration, the planner's estimates against the measured times, the points
that were infeasible or failed with their reasons, and load-generator saturation flags. A point's figures are read
from its summary.json (`PointSummary`, the one place they are: docs/metrics.md's definitions, applied once when the
point ended), never recomputed beside it; records.parquet gives only what a summary does not hold: the ITL
distributions the plots draw and, against a baseline, compare's bootstrap intervals (results/compare.py).
The HTML has no script and no URL: inline CSS and inline SVG plots, so it opens offline and can be attached to CI.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from servesweep.config.experiment import KV_OVERFLOW
from servesweep.files import write_atomic
from servesweep.results.answers_report import answers_html, answers_markdown, answers_tables
from servesweep.results.capacity import frontier_svg, load_capacity
from servesweep.results.capacity import markdown as capacity_markdown
from servesweep.results.compare import (
    RunComparison,
    compare_html_section,
    compare_runs,
    fmt_change,
    fmt_ci,
    fmt_value,
    metric,
    point_sample,
)
from servesweep.results.degraded import Degradation, degradation
from servesweep.results.diagnosis import MIN_STATE_SAMPLES, Diagnosis, config_label, diagnose_all, knees
from servesweep.results.energy import throttle_flag
from servesweep.results.isolation_analysis import html_section as isolation_html
from servesweep.results.isolation_analysis import markdown as isolation_markdown
from servesweep.results.pergpu import point_gpus, with_per_gpu
from servesweep.results.point_summary import PointSummary
from servesweep.results.runfolder import PointInfo, Run, load_run, secs_between

HTML_NAME = "report.html"
MD_NAME = "report.md"
LAG_FLAG_MS = (
    10.0  # a closed loop sends right after the previous response; more lag means the client fell behind
)
PROMPT_DEV_FLAG_PCT = 1.0
# a percentile from fewer values than this is marked in tables and plots (a p99 of 4 requests is their largest)
SMALL_SAMPLE = 20
KINDS = {"run": "servesweep run", "load": "servesweep load", "point": "one point", "records": "records file"}

# (key, header, metric name, unit for display, decimals); metric None: a total per GPU (results/pergpu.py)
COLUMNS = (
    ("output_tokens_per_s", "output tok/s", "output_tokens_per_s", "", 1),
    ("output_tokens_per_s_per_gpu", "output tok/s per GPU", None, "", 1),
    ("request_rate", "req/s", "request_rate", "", 2),
    ("request_rate_per_gpu", "req/s per GPU", None, "", 3),
    ("decode_tokens_per_s", "per-request tok/s", "decode_tokens_per_s_mean", "", 1),
    ("ttft_p50", "TTFT p50 ms", "ttft_p50", "", 1),
    ("ttft_p99", "TTFT p99 ms", "ttft_p99", "", 1),
    ("itl_p50", "ITL per chunk p50 ms", "itl_p50", "", 2),
    ("itl_p99", "ITL per chunk p99 ms", "itl_p99", "", 2),
    ("itl_per_token_p50", "ITL per token p50 ms", "itl_per_token_p50", "", 2),
    ("tpot_p50", "TPOT p50 ms", "tpot_p50", "", 2),
    ("e2e_p50", "E2E p50 ms", "e2e_p50", "", 1),
    ("error_rate", "error rate %", "error_rate", "%", 2),
    ("degenerate_rate", "degenerate %", "degenerate_rate", "%", 1),
)
# Where each column's figure is in summary.json: (field, statistic of its Stats; None: the field is the figure)
SUMMARY_AT = {
    "output_tokens_per_s": ("output_tokens_per_s", None),
    "request_rate": ("request_rate", None),
    "decode_tokens_per_s": ("decode_tokens_per_s", "mean"),
    "ttft_p50": ("ttft_ms", "p50"),
    "ttft_p99": ("ttft_ms", "p99"),
    "itl_p50": ("itl_ms", "p50"),
    "itl_p99": ("itl_ms", "p99"),
    "itl_per_token_p50": ("itl_per_token_ms", "p50"),
    "tpot_p50": ("tpot_ms", "p50"),
    "e2e_p50": ("e2e_ms", "p50"),
    "error_rate": ("error_rate", None),
    "degenerate_rate": ("degenerate_rate", None),
}
# The GPUs' energy during each point (summary.json's `gpu`, from its gpu.json where a GPU sampler ran:
# docs/gpu-telemetry.md), after COLUMNS in a report where any point has it
ENERGY_COLUMNS = (
    ("joules_per_output_token", "GPU J/out tok", "joules_per_output_token", "", 3),
    ("output_tokens_per_joule", "out tok/J", "output_tokens_per_joule", "", 3),
    ("joules_per_token", "GPU J/tok", "joules_per_token", "", 4),
    ("power_avg_w", "GPU avg W", "power_avg_w", "", 0),
)


def report_columns(sections: list[ConfigSection]) -> tuple:
    """COLUMNS, and ENERGY_COLUMNS when a point of the report has GPU energy."""
    has = any(_finite(r.values.get("joules_per_output_token")) for sec in sections for r in sec.rows)
    return COLUMNS + ENERGY_COLUMNS if has else COLUMNS


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def queue_s_per_request(state: dict | None) -> float | None:
    """The mean time a request of the point waited in SGLang's queue (sglang:queue_time_seconds' increase over
    the point: its sum / its count); None without the counters or without a request measured."""
    c = (state or {}).get("counters") or {}
    s, n = c.get("queue_time_s"), c.get("queue_time_count")
    if not (_number(s) and _number(n)):
        return None
    return s / n if n > 0 else None


def _number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


# the server's own state during each point (summary.json server_state, results/server_state.py):
# (key, header, where in server_state or a function of it, decimals); mamba usage only where some point of the
# section has it
# (key, header, the keys to the value in server_state or a function of server_state, decimals)
StateColumn = tuple[str, str, tuple[str, ...] | Callable[[dict | None], float | None], int]
SERVER_STATE_COLUMNS: tuple[StateColumn, ...] = (
    # gauges: a sample reads SGLang's last log, so they mean something only over enough samples
    ("utilization_mean", "utilization mean", ("gauges", "utilization", "mean"), 2),
    ("utilization_max", "utilization max", ("gauges", "utilization", "max"), 2),
    ("token_usage_max", "token usage max", ("gauges", "token_usage", "max"), 2),
    ("running_max", "running max", ("gauges", "num_running_reqs", "max"), 0),
    ("queue_max", "queue max", ("gauges", "num_queue_reqs", "max"), 0),
    ("mamba_usage_max", "mamba usage max", ("gauges", "mamba_usage", "max"), 2),
    # counters: their increase from the sample before the point's first request to the one after its last
    ("queue_s_per_req", "queue s/req", queue_s_per_request, 2),
    ("retractions", "retractions", ("counters", "retracted_requests"), 0),
)
GAUGE_COLUMNS = frozenset(
    c[0] for c in SERVER_STATE_COLUMNS if isinstance(c[2], tuple) and c[2][0] == "gauges"
)
UTILIZATION_COLUMNS = ("utilization_mean", "utilization_max")
# The first sample precedes the point's load and the last follows it: a point needs this many to have 3 taken
# while it ran (about 3 s at one a second). Fewer read the state before or after the load (the demo's 2 s points
# at concurrency 4 showed running max 0): their gauges are not shown, and the row says why.
MIN_GAUGE_SAMPLES = MIN_STATE_SAMPLES  # one figure with results/diagnosis.py: its gauges need as many
FEW_SAMPLES = "too few samples"
# a point without server_state: written before it was sampled, or a server without SGLang's metrics
NO_STATE = "—"
SERVER_STATE_NOTE = (
    "The server's own gauges and counters from its Prometheus /metrics, sampled about once a second while each "
    "point ran: usage and utilization as fractions (mean and max over the samples), running and queued requests "
    "at most, the mean time a request waited in the server's queue before its first forward (from SGLang's "
    "queue-time histogram: every request of the point, not a sample), retractions during the point (SGLang up "
    "to 0.5.23 leaves utilization at 0: nothing sets the "
    "running-request cap it divides by; its columns are left out when every sample read 0). SGLang sets these "
    "gauges when it logs (each prefill batch, every 40 decode steps by default), and the first sample precedes a "
    "point's load and the last follows it: a point with fewer than "
    f"{MIN_GAUGE_SAMPLES} samples ({FEW_SAMPLES}) would read the state before or after its load, so its gauges "
    f"are not shown (its queue time and retractions, counted over the whole point, are). {NO_STATE}: not "
    "recorded (a run folder written before servesweep sampled /metrics, or a server without SGLang's metrics)."
)
RESOLVED_KEYS = (
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "context_length",
    "mem_fraction_static",
    "max_running_requests",
    "max_total_num_tokens",
    "max_total_tokens",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "kv_cache_dtype",
    "attention_backend",
    "schedule_policy",
    "disable_radix_cache",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "mamba_radix_cache_strategy",
    "served_model_name",
)


@dataclass(frozen=True)
class Flag:
    """A sign that a point's numbers may not describe the server: a short badge, its full text in the title."""

    code: str  # the badge, one of FLAG_LEGEND
    text: str  # what was seen, e.g. "vm:24767: event-loop lag p99 22.4 ms > 20 ms"


# badge -> what it means (the legend under a table that shows it); DEGRADED first: the loudest
FLAG_LEGEND = {
    "DEGRADED": "the point ran at a lower load than asked (a Locust worker was lost): its figures are not its label's",
    "KV overflow": "kept past the KV pool on purpose (experiment keep: [kv_overflow]): its running requests × "
    "context exceed the pool, so it measures the pool (queueing for KV, retractions), not the concurrency",
    "client CPU": "a load-generating process used more than 90% of a core: the client may have set the numbers",
    "loop lag": "a load-generating process's event loop woke more than 20 ms late at p99: stamps can be that late",
    "merged gaps": "more than 1% of ITL gaps were chunks read together (the client fell a chunk gap behind)",
    "sched lag": f"schedule lag p99 above {LAG_FLAG_MS:g} ms: the load generator sent requests late",
    "Locust CPU": "Locust warned that the load generator's CPU was above 90%",
    "prompt off": f"prompt tokens more than {PROMPT_DEV_FLAG_PCT:g}% off target",
    "replay off": "a trace replay did not reach the server as the trace has it (summary.json trace_fidelity: cache "
    "hits apart, requests missing, prompt lengths off); the verdict in the badge's tooltip",
    "GPU throttled": "a GPU slowed for heat, a hardware slowdown or a power brake during the point (gpu.json); the "
    "power cap alone is not throttling",
    "other": "another sign, its text in the badge's tooltip",
}
# client headroom reasons (results/summary.py client_headroom) -> badge, by their wording
_REASON_CODES = (
    (re.compile(r"% of a core"), "client CPU"),
    (re.compile(r"event-loop lag"), "loop lag"),
    (re.compile(r"chunks read together"), "merged gaps"),
)


def reason_flag(text: str) -> Flag:
    """A client headroom reason as a badge (summaries keep the reasons as text)."""
    code = next((c for rx, c in _REASON_CODES if rx.search(text)), "other")
    return Flag(code, text)


@dataclass
class PointRow:
    info: PointInfo
    values: dict[str, float]
    ok: int
    failed: int
    failures: dict[str, int]
    slos: list[dict]
    flags: list[Flag]
    itl: list[float]
    samples: dict[str, int] = field(default_factory=dict)  # percentile column -> values it rests on
    server_state: dict | None = None  # summary.json's server_state (None: not recorded)
    degraded: Degradation | None = None  # measured at a lower load than asked (results/degraded.py)
    why: Diagnosis | None = None  # the point's verdict (results/diagnosis.py), set by build_report

    def few(self, key: str) -> int | None:
        """The sample count of a percentile column resting on fewer than SMALL_SAMPLE values, else None."""
        n = self.samples.get(key)
        return n if n is not None and n < SMALL_SAMPLE else None


@dataclass
class ConfigSection:
    config_id: str
    title: str
    config: dict
    points: list[PointInfo]
    rows: list[PointRow] = field(default_factory=list)
    plots: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, caption, svg)
    knees: list[str] = field(
        default_factory=list
    )  # "sweep: knee at ..." per configuration sweep of the section

    @property
    def not_done(self) -> list[PointInfo]:
        return [p for p in self.points if p.status != "done"]


def summary_values(s: PointSummary) -> dict[str, float]:
    """The table's figures (COLUMNS and ENERGY_COLUMNS keys) as the point's summary.json holds them; NaN where it
    has none (no such values, no GPU measured)."""
    out = {}
    for key, _, name, _, _ in COLUMNS + ENERGY_COLUMNS:
        if name is None:
            continue
        if key in (e[0] for e in ENERGY_COLUMNS):
            v = (s.gpu or {}).get(key)
        else:
            field_name, stat = SUMMARY_AT[key]
            v = getattr(s, field_name)
            if stat is not None:
                v = None if v is None else getattr(v, stat)
        out[key] = math.nan if v is None else float(v)
    return out


def point_row(p: PointInfo, gpus: int | None = None) -> PointRow:
    """One done point's table row: its figures as its summary.json says them (the one place a point's figures
    are), totals also per GPU when `gpus` is known; its records give only what a summary does not hold, the ITL
    distribution its plot draws. A bare records file has no summary: its figures come from its records alone."""
    if p.records_file is not None:
        return _records_row(p, gpus)
    assert p.summary is not None  # a done point's, checked (runfolder.read_summary)
    summary = p.summary
    s = PointSummary.model_validate(summary)
    records = p.records_path
    deg = degradation(summary, records)
    return PointRow(
        info=p,
        values=with_per_gpu(summary_values(s), gpus),
        ok=s.requests.ok,
        failed=s.requests.failed,
        failures=dict(sorted(s.failures.items())),
        slos=list(summary.get("slos") or []),
        flags=([Flag("DEGRADED", deg.text)] if deg is not None else []) + kept_flags(p) + saturation_flags(p, s),
        itl=point_sample(p).pooled["itl"][0].tolist(),
        samples={key: stats.n for key, (f, st) in SUMMARY_AT.items() if st and (stats := getattr(s, f)) is not None},
        server_state=s.server_state,
        degraded=deg,
    )


def kept_flags(p: PointInfo) -> list[Flag]:
    """A point the planner would have dropped and the experiment kept (its manifest warning `kv_overflow: ...`,
    matrix/planner.py): the KV overflow badge with the planner's arithmetic."""
    mark = f"{KV_OVERFLOW}: "
    return [Flag("KV overflow", w[len(mark) :]) for w in p.warnings if w.startswith(mark)]


def server_state_value(state: dict | None, path: tuple[str, ...] | Callable) -> float | None:
    """A number of a point's server_state (None: not recorded, or the server does not have it); `path`: the keys
    to it, or a function of the whole server_state."""
    if callable(path):
        return path(state) if state is not None else None
    v = state
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def too_few_samples(state: dict | None) -> bool:
    """Whether a point's gauges rest on too few samples to describe its load (MIN_GAUGE_SAMPLES)."""
    n = server_state_value(state, ("samples",))
    return state is not None and (n is None or n < MIN_GAUGE_SAMPLES)


def _state_column_shown(c: StateColumn, states: list[dict | None]) -> bool:
    """Mamba usage only where some point has it; utilization only where some sample read more than 0 (SGLang up
    to 0.5.23 never sets it: a column of 0.00 would read as an idle server)."""
    if c[0] == "mamba_usage_max":
        return any(server_state_value(st, c[2]) is not None for st in states)
    if c[0] in UTILIZATION_COLUMNS:
        return any((server_state_value(st, ("gauges", "utilization", "max")) or 0) > 0 for st in states)
    return True


def server_state_table(sec: ConfigSection) -> tuple[list[tuple], list[tuple[PointRow, list[tuple]]]]:
    """The section's "Server state" table: its columns, and per row (key, shown text, raw value) per column.
    Empty when no point of the section has server_state. A point with too few samples shows FEW_SAMPLES in its
    gauge cells (too_few_samples)."""
    states = [r.server_state for r in sec.rows]
    if not any(states):
        return [], []
    cols = [
        *(c for c in SERVER_STATE_COLUMNS if _state_column_shown(c, states)),
        ("samples", "samples", ("samples",), 0),
    ]
    rows = []
    for r in sec.rows:
        few = too_few_samples(r.server_state)
        cells = []
        for key, _, path, dec in cols:
            v = server_state_value(r.server_state, path)
            if r.server_state is None:
                text = NO_STATE
            elif few and key in GAUGE_COLUMNS:
                text, v = FEW_SAMPLES, None
            else:
                text = fmt(v, dec) if v is not None else "-"
            cells.append((key, text, "" if v is None else repr(v)))
        rows.append((r, cells))
    return cols, rows


def utilization_note(sec: ConfigSection) -> str | None:
    """Why the utilization columns are left out, when they are."""
    cols, _ = server_state_table(sec)
    if not cols or any(c[0] in UTILIZATION_COLUMNS for c in cols):
        return None
    return (
        "utilization: left out, every sample read 0 (SGLang up to 0.5.23 never sets the cap it divides by)."
    )


def _records_row(p: PointInfo, gpus: int | None) -> PointRow:
    """The row of a bare records file (`locust ... --records r.parquet`: no summary.json), from its records."""
    from collections import Counter

    import pyarrow.parquet as pq

    s = point_sample(p)
    values = {key: metric(name).value(s) for key, _, name, _, _ in COLUMNS + ENERGY_COLUMNS if name}
    assert p.records_file is not None
    t = pq.read_table(p.records_file, columns=["warmup", "error_class"])
    classes = [
        e
        for e, w in zip(t.column("error_class").to_pylist(), t.column("warmup").to_pylist(), strict=True)
        if e is not None and not w
    ]
    samples = {
        key: int(s.sorted_values(metric(name).base)[0].size)
        for key, _, name, _, _ in COLUMNS
        if name and str(metric(name).stat).startswith("p")
    }
    return PointRow(
        info=p,
        values=with_per_gpu(values, gpus),
        ok=int(s.ok.sum()),
        failed=int((~s.ok).sum()),
        failures=dict(sorted(Counter(classes).items())),
        slos=[],
        flags=_client_flags(p, metric("schedule_lag_p99").value(s)),
        itl=s.pooled["itl"][0].tolist(),
        samples=samples,
    )


def _client_flags(p: PointInfo, lag_p99_ms: float | None) -> list[Flag]:
    """The load generator fell behind its schedule, or Locust warned of its CPU."""
    flags = []
    if lag_p99_ms is not None and math.isfinite(lag_p99_ms) and lag_p99_ms > LAG_FLAG_MS:
        flags.append(
            Flag(
                "sched lag",
                f"schedule lag p99 {lag_p99_ms:.1f} ms > {LAG_FLAG_MS:g} ms: the load generator fell behind",
            )
        )
    log = p.dir / "locust.log" if p.dir else None
    if log is not None and log.is_file():
        text = log.read_text(errors="replace")
        if re.search(r"CPU usage above \d+%", text):
            flags.append(Flag("Locust CPU", "Locust warned: load generator CPU above 90%"))
    return flags


def saturation_flags(p: PointInfo, s: PointSummary) -> list[Flag]:
    """Signs that the load generator, not the server, limited the point; or that the workload was not as asked."""
    flags = [reason_flag(str(r)) for r in s.client_headroom.reasons]
    flags += _client_flags(p, s.schedule_lag_ms.p99 if s.schedule_lag_ms is not None else None)
    dev = s.prompt_tokens.mean_deviation_pct
    if dev is not None and abs(dev) > PROMPT_DEV_FLAG_PCT:
        flags.append(Flag("prompt off", f"prompt tokens {dev:+.1f}% off target"))
    if gpu_text := throttle_flag(s.gpu):
        flags.append(Flag("GPU throttled", gpu_text))
    tf = s.trace_fidelity  # a trace replay's check (driver/point_run.py replay_fidelity)
    if tf and not tf.get("faithful", True):
        flags.append(Flag("replay off", str(tf.get("verdict"))))
    return flags


def constant_axes(sec: ConfigSection) -> dict[str, str]:
    """The workload and output length when every row of the section shares them ({'workload': 'workload chat'}):
    the HTML table names them once above it instead of a column each (it fits 1,400 px)."""
    out = {}
    if len({r.info.workload for r in sec.rows}) == 1:
        out["workload"] = f"workload {sec.rows[0].info.workload}"
    if len({r.info.output_tokens for r in sec.rows}) == 1:
        out["output"] = f"output {sec.rows[0].info.output_tokens} tokens"
    return out


def section_legend(sec: ConfigSection) -> list[tuple[str, str]]:
    """(badge, meaning) of every badge the section's table shows, in FLAG_LEGEND's order."""
    shown = {f.code for r in sec.rows for f in r.flags}
    return [(code, text) for code, text in FLAG_LEGEND.items() if code in shown]


def degraded_rows(rep_sections: list[ConfigSection]) -> list[PointRow]:
    """The report's degraded points, for the banner at its head."""
    return [r for sec in rep_sections for r in sec.rows if r.degraded is not None]


def _sections(run: Run) -> list[ConfigSection]:
    configs = run.configs
    order = list(configs) + [p.config_id for p in run.points if p.config_id not in configs]
    by_cfg: dict[str, list[PointInfo]] = defaultdict(list)
    for p in run.points:
        by_cfg[p.config_id].append(p)
    out = []
    for cid in dict.fromkeys(order):
        if cid not in by_cfg and cid not in configs:
            continue
        c = configs.get(cid) or {}
        if cid:
            flags = " ".join(
                f"{k}={v}" for k, v in {**(c.get("flags") or {}), **(c.get("env") or {})}.items()
            )
            title = f"{cid}" + (f" — {flags}" if flags else "")
        else:
            title = f"server {run.manifest.get('base_url', '')}".strip()
        pts = sorted(
            by_cfg.get(cid, []), key=lambda p: (p.workload, p.prompt_tokens, p.output_tokens, p.concurrency)
        )
        out.append(ConfigSection(cid, title, c, pts))
    return out


def _group_label(p: PointInfo, with_workload: bool, with_output: bool) -> str:
    parts = [f"prompt {p.prompt_tokens}"]
    if with_output:
        parts.append(f"out {p.output_tokens}")
    if with_workload:
        parts.insert(0, p.workload)
    return ", ".join(parts)


def _add_plots(run: Run, sec: ConfigSection) -> None:
    from servesweep.results import plots

    rows = sec.rows
    if not rows:
        return
    wl = len({r.info.workload for r in rows}) > 1
    outs = len({r.info.output_tokens for r in rows}) > 1
    name = sec.config_id or "server"
    thr: dict[str, list] = defaultdict(list)
    lt: dict[str, list] = defaultdict(list)
    for r in rows:
        g = _group_label(r.info, wl, outs)
        thr[g].append((r.info.concurrency, r.values["output_tokens_per_s"]))
        lt[g].append((r.values["output_tokens_per_s"], r.values["decode_tokens_per_s"], r.info.concurrency))
    sec.plots.append(
        (
            "throughput",
            f"{name}: aggregate output tokens/s by concurrency",
            plots.throughput_vs_concurrency(thr, f"{name}: throughput vs concurrency"),
        )
    )
    tt: dict[str, list] = defaultdict(list)
    for r in rows:
        g = (
            f"c{r.info.concurrency}"
            + (f" {r.info.workload}" if wl else "")
            + (f" o{r.info.output_tokens}" if outs else "")
        )
        p99_n = r.samples.get("ttft_p99", 0)
        tt[g].append((r.info.prompt_tokens, r.values["ttft_p50"], r.values["ttft_p99"], p99_n))
    sec.plots.append(
        (
            "ttft",
            f"{name}: TTFT p50 (solid) and p99 (dashed) by prompt length",
            plots.ttft_vs_prompt(tt, f"{name}: TTFT vs prompt length", SMALL_SAMPLE),
        )
    )
    sec.plots.append(
        (
            "tradeoff",
            f"{name}: per-request decode speed against aggregate throughput (cN: concurrency)",
            plots.latency_throughput(lt, f"{name}: latency–throughput trade-off"),
        )
    )
    energy: dict[str, list] = defaultdict(list)
    hot: list[tuple[float, float]] = []
    for r in rows:
        tpj = r.values.get("output_tokens_per_joule")
        ok = tpj is not None and math.isfinite(tpj)
        energy[_group_label(r.info, wl, outs)].append((r.info.concurrency, tpj if ok else None))
        if tpj is not None and ok and any(f.code == "GPU throttled" for f in r.flags):
            hot.append((float(r.info.concurrency), float(tpj)))
    if any(v is not None for pts in energy.values() for _, v in pts):
        sec.plots.append(
            (
                "energy",
                f"{name}: output tokens per joule of GPU energy by concurrency (gpu.json; ringed: a GPU throttled)",
                plots.tokens_per_joule_vs_concurrency(
                    energy, f"{name}: output tokens per joule vs concurrency", throttled=hot
                ),
            )
        )
    dist = {f"{_group_label(r.info, wl, outs)}, c{r.info.concurrency}": r.itl for r in rows if r.itl}
    if dist:
        sec.plots.append(
            (
                "itl",
                f"{name}: distribution of ITL per chunk, the gaps between token-bearing chunks (every gap of every "
                "successful request)",
                plots.itl_distribution(dist, f"{name}: ITL per chunk distribution", SMALL_SAMPLE),
            )
        )


@dataclass
class Report:
    run: Run
    sections: list[ConfigSection]
    overview_plots: list[tuple[str, str, str]]
    comparisons: list[RunComparison]
    capacity: dict | None = None  # the run's capacity.json, read once for both renderings
    decision: dict | None = None  # the run's decision.json (a decide: run, matrix/decision_run.py)
    answers: tuple[list, list] = ([], [])  # the needle and mismatch tables (answers_report.tables), read once
    needle_warnings: list[str] = field(default_factory=list)  # results/needle.py needle_warnings, at the head
    html: str = ""
    markdown: str = ""


def diagnose_section(sec: ConfigSection) -> None:
    """Each row's verdict and each sweep's saturation knee (results/diagnosis.py, from the points' summary.json)."""
    summaries = [r.info.summary or {"point": {}} for r in sec.rows]
    for r, d in zip(sec.rows, diagnose_all(summaries), strict=True):
        r.why = d
    sec.knees = [f"{config_label(k)}: {knee.text}" for k, knee in knees(summaries).items()]


def build_report(run: Run, baselines: list[Run] | None = None) -> Report:
    from servesweep.results import plots

    sections = _sections(run)
    for sec in sections:
        sec.rows = [
            point_row(p, point_gpus(p.summary, p.config_id, run.manifest))
            for p in sec.points
            if p.status == "done"
        ]
        _add_plots(run, sec)
        diagnose_section(sec)
    overview = []
    if len([s for s in sections if s.rows]) > 1:
        series: dict[str, list] = defaultdict(list)
        for sec in sections:
            for r in sec.rows:
                series[f"{sec.config_id} p{r.info.prompt_tokens} o{r.info.output_tokens}"].append(
                    (r.info.concurrency, r.values["output_tokens_per_s"])
                )
        overview.append(
            (
                "throughput-all",
                "aggregate output tokens/s by concurrency, every configuration",
                plots.throughput_vs_concurrency(series, "throughput vs concurrency per configuration"),
            )
        )
    tpj: dict[str, list] = defaultdict(list)
    hot: list[tuple[float, float]] = []
    for sec in sections:  # a power-limit axis: one line per limit (configuration)
        for r in sec.rows:
            v = r.values.get("output_tokens_per_joule")
            if v is not None and math.isfinite(v):
                tpj[f"{sec.config_id} p{r.info.prompt_tokens} o{r.info.output_tokens}"].append(
                    (r.info.concurrency, v)
                )
                if any(f.code == "GPU throttled" for f in r.flags):
                    hot.append((float(r.info.concurrency), float(v)))
    if len([s for s in sections if s.rows]) > 1 and tpj:
        overview.append(
            (
                "energy-all",
                "output tokens per joule of GPU energy by concurrency, every configuration (ringed: a GPU throttled)",
                plots.tokens_per_joule_vs_concurrency(
                    tpj, "output tokens per joule vs concurrency per configuration", throttled=hot
                ),
            )
        )
    est = [
        (p.point_id, p.est_s, p.actual_s)
        for p in run.points
        if p.status == "done" and p.est_s is not None and p.actual_s is not None
    ]
    if est:
        overview.append(
            (
                "estimate",
                "the planner's time estimate against the measured time per point",
                plots.estimate_vs_actual(est, "planner estimate vs actual time"),
            )
        )
    cap = load_capacity(run.path) if run.kind != "records" else None
    if cap and cap["frontier"]:
        text = "throughput per GPU against per-user output speed at every probe; the Pareto frontier drawn"
        overview.insert(0, ("frontier", text, frontier_svg(cap)))
    comps = [compare_runs(b, run) for b in baselines or []]
    rep = Report(run, sections, overview, comps, capacity=cap, answers=answers_tables(run))
    rep.decision = load_decision(run.path) if run.kind != "records" else None
    if getattr(run, "kind", None) != "records":  # a records file has no probes
        from servesweep.results.needle import needle_warnings, read_probes

        rep.needle_warnings = needle_warnings(read_probes(run.path))
    rep.html = render_html(rep)
    rep.markdown = render_markdown(rep)
    return rep


# ---------------------------------------------------------------- formatting shared by HTML and Markdown


def fmt(x, decimals: int = 1, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x * 100:.{decimals}f}" if pct else f"{x:,.{decimals}f}"


def fmt_s(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def _failures_text(r: PointRow) -> str:
    return ", ".join(f"{k}={v}" for k, v in r.failures.items()) or "0"


def _small_rows(sec: ConfigSection) -> bool:
    """Whether any percentile of the section rests on fewer than SMALL_SAMPLE values (its tables get a note)."""
    return any(r.few(key) is not None for r in sec.rows for key in r.samples)


SMALL_NOTE = (
    f"n=…: a percentile from fewer than {SMALL_SAMPLE} values (requests for TTFT, TPOT and E2E; gaps for ITL per chunk, "
    "tokens for ITL per token), "
    "so its tail is not measured: a p99 of 4 requests is their largest value."
)


def _cell(r: PointRow, key: str, decimals: int, unit: str) -> str:
    """A Markdown table cell: the value, with its sample count when a percentile rests on few values."""
    few = r.few(key)
    return fmt(r.values[key], decimals, pct=(unit == "%")) + (f" (n={few})" if few is not None else "")


def _slo_text(r: PointRow) -> str:
    if not r.slos:
        return "-"
    bad = [s["slo"] for s in r.slos if not s.get("pass")]
    return "pass" if not bad else "breach: " + ", ".join(bad)


def _run_facts(run: Run) -> list[tuple[str, str]]:
    m = run.manifest
    exp = m.get("experiment") or {}
    plan = m.get("plan") or {}
    facts = [
        ("run", run.run_id),
        ("kind", KINDS[run.kind]),
    ]
    if m.get("status"):
        facts.append(("status", str(m["status"])))
    if exp.get("name"):
        facts.append(("experiment", exp["name"]))
    model = (exp.get("model") or {}).get("path") or plan.get("model")
    if model:
        facts.append(("model", model))
    if plan.get("gpu"):
        facts.append(("GPU profile", str(plan["gpu"]) + (" (emulator)" if plan.get("emulator") else "")))
    if exp.get("sglang_version"):
        facts.append(("SGLang version", exp["sglang_version"]))
    if m.get("base_url"):
        facts.append(("server", m["base_url"]))
    for k in ("created", "updated"):
        if m.get(k):
            facts.append((k, m[k]))
    if m.get("git_rev"):
        facts.append(("servesweep revision", m["git_rev"]))
    counts: dict[str, int] = defaultdict(int)
    for p in run.points:
        counts[p.status] += 1
    facts.append(("points", ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))))
    if plan.get("total_s") is not None:
        facts.append(("planner estimate", fmt_s(plan["total_s"])))
    actual = _elapsed(m)
    if actual is not None:
        facts.append(("actual wall time", fmt_s(actual)))
    return facts


def _elapsed(m: dict) -> float | None:
    return secs_between(m.get("created"), m.get("updated"))


def _resolved(cfg: dict) -> tuple[list[tuple[str, str, str]], dict]:
    """(key, asked, resolved) rows for the flags that matter, and the raw server record."""
    server = cfg.get("server") or {}
    info = server.get("server_info") or {}
    asked = cfg.get("flags") or {}
    rows = []
    for k in dict.fromkeys([*asked, *RESOLVED_KEYS]):
        if k in asked or info.get(k) is not None:
            rows.append((k, "-" if k not in asked else str(asked[k]), "-" if k not in info else str(info[k])))
    return rows, server


# ---------------------------------------------------------------- HTML


def render_html(rep: Report) -> str:
    from servesweep.results.templates import render

    run = rep.run
    body = render(
        "report_body.html.j2",
        run=run,
        degraded=degraded_rows(rep.sections),
        needle_warnings=rep.needle_warnings,
        section_legend=section_legend,
        constant_axes=constant_axes,
        facts=_run_facts(run),
        decision=rep.decision,
        sections=rep.sections,
        overview=rep.overview_plots,
        columns=report_columns(rep.sections),
        fmt=fmt,
        fmt_s=fmt_s,
        failures_text=_failures_text,
        slo_text=_slo_text,
        small_rows=_small_rows,
        small_note=SMALL_NOTE,
        resolved=_resolved,
        pivot=_pivot,
        server_state_table=server_state_table,
        server_state_note=SERVER_STATE_NOTE,
        utilization_note=utilization_note,
        few_samples=FEW_SAMPLES,
        gauge_columns=GAUGE_COLUMNS,
        no_state=NO_STATE,
        events=(run.manifest.get("events") or [])[-50:],
        comparison=compare_html_section(rep.comparisons) if rep.comparisons else "",
        answers=answers_html(rep.answers)
        + isolation_html(run.manifest),  # the isolation sample of a packed run
    )
    banner = (
        "DRY RUN — the emulator on this machine with shrunk points: these numbers check the matrix, "
        "they do not describe a real server"
        if run.dry_run
        else None
    )
    return render("page.html.j2", title=f"servesweep report {run.run_id}", banner=banner, body=body)


def _pivot(sec: ConfigSection) -> tuple[list[tuple], list[int], dict]:
    """By prompt length: rows (workload, output, concurrency), columns prompt lengths, cells (tok/s, TTFT p50)."""
    prompts = sorted({r.info.prompt_tokens for r in sec.rows})
    cells = {}
    keys = []
    for r in sec.rows:
        k = (r.info.workload, r.info.output_tokens, r.info.concurrency)
        if k not in keys:
            keys.append(k)
        cells[(k, r.info.prompt_tokens)] = r
    return sorted(keys), prompts, cells


# ---------------------------------------------------------------- Markdown


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _md_points(sec: ConfigSection, columns: tuple = COLUMNS) -> list[str]:
    header = [
        "workload",
        "prompt",
        "output",
        "concurrency",
        *[c[1] for c in columns],
        "ok",
        "failures",
        "SLO",
        "flags",
    ]
    rows = [
        [
            r.info.workload,
            str(r.info.prompt_tokens),
            str(r.info.output_tokens),
            str(r.info.concurrency),
            *[_cell(r, k, d, u) for k, _, _, u, d in columns],
            str(r.ok),
            _failures_text(r),
            _slo_text(r),
            "; ".join(f"{f.code}: {f.text}" for f in r.flags) or "-",
        ]
        for r in sec.rows
    ]
    return [_md_table(header, rows), ""] + ([SMALL_NOTE, ""] if _small_rows(sec) else [])


def _md_by_prompt(sec: ConfigSection) -> list[str]:
    """Output tok/s and TTFT p50 with prompt lengths as columns; nothing when the section has one prompt length."""
    keys, prompts, cells = _pivot(sec)
    if len(prompts) < 2:
        return []

    def cell(k: tuple, pl: int) -> str:
        r = cells.get((k, pl))
        return "-" if r is None else f"{fmt(r.values['output_tokens_per_s'])} / {fmt(r.values['ttft_p50'])}"

    rows = [[k[0], str(k[1]), str(k[2]), *(cell(k, pl) for pl in prompts)] for k in keys]
    header = ["workload", "output", "concurrency", *[f"prompt {pl}" for pl in prompts]]
    return ["By prompt length (output tok/s / TTFT p50 ms):", "", _md_table(header, rows), ""]


def _md_server_state(sec: ConfigSection) -> list[str]:
    """The section's "Server state" table; a line saying none was recorded when no point has it."""
    cols, rows = server_state_table(sec)
    if not cols:
        return [f"Server state: {NO_STATE} (not recorded for these points).", ""]
    header = ["workload", "prompt", "output", "concurrency", *[c[1] for c in cols]]
    body = [
        [r.info.workload, str(r.info.prompt_tokens), str(r.info.output_tokens), str(r.info.concurrency)]
        + [text for _, text, _ in cells]
        for r, cells in rows
    ]
    note = utilization_note(sec)
    return [
        "### Server state",
        "",
        _md_table(header, body),
        "",
        *([note, ""] if note else []),
        SERVER_STATE_NOTE,
        "",
    ]


def _md_diagnosis(sec: ConfigSection) -> list[str]:
    """The section's "Diagnosis": each point's ranked causes, then each sweep's saturation knee."""
    header = ["workload", "prompt", "output", "concurrency", "why"]
    rows = [
        [
            r.info.workload,
            str(r.info.prompt_tokens),
            str(r.info.output_tokens),
            str(r.info.concurrency),
            r.why.line,
        ]
        for r in sec.rows
        if r.why is not None
    ]
    knees_md = [f"- saturation, {k}" for k in sec.knees]
    return ["### Diagnosis", "", _md_table(header, rows), "", *knees_md, *([""] if knees_md else [])]


def _md_replay(sec: ConfigSection) -> list[str]:
    """The section's "Trace replay": each replayed point's fidelity verdict (docs/workloads.md, "Trace replay")."""
    rows = [
        [r.info.point_id, str((r.info.summary or {})["trace_fidelity"].get("verdict"))]
        for r in sec.rows
        if (r.info.summary or {}).get("trace_fidelity")
    ]
    return ["### Trace replay", "", _md_table(["point", "fidelity"], rows), ""] if rows else []


def _md_section(sec: ConfigSection, columns: tuple = COLUMNS) -> list[str]:
    out = [f"## {sec.title}", ""]
    if sec.rows:
        out += (
            _md_points(sec, columns)
            + _md_by_prompt(sec)
            + _md_replay(sec)
            + _md_server_state(sec)
            + _md_diagnosis(sec)
        )
    if sec.not_done:
        rows = [[p.point_id, p.status, p.reason or "-"] for p in sec.not_done]
        out += ["Points not measured:", "", _md_table(["point", "status", "reason"], rows), ""]
    return out


def _md_comparison(rc: RunComparison) -> list[str]:
    rows = [
        [
            pc.label,
            c.metric.label,
            fmt_value(c.a, c.metric.unit),
            fmt_value(c.b, c.metric.unit),
            fmt_change(c),
            fmt_ci(c),
            c.verdict,
        ]
        for pc in rc.points
        for c in pc.changes
    ]
    header = ["point", "metric", "baseline", "run", "change", "interval", "verdict"]
    return [f"## Comparison with baseline {rc.a.run_id}", "", _md_table(header, rows), ""]


def _md_degraded(rep: Report) -> list[str]:
    """The warning at the head of the Markdown: each degraded point and what happened."""
    rows = degraded_rows(rep.sections)
    if not rows:
        return []
    out = [
        f"> **{len(rows)} point(s) DEGRADED**: measured at a lower load than asked (a Locust worker was lost), so "
        "their figures describe another load than their label says; `servesweep gate` fails them (exit 2) unless "
        "`--allow-degraded`.",
        ">",
    ]
    out += [f"> - **{r.info.point_id}**: {r.degraded.text}" for r in rows if r.degraded is not None]
    return [*out, ""]


def load_decision(path: Path) -> dict | None:
    """A decide run's decision.json (the anytime answer after its last probe), None when the run has none."""
    f = Path(path) / "decision.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def decision_markdown(d: dict) -> list[str]:
    """The Decision section: the answer's label, then per (shape, tier) its state, best configuration and value."""
    out = ["## Decision", "", f"**{d['label']}**", ""]
    budget = f" (budget {fmt_s(d['budget_s'])})" if d.get("budget_s") else ""
    out += [
        f"{d['probes']} probes, {d['gpu_seconds']:.0f} GPU-s, {fmt_s(d['elapsed_s'])}{budget}; value: output tok/s "
        f"per GPU at the tier's capacity, {d['confidence']:.0%} per interval, ties within {d['resolution']:.0%}.",
        "",
    ]
    rows = []
    for q in d["questions"]:
        v = q.get("value") or {}
        rows.append(
            [
                q["shape"],
                q["tier"],
                ", ".join(q["slos"]),
                q["state"],
                q["best"] or "-",
                f"{fmt(v.get('low'))} / {fmt(v.get('estimate'))} / {fmt(v.get('high'))}" if v else "-",
                " - ".join(str(x) for x in v.get("bracket", [])) if v else "-",
                ", ".join(q["dropped"]) or "-",
            ]
        )
    header = [
        "shape",
        "tier",
        "SLOs",
        "state",
        "best",
        "low / estimate / high",
        "capacity bracket",
        "raced out",
    ]
    return out + [_md_table(header, rows), ""]


def render_markdown(rep: Report) -> str:
    run = rep.run
    out = [f"# servesweep report: {run.run_id}", ""]
    if run.dry_run:
        out += [
            "> **DRY RUN** — the emulator on this machine with shrunk points; no real server was measured.",
            "",
        ]
    out += _md_degraded(rep)
    out += [f"> **{w}**" for w in rep.needle_warnings] + ([""] if rep.needle_warnings else [])
    out += [f"- **{k}**: {v}" for k, v in _run_facts(run)]
    out.append("")
    if rep.decision:
        out += decision_markdown(rep.decision)
    if rep.capacity:
        out += capacity_markdown(rep.capacity)
    columns = report_columns(rep.sections)
    for sec in rep.sections:
        out += _md_section(sec, columns)
    out += answers_markdown(rep.answers)
    out += isolation_markdown(run.manifest)
    est = [p for p in run.points if p.est_s is not None and p.status == "done"]
    if est:
        rows = [[p.point_id, fmt_s(p.est_s), fmt_s(p.actual_s)] for p in est]
        out += ["## Planner estimate vs actual", "", _md_table(["point", "estimate", "actual"], rows), ""]
    for rc in rep.comparisons:
        out += _md_comparison(rc)
    out += ["", f"Full report with plots: {HTML_NAME}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- command


def write_report(
    run_dir: str | Path,
    baselines: list[str | Path] | None = None,
    html_path: Path | None = None,
    md_path: Path | None = None,
) -> tuple[Path, Path]:
    run = load_run(run_dir)
    rep = build_report(run, [load_run(b) for b in baselines or []])
    # next to a bare records file (r.parquet -> r.report.html), else inside the run folder
    here = (
        (lambda name: run.path.with_suffix("." + name))
        if run.kind == "records"
        else (lambda name: run.path / name)
    )
    html_path = Path(html_path) if html_path else here(HTML_NAME)
    md_path = Path(md_path) if md_path else here(MD_NAME)
    write_atomic(html_path, rep.html, mode=0o666)  # reports are for reading (mkstemp makes files private)
    # the Markdown names the HTML file as written (r.report.html next to a records file, or another --html)
    link = os.path.relpath(html_path, md_path.parent)
    markdown = rep.markdown.replace(
        f"Full report with plots: {HTML_NAME}", f"Full report with plots: [{link}]({link})"
    )
    write_atomic(md_path, markdown, mode=0o666)
    return html_path, md_path
