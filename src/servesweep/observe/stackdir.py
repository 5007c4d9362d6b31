"""The observe stack's folder on disk, and nothing that starts a service: where things live (`stack_dir`,
`targets_dir`, `Layout`, $SERVESWEEP_OBSERVE_DIR), the file_sd job names, the target files (`register_targets`,
`unregister`, owner stamps, `sweep_stale`, `list_targets`), the records of the processes `observe up` started
(`running`, `write_record`), and what a process that registers itself reads back (`stack_present`,
`watching_prometheus`, `scrape_interval_s` of the generated prometheus.yml).

It imports neither observe/promconfig.py (which writes prometheus.yml and launches Prometheus and the Pushgateway)
nor observe/dashboards (Grafana's JSON), so the code that runs inside Locust (client/exporter_feed.py, through
observe/targets.py) registers in the stack without them (pyproject.toml's contract "client/ imports no
parent-side module"). observe/stack.py, the stack's commands, is built on it.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from servesweep.files import write_atomic
from servesweep.processes import same_process

if TYPE_CHECKING:
    pass

ENV_DIR = "SERVESWEEP_OBSERVE_DIR"
DEFAULT_ROOT = "runs"
STACK_NAME = ".observe"
# The jobs of the generated prometheus.yml (observe/promconfig.py): exporters and servers from file_sd files, and
# a Pushgateway when one is given.
EXPORTER_JOB = "servesweep"
SGLANG_JOB = "sglang"
PUSHGATEWAY_JOB = "pushgateway"
JOBS = (EXPORTER_JOB, SGLANG_JOB)  # the file_sd jobs the generated config reads
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # a Prometheus label name
TARGET = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")  # a file_sd target: host:port, no scheme, no path
_KEY = re.compile(r"^[A-Za-z0-9._=-]+$")
# The process that wrote a target file, "host:pid:start time", as a label Prometheus drops after relabelling (every
# `__` label is), so it never reaches a series; what `sweep_stale` reads to remove a killed process's files.
OWNER_LABEL = "__servesweep_owner"


# ---------------------------------------------------------------- where things live


def stack_dir(root: str | Path | None = None) -> Path:
    """The stack folder (absolute): $SERVESWEEP_OBSERVE_DIR if set, else `<root or runs>/.observe`."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser().resolve()
    return (Path(root if root is not None else DEFAULT_ROOT).expanduser() / STACK_NAME).resolve()


def targets_dir(root: str | Path | None = None) -> Path:
    """The one folder of file_sd target files that the stack's Prometheus watches."""
    return stack_dir(root) / "targets"


@dataclass(frozen=True)
class Layout:
    """Paths inside one stack folder."""

    dir: Path

    @property
    def targets(self) -> Path:
        return self.dir / "targets"

    @property
    def prom(self) -> Path:
        return self.dir / "prometheus"

    @property
    def prom_config(self) -> Path:
        return self.prom / "prometheus.yml"

    @property
    def grafana(self) -> Path:
        return self.dir / "grafana"

    def record(self, service: str) -> Path:
        return self.dir / service / "process.json"

    def log(self, service: str) -> Path:
        return self.dir / service / f"{service}.log"


# ---------------------------------------------------------------- target registration


def _key(labels: Mapping[str, str], key: str | None) -> str:
    """The file's key: `key`, else `<run_id>-<pid>` (one file per registering process), else `pid<pid>`."""
    k = (
        key
        if key is not None
        else (f"{labels['run_id']}-{os.getpid()}" if "run_id" in labels else f"pid{os.getpid()}")
    )
    if not _KEY.match(k):
        raise ValueError(f"target key {k!r} must be letters, digits, '.', '_', '=', '-' (pass key=...)")
    return k


def _check(job: str, targets: Iterable[str], labels: Mapping) -> tuple[list[str], dict[str, str]]:
    """Validate what a file_sd group may hold (the same rules as promconfig.write_targets, for any key); the owner
    label is register_targets' own, never a caller's."""
    if job not in JOBS:
        raise ValueError(f"job {job!r}: the stack's Prometheus reads only {', '.join(JOBS)}")
    ts = list(targets)
    for t in ts:
        if not isinstance(t, str) or not TARGET.match(t):
            raise ValueError(f"register_targets: target must be host:port (no scheme, no path), got {t!r}")
    out = {}
    for k, v in labels.items():
        # __metrics_path__ is the one reserved label file_sd may set (a server whose metrics live elsewhere)
        if not isinstance(k, str) or not (
            LABEL_NAME.match(k) and not k.startswith("__") or k == "__metrics_path__"
        ):
            raise ValueError(f"register_targets: {k!r} is not a label name a target may carry")
        out[k] = str(v)
    return ts, out


def register_targets(
    job: str,
    targets: Iterable[str],
    labels: Mapping[str, str] | None = None,
    root: str | Path | None = None,
    *,
    key: str | None = None,
) -> Path:
    """Write `<targets folder>/<job>-<key>.json` (one file_sd group) atomically; returns its path.

    job: "servesweep" (a ClientMetrics exporter) or "sglang" (a server's /metrics). targets: "host:port" each.
    labels: put on every target (`run_id`, `config`, ...; `__metrics_path__` for another path). key: the file's
    name part; default `<run_id>-<pid>`, so each registering process owns one file and re-registering replaces it.
    Prometheus reads the change within seconds (inotify), with no restart. An empty target list writes an empty
    group list, which removes the targets and keeps the file. The group also carries OWNER_LABEL (this process),
    so a file whose process was killed is removed by the next registration or `observe` command (sweep_stale).
    """
    labels = dict(labels or {})
    ts, lab = _check(job, targets, labels)
    groups = [{"targets": ts, "labels": {**lab, OWNER_LABEL: owner_stamp()}}] if ts else []
    path = targets_dir(root) / f"{job}-{_key(labels, key)}.json"
    sweep_stale(root)  # each new registration clears what killed processes left
    # 0644: a Prometheus run by another user (Debian's systemd unit, the compose container) must read it.
    return write_atomic(path, json.dumps(groups, indent=2) + "\n", mode=0o644)


