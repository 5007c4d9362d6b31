"""A packed run: placed server configurations run at the same time, each on its own host, GPUs and port.

The placements come from servesweep.matrix.placement (through timeline.attach_schedule) and are kept in the
manifest (`packing`), so a resumed run puts every configuration back where it stood: same host, same GPUs
(`CUDA_VISIBLE_DEVICES` in the server's environment), same port (and so the same server work folder, whose pidfile
lets the role stop a server a killed run left). A placement starts when every earlier placement that shares one of
its GPUs has finished and fewer than `max_parallel` run; each runs in its own thread as a `Lane`: the orchestrator's
per-configuration code path (start the server, run the points, restart a dead server and retry its point) with its
own server, base URL, Locust master and records, and the labels `host` and `gpus` on its points. Every lane's
ansible-runner call has its own private data dir and artifact folder (run_playbook), and only the main thread
installs signal handlers; a signal stops every lane: a lane's Locust point is stopped at its next progress report,
its Ansible run at its next poll; then the main thread stops the server of every placement that started one
(stop_placements, all at once), so a Ctrl-C or SIGTERM leaves no server on any GPU. A placement's server that its
lane stopped is marked (`server_stopped` on its configuration), so a resume after a SIGKILL stops exactly the
servers the killed run left: those of placements still to run are restarted where they stood (same host, GPUs,
port, work folder), those of finished placements are stopped before anything starts.

A lane's state is explicit (servesweep.matrix.orchestrator): `Lane` is a ServerRun of its own (placement, port,
base URL, console, Ansible state, pending points) over the run's RunState, the one object every lane shares
(manifest, experiment, plan, owned processes, exporter, the stop), which says what lane threads may change and
how. The orchestrator imports this module, which may not import it back (pyproject.toml: no import circles), so
it hands the class in (LaneFactory) and this module sees the run through RunView.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from servesweep.matrix.isolation_rerun import add_samples, run_samples
from servesweep.matrix.timeline import attach_schedule
from servesweep.net import free_port
from servesweep.results import manifest as mf

if TYPE_CHECKING:
    from servesweep.config.experiment import Experiment
    from servesweep.matrix.planner import Plan
    from servesweep.observe.targets import RunTargets

POLL_S = 0.2


class PlacementRecord(TypedDict):
    """One placement as the manifest's `packing` keeps it (packing_of); a resume reads it back unchanged."""

    config: str
    host: str
    address: str  # where the load generator reaches the host's servers
    gpus: str  # the server's CUDA_VISIBLE_DEVICES
    port: int
    slot: int  # index in the schedule: names the server (port, work folder)
    planned_start_s: float
    planned_end_s: float


class RunView(Protocol):
    """What this module reads and changes of the run (orchestrator.Runner, the main thread's)."""

    port: int  # the run's port: the first placement's when the target is local
    console: Any
    in_ansible: bool  # set while the placements' servers are stopped: a signal then waits for the stops
    stop_requested: bool  # set to stop every lane; cleared by stop_placements before its own Ansible runs

    @property
    def m(self) -> mf.Manifest: ...

    @property
    def exp(self) -> Experiment: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def keep_server(self) -> bool: ...

    def event(self, text: str) -> None: ...

    def run_targets(self) -> RunTargets: ...


class PlacementLane(Protocol):
    """What the scheduler asks of one placement's lane (orchestrator.Lane)."""

    tag: str  # host:gpus

    def run_placement(self) -> None: ...

    def stop_server(self, artifact_dir: Path | None = None) -> bool: ...


# orchestrator.Lane: called with (the run's Runner, a PlacementRecord, the run's Interrupted); Callable[...]: the
# class takes the Runner itself, of which RunView is a part
LaneFactory = Callable[..., PlacementLane]


