"""`servesweep run` with a `decide:` block: matrix/decision.py's `run_decision` with its probes measured on real
servers (docs/decision.md).

The cells are the planner's (`planner.decision_cells`, the ones `servesweep plan` predicts with; on the emulator its
step model takes the configuration's `--sim-calibration`). `measure(cell, load)` is backed by the runner's point
execution (`Runner._run_point`, i.e. `driver.point_run.run_point`): a probe's first look is one point of the manifest
(`d-<config>-<shape>-c<load>-l1`), each later look of the same probe a *top-up* point (`-l2`, `-l3` ...: a new
Locust start at the same load, its records added to the earlier looks'). A configuration's server is started
through the role when the decision first probes it and kept while the decision probes it; a probe of another
configuration replaces it on the run's port (the configuration's `restarts` count the returns).

After each probe `decision.json` (the anytime answer: per (shape, tier) question the best configuration, its value
interval, decided / tie / none / best-so-far / unsettled, probes so far; GPU-seconds used) is rewritten atomically
and one progress line printed. `budget.wall_time` stops the decision before its next probe (this attempt's wall
time from its first server start: a resume reads back what was measured and goes on for another budget); the answer is then labelled best so far and the run exits 2.

Resume: the decision is deterministic given its probes' records, so a resumed run replays it: a look whose point is
done is read back from its folder instead of measured, and the decision goes on from where it stopped.

The runner (matrix/orchestrator.Runner) is passed in: this module uses its manifest, plan, `_start_server`,
`_run_point`, `event`, `console`; a packed decision's lanes are orchestrator.Lane, handed in too.
"""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from servesweep.matrix.capacity_search import ProbeResult
from servesweep.matrix.decision import (
    Answer,
    Cell,
    Measured,
    ProbeRecord,
    Shape,
    derive,
    run_decision,
    searched_cells,
)
from servesweep.matrix.decision_packed import DecisionLane, LaneEvent, run_decision_packed
from servesweep.results import manifest as mf
from servesweep.results.store import write_json_atomic

if TYPE_CHECKING:
    from servesweep.matrix.packed import LaneFactory, PlacementRecord

DECISION_JSON = "decision.json"
# a question's state as decision.json says it (matrix/decision.py's status)
STATE = {"decided": "decided", "tie": "tie", "none": "none", "leading": "best-so-far", "open": "unsettled"}


class ProbeFailed(RuntimeError):
    """A probe's point did not finish, or its server did not start: the decision stops there (exit 2)."""


def cell_key(config: str, shape: str) -> str:
    return f"{config}/{shape}"


def move_points_to_decision(data: dict[str, Any]) -> None:
    """In a new manifest: each (configuration, shape) keeps one planned point as the template of its probes; the
    points of the manifest are the decision's probes, added as it runs."""
    templates: dict[str, dict[str, Any]] = {}
    for p in data["points"].values():
        if p["status"] != mf.PENDING:
            continue
        shape = Shape(p["workload"], p["prompt_tokens"], p["output_tokens"])
        templates.setdefault(cell_key(p["config_id"], shape.key), p)
    data["decision"] = {"templates": templates, "status": "pending"}
    data["points"] = {}


def unfinished(data: dict[str, Any]) -> str | None:
    """Why the decision did not finish (None: it did, or the run has none)."""
    d = data.get("decision")
    if d is None or d["status"] == "finished":
        return None
    if d["status"] == "budget":
        return (
            f"the decision stopped at budget.wall_time after {d['probes']} probes: decision.json holds the best "
            "answer so far (servesweep run --resume goes on for another budget)"
        )
    return f"the decision did not finish ({d['status']}: {(d.get('reason') or '')[:300]})"


