"""Packing server configurations onto the GPUs of the hosts: which host, which GPUs, which port, from when to when.

Pure: no I/O. A configuration (a `Job`) needs `gpus` GPUs of one host for `est_s` seconds (the planner's estimate:
its server start plus its points). Hosts (`GpuHost`) have `gpus` GPUs and optionally a topology, `groups`: GPU
sets a server must stay within when it fits in one (e.g. `[[0,1,2,3],[4,5,6,7]]`, the two NVLink/PCIe halves of
an 8-GPU host: a TP4 server never straddles them); a server larger than every group takes whole groups.

Scheduling is list scheduling in longest-processing-time-first order (LPT): the jobs are sorted by estimate,
longest first; whenever GPUs are free, the first job in that order that fits onto free GPUs of some host starts
there (later, shorter jobs may fill gaps a longer one cannot use: backfilling). For jobs of one GPU each this is
Graham's LPT, within 4/3 − 1/(3m) of the optimum on m GPUs; in general the makespan is at most
(total GPU-seconds / GPUs + the longest job) when every job fits any host. Within a host the GPU set is chosen
best-fit: the group with the fewest free GPUs that still holds the server, so whole groups stay free for the big
ones; without a topology, an aligned block of the server's size when one is free (GPUs 4-7 for a TP4), else the
lowest free ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuHost:
    name: str
    gpus: int
    groups: tuple[tuple[int, ...], ...] = ()  # topology; empty: all GPUs are one group
    address: str | None = None  # where the load generator reaches its servers (None: the name)

    def topology(self) -> tuple[tuple[int, ...], ...]:
        return self.groups or (tuple(range(self.gpus)),)


@dataclass(frozen=True)
class Job:
    id: str
    gpus: int
    est_s: float


@dataclass
class Placement:
    config_id: str
    host: str
    gpu_ids: tuple[int, ...]
    port: int
    start_s: float
    end_s: float
    slot: int  # index in the schedule's placements: names the server (port, work folder)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpu_ids)


@dataclass
class Schedule:
    placements: list[Placement]
    hosts: list[GpuHost]
    serial_s: float  # one configuration after another (the planner's total)
    unplaced: dict[str, str] = field(default_factory=dict)  # configuration id -> why no host can take it
    max_parallel: int | None = None

    @property
    def makespan_s(self) -> float:
        return max((p.end_s for p in self.placements), default=0.0)

    def of(self, config_id: str) -> Placement | None:
        return next((p for p in self.placements if p.config_id == config_id), None)


def validate_host(host: GpuHost) -> str | None:
    """What is wrong with a host's topology (None: nothing): groups must be disjoint GPU ids below `gpus`."""
    seen: set[int] = set()
    for g in host.groups:
        for i in g:
            if not 0 <= i < host.gpus:
                return f"host {host.name}: gpu_groups names GPU {i}, the host has GPUs 0-{host.gpus - 1}"
            if i in seen:
                return f"host {host.name}: GPU {i} is in two gpu_groups"
            seen.add(i)
    return None


def pick_gpus(host: GpuHost, free: set[int], need: int) -> tuple[int, ...] | None:
    """The GPU ids of `host` a server of `need` GPUs takes from `free`, respecting the topology; None: none fit."""
    if not host.groups:
        # no topology given: an aligned block (GPUs 0-3 or 4-7 for four) when one is free, as the usual
        # NVLink/PCIe wiring groups them; else the lowest free ids
        for start in range(0, host.gpus - need + 1, need):
            block = tuple(range(start, start + need))
            if all(i in free for i in block):
                return block
    groups = host.topology()
    if need <= max(len(g) for g in groups):
        fits = [g for g in groups if sum(1 for i in g if i in free) >= need]
        if not fits:
            return None
        best = min(fits, key=lambda g: (sum(1 for i in g if i in free), g))
        return tuple(sorted(i for i in best if i in free)[:need])
    whole = [g for g in groups if all(i in free for i in g)]
    whole.sort(key=len, reverse=True)
    taken: list[int] = []
    for g in whole:
        if len(taken) >= need:
            break
        taken.extend(g)
    if len(taken) < need:
        return None
    return tuple(sorted(taken)[:need])


def fits_host(host: GpuHost, need: int) -> bool:
    return pick_gpus(host, set(range(host.gpus)), need) is not None


def schedule(
    jobs: list[Job], hosts: list[GpuHost], *, base_port: int = 30000, max_parallel: int | None = None
) -> Schedule:
    """Longest-first list scheduling of `jobs` onto `hosts` (module docstring); at most `max_parallel` servers at
    once (None: as many as fit). Each placement gets port `base_port + slot`."""
    serial = sum(j.est_s for j in jobs)
    unplaced = {
        j.id: f"needs {j.gpus} GPUs on one host; no host of the GPU group has them"
        + (" within its gpu_groups" if any(h.gpus >= j.gpus for h in hosts) else "")
        for j in jobs
        if not any(fits_host(h, j.gpus) for h in hosts)
    }
    queue = sorted((j for j in jobs if j.id not in unplaced), key=lambda j: (-j.est_s, -j.gpus, j.id))
    free_at = {h.name: dict.fromkeys(range(h.gpus), 0.0) for h in hosts}
    running: list[Placement] = []
    out: list[Placement] = []
    t = 0.0
    while queue:
        running = [p for p in running if p.end_s > t]
        started = _start_what_fits(queue, hosts, free_at, running, t, max_parallel)
        for p in started:
            p.slot, p.port = len(out), base_port + len(out)
            out.append(p)
            running.append(p)
        if queue and not started:
            t = min(p.end_s for p in running)
    return Schedule(out, list(hosts), serial, unplaced, max_parallel)


def _start_what_fits(queue, hosts, free_at, running, t, max_parallel) -> list[Placement]:
    """Start, in queue order, every job that fits onto GPUs free at time t (removed from the queue)."""
    started: list[Placement] = []
    for job in list(queue):
        if max_parallel is not None and len(running) + len(started) >= max_parallel:
            break
        for h in hosts:
            free = {g for g, at in free_at[h.name].items() if at <= t}
            ids = pick_gpus(h, free, job.gpus)
            if ids is None:
                continue
            end = t + job.est_s
            for g in ids:
                free_at[h.name][g] = end
            started.append(Placement(job.id, h.name, ids, 0, t, end, 0))
            queue.remove(job)
            break
    return started
