"""A standing observability stack: `servesweep observe up|down|status|targets|backfill`.

One Prometheus (the `prometheus` binary on PATH, e.g. the Debian package) watches ONE stable targets folder, so
every run, every `servesweep load --metrics-port` and every Locust process that registers itself there is scraped
with no restart and no edit. Prometheus' file_sd allows `*` only in a path's last segment, so per-run folders
(`runs/<id>/prometheus/`) cannot all be discovered by one config; this folder can.

Stack folder (default `<results root>/.observe`, results root `runs`; `--root` / `root=` name another results
root; the environment variable SERVESWEEP_OBSERVE_DIR, when set, names the stack folder itself and wins, so every
process on a host registers into the one stack whatever its own results root):

    <stack>/targets/                 file_sd files: servesweep-<key>.json (exporters), sglang-<key>.json (servers)
    <stack>/prometheus/prometheus.yml   generated (servesweep.observe.promconfig), scrapes the targets folder
    <stack>/prometheus/data/         TSDB (retention 400d by default); backfilled runs are imported here
    <stack>/prometheus/process.json  pid + start time of the Prometheus this stack started (what `down` stops)
    <stack>/grafana/provisioning/    datasource (this Prometheus, uid `prometheus`) + dashboard provider
    <stack>/grafana/dashboards/      copies of grafana/dashboards/*.json, refreshed at every `up`
    <stack>/grafana/process.json     pid + start time of grafana-server, when one was found on PATH

A process is identified by pid AND start time (psutil), never by its command line: `down` signals only the
recorded process, and a record whose pid now belongs to another process is dropped, not acted on.

API for processes that expose /metrics:

    register_targets("servesweep", ["127.0.0.1:9464"], {"run_id": run_id}) -> Path   # atomic file_sd JSON
    unregister("servesweep", {"run_id": run_id})                                    # removes that file
    backfill("runs/<run_id>")                       # a finished run's summaries into this Prometheus' TSDB
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import click
import psutil

from servesweep.files import write_atomic
from servesweep.observe import promconfig

ENV_DIR = "SERVESWEEP_OBSERVE_DIR"
DEFAULT_ROOT = "runs"
STACK_NAME = ".observe"
JOBS = (promconfig.EXPORTER_JOB, promconfig.SGLANG_JOB)  # the file_sd jobs the generated config reads
DEFAULT_RETENTION = "400d"  # months of history, with backfilled runs older than a year still kept
DEFAULT_PORT, DEFAULT_GRAFANA_PORT = 9090, 3000
DATASOURCE_UID = "prometheus"  # the dashboards' fixed datasource uid (grafana/provisioning uses the same)
# The committed dashboards, from src/servesweep/observe/stack.py up to the repository root.
REPO_DASHBOARDS = Path(__file__).resolve().parents[3] / "grafana" / "dashboards"
_KEY = re.compile(r"^[A-Za-z0-9._=-]+$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TARGET = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
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
        if not isinstance(t, str) or not _TARGET.match(t):
            raise ValueError(f"register_targets: target must be host:port (no scheme, no path), got {t!r}")
    out = {}
    for k, v in labels.items():
        # __metrics_path__ is the one reserved label file_sd may set (a server whose metrics live elsewhere)
        if not isinstance(k, str) or not (
            _LABEL_NAME.match(k) and not k.startswith("__") or k == "__metrics_path__"
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
    started = _start_time(pid)
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


def backfill(run_dir: str | Path, root: str | Path | None = None) -> list[Path]:
    """Import a finished run folder, point folder or bare records file (what `report` reads) into the stack's TSDB
    (servesweep.observe.promconfig.backfill); returns the new blocks. A stopped Prometheus loads them at `up`; a
    running one within about a minute."""
    data = Layout(stack_dir(root)).prom / "data"
    return promconfig.backfill(run_dir, data)


# ---------------------------------------------------------------- recorded processes


def _start_time(pid: int) -> float | None:
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


def _write_record(path: Path, proc: subprocess.Popen, **extra) -> dict:
    rec = {"pid": proc.pid, "start_time": _start_time(proc.pid), **extra}
    write_atomic(path, json.dumps(rec, indent=2) + "\n")
    return rec


def running(path: Path) -> dict | None:
    """The record at `path` if its process still runs (same pid AND same start time), else None."""
    try:
        rec = json.loads(path.read_text())
        pid, started = int(rec["pid"]), float(rec["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = _start_time(pid)
    # psutil's create_time comes from boot time + clock ticks: equal for one process, to 1/100 s
    return rec if now is not None and abs(now - started) < 0.05 else None


def _stop(path: Path, timeout: float) -> dict | None:
    """SIGTERM the recorded process (only if it is still the one recorded), SIGKILL after `timeout`; drop the
    record. Returns the record of the process stopped, None if there was none."""
    rec = running(path)
    if rec is not None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if running(path) is None:
                break
            os.kill(rec["pid"], sig)
            deadline = time.monotonic() + wait
            while running(path) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
    path.unlink(missing_ok=True)
    return rec


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read() if r.status == 200 else None
    except (OSError, urllib.error.URLError):
        return None


def _launch(
    argv: list[str], record: Path, log: Path, ready_url: str, timeout: float, env=None, **extra
) -> dict:
    """Start argv in its own session (it outlives this command), record it, wait until ready_url answers 200."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)  # fmt: skip
    rec = _write_record(record, proc, argv=argv, log=str(log), **extra)
    deadline = time.monotonic() + timeout
    while _get(ready_url) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with {proc.returncode}"
                if proc.poll() is not None
                else f"not ready after {timeout:.0f}s"
            )
            _stop(record, 5.0)
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{Path(argv[0]).name} {why} ({ready_url}); log {log}:\n{tail}")
        time.sleep(0.1)
    return rec


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


