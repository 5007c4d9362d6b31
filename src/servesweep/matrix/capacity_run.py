"""`servesweep run` with a `search:` block: per server configuration and per workload × endpoint × prompt × output
combination, the capacity search of matrix/capacity_search.py, its probes run as points of the matrix.

The run folder (docs/capacity.md): every probe call is a point of the manifest (`<search>-c<load>-n<call>`, its
folder with records.parquet and summary.json, like any point); `manifest.searches[<search>]` holds the search's
status and headline; `searches/<search>.json` the whole SearchResult; `capacity.json` every search's rows and the
frontier; `frontier.svg` the frontier plot.

Resume: the search is deterministic given its probes' records (the bootstrap's generator is seeded and each call's
records come back in the same order), so a resumed search replays: a probe call whose point is done is read back
from its folder instead of measured, and the search goes on from where it stopped. Nothing finished runs again.

The runner (matrix/orchestrator.Runner) is passed in: this module uses its manifest, `_run_point`, `event`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np

from servesweep.matrix.capacity_agent import is_agent, load_unit, search_overrides, session_figures
from servesweep.matrix.capacity_plan import spec_for
from servesweep.matrix.capacity_search import (
    ProbeRecord,
    ProbeResult,
    SearchResult,
    frontier_points,
    pareto_frontier,
    parse_tier,
    search,
)
from servesweep.results import manifest as mf
from servesweep.results.capacity import load_search, load_text, save_capacity, save_search, search_path
from servesweep.results.pergpu import flags_gpus

# a probe point's id: <search>-<tag><load>-n<call> (c: concurrency, r: req/s, x: a trace replay's speed-up)
AXIS_TAG = {"concurrency": "-c", "rate": "-r", "speedup": "-x"}


def probe_tag(axis: str, load) -> str:
    """The load's part of a probe point's id: c8, r2.5, x3.2."""
    return f"c{int(load)}" if axis == "concurrency" else f"{AXIS_TAG[axis][1:]}{load:.4g}"


def set_load(point: dict[str, Any], axis: str, load) -> None:
    """A point's fields (LoadPoint's, as JSON) at a search's load: its concurrency, its open loop's rate, or its
    trace replay's speed-up (the replay sends its window's requests, whatever the search asks: a probe of the
    speed-up axis is one replay of the window, a top-up another one, the server's cache flushed before each)."""
    if axis == "concurrency":
        point["concurrency"] = int(load)
    elif axis == "rate":
        point["rate_rps"] = float(load)
    else:
        point["trace_speedup"] = float(load)


def replay_probe(point, out_dir: Path, *, workers: int = 0, **run_kw: Any):
    """probe(speed_up, requests) for search() over a trace replay's speed-up without a matrix: each call replays
    `point`'s window at that speed-up with `run_point` into out_dir/x<speed-up>-n<call> (what capacity_run's probes
    do inside a run; tests, scripts)."""
    from servesweep.driver.point_run import run_point
    from servesweep.results.records import read_parquet

    calls: dict[Any, int] = {}

    def probe(load, requests: int) -> ProbeResult:
        call = calls[load] = calls.get(load, 0) + 1
        d = point.model_dump(mode="json")
        set_load(d, "speedup", load)
        d["point_id"] = f"{probe_tag('speedup', load)}-n{call}"
        p = type(point).model_validate(d)
        folder = Path(out_dir) / p.point_id
        t0 = time.monotonic()
        run_point(p, folder, workers=workers, **run_kw)
        return ProbeResult.from_records(read_parquet(folder / "records.parquet"), wall_s=time.monotonic() - t0)

    return probe


class ProbeFailed(RuntimeError):
    """A probe's point did not finish (the load generator or the server failed): the search stops there."""


def move_points_to_searches(exp, data: dict[str, Any], plan) -> None:
    """In a new manifest: the planned points (one per combination, at search.lower) become searches with the
    planner's estimate; the probe points are added as the searches run."""
    planned = {pp.id: pp.search for cp in plan.configs for pp in cp.points}
    cut = AXIS_TAG[exp.search.axis]
    searches = {}
    for pid, p in data["points"].items():
        searches[pid.rsplit(cut, 1)[0]] = {
            "template": p,
            "config_id": p["config_id"],
            "status": mf.PENDING if p["status"] == mf.PENDING else mf.INFEASIBLE,
            "reason": p["reason"],
            "planned": planned.get(pid),
            "result": None,
        }
    data["searches"] = searches
    data["points"] = {}


def pending_searches(data: dict[str, Any], cid: str) -> list[str]:
    return [
        sid
        for sid, s in (data.get("searches") or {}).items()
        if s["config_id"] == cid and s["status"] not in mf.FINISHED
    ]


