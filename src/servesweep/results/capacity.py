"""Capacity at SLO in a run folder (written by matrix/capacity_run.py): the capacity-at-SLO table, the frontier plot,
two runs' capacities compared with their brackets, and the gate on a minimum capacity.

capacity.json: `rows` (one per search × tier: configuration, GPUs, capacity with its bracket, stop reason, binding
SLO, probes, and the figures at capacity, totals and per GPU), `frontier` (every probe: output tok/s per GPU
against the median per-request decode tok/s, `pareto` marking the Pareto frontier across configurations),
`probes` and `grid_points` (the searches' probes against the equivalent grids at the same resolution).

Energy at capacity (issue 31; docs/gpu-telemetry.md, "At SLO capacity"): where a GPU sampler measured the probes,
`load_capacity` adds each row's `energy` (the gpu.json of every call of the search at its capacity, pooled by
results/energy.pooled: joules per output token, output tokens per joule, average power, capacity per kW) and each
frontier probe's `output_tokens_per_joule`, `joules_per_output_token`, `power_avg_w` and `energy_pareto` (no other
probe has both more output tok/s per GPU and more output tokens per joule). A row without telemetry gets
`energy: None`: every surface prints `-`, never a guess.

The file's model is CapacityFile (schema_version 1): one load (`CapacityFile.load`, through
`load_capacity`) and one atomic save (`save_capacity`, what matrix/capacity_run.py writes with), both from
results/schema.py VersionedFile. Every key is declared and typed; a file with a field missing, of a wrong type or
unknown is refused naming the file and the field. The same holds for searches/<search>.json (SearchFile,
save_search, load_search), one per finished search, what capacity.json is made from. A file without
`schema_version` is the format before the models, with the same keys (a row's `load_unit` and the energy figures
absent where that code did not write them yet): it loads as version 1.
"""

from __future__ import annotations

import json
import operator
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar, Literal

from servesweep.results import energy as en
from servesweep.results.schema import Strict, VersionedFile

CAPACITY_JSON = "capacity.json"
SEARCHES_DIR = "searches"  # searches/<search>.json: one finished search (SearchFile)
FRONTIER_SVG = "frontier.svg"
ENERGY_FRONTIER_SVG = "energy_frontier.svg"
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
    "J/out tok",
    "out tok/J",
    "avg W",
    "cap/kW",
]


Load = int | float  # a concurrency or session count stays an int, a rate or a speed-up a float


class CapacityRow(Strict):
    """One search x tier (matrix/capacity_run.py search_document): its capacity, bracket and the figures at it."""

    search: str
    config: str
    workload: str
    prompt_tokens: int
    output_tokens: int
    gpus: int
    axis: str
    tier: str
    slos: list[str]
    capacity: Load | None  # the last passing load (None: fails at the lower bound)
    bracket: list[Load | None]  # (last pass, first fail)
    stop: str
    binding: str | None
    probes: int
    load_unit: str | None = None
    at_capacity: dict[str, Any]  # totals, per GPU, TTFT and ITL p99, an agent search's session figures
    energy: dict[str, Any] | None = None  # add_energy: the GPU telemetry at capacity (None: no sampler)


class FrontierPointFile(Strict):
    """A probe of a search as a frontier point (matrix/capacity_search.py FrontierPoint)."""

    config: str
    load: Load
    tokens_per_s_per_gpu: float
    user_tokens_per_s: float


class FrontierProbe(FrontierPointFile):
    """A frontier point in capacity.json: its search and Pareto flags."""

    search: str
    pareto: bool
    # add_energy's
    output_tokens_per_joule: float | None = None
    joules_per_output_token: float | None = None
    power_avg_w: float | None = None
    throttled: bool = False
    energy_pareto: bool = False


class CapacityFile(VersionedFile):
    """capacity.json of a run with a `search:` block, schema_version 1."""

    WHAT: ClassVar[str] = CAPACITY_JSON

    schema_version: Literal[1] = 1
    run_id: str | None
    dry_run: bool = False
    axis: str | None
    rows: list[CapacityRow]
    frontier: list[FrontierProbe]
    probes: int
    grid_points: int


