"""The decision's probes packed onto the hosts' GPUs: several configurations' servers up at once, each probing its
own cells, the answer re-derived as each probe lands (docs/decision.md, "Packed").

A *lane* is one configuration's server on GPUs of one host (matrix/placement.py picks them: best-fit within the
host's topology). It probes one cell at a time and closes (its server stopped, its GPUs freed) once its
configuration has nothing left worth a probe; a configuration closed and needed again gets a new lane (its server
started again). At most `max_parallel` lanes at once. What each idle lane and free GPUs take next:
- `lookahead` (the default): the one-at-a-time decision (matrix/decision.py `Decider.work`, its order) run forward on
  a fork of the decision, every probe in flight and every probe it names assumed to measure its configuration's
  calibrated step model; the first probes it names of configurations whose lane is idle, or that fit free GPUs,
  start now (their loads from the real decision); idle lanes it does not name give their GPUs back. So the lanes do
  what one-at-a-time would do next, as far as the model can tell, instead of each probing its own best.
- `greedy` (and the lookahead's fallback when it names nothing that can start): a configuration whose best score is
  at least `threshold` x the best of all gets a lane where GPUs are free; idle lanes worth less give theirs back
  while it waits; with none waiting, free GPUs take lesser work (backfilling).

The loop is the same for the plan and the run; only the executor differs: `SimulatedExecutor` (here: virtual time,
each probe drawn at once from the caller's measure and finished at now + its seconds) gives `servesweep plan` its
time to decision; the run's executor (matrix/decision_run.py) starts servers and runs Locust points in one thread
per lane. Events come back one at a time to the deciding thread, which alone changes the Decider.

A stop (`stop()`, the budget) or a failed lane (its server did not start, a probe's point failed) halts it: no new
probe starts, the probes in flight finish and count, every lane closes; the failure is then returned.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from servesweep.matrix.decision import (
    Answer,
    Cell,
    Decider,
    DecisionRun,
    Measure,
    Noise,
    ProbeRecord,
    Work,
    simulated_measure,
)
from servesweep.matrix.placement import GpuHost, fits_host, pick_gpus


@dataclass
class DecisionLane:
    """One configuration's server on GPUs of one host, for as long as the decision probes it there."""

    slot: int  # in the order lanes opened: names the server (port, work folder)
    config: str
    host: str
    gpu_ids: tuple[int, ...]
    opened_s: float  # on the executor's clock
    closed_s: float | None = None
    started: bool = False  # its server is up (its first probe starts it)
    busy: bool = False  # a probe (or its close) in flight
    probes: int = 0
    start_s: float = 0.0  # what its server's start took
    failed: str | None = None

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpu_ids)

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "config": self.config,
            "host": self.host,
            "gpus": self.cuda_visible_devices,
            "opened_s": round(self.opened_s, 1),
            "closed_s": None if self.closed_s is None else round(self.closed_s, 1),
            "probes": self.probes,
            "start_s": round(self.start_s, 1),
            "failed": self.failed,
        }


@dataclass
class LaneEvent:
    kind: Literal["probe", "closed", "failed"]
    lane: DecisionLane
    cell: Cell | None = None
    record: ProbeRecord | None = None
    start_s: float = 0.0  # the server start this probe paid (its lane's first)
    error: str | None = None


class Executor(Protocol):
    """Runs what the loop asks, each asynchronously, and hands back one event at a time."""

    def now(self) -> float: ...

    def probe(self, lane: DecisionLane, cell: Cell, job: Callable[[], ProbeRecord]) -> None:
        """Start the lane's server unless it is up, then `job()` (one sequential probe): a `probe` event (a
        `failed` one when the server did not start or the probe's point failed)."""

    def close(self, lane: DecisionLane) -> None:
        """Stop the lane's server: a `closed` event once its GPUs are free."""

    def next_event(self) -> LaneEvent: ...


@dataclass
class PackedDecision:
    run: DecisionRun
    lanes: list[DecisionLane]
    wall_s: float  # the executor's clock at the end: the time to decision, packed
    error: str | None = None  # why it halted, when a lane failed
    at_budget: Answer | None = None  # the answer when the clock passed `snapshot_s` (default `budget_s`)

    @property
    def restarts(self) -> dict[str, int]:
        """Per configuration: the lanes it had beyond its first (a server started again)."""
        out: dict[str, int] = {}
        for lane in self.lanes:
            out[lane.config] = out.get(lane.config, -1) + 1
        return {k: v for k, v in out.items() if v > 0}