class _Servers:
    """The one server the decision's probes need now, started through the runner's role (force restart on the run's
    port: the previous configuration's server is replaced)."""

    def __init__(self, runner):
        self.runner = runner
        self.current: str | None = None
        self.seconds: dict[str, float] = {}  # server start time per configuration, this attempt
        self.first_at: float | None = None  # when this attempt first measured (started a server)

    def ensure(self, cid: str) -> None:
        if self.current == cid:
            return
        r = self.runner
        if self.first_at is None:
            self.first_at = time.monotonic()
        if self.current is not None:
            r.m.update_config(self.current, status="done")
        t0 = time.monotonic()
        cfg = next(cp.config for cp in r.plan.configs if cp.config.id == cid)
        if not r.open_config(cfg, [], restart=cid in self.seconds):
            self.current = None
            raise ProbeFailed(f"server {cid} did not start: {(r.m.configs[cid].get('error') or '')[:500]}")
        self.seconds[cid] = self.seconds.get(cid, 0.0) + time.monotonic() - t0
        self.current = cid


class _Probes:
    """measure(cell, load) for run_decision: each look of a probe one point of the manifest, run by the ServerRun
    that serves the cell's configuration now (`serve(config)`: the run itself one server at a time, or the lane of a
    packed decision), or read back from its folder when a previous attempt finished it (resume)."""

    def __init__(self, runner, serve: Callable[[str], Any]):
        self.runner, self.serve = runner, serve
        self.point_of: dict[
            tuple[str, str, int], list[str]
        ] = {}  # (config, shape, load) -> its looks' points

    def __call__(self, cell: Cell, load: int, skip_first_round: bool = False) -> Callable[[int], Measured]:
        """`skip_first_round`: each look runs `load` more requests and is judged without each user's first."""
        parts: list[ProbeResult] = []
        state = {"have": 0, "took": 0.0}
        looks = self.point_of.setdefault((cell.config, cell.shape.key, load), [])
        burst = load if skip_first_round else 0

        def draw(n: int) -> Measured:
            if n > state["have"]:
                pid = f"d-{cell.config}-{cell.shape.key}-c{load}-l{len(parts) + 1}"
                ask = n - int(state["have"]) + burst
                res, wall = self._look(cell, load, pid, len(parts) + 1, ask, skip=bool(burst))
                parts.append(res)
                looks.append(pid)
                state["have"], state["took"] = n, state["took"] + wall
            return _measured(parts, cell.shape.output, state["took"])

        return draw

    def _look(
        self, cell: Cell, load: int, pid: str, look: int, ask: int, skip: bool = False
    ) -> tuple[ProbeResult, float]:
        from servesweep.results.records import read_parquet

        r = self.runner
        p = r.m.points.get(pid)
        if p is None or p["status"] != mf.DONE or p.get("asked") != ask:
            self._new_point(cell, load, pid, look, ask)
            try:
                srv = self.serve(cell.config)
            except ProbeFailed as e:
                r.m.update_point(pid, status=mf.SERVER_FAILED, reason=str(e))
                r.m.save()
                raise
            self._aim(srv, pid)
            t0 = time.monotonic()
            srv._run_point(cell.config, pid)
            done = r.m.update_point(pid, probe_wall_s=round(time.monotonic() - t0, 3))
            r.m.save()
            if done.status != mf.DONE:
                raise ProbeFailed(f"probe {pid}: {done.status}: {(done.reason or '')[:500]}")
        else:
            r.console.print(f"  ↺ {pid}: finished before, read back", markup=False, highlight=False)
        p = r.m.points[pid]
        table = read_parquet(r.run_dir / p["dir"] / "records.parquet")
        if skip:
            table = after_first_round(table)
        return ProbeResult.from_records(table), float(p.get("probe_wall_s") or 0.0)

    def _aim(self, srv, pid: str) -> None:
        """The point at the server that measures it: a lane's address, host and GPUs (labels)."""
        placement = getattr(srv, "placement", None)
        if placement is None:
            return
        point = self.runner.m.points[pid]["point"]
        labels = {**point.get("labels", {}), "host": placement["host"], "gpus": placement["gpus"]}
        self.runner.m.update_point(pid, point={**point, "base_url": srv.base_url(), "labels": labels})

    def _new_point(self, cell: Cell, load: int, pid: str, look: int, ask: int) -> None:
        r = self.runner
        t = r.m.data["decision"]["templates"][cell_key(cell.config, cell.shape.key)]
        p = copy.deepcopy(t)
        point = p["point"]
        point.update(point_id=pid, requests=ask, concurrency=load, duration_s=None)
        p.update(
            concurrency=load, status=mf.PENDING, attempts=0, dir=None, result=None, reason=None, est_s=None,
            decide=cell_key(cell.config, cell.shape.key), look=look, load=load, asked=ask,
        )  # fmt: skip
        r.m.add_point(pid, p)


