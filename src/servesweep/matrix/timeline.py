"""The packed schedule of a plan, for `servesweep plan` and `servesweep run`: which configuration runs on which
host and GPUs when, its wall time next to the serial one, as JSON and as a compact text Gantt chart per host and
GPU. The schedule itself is servesweep.matrix.placement's (longest first, list scheduling)."""

from __future__ import annotations

import string
from typing import Any

from servesweep.matrix.gpu_hosts import InventoryError, gpu_hosts, jobs_of
from servesweep.matrix.placement import GpuHost, Schedule, schedule

GANTT_WIDTH = 64
LETTERS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def attach_schedule(
    plan, experiment_file: str | None = None, max_parallel: int | None = None, base_port: int | None = None
) -> Schedule:
    """Pack the plan's configurations onto the hosts of its inventory and keep the schedule on the plan
    (`plan.schedule`, `plan.schedule_note`). `parallel: false` means one server at a time. An unreadable inventory
    falls back to one host of `launcher.gpus_per_host` GPUs, with a note saying why. Ports count up from `base_port`
    (default: target.port, or 30000 when that is 0)."""
    exp = plan.experiment
    note = None
    try:
        hosts = gpu_hosts(exp, experiment_file)
    except InventoryError as e:
        hosts = [GpuHost("host", exp.launcher.gpus_per_host)]
        note = f"{e}; packed as one host of launcher.gpus_per_host ({exp.launcher.gpus_per_host}) GPUs"
    limit = 1 if not exp.parallel else max_parallel
    base_port = base_port or exp.target.port or 30000
    plan.schedule = schedule(jobs_of(plan), hosts, base_port=base_port, max_parallel=limit)
    plan.schedule.serial_s = plan.total_s  # the figure plan prints: neighbours that share a server start once
    plan.schedule_note = note
    return plan.schedule


def schedule_of(plan) -> Schedule:
    return getattr(plan, "schedule", None) or attach_schedule(plan)


def packed_json(plan) -> dict[str, Any]:
    s = schedule_of(plan)
    return {
        "method": "longest-processing-time-first list scheduling onto free GPU sets (topology best-fit)",
        "hosts": [
            {"name": h.name, "gpus": h.gpus, "gpu_groups": [list(g) for g in h.groups]} for h in s.hosts
        ],
        "max_parallel": s.max_parallel,
        "wall_s": round(s.makespan_s, 1),
        "serial_s": round(s.serial_s, 1),
        "placements": [
            {
                "config": p.config_id,
                "host": p.host,
                "gpus": list(p.gpu_ids),
                "cuda_visible_devices": p.cuda_visible_devices,
                "port": p.port,
                "start_s": round(p.start_s, 1),
                "end_s": round(p.end_s, 1),
            }
            for p in s.placements
        ],
        "unplaced": s.unplaced,
        "note": getattr(plan, "schedule_note", None),
    }


def _fmt(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.2f}h"


def gantt_lines(s: Schedule, width: int = GANTT_WIDTH) -> list[str]:
    """One row per host and GPU: each placement's letter over the share of the wall time it holds that GPU."""
    span = s.makespan_s or 1.0
    letter = {p.slot: LETTERS[p.slot % len(LETTERS)] for p in s.placements}
    name_w = max((len(h.name) for h in s.hosts), default=4)
    lines = []
    for h in s.hosts:
        for g in range(h.gpus):
            row = ["."] * width
            for p in s.placements:
                if p.host == h.name and g in p.gpu_ids:
                    a = int(p.start_s / span * width)
                    b = max(a + 1, int(round(p.end_s / span * width)))
                    for i in range(a, min(b, width)):
                        row[i] = letter[p.slot]
            label = h.name if g == 0 else ""
            lines.append(f"{label:>{name_w}} {g:>2} |{''.join(row)}|")
    ticks = (
        " " * (name_w + 4) + "0" + f"{_fmt(span / 2):>{width // 2}}" + f"{_fmt(span):>{width - width // 2}}"
    )
    lines.append(ticks)
    return lines


def legend_lines(s: Schedule, *, ports_chosen_at_start: bool = False) -> list[str]:
    """One line per placement; with target.port 0 the run picks a free port per server when it starts it, so the
    plan names none (the base+slot numbers it counts with would be wrong)."""
    return [
        f"{LETTERS[p.slot % len(LETTERS)]} {p.config_id}: {p.host} GPU {p.cuda_visible_devices}, "
        + ("a free port at start" if ports_chosen_at_start else f"port {p.port}")
        + f", {_fmt(p.start_s)}-{_fmt(p.end_s)}"
        for p in s.placements
    ]


def print_packed(plan, console) -> None:
    """The packed timeline and its wall time next to the serial one."""
    s = schedule_of(plan)
    if not s.placements:
        return
    gpus = sum(h.gpus for h in s.hosts)
    at_once = (
        "one server at a time (parallel: false)"
        if s.max_parallel == 1
        else (f"at most {s.max_parallel} servers at once" if s.max_parallel else "as many servers as fit")
    )
    exp = plan.experiment
    # the emulator has no GPU: its host's GPUs are the launcher's declared count (launcher.gpus_per_host)
    kind = f"emulated {exp.launcher.gpu} GPUs" if exp.launcher.emulator else "GPUs"
    console.print(
        f"[bold]packed[/] onto {len(s.hosts)} host(s), {gpus} {kind} (longest first, {at_once}): wall time "
        f"[bold]{_fmt(s.makespan_s)}[/] against {_fmt(s.serial_s)} one configuration after another "
        f"({s.serial_s / s.makespan_s if s.makespan_s else 1:.1f}× less); run it with  servesweep run --max-parallel N"
    )
    note = getattr(plan, "schedule_note", None)
    if note:
        console.print(f"[yellow]! {note}[/]")
    for line in gantt_lines(s) + legend_lines(s, ports_chosen_at_start=not exp.target.port):
        console.print(line, markup=False, highlight=False)
    for cid, why in s.unplaced.items():
        console.print(f"[red]✗ {cid}[/]: {why}")
