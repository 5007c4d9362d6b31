"""Capacity at SLO in a run folder (written by matrix/capacity_run.py): the capacity-at-SLO table, the frontier plot,
two runs' capacities compared with their brackets, and the gate on a minimum capacity.

capacity.json: `rows` (one per search × tier: configuration, GPUs, capacity with its bracket, stop reason, binding
SLO, probes, and the figures at capacity, totals and per GPU), `frontier` (every probe: output tok/s per GPU
against the median per-request decode tok/s, `pareto` marking the Pareto frontier across configurations),
`probes` and `grid_points` (the searches' probes against the equivalent grids at the same resolution).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

CAPACITY_JSON = "capacity.json"
FRONTIER_SVG = "frontier.svg"
HEADER = [
    "config",
    "workload",
    "prompt",
    "output",
    "GPUs",
    "tier",
    "capacity",
    "bracket",
    "tok/s",
    "tok/s/GPU",
    "req/s/GPU",
    "TTFT p99",
    "ITL/chunk p99",
    "binding SLO",
    "probes",
]


def load_capacity(run_dir: str | Path) -> dict[str, Any] | None:
    f = Path(run_dir) / CAPACITY_JSON
    return json.loads(f.read_text()) if f.is_file() else None


def _n(x, d: int = 1) -> str:
    return "-" if x is None else f"{x:,.{d}f}"


def _ms(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.2f}s" if x >= 1000 else f"{x:.1f}ms"


def load_text(x) -> str:
    """A load (concurrency, sessions or req/s) as printed: `-` when unknown."""
    return "-" if x is None else f"{x:g}"


def table_rows(cap: dict[str, Any]) -> list[list[str]]:
    """The capacity-at-SLO table's rows (HEADER's columns), as text."""
    out = []
    for r in cap["rows"]:
        a = r.get("at_capacity") or {}
        lo, hi = r["bracket"]
        stop = {"upper_bound": "≥ upper", "lower_bound": "< lower", "budget": "budget"}.get(r["stop"], "")
        out.append(
            [
                r["config"],
                str(r["workload"]),
                str(r["prompt_tokens"]),
                str(r["output_tokens"]),
                str(r["gpus"]),
                r["tier"],
                load_text(r["capacity"])
                + (" sessions" if r.get("load_unit") == "sessions" else "")  # agent sessions at once
                + (f" ({stop})" if stop else ""),
                f"[{load_text(lo)}, {load_text(hi)})",
                _n(a.get("output_tokens_per_s")),
                _n(a.get("output_tokens_per_s_per_gpu")),
                _n(a.get("request_rate_per_gpu"), 3),
                _ms(a.get("ttft_p99_ms")),
                _ms(a.get("itl_p99_ms")),
                r["binding"] or "-",
                str(r["probes"]),
            ]
        )
    return out


def markdown(cap: dict[str, Any]) -> list[str]:
    """The report's section: the table, what the bracket means, probes against the grid, the frontier's points."""
    rows = table_rows(cap)
    out = [
        "## Capacity at SLO",
        "",
        f"The largest {cap.get('axis') or 'load'} at which every SLO of the tier holds; bracket [last pass, first "
        "fail). Figures at capacity: the probe at that load (tok/s and req/s per GPU next to the total).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        f"{cap['probes']} probes where the equivalent grids at the same resolution have {cap['grid_points']} points.",
        "",
    ]
    pareto = [p for p in cap["frontier"] if p["pareto"]]
    if pareto:
        out += ["Pareto frontier (no other probe has both more tok/s per GPU and more tok/s per user):", ""]
        out += [
            f"- {p['config']} at {load_text(p['load'])}: {p['tokens_per_s_per_gpu']:,.1f} tok/s per GPU, "
            f"{p['user_tokens_per_s']:,.1f} tok/s per user"
            for p in pareto
        ]
        out.append("")
    return out


def print_table(console, run_dir: str | Path) -> None:
    """The capacity-at-SLO table on the console (after `servesweep run`)."""
    from rich.table import Table

    cap = load_capacity(run_dir)
    if cap is None:
        return
    dry = "DRY RUN (emulator, tiers scaled to its speed-up) - " if cap.get("dry_run") else ""
    t = Table(title=f"{dry}capacity at SLO ({cap.get('axis')})")
    for col in HEADER:
        t.add_column(col, justify="left" if col in ("config", "workload", "tier", "binding SLO") else "right")
    for r in table_rows(cap):
        t.add_row(*r)
    console.print(t)
    console.print(
        f"{cap['probes']} probes (the equivalent grids: {cap['grid_points']} points); frontier plot: "
        f"{Path(run_dir) / FRONTIER_SVG}"
    )


def frontier_svg(cap: dict[str, Any]) -> str:
    """Throughput per GPU against per-user output speed, one series per configuration, the Pareto frontier drawn."""
    from servesweep.results import plots

    fig, ax = plots._figure(
        "frontier: throughput per GPU vs per-user speed",
        "output tok/s per user (median)",
        "output tok/s per GPU",
    )
    by: dict[str, list] = defaultdict(list)
    for p in cap["frontier"]:
        by[p["config"]].append(p)
    for (name, pts), marker in zip(sorted(by.items()), plots._MARKERS * 10, strict=False):
        pts = sorted(pts, key=lambda p: p["user_tokens_per_s"])
        ax.plot(
            [p["user_tokens_per_s"] for p in pts],
            [p["tokens_per_s_per_gpu"] for p in pts],
            marker=marker,
            linestyle=":",
            label=name,
        )
    front = sorted((p for p in cap["frontier"] if p["pareto"]), key=lambda p: p["user_tokens_per_s"])
    if front:
        ax.plot(
            [p["user_tokens_per_s"] for p in front],
            [p["tokens_per_s_per_gpu"] for p in front],
            color="black",
            linewidth=2,
            alpha=0.6,
            label="Pareto frontier",
        )
    plots._finish(ax, len(by) + 1)
    return plots._svg(fig)


def write_frontier_svg(run_dir: str | Path, cap: dict[str, Any]) -> Path:
    from servesweep.files import write_atomic

    return write_atomic(Path(run_dir) / FRONTIER_SVG, frontier_svg(cap), mode=0o666)


# ---------------------------------------------------------------- two runs


def _key(r: dict[str, Any]) -> tuple:
    return (r["config"], r["workload"], r["prompt_tokens"], r["output_tokens"], r["tier"])


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Each search × tier of both runs: capacities with their brackets [pass, fail) and a verdict. The true capacity
    lies in each bracket, so B is `lower` only when its first fail is at or below A's pass (the brackets cannot
    overlap), `higher` when its pass is at or above A's first fail, else `same within resolution`."""
    rows_b = {_key(r): r for r in b["rows"]}
    out = []
    for ra in a["rows"]:
        rb = rows_b.get(_key(ra))
        if rb is None:
            continue
        (pa, fa), (pb, fb) = ra["bracket"], rb["bracket"]
        pa, pb = pa or 0, pb or 0
        if fb is not None and fb <= pa:
            verdict = "lower"
        elif fa is not None and pb >= fa:
            verdict = "higher"
        else:
            verdict = "same within resolution"
        ca, cb = ra["capacity"], rb["capacity"]
        out.append(
            {
                "search": ra["search"],
                "tier": ra["tier"],
                "a": ca,
                "a_bracket": ra["bracket"],
                "b": cb,
                "b_bracket": rb["bracket"],
                "ratio": (cb / ca) if ca and cb is not None else None,
                "a_tok_s_per_gpu": (ra.get("at_capacity") or {}).get("output_tokens_per_s_per_gpu"),
                "b_tok_s_per_gpu": (rb.get("at_capacity") or {}).get("output_tokens_per_s_per_gpu"),
                "verdict": verdict,
            }
        )
    return out


