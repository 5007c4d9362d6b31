"""The GPUs a matrix may use and what each configuration needs of them, for packing (servesweep.matrix.placement).

Hosts come from the experiment's inventory group (`target.host_group`): per host the host variable `gpus` (default
`launcher.gpus_per_host`), an optional topology `gpu_groups` (e.g. `[[0,1,2,3],[4,5,6,7]]`) and `ansible_host`
(where the load generator reaches the host's servers). The inventory is read with `ansible-inventory --list`, so
INI and YAML inventories, groups of groups and group variables all count. `inventory: local` is this machine with
`launcher.gpus_per_host` GPUs.

A configuration needs tp_size × dp_size × pp_size GPUs, or `launcher.gpus` when set (a generic server).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from servesweep.config.experiment import Experiment
from servesweep.matrix.placement import GpuHost, Job, validate_host
from servesweep.results.pergpu import flags_gpus


class InventoryError(ValueError):
    """The inventory could not be read, or a host's `gpus` / `gpu_groups` is not what packing needs."""


def inventory_path(exp: Experiment, experiment_file: str | None) -> str | None:
    """The experiment's inventory as a path (relative ones: to the experiment file); None for 'local'."""
    inv = exp.target.inventory
    if inv is None or inv == "local":
        return None
    p = Path(inv).expanduser()
    if not p.is_absolute() and experiment_file:
        p = Path(experiment_file).resolve().parent / p
    return str(p)


def gpu_hosts(exp: Experiment, experiment_file: str | None = None) -> list[GpuHost]:
    """The hosts of the experiment's GPU group with their GPUs and topology (InventoryError when unreadable)."""
    path = inventory_path(exp, experiment_file)
    if path is None:
        return [GpuHost("localhost", exp.launcher.gpus_per_host, (), "127.0.0.1")]
    return hosts_of_inventory(path, exp.target.host_group, exp.launcher.gpus_per_host)


def hosts_of_inventory(inventory: str, group: str, default_gpus: int) -> list[GpuHost]:
    data = _inventory_list(inventory)
    names = _group_hosts(data, group)
    if not names:
        raise InventoryError(f"inventory {inventory}: group {group!r} has no hosts")
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    hosts = [_host(n, hostvars.get(n) or {}, default_gpus) for n in names]
    for h in hosts:
        if problem := validate_host(h):
            raise InventoryError(f"inventory {inventory}: {problem}")
    return hosts


def _inventory_list(inventory: str) -> dict[str, Any]:
    exe = Path(sys.executable).parent / "ansible-inventory"
    cmd = str(exe) if exe.exists() else shutil.which("ansible-inventory")
    if cmd is None:
        raise InventoryError("ansible-inventory is not installed (it comes with ansible-core)")
    r = subprocess.run([cmd, "-i", inventory, "--list"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise InventoryError(f"inventory {inventory}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def _group_hosts(data: dict[str, Any], group: str) -> list[str]:
    """Hosts of `group` and of its child groups, in inventory order, each once."""
    out: list[str] = []
    todo, seen = [group], set()
    while todo:
        g = todo.pop(0)
        if g in seen or g not in data:
            continue
        seen.add(g)
        out.extend(h for h in data[g].get("hosts") or [] if h not in out)
        todo.extend(data[g].get("children") or [])
    return out


def _host(name: str, hv: dict[str, Any], default_gpus: int) -> GpuHost:
    try:
        gpus = int(hv.get("gpus", default_gpus))
        groups = hv.get("gpu_groups") or ()
        if isinstance(groups, str):
            groups = json.loads(groups)
        topo = tuple(tuple(int(i) for i in g) for g in groups)
    except (TypeError, ValueError) as e:
        raise InventoryError(
            f"host {name}: gpus must be an integer and gpu_groups a list of GPU id lists ({e})"
        ) from None
    return GpuHost(name, gpus, topo, str(hv.get("ansible_host") or name))


def jobs_of(plan) -> list[Job]:
    """One job per configuration that has points to run: its own server start, its points and its server's stop
    (each placement starts its own server, so no start is shared with a neighbour, and its GPUs are free for the
    next placement only once that server has stopped)."""
    exp = plan.experiment
    return [
        Job(
            cp.config.id,
            flags_gpus(cp.config.flags, exp.launcher.gpus),
            cp.start_s + sum(p.est_s for p in cp.feasible_points) + cp.stop_s,
        )
        for cp in plan.configs
        if cp.feasible_points
    ]