def placement_record(
    runner: RunView, config: str, host: str, address: str, gpus: str, slot: int, port: int,
    start_s: float, end_s: float,
) -> PlacementRecord:  # fmt: skip
    """One placement as the manifest keeps it. Its port: on this machine the run's port for the first placement
    and a free one for the others; on a remote host `port` (the schedule's: base port + slot)."""
    local = runner.exp.target.inventory == "local"
    return {
        "config": config,
        "host": host,
        "address": address,
        "gpus": gpus,
        "port": (runner.port if slot == 0 else free_port()) if local else port,
        "slot": slot,
        "planned_start_s": round(start_s, 1),
        "planned_end_s": round(end_s, 1),
    }


def register_server(runner: RunView, pl: PlacementRecord) -> None:
    """The placement's server /metrics among the observe stack's targets (observe/targets.py), labelled host and
    gpus; removed when the run closes."""
    path = runner.exp.launcher.metrics_path
    if path is None:
        return
    runner.run_targets().server(
        f"{pl['address']}:{pl['port']}",
        config=pl["config"],
        metrics_path=path,
        role=f"server-{pl['slot']}",
        labels={"host": pl["host"], "gpus": pl["gpus"]},
    )


def packing_of(runner: RunView, max_parallel: int | None) -> dict[str, Any]:
    """The run's placements, from the manifest when a previous run stored them, else planned now and stored."""
    kept = runner.m.packing
    if kept:
        return kept
    s = attach_schedule(runner.plan, runner.m.experiment_file, max_parallel, base_port=runner.port)
    hosts = {h.name: h.address or h.name for h in s.hosts}
    placements = [
        placement_record(
            runner, p.config_id, p.host, hosts[p.host], p.cuda_visible_devices, p.slot, p.port, p.start_s, p.end_s
        )
        for p in s.placements
    ]
    packing = {
        "max_parallel": s.max_parallel,
        "planned_wall_s": round(s.makespan_s, 1),
        "serial_s": round(s.serial_s, 1),
        "placements": placements,
        "unplaced": s.unplaced,
    }
    runner.m.packing = packing
    for cid, why in s.unplaced.items():
        for pid, p in runner.m.points_typed().items():
            if p.config_id == cid and p.status not in mf.FINISHED:
                runner.m.update_point(pid, status=mf.SERVER_FAILED, reason=f"not placed: {why}")
    if runner.m.isolation_sample:
        add_samples(runner.m, packing)  # the isolation sample: re-run alone after the packed phase
    else:
        packing["isolation_sample"] = False
        runner.event(
            "isolation sample off (--no-isolation-sample): packed points are not checked against alone"
        )
    runner.m.save()
    return packing


def holding(runner: RunView, packing: dict[str, Any]) -> list[PlacementRecord]:
    """The placements that may hold a server: their lane started (this run or a killed one) and did not stop it."""
    out: list[PlacementRecord] = []
    for pl in packing.get("placements", []):
        c = runner.m.config(pl["config"]) if pl["config"] in runner.m.configs else None
        if c is not None and c.placement and not c.server_stopped:
            out.append(pl)
    return out


def stop_placements(
    runner: RunView,
    interrupted: type[BaseException],
    lane_cls: LaneFactory,
    placements: list[PlacementRecord],
    *,
    outside_run_dir: bool = False,
) -> list[str]:
    """Stop the servers of `placements` at the same time, one thread (and one Ansible run) each; the main thread
    waits, counted as in Ansible, so a second signal cancels the stops instead of breaking out of them. With a full
    results folder each stop's artifacts go to a temporary folder. Returns the placements stopped (host:gpus)."""
    if not placements:
        return []
    stopped: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="servesweep-stop-")) if outside_run_dir else None

    def stop(pl: PlacementRecord) -> None:
        lane = lane_cls(runner, pl, interrupted)
        try:
            where = scratch / str(pl["slot"]) if scratch else None
            if lane.stop_server(artifact_dir=where):
                stopped.append(lane.tag)
        except (interrupted, OSError) as e:
            runner.console.print(f"[yellow]could not stop {pl['config']} on {lane.tag}: {e}[/]")

    runner.stop_requested = False
    runner.in_ansible = True
    threads = [threading.Thread(target=stop, args=(pl,), daemon=True) for pl in placements]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=POLL_S)
    finally:
        runner.in_ansible = False
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    runner.console.print(
        f"stopped the servers of {len(stopped)} of {len(placements)} placement(s): {', '.join(stopped)}"
    )
    return stopped