def print_compare(console, a_dir: Path, b_dir: Path) -> None:
    """`servesweep compare`: the capacities of two search runs, side by side with their brackets."""
    from rich.table import Table

    a, b = load_capacity(a_dir), load_capacity(b_dir)
    if a is None or b is None:
        return
    t = Table(title=f"capacity at SLO: {a['run_id']} (baseline) vs {b['run_id']}")
    for col in ("search", "tier", "baseline [bracket)", "run [bracket)", "ratio", "tok/s/GPU", "verdict"):
        t.add_column(col)
    for r in compare(a, b):
        t.add_row(
            r["search"],
            r["tier"],
            f"{load_text(r['a'])} [{load_text(r['a_bracket'][0])}, {load_text(r['a_bracket'][1])})",
            f"{load_text(r['b'])} [{load_text(r['b_bracket'][0])}, {load_text(r['b_bracket'][1])})",
            _n(r["ratio"], 2),
            f"{_n(r['a_tok_s_per_gpu'])} → {_n(r['b_tok_s_per_gpu'])}",
            r["verdict"],
        )
    console.print(t)


def print_compares(console, runs) -> bool:
    """Each later run's capacities against the first's; True when every run holds a capacity.json."""
    if any(load_capacity(r) is None for r in runs):
        return False
    for b in runs[1:]:
        print_compare(console, runs[0], b)
    return True


def gate(run_dir: Path, min_capacity: str, baseline: Path | None) -> list[tuple[str, str, bool, str]]:
    """`servesweep gate --min-capacity`: (search/tier, check, passed, message) per row. A number: every capacity
    must reach it; a percentage (with --baseline): every capacity must reach that share of the baseline's, judged
    on the brackets (a breach only when the run's first fail is at or below the required load)."""
    cap = load_capacity(run_dir)
    if cap is None:
        raise ValueError(f"{run_dir} has no {CAPACITY_JSON}: not a run with a search: block")
    text = min_capacity.strip()
    base = load_capacity(baseline) if baseline is not None else None
    if text.endswith("%") and base is None:
        raise ValueError("--min-capacity as a percentage needs --baseline (a run with a search: block)")
    share = float(text[:-1]) / 100 if text.endswith("%") else None
    base_rows = {_key(r): r for r in (base or {"rows": []})["rows"]}
    out = []
    for r in cap["rows"]:
        name = f"{r['search']}/{r['tier']}"
        if share is None:
            need = float(text)
        else:
            b = base_rows.get(_key(r))
            if b is None or b["capacity"] is None:
                continue
            need = share * b["capacity"]
        cap_v, fail = r["capacity"], r["bracket"][1]
        ok = cap_v is not None and (cap_v >= need or (share is not None and (fail is None or fail > need)))
        msg = f"capacity {load_text(cap_v)} [{load_text(r['bracket'][0])}, {load_text(fail)}) vs required {need:g}"
        out.append((name, f"capacity >= {text}", ok, msg))
    return out
