"""Summaries of one point from its per-request records. Every definition is in docs/metrics.md.

Percentiles are exact, from the raw values (numpy, linear interpolation between order statistics), never from
histogram buckets. No Locust import.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import ClassVar, Final, Literal

import numpy as np
import pyarrow as pa

from servesweep.config.slo import SLO, parse_slos
from servesweep.results import metrics
from servesweep.results.degraded import in_flight
from servesweep.results.diagnosis import record_evidence
from servesweep.results.records import ERROR_CLASSES
from servesweep.results.schema import Strict, VersionedFile

_NS_PER_MS = metrics.NS_PER_MS


def stats(values) -> dict | None:
    """p50/p90/p95/p99/mean/min/max/n of raw values; None when there are none."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return None
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "n": int(a.size),
    }


# ---------------------------------------------------------------- SLOs


def check_slos(summary: dict) -> dict:
    """The verdict of the SLOs a summary was made with: each one's measured value and whether it held."""
    checks = list(summary.get("slos", []))
    return {"pass": all(c["pass"] for c in checks), "checks": checks}


def _slo_value(slo: SLO, summary: dict) -> float | None:
    """The summary's figure an aggregate SLO judges: a latency statistic, goodput, or a scalar of the same name."""
    m = slo.metric
    if m.stat is not None:
        st = summary.get(m.base + ("_ms" if m.unit == "ms" else ""))
        return None if st is None else st[m.stat]
    if slo.goodput:
        g = summary.get("goodput")
        return None if g is None else g["ratio" if m.base == "goodput_ratio" else "per_s"]
    return summary.get(m.base)


# ---------------------------------------------------------------- arrivals and client headroom


def _arrivals(m: pa.Table) -> dict | None:
    """The measured requests' schedule. `rate_rps`: the achieved arrival rate, summed over the load-generating
    processes of each one's (n - 1) / (last slot - first slot): every process runs its own share of the rate from
    its own start, so one span over all of them would count their start offsets and the latest end as gaps.
    `interarrival_cv`: std / mean of the gaps between consecutive slots of all processes together (about 1 for
    Poisson arrivals, 0 for a constant rate)."""
    if m.num_rows < 2:
        return None
    sched = _col(m, "scheduled_ns")
    workers = np.asarray(m.column("worker").to_pylist(), dtype=object)
    names = set(workers.tolist())
    rate = 0.0
    for w in names:
        t = np.sort(sched[workers == w])
        if len(t) >= 2 and t[-1] > t[0]:
            rate += (len(t) - 1) / ((t[-1] - t[0]) / 1e9)
    gaps = np.diff(np.sort(sched)) / 1e9
    mean = float(gaps.mean())
    return {
        "rate_rps": rate or None,
        "interarrival_cv": float(gaps.std() / mean) if mean > 0 else None,
        "n": int(m.num_rows),
        "processes": len(names),
    }


CPU_SATURATED_PCT = 90.0  # a process near one full core cannot take its stamps on time
LOOP_LAG_SATURATED_MS = 20.0  # p99 of how late a 50 ms sleep wakes up: a stamp can be this late as well
# With kernel receive stamps a late read does not make a stamp late; it merges chunks once the reader falls a
# whole chunk gap behind (they then share one stamp: ITL gaps of exactly 0). Flag the client when more than this
# share of the ITL gaps were merged: past it the ITL percentiles themselves move.
MERGED_GAPS_SATURATED_SHARE = 0.01


CLIENTS_JSON: Final = "clients.json"


class ClientEntry(Strict):
    """One load-generating process as the master (or a local runner, of itself) knew it at the end: its counters,
    CPU time, every event-loop lag sample, the last state Locust gave it (`missing`: its heartbeats stopped)."""

    client_id: str
    lags_ms: list[float]
    cpu_pct_max: float
    worker: str | None = None  # host:pid; the master's is "master host:pid"
    pid: int | None = None
    role: str | None = None  # local, master; absent: a worker
    issued: int | None = None
    completed: int | None = None
    failed: int | None = None
    cpu_s: float | None = None
    wall_s: float | None = None
    shipped: int = 0
    last_state: str | None = None
    missing: bool = False


class ClientsFile(VersionedFile):
    """clients.json, beside a point's records (client/clients.py `Clients.write`; read by driver/point_run.py into
    summary.json's client_headroom and workers), schema_version 1. A file without schema_version is the format
    before the model, the same keys."""

    WHAT: ClassVar[str] = "clients file (clients.json)"

    schema_version: Literal[1] = 1
    clients: list[ClientEntry]
    worker_exits: dict[int, int] = {}  # forked local worker pid -> exit status (a signal N as 128 + N)


