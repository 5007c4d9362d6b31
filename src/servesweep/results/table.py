"""The console table of a sweep's points: `servesweep load`'s result table and the notes under it (also drawn by
the web UI's step ramp at the end of a run)."""

from __future__ import annotations

from servesweep.results.degeneration import degenerate_cell, degeneration_warning
from servesweep.results.degraded import degradation
from servesweep.results.diagnosis import breached, config_label, diagnose_all, knees


def _fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def _p(summary: dict, metric: str, q: str) -> float | None:
    st = summary.get(metric)
    return None if st is None else st[q]


def results_table(summaries: list[dict], title: str = "servesweep load"):
    """ITL/chunk is the gap between token-bearing chunks (summary `itl_ms`), ITL/token each gap divided by its
    chunk's tokens (`itl_per_token_ms`); docs/metrics.md."""
    from rich.table import Table

    t = Table(title=title)
    open_loop = any(s["point"].get("arrival", "closed") != "closed" for s in summaries)
    if open_loop:
        for col in ("arrival", "rate /s", "got /s", "lag p50 ms", "lag p99 ms"):
            t.add_column(col, justify="right")
    for col in (
        "conc",
        "out tok/s",
        "per-request tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL/chunk p50 ms",
        "ITL/chunk p99 ms",
        "ITL/token p50 ms",
        "ok",
        "failures",
        "prompt Δ%",
        "degen %",
    ):
        t.add_column(col, justify="right")
    # GPU energy per output token (results/energy.py), where a GPU sampler measured the point
    energy = any((s.get("gpu") or {}).get("joules_per_output_token") is not None for s in summaries)
    if energy:
        t.add_column("J/out tok", justify="right")
    whys = why_cells(summaries)
    # results/diagnosis.py: the first cause of a breached or flagged point, whole (the notes hold its evidence)
    t.add_column("why", justify="left", no_wrap=True, min_width=max(map(len, whys), default=3))
    degraded: list[str] = []
    for s, why in zip(summaries, whys, strict=True):
        fails = ", ".join(f"{k}={v}" for k, v in s["failures"].items()) or "0"
        conc = str(s["point"]["concurrency"])
        deg = degradation(s)
        if deg is not None:
            # the row itself says it: asked → held load, the requests lost with the worker (never in `failures`)
            conc = f"{conc}→{deg.held_concurrency:.1f}" if deg.held_concurrency is not None else conc
            lost = f"lost={deg.lost_requests}" if deg.lost_requests else ""
            fails = ", ".join(x for x in (lost, "" if fails == "0" else fails) if x) or fails
            degraded.append(s["point_id"])
        dec = s.get("decode_tokens_per_s")
        lead = []
        if open_loop:
            pt, arr = s["point"], s.get("arrivals") or {}
            lead = [
                pt.get("arrival", "closed"),
                _fmt(pt.get("rate_rps"), "g"),
                _fmt(arr.get("rate_rps"), ".2f"),
                _fmt(_p(s, "schedule_lag_ms", "p50"), ".2f"),
                _fmt(_p(s, "schedule_lag_ms", "p99"), ".2f"),
            ]
        t.add_row(
            *lead,
            conc,
            _fmt(s["output_tokens_per_s"]),
            _fmt(dec["mean"] if dec else None),
            _fmt(_p(s, "ttft_ms", "p50")),
            _fmt(_p(s, "ttft_ms", "p99")),
            _fmt(_p(s, "itl_ms", "p50"), ".2f"),
            _fmt(_p(s, "itl_ms", "p99"), ".2f"),
            _fmt(_p(s, "itl_per_token_ms", "p50"), ".2f"),
            str(s["requests"]["ok"]),
            fails,
            _fmt(s["prompt_tokens"]["mean_deviation_pct"], "+.2f"),
            degenerate_cell(s),
            *([_fmt((s.get("gpu") or {}).get("joules_per_output_token"), ".3f")] if energy else []),
            why,
            style="bold red" if deg is not None else None,
        )
    if degraded:  # under the table, part of it: a row in red is not what was asked
        t.caption = (
            f"[bold red]DEGRADED: {', '.join(degraded)} ran at a lower load than asked (conc: asked→held; "
            "lost: requests lost with a Locust worker); see below[/]"
        )
    return t


def why_cells(summaries: list[dict]) -> list[str]:
    """The `why` column: the first cause's name of each point that broke an SLO or was flagged, else "-"."""
    out = []
    for s, d in zip(summaries, diagnose_all(summaries), strict=True):
        out.append((d.first or d.status) if breached(s) else "-")
    return out


def diagnosis_notes(summaries: list[dict]) -> list[str]:
    """The whole verdict of each breached or flagged point, and each configuration's saturation knee."""
    from rich.markup import escape

    out = [
        f"[yellow]point {s.get('point_id')}: why: {escape(d.line)}[/]"
        for s, d in zip(summaries, diagnose_all(summaries), strict=True)
        if breached(s)
    ]
    for key, knee in knees(summaries).items():
        out.append(f"saturation ({escape(config_label(key))}): {escape(knee.text)}")
    return out


def table_notes(summaries: list[dict]) -> list[str]:
    """Lines printed under the table: degraded points, a saturated load generator, why each breached or flagged
    point missed (results/diagnosis.py) and each configuration's saturation knee."""
    from rich.markup import escape

    out = []
    for s in summaries:
        if warning := degeneration_warning(s):
            out.append(f"[bold red]{warning}[/]")
        for n in s.get("notes") or ():
            out.append(f"[yellow]point {s['point_id']}: {n}[/]")
        if (deg := degradation(s)) is not None:
            out.append(f"[bold red]{escape(deg.line())}[/]")
        if s.get("client_saturated"):
            why = "; ".join(s["client_headroom"]["reasons"])
            out.append(f"[yellow]point {s['point_id']}: the load generator saturated ({why})[/]")
    return out + diagnosis_notes(summaries)
