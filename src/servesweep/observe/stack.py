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

The folder itself (where things live, the target files, the process records, what a registering process reads
back) is observe/stackdir.py, which starts nothing, so a Locust process registers without this module. API for
processes that expose /metrics:

    register_targets("servesweep", ["127.0.0.1:9464"], {"run_id": run_id}) -> Path   # stackdir: atomic file_sd JSON
    unregister("servesweep", {"run_id": run_id})                                    # stackdir: removes that file
    backfill("runs/<run_id>")                       # a finished run's summaries into this Prometheus' TSDB
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

from servesweep.files import write_atomic
from servesweep.observe import promconfig

# Re-exported: what a process that exposes /metrics calls (docs/observability.md), and driver/load.py's check;
# the variable that names the stack folder.
from servesweep.observe.stackdir import ENV_DIR as ENV_DIR
from servesweep.observe.stackdir import (
    Layout,
    running,
    stack_dir,
    sweep_stale,
    write_record,
)
from servesweep.observe.stackdir import register_targets as register_targets
from servesweep.observe.stackdir import stack_present as stack_present
from servesweep.observe.stackdir import unregister as unregister
from servesweep.processes import Group, stop_group

DEFAULT_RETENTION = "400d"  # months of history, with backfilled runs older than a year still kept
DEFAULT_PORT, DEFAULT_GRAFANA_PORT = 9090, 3000
DATASOURCE_UID = "prometheus"  # the dashboards' fixed datasource uid (grafana/provisioning uses the same)
# The committed dashboards, from src/servesweep/observe/stack.py up to the repository root.
REPO_DASHBOARDS = Path(__file__).resolve().parents[3] / "grafana" / "dashboards"


def backfill(run_dir: str | Path, root: str | Path | None = None) -> list[Path]:
    """Import a finished run folder, point folder or bare records file (what `report` reads) into the stack's TSDB
    (servesweep.observe.promconfig.backfill); returns the new blocks. A stopped Prometheus loads them at `up`; a
    running one within about a minute."""
    data = Layout(stack_dir(root)).prom / "data"
    return promconfig.backfill(run_dir, data)


# ---------------------------------------------------------------- started processes (records: observe/stackdir.py)


def _stop(path: Path, timeout: float) -> dict | None:
    """Stop the recorded process's group (only if its leader is still the one recorded): SIGTERM, SIGKILL after
    `timeout`; drop the record. Returns the record of the process stopped, None if there was none."""
    rec = running(path)
    if rec is not None:
        stop_group({"pid": rec["pid"], "create_time": rec["start_time"]}, timeout)
    path.unlink(missing_ok=True)
    return rec


def _get(url: str, timeout: float = 2.0) -> str | None:
    from servesweep.target import http

    try:
        return http.get_text(url, timeout=timeout)
    except http.ServerError:
        return None


def _launch(start: Callable[..., promconfig.LocalService], record: Path, log: Path, **extra) -> dict:
    """Start a service with `start` (promconfig.start_prometheus or launch_service, given the rest of its
    arguments) in a session of its own that outlives this command, record it as soon as it runs, wait until ready;
    returns the record (dropped again when the service does not get ready)."""
    recs: list[dict] = []

    def started(group: Group) -> None:
        recs.append(write_record(record, group.pid, argv=group.argv, log=str(log), **extra))

    try:
        start(log_path=log, watch_parent=False, started=started)
    except BaseException:
        record.unlink(missing_ok=True)
        raise
    return recs[0]


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
    start = functools.partial(promconfig.start_prometheus, lay.prom_config, lay.prom / "data", exe=exe, host=host,
                              port=port, retention=retention, timeout=timeout)  # fmt: skip
    return _launch(start, lay.record("prometheus"), lay.log("prometheus"), url=f"http://{host}:{port}",
                   retention=retention)  # fmt: skip


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
    start = functools.partial(promconfig.launch_service, argv, url=url, ready_path="/api/health", timeout=timeout,
                              env=env)  # fmt: skip
    return _launch(start, lay.record("grafana"), lay.log("grafana"), url=url)


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