def client_headroom(
    clients: list[ClientEntry], records: pa.Table | None = None, itl_zero_gap_share: float | None = None
) -> dict:
    """Per load-generating process (clients.json): CPU use over the point (process CPU time / wall time, % of one
    core) and its busiest 3-s window, and event-loop lag percentiles; `client_saturated` with the reasons when a
    process passed CPU_SATURATED_PCT or its lag p99 passed LOOP_LAG_SATURATED_MS (or, with kernel receive stamps
    in the records, more than MERGED_GAPS_SATURATED_SHARE of the ITL gaps were chunks read together): then the
    client, not the server, may have set the numbers. The read lag's percentiles are reported beside."""
    rows, reasons = [], []
    for c in sorted(clients, key=lambda c: str(c.worker or c.client_id)):
        wall = c.wall_s or 0.0
        cpu = 100.0 * c.cpu_s / wall if wall > 0 and c.cpu_s is not None else None
        lag = stats(c.lags_ms)
        row = {
            "worker": c.worker,
            "role": c.role or "worker",  # worker, local (one process) or master (merges, sends nothing)
            "client_id": c.client_id,
            "cpu_pct": cpu,
            "cpu_pct_max_3s": c.cpu_pct_max
            if wall >= 3.0
            else None,  # no full window in a short point
            "loop_lag_p50_ms": lag["p50"] if lag else None,
            "loop_lag_p99_ms": lag["p99"] if lag else None,
            "loop_lag_max_ms": lag["max"] if lag else None,
            "wall_s": wall or None,
        }
        rows.append(row)
        name = c.worker or c.client_id
        if cpu is not None and cpu > CPU_SATURATED_PCT:
            reasons.append(f"{name}: CPU {cpu:.0f}% of a core > {CPU_SATURATED_PCT:g}%")
        # The master stamps nothing: its loop lag delays no measurement (its CPU does: records pile up).
        lag_p99 = lag["p99"] if lag else None
        if c.role != "master" and lag_p99 is not None and lag_p99 > LOOP_LAG_SATURATED_MS:
            reasons.append(f"{name}: event-loop lag p99 {lag_p99:.1f} ms > {LOOP_LAG_SATURATED_MS:g} ms")
    read_lag = _read_lag_ms(records)
    if (
        read_lag is not None
        and itl_zero_gap_share is not None
        and itl_zero_gap_share > MERGED_GAPS_SATURATED_SHARE
    ):
        reasons.append(
            f"{itl_zero_gap_share:.1%} of ITL gaps are chunks read together (> {MERGED_GAPS_SATURATED_SHARE:.0%}; "
            f"read lag p99 {read_lag['p99']:.1f} ms)"
        )
    master = next((r for r in rows if r["role"] == "master"), None)
    return {
        "workers": [r for r in rows if r["role"] != "master"],
        "master": master,
        "read_lag_ms": read_lag,
        "client_saturated": bool(reasons),
        "reasons": reasons,
        "limits": {
            "cpu_pct": CPU_SATURATED_PCT,
            "loop_lag_p99_ms": LOOP_LAG_SATURATED_MS,
            "merged_itl_gaps_share": MERGED_GAPS_SATURATED_SHARE,
        },
    }


def _rx_clocks(t: pa.Table) -> dict[str, int]:
    """How many records' stamps came from the kernel ('kernel') or user space ('user'); 'unknown' where unset."""
    return dict(Counter(v or "unknown" for v in t.column("rx_clock").to_pylist()))


def _read_lag_ms(records: pa.Table | None) -> dict | None:
    """The records' per-request read lag (user-space stamp minus kernel receive stamp) where the user recorded it."""
    if records is None:
        return None
    v = _col(records, "read_lag_ns") / _NS_PER_MS
    return stats(v[~np.isnan(v)])


# ---------------------------------------------------------------- the summary


def _col(t: pa.Table, name: str) -> np.ndarray:
    """A nullable integer column as float64 with NaN for nulls (ns fit exactly below 2**53 for days of uptime)."""
    return t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def _reasoning(ok: pa.Table, sent: np.ndarray) -> dict:
    """Reasoning models: time to the first reasoning and the first answer chunk, and the reasoning tokens."""
    fr = _col(ok, "first_reasoning_ns")
    fa = _col(ok, "first_answer_ns")
    rt = _col(ok, "reasoning_tokens")
    return {
        "time_to_first_reasoning_ms": stats(((fr - sent) / _NS_PER_MS)[~np.isnan(fr)]),
        "time_to_first_answer_ms": stats(((fa - sent) / _NS_PER_MS)[~np.isnan(fa)]),
        "reasoning_tokens": stats(rt[~np.isnan(rt)]),
    }


