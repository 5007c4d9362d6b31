"""Process control, for every layer. How servesweep starts a process group (`start_group`, a `Group`: its own
session, its log, a `ref`; with `watch_parent` it does not outlive this process), waits for it to get ready
(`wait_ready`: `NotReady` names what did not come up, with its log's tail) and stops it (`stop_group`: SIGTERM, a
grace, SIGKILL to what is left, the leader reaped). And the processes servesweep started, and only those:
`processes.json` in a run folder (`OwnedProcesses`), the record that identifies one process (`process_ref`: pid plus
the kernel's start time, so a reused pid never matches) and how a recorded process or process group is found again
and stopped. servesweep never finds a process by its command line. Imports nothing of servesweep but files.py
(psutil is imported where used): every layer may use it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
                grace = grace_s if ref.get("kind") == "locust" else 0
                if ref.get("group"):  # the group with killpg: it also reaches what the group forks meanwhile
                    stop_group(ref, grace)
                    n = len(procs)
                else:
                    n = stop_processes(procs, grace)
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


# ---------------------------------------------------------------- starting, waiting for and stopping a group


class NotReady(RuntimeError):
    """A process group started here did not get ready: its leader exited, or the time ran out (the group is
    stopped before this is raised). The message names what did not come up and ends with its log's tail."""


class Group:
    """A process group this process started (`start_group`): the leader's Popen (`popen`), what identifies it
    (`ref`, a `process_ref` with "group": true, what `OwnedProcesses` records), its argv and log. Stop it with
    `stop_group` (or `stop`): only this group is signalled, found again by pid and start time."""

    def __init__(self, popen: subprocess.Popen, argv: list[str], log_path: Path | None, ref: dict[str, Any]):
        self.popen = popen
        self.argv = argv
        self.log_path = log_path
        self.ref = ref
        self._watch_fd: int | None = None  # the write end of the parent watch's pipe (None: not watched)
        self._watcher: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        """Whether the leader still runs (its group may outlive it: `group_members`)."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40, chars: int = 3000) -> str:
        """The last lines of the group's log ('' without a log or when it cannot be read)."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])[-chars:]

    def stop(self, grace_s: float = 5.0) -> int | None:
        return stop_group(self, grace_s)


def start_group(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    log_path: str | Path | None = None,
    log_mode: str = "ab",
    kind: str = "process",
    watch_parent: bool = False,
    **extra: Any,
) -> Group:
    """Start argv as the leader of a new session and process group (start_new_session), stdin from /dev/null, its
    stdout and stderr into `log_path` (opened with `log_mode`; None: this process's own). `env`: the child's whole
    environment (None: this one's). `kind` and `extra` go into the group's `ref`.

    `watch_parent`: the group must not outlive this process. True where servesweep starts something for its own
    use (an emulator, a CPU SGLang server, a test's Prometheus); False for what must outlive the command that
    started it (`observe up`'s Prometheus) or has a watch of its own and is stopped by a resume (Locust)."""
    log = open(log_path, log_mode) if log_path is not None else None  # noqa: SIM115 - closed below: the child holds it
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        # None only when psutil may not look at it: a start time of 0 matches no process, so nothing is signalled
        ref = process_ref(popen.pid, kind, group=True, **extra)
        ref = ref or {"pid": popen.pid, "create_time": 0.0, "kind": kind, "group": True}
        group = Group(popen, list(argv), Path(log_path) if log_path is not None else None, ref)
        if watch_parent:
            try:
                _start_watch(group, log)
            except BaseException:
                stop_group(group, 0)  # unwatched it must not run: nobody would hold its handle
                raise
    finally:
        if log is not None:
            log.close()
    return group


# Why a watcher process on a pipe, and not Linux's PR_SET_PDEATHSIG set in a preexec_fn:
# - PDEATHSIG fires when the *thread* that forked the child ends, not the process: a server started from a packed
#   lane's thread or a fixture's thread would be killed when that thread ends while the process goes on;
# - it reaches the leader only, with one signal: a leader that ignores or outlives SIGTERM keeps its whole group up,
#   and the leader's own children are not told at all;
# - it needs a preexec_fn, which Python documents as unsafe in a process with threads (servesweep has them);
# - it is Linux only.
# The watcher is a small process in a session of its own that holds the read end of a pipe whose only write end
# this process holds (not inheritable: closed in every child it execs; servesweep forks none without exec). The
# kernel closes that end when this process ends, however it ends (SIGKILL too), and the watcher's read returns at
# once: it then stops the group the way `stop_group` does (SIGTERM, a grace, SIGKILL to what is left; only the
# recorded group, by pid and start time). It exits by itself once the group is gone, and `stop_group` closes the
# pipe, which ends it too.
WATCH_GRACE_S = 5.0
WATCH_POLL_S = 1.0


