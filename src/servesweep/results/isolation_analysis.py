"""Isolation measured: a packed point against the same point re-run alone on the same GPUs (matrix/isolation_rerun.py).

For each pair, TTFT p50 and output tok/s change from alone (baseline) to packed, each with compare's bootstrap
interval over the per-request values (requests resampled in both points); a configuration is flagged when a
change is larger than the threshold (10 % by default) in either direction. The result is kept in the manifest
(`isolation`) and shown by the report (Markdown and HTML) and the exporter.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from servesweep.results.compare import PointSample, bootstrap_changes, metric
from servesweep.results.records import read_parquet

METRICS = ("ttft_p50", "output_tok_s")
THRESHOLD = 0.10
SHARE = (
    "the first point of each packed configuration, re-run after the packed phase with nothing else running"
)


def _sample(run_dir: Path, pid: str) -> PointSample:
    return PointSample.from_table(read_parquet(run_dir / pid / "records.parquet"))


def analyze(run_dir: Path, data: dict[str, Any], *, threshold: float = THRESHOLD, seed: int = 0) -> dict:
    """Every done isolation sample against its packed point: the manifest's `isolation` section."""
    rows = []
    points = data.get("points") or {}
    for i, (aid, a) in enumerate(sorted(points.items())):
        pid = a.get("isolation_of")
        p = points.get(pid) if pid else None
        if not p or a.get("status") != "done" or p.get("status") != "done":
            continue
        changes = bootstrap_changes(
            _sample(run_dir, aid), _sample(run_dir, pid), [metric(n) for n in METRICS], seed=seed + i
        )
        flagged = [c.metric.name for c in changes if c.delta == c.delta and abs(c.delta) > threshold]
        labels = (p.get("point") or {}).get("labels") or {}
        rows.append(
            {
                "config": p["config_id"],
                "packed_point": pid,
                "alone_point": aid,
                "host": labels.get("host"),
                "gpus": labels.get("gpus"),
                "changes": [c.as_dict() for c in changes],
                "flagged": flagged,
            }
        )
    return {"share": SHARE, "threshold": threshold, "confidence": 0.95, "configs": rows}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f} %"


def _cells(row: dict) -> list[str]:
    out = []
    for c in row["changes"]:
        out.append(f"{_pct(c['change'])} [{_pct(c['ci_low'])}, {_pct(c['ci_high'])}]")
    return out


def markdown(data: dict[str, Any]) -> list[str]:
    iso = data.get("isolation")
    if not iso:
        return []
    head = ["config", "host", "GPUs", "packed", "alone", *(f"{m} packed vs alone" for m in METRICS), "flag"]
    lines = [
        "## Isolation: packed vs alone",
        "",
        f"Re-run alone: {iso['share']}. Change from alone to packed with a {iso['confidence']:.0%} bootstrap "
        f"interval; flagged above ±{iso['threshold']:.0%}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in iso["configs"]:
        flag = "**FLAGGED** " + ", ".join(r["flagged"]) if r["flagged"] else "ok"
        cells = [r["config"], r["host"] or "-", r["gpus"] or "-", r["packed_point"], r["alone_point"]]
        lines.append("| " + " | ".join([*cells, *_cells(r), flag]) + " |")
    if not iso["configs"]:
        lines.append("| (no isolation sample finished) |" + " |" * (len(head) - 1))
    return [*lines, ""]


def html_section(data: dict[str, Any]) -> str:
    iso = data.get("isolation")
    if not iso:
        return ""
    e = html.escape
    head = "".join(
        f"<th>{e(h)}</th>" for h in ["config", "host", "GPUs", "packed", "alone", *METRICS, "flag"]
    )
    body = []
    for r in iso["configs"]:
        flag = "FLAGGED " + ", ".join(r["flagged"]) if r["flagged"] else "ok"
        cells = [
            r["config"],
            r["host"] or "-",
            r["gpus"] or "-",
            r["packed_point"],
            r["alone_point"],
            *_cells(r),
        ]
        style = ' style="color:#b00;font-weight:bold"' if r["flagged"] else ""
        body.append(
            "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + f"<td{style}>{e(flag)}</td></tr>"
        )
    return (
        '<section id="isolation"><h2>Isolation: packed vs alone</h2>'
        f"<p>Re-run alone: {e(iso['share'])}. Change from alone to packed with a {iso['confidence']:.0%} bootstrap "
        f"interval; flagged above ±{iso['threshold']:.0%}.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>"
    )