def _sessions(ok: pa.Table, measured: pa.Table, window_s: float) -> dict | None:
    """Agent sessions: per turn (TTFT, prompt and cached tokens) and per session (turns, time to finish)."""
    if measured.column("session_id").null_count == measured.num_rows:
        return None
    sid_all = measured.column("session_id").to_pylist()
    sid = ok.column("session_id").to_pylist()
    turn = _col(ok, "turn")
    sent, first, end = _col(ok, "sent_ns"), _col(ok, "first_token_ns"), _col(ok, "end_ns")
    prompt, cached = _col(ok, "prompt_tokens"), _col(ok, "cached_tokens")
    per_turn = []
    for k in sorted({int(x) for x in turn[~np.isnan(turn)]}):
        sel = turn == k
        p, c = prompt[sel], cached[sel]
        has = ~np.isnan(p) & ~np.isnan(c)
        ttft = stats(metrics.ttft(first[sel], sent[sel]))
        per_turn.append(
            {
                "turn": k,
                "requests": int(sel.sum()),
                "ttft_ms_p50": ttft["p50"] if ttft else None,
                "ttft_ms_p99": ttft["p99"] if ttft else None,
                "prompt_tokens_mean": float(np.nanmean(p)) if (~np.isnan(p)).any() else None,
                "cached_tokens_mean": float(np.nanmean(c)) if (~np.isnan(c)).any() else None,
                "cache_hit_ratio": float(c[has].sum() / p[has].sum())
                if has.any() and p[has].sum() > 0
                else None,
            }
        )
    spans: dict[str, list[float]] = {}
    for i, s in enumerate(sid):
        if s is None:
            continue
        a = spans.setdefault(s, [sent[i], end[i], 0])
        a[0], a[1], a[2] = min(a[0], sent[i]), max(a[1], end[i]), a[2] + 1
    failed = {s for s, e in zip(sid_all, measured.column("error_class").to_pylist(), strict=True) if e and s}
    done = [v for s, v in spans.items() if s not in failed]
    return {
        "sessions": len(set(filter(None, sid_all))),
        "failed_sessions": len(failed),
        "turns_per_session": stats([v[2] for v in done]),
        "session_duration_ms": stats([(v[1] - v[0]) / _NS_PER_MS for v in done]),
        "turns_per_s": len(sid) / window_s if window_s == window_s and window_s > 0 else None,
        "per_turn": per_turn,
    }


def _split(table: pa.Table) -> tuple[np.ndarray, pa.Table, pa.Table, dict[str, int]]:
    """(warmup mask, measured requests, ok requests, failures by class) of one point's records."""
    warm = (
        table.column("warmup").to_numpy(zero_copy_only=False).astype(bool)
        if table.num_rows
        else np.zeros(0, bool)
    )
    m = table.filter(pa.array(~warm)) if table.num_rows else table
    err = m.column("error_class").to_pylist()
    ok_mask = np.array([e is None for e in err], dtype=bool)
    ok = m.filter(pa.array(ok_mask)) if m.num_rows else m
    failures = {c: 0 for c in ERROR_CLASSES}
    for e in err:
        if e is not None:
            failures[e] = failures.get(e, 0) + 1
    return warm, m, ok, failures


def _window(m: pa.Table) -> tuple[float, float, float]:
    """The measurement window (w0, w1, window_s): from the first measured request's schedule to the last measured
    request's end."""
    if not m.num_rows:
        return math.nan, math.nan, math.nan
    w0 = float(np.nanmin(_col(m, "scheduled_ns")))
    w1 = float(np.nanmax(_col(m, "end_ns")))
    return w0, w1, max((w1 - w0) / 1e9, 1e-9)


def _latencies(ok: pa.Table, m: pa.Table, rm: metrics.RequestMetrics) -> dict:
    """The latency statistics of the ok requests (schedule lag: of every measured request)."""
    itl = rm.itl_ms
    tpot_v = rm.tpot_ms[~np.isnan(rm.tpot_ms)]
    return {
        "ttft_ms": stats(rm.ttft_ms),
        "ttft_from_scheduled_ms": stats(rm.ttft_from_scheduled_ms),
        "itl_ms": stats(itl),
        "itl_per_token_ms": stats(rm.itl_per_token_ms),
        # gaps of exactly 0: chunks read together and stamped by one kernel receive time (a client a gap behind)
        "itl_zero_gap_share": float(np.mean(itl == 0.0)) if itl.size else None,
        "rx_clock": _rx_clocks(ok),
        "tpot_ms": stats(tpot_v),
        "e2e_ms": stats(rm.e2e_ms),
        "e2e_from_scheduled_ms": stats(rm.e2e_from_scheduled_ms),
        "decode_tokens_per_s": stats(metrics.decode_tokens_per_s(tpot_v[tpot_v > 0])),
        "schedule_lag_ms": stats(metrics.schedule_lag(_col(m, "sent_ns"), _col(m, "scheduled_ns"))),
    }