class SearchHeadline(Strict):
    probes: int
    calls: int
    grid_points: int
    capacity: dict[str, Load | None]  # tier -> capacity


class SearchFile(VersionedFile):
    """searches/<search>.json of a run with a `search:` block (matrix/capacity_run.py search_document), one per
    finished search, what capacity.json is made from: the SearchResult, one row per tier, the frontier points."""

    WHAT: ClassVar[str] = "search result file"

    schema_version: Literal[1] = 1
    search: str
    config: str
    gpus: int
    result: dict[str, Any]  # matrix/capacity_search.py SearchResult.as_dict: probes, tiers, judgements
    rows: list[CapacityRow]
    frontier: list[FrontierPointFile]
    headline: SearchHeadline


def search_path(run_dir: str | Path, search: str) -> Path:
    return Path(run_dir) / SEARCHES_DIR / f"{search}.json"


def save_search(run_dir: str | Path, doc: dict[str, Any]) -> dict[str, Any]:
    """searches/<search>.json from its JSON, checked (SearchFile), written atomically; the JSON as written."""
    return SearchFile.save_data(search_path(run_dir, doc.get("search", "")), doc)


def load_search(run_dir: str | Path, search: str) -> dict[str, Any]:
    """searches/<search>.json, checked (FileNotFoundError; ValueError naming the file and the field)."""
    return SearchFile.load_data(search_path(run_dir, search))


def save_capacity(run_dir: str | Path, cap: dict[str, Any]) -> dict[str, Any]:
    """capacity.json of `run_dir` from its JSON (matrix/capacity_run.py write_capacity), checked, written atomically;
    the JSON as written."""
    return CapacityFile.save_data(Path(run_dir) / CAPACITY_JSON, cap)


def load_capacity(run_dir: str | Path) -> dict[str, Any] | None:
    """capacity.json (checked: CapacityFile) with the energy at capacity added (add_energy) where the file does not
    hold it yet; None when the run has none. ValueError naming the file and the field when it is not valid."""
    f = Path(run_dir) / CAPACITY_JSON
    if not f.is_file():
        return None
    cap = CapacityFile.load(f).as_data()
    if any("energy" not in r for r in cap.get("rows") or []) or any(
        "energy_pareto" not in p for p in cap.get("frontier") or []
    ):
        add_energy(run_dir, cap)
    return cap


def _probe_gpu(run_dir: Path) -> dict[tuple[str, str], list[dict]]:
    """(search, load as text) -> the gpu.json of each finished call of that probe, from the manifest's points."""
    from servesweep.results.store import MANIFEST

    try:
        points = (json.loads((run_dir / MANIFEST).read_text()).get("points") or {}).values()
    except (OSError, ValueError):  # no manifest (a copied capacity.json): no energy, said as `-`
        return {}
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        if p.get("status") != "done" or not p.get("search") or not p.get("dir") or p.get("load") is None:
            continue
        doc = en.load_gpu(run_dir / p["dir"])  # a damaged one: ValueError naming the file and the field
        if doc is not None:  # None: no sampler for this point, it adds nothing
            out[(p["search"], f"{p['load']:g}")].append(doc.as_data())
    return out


def _pareto_flags(pts: list[dict[str, Any]], x: str, y: str) -> list[bool]:
    """Whether each point is on the Pareto frontier of (x, y), both higher better; a point lacking either is not."""
    ok = [p.get(x) is not None and p.get(y) is not None for p in pts]
    return [
        ok[i]
        and not any(
            ok[j]
            and pts[j][x] >= pts[i][x]
            and pts[j][y] >= pts[i][y]
            and (pts[j][x], pts[j][y]) != (pts[i][x], pts[i][y])
            for j in range(len(pts))
        )
        for i in range(len(pts))
    ]