def unfinished(data: dict[str, Any]) -> bool:
    return any(s["status"] not in mf.FINISHED for s in (data.get("searches") or {}).values())


class _Probe:
    """probe(load, requests) for search(): each call a point of the manifest, run by the runner, or read back
    from its folder when a previous attempt finished it (resume)."""

    def __init__(self, runner, cid: str, sid: str):
        self.runner, self.cid, self.sid = runner, cid, sid
        self.calls: dict[Any, int] = {}

    def point_id(self, load, call: int) -> str:
        return f"{self.sid}-{probe_tag(self.runner.exp.search.axis, load)}-n{call}"

    def __call__(self, load, requests: int) -> ProbeResult:
        from servesweep.results.records import read_parquet

        call = self.calls[load] = self.calls.get(load, 0) + 1
        pid = self.point_id(load, call)
        m = self.runner.m
        p = m.point(pid) if pid in m.points else None
        asked = None if p is None else (p.asked if p.asked is not None else p.point["requests"])
        if p is None or p.status != mf.DONE or asked != requests:
            self._new_point(pid, load, requests)
            t0 = time.monotonic()
            self.runner._run_point(self.cid, pid)
            p = m.update_point(pid, probe_wall_s=round(time.monotonic() - t0, 3))
            m.save()
            if p.status != mf.DONE:
                raise ProbeFailed(f"probe {pid}: {p.status}: {(p.reason or '')[:500]}")
        else:
            self.runner.event(f"  ↺ {pid}: finished before, read back")
        assert p.dir is not None  # a done point's folder
        table = read_parquet(self.runner.run_dir / p.dir / "records.parquet")
        return ProbeResult.from_records(table, wall_s=p.probe_wall_s)

    def _new_point(self, pid: str, load, requests: int) -> dict[str, Any]:
        s = self.runner.m.data["searches"][self.sid]
        p = copy.deepcopy(s["template"])
        axis = self.runner.exp.search.axis
        point = p["point"]
        point["point_id"] = pid
        if axis != "speedup":  # a replay sends its window's requests (its template's), each call one replay
            point["requests"] = requests
        set_load(point, axis, load)
        if axis in ("concurrency", "rate"):
            p[axis] = point["concurrency"] if axis == "concurrency" else point["rate_rps"]
        else:
            p["speedup"] = float(load)
        p.update(
            status=mf.PENDING, attempts=0, dir=None, reason=None, search=self.sid, load=load,
            asked=requests,
        )  # fmt: skip
        self.runner.m.add_point(pid, p)
        return p


def run_searches(runner, cid: str, todo: list[str]) -> None:
    """Every pending search of configuration `cid`, on its running server."""
    exp = runner.exp
    block = exp.search
    tiers = {name: parse_tier(texts) for name, texts in block.tiers.items()}
    for sid in todo:
        s = runner.m.data["searches"][sid]
        start = (s.get("planned") or {}).get("start")
        s.update(status=mf.RUNNING, started=s.get("started") or mf.now_iso())
        runner.m.save()
        runner.console.rule(
            f"search {sid}: {block.axis} in [{block.lower:g}, {block.upper:g}], start {start}"
        )
        try:
            spec = spec_for(block, start, **search_overrides(s["template"]))  # agents: whole sessions per probe
            result = search(_Probe(runner, cid, sid), tiers, spec)
        except ProbeFailed as e:
            s.update(status=mf.FAILED, reason=str(e), finished=mf.now_iso())
            runner.m.save()
            runner.event(f"[red]✗ search {sid}[/]: {e}")
            continue
        doc = search_document(runner, cid, sid, result)
        doc = save_search(runner.run_dir, doc)  # checked: results/capacity.py SearchFile
        s.update(status=mf.DONE, finished=mf.now_iso(), result=doc["headline"], reason=None)
        runner.m.save()
        for row in doc["rows"]:
            runner.event(
                f"  ✓ {sid} {row['tier']}: capacity {load_text(row['capacity'])} (bracket {load_text(row['bracket'][0])}"
                f"–{load_text(row['bracket'][1])}, {row['stop']}), {row['probes']} probes"
            )
    cap = write_capacity(runner.run_dir, runner.m.data)
    if getattr(runner, "metrics", None) is not None:  # the exporter's servesweep_capacity* gauges (the dashboard)
        runner.metrics.set_capacity(cap["rows"], cap["frontier"])