def _tokens(ok: pa.Table) -> dict:
    """Prompt-token accuracy, completion-token statistics and the cache hit ratio of the ok requests."""
    completion = _col(ok, "completion_tokens")
    prompt = _col(ok, "prompt_tokens")
    cached = _col(ok, "cached_tokens")
    target_prompt = _col(ok, "target_prompt_tokens")
    has_usage = ~np.isnan(prompt)
    sized = has_usage & (target_prompt > 0)  # agent turns after the first have no target length
    dev_pct = (prompt[sized] - target_prompt[sized]) / target_prompt[sized] * 100.0
    has_cache = ~np.isnan(cached) & has_usage
    return {
        "prompt_tokens": {
            "target": float(target_prompt[0]) if ok.num_rows and target_prompt[0] > 0 else None,
            "mean": float(prompt[has_usage].mean()) if has_usage.any() else None,
            "mean_deviation_pct": float(dev_pct.mean()) if dev_pct.size else None,
            "max_abs_deviation_pct": float(np.abs(dev_pct).max()) if dev_pct.size else None,
            "reported": int(has_usage.sum()),
        },
        "completion_tokens": stats(completion[~np.isnan(completion)]),
        "cache_hit_ratio": float(cached[has_cache].sum() / prompt[has_cache].sum())
        if has_cache.any() and prompt[has_cache].sum() > 0
        else None,
    }


def _goodput(slos: list[SLO], rm: metrics.RequestMetrics, n_meas: int, window_s: float) -> dict | None:
    """Goodput under the per-request SLOs (those without a STAT); None without any."""
    per_request = [s for s in slos if s.per_request]
    if not per_request or not n_meas:
        return None
    ok = np.ones(rm.ttft_ms.size, dtype=bool)
    good = metrics.good_requests(
        rm.per_request_slo_values(), ok, [(s.name, s.op, s.value) for s in per_request]
    )
    n_good, ratio, per_s = metrics.goodput(good, n_meas, window_s)
    return {"slos": [s.text for s in per_request], "requests": n_good, "ratio": ratio, "per_s": per_s}


def _slo_checks(slos: list[SLO], summary: dict) -> list[dict]:
    """Each aggregate SLO's measured value and whether it held. Per-request SLOs shape goodput instead."""
    out = []
    for s in slos:
        if s.per_request:
            continue
        v = _slo_value(s, summary)
        out.append({"slo": s.text, "value": v, "pass": v is not None and s.holds(v)})
    return out


def summarize(table: pa.Table, slos: list[SLO] | str | None = None, answers: dict | None = None) -> dict:
    """Everything docs/metrics.md defines, for one point's records (per-request metrics: servesweep.results.metrics).
    `answers`: the parent's degeneration figures (results/degeneration.py), judged by the SLOs like the rest."""
    if isinstance(slos, str):
        slos = parse_slos(slos)
    slos = slos or []
    warm, m, ok, failures = _split(table)
    n_meas, n_ok = m.num_rows, ok.num_rows
    n_fail = n_meas - n_ok
    w0, w1, window_s = _window(m)
    rm = metrics.request_metrics(ok)
    completion = _col(ok, "completion_tokens")
    comp_ok = completion[~np.isnan(completion)]
    out_tokens = float(comp_ok.sum()) if comp_ok.size else 0.0
    summary = {
        "requests": {
            "total": table.num_rows,
            "warmup": int(warm.sum()),
            "measured": n_meas,
            "ok": n_ok,
            "failed": n_fail,
        },
        "window_s": window_s,
        "window_ns": [w0, w1],
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / window_s if n_meas else None,
        "request_rate": n_ok / window_s if n_meas else None,
        "error_rate": n_fail / n_meas if n_meas else None,
        "failures": {k: v for k, v in failures.items() if v},
        **_latencies(ok, m, rm),
        "arrivals": _arrivals(m),
        # the concurrency the records held (time-weighted): a lost worker's users are missing from it
        "in_flight": in_flight(_col(m, "sent_ns"), _col(m, "end_ns")) if m.num_rows else None,
        # what results/diagnosis.py needs of the records (in-flight levels, ITL spikes and prefills): the verdict
        # itself is computed by each surface from summary.json, never stored
        "diagnosis_evidence": record_evidence(table, w0, w1),
        **_tokens(ok),
        "goodput": _goodput(slos, rm, n_meas, window_s),
        "slos": [],
    }
    summary.update(_reasoning(ok, _col(ok, "sent_ns")))
    summary["sessions"] = _sessions(ok, m, window_s)
    summary.update(answers or {})
    summary["slos"] = _slo_checks(slos, summary)
    return summary