# ---------------------------------------------------------------- Prometheus


def _find(explicit: str | None, names: Iterable[str]) -> str | None:
    if explicit:
        exe = shutil.which(explicit)
        if exe is None:
            raise FileNotFoundError(f"{explicit!r} is not an executable file")
        return exe
    return next((e for e in map(shutil.which, names) if e), None)


def write_config(lay: Layout, *, scrape_interval: str = "5s", pushgateway: str | None = None) -> bool:
    """Write the stack's prometheus.yml (promconfig.prometheus_config on the targets folder); True if changed."""
    lay.targets.mkdir(parents=True, exist_ok=True)
    before = lay.prom_config.read_text() if lay.prom_config.exists() else None
    promconfig.write_prometheus_config(
        lay.prom_config, sd_dir=str(lay.targets), scrape_interval=scrape_interval, pushgateway=pushgateway
    )
    return lay.prom_config.read_text() != before


def start_prometheus(lay: Layout, *, exe: str, host: str, port: int, retention: str, timeout: float) -> dict:
    """Start Prometheus on the stack's config and data, recorded in prometheus/process.json."""
    if not _port_free(host, port):
        raise RuntimeError(f"{host}:{port} is in use by a process this stack did not start; pass --port")
    url = f"http://{host}:{port}"
    argv = [exe, f"--config.file={lay.prom_config}", f"--storage.tsdb.path={lay.prom / 'data'}",
            f"--storage.tsdb.retention.time={retention}", f"--web.listen-address={host}:{port}",
            "--log.level=warn"]  # fmt: skip
    return _launch(argv, lay.record("prometheus"), lay.log("prometheus"), url + "/-/ready", timeout,
                   url=url, retention=retention)  # fmt: skip


# ---------------------------------------------------------------- Grafana


def _dashboard_files(src: Path | None) -> dict[str, str]:
    """{file name: JSON text} of the dashboards: `src`, else the repository's grafana/dashboards, else built from
    code (servesweep.observe.dashboards) when the package is installed without the repository."""
    folder = src or (REPO_DASHBOARDS if any(REPO_DASHBOARDS.glob("*.json")) else None)
    if folder is not None:
        files = {p.name: p.read_text() for p in sorted(Path(folder).glob("*.json"))}
        if not files:
            raise FileNotFoundError(f"no dashboard JSON in {folder}")
        return files
    from servesweep.observe.dashboards import build_all, render

    return {f"{name}.json": render(d) for name, d in build_all().items()}