class SimulatedExecutor:
    """Virtual time: a probe is drawn at once from `measure` and finishes at now + its server's start (a lane's
    first) + its seconds; a close takes `stop_s[config]`."""

    def __init__(self, stop_s: Mapping[str, float] | None = None):
        self.t = 0.0
        self.stop_s = dict(stop_s or {})
        self._heap: list[tuple[float, int, LaneEvent]] = []
        self._seq = 0

    def now(self) -> float:
        return self.t

    def _at(self, t: float, ev: LaneEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, ev))

    def probe(self, lane: DecisionLane, cell: Cell, job: Callable[[], ProbeRecord]) -> None:
        start = 0.0 if lane.started else cell.start_s
        rec = job()
        self._at(self.t + start + rec.seconds, LaneEvent("probe", lane, cell, rec, start))

    def close(self, lane: DecisionLane) -> None:
        self._at(self.t + self.stop_s.get(lane.config, 0.0), LaneEvent("closed", lane))

    def next_event(self) -> LaneEvent:
        t, _, ev = heapq.heappop(self._heap)
        self.t = max(self.t, t)
        return ev


def run_decision_packed(
    cells: Sequence[Cell],
    tier_texts: Mapping[str, Sequence[str]],
    measure: Measure,
    hosts: Sequence[GpuHost],
    executor: Executor,
    *,
    max_parallel: int | None = None,
    stop: Callable[[], bool] | None = None,
    budget_s: float | None = None,
    snapshot_s: float | None = None,
    on_record: Callable[[ProbeRecord, Answer, DecisionLane], None] | None = None,
    on_lane: Callable[[DecisionLane, str], None] | None = None,
    max_rounds: int = 5000,
    threshold: float = 0.9,
    backfill: bool = True,
    policy: str = "lookahead",
    lookahead_steps: int = 60,
    **settings: Any,
) -> PackedDecision:
    """Decide every question with lanes side by side on `hosts` (module docstring). `stop()` (checked before each
    probe starts) halts it, as does `budget_s` on the executor's clock (the answer then is best-so-far);
    `on_record(record, answer, lane)` sees each probe landed and the answer after it, `on_lane(lane, what)` each
    lane opened and closed. `settings`: matrix/decision.py's Decider."""
    dec = Decider(cells, tier_texts, **settings)
    free = {h.name: set(range(h.gpus)) for h in hosts}
    active: dict[str, DecisionLane] = {}  # configuration -> its open lane
    lanes: list[DecisionLane] = []
    flying: dict[int, tuple[Cell, int, list[str]]] = {}  # lane slot -> the probe in flight there
    spec_noise = settings.get("noise") or Noise()
    halted = budget_hit = False
    error: str | None = None
    at_budget: Answer | None = None
    rounds = 0
    placeable = [c for c, n in dec.gpus.items() if any(fits_host(h, n) for h in hosts)]

    def start_probe(lane: DecisionLane, work: list[Work]) -> bool:
        nonlocal rounds
        while work:
            w = max(work, key=lambda x: x.score)
            load = dec.load_for(w)
            if load is not None:
                rounds += 1
                lane.busy = True
                lane.probes += 1
                flying[lane.slot] = (w.cell, load, list(w.want))
                job = partial(dec.probe, w.cell, load, list(w.want), measure)
                executor.probe(lane, w.cell, job)
                return True
            work = dec.work(dec.answer(), configs=[lane.config])
        return False

    def place(config: str, work: list[Work]) -> bool:
        """A lane for `config` on the first host with GPUs free for it, its first probe (the best of `work`, its
        cells) started; False: none fit."""
        for h in hosts:
            ids = pick_gpus(h, free[h.name], dec.gpus[config])
            if ids is None:
                continue
            lane = DecisionLane(len(lanes), config, h.name, ids, executor.now())
            free[h.name] -= set(ids)
            lanes.append(lane)
            active[config] = lane
            if on_lane is not None:
                on_lane(lane, "opened")
            if not start_probe(lane, work):
                close(lane)
            return True
        return False

    def close(lane: DecisionLane) -> None:
        lane.busy = True
        executor.close(lane)

    def greedy_pass() -> None:
        """Each idle lane its configuration's best cell; a configuration whose best is at least `threshold` x the
        best of all gets a lane where GPUs are free; idle lanes worth less give theirs back while it waits for GPUs;
        with none waiting, free GPUs take lesser work (backfilling)."""
        ans = dec.answer()
        fresh = [c for c in placeable if c not in active]
        # every cell's score; a configuration without a lane pays its server's start (to rank configurations; a new
        # lane then picks among its own cells as a running one does, without it)
        work = dec.work(ans, configs=[c for c in placeable if c in active]) + dec.work(ans, running="", configs=fresh)
        own = dec.work(ans, configs=fresh)
        bar = threshold * max((w.score for w in work), default=0.0)
        best: dict[str, float] = {}
        for w in work:
            best[w.cell.config] = max(best.get(w.cell.config, 0.0), w.score)
        ranked = [c for c in sorted(best, key=lambda k: (-best[k], k)) if c not in active]
        eligible = [c for c in ranked if best[c] >= bar]
        blocked = False
        for config in eligible:
            if max_parallel is not None and len(active) >= max_parallel:
                blocked = True
                break
            if not place(config, [w for w in own if w.cell.config == config]):
                blocked = True
        for lane in sorted(active.values(), key=lambda x: x.slot):
            if lane.busy:
                continue
            mine = best.get(lane.config)
            if mine is None or (mine < bar and blocked):
                close(lane)
            elif not start_probe(lane, [w for w in work if w.cell.config == lane.config]):
                close(lane)
        if not blocked and backfill:
            for config in ranked:
                if config in active or config in eligible:
                    continue
                if max_parallel is not None and len(active) >= max_parallel:
                    break
                place(config, [w for w in own if w.cell.config == config])

    def lookahead_pass() -> None:
        """What the one-at-a-time decision would probe next if every probe in flight, and every probe it would make
        before, measured the step model's calibrated prediction: the first such probes of configurations whose
        lane is idle or that fit free GPUs start now; idle lanes it does not name give their GPUs back."""
        spec = dec.fork()
        measure_spec = simulated_measure(spec_noise, _Expected(spec), 0)
        for lane in active.values():
            if lane.slot in flying:  # (a closing lane has no probe in flight)
                c, ld, want = flying[lane.slot]
                spec.add(spec.probe(c, ld, want, measure_spec), c)
        busy = {lane.config for lane in active.values() if lane.busy}
        picks: list[str] = []
        trial = {h: set(f) for h, f in free.items()}
        steps = 0
        real = dec.work(dec.answer())
        # the smallest server any configuration with work left needs: free GPUs fewer than that take no pick
        smallest = min((dec.gpus[w.cell.config] for w in real), default=1)
        while steps < lookahead_steps:
            idle = [x for x in active.values() if not x.busy and x.config not in picks]
            if not idle and all(len(f) < smallest for f in trial.values()):
                break  # every slot that could start a probe now has its pick
            steps += 1
            work = spec.work(spec.answer())
            if not work:
                break
            w = max(work, key=lambda x: x.score)
            load = spec.load_for(w)
            if load is None:
                continue
            config = w.cell.config
            if config not in busy and config not in picks:
                have = active.get(config)
                if have is not None and not have.busy:
                    picks.append(config)
                elif have is None:
                    fit = next(((h, i) for h in hosts if (i := pick_gpus(h, trial[h.name], dec.gpus[config]))), None)
                    if fit is not None:
                        trial[fit[0].name] -= set(fit[1])
                        picks.append(config)
                    elif not any(x.busy for x in active.values()) and not picks:
                        picks.append(config)  # nothing runs: the idle lanes make room for it
            spec.add(spec.probe(w.cell, load, w.want, measure_spec), w.cell)
        for lane in sorted(active.values(), key=lambda x: x.slot):
            if not lane.busy and lane.config not in picks:
                close(lane)
        for config in picks:
            mine = [w for w in real if w.cell.config == config]
            have = active.get(config)
            if have is not None and not have.busy:
                if not mine or not start_probe(have, mine):
                    close(have)
            elif have is None and mine and (max_parallel is None or len(active) < max_parallel):
                place(config, mine)

    while True:
        if not halted and (
            (stop is not None and stop()) or (budget_s is not None and executor.now() >= budget_s)
        ):
            halted = budget_hit = True
        if not halted and rounds >= max_rounds:
            halted = True
        if halted:
            for lane in list(active.values()):
                if not lane.busy:
                    close(lane)
        else:
            if policy == "lookahead":
                lookahead_pass()
            if policy != "lookahead" or not any(lane.busy for lane in active.values()):
                greedy_pass()  # (after the lookahead: its picks had nothing left to probe, the greedy choice instead)
        if not any(lane.busy for lane in active.values()):
            break
        ev = executor.next_event()
        lane = ev.lane
        lane.busy = False
        flying.pop(lane.slot, None)
        if ev.kind == "closed":
            lane.closed_s = executor.now()
            free[lane.host] |= set(lane.gpu_ids)
            del active[lane.config]
            if on_lane is not None:
                on_lane(lane, "closed")
            continue
        if ev.kind == "failed":
            lane.failed = ev.error
            error = error or ev.error
            halted = True
            continue
        assert ev.record is not None and ev.cell is not None
        if not lane.started:
            lane.started, lane.start_s = True, ev.start_s
        snap = snapshot_s if snapshot_s is not None else budget_s
        if snap is not None and at_budget is None and executor.now() >= snap:
            at_budget = dec.answer(complete=False)
        dec.add(ev.record, ev.cell, start_s=ev.start_s)
        if on_record is not None:
            on_record(ev.record, dec.answer(), lane)
    run = dec.result(rounds, budget_hit)
    return PackedDecision(run, lanes, executor.now(), error, at_budget)


class _Expected(dict):
    """truth[(config, shape)] for simulated_measure: each cell's prediction calibrated to the decider's probes."""

    def __init__(self, dec: Decider):
        super().__init__()
        self.dec = dec
        self.of = {c.key: c for c in dec.cells}

    def __missing__(self, key):
        return self.dec.expected(self.of[key])
