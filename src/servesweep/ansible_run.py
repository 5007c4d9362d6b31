"""Running servesweep's playbooks through ansible-runner, safely.

The pitfalls this wrapper exists for (reference locust-and-ansible.md §6):
- ansible-runner hangs forever after the playbook in a process where gevent patched the standard library, so it
  refuses to run when Locust or gevent is imported;
- ansible-runner reads back the extravars/settings of earlier runs from its private data dir, so every run gets a
  fresh one (removed afterwards; the artifacts are kept where the caller asks);
- `ansible-playbook` is looked up on PATH, so the venv's bin folder goes first;
- a timeout or cancel kills only ansible-playbook's process group; Ansible's per-task worker called setsid and
  survives, so every process still holding the private data dir on its command line is killed at the end.
Secrets never pass through here: the role reads them from the environment this process hands down.
"""

from __future__ import annotations

import os
import shutil
import signal
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
    return Path(__file__).resolve().parents[2] / "ansible"


def local_inventory(group: str = "gpu") -> str:
    """An INI inventory with this machine in `group`, modules run by this interpreter (no SSH)."""
    return f"[{group}]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"


@dataclass
class PlaybookResult:
    status: str  # successful | failed | timeout | canceled
    rc: int
    duration_s: float
    failures: list[str] = field(default_factory=list)  # "host: task: message" for each failed task
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
) -> PlaybookResult:
    """Run one playbook (a path; relative ones are looked up in ansible_dir()) and return what happened.

    `inventory` is a path to an inventory file or inventory text (INI). `on_event` sees every ansible-runner
    event (for progress display); `cancel` is polled and stops the run when it returns True. `tag` goes into the
    private data dir's name, which every Ansible process names on its command line: kill_tagged(tag) finds what a
    SIGKILLed caller left running.

    `secrets` (extravar name -> value) reach the playbook through 0600 files in the private data dir (removed at
    the end), never through extravars (ansible-runner may put those on ansible-playbook's command line) or the
    environment; `hide_env` names environment variables (the ones holding those secrets) that Ansible must not
    see: ansible-runner writes its whole environment into the artifact folder (`command`), and fact gathering
    records it too.
    """
    for mod in ("gevent", "locust"):
        if mod in sys.modules:
            raise RuntimeError(
                f"ansible-runner must not run in a process that imported {mod}: it hangs after the playbook "
                "(gevent's monkey-patching); run Locust in a subprocess instead"
            )
    import ansible_runner  # imported here: the rest of servesweep does not need it

    adir = ansible_dir()
    pb = Path(playbook)
    if not pb.is_absolute():
        pb = adir / pb
    if not pb.exists():
        raise FileNotFoundError(f"playbook {pb} does not exist")
    inv_path = Path(inventory).expanduser()
    inv_is_file = "\n" not in inventory and inv_path.exists()
    artifact_dir.mkdir(parents=True, exist_ok=True)
    pd = Path(tempfile.mkdtemp(prefix=_prefix(tag)))
    try:
        if not inv_is_file:
            (pd / "inventory").mkdir()
            (pd / "inventory" / "hosts.ini").write_text(inventory)
        bin_dir = str(Path(sys.executable).parent)
        envvars = {
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "ANSIBLE_ROLES_PATH": str(adir / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "False"),
            "ANSIBLE_LOCAL_TEMP": str(pd / "tmp"),
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
        }
        extravars = dict(extravars)
        if secrets:
            (pd / "secrets").mkdir(mode=0o700)
            for name, value in secrets.items():
                f = pd / "secrets" / name
                fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(value)
                extravars[name] = "{{ lookup('ansible.builtin.file', " + repr(str(f)) + ", rstrip=False) }}"
        cmdline = " ".join(x for x in ("--check" if check else "", "--diff" if diff else "") if x)
        failures: list[str] = []
        artifact: dict[str, Any] = {}

        def handler(ev: dict) -> bool:
            data = ev.get("event_data") or {}
            if ev.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get(
                "ignore_errors"
            ):
                res = data.get("res") or {}
                msg = res.get("msg") or res.get("stderr") or res.get("stdout") or "failed"
                failures.append(f"{data.get('host', '?')}: {data.get('task', '?')}: {str(msg).strip()}")
            if ev.get("event") == "playbook_on_stats":
                artifact.update(data.get("artifact_data") or {})
            if on_event is not None:
                try:
                    on_event(ev)
                except Exception:  # a progress display must never break the run
                    pass
            return True

        t0 = time.monotonic()
        kwargs: dict[str, Any] = dict(
            private_data_dir=str(pd),
            project_dir=str(adir),
            playbook=str(pb),
            inventory=str(inv_path) if inv_is_file else str(pd / "inventory" / "hosts.ini"),
            extravars=dict(extravars),
            envvars=envvars,
            ident=ident,
            artifact_dir=str(artifact_dir),
            quiet=True,
            event_handler=handler,
            cancel_callback=(lambda: bool(cancel())) if cancel is not None else None,
            settings={"suppress_env_files": True, "pexpect_timeout": 1},
        )
        if limit:
            kwargs["limit"] = limit
        if cmdline:
            kwargs["cmdline"] = cmdline
        if timeout_s is not None:
            kwargs["timeout"] = int(timeout_s)
        hidden = {n: os.environ.pop(n) for n in hide_env if n in os.environ}
        try:
            r = ansible_runner.run(**kwargs)
        finally:
            os.environ.update(hidden)
        result = PlaybookResult(
            status=r.status,
            rc=r.rc if r.rc is not None else -1,
            duration_s=time.monotonic() - t0,
            failures=failures,
            artifact_data=artifact,
            stats=r.stats,
            artifact_dir=Path(r.config.artifact_dir),
        )
        if result.status in ("failed",) and not failures and r.rc != 0:
            # no failed task event: a syntax error or a missing binary; the playbook's stdout says which
            tail = _tail(Path(r.config.artifact_dir) / "stdout", 12)
            if tail:
                result.failures.append(tail)
        return result
    finally:
        _kill_orphans(pd)
        shutil.rmtree(pd, ignore_errors=True)


def _tail(path: Path, n: int) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _prefix(tag: str | None) -> str:
    return f"servesweep-ansible-{tag}-" if tag else "servesweep-ansible-"


def kill_tagged(tag: str) -> int:
    """Kill Ansible processes of a run_playbook(tag=...) whose caller died (SIGKILL leaves them running: they
    could start a server behind the back of the run that resumes). Returns how many were killed."""
    n = _kill_naming(os.path.join(tempfile.gettempdir(), _prefix(tag)))
    for leftover in Path(tempfile.gettempdir()).glob(_prefix(tag) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return n


def _kill_orphans(pd: Path) -> None:
    """Kill processes left behind by a timed-out or cancelled run: they name the private data dir."""
    _kill_naming(str(pd))


def _kill_naming(needle: str) -> int:
    """SIGKILL every other process with `needle` in an argument of its command line; how many were killed."""
    me, n = os.getpid(), 0
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] != me and any(needle in a for a in (p.info["cmdline"] or [])):
                p.send_signal(signal.SIGKILL)
                n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return n
