"""The processes servesweep started, and only those: `processes.json` in a run folder (`OwnedProcesses`), the
record that identifies one process (`process_ref`: pid plus the kernel's start time, so a reused pid never matches)
and how a recorded process or process group is found again and stopped. servesweep never finds a process by its
command line. Imports nothing of servesweep but files.py: every layer may use it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from servesweep.files import write_atomic

PROCESSES = "processes.json"


def process_ref(pid: int, kind: str, **extra: Any) -> dict[str, Any] | None:
    """What identifies a process servesweep started, taken right after it started it: pid, start time (psutil's
    create_time: the kernel's start time, which a reused pid does not share), session and group. None when it is
    already gone."""
    import psutil

    try:
        p = psutil.Process(pid)
        return {
            "pid": pid,
            "create_time": p.create_time(),
            "sid": os.getsid(pid),
            "pgid": os.getpgid(pid),
            "kind": kind,
            **extra,
        }
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        return None


def same_process(ref: dict[str, Any]):
    """The live psutil.Process that `ref` recorded, or None (gone, a zombie, or its pid now names another
    process: the start time differs)."""
    import psutil

    try:
        p = psutil.Process(int(ref["pid"]))
        if abs(p.create_time() - float(ref["create_time"])) > 0.05 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError, TypeError):
        return None


def group_members(ref: dict[str, Any]) -> list:
    """The live processes of the process group that `ref` leads (it was started with start_new_session, so its
    group is its pid). The leader must still be the recorded process, or be gone: a group id stays reserved by the
    kernel while any member lives, so members of a group whose leader died are still that group's; members started
    before the leader cannot be (that group id then named something else)."""
    import psutil

    pgid = int(ref["pid"])
    try:
        leader = psutil.Process(pgid)
        if abs(leader.create_time() - float(ref["create_time"])) > 0.05:
            return []  # the pid names another process now
    except psutil.NoSuchProcess:
        pass
    out = []
    for p in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if (
                os.getpgid(p.pid) == pgid
                and p.info["create_time"] >= float(ref["create_time"]) - 0.05
                and p.info["status"] != psutil.STATUS_ZOMBIE
            ):
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return out


def stop_processes(procs: list, grace_s: float) -> int:
    """SIGTERM each psutil.Process, wait up to grace_s, SIGKILL what is left; how many were alive."""
    import psutil

    alive = []
    for p in procs:
        try:
            p.terminate() if grace_s > 0 else p.kill()
            alive.append(p)
        except psutil.NoSuchProcess:
            continue
    if grace_s > 0 and alive:
        _, left = psutil.wait_procs(alive, timeout=grace_s)
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
    return len(alive)


class OwnedProcesses:
    """`runs/<run_id>/processes.json`: the processes this run started (Locust process groups, Ansible's processes),
    each recorded by pid and start time when it was started, plus the servesweep process that owns them. A resumed
    run stops exactly these (after checking each is still the recorded process) and nothing else: never a process
    found by its command line. Rewritten with files.write_atomic on every change."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / PROCESSES
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.RLock()  # a packed run records processes from one thread per placement
        me = process_ref(os.getpid(), "owner")
        self.owner = {k: me[k] for k in ("pid", "create_time")} if me else {"pid": os.getpid()}

    # -- the previous owner's records --

    def previous(self) -> dict[str, Any]:
        try:
            d = json.loads(self.path.read_text())
            return d if isinstance(d, dict) else {}
        except (FileNotFoundError, ValueError):
            return {}

    def previous_owner_alive(self) -> int | None:
        """The pid of the servesweep process that recorded the file, when it still runs (and is not this one)."""
        owner = self.previous().get("owner") or {}
        if not owner.get("create_time") or owner.get("pid") == os.getpid():
            return None
        return owner["pid"] if same_process(owner) is not None else None

    def stop_previous(self, grace_s: float = 5.0) -> dict[str, int]:
        """Stop what the previous owner recorded and is still alive (same pid AND start time): Locust process
        groups (SIGTERM, then SIGKILL after grace_s), Ansible processes (SIGKILL, only while still in one of the
        sessions recorded with them). Returns counts by kind."""
        counts: dict[str, int] = {}
        for ref in self.previous().get("processes") or []:
            procs = owned_now(ref)
            if procs:
                n = stop_processes(procs, grace_s if ref.get("kind") == "locust" else 0)
                counts[ref.get("kind", "?")] = counts.get(ref.get("kind", "?"), 0) + n
        self.entries = []
        self.save()
        return counts

    # -- this process's records --

    def add(self, refs: list[dict[str, Any]]) -> None:
        with self._lock:
            known = {(e["pid"], e["create_time"]) for e in self.entries}
            new = [r for r in refs if r and (r["pid"], r["create_time"]) not in known]
            if new:
                self.entries.extend(new)
                self.save()

    def remove(self, refs: list[dict[str, Any]]) -> None:
        with self._lock:
            drop = {(r["pid"], r["create_time"]) for r in refs if r}
            kept = [e for e in self.entries if (e["pid"], e["create_time"]) not in drop]
            if len(kept) != len(self.entries):
                self.entries = kept
                self.save()

    def save(self) -> None:
        with self._lock:
            write_atomic(self.path, json.dumps({"owner": self.owner, "processes": self.entries}, indent=1))


def owned_now(ref: dict[str, Any]) -> list:
    """The live processes a record stands for: a whole group for a group leader ("group": true), else the one
    process, and that one only while it is still in one of the sessions recorded with it ("sessions")."""
    if ref.get("group"):
        return group_members(ref)
    p = same_process(ref)
    if p is None:
        return []
    sessions = ref.get("sessions")
    if sessions is not None:
        try:
            sid = os.getsid(p.pid)
        except (ProcessLookupError, PermissionError):
            return []
        leaders = {int(s): float(t) for s, t in sessions}
        if sid not in leaders:
            return []  # it left the sessions we started (setsid: a server the playbook launched)
        if _reused(sid, leaders[sid]):
            return []  # the session id names a session someone else started (the recorded leader's pid reused)
    return [p]


def _reused(pid: int, create_time: float) -> bool:
    """Whether `pid` now names a process started at another time than `create_time` (gone: False)."""
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - create_time) > 0.05
    except psutil.Error:
        return False