def after_first_round(table):
    """A closed-loop point's records without each user's first request (the earliest it scheduled; users are
    (worker, user)): those start together, so at a long prompt their prefills queue behind each other, a TTFT tail
    the running load does not have. Counted per user, no clock is compared across processes or hosts."""
    import pyarrow as pa

    users = list(zip(table.column("worker").to_pylist(), table.column("user").to_pylist(), strict=True))
    sched = table.column("scheduled_ns").to_pylist()
    first: dict[tuple[str, int], int] = {}
    for i, (u, t) in enumerate(zip(users, sched, strict=True)):
        if u not in first or t < sched[first[u]]:
            first[u] = i
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(first.values())] = False
    return table.filter(pa.array(keep))


def _measured(parts: Sequence[ProbeResult], output: int, seconds: float) -> Measured:
    """The looks' records as one stream (seconds): a failed request's TTFT and TPOT count as infinite (a tier fails
    on them); the throughput is the successful requests'."""
    ok = np.concatenate([x.ok for x in parts])

    def col(name: str) -> np.ndarray:
        v = np.concatenate([getattr(x, name) for x in parts]) / 1000.0
        return np.where(ok, v, np.inf)

    e2e = col("e2e_ms")
    e2e = e2e[ok & np.isfinite(e2e)]
    if e2e.size < 2:  # nothing served: no throughput
        e2e = np.full(2, 1e6)
    return Measured(col("ttft_ms"), col("tpot_ms"), e2e, output, seconds=seconds)


def decision_document(
    runner, cells: Sequence[Cell], ans: Answer, records: Sequence[ProbeRecord], probes: _Probes,
    *, status: str, elapsed_s: float, server_gpu_s: float,
) -> dict[str, Any]:  # fmt: skip
    """decision.json: the anytime answer, per question and overall, and every probe with its points."""
    d = runner.exp.decide
    per_shape: dict[str, int] = {}
    for r in records:
        per_shape[r.shape] = per_shape.get(r.shape, 0) + 1
    # the probes of each (configuration, shape): an answer whose best cell has none rests on the configuration's
    # fitted calibration (its other shapes' probes) or the step model, not on a measurement of that cell
    cell_probes: dict[tuple[str, str], int] = {}
    for r in records:
        cell_probes[(r.config, r.shape)] = cell_probes.get((r.config, r.shape), 0) + 1
    questions = []
    for q in ans.questions:
        v = q.value
        questions.append(
            {
                "shape": q.shape,
                "tier": q.tier,
                "slos": d.tiers[q.tier],
                "state": STATE[q.status],
                "best": q.best,
                "value": None
                if v is None or q.best is None
                else {
                    "low": _r(v.low),
                    "estimate": _r(v.estimate),
                    "high": _r(v.high),
                    "bracket": list(v.bracket),
                    "from_fit": v.from_prior,  # a bound rests on the configuration's fitted calibration
                    "unit": "output tok/s per GPU at the tier's capacity",
                },
                "alive": q.alive,
                "dropped": q.dropped,
                "probes": per_shape.get(q.shape, 0),
                "best_cell_probes": cell_probes.get((q.best, q.shape), 0) if q.best else 0,
                "label": q.label,
                "guessed": q.guessed,  # settled on a point estimate at a probe's cap, not proven
            }
        )
    states: dict[str, int] = {}
    for row in questions:
        states[row["state"]] = states.get(row["state"], 0) + 1
    probe_gpu_s = ans.gpu_seconds
    label = ans.label if status in ("finished", "running") else f"{ans.label} [{status}]"
    if status == "budget":
        label = f"best so far (budget.wall_time reached): {ans.label.split(': ', 1)[-1]}"
    return {
        "run_id": runner.m.run_id,
        "status": status,
        "complete": status == "finished",
        "label": label,
        "confidence": d.confidence,
        "resolution": d.resolution,
        "tiers": d.tiers,
        "budget_s": runner.exp.budget.wall_time_s,
        "elapsed_s": round(elapsed_s, 1),
        "probes": len(records),
        "states": states,
        "gpu_seconds": round(probe_gpu_s + server_gpu_s, 1),
        "probe_gpu_seconds": round(probe_gpu_s, 1),
        "server_gpu_seconds": round(server_gpu_s, 1),
        "questions": questions,
        "probe_log": [
            {
                "order": r.order,
                "config": r.config,
                "shape": r.shape,
                "load": r.load,
                "requests": r.requests,
                "seconds": round(r.seconds, 2),
                "verdicts": r.verdicts,
                "tput_per_gpu": [_r(x) for x in r.tput],
                "at_cap": r.at_cap,
                "guessed": list(r.guessed),
                # one user's requests of the shape measured_as (its points): shared by the prompt's outputs
                "measured_as": r.measured_as,
                "first_round_skipped": r.skipped,  # requests run on top of `requests`, not judged
                "points": probes.point_of.get((r.config, r.measured_as or r.shape, r.load), []),
            }
            for r in records
        ],
    }