def provision_grafana(lay: Layout, prometheus_url: str, dashboards: Path | None = None) -> dict[str, Path]:
    """Write Grafana's provisioning (datasource = this Prometheus; a file provider over the copied dashboards).
    Any Grafana pointed at `<stack>/grafana/provisioning` (paths.provisioning) shows the stack; see docs."""
    dash = lay.grafana / "dashboards"
    files = _dashboard_files(dashboards)
    for old in dash.glob("*.json"):  # a dashboard removed from the source goes from the copies too
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        write_atomic(dash / name, text, mode=0o644)
    prov = lay.grafana / "provisioning"
    # JSON strings are valid YAML double-quoted scalars, so json.dumps quotes paths and URLs safely.
    ds = (f"# Written by servesweep observe up: the stack's Prometheus.\napiVersion: 1\ndatasources:\n"
          f"  - name: Prometheus\n    type: prometheus\n    uid: {DATASOURCE_UID}\n    access: proxy\n"
          f"    url: {json.dumps(prometheus_url)}\n    isDefault: true\n    jsonData:\n      timeInterval: 5s\n")  # fmt: skip
    db = (f"# Written by servesweep observe up: the dashboards copied to {json.dumps(str(dash))}.\napiVersion: 1\n"
          f"providers:\n  - name: servesweep\n    folder: servesweep\n    type: file\n    disableDeletion: false\n"
          f"    allowUiUpdates: false\n    updateIntervalSeconds: 30\n    options:\n      path: {json.dumps(str(dash))}\n")  # fmt: skip
    return {
        "datasource": write_atomic(prov / "datasources" / "servesweep.yaml", ds, mode=0o644),
        "dashboards": write_atomic(prov / "dashboards" / "servesweep.yaml", db, mode=0o644),
        "dashboard_dir": dash,
    }


def _grafana_home(exe: str) -> Path | None:
    """Grafana's homepath: `<home>/bin/grafana*` of a tarball, else the Debian/RPM /usr/share/grafana."""
    for home in (Path(exe).resolve().parent.parent, Path("/usr/share/grafana")):
        if (home / "conf" / "defaults.ini").exists():
            return home
    return None


def start_grafana(lay: Layout, *, exe: str, host: str, port: int, timeout: float) -> dict:
    """Start grafana-server (or `grafana server`) on the stack's provisioning, with its data under the stack."""
    home = _grafana_home(exe)
    if home is None:
        raise RuntimeError(f"{exe}: Grafana's homepath (conf/defaults.ini) was not found")
    g = lay.grafana
    argv = [exe, "server"] if Path(exe).name == "grafana" else [exe]
    argv += ["--homepath", str(home)]
    env = {**os.environ, "GF_PATHS_PROVISIONING": str(g / "provisioning"), "GF_PATHS_DATA": str(g / "data"),
           "GF_PATHS_LOGS": str(g / "logs"), "GF_PATHS_PLUGINS": str(g / "plugins"),
           "GF_SERVER_HTTP_ADDR": host, "GF_SERVER_HTTP_PORT": str(port),
           "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": str(g / "dashboards" / "live.json")}  # fmt: skip
    url = f"http://{host}:{port}"
    return _launch(
        argv, lay.record("grafana"), lay.log("grafana"), url + "/api/health", timeout, env=env, url=url
    )


def grafana_hint(lay: Layout) -> str:
    """How to point a Grafana at the stack when none was started here."""
    prov, dash = lay.grafana / "provisioning", lay.grafana / "dashboards"
    return (
        "Grafana not started (no grafana-server / grafana on PATH). Point one at the stack:\n"
        f"  grafana server --homepath /usr/share/grafana cfg:default.paths.provisioning={prov}\n"
        "  or: docker run -d --network host -e GF_SERVER_HTTP_ADDR=127.0.0.1 "
        f"-v {prov}:/etc/grafana/provisioning:ro -v {dash}:{dash}:ro grafana/grafana:11.1.0\n"
        f"  or add a Prometheus datasource (uid '{DATASOURCE_UID}') and import {dash}/*.json by hand."
    )


# ---------------------------------------------------------------- up / down / status