def add_energy(run_dir: str | Path, cap: dict[str, Any]) -> dict[str, Any]:
    """Add each row's `energy` at capacity and each frontier probe's energy figures and `energy_pareto` (in place;
    returned too), from the probes' gpu.json files (module docstring)."""
    gpu = _probe_gpu(Path(run_dir))
    for r in cap.get("rows") or []:
        e = (
            en.pooled(gpu.get((r["search"], f"{r['capacity']:g}"), []))
            if r.get("capacity") is not None
            else None
        )
        if e is not None:
            kw = (e["power_avg_w"] or 0) / 1000
            # the load held per kW of GPU power at capacity (users, or req/s for axis rate)
            e["capacity_per_kw"] = r["capacity"] / kw if kw else None
        r["energy"] = e
    for p in cap.get("frontier") or []:
        e = en.pooled(gpu.get((p.get("search") or "", f"{p['load']:g}"), [])) or {}
        for k in ("output_tokens_per_joule", "joules_per_output_token", "power_avg_w"):
            p[k] = e.get(k)
        p["throttled"] = bool(e.get("throttled"))
    for p, flag in zip(
        cap.get("frontier") or [],
        _pareto_flags(cap.get("frontier") or [], "tokens_per_s_per_gpu", "output_tokens_per_joule"),
        strict=True,
    ):
        p["energy_pareto"] = flag
    return cap


def _n(x, d: int = 1) -> str:
    return "-" if x is None else f"{x:,.{d}f}"


def _ms(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.2f}s" if x >= 1000 else f"{x:.1f}ms"


def load_text(x) -> str:
    """A load (concurrency, sessions, req/s or a trace's speed-up) as printed: `-` when unknown."""
    return "-" if x is None else f"{x:g}"


def _per_gpu_speedup(r: dict[str, Any]) -> str:
    """A replay capacity (search axis speedup) reads as the trace's speed-up, and per GPU: `3.2× (1.6×/GPU)`."""
    if r.get("load_unit") != "x trace" or r["capacity"] is None:
        return ""
    return f"× ({r['capacity'] / max(1, r['gpus'] or 1):.3g}×/GPU)"


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
                + _per_gpu_speedup(r)
                + (f" ({stop})" if stop else ""),
                f"[{load_text(lo)}, {load_text(hi)})",
                _n(a.get("output_tokens_per_s")),
                _n(a.get("output_tokens_per_s_per_gpu")),
                _n(a.get("request_rate_per_gpu"), 3),
                _ms(a.get("ttft_p99_ms")),
                _ms(a.get("itl_p99_ms")),
                r["binding"] or "-",
                str(r["probes"]),
                *energy_cells(r.get("energy")),
            ]
        )
    return out


def energy_cells(e: dict[str, Any] | None) -> list[str]:
    """J/out tok, out tok/J, avg W, cap/kW at capacity; `-` without telemetry; a throttled GPU marked `!`."""
    if not e:
        return ["-"] * 4
    mark = "!" if e.get("throttled") else ""
    return [
        _n(e.get("joules_per_output_token"), 3) + mark,
        _n(e.get("output_tokens_per_joule"), 2),
        _n(e.get("power_avg_w"), 0),
        _n(e.get("capacity_per_kw"), 1),
    ]


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
    out += energy_notes(cap)
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


def energy_notes(cap: dict[str, Any]) -> list[str]:
    """What the energy columns are, the throttled rows, and the energy frontier's points (none without telemetry)."""
    rows = [r for r in cap["rows"] if r.get("energy")]
    if not rows:
        return []
    out = [
        "Energy at capacity (GPU sampler, docs/gpu-telemetry.md): J/out tok and out tok/J are the GPUs' energy over "
        "the probe's window (every call at that load pooled) per output token, idle power included; avg W their "
        "average power; cap/kW the capacity per kW of it. `!`: a GPU throttled during the probe.",
        "",
    ]
    for r in rows:
        if r["energy"].get("throttled"):
            out.append(
                f"- {r['search']}/{r['tier']}: GPU throttled at capacity ({', '.join(r['energy']['throttle_reasons'])})"
            )
    front = [p for p in cap["frontier"] if p.get("energy_pareto")]
    if front:
        out += [
            "",
            "Energy frontier (no other probe has both more tok/s per GPU and more output tokens per joule):",
            "",
        ]
        out += [
            f"- {p['config']} at {load_text(p['load'])}: {p['tokens_per_s_per_gpu']:,.1f} tok/s per GPU, "
            f"{p['output_tokens_per_joule']:,.2f} output tok/J"
            for p in sorted(front, key=lambda p: p["tokens_per_s_per_gpu"])
        ]
    return out + [""]


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
        + (f", energy frontier: {Path(run_dir) / ENERGY_FRONTIER_SVG}" if has_energy(cap) else "")
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


