"""The cost of the sglang_server role's start and stop runs (what every configuration of a matrix pays twice), against
the built-in emulator on localhost, through servesweep's own run_playbook (ansible-runner).

Each task that runs a module on the host (shell, command, file, copy, template = stat + copy, wait_for, setup, ...)
costs about 0.5 s of CPU (controller + the AnsiballZ module), so the figures are the wall and CPU time of each
run and the number of module tasks it ran (its job_events: runner_on_ok/failed events of a module action).

Two role versions are compared in one run, alternating start+stop cycles, so a loaded machine weighs on both alike:
`--before` is a copy of the ansible/ folder as it was (SERVESWEEP_ANSIBLE_DIR points at it for those runs), the
other side is this checkout's ansible/.

    cp -a ansible /tmp/ansible-before   # before editing the role
    .venv/bin/python bench/bench_role.py --before /tmp/ansible-before --rounds 3

An environment setting of run_playbook's (ANSIBLE_PIPELINING) is compared the same way: `--before ansible
--before-env ANSIBLE_PIPELINING=False`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from servesweep.driver.ansible import local_inventory, run_playbook
from servesweep.sglang.server_command import ServerLaunch

ROOT = Path(__file__).resolve().parents[1]
# controller-only actions: no module travels to the host
CHEAP = {"set_fact", "assert", "include_tasks", "import_tasks", "meta", "set_stats", "fail", "debug"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _module_tasks(artifact_dir: Path) -> list[str]:
    out = []
    for f in sorted((artifact_dir / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-")[0])):
        ev = json.loads(f.read_text())
        data = ev.get("event_data") or {}
        if ev.get("event") in ("runner_on_ok", "runner_on_failed"):
            action = str(data.get("task_action", "")).rsplit(".", 1)[-1]
            if action not in CHEAP:
                out.append(f"{action}: {data.get('task')} ({data.get('duration', 0):.2f} s)")
    return out


def _cpu() -> float:
    """CPU of this process and of its reaped children (ansible-playbook and its task workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one(adir: Path, tmp: Path, state: str, port: int, n: int, gather: bool) -> dict:
    os.environ["SERVESWEEP_ANSIBLE_DIR"] = str(adir)
    extravars = {  # what the orchestrator hands the role for an emulator configuration (role_vars)
        "sglang_server_state": state,
        "sglang_server_version": "0.5.23",
        "sglang_server_model_path": "Qwen/Qwen3.6-27B",
        "sglang_server_port": port,
        "sglang_server_python": sys.executable,
        "sglang_server_emulator": True,
        "sglang_server_sim_gpu": "H200",
        # the command line the orchestrator builds (servesweep.sglang.server_command)
        "sglang_server_argv": ServerLaunch(
            kind="emulator",
            launcher="process",
            python=sys.executable,
            model_path="Qwen/Qwen3.6-27B",
            port=port,
            bind="127.0.0.1",
            workdir=str(tmp / "server"),
            version="0.5.23",
            flags={"tp_size": 1, "context_length": 4096},
            sim_gpu="H200",
            sim_args={"sim_load_time": 0.2},
        ).argv(),
        "sglang_server_flags": {"tp_size": 1, "context_length": 4096},
        "sglang_server_workdir": str(tmp / "server"),
        "sglang_server_results_dir": str(tmp / "results"),
        "sglang_server_results_on_success": False,  # the orchestrator writes them from the stats (ignored before)
        "sglang_server_startup_timeout": 120,
        "sglang_server_stop_timeout": 20,
        "sglang_server_force_restart": state == "started",
        "sglang_server_gather_facts": gather,
    }
    art = tmp / "artifacts"
    c0, t0 = _cpu(), time.monotonic()
    r = run_playbook(
        "sglang_server.yml", inventory=local_inventory(), extravars=extravars, artifact_dir=art,
        ident=f"{state}-{n}", timeout_s=300,
    )
    wall, cpu = time.monotonic() - t0, _cpu() - c0
    if not r.ok:
        raise SystemExit(f"{adir} {state}: {r.error()}")
    return {"wall": wall, "cpu": cpu, "tasks": _module_tasks(art / f"{state}-{n}")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="a copy of the ansible/ folder as it was")
    ap.add_argument("--after", type=Path, default=ROOT / "ansible")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gather-facts", action="store_true", help="as the first configuration of a run does")
    ap.add_argument("--list", action="store_true", help="print each run's module tasks")
    ap.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment of the before side's runs only (e.g. ANSIBLE_PIPELINING=False)")
    a = ap.parse_args()
    res: dict[str, dict[str, list]] = {k: {"start": [], "stop": []} for k in ("before", "after")}
    env = {"before": dict(kv.split("=", 1) for kv in a.before_env)}
    env["after"] = {name: os.environ.get(name) for name in env["before"]}  # the environment as it was
    with tempfile.TemporaryDirectory(prefix="bench-role-") as d:
        n = 0
        for _ in range(a.rounds):
            for side, adir in (("before", a.before), ("after", a.after)):
                tmp = Path(d) / side
                for name, value in env[side].items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                port = _free_port()
                for state in ("started", "stopped"):
                    n += 1
                    x = one(adir, tmp, state, port, n, a.gather_facts)
                    res[side]["start" if state == "started" else "stop"].append(x)
                    print(f"{side:6} {state:7} wall {x['wall']:5.2f} s  cpu {x['cpu']:5.2f} s  module tasks {len(x['tasks'])}",
                          flush=True)
                    if a.list:
                        for t in x["tasks"]:
                            print("         ", t)

    def med(side: str, phase: str, key: str) -> float:
        return statistics.median(x[key] for x in res[side][phase])

    print()
    for side in ("before", "after"):
        s = {k: med(side, "start", k) + med(side, "stop", k) for k in ("wall", "cpu")}
        print(
            f"{side:6} medians: start wall {med(side, 'start', 'wall'):.2f} s cpu {med(side, 'start', 'cpu'):.2f} s "
            f"({len(res[side]['start'][0]['tasks'])} module tasks); stop wall {med(side, 'stop', 'wall'):.2f} s "
            f"cpu {med(side, 'stop', 'cpu'):.2f} s ({len(res[side]['stop'][0]['tasks'])} module tasks); "
            f"start+stop wall {s['wall']:.2f} s cpu {s['cpu']:.2f} s"
        )
    for key in ("wall", "cpu"):
        b = med("before", "start", key) + med("before", "stop", key)
        f = med("after", "start", key) + med("after", "stop", key)
        print(f"start+stop {key}: after/before {f / b:.2f} ({100 * (1 - f / b):.0f} % less)")


if __name__ == "__main__":
    main()