def up(
    root: str | Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    prometheus: str | None = None,
    retention: str = DEFAULT_RETENTION,
    scrape_interval: str = "5s",
    pushgateway: str | None = None,
    grafana: str | bool | None = None,
    grafana_port: int = DEFAULT_GRAFANA_PORT,
    dashboards: Path | None = None,
    timeout: float = 60.0,
) -> dict:
    """Start (or find running) the stack; returns {"dir", "targets", "prometheus": record, "grafana": record or
    None, "started": [names], "hint": text or None}. grafana: a path, None (find on PATH), False (never)."""
    lay = Layout(stack_dir(root))
    changed = write_config(lay, scrape_interval=scrape_interval, pushgateway=pushgateway)
    sweep_stale(root)
    started: list[str] = []
    prom = running(lay.record("prometheus"))
    if prom is None:
        exe = _find(prometheus, ["prometheus"])
        if exe is None:
            raise FileNotFoundError(
                "no `prometheus` on PATH (Debian: apt-get install prometheus); or --prometheus"
            )
        prom = start_prometheus(lay, exe=exe, host=host, port=port, retention=retention, timeout=timeout)
        started.append("prometheus")
    elif changed:  # same process, new config (e.g. another scrape interval): SIGHUP reloads it
        os.kill(prom["pid"], signal.SIGHUP)
    provision_grafana(lay, prom["url"], dashboards)
    graf, hint = running(lay.record("grafana")), None
    if graf is None and grafana is not False:
        exe = _find(grafana if isinstance(grafana, str) else None, ["grafana-server", "grafana"])
        if exe is None:
            hint = grafana_hint(lay)
        else:
            try:
                graf = start_grafana(lay, exe=exe, host=host, port=grafana_port, timeout=timeout)
                started.append("grafana")
            except (
                RuntimeError
            ) as e:  # Prometheus is up and recording; a Grafana that will not start is a note
                hint = f"Grafana ({exe}) did not start: {e}\n{grafana_hint(lay)}"
    return {"dir": lay.dir, "targets": lay.targets, "prometheus": prom, "grafana": graf, "started": started,
            "hint": hint}  # fmt: skip


def down(root: str | Path | None = None, *, timeout: float = 20.0) -> list[str]:
    """Stop the recorded Grafana and Prometheus (only those); returns the names of what was stopped. The TSDB,
    the targets folder and the provisioning stay, so the next `up` continues the same history."""
    lay = Layout(stack_dir(root))
    return [s for s in ("grafana", "prometheus") if _stop(lay.record(s), timeout) is not None]


def status(root: str | Path | None = None) -> dict:
    """{"dir", "targets", "prometheus": record or None, "grafana": ..., "ready": bool, "active": [targets]}.
    active: Prometheus' own view of each target (job, instance, health, lastError) when it runs."""
    lay = Layout(stack_dir(root))
    sweep_stale(root)
    prom, graf = running(lay.record("prometheus")), running(lay.record("grafana"))
    active: list[dict] = []
    ready = False
    if prom is not None:
        ready = _get(prom["url"] + "/-/ready") is not None
        body = _get(prom["url"] + "/api/v1/targets?state=active")
        for t in json.loads(body)["data"]["activeTargets"] if body else []:
            lab = t.get("labels", {})
            active.append({"job": lab.get("job"), "instance": lab.get("instance"), "run_id": lab.get("run_id"),
                           "health": t.get("health"), "error": t.get("lastError", "")})  # fmt: skip
    return {"dir": lay.dir, "targets": lay.targets, "prometheus": prom, "grafana": graf, "ready": ready,
            "active": active}  # fmt: skip


# ---------------------------------------------------------------- CLI

_root_opt = click.option(
    "--root", default=None, type=click.Path(file_okay=False),
    help=f"results root; the stack lives in <root>/{STACK_NAME} (default runs). ${ENV_DIR}, if set, names the "
    "stack folder itself and wins.",
)  # fmt: skip


@click.group(name="observe")
def command():
    """A standing Prometheus (+ Grafana if installed) that sees every run through one targets folder."""


def _echo_urls(info: dict) -> None:
    prom = info["prometheus"]
    click.echo(f"stack      {info['dir']}")
    click.echo(
        f"targets    {info['targets']}   (export {ENV_DIR}={info['dir']} for processes started elsewhere)"
    )
    click.echo(f"prometheus {prom['url']}   (pid {prom['pid']}; targets page {prom['url']}/targets)")
    if info.get("grafana"):
        click.echo(f"grafana    {info['grafana']['url']}/d/servesweep-live   (pid {info['grafana']['pid']})")