def has_energy(cap: dict[str, Any]) -> bool:
    """Whether any probe of the frontier has its output tokens per joule (a GPU sampler measured it)."""
    return any(p.get("output_tokens_per_joule") is not None for p in cap.get("frontier") or [])


def energy_frontier_svg(cap: dict[str, Any]) -> str:
    """The second frontier: output tokens per joule against output tok/s per GPU at every probe that has both, one
    series per configuration, the energy Pareto frontier drawn (up and to the right is better)."""
    from servesweep.results import plots

    pts = [p for p in cap.get("frontier") or [] if p.get("output_tokens_per_joule") is not None]
    series: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for p in pts:
        series[p["config"]].append(
            (p["tokens_per_s_per_gpu"], p["output_tokens_per_joule"], load_text(p["load"]))
        )
    front = sorted(
        (p["tokens_per_s_per_gpu"], p["output_tokens_per_joule"]) for p in pts if p.get("energy_pareto")
    )
    throttled = [(p["tokens_per_s_per_gpu"], p["output_tokens_per_joule"]) for p in pts if p.get("throttled")]
    return plots.energy_frontier(
        series, front, throttled, "energy frontier: tokens per joule vs throughput per GPU"
    )


def write_frontier_svg(run_dir: str | Path, cap: dict[str, Any]) -> Path:
    """frontier.svg, and energy_frontier.svg where a GPU sampler measured the probes."""
    from servesweep.files import write_atomic

    if "energy_pareto" not in next(iter(cap.get("frontier") or []), {"energy_pareto": 0}):
        add_energy(run_dir, cap)  # capacity_run's fresh document: read its probes' gpu.json
    if has_energy(cap):
        write_atomic(Path(run_dir) / ENERGY_FRONTIER_SVG, energy_frontier_svg(cap), mode=0o666)
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
                "a_tok_per_joule": (ra.get("energy") or {}).get("output_tokens_per_joule"),
                "b_tok_per_joule": (rb.get("energy") or {}).get("output_tokens_per_joule"),
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
    rows = compare(a, b)
    energy = any(r["a_tok_per_joule"] is not None or r["b_tok_per_joule"] is not None for r in rows)
    cols = ["search", "tier", "baseline [bracket)", "run [bracket)", "ratio", "tok/s/GPU"]
    for col in cols + (["out tok/J"] if energy else []) + ["verdict"]:
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["search"],
            r["tier"],
            f"{load_text(r['a'])} [{load_text(r['a_bracket'][0])}, {load_text(r['a_bracket'][1])})",
            f"{load_text(r['b'])} [{load_text(r['b_bracket'][0])}, {load_text(r['b_bracket'][1])})",
            _n(r["ratio"], 2),
            f"{_n(r['a_tok_s_per_gpu'])} → {_n(r['b_tok_s_per_gpu'])}",
            *([f"{_n(r['a_tok_per_joule'], 2)} → {_n(r['b_tok_per_joule'], 2)}"] if energy else []),
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