class PackedRun:
    """Runs the placements: each in a thread once its GPUs are free; the main thread waits, and on a signal (its
    handler raises `interrupted` here) tells every lane to stop and waits for them."""

    def __init__(
        self,
        runner: RunView,
        packing: dict[str, Any],
        interrupted: type[BaseException],
        lane_cls: LaneFactory,
    ):
        self.runner = runner
        self.packing = packing
        self.interrupted = interrupted
        self.lane = lane_cls
        self.threads: dict[int, threading.Thread] = {}
        self.errors: dict[int, BaseException] = {}

    def _todo(self) -> list[PlacementRecord]:
        pending = {
            p.config_id
            for p in self.runner.m.points_typed().values()
            if p.status not in mf.FINISHED and p.isolation_of is None
        }
        return [pl for pl in self.packing["placements"] if pl["config"] in pending]

    def _ready(self, pl: PlacementRecord, todo: list[PlacementRecord]) -> bool:
        """Every earlier placement of the plan that shares a GPU of this one has ended."""
        mine = set(pl["gpus"].split(","))
        for other in todo:
            if other["slot"] >= pl["slot"]:
                break
            if other["host"] == pl["host"] and mine & set(other["gpus"].split(",")):
                t = self.threads.get(other["slot"])
                if t is None or t.is_alive():
                    return False
        return True

    def _lane(self, pl: PlacementRecord) -> None:
        try:
            self.lane(self.runner, pl, self.interrupted).run_placement()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self.errors[pl["slot"]] = e

    def run(self) -> None:
        todo = self._todo()
        # a killed run's servers on placements with nothing left to run: stopped before anything starts
        slots = {pl["slot"] for pl in todo}
        left = [pl for pl in holding(self.runner, self.packing) if pl["slot"] not in slots]
        if left and self.runner.exp.target.managed and not self.runner.keep_server:
            stop_placements(self.runner, self.interrupted, self.lane, left)
        self._write_targets()
        limit = self.packing.get("max_parallel")
        try:
            while any(pl["slot"] not in self.threads or self.threads[pl["slot"]].is_alive() for pl in todo):
                self._raise_lane_error()
                running = sum(1 for t in self.threads.values() if t.is_alive())
                for pl in todo:
                    if pl["slot"] in self.threads or (limit and running >= limit):
                        continue
                    if self._ready(pl, todo):
                        t = threading.Thread(
                            target=self._lane, args=(pl,), name=f"lane-{pl['slot']}", daemon=True
                        )
                        self.threads[pl["slot"]] = t
                        t.start()
                        running += 1
                time.sleep(POLL_S)
            self._raise_lane_error()
            run_samples(self.runner, self.packing, self.interrupted, self.lane)
        except BaseException:
            self.runner.stop_requested = True
            self._join()
            raise

    def _raise_lane_error(self) -> None:
        for e in self.errors.values():
            if not isinstance(e, self.interrupted):
                raise e
        if self.errors:
            raise next(iter(self.errors.values()))

    def _join(self) -> None:
        for t in self.threads.values():
            while t.is_alive():
                t.join(timeout=POLL_S)

    def _write_targets(self) -> None:
        """The observe stack's targets (observe/targets.py, as a serial run registers them): the run's exporter and
        every placed server's /metrics, labelled host and gpus; removed when the run closes."""
        self.runner.run_targets()  # the run's exporter, even with no server /metrics path
        for pl in self.packing["placements"]:
            register_server(self.runner, pl)