@command.command("up")
@_root_opt
@click.option("--host", default="127.0.0.1", show_default=True, help="address Prometheus and Grafana bind")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--prometheus", "prometheus", default=None, help="Prometheus binary (default: `prometheus` on PATH)"
)
@click.option(
    "--retention", default=DEFAULT_RETENTION, show_default=True, help="--storage.tsdb.retention.time"
)
@click.option("--scrape-interval", default="5s", show_default=True)
@click.option("--pushgateway", default=None, help="host:port of a Pushgateway to scrape too")
@click.option(
    "--grafana", "grafana", default=None, help="Grafana binary (default: grafana-server/grafana on PATH)"
)
@click.option("--no-grafana", is_flag=True, help="only provision Grafana's files, start none")
@click.option(
    "--grafana-port", default=DEFAULT_GRAFANA_PORT, show_default=True, type=click.IntRange(1, 65535)
)
@click.option(
    "--timeout", default=60.0, show_default=True, help="seconds to wait for each service to be ready"
)
def _up(root, host, port, prometheus, retention, scrape_interval, pushgateway, grafana, no_grafana, grafana_port,
        timeout):  # fmt: skip
    """Start the stack (idempotent: a running one is found and kept) and print its URLs."""
    try:
        info = up(root, host=host, port=port, prometheus=prometheus, retention=retention,
                  scrape_interval=scrape_interval, pushgateway=pushgateway,
                  grafana=False if no_grafana else grafana, grafana_port=grafana_port, timeout=timeout)  # fmt: skip
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo("started: " + ", ".join(info["started"]) if info["started"] else "already running")
    prom = info["prometheus"]
    if "prometheus" not in info["started"] and (prom["url"], prom.get("retention")) != (
        f"http://{host}:{port}",
        retention,
    ):  # a running Prometheus keeps its address and retention; say so rather than pretend
        click.echo(f"note: the running Prometheus keeps {prom['url']}, retention {prom.get('retention')}; "
                   "`servesweep observe down` first to change them")  # fmt: skip
    _echo_urls(info)
    if info["hint"]:
        click.echo(info["hint"])


@command.command("down")
@_root_opt
@click.option("--timeout", default=20.0, show_default=True, help="seconds between SIGTERM and SIGKILL")
def _down(root, timeout):
    """Stop the Prometheus (and Grafana) this stack started; data and targets stay."""
    stopped = down(root, timeout=timeout)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running in {stack_dir(root)}")


@command.command("status")
@_root_opt
@click.option("--json", "as_json", is_flag=True, help="machine-readable")
def _status(root, as_json):
    """Show the stack and the health of every target; exit 3 when its Prometheus is not running."""
    st = status(root)
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
    elif st["prometheus"] is None:
        click.echo(f"not running ({st['dir']}); start it with: servesweep observe up")
    else:
        _echo_urls(st)
        click.echo(f"ready      {st['ready']}; {len(st['active'])} active target(s)")
        for t in st["active"]:
            click.echo(
                f"  {t['health']:<7} {t['job']:<10} {t['instance']:<22} run_id={t['run_id']} {t['error']}"
            )
    if st["prometheus"] is None:
        sys.exit(3)


@command.command("targets")
@_root_opt
@click.option("--json", "as_json", is_flag=True, help="machine-readable")
def _targets(root, as_json):
    """List the registered target files (what Prometheus discovers)."""
    rows = list_targets(root)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{targets_dir(root)}: {len(rows)} group(s)")
    for r in rows:
        lab = " ".join(f"{k}={v}" for k, v in r["labels"].items())
        click.echo(
            f"  {r['job']:<10} {','.join(r['targets']) or '-':<24} {lab} {r.get('error', '')}  [{Path(r['file']).name}]"
        )


@command.command("backfill")
@_root_opt
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
def _backfill(root, run_dirs):
    """Import finished runs into the stack's history (promtool; a running Prometheus loads them within about a
    minute): whatever `report` reads, i.e. run folders, point folders and a headless Locust's --records file."""
    for rd in run_dirs:
        try:
            blocks = backfill(rd, root)
        except (FileNotFoundError, RuntimeError, ValueError) as e:
            raise click.ClickException(str(e)) from None
        click.echo(f"{rd}: {len(blocks)} block(s) into {Layout(stack_dir(root)).prom / 'data'}")


if __name__ == "__main__":
    command()