def _r(x: float) -> float | None:
    return round(x, 3) if math.isfinite(x) else None


class _LaneExecutor:
    """matrix/decision_packed.py's Executor on real servers: each lane a placement of the run (orchestrator.Lane: its
    host, GPUs and port, the server's CUDA_VISIBLE_DEVICES), kept in the manifest's `packing` so that a stop or a
    resume stops exactly the servers the decision started; each probe, server start and stop in a thread of its own;
    events come back to the deciding (main) thread through a queue."""

    def __init__(self, runner, hosts, lane_cls: LaneFactory, interrupted: type[BaseException]):
        self.runner, self.Lane, self.Interrupted = runner, lane_cls, interrupted
        self.address = {h.name: h.address or h.name for h in hosts}
        self.t0 = time.monotonic()
        self.first_at: float | None = None  # when the first server start began (the budget counts from there)
        self.events: queue.Queue = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.server: dict[str, Any] = {}  # configuration -> the orchestrator.Lane serving it now
        self.started: set[str] = set()  # configurations whose server this attempt started

    def now(self) -> float:
        return time.monotonic() - self.t0

    def serve(self, config: str):
        return self.server[config]

    def _spawn(self, name: str, fn: Callable[[], LaneEvent | None], lane: DecisionLane) -> None:
        def body() -> None:
            try:
                ev = fn()
            except ProbeFailed as e:
                ev = LaneEvent("failed", lane, error=str(e))
            except BaseException as e:  # noqa: BLE001 - raised again in the deciding thread (next_event)
                self.events.put(e)
                return
            if ev is not None:
                self.events.put(ev)

        t = threading.Thread(target=body, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def _placement(self, lane: DecisionLane) -> PlacementRecord:
        from servesweep.matrix.packed import placement_record

        r = self.runner
        packing = r.m.packing or {"decision": True, "placements": []}
        slot = len(packing["placements"])
        address = self.address.get(lane.host, lane.host)
        pl = placement_record(
            r, lane.config, lane.host, address, lane.cuda_visible_devices, slot, r.port + slot, lane.opened_s,
            lane.opened_s,
        )  # fmt: skip
        packing["placements"].append(pl)
        r.m.packing = packing
        return pl

    def probe(self, lane: DecisionLane, cell: Cell, job: Callable[[], ProbeRecord]) -> None:
        from servesweep.matrix.packed import register_server

        r = self.runner
        first = not lane.started
        if first:  # the lane's placement, recorded before its server starts (a stop then finds it)
            pl = self._placement(lane)
            self.server[lane.config] = self.Lane(r, pl, self.Interrupted)
            r.m.update_config(lane.config, placement=dict(pl), server_stopped=None)
            r.m.save()
            register_server(r, pl)
        srv = self.server[lane.config]

        def run() -> LaneEvent:
            start = 0.0
            if first:
                if self.first_at is None:
                    self.first_at = time.monotonic()
                t0 = time.monotonic()
                cfg = next(cp.config for cp in r.plan.configs if cp.config.id == lane.config)
                if not srv.open_config(cfg, [], restart=lane.config in self.started):
                    why = (r.m.configs[lane.config].get("error") or "")[:500]
                    return LaneEvent("failed", lane, cell, error=f"server {lane.config} did not start: {why}")
                self.started.add(lane.config)
                start = time.monotonic() - t0
            return LaneEvent("probe", lane, cell, job(), start)

        self._spawn(f"decide-{lane.slot}", run, lane)

    def close(self, lane: DecisionLane) -> None:
        r = self.runner
        srv = self.server.pop(lane.config, None)

        def run() -> LaneEvent:
            if srv is not None:
                if r.exp.target.managed and not r.keep_server and not r.stop_requested:
                    srv.stop_server()
                r.m.update_config(lane.config, status="done" if lane.failed is None else "failed")
                r.m.save()
            return LaneEvent("closed", lane)

        self._spawn(f"decide-{lane.slot}-stop", run, lane)

    def next_event(self) -> LaneEvent:
        while True:  # polled: the main thread's signal handler may raise here
            try:
                ev = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(ev, BaseException):
                raise ev
            return ev

    def join(self) -> None:
        """Every lane's thread ended (a stop reaches their Locust points and Ansible runs within a second)."""
        for t in self.threads:
            while t.is_alive():
                t.join(timeout=0.2)


def decision_packs(runner) -> bool:
    """Whether the decision packs its probes over the hosts' GPUs (the default, as `servesweep plan` prices it):
    not with `parallel: false`, `--max-parallel 1` or an unmanaged target (one server the run does not start)."""
    exp = runner.exp
    return bool(exp.decide and exp.target.managed and exp.parallel and (runner.m.max_parallel or 2) > 1)


def run_decision_phase(runner, lane_cls: LaneFactory, interrupted: type[BaseException]) -> None:
    """The decision of the run's `decide:` block, with decision.json after each probe: packed over the hosts' GPUs
    (decision_packs; each lane an orchestrator.Lane, handed in as `lane_cls` with the run's `interrupted`: this
    module may not import the orchestrator) or one server at a time."""
    from servesweep.matrix.planner import decision_cells, decision_settings

    exp, m = runner.exp, runner.m
    d = exp.decide
    entry = m.data["decision"]
    cells = [c for c in decision_cells(runner.plan) if cell_key(c.config, c.shape.key) in entry["templates"]]
    packed = decision_packs(runner)
    servers = _Servers(runner)
    executor: _LaneExecutor | None = None
    if packed:
        from servesweep.matrix.gpu_hosts import gpu_hosts

        hosts = gpu_hosts(exp, m.experiment_file)
        executor = _LaneExecutor(runner, hosts, lane_cls, interrupted)
        probes = _Probes(runner, executor.serve)
    else:

        def serve(cid: str):
            servers.ensure(cid)
            return runner

        probes = _Probes(runner, serve)
    records: list[ProbeRecord] = []
    budget = exp.budget.wall_time_s
    before = float(entry.get("elapsed_s") or 0.0)
    t0 = time.monotonic()
    entry.update(status="running", started=entry.get("started") or mf.now_iso(), reason=None, packed=packed)
    m.save()
    gpus = {c.config: c.gpus for c in cells}
    lanes: list[DecisionLane] = []

    def server_gpu_s() -> float:
        if executor is not None:
            return sum(lane.start_s * gpus.get(lane.config, 1) for lane in lanes)
        return sum(s * gpus.get(k, 1) for k, s in servers.seconds.items())

    def write(ans: Answer, status: str) -> None:
        elapsed = before + time.monotonic() - t0
        doc = decision_document(
            runner, cells, ans, records, probes, status=status, elapsed_s=elapsed, server_gpu_s=server_gpu_s()
        )
        if executor is not None:
            doc["lanes"] = [lane.as_dict() for lane in lanes]
        write_json_atomic(runner.run_dir / DECISION_JSON, doc)
        entry.update(probes=len(records), label=doc["label"], elapsed_s=round(elapsed, 1))
        m.save()

    def on_record(rec: ProbeRecord, ans: Answer, lane: DecisionLane | None = None) -> None:
        records.append(rec)
        write(ans, "running")
        verdicts = " ".join(f"{k}:{v}" for k, v in rec.verdicts.items())
        where = f" on {lane.host}:{lane.cuda_visible_devices}" if lane is not None else ""
        if rec.measured_as not in (None, rec.shape):
            where += f" measured as {rec.measured_as}"
        runner.console.print(
            f"decision: probe {rec.order} {rec.config} {rec.shape} c{rec.load}{where} ({rec.requests} requests, "
            f"{verdicts}, {rec.tput[1]:.1f} tok/s/GPU) -> {ans.label}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def first_at() -> float | None:
        return executor.first_at if executor is not None else servers.first_at

    def stop() -> bool:  # this attempt's measuring time (a resume's read-back probes cost nothing)
        started = first_at()
        return budget is not None and started is not None and time.monotonic() - started >= budget

    kw: dict[str, Any] = {"resolution": d.resolution, "confidence": d.confidence}
    runner.console.rule(
        f"decision: {len({c.shape.key for c in cells}) * len(d.tiers)} questions over "
        f"{len({c.config for c in cells})} configurations"
        + (f", packed on {sum(h.gpus for h in hosts)} GPUs" if packed else ", one server at a time")
    )
    error: str | None = None
    if executor is not None:
        from servesweep.matrix.packed import holding, stop_placements

        if m.packing and exp.target.managed and not runner.keep_server:
            # a killed attempt's servers: stopped before this one starts its own
            stop_placements(runner, executor.Interrupted, executor.Lane, holding(runner, m.packing))

        def on_lane(lane: DecisionLane, what: str) -> None:
            if what == "opened":
                lanes.append(lane)

        try:
            res = run_decision_packed(
                cells,
                d.tiers,
                probes,
                hosts,
                executor,
                max_parallel=m.max_parallel,
                stop=stop,
                on_record=on_record,
                on_lane=on_lane,
                **decision_settings(exp),
            )
        except BaseException:
            runner.stop_requested = True
            executor.join()
            raise
        run, error = res.run, res.error
    else:
        try:
            run = run_decision(
                cells,
                d.tiers,
                probes,
                **decision_settings(exp),
                on_record=on_record,
                stop=stop,
                one_server=True,
            )
        except ProbeFailed as e:
            error = str(e)
            run = None
    if error is not None or run is None:  # the answer so far, on the cells the decision searched
        ans = derive(searched_cells(cells, d.knee_margin), list(d.tiers), records, **kw)
        entry.update(status="failed", reason=error or "stopped", finished=mf.now_iso())
        write(ans, "failed")
        runner.event(f"[red]✗ decision stopped[/]: {error}")
        return
    status = "budget" if run.budget_hit else "finished"
    entry.update(status=status, finished=mf.now_iso())
    write(run.answer, status)
    if servers.current is not None:
        m.update_config(servers.current, status="done")
        m.save()
    runner.event(f"decision: {entry['label']}")
    for q in run.answer.questions:
        runner.event(f"  {q.shape} {q.tier}: {STATE[q.status]}: {q.best or '-'} ({q.label})")