def _at(rec: ProbeRecord | None, gpus: int) -> dict[str, Any]:
    """The figures of the probe at a capacity: totals, per GPU, TTFT p99 and ITL p99 per chunk, per-user speed."""
    if rec is None:
        return {}
    r = rec.result

    def pct(a, q):
        a = a[np.isfinite(a)]
        return float(np.percentile(a, q)) if a.size else None

    tok = r.output_tokens_per_s
    req = float(np.count_nonzero(r.ok) / r.window_s)
    return {
        "output_tokens_per_s": tok,
        "output_tokens_per_s_per_gpu": tok / gpus,
        "request_rate": req,
        "request_rate_per_gpu": req / gpus,
        "ttft_p99_ms": pct(r.ttft_ms, 99),
        "itl_p99_ms": pct(r.itl_ms, 99),
        "decode_tokens_per_s_p50": pct(r.decode_tokens_per_s, 50),
        "requests": r.n,
    }


def _sessions_at(runner, sid: str, template: dict[str, Any], load) -> dict[str, Any]:
    """An agent search's session figures at its capacity, from the records of that load's probe calls."""
    if load is None or not is_agent(template):
        return {}
    files = [
        runner.run_dir / p.dir / "records.parquet"
        for p in runner.m.points_typed().values()
        if p.search == sid and p.load == load and p.status == mf.DONE and p.dir
    ]
    return session_figures(files)


def search_document(runner, cid: str, sid: str, result: SearchResult) -> dict[str, Any]:
    """searches/<sid>.json: the SearchResult, the combination, the GPUs, one row per tier and the frontier points."""
    s = runner.m.data["searches"][sid]
    t = s["template"]
    gpus = flags_gpus(runner.m.config(cid).flags, runner.exp.launcher.gpus)
    by_load = {p.load: p for p in result.probes}
    rows = []
    for name, tr in result.tiers.items():
        rows.append(
            {
                "search": sid,
                "config": cid,
                "workload": t["workload"],
                "prompt_tokens": t["prompt_tokens"],
                "output_tokens": t["output_tokens"],
                "gpus": gpus,
                "axis": result.axis,
                "tier": name,
                "slos": tr.slos,
                "capacity": tr.capacity,
                "bracket": list(tr.bracket),
                "stop": tr.stop,
                "binding": tr.binding,
                "probes": tr.probes_used,
                # a replay capacity: the largest speed-up of the trace (×) at which the tier holds
                "load_unit": "x trace" if result.axis == "speedup" else load_unit(t["workload"], result.axis),
                "at_capacity": _at(by_load.get(tr.capacity) if tr.capacity is not None else None, gpus) | _sessions_at(runner, sid, t, tr.capacity),
            }
        )
    points = [p.__dict__ for p in frontier_points(cid, gpus, result)]
    return {
        "search": sid,
        "config": cid,
        "gpus": gpus,
        "result": result.as_dict(),
        "rows": rows,
        "frontier": points,
        "headline": {
            "probes": result.probes_used,
            "calls": result.calls,
            "grid_points": result.grid_points,
            "capacity": {r["tier"]: r["capacity"] for r in rows},
        },
    }


def write_capacity(run_dir: Path, data: dict[str, Any]) -> dict[str, Any]:
    """capacity.json (every finished search's rows, the frontier with its Pareto points marked, probes against the
    grid) and frontier.svg, from searches/*.json."""
    from servesweep.matrix.capacity_search import FrontierPoint
    from servesweep.results.capacity import write_frontier_svg

    rows, points, searches, probes, grid = [], [], [], 0, 0
    for sid, s in (data.get("searches") or {}).items():
        if s["status"] != mf.DONE or not search_path(run_dir, sid).is_file():
            continue
        doc = load_search(run_dir, sid)
        rows += doc["rows"]
        points += [FrontierPoint(**p) for p in doc["frontier"]]
        searches += [sid] * len(doc["frontier"])
        probes += doc["headline"]["probes"]
        grid += doc["headline"]["grid_points"]
    # by identity: two searches of one configuration (another workload or prompt length) may probe the same load
    pareto = {id(p) for p in pareto_frontier(points)}
    cap = {
        "run_id": data.get("run_id"),
        "dry_run": bool(data.get("dry_run")),
        "axis": (data.get("experiment") or {}).get("search", {}).get("axis"),
        "rows": rows,
        "frontier": [
            p.__dict__ | {"search": sid, "pareto": id(p) in pareto}
            for sid, p in zip(searches, points, strict=True)
        ],
        "probes": probes,
        "grid_points": grid,
    }
    cap = save_capacity(run_dir, cap)  # checked against results/capacity.py CapacityFile, written atomically
    if points:
        write_frontier_svg(run_dir, cap)
    return cap