def _start_watch(group: Group, log) -> None:
    r, w = os.pipe()  # both ends non-inheritable: only the watcher gets r (pass_fds), no child ever gets w
    root = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); from servesweep.processes import _watch_main; "
        f"_watch_main({r}, {group.ref['pid']}, {group.ref['create_time']!r}, {WATCH_GRACE_S})"
    )
    try:
        group._watcher = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log if log is not None else subprocess.DEVNULL,
            pass_fds=(r,),
            start_new_session=True,  # a Ctrl-C to the terminal's group does not end the watch before its work
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    group._watch_fd = w


def _watch_main(fd: int, pgid: int, create_time: float, grace_s: float) -> None:
    """The watcher (see above): wait for EOF on `fd` (the parent is gone or stopped the group), checking each
    WATCH_POLL_S whether the group still has a process; then stop what is left of the group."""
    import select

    while True:
        ready, _, _ = select.select([fd], [], [], WATCH_POLL_S)
        if ready and not os.read(fd, 64):
            break
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return  # the group is gone: nothing left to watch
        except PermissionError:
            return  # the group id names someone else's group now
    stop_group({"pid": pgid, "create_time": create_time, "group": True}, grace_s)


def wait_ready(
    group: Group,
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    detail: str = "",
    poll_s: float = 0.1,
    stop_grace_s: float = 5.0,
) -> float:
    """Call `check` until it returns True; the seconds it took. When the leader exits first, or `timeout_s` passes,
    the group is stopped (`stop_grace_s`) and NotReady raised: "<what> exited with code N before getting ready" or
    "<what> not ready within T s", then `detail` (e.g. ": <argv>"), then the log's tail. An exception meanwhile (the
    check's, a signal's) stops the group too before it goes up."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    try:
        while True:
            rc = group.popen.poll()
            if rc is not None:
                why = f"exited with code {rc} before getting ready"
                break
            if check():
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                why = f"not ready within {timeout_s:g} s"
                break
            time.sleep(poll_s)
    except BaseException:  # the check raised, or a signal came (KeyboardInterrupt ...): nothing stays up
        stop_group(group, stop_grace_s)
        raise
    stop_group(group, stop_grace_s)
    log = f"\n--- {group.log_path} (tail) ---\n{group.log_tail()}" if group.log_path is not None else ""
    raise NotReady(f"{what} {why}{detail}{log}")


def answers_200(url: str, timeout_s: float = 2.0) -> bool:
    """Whether GET `url` answers 200 now: the readiness probe of a server started here, for the layers below
    target/ (the emulator, a CPU SGLang server), which do not import the load generator's HTTP helper."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return False  # not listening yet, 503 while loading (HTTPError is an URLError)


def stop_group(
    group: Group | dict[str, Any], grace_s: float = 5.0, *, kill_wait_s: float = 5.0
) -> int | None:
    """Stop a process group this process started (a `Group`) or recorded (its `ref`): SIGTERM to the group, up to
    `grace_s` for all its processes to end (0: SIGKILL at once), SIGKILL to what is left, then the leader reaped
    when it is this process's child. Signals go only to a group whose leader is still the recorded process or, the
    leader gone, to the members it left (`group_members`). Returns the leader's exit status (None: not our child).
    Also ends the group's parent watch."""
    ref = group.ref if isinstance(group, Group) else group
    popen = group.popen if isinstance(group, Group) else None
    pgid = int(ref["pid"])
    steps = [(signal.SIGTERM, grace_s)] if grace_s > 0 else []
    for sig, wait_s in [*steps, (signal.SIGKILL, kill_wait_s)]:
        if not group_members(ref):
            break
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if popen is not None:
                popen.poll()  # reap the leader as it exits (a zombie is not counted anyway)
            if not group_members(ref):
                break
            time.sleep(0.05)
    if popen is None:
        return None
    try:
        popen.wait(kill_wait_s)
    except subprocess.TimeoutExpired:
        pass
    if isinstance(group, Group):
        _end_watch(group)
    return popen.returncode


def _end_watch(group: Group) -> None:
    if group._watch_fd is not None:
        os.close(group._watch_fd)  # EOF: the watcher finds the group gone and exits
        group._watch_fd = None
    if group._watcher is not None:
        try:
            group._watcher.wait(5)
        except subprocess.TimeoutExpired:
            group._watcher.kill()
            group._watcher.wait()
        group._watcher = None


def process_alive(pid: int) -> bool:
    """Whether `pid` names a live process (not a zombie)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