def unregister(
    job: str,
    labels: Mapping[str, str] | None = None,
    root: str | Path | None = None,
    *,
    key: str | None = None,
) -> bool:
    """Remove the file register_targets wrote for the same (job, labels/key) from the same process; True if it
    existed. Prometheus drops those targets within seconds."""
    if job not in JOBS:
        raise ValueError(f"job {job!r}: the stack's Prometheus reads only {', '.join(JOBS)}")
    path = targets_dir(root) / f"{job}-{_key(dict(labels or {}), key)}.json"
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def owner_stamp(pid: int | None = None) -> str:
    """ "host:pid:start time" of a process (this one by default): what identifies it across pid reuse."""
    pid = os.getpid() if pid is None else pid
    started = process_start_time(pid)
    return f"{socket.gethostname()}:{pid}:{started if started is not None else 0:.2f}"


def _owner_gone(stamp: str) -> bool:
    """True when the owner is a process of this host that no longer runs (its pid is gone or is another process's
    now). A stamp of another host (a shared folder) is never judged from here."""
    host, pid_text, started_text = (stamp.rsplit(":", 2) + ["", ""])[:3]
    try:
        pid, started = int(pid_text), float(started_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    try:
        proc = psutil.Process(pid)
        now = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:  # another user's live process: not ours to judge
        return False
    return started > 0 and abs(now - started) >= 0.05


def _file_owners(path: Path) -> list[str]:
    try:
        groups = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    if not isinstance(groups, list):
        return []
    return [
        g["labels"][OWNER_LABEL] for g in groups if isinstance(g, dict) and OWNER_LABEL in g.get("labels", {})
    ]


def sweep_stale(root: str | Path | None = None) -> list[Path]:
    """Remove the target files whose owning process is gone (killed with SIGKILL, or a host that rebooted), so dead
    targets do not pile up; returns the files removed. Files without an owner (written by hand, or by an older
    servesweep) are kept."""
    tdir = targets_dir(root)
    gone = []
    for job in JOBS:
        for p in sorted(tdir.glob(f"{job}-*.json")):
            owners = _file_owners(p)
            if owners and all(map(_owner_gone, owners)):
                p.unlink(missing_ok=True)
                gone.append(p)
    return gone


def list_targets(root: str | Path | None = None) -> list[dict]:
    """[{"file", "job", "targets", "labels"}] of every registered group (a file that does not parse: "error"),
    after removing the files of processes that are gone (sweep_stale); the owner label is left out of `labels`."""
    out = []
    sweep_stale(root)
    tdir = targets_dir(root)
    for job in JOBS:
        for p in sorted(tdir.glob(f"{job}-*.json")):
            try:
                groups = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError) as e:
                out.append({"file": str(p), "job": job, "targets": [], "labels": {}, "error": str(e)})
                continue
            for g in groups:
                out.append(
                    {
                        "file": str(p),
                        "job": job,
                        "targets": g.get("targets", []),
                        "labels": {k: v for k, v in g.get("labels", {}).items() if k != OWNER_LABEL},
                    }
                )
    return out


# ---------------------------------------------------------------- what a registering process reads back


def stack_present(root: str | Path | None = None) -> bool:
    """Whether processes that are not runs (a Locust started by hand) should register here: a stack was set up
    (its targets folder exists: `observe up` ran, or the compose stack's folder), or $SERVESWEEP_OBSERVE_DIR names
    one. Without either nothing is written, so a plain `locust -f ...` in any folder leaves no `runs/.observe`."""
    return bool(os.environ.get(ENV_DIR)) or targets_dir(root).is_dir()


def watching_prometheus(root: str | Path | None = None) -> dict | None:
    """The record of the stack's Prometheus when `observe up` started it and it still runs, else None (no stack,
    one stopped, or a Prometheus this stack did not start, such as the compose one)."""
    return running(Layout(stack_dir(root)).record("prometheus"))


def scrape_interval_s(root: str | Path | None = None, default: float = 5.0) -> float:
    """The scrape interval of the stack's generated prometheus.yml, in seconds (`default` when unreadable)."""
    try:
        text = Layout(stack_dir(root)).prom_config.read_text()
    except OSError:
        return default
    m = re.search(r"^\s*scrape_interval:\s*['\"]?(\d+(?:\.\d+)?)(ms|s|m|h)\b", text, re.M)
    if m is None:
        return default
    return float(m[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m[2]]


# ---------------------------------------------------------------- recorded processes


def process_start_time(pid: int) -> float | None:
    """The process' start time, or None when no live (non-zombie) process has that pid."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _reap(pid: int) -> None:
    """Collect our own exited child (when `up` and `down` ran in one process, e.g. a test)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def write_record(path: Path, pid: int, **extra) -> dict:
    """Record a process just started (pid, start time and `extra`) at `path`; returns the record."""
    rec = {"pid": pid, "start_time": process_start_time(pid), **extra}
    write_atomic(path, json.dumps(rec, indent=2) + "\n")
    return rec


def running(path: Path) -> dict | None:
    """The record at `path` if its process still runs (same pid AND same start time: processes.same_process),
    else None."""
    try:
        rec = json.loads(path.read_text())
        pid, started = int(rec["pid"]), float(rec["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if same_process({"pid": pid, "create_time": started}) is None:
        _reap(pid)  # our own exited child stays a zombie until collected (`up` and `down` in one process)
        return None
    return rec
