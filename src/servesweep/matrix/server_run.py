"""One server configuration's life in a run and its points (`ServerRun`): the sglang_server role's variables and
its start through ansible-runner, each point through the load core's `run_point`, a point's outcome (done, failed,
interrupted, its records kept aside), and a server lost under a point told hung from dead. `RunState` is what the
main run (orchestrator.Runner) and every packed lane (orchestrator.Lane) share, declared; a lane's own state is its
ServerRun's.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.config.experiment import (
    Experiment,
    ServerConfig,
)
from servesweep.config.point import LoadPoint
from servesweep.config.secrets import KEY_ENV
from servesweep.matrix.answer_probes import needle_into_summary, probe_configuration
from servesweep.matrix.planner import ConfigPlan, Plan
from servesweep.matrix.run_setup import MANIFEST_RESERVE_BYTES, mib, point_bytes, point_requests, relative_to
from servesweep.processes import OwnedProcesses
from servesweep.results import manifest as mf
from servesweep.results.degeneration import degeneration_warning
from servesweep.results.degraded import degradation
from servesweep.results.point_summary import SUMMARY, PointSummary, Stats
from servesweep.target import http

if TYPE_CHECKING:  # at run time imported where used: a run that does not need one does not load it
    from servesweep.driver.ansible import PlaybookResult
    from servesweep.driver.point_progress import PointWatch
    from servesweep.observe.exporter import ClientMetrics
    from servesweep.observe.targets import RunTargets

PLAYBOOK = "sglang_server.yml"


class Interrupted(Exception):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP: stop after cleaning up; the run can be resumed. The run exits with
    128 + the signal's number."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DiskTrouble(Exception):
    """The results folder filled up (or went read-only) mid-run: stop before a point is half-written; finished
    points stay as they are and the run can be resumed once there is room."""


# errno values that mean "the results folder cannot take more": full, over quota, read-only
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}


def print_error(text: str, style: str | None = None) -> None:
    """One message on stderr, as written (no markup read, never wrapped); `style` colours it on a terminal."""
    if style and sys.stderr.isatty():
        from rich.console import Console

        Console(stderr=True).print(
            text, style=style, markup=False, highlight=False, emoji=False, soft_wrap=True
        )
    else:
        print(text, file=sys.stderr, flush=True)


def is_disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _DISK_ERRNOS


@dataclass
class StopState:
    """A stop asked of the whole run (a signal, or a lane that failed): set from the main thread's signal handler or
    from any lane, cleared by the run only (before it stops the servers), read by every part of it."""

    requested: bool = False
    signal: signal.Signals | int = signal.SIGINT  # the signal that asked (the run's exit code is 128 + it)

    def name(self) -> str:
        return signal.Signals(self.signal).name


@dataclass
class RunState:
    """What the parts of one run share: the serial run and each lane of a packed run (servesweep.matrix.packed)
    read it all; nothing else is shared between them (each part's own state is its ServerRun's).

    Lane threads change it only as follows: the manifest's entries of their own configuration and its points, its
    `events` (appended) and `hosts` (set by key), saved with Manifest.save (one snapshot under the manifest's lock);
    `stop` (set, never cleared); the exporter's read count (`note_last_summary`, under `lock`). The rest is set by
    the run (main thread) before any lane starts or after they all ended."""

    m: mf.Manifest
    exp: Experiment
    plan: Plan
    keep_server: bool
    owned: OwnedProcesses  # processes.json: the Locust groups and Ansible processes of this run
    api_key: str | None
    key_env: (
        str | None
    )  # the variable each Locust child gets the run's key under (driver.point_run.run_point)
    stop: StopState = field(default_factory=StopState)
    metrics: ClientMetrics | None = None  # while the run runs (Runner._start_exporter)
    exporter_at: str | None = None
    targets: RunTargets | None = None  # what this run registered for Prometheus
    reads_at_finish: int | None = None  # metrics.reads when the last point's summary was set
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_last_summary(self, reads: int) -> None:
        """The exporter's read count when a point's summary was set: Runner.close waits for a read after the last."""
        with self.lock:
            self.reads_at_finish = reads


class ServerRun:
    """One configuration's server and its points at one address: start the server, run the points, restart a dead
    server and retry its point. The serial run is one (Runner, the run's port); each placement of a packed run is one
    (Lane, the placement's host, GPUs and port). Its own state: `port`, `console`, `in_ansible` (its Ansible run in
    progress: a signal then waits for the run's next poll), the point being watched; the rest is `shared`."""

    def __init__(self, shared: RunState, *, port: int, console: Any):
        self.shared = shared
        self.port = port
        self.console = console
        self.in_ansible = False
        self._watch: PointWatch | None = None  # the point running

    # -- the run's shared state, read-only here (RunState says who changes what) --

    @property
    def m(self) -> mf.Manifest:
        return self.shared.m

    @property
    def exp(self) -> Experiment:
        return self.shared.exp

    @property
    def plan(self) -> Plan:
        return self.shared.plan

    @property
    def keep_server(self) -> bool:
        return self.shared.keep_server

    @property
    def owned(self) -> OwnedProcesses:
        return self.shared.owned

    @property
    def api_key(self) -> str | None:
        return self.shared.api_key

    @property
    def key_env(self) -> str | None:
        return self.shared.key_env

    @property
    def metrics(self) -> ClientMetrics | None:
        return self.shared.metrics

    @property
    def stop_signal(self) -> signal.Signals | int:
        return self.shared.stop.signal

    @property
    def stop_requested(self) -> bool:
        return self.shared.stop.requested

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        if value:  # any part may stop the whole run; only the run clears a stop (Runner.stop_requested)
            self.shared.stop.requested = True

    # -- helpers --

    @property
    def run_dir(self) -> Path:
        return self.m.run_dir

    @property
    def ansible_tag(self) -> str:
        """Names this run's Ansible processes (their private data dir), so a resume can find a killed run's."""
        return hashlib.sha1(str(self.run_dir.resolve()).encode()).hexdigest()[:12]

    def event(self, text: str) -> None:
        """`text` (Rich markup) on the console; the manifest keeps it plain."""
        from rich.text import Text

        self.m.add_event(Text.from_markup(text).plain)
        self.console.print(text)

    def base_url(self) -> str:
        return self.exp.target.url(self.port)

    def _worker_hosts(self) -> dict | None:
        """load.worker_hosts as run_point takes it (the inventory relative to the experiment file)."""
        wh = self.exp.load.worker_hosts
        if wh is None:
            return None
        return wh.model_dump() | {"inventory": relative_to(self.m.experiment_file, wh.inventory)}

    def _inventory(self) -> str:
        from servesweep.driver.ansible import local_inventory

        inv = self.exp.target.inventory
        assert inv is not None  # Ansible runs for a managed target only, which has one (Target._one)
        if inv == "local":
            return local_inventory(self.exp.target.host_group)
        p = Path(inv).expanduser()
        if not p.is_absolute() and self.m.experiment_file:
            p = Path(self.m.experiment_file).parent / p
        return str(p)

    def role_vars(self, cfg_id: str, state: str) -> dict[str, Any]:
        from servesweep.sglang.server_command import ServerLaunch

        exp, L = self.exp, self.exp.launcher
        c = self.m.config(cfg_id)
        local = exp.target.inventory == "local"
        python = L.python or (sys.executable if (L.emulator and local) else "python3")
        if L.generic:
            image = L.image or ""
        else:
            image = L.image or f"lmsysorg/sglang:v{exp.sglang_version}"
        bind, workdir = ("127.0.0.1" if local else "0.0.0.0"), f"{L.workdir.rstrip('/')}/p{self.port}"
        # the server's whole command line, built here (sglang/server_command.py); the role only writes it out
        launch = ServerLaunch(
            kind="generic" if L.generic else "emulator" if L.emulator else "sglang",
            launcher=L.kind,
            python=python,
            model_path=exp.model.path,
            served_model_name=exp.model.served_model_name or "",
            port=self.port,
            bind=bind,
            workdir=workdir,
            version=exp.sglang_version or "",
            flags=c.flags,
            command=L.command or (),
            sim_gpu=L.gpu or "",
            sim_args=L.sim_args,
            extra_spec_algorithms=L.extra_spec_algorithms,
            api_key=bool(self.api_key),
        )
        return {
            "sglang_server_hosts": exp.target.host_group,
            "sglang_server_state": state,
            "sglang_server_launcher": L.kind,
            "sglang_server_version": exp.sglang_version or "",
            "sglang_server_argv": launch.argv(),
            "sglang_server_generic": L.generic,
            "sglang_server_health_path": L.health_path,
            "sglang_server_info_paths": L.info_paths,
            "sglang_server_verify": L.verify,
            "sglang_server_server_api_key_env": L.server_api_key_env or "",
            "sglang_server_model_path": exp.model.path,
            "sglang_server_served_model_name": exp.model.served_model_name or "",
            "sglang_server_flags": c.flags,
            "sglang_server_env": c.env,
            "sglang_server_port": self.port,
            "sglang_server_bind": bind,
            "sglang_server_python": python,
            "sglang_server_emulator": L.emulator,
            "sglang_server_sim_gpu": L.gpu or "",
            "sglang_server_workdir": workdir,
            "sglang_server_results_dir": str(self.run_dir / "servers" / cfg_id),
            # a started server's info and log are written here from the role's set_stats (_save_server_files):
            # three module runs fewer per start; a failed start's log the role still writes itself
            "sglang_server_results_on_success": False,
            "sglang_server_startup_timeout": int(L.startup_timeout_s),
            # never adopt a server that is already up (a killed run's leftover may be mid-point or wedged): the
            # role stops it through its pidfile and starts a fresh one
            "sglang_server_force_restart": state == "started",
            "sglang_server_stop_timeout": int(L.stop_timeout_s),
            "sglang_server_api_key_env": L.api_key_env or "",
            "sglang_server_become": L.become,
            # host facts once per run: gathering them costs a few seconds per restart
            "sglang_server_gather_facts": not self.m.hosts,
            "sglang_server_unit": L.unit,
            "sglang_server_docker_image": image,
        }

    def _secrets(self) -> dict[str, Any]:
        """The API key goes to the role through a 0600 file; its variables are hidden from Ansible's environment."""
        if not self.api_key:
            return {}
        hide = tuple(n for n in (self.exp.launcher.api_key_env, KEY_ENV) if n)
        return {"secrets": {"sglang_server_api_key": self.api_key}, "hide_env": hide}

    def ansible(self, cfg_id: str, state: str, what: str, artifact_dir: Path | None = None) -> PlaybookResult:
        from rich.markup import escape

        from servesweep.driver.ansible import run_playbook
        from servesweep.driver.point_progress import PROGRESS_EVERY_S

        ident = f"{cfg_id}-{state}-{self.m.config(cfg_id).attempts}-{int(time.time())}"
        status = self.console.status(f"{what}: starting Ansible")
        # Without a terminal the spinner shows nothing: a server that takes minutes to start (a big model on GPUs)
        # gets a plain line at the start and, while the role waits, one every PROGRESS_EVERY_S with its task.
        plain = not self.console.is_terminal
        started = time.monotonic()
        task_now, line_at = "starting Ansible", started
        if plain and state == "started":
            self.console.print(f"  {escape(what)}: starting (Ansible role)", highlight=False)

        def on_event(ev: dict) -> None:
            nonlocal task_now
            task = (ev.get("event_data") or {}).get("task")
            if ev.get("event") == "playbook_on_task_start" and task:
                status.update(f"{what}: {task}")
                task_now = task

        def cancel() -> bool:  # run_playbook polls it about once a second
            nonlocal line_at
            now = time.monotonic()
            if plain and now - line_at >= PROGRESS_EVERY_S:
                self.console.print(
                    f"  {escape(what)}: {escape(task_now)} ({now - started:.0f} s)", highlight=False
                )
                line_at = now
            return self.stop_requested

        self.in_ansible = True
        try:
            with status:
                return run_playbook(
                    PLAYBOOK,
                    inventory=self._inventory(),
                    extravars=self.role_vars(cfg_id, state),
                    artifact_dir=artifact_dir or self.run_dir / "servers" / cfg_id / "ansible",
                    ident=ident,
                    timeout_s=self.exp.launcher.startup_timeout_s + self.exp.launcher.stop_timeout_s + 300,
                    on_event=on_event,
                    cancel=cancel,
                    tag=self.ansible_tag,
                    owned=self.owned,
                    **self._secrets(),
                )
        finally:
            self.in_ansible = False
            if self.stop_requested:
                raise Interrupted(signal.Signals(self.stop_signal).name)

    def _write_targets(self, cid: str) -> None:
        """Register the exporter and this configuration's server /metrics in the observe stack's one targets
        folder (`<results root>/.observe/targets`, docs/observability.md); the next configuration replaces it."""
        from urllib.parse import urlsplit

        targets = self.run_targets()
        path = self.exp.launcher.metrics_path
        if path is None:
            targets.drop("sglang", "server")
        else:
            targets.server(urlsplit(self.base_url()).netloc, config=cid, metrics_path=path)

    def run_targets(self) -> RunTargets:
        """This run's observe.targets.RunTargets, made at first use with the run's exporter registered in it."""
        from servesweep.observe.targets import RunTargets, scrape_address

        s = self.shared
        if s.targets is None:
            s.targets = RunTargets(self.m.run_id, self.run_dir.parent)
            if s.exporter_at is not None and (served := self.m.exporter) is not None:
                s.targets.exporter(scrape_address(self.exp.exporter.host, served.port))
        return s.targets

    def _point_watch(self, pid: str, head: str) -> PointWatch:
        """The point's live view: the feed's records go to the exporter as they arrive; without a terminal, plain
        progress lines (driver/point_progress.py)."""
        from servesweep.driver.point_progress import PointWatch

        plain = None if self.console.is_terminal else self._plain
        return PointWatch(pid, metrics=self.metrics, echo=plain, label=head)

    def _plain(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _metrics_started(self, pid: str, point) -> None:
        if self.metrics is None:
            return
        from servesweep.observe.exporter import loadpoint_axes

        self.metrics.point_started(pid, loadpoint_axes(point))

    def _metrics_finished(self, pid: str, folder: Path, summary: dict | None) -> None:
        if self.metrics is None:
            return
        if summary is not None:
            assert self._watch is not None  # _run_point made the point's watch before it ran the point
            try:
                from servesweep.results.records import read_parquet

                # the records the live feed did not carry (each request is counted once)
                self._watch.rest(read_parquet(folder / "records.parquet").to_pylist())
            except (OSError, ValueError) as e:  # the gauges still come from the summary
                self.console.print(f"[yellow]client metrics: records of {pid} not read ({e})[/]")
        self.metrics.point_finished(pid, summary)
        self.shared.note_last_summary(self.metrics.reads)

    def _gpu_samplers(self, cid: str) -> list[str] | None:
        """The GPU sampler the role started beside the configuration's server (docs/gpu-telemetry.md), if any."""
        gs = (self.m.config(cid).server or {}).get("gpu_sampler") or {}
        return [gs["url"]] if gs.get("running") and gs.get("url") else None

    def _pending(self, cfg_id: str) -> list[str]:
        return [
            pid
            for pid, p in self.m.points_typed().items()
            if p.config_id == cfg_id and p.status not in mf.FINISHED
        ]

    def open_config(self, cfg, todo: list[str], *, restart: bool = False) -> bool:
        """Make a configuration's server ready for points: an attempt counted, the server started through the role
        (or, unmanaged, its info read), its Prometheus targets written, its needle probes run. False: it did not
        start (`_start_server` marked `todo` with the reason). The grid, a search and a decision start one so."""
        cid = cfg.id
        self.m.update_config(
            cid, attempts=self.m.config(cid).attempts + 1, status="starting", started=mf.now_iso()
        )
        self.m.save()
        if self.exp.target.managed:
            self.config_rule(cfg)
            if not self._start_server(cid, todo, restart=restart):
                return False
        else:
            info = {
                k: _get_json(self.base_url() + p) for k, p in (self.exp.launcher.info_paths or {}).items()
            }
            self.m.update_config(cid, status="ready", server={**info, "info": info})
            self.m.save()
        self._write_targets(cid)
        probe_configuration(self.exp, self.m, cid, self.base_url(), self.api_key, self.event)
        return True

    def _run_config(self, cp: ConfigPlan) -> None:
        cfg = cp.config
        cid = cfg.id
        todo = self._pending(cid)
        if self.exp.search is not None:
            from servesweep.matrix.capacity_run import pending_searches

            todo = pending_searches(self.m.data, cid)
        if not todo:
            return
        if not self.open_config(cfg, [pid for pid in todo if pid in self.m.points]):
            return
        if self.exp.search is not None:
            from servesweep.matrix.capacity_run import run_searches

            run_searches(self, cid, todo)
            todo = []
        for i, pid in enumerate(todo):
            while True:
                if self.stop_requested:
                    raise Interrupted(signal.Signals(self.stop_signal).name)
                self._run_point(cid, pid)
                p = self.m.point(pid)
                # _run_point has checked /health when Locust ran; else (the point failed before) check it now
                if p.status != mf.FAILED or (
                    p.server_lost is None and not self._lost_under(pid, keep_reason=True)
                ):
                    break
                # the server died under this point: keep its log with the point, restart it, retry the point
                self._server_crashed(cid, pid)
                retry = p.attempts <= self.exp.retries
                later = todo[i + 1 :]
                if not self.exp.target.managed or not (retry or later):
                    for other in later:
                        self.m.update_point(
                            other, status=mf.SERVER_FAILED, reason=f"server crashed during {pid}"
                        )
                    self.m.save()
                    return
                if not self._start_server(cid, ([pid] if retry else []) + later, restart=True):
                    return
                if not retry:
                    self.event(
                        f"[red]✗ {pid}[/]: failed after {p.attempts} attempts (retries: {self.exp.retries})"
                    )
                    break
                self.event(f"retrying {pid} (attempt {p.attempts + 1} of {self.exp.retries + 1})")
        self.m.update_config(cid, status="done")
        self.m.save()

    def config_rule(self, cfg: ServerConfig) -> None:
        """The console's rule that opens a configuration: its id and flags."""
        self.console.rule(f"[bold]{cfg.id}[/]  {_flags_text(cfg)}")

    def _start_server(self, cid: str, todo: list[str], *, restart: bool = False) -> bool:
        """Apply the role (state started); on failure every point of `todo` is marked server_failed."""
        if restart:
            self.m.update_config(cid, restarts=self.m.config(cid).restarts + 1)
        res = self.ansible(cid, "started", f"{'restarting' if restart else 'server'} {cid}")
        server = res.artifact_data.get("sglang_server")
        if not res.ok:
            from rich.markup import escape

            from servesweep.sglang.server_log import decisive_line

            log = self.run_dir / "servers" / cid / "server.log"
            # the line that says why (SGLang's argparse `error:` line, a traceback's last line) before the role's
            # message, whose tail of the log is mostly usage text or stack frames
            decisive = decisive_line(log.read_text(errors="replace")) if log.is_file() else None
            error = res.error() if decisive is None else f"{decisive} -- {res.error()}"
            self.m.update_config(
                cid, status="failed", error=error, server=server, log=str(log) if log.exists() else None
            )
            for pid in todo:
                self.m.update_point(pid, status=mf.SERVER_FAILED, reason=f"server did not start: {error}")
            self.m.save()
            head = "" if decisive is None else f"[bold]{escape(decisive)}[/]\n  "
            self.event(f"[red]✗ {cid}[/]: {head}{escape(res.error()[:2000])}")
            return False
        self._save_server_files(cid, server, res.artifact_data.get("sglang_server_log"))
        self.m.update_config(
            cid, status="ready", server=server, error=None, ready_after_s=round(res.duration_s, 1)
        )
        if server and server.get("facts"):
            self.m.set_host_facts(server.get("host", "?"), server["facts"])
        self.m.save()
        ready = (server or {}).get("ready") or {}
        self.event(
            f"[green]✓ {cid}[/] {'restarted' if restart else 'ready'} (/health after "
            f"{ready.get('health_after_s', '?')} s, role {res.duration_s:.1f} s)"
        )
        return True

    def _save_server_files(self, cid: str, server: dict | None, log: str | None) -> None:
        """servers/<cid>/server_info.json and server.log of a started server, as the role would write them."""
        folder = self.run_dir / "servers" / cid
        folder.mkdir(parents=True, exist_ok=True)
        if server is not None:
            (folder / "server_info.json").write_text(json.dumps(server, indent=4) + "\n")
        (folder / "server.log").write_text((log or "") + "\n")

    def _run_point(self, cid: str, pid: str) -> bool:
        """Run one point of configuration `cid` into its folder; False when it failed (the run goes on)."""
        from servesweep.driver.point_run import run_point  # no Locust import: it runs Locust as a subprocess

        p = self.m.point(pid)
        ld = self.exp.load
        flushed = None
        if self.exp.flush_cache_between_points and self.exp.launcher.flush_cache_path:
            flushed = _flush_cache(self.base_url() + self.exp.launcher.flush_cache_path, self.api_key)
        # the point as the manifest stores it; the key's variable is the one this process holds the run's key under
        point = LoadPoint.model_validate({**p.point, "api_key_env": self.key_env})
        tmp = self.run_dir / f".tmp-{pid}"
        shutil.rmtree(tmp, ignore_errors=True)
        self._check_room(pid, point)
        p = self.m.update_point(
            pid,
            status=mf.RUNNING,
            attempts=p.attempts + 1,
            started=mf.now_iso(),
            cache_flushed=flushed,
            server_lost=None,
        )
        self.m.save()
        self._metrics_started(pid, point)
        t0 = time.monotonic()
        counts = self.m.counts()
        n_done = counts.get(mf.DONE, 0) + 1
        n_all = sum(v for k, v in counts.items() if k != mf.INFEASIBLE)
        head = f"[{n_done}/{n_all}] {pid}"
        status = self.console.status(f"{head}: starting Locust")
        watch = self._watch = self._point_watch(pid, head)

        def progress(d: dict) -> None:
            watch.progress(d)
            status.update(
                f"{head}: {d.get('completed', 0)} done, {d.get('failed', 0)} failed, {d.get('elapsed_s', 0):.0f} s"
            )

        try:
            with status:
                summary = run_point(
                    point,
                    tmp,
                    workers=ld.workers,
                    progress=progress,
                    slos=",".join(self.exp.slo) or None,
                    worker_hosts=self._worker_hosts(),
                    owned=self.owned,
                    max_failure_rate=ld.max_failure_rate,
                    on_records=watch.records,
                    gpu_telemetry=self._gpu_samplers(p.config_id),
                )
        except Interrupted:
            self._keep_interrupted(pid, tmp)
            raise
        except Exception as e:  # the point failed; the run goes on
            self._point_failed(pid, tmp, e)
            return False
        if self._lost_under(pid):
            # the server died or hung under this point: its records measure that, not the configuration. Keep
            # them aside for inspection (a folder resume does not adopt) and let the caller record the crash.
            aside = _aside(self.run_dir, pid, p.attempts)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(tmp, aside)
            self._metrics_finished(pid, aside, None)
            self.m.update_point(
                pid,
                status=mf.FAILED,
                reason=f"{self.m.point(pid).reason}; records in {aside.relative_to(self.run_dir)}",
                finished=mf.now_iso(),
            )
            self.m.save()
            return False
        self._point_done(pid, tmp, summary, time.monotonic() - t0)
        return True

    def _check_room(self, pid: str, point: LoadPoint) -> None:
        """DiskTrouble when the results folder has no room for the point's records and the manifest."""
        dry = self.m.dry_run
        need = point_bytes(point_requests(self.exp, point.concurrency, dry), point.output_tokens)
        free = shutil.disk_usage(self.run_dir).free
        if free < need + MANIFEST_RESERVE_BYTES:
            raise DiskTrouble(
                f"the results folder {self.run_dir} has {mib(free)} free, point {pid} needs about "
                f"{mib(need + MANIFEST_RESERVE_BYTES)}"
            )

    def _keep_interrupted(self, pid: str, tmp: Path) -> None:
        """A signal stopped the point: the records Locust wrote before it stopped (run_point kept them in tmp) go
        aside, listed on the point."""
        if (tmp / "interrupted.json").is_file():
            aside = self.run_dir / "interrupted" / f"{pid}.{self.m.point(pid).attempts}"
            aside.parent.mkdir(exist_ok=True)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(tmp, aside)
            self.m.update_point(
                pid,
                records_aside=str(aside.relative_to(self.run_dir)),
                reason=f"interrupted by {signal.Signals(self.stop_signal).name}; the records of what "
                f"finished: {aside.relative_to(self.run_dir)}/records.partial.parquet",
            )
        shutil.rmtree(tmp, ignore_errors=True)
        self._metrics_finished(pid, tmp, None)

    def _point_failed(self, pid: str, tmp: Path, e: Exception) -> None:
        """The point failed: recorded, and the run goes on; DiskTrouble when the disk is why."""
        if is_disk_error(e) or shutil.disk_usage(self.run_dir).free < MANIFEST_RESERVE_BYTES:
            shutil.rmtree(tmp, ignore_errors=True)
            # the first line only: a failed Locust's message carries its log tail, tracebacks included
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise DiskTrouble(
                f"the results folder filled up during {pid} ({type(e).__name__}: {first})"
            ) from e
        msg = f"{type(e).__name__}: {e}"
        self.m.update_point(pid, status=mf.FAILED, reason=msg[-4000:], finished=mf.now_iso())
        self.m.save()
        self._metrics_finished(pid, tmp, None)
        self.event(f"[red]✗ {pid}[/]: {msg[:500]}")

    def _point_done(self, pid: str, tmp: Path, summary: dict, took_s: float) -> None:
        """The point's folder takes its final name and the manifest says where it is (its figures stay in its
        summary.json, the one place they are)."""
        final = self.run_dir / pid
        if final.exists():  # a folder from an attempt the manifest never recorded as done
            shutil.rmtree(final)
        needle_into_summary(summary, tmp, self.run_dir, self.m.point(pid).config_id)
        os.replace(tmp, final)
        self._metrics_finished(pid, final, summary)
        self.m.update_point(pid, status=mf.DONE, dir=pid, finished=mf.now_iso(), reason=None)
        self.m.save()
        s = PointSummary.check(final / SUMMARY, summary)
        mark = "[bold red]! DEGRADED[/]" if s.degraded else "✓"  # not the asked load: no tick
        self.console.print(
            f"  {mark} {pid}: {s.output_tokens_per_s or 0:.1f} tok/s, TTFT p50 {ms_text(_p(s.ttft_ms, 'p50'))}, "
            f"ITL/chunk p50 {ms_text(_p(s.itl_ms, 'p50'))}, ITL/token p50 {ms_text(_p(s.itl_per_token_ms, 'p50'))}, "
            f"{s.requests.failed} failed ({took_s:.1f} s)"
        )
        if warning := degeneration_warning({**summary, "point_id": pid}):
            self.event(f"[bold red]{warning}[/]")
        if (deg := degradation({**summary, "point_id": pid})) is not None:
            from rich.markup import escape

            self.event(f"[bold red]{escape(deg.line())}[/]")

    def _server_lost(self) -> tuple[str, str] | None:
        """None when /health answers 200, retried for a few seconds (a server may answer 503 briefly without being
        dead); else (what happened to the server, the detail): it hung (it took the connection and answered nothing
        within launcher.health_timeout_s: its process is up), it died (no connection), or it answered another
        status. Bounded: 3 tries of at most health_timeout_s (default 10 s), 1 + 2 s apart; the load has stopped
        when this runs, so a live server answers at once."""
        health_path = self.exp.launcher.health_path
        assert health_path is not None  # filled with its default by Launcher._server_kind_defaults
        url = self.base_url() + health_path
        timeout = self.exp.launcher.health_timeout_s
        try:
            code = http.retrying("health", lambda: http.status("GET", url, timeout=timeout), _HEALTH_RETRY)
        except http.ServerError as e:
            if e.status is not None:
                return f"the server answered {health_path} with HTTP {e.status}", str(e)
            if "no answer within" in str(e):
                return "the server hung", f"it took the connection but answered nothing: {e}"
            return "the server died", str(e)
        return None if code == 200 else (f"the server answered {health_path} with HTTP {code}", url)

    def _lost_under(self, pid: str, *, keep_reason: bool = False) -> bool:
        """Whether the server is gone (died or hung) after point `pid`; if so the point records what and why (before
        the reason it failed with, when `keep_reason`: the point failed before its health check)."""
        lost = self._server_lost()
        if lost is not None:
            what, detail = lost
            reason = self.m.point(pid).reason
            before = f"; {reason}" if keep_reason and reason else ""
            self.m.update_point(pid, server_lost=what, reason=f"{what} during this point ({detail}){before}")
        return lost is not None

    def _server_crashed(self, cid: str, failed_pid: str) -> None:
        """Record the crash: the server's log is fetched (Ansible) and attached to the failed point's kept-aside
        records; the configuration keeps a list of its crashes."""
        p = self.m.point(failed_pid)
        if self.exp.target.managed:
            self.ansible(cid, "logs", f"server {cid} crashed: fetching its log")
        log = self.run_dir / "servers" / cid / "server.log"
        aside = _aside(self.run_dir, failed_pid, p.attempts)
        attached = None
        if log.exists():
            aside.mkdir(exist_ok=True)
            shutil.copyfile(log, aside / "server.log")
            attached = str(aside / "server.log")
        lost = p.server_lost or "the server stopped answering /health"
        crash = {"t": mf.now_iso(), "point": failed_pid, "log": attached, "what": lost}
        self.m.update_config(
            cid,
            crashes=[*self.m.config(cid).crashes, crash],
            status="crashed",
            error=f"{lost} during {failed_pid}",
            log=attached,
        )
        reason = p.reason or ""
        self.m.update_point(
            failed_pid,
            server_log=attached,
            records_aside=str(aside.relative_to(self.run_dir))
            if (aside / "records.parquet").exists()
            else None,
            reason=f"{reason} (server log: {attached})"[:4000],
        )
        self.m.save()
        self.event(f"[red]✗ {cid}[/] {lost} during {failed_pid}; its log: {attached}")


def _aside(run_dir: Path, pid: str, attempt: int) -> Path:
    """Where a crashed attempt's records and the server log go: one level deeper than point folders, so nothing
    that globs `<run>/*/summary.json` (resume, reports, the exporter) takes them for a finished point."""
    d = run_dir / "crashed" / f"{pid}.{attempt}"
    d.parent.mkdir(exist_ok=True)
    return d


def _p(stats: Stats | None, which: str) -> float | None:
    """A percentile of a summary's Stats (None: the point has no such values)."""
    return None if stats is None else getattr(stats, which)


def table_figures(s: PointSummary | None) -> dict[str, Any]:
    """The figures of the run's results table from a done point's summary.json ({} for a point not done)."""
    if s is None:
        return {}
    return {
        "failed": s.requests.failed,
        "output_tokens_per_s": s.output_tokens_per_s,
        "request_rate": s.request_rate,
        "ttft_p50_ms": _p(s.ttft_ms, "p50"),
        "ttft_p99_ms": _p(s.ttft_ms, "p99"),
        "itl_p50_ms": _p(s.itl_ms, "p50"),
        "itl_p99_ms": _p(s.itl_ms, "p99"),
        "itl_per_token_p50_ms": _p(s.itl_per_token_ms, "p50"),
    }


def num_text(v: float | None, decimals: int) -> str:
    return "-" if v is None else f"{v:,.{decimals}f}"


def first_ids(ids: list[str], n: int = 5) -> str:
    """The first `n` point ids of an exit line, ', ...' when there are more."""
    return ", ".join(ids[:n]) + (", ..." if len(ids) > n else "")


def ms_text(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f}s" if v >= 1000 else f"{v:.1f}ms"


def _flags_text(cfg: ServerConfig) -> str:
    return " ".join(f"{k}={v}" for k, v in {**cfg.flags, **cfg.env}.items())


def _get_json(url: str) -> Any:
    try:
        return http.get_json(url, timeout=30)
    except http.ServerError as e:
        return {"error": str(e)}


_HEALTH_RETRY = http.Retry(attempts=3, first_delay_s=1.0)  # 1 + 2 s


# SGLang's /flush_cache answers 400 while requests still run: up to 20 tries 0.5 s apart
_FLUSH_RETRY = http.Retry(attempts=20, first_delay_s=0.5, max_delay_s=0.5, also=frozenset({400}))


def _flush_cache(url: str, api_key: str | None) -> bool:
    """POST the flush path (SGLang: /flush_cache), retried while the server is busy; False when it never took."""
    try:
        flushed = http.retrying(
            "flushing the cache", lambda: http.status("POST", url, api_key=api_key), _FLUSH_RETRY
        )
        return flushed == 200
    except http.ServerError:
        return False
