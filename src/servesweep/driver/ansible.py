"""Running servesweep's playbooks through ansible-runner, safely.

The pitfalls this wrapper exists for (reference locust-and-ansible.md §6):
- ansible-runner hangs forever after the playbook in a process where gevent patched the standard library, so it
  refuses to run when Locust or gevent is imported;
- ansible-runner reads back the extravars/settings of earlier runs from its private data dir, so every run gets a
  fresh one (removed afterwards; the artifacts are kept where the caller asks);
- `ansible-playbook` is looked up on PATH, so the venv's bin folder goes first;
- a timeout or cancel kills only ansible-playbook's process group; Ansible's per-task worker called setsid and
  survives. So while the playbook runs, its processes are recorded (`_Tracker`: pid and start time of
  ansible-playbook, of its task workers and of every process in their sessions), and at the end what is still
  alive of them is killed; `owned` (a manifest.OwnedProcesses) gets the same records, so a run that resumes after
  a SIGKILL stops them too. A process is never found by its command line: ansible-playbook is the child of this
  process whose environment holds this run's mark (SERVESWEEP_ANSIBLE_RUN), so runs in other threads (a packed
  matrix runs one per placement) and their Locust processes are never taken for it; a server the playbook launched
  in a session of its own (setsid) is never one of them.
- the environment ansible-playbook gets is ansible-runner's copy of this process's environment less `hide_env`,
  edited on the prepared runner before it starts: os.environ is never changed, so threads cannot undo each other's
  hiding, and the artifact `command` file (which holds that environment) never sees a hidden variable.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


def ansible_dir() -> Path:
    """The folder holding servesweep's playbooks and roles (SERVESWEEP_ANSIBLE_DIR overrides)."""
    env = os.environ.get("SERVESWEEP_ANSIBLE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "ansible"


def local_inventory(group: str = "gpu") -> str:
    """An INI inventory with this machine in `group`, modules run by this interpreter (no SSH)."""
    return f"[{group}]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"


@dataclass
class PlaybookResult:
    status: str  # successful | failed | timeout | canceled
    rc: int
    duration_s: float
    failures: list[str] = field(default_factory=list)  # "host: task: message" for each failed task
    # host -> the task timeout (s) its task ran past (a task's `timeout:`): the host did not answer in time
    timed_out: dict[str, int] = field(default_factory=dict)
    artifact_data: dict[str, Any] = field(default_factory=dict)  # what the playbook handed back via set_stats
    stats: dict[str, Any] | None = None
    artifact_dir: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def error(self) -> str:
        if self.ok:
            return ""
        if self.failures:
            return self.failures[-1]  # the role's rescue re-raises one message that says it all
        return f"ansible-playbook ended with status {self.status} (rc {self.rc})"


def run_playbook(
    playbook: str | Path,
    *,
    inventory: str,
    extravars: Mapping[str, Any],
    artifact_dir: Path,
    ident: str,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    timeout_s: float | None = None,
    on_event: Callable[[dict], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    tag: str | None = None,
    secrets: Mapping[str, str] | None = None,
    hide_env: tuple[str, ...] = (),
    owned=None,
) -> PlaybookResult:
    """Run one playbook (a path; relative ones are looked up in ansible_dir()) and return what happened.

    `inventory` is a path to an inventory file or inventory text (INI). `on_event` sees every ansible-runner
    event (for progress display); `cancel` is polled and stops the run when it returns True. `tag` goes into the
    private data dir's name (remove_private_dirs(tag) removes what a SIGKILLed caller left). `owned`
    (processes.OwnedProcesses): the playbook's processes are recorded there while they run.

    `secrets` (extravar name -> value) reach the playbook through 0600 files in the private data dir (removed at
    the end), never through extravars (ansible-runner may put those on ansible-playbook's command line) or the
    environment; `hide_env` names environment variables (the ones holding those secrets) that Ansible must not
    see: ansible-runner writes its whole environment into the artifact folder (`command`), and fact gathering
    records it too.
    """
    _refuse_under_gevent()
    import ansible_runner  # imported here: the rest of servesweep does not need it

    adir = ansible_dir()
    pb = _playbook_path(playbook, adir)
    inv_path = Path(inventory).expanduser()
    inv_is_file = "\n" not in inventory and inv_path.exists()
    artifact_dir.mkdir(parents=True, exist_ok=True)
    pd = Path(tempfile.mkdtemp(prefix=_prefix(tag)))
    tracker = _Tracker(owned, mark=pd.name)
    try:
        if not inv_is_file:
            (pd / "inventory").mkdir()
            (pd / "inventory" / "hosts.ini").write_text(inventory)
        events = _Events(tracker, on_event)

        def cancel_requested() -> bool:
            # polled about once a second (pexpect_timeout): the moment to record the playbook's processes
            tracker.sample()
            return bool(cancel()) if cancel is not None else False

        t0 = time.monotonic()
        kwargs: dict[str, Any] = dict(
            private_data_dir=str(pd),
            project_dir=str(adir),
            playbook=str(pb),
            inventory=str(inv_path) if inv_is_file else str(pd / "inventory" / "hosts.ini"),
            extravars={**extravars, **_secret_files(pd, secrets or {})},
            envvars={**_envvars(pd, adir), MARK_ENV: pd.name},
            ident=ident,
            artifact_dir=str(artifact_dir),
            quiet=True,
            event_handler=events.handle,
            cancel_callback=cancel_requested,
            settings={"suppress_env_files": True, "pexpect_timeout": 1},
        )
        cmdline = " ".join(x for x in ("--check" if check else "", "--diff" if diff else "") if x)
        if limit:
            kwargs["limit"] = limit
        if cmdline:
            kwargs["cmdline"] = cmdline
        if timeout_s is not None:
            kwargs["timeout"] = int(timeout_s)
        r = ansible_runner.interface.init_runner(**kwargs)  # what ansible_runner.run does, in two steps:
        for name in hide_env:  # the prepared environment, before the run writes it to `command` or spawns
            r.config.env.pop(name, None)
        r.config.command = _dies_with_parent(r.config.command)
        r.run()
        return _result(r, time.monotonic() - t0, events)
    finally:
        tracker.finish()
        shutil.rmtree(pd, ignore_errors=True)


MARK_ENV = "SERVESWEEP_ANSIBLE_RUN"  # in ansible-playbook's environment: which run_playbook call started it


def _refuse_under_gevent() -> None:
    for mod in ("gevent", "locust"):
        if mod in sys.modules:
            raise RuntimeError(
                f"ansible-runner must not run in a process that imported {mod}: it hangs after the playbook "
                "(gevent's monkey-patching); run Locust in a subprocess instead"
            )


def _playbook_path(playbook: str | Path, adir: Path) -> Path:
    pb = Path(playbook)
    if not pb.is_absolute():
        pb = adir / pb
    if not pb.exists():
        raise FileNotFoundError(f"playbook {pb} does not exist")
    return pb


SSH_RETRIES = "3"  # Ansible's default is 0: one SSH connection lost as it is made fails the host for the play
# Ansible's default is off: each module task then makes a temporary folder on the host, copies the module there,
# makes it executable, runs it and removes the folder, each its own shell (its own SSH round trip on a remote host);
# pipelined, the module goes to the interpreter's stdin in one. The default is off for sudoers with `requiretty`
# (no longer a distribution's default): such hosts set ANSIBLE_PIPELINING=False in servesweep's environment.
PIPELINING = "True"


def _envvars(pd: Path, adir: Path) -> dict[str, str]:
    """ansible-playbook's environment: the venv's bin first on PATH, servesweep's roles, no colour or retry
    files, temporary files inside the private data dir, and SSH connections retried.

    A night-long matrix makes thousands of SSH connections; one that fails while it is made (a shared connection's
    master exiting as a task reuses it, an sshd past MaxStartups, a link that drops a SYN) made ssh exit 255 and
    Ansible mark the host unreachable, failing a whole configuration's start (seen under load in a packed run).
    Ansible retries exactly those (exit 255, back-off 1 s, 3 s, 7 s), the task itself never:
    ANSIBLE_SSH_RETRIES=3 unless the environment sets its own. Modules are pipelined (PIPELINING) unless the
    environment sets ANSIBLE_PIPELINING."""
    return {
        "ANSIBLE_SSH_RETRIES": os.environ.get("ANSIBLE_SSH_RETRIES", SSH_RETRIES),
        "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", PIPELINING),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_ROLES_PATH": str(adir / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "False"),
        "ANSIBLE_LOCAL_TEMP": str(pd / "tmp"),
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }


def _dies_with_parent(command: list[str]) -> list[str]:
    """ansible-playbook's command, made to get SIGTERM the moment this process dies (util-linux `setpriv
    --pdeathsig`, which sets the kernel's parent-death signal and execs it: the same pid, the same environment).

    ansible-runner starts it in a session of its own (a pty), so a SIGKILLed servesweep took it with it neither by
    process group nor by hang-up (it ignores SIGHUP): it went on with its task (a readiness wait lasts the server's
    whole load time), started the GPU sampler and so on, for nobody. On SIGTERM it stops its task workers and exits.
    Where setpriv is missing (not Linux), the command is unchanged and `--resume` stops what processes.json
    recorded."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or sys.platform != "linux":
        return command
    return [setpriv, "--pdeathsig", "TERM", "--", *command]


def _secret_files(pd: Path, secrets: Mapping[str, str]) -> dict[str, str]:
    """Each secret in a 0600 file of the private data dir; the extravar holds a lookup of that file, never the
    value."""
    if not secrets:
        return {}
    (pd / "secrets").mkdir(mode=0o700)
    out = {}
    for name, value in secrets.items():
        f = pd / "secrets" / name
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value)
        out[name] = "{{ lookup('ansible.builtin.file', " + repr(str(f)) + ", rstrip=False) }}"
    return out


class _Events:
    """ansible-runner's event handler: records the playbook's processes, collects failed tasks and the
    artifact data the playbook hands back, and passes every event on to `on_event`."""

    def __init__(self, tracker: _Tracker, on_event: Callable[[dict], None] | None) -> None:
        self.tracker = tracker
        self.on_event = on_event
        self.failures: list[str] = []
        self.timed_out: dict[str, int] = {}
        self.artifact: dict[str, Any] = {}

    def handle(self, ev: dict) -> bool:
        self.tracker.sample()
        data = ev.get("event_data") or {}
        if ev.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") or {}
            msg = res.get("msg") or res.get("stderr") or res.get("stdout") or "failed"
            self.failures.append(f"{data.get('host', '?')}: {data.get('task', '?')}: {str(msg).strip()}")
            timedout = res.get("timedout")  # a task that ran past its `timeout:` ({"period": s, ...})
            if isinstance(timedout, dict) and timedout.get("period"):
                self.timed_out[str(data.get("host", "?"))] = int(timedout["period"])
        if ev.get("event") == "playbook_on_stats":
            self.artifact.update(data.get("artifact_data") or {})
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # a progress display must never break the run
                pass
        return True


def _result(r: Any, duration_s: float, events: _Events) -> PlaybookResult:
    result = PlaybookResult(
        status=r.status,
        rc=r.rc if r.rc is not None else -1,
        duration_s=duration_s,
        failures=events.failures,
        timed_out=events.timed_out,
        artifact_data=events.artifact,
        stats=r.stats,
        artifact_dir=Path(r.config.artifact_dir),
    )
    if result.status in ("failed",) and not events.failures and r.rc != 0:
        # no failed task event: a syntax error or a missing binary; the playbook's stdout says which
        tail = _tail(Path(r.config.artifact_dir) / "stdout", 12)
        if tail:
            result.failures.append(tail)
    return result


def _tail(path: Path, n: int) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _prefix(tag: str | None) -> str:
    return f"servesweep-ansible-{tag}-" if tag else "servesweep-ansible-"


def remove_private_dirs(tag: str) -> int:
    """Remove the private data dirs a SIGKILLed run_playbook(tag=...) left in the temporary folder (its processes
    are stopped through the run's processes.json, not here). Returns how many were removed."""
    n = 0
    for leftover in Path(tempfile.gettempdir()).glob(_prefix(tag) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
        n += 1
    return n


class _Tracker:
    """The processes of one playbook run, recorded as they appear: ansible-playbook (a child of this process that
    was not there before: ansible-runner spawns it in a session of its own, through a pty), its task workers (its
    children; each calls setsid) and every process in those sessions (modules, their shells). A process that
    started a session of its own below them (a server the role launched with setsid) is not theirs. Each record
    holds the pid, the start time and the sessions; finish() kills what is still alive of them, checked against
    both."""

    def __init__(self, owned=None, mark: str = ""):
        self.me = psutil.Process()
        self.before = {(c.pid, _ctime(c)) for c in self.me.children()}
        self.owned = owned
        self.mark = mark
        self.tops: set[tuple[int, float]] = (
            set()
        )  # this run's ansible-playbook, once its environment showed it
        self.sessions: dict[int, float] = {}  # session id -> its leader's start time
        self.refs: dict[tuple[int, float], dict] = {}

    def sample(self) -> None:
        try:
            # The children of this process and of the playbook's tree only, each read once per sample (psutil's
            # children() scans the whole process table on each call). This runs at every ansible event (about 100
            # a playbook) on a controller that also runs Locust.
            kids = _ProcessTable()
            tops = [c for c in kids.children(self.me.pid) if self._is_top(c)]
            new = []
            for top in tops:
                self.sessions.setdefault(top.pid, _ctime(top))
                for k in kids.children(top.pid):
                    self.sessions.setdefault(
                        k.pid, _ctime(k)
                    )  # a task worker: setsid made its pid its session
                for p in [top, *_descendants(kids, top)]:
                    try:
                        sid = os.getsid(p.pid)
                    except (ProcessLookupError, PermissionError):
                        continue
                    if sid not in self.sessions:
                        continue  # a session of its own: a server the playbook launched
                    key = (p.pid, _ctime(p))
                    if key[1] and key not in self.refs:
                        self.refs[key] = {
                            "pid": p.pid,
                            "create_time": key[1],
                            "kind": "ansible",
                            "sessions": self._sessions(),
                        }
                        new.append(self.refs[key])
            for r in self.refs.values():
                r["sessions"] = self._sessions()
            if new and self.owned is not None:
                self.owned.add(new)
        except (psutil.Error, OSError):
            pass  # recording must never break the playbook

    def _is_top(self, c: psutil.Process) -> bool:
        """A child that was not there before and carries this run's mark (another thread's playbook or Locust
        process does not; a child forked but not yet exec'd shows this process's environment, and is looked at
        again at the next sample)."""
        key = (c.pid, _ctime(c))
        if key in self.tops:
            return True
        if key in self.before:
            return False
        try:
            mine = c.environ().get(MARK_ENV) == self.mark if self.mark else True
        except (psutil.Error, OSError):
            return False
        if mine:
            self.tops.add(key)
        return mine

    def _sessions(self) -> list[list]:
        return [[sid, t] for sid, t in sorted(self.sessions.items())]

    def finish(self) -> int:
        """Kill what is left of the recorded processes (a timed-out or cancelled playbook leaves task workers and
        their modules running); forget them. Returns how many were killed."""
        from servesweep.processes import owned_now

        self.sample()
        n = 0
        for ref in self.refs.values():
            ref["sessions"] = self._sessions()
            for p in owned_now(ref):
                try:
                    p.kill()
                    n += 1
                except psutil.Error:
                    pass
        if self.owned is not None and self.refs:
            self.owned.remove(list(self.refs.values()))
        return n


class _ProcessTable:
    """Who is whose child, read once per parent per sample; psutil.Process objects are made only for the parents
    asked about, once each. Linux lists a thread's children in /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN,
    on in the distributions' kernels): a sample reads a few files for the playbook's tree instead of the stat file of
    every process on the machine (a test suite's controller runs hundreds). Without those files: one pass over the
    process table (`_ppid_table`)."""

    def __init__(self, children_files: bool | None = None) -> None:
        use_files = _CHILDREN_FILES if children_files is None else children_files
        self.table: dict[int, list[int]] | None = None if use_files else _ppid_table()
        self._made: dict[int, list[psutil.Process]] = {}

    def _child_pids(self, ppid: int) -> list[int]:
        if self.table is not None:
            return self.table.get(ppid, [])
        pids: list[int] = []
        try:
            tids = os.listdir(f"/proc/{ppid}/task")
        except OSError:
            return pids  # gone meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{ppid}/task/{tid}/children", "rb") as f:
                    pids.extend(int(x) for x in f.read().split())
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
        return pids

    def children(self, ppid: int) -> list[psutil.Process]:
        if ppid not in self._made:
            procs = []
            for pid in self._child_pids(ppid):
                try:
                    procs.append(psutil.Process(pid))
                except psutil.Error:
                    pass  # gone since the table was read
            self._made[ppid] = procs
        return self._made[ppid]


_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _ppid_table() -> dict[int, list[int]]:
    """{ppid: [pids]} of every process: one pass of psutil over the process table (only where the kernel has no
    children files, so its cost is off the usual path)."""
    out: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        if p.info.get("ppid") is not None:
            out.setdefault(p.info["ppid"], []).append(p.pid)
    return out


def _descendants(kids: _ProcessTable, top: psutil.Process) -> list[psutil.Process]:
    """Every process below `top` in `kids` (psutil's children(recursive=True), from the one table): a child
    started before its parent is a reused pid of an older process, not a descendant."""
    out, todo, seen = [], [top], {top.pid}
    while todo:
        parent = todo.pop()
        born = _ctime(parent)
        for c in kids.children(parent.pid):
            if c.pid in seen or _ctime(c) < born:
                continue
            seen.add(c.pid)
            out.append(c)
            todo.append(c)
    return out


def _ctime(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0
