"""Locust workers on other machines: started and stopped over SSH by the `locust_worker` Ansible role.

`start_remote_workers(...)` runs `ansible/locust_workers.yml` through ansible-runner on the hosts of one inventory
group: it installs servesweep into a virtual environment on each host (from a wheel built here, no index needed
there), copies the point, and starts N workers per host pointed at the master. `handle.stop()` stops them and
brings back each worker's state (pid, exit status, its own request counters) and log. `account(...)` then compares
what each worker says it issued with the records the master received, so a worker that died mid-point is named
with the number of requests it lost.

Never imports Locust or gevent: ansible-runner hangs in a process where gevent patched the standard library
(see driver/ansible.py). The Locust master runs in a subprocess (`driver.command.master_command`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.config.secrets import KEY_ENV, env_key
from servesweep.driver.ansible import run_playbook

PLAYBOOK = "locust_workers.yml"
# A servesweep Locust process's exit status when it stopped because its parent or master was gone
# (client/outcome.py EXIT_PARENT_GONE; not imported: this module never imports Locust)
_LOST_MASTER = 4
_MISSING = re.compile(r"Worker (\S+) failed to send heartbeat, setting state to missing")


# The variable that carries an API key to servesweep's children (config/secrets.py): Ansible must never see it
# (ansible-runner writes its environment into the artifacts).
_KEY_ENVS = (KEY_ENV,)


def _hidden_envs(variables: Mapping[str, Any]) -> tuple[str, ...]:
    name = str(variables.get("locust_worker_api_key_env") or "")
    return _KEY_ENVS + ((name,) if name and name not in _KEY_ENVS else ())


def _key_args(variables: Mapping[str, Any], key: str | None = None) -> dict[str, Any]:
    """run_playbook's secret arguments: the key named by locust_worker_api_key_env as a no-log secret file (the
    role writes it to a 0600 file on the host), and every key variable hidden from Ansible's environment: servesweep's
    own and any variable of this process that holds the same key (the user's original one)."""
    name = str(variables.get("locust_worker_api_key_env") or "")
    hide = _hidden_envs(variables)
    if not name:
        return {"hide_env": hide}
    key = key or env_key(name)
    if not key:
        raise RemoteWorkersError(
            f"locust_worker_api_key_env: the environment variable {name} is not set or empty"
        )
    hide += tuple(sorted(n for n, v in os.environ.items() if v == key and n not in hide))
    return {"secrets": {"locust_worker_api_key": key}, "hide_env": hide}


class RemoteWorkersError(RuntimeError):
    """The role failed on some host (the message says which host, which task, and where the logs are)."""


@dataclass
class WorkerState:
    """One remote Locust worker as its host reported it after the point."""

    host: str  # inventory name
    hostname: str  # the host's own name (the first half of the records' `worker` column)
    index: int
    pid: int | None
    exit_code: int | None  # None: still running, or the role had to stop it
    stopped_by_role: bool
    status: dict[str, Any] | None  # its last counters: issued, completed, failed, shipped, worker, unix
    log: Path | None  # the log brought back to the controller
    note: str | None = None  # what happened, when exit_code cannot say (a local worker that vanished)

    @property
    def identity(self) -> str:
        """The value of the records' `worker` column for this worker (host:pid)."""
        if self.status and self.status.get("worker"):
            return str(self.status["worker"])
        return f"{self.hostname}:{self.pid}"

    @property
    def ended_cleanly(self) -> bool:
        return self.exit_code == 0


@dataclass
class RemoteWorkers:
    """Handle on the workers of one point; `stop()` is idempotent and always safe to call."""

    inventory: str
    group: str
    run_dir: Path
    extravars: dict[str, Any]
    expected: int  # workers asked for across all hosts
    started: list[WorkerState] = field(default_factory=list)
    states: list[WorkerState] | None = None
    start_s: float = 0.0
    changed_hosts: list[str] = field(default_factory=list)  # hosts where the start changed something
    hide_env: tuple[str, ...] = ()  # the start's hidden key variables: the stop hides the same

    def stop(self, timeout_s: float = 300) -> list[WorkerState]:
        """Stop every worker and return each one's state. A host that cannot be reached any more (it died, or
        dropped off the network) does not fail the stop: its started workers come back with exit_code None and a
        note saying so, and `account` makes the point degraded (its records that reached the master are kept). A
        stop task that ran past its timeout counts the same: the role's own kill is bounded
        (locust_worker_stop_timeout), so the time past it went to reaching a host that did not answer (a dead host
        with SSH retries takes about 50 s to be called unreachable). A task that fails on a host that answers still
        raises RemoteWorkersError."""
        if self.states is not None:
            return self.states
        results = self.run_dir / "workers"
        for host in {w.host for w in self.started}:
            # the start's state: a host that does not answer now must not pass for one whose workers still run
            (results / host / "state.json").unlink(missing_ok=True)
        res = run_playbook(
            PLAYBOOK,
            inventory=self.inventory,
            extravars={**self.extravars, "locust_worker_state": "stopped"},
            artifact_dir=self.run_dir / "ansible",
            ident=f"workers-stop-{int(time.time() * 1000)}",
            timeout_s=timeout_s,
            hide_env=self.hide_env or _hidden_envs(self.extravars),
        )
        states = _read_states(results)
        stats = res.stats or {}
        dark = {h for h, n in (stats.get("dark") or {}).items() if n}
        failed = {h for h, n in (stats.get("failures") or {}).items() if n}
        lost = dark | set(res.timed_out)
        reported = {w.host for w in states}
        for w in self.started:
            if w.host not in reported:
                if w.host in dark:
                    why = "could not be reached after the point"
                elif w.host in res.timed_out:
                    why = f"did not answer the stop within {res.timed_out[w.host]} s"
                else:
                    why = "did not report after the point"
                states.append(
                    dataclasses.replace(
                        w,
                        exit_code=None,
                        stopped_by_role=False,
                        status=None,
                        log=None,
                        note=f"was lost: its host {w.host} {why} (it died, or dropped off the network)",
                    )
                )
        self.states = states
        if not res.ok and (failed - set(res.timed_out) or not lost or res.status == "timeout"):
            raise RemoteWorkersError(f"stopping the Locust workers: {res.error()}")
        return self.states


def build_package(dest_dir: Path, source: Path | None = None) -> Path:
    """A wheel of servesweep built from this checkout (or `source`), without network or build isolation."""
    source = source or Path(__file__).resolve().parents[3]
    if not (source / "pyproject.toml").is_file():
        raise FileNotFoundError(
            f"{source} is not a servesweep source tree (no pyproject.toml); give the package (a wheel) instead"
        )
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    before = set(dest_dir.glob("servesweep-*.whl"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    r = subprocess.run([*cmd, "-w", str(dest_dir), str(source)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"building the servesweep wheel from {source} failed:\n{r.stdout}\n{r.stderr}")
    wheels = sorted(dest_dir.glob("servesweep-*.whl"), key=lambda p: p.stat().st_mtime)
    new = [w for w in wheels if w not in before] or wheels
    return new[-1]


def start_remote_workers(
    inventory: str,
    group: str,
    master_host: str,
    master_port: int,
    workers_per_host: int,
    point_json: Path,
    run_dir: Path,
    *,
    package: Path | None = None,
    extravars: Mapping[str, Any] | None = None,
    timeout_s: float = 900,
    api_key: str | None = None,
) -> RemoteWorkers:
    """Start `workers_per_host` Locust workers of the point in `point_json` on every host of `group`, pointed at
    master_host:master_port. Blocks until every worker has built its point (or raises RemoteWorkersError with the
    host, the task and the log tail; whatever started is stopped again). `package` is a servesweep wheel or sdist
    (default: a wheel built from this checkout); `extravars` sets more role variables (locust_worker_python,
    locust_worker_pip_args, ...; per-host values such as locust_worker_dir belong in the inventory). `api_key`: the
    key of the variable `locust_worker_api_key_env` names, when the caller holds it (else read by that name).
    """
    if workers_per_host < 1:
        raise ValueError(f"workers_per_host must be >= 1, got {workers_per_host}")
    if not (0 < int(master_port) < 65536):
        raise ValueError(f"master_port must be a TCP port, got {master_port}")
    point_json = Path(point_json).resolve()
    if not point_json.is_file():
        raise FileNotFoundError(f"point_json {point_json} does not exist")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if package is None:
        package = build_package(run_dir / "dist")
    package = Path(package).resolve()
    if not package.is_file():
        raise FileNotFoundError(f"package {package} does not exist (a servesweep wheel or sdist)")
    results = run_dir / "workers"
    variables: dict[str, Any] = {
        "locust_worker_hosts": group,
        "locust_worker_count": int(workers_per_host),
        "locust_worker_master_host": master_host,
        "locust_worker_master_port": int(master_port),
        "locust_worker_point_json": str(point_json),
        "locust_worker_package": str(package),
        "locust_worker_results_dir": str(results),
        **dict(extravars or {}),
    }
    key_args = _key_args(variables, api_key)
    t0 = time.monotonic()
    res = run_playbook(
        PLAYBOOK,
        inventory=inventory,
        extravars={**variables, "locust_worker_state": "started"},
        artifact_dir=run_dir / "ansible",
        ident=f"workers-start-{int(time.time() * 1000)}",
        timeout_s=timeout_s,
        **key_args,
    )
    handle = RemoteWorkers(
        inventory=inventory,
        group=group,
        run_dir=run_dir,
        extravars=variables,
        expected=0,
        start_s=time.monotonic() - t0,
        hide_env=key_args["hide_env"],
    )
    if not res.ok:
        stats = res.stats or {}
        failed = set(stats.get("failures") or {}) | set(stats.get("dark") or {})
        if res.stats is None or set(stats.get("processed") or {}) - failed:
            try:
                handle.stop()  # hosts that did start keep no workers (failed hosts stopped theirs in the rescue)
            except RemoteWorkersError:
                pass
        raise RemoteWorkersError(f"starting the Locust workers: {res.error()}")
    handle.changed_hosts = sorted(h for h, n in ((res.stats or {}).get("changed") or {}).items() if n)
    handle.started = _read_states(results)
    handle.expected = len(handle.started)
    if not handle.started:
        raise RemoteWorkersError(f"no host of group {group!r} in the inventory started a worker")
    return handle


def _read_states(results: Path) -> list[WorkerState]:
    out: list[WorkerState] = []
    if not results.is_dir():
        return out
    for host_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        f = host_dir / "state.json"
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for w in d.get("workers", []):
            log = host_dir / f"{w['index']}.log"
            out.append(
                WorkerState(
                    host=host_dir.name,
                    hostname=d.get("hostname", host_dir.name),
                    index=int(w["index"]),
                    pid=w.get("pid"),
                    exit_code=w.get("exit_code"),
                    stopped_by_role=bool(w.get("stopped_by_role")),
                    status=w.get("status"),
                    log=log if log.is_file() else None,
                )
            )
    return out


def account(
    workers: list[WorkerState],
    records,
    master_log: str | None = None,
    missing: set[str] | None = None,
) -> dict[str, Any]:
    """Per worker: records the master received from it against the requests it says it issued; a worker that did
    not end by itself (killed, crashed, stopped by the role) or lost requests makes the point degraded.

    `records` is the point's Arrow table (or anything with to_pylist-able `worker` and `warmup` columns).
    `lost` counts measured requests the worker issued (by its last counters, written every 0.25 s and at each
    report) whose records never reached the master: in flight when it died, or finished but not shipped yet. It is a
    lower bound when the worker died: requests it issued in its last 0.25 s are not in its counters.
    `missing`: the record identities (host:pid) whose heartbeats the master saw stop; without it, the master log's
    "missing" lines are matched by host name (one worker per host).
    """
    names = records.column("worker").to_pylist()
    warm = records.column("warmup").to_pylist()
    received: dict[str, int] = {}
    for w, wu in zip(names, warm, strict=True):
        if not wu:
            received[w] = received.get(w, 0) + 1
    missing_ids = set(_MISSING.findall(master_log or ""))
    rows: list[dict[str, Any]] = []
    w_counted = [w.status is not None for w in workers]  # its counters came back (else `lost` is unknown)
    for w in workers:
        issued = int((w.status or {}).get("issued", 0))
        got = received.pop(w.identity, 0)
        lost = max(0, issued - got)
        # Locust's client id is "<hostname>_<uuid>": the master's "missing" line names the host
        heartbeat_missing = (
            w.identity in missing
            if missing is not None
            else any(cid.rsplit("_", 1)[0] == w.hostname for cid in missing_ids)
        )
        rows.append(
            {
                "host": w.host,
                "index": w.index,
                "worker": w.identity,
                "exit_code": w.exit_code,
                "stopped_by_role": w.stopped_by_role,
                "ended_cleanly": w.ended_cleanly,
                "heartbeat_missing": heartbeat_missing,
                "issued": issued,
                "records": got,
                "lost": lost,
                "note": w.note,
            }
        )
    failed = [r for r in rows if not r["ended_cleanly"] or r["lost"]]
    problems = [
        f"worker {r['worker']} on {r['host']} (#{r['index']}) "
        + (
            (
                f"exited with {r['exit_code']}"
                + (
                    " (it stopped its load by itself: it lost its master)"
                    if r["exit_code"] == _LOST_MASTER
                    else ""
                )
            )
            if r["exit_code"] is not None
            else (
                "was still running and had to be stopped"
                if r["stopped_by_role"]
                else (r["note"] or "did not report")
            )
        )
        + (" (its heartbeat went missing)" if r["heartbeat_missing"] else "")
        + (
            f": {r['lost']} of its {r['issued']} requests lost"
            if w_counted[i]
            else f": how many of its requests were lost is unknown ({r['records']} reached the master)"
        )
        for i, r in enumerate(rows)
        if not r["ended_cleanly"] or r["lost"]
    ]
    return {
        "degraded": bool(failed),
        "workers": rows,
        "lost_requests": sum(r["lost"] for r in rows),
        "problems": problems,
        "unknown_workers": sorted(received),  # records from no started worker (should be empty)
    }