# `--min-capacity` energy terms: the row's `energy` figure -> what it means (docs/gpu-telemetry.md)
ENERGY_METRICS: dict[str, str] = {
    "output_tokens_per_joule": "output tokens per joule at capacity",
    "tokens_per_joule": "tokens (prompt + output) per joule at capacity",
    "joules_per_output_token": "joules per output token at capacity",
    "joules_per_token": "joules per token (prompt + output) at capacity",
    "capacity_per_kw": "capacity per kW of GPU power at capacity",
}
_TERM = re.compile(r"^([a-z_]+)\s*(<=|>=|<|>)\s*([^%\s]+)\s*(%?)$")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def parse_min_capacity(text: str) -> tuple[str | None, list[tuple[str, str, float, bool]]]:
    """`--min-capacity` as (the load term or None, [(energy metric, op, value, is a share of the baseline)]): terms
    split by commas, a bare number or percentage is the load, `METRIC OP VALUE[%]` an energy bound (ENERGY_METRICS).
    ValueError naming the term that cannot be read."""
    load: str | None = None
    terms = []
    for part in (t.strip() for t in text.split(",")):
        if not part:
            continue
        m = _TERM.match(part)
        if m is None:
            try:
                float(part[:-1] if part.endswith("%") else part)
            except ValueError:
                raise ValueError(
                    f"{part!r} is neither a load (8, or 90% of --baseline's) nor an energy bound "
                    f"(e.g. output_tokens_per_joule>=2; metrics: {', '.join(ENERGY_METRICS)})"
                ) from None
            if load is not None:
                raise ValueError(f"two loads ({load!r}, {part!r}): give one")
            load = part
            continue
        name, op, num, pct = m.groups()
        if name not in ENERGY_METRICS:
            raise ValueError(f"{part!r}: unknown energy metric {name!r} (known: {', '.join(ENERGY_METRICS)})")
        try:
            value = float(num)
        except ValueError:
            raise ValueError(f"{part!r}: {num!r} is not a number") from None
        terms.append((name, op, value / 100 if pct else value, bool(pct)))
    if load is None and not terms:
        raise ValueError(f"{text!r}: nothing to check")
    return load, terms


def gate(run_dir: Path, min_capacity: str, baseline: Path | None) -> list[tuple[str, str, bool, str]]:
    """`servesweep gate --min-capacity`: (search/tier, check, passed, message) per row and term. The load term: a
    number (every capacity must reach it) or a percentage (with --baseline: that share of the baseline's), judged on
    the brackets (a breach only when the run's first fail is at or below the required load). Energy terms
    (`output_tokens_per_joule>=2`, `joules_per_output_token<=110%` of the baseline's): the figure at each capacity."""
    cap = load_capacity(run_dir)
    if cap is None:
        raise ValueError(f"{run_dir} has no {CAPACITY_JSON}: not a run with a search: block")
    load, terms = parse_min_capacity(min_capacity)
    base = load_capacity(baseline) if baseline is not None else None
    if base is None and ((load or "").endswith("%") or any(t[3] for t in terms)):
        raise ValueError("a percentage needs --baseline (a run with a search: block)")
    base_rows = {_key(r): r for r in (base or {"rows": []})["rows"]}
    out = _load_checks(cap, base_rows, load) if load is not None else []
    return out + (_energy_checks(cap, base_rows, terms) if terms else [])


def _load_checks(cap: dict[str, Any], base_rows: dict, text: str) -> list[tuple[str, str, bool, str]]:
    share = float(text[:-1]) / 100 if text.endswith("%") else None
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


def _energy_checks(
    cap: dict[str, Any], base_rows: dict, terms: list[tuple[str, str, float, bool]]
) -> list[tuple[str, str, bool, str]]:
    """One check per row and energy term; a row without telemetry at capacity fails, saying so."""
    if not any(r.get("energy") for r in cap["rows"]):
        raise ValueError(
            "an energy bound needs GPU telemetry at capacity, and no probe at a capacity of this run has a gpu.json "
            "(docs/gpu-telemetry.md)"
        )
    out = []
    for name, op, value, share in terms:
        check = f"{name} {op} {value * 100:g}% of the baseline's" if share else f"{name} {op} {value:g}"
        for r in cap["rows"]:
            row = f"{r['search']}/{r['tier']}"
            if share:
                b = (base_rows.get(_key(r)) or {}).get("energy") or {}
                if b.get(name) is None:
                    continue  # the baseline has no such row or no telemetry there: nothing to compare with
                need = value * b[name]
            else:
                need = value
            got = (r.get("energy") or {}).get(name)
            if got is None:
                why = "no capacity" if r.get("capacity") is None else "no GPU telemetry at capacity"
                out.append((row, check, False, f"{ENERGY_METRICS[name]}: {why}"))
                continue
            ok = bool(_OPS[op](got, need))
            out.append((row, check, ok, f"{ENERGY_METRICS[name]} {got:.4g} vs required {op} {need:.4g}"))
    return out
