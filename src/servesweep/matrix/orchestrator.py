"""`servesweep run FILE` and `servesweep run --resume runs/<run_id>`: the whole matrix, headless.

For each server configuration (in the planner's order) the sglang_server role is applied through ansible-runner
(restart, readiness, verification, resolved info), then every load point runs through the load core's `run_point`
(a Locust subprocess: this process never imports Locust or gevent, which would deadlock ansible-runner). A `search:`
block runs its capacity searches instead (matrix/capacity_run.py), a `decide:` block its decision, one server at a
time (matrix/decision_run.py).

The run is three objects: `Runner` (here: the whole run, its signals, exporter, table and report) and each packed
placement's `Lane` (here), both a `ServerRun` (matrix/server_run.py: one server's life and its points) sharing one
declared `RunState`; the run folder is made before by matrix/run_setup.py.

Durability: each point is measured into `runs/<run_id>/.tmp-<point_id>/` and renamed to `runs/<run_id>/<point_id>/`
only when complete, so a point folder exists if and only if the point finished; the manifest is rewritten
atomically after every change. Resume trusts both: finished points are never run again, a point interrupted
half-way is thrown away and run again, and nothing finished is lost.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.config.experiment import (
    ExperimentError,
    load_experiment,
)
from servesweep.config.secrets import drop_key, hold_key
from servesweep.exit_codes import BREACH, COULD_NOT_RUN, FAILED_REQUESTS, PASS, CouldNotRun, UsageError
from servesweep.matrix.planner import make_plan
from servesweep.matrix.run_setup import (
    MANIFEST_RESERVE_BYTES,
    create_run,
    estimate_run_bytes,
    point_bytes,
    point_requests,
    preflight_results_dir,
    resolve_run_key,
    shrink_for_dry_run,
    workload_cell,
)
from servesweep.matrix.server_run import (
    STOP_SIGNALS,
    DiskTrouble,
    Interrupted,
    RunState,
    ServerRun,
    first_ids,
    is_disk_error,
    ms_text,
    num_text,
    print_error,
    table_figures,
)
from servesweep.processes import OwnedProcesses
from servesweep.results import manifest as mf
from servesweep.results.pergpu import manifest_gpus, per_gpu
from servesweep.results.point_summary import SUMMARY, PointSummary

if TYPE_CHECKING:  # at run time imported where used: a run that does not need one does not load it
    from servesweep.matrix.packed import PlacementRecord


class Runner(ServerRun):
    """`servesweep run`: the whole matrix, its signals, exporter, results table and report. Serially it is the one
    ServerRun of the run (the run's port); a packed run's placements run as Lanes (servesweep.matrix.packed) that
    share its RunState."""

    def __init__(self, m: mf.Manifest, *, console, keep_server: bool = False):
        exp = m.experiment()
        # read once, before any server starts (an unreadable key fails here, naming the setting and the file)
        api_key = resolve_run_key(exp, m.experiment_file)
        shared = RunState(
            m=m,
            exp=exp,
            plan=make_plan(exp),
            keep_server=keep_server,
            # a resumed run stops the processes the interrupted run left (and nothing else)
            owned=OwnedProcesses(m.run_dir),
            api_key=api_key,
            # held in this process, never in os.environ (Ansible's processes inherit it); each Locust child gets it
            # in its own environment (driver.point_run.run_point)
            key_env=hold_key(api_key),
        )
        super().__init__(shared, port=m.port, console=console)
        # placed configurations side by side (servesweep.matrix.packed) when --max-parallel N > 1 asked for it
        self.packed = bool(m.packing or (exp.target.managed and exp.parallel and (m.max_parallel or 1) > 1))
        if exp.decide is not None:  # a decision packs its own probes (matrix/decision_run.py, docs/decision.md)
            from servesweep.matrix.decision_run import decision_packs

            self.packed = decision_packs(self)

    @property
    def stop_requested(self) -> bool:
        return self.shared.stop.requested

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        # cleared before the servers are stopped: the stop's own Ansible runs must not cancel themselves
        self.shared.stop.requested = value

    # -- signals: SIGINT / SIGTERM / SIGHUP set a flag; outside Ansible they interrupt at once --

    def _on_signal(self, signum, frame):
        if self.stop_requested:
            return  # the first signal's stop is under way: a second one must not break it
        self.stop_requested = True
        self.shared.stop.signal = signum
        if not self.in_ansible:
            raise Interrupted(signal.Signals(signum).name)

    def run(self) -> int:
        old = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            self._adopt_and_clean()
            self._start_exporter()
            self.m.status = "running"
            self.m.error = None  # a resumed run's previous stop
            self.m.data.setdefault("resumed", [])
            self.event(f"run {self.m.run_id}: results in {self.run_dir}")
            self.m.save()
            if self.exp.decide is not None:
                from servesweep.matrix.decision_run import run_decision_phase

                run_decision_phase(self, Lane, Interrupted)
            elif self.packed:
                from servesweep.matrix.packed import PackedRun, packing_of

                PackedRun(self, packing_of(self, self.m.max_parallel), Interrupted, Lane).run()
            else:
                for cp in self.plan.configs:
                    if self.stop_requested:
                        raise Interrupted(signal.Signals(self.stop_signal).name)
                    self._run_config(cp)
            self.m.status = "finished"
            self.m.save()
        except Interrupted:
            self.stop_requested = True
            self._mark_interrupted()
            name = signal.Signals(self.stop_signal).name
            msg = (
                f"interrupted by {name}: the load generator is stopped, finished points are kept; resume with  "
                f"servesweep run --resume {self.run_dir}"
            )
            print_error(msg)
            self._stop_server_quietly()
            return 128 + int(self.stop_signal)
        except DiskTrouble as e:
            for tmp in self.run_dir.glob(".tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            try:
                self._mark_interrupted()  # may fail too: the previous manifest then stays, whole
            except OSError:
                pass
            self.console.print(
                f"[red]stopped: {e}[/]\nfinished points are kept; make room, then resume with  "
                f"servesweep run --resume {self.run_dir}"
            )
            self._stop_server_quietly(outside_run_dir=True)
            return 4
        except OSError as e:
            if not is_disk_error(e):
                raise
            self._stop_server_quietly(outside_run_dir=True)
            self.console.print(
                f"[red]stopped: the results folder cannot be written ({e.strerror}: {e.filename})[/]\n"
                f"finished points are kept; fix it, then resume with  servesweep run --resume {self.run_dir}"
            )
            return 4
        except Exception as e:
            # A bug (ours or a library's): its traceback follows, but the server is not left running on its GPUs
            # and the manifest does not claim a running run (found on the real-SGLang tier: an orphaned server)
            self._on_unexpected_error(e)
            raise
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
        if not self.keep_server:
            self._stop_server_quietly()
        self.print_results()
        self.write_report()
        entries = self.m.points_typed()
        not_done = [pid for pid, p in entries.items() if p.status not in mf.FINISHED]
        if not_done:
            print_error(
                f"exit {COULD_NOT_RUN}: {len(not_done)} point(s) not measured ({first_ids(not_done)}; their "
                "status and reason in manifest.json)",
            )
            return COULD_NOT_RUN
        done = self.summaries()
        degraded = [pid for pid, s in done.items() if s.degraded]
        if degraded:  # measured, but not at the asked load: not what was asked (servesweep.exit_codes)
            from servesweep.results.degraded import exit_line

            print_error(exit_line(COULD_NOT_RUN, degraded))
            return COULD_NOT_RUN
        if self.exp.search is not None:
            from servesweep.matrix.capacity_run import unfinished

            if unfinished(self.m.data):
                print_error(f"exit {COULD_NOT_RUN}: the capacity search did not finish")
                return COULD_NOT_RUN
        if self.exp.decide is not None:
            from servesweep.matrix.decision_run import unfinished as decision_unfinished

            if why := decision_unfinished(self.m.data):
                print_error(f"exit {COULD_NOT_RUN}: {why}")
                return COULD_NOT_RUN
        # a capacity probe's failures are the search's evidence (its SLOs judge them, error_rate included): a probe
        # past the capacity may fail requests by design, and the search says what it found; a decision's probe
        # likewise (its tiers judge it)
        measured = {
            pid: s for pid, s in done.items() if entries[pid].search is None and entries[pid].decide is None
        }
        checks = [s.failure_check for s in measured.values()]
        # Any failed request is said, even within load.max_failure_rate: a green CI job should not hide a few 500s
        for fc in checks:
            if fc.passed and fc.warning:
                print_error(f"WARNING: {fc.warning}", style="bold yellow")
        over = [str(fc.message) for fc in checks if not fc.passed]
        for msg in over:
            print_error(f"failed: {msg}")
        if over:
            print_error(
                f"exit 3: {len(over)} point(s) failed the failure check (load.max_failure_rate "
                f"{self.exp.load.max_failure_rate:.1%}; 1.0 allows any share short of no success at all)",
            )
        if over:
            return FAILED_REQUESTS
        # the experiment's slo: at each measured point (a capacity probe's SLOs are the search's to judge)
        breached = [pid for pid, s in measured.items() if s.slos and not all(c.passed for c in s.slos)]
        if breached:
            print_error(
                f"exit {BREACH}: an SLO of the experiment breached at {len(breached)} point(s): "
                f"{first_ids(breached)} (servesweep gate RUN --details)",
            )
            return BREACH
        return PASS

    def _start_exporter(self) -> None:
        """One ClientMetrics per run, served over HTTP for Prometheus. It is fed here: during a point from the
        Locust process's live record feed (about once a second), at its end from the records the feed did not
        carry, and the point's summary (point_finished). Locust gets no metrics_port and each request id is
        observed once, so nothing is counted twice. A resumed run serves again (new port unless fixed)."""
        ex = self.exp.exporter
        if not ex.enabled or self.metrics is not None:
            return
        from servesweep.observe.exporter import ClientMetrics

        m = ClientMetrics(self.m.run_id)
        try:
            port = m.serve(ex.host, ex.port)
        except OSError as e:
            raise CouldNotRun(
                f"exporter: cannot serve client metrics on {ex.host}:{ex.port} ({e.strerror}); "
                "set exporter.port to a free port, or exporter.enabled: false"
            ) from None
        self.shared.metrics = m
        self.shared.exporter_at = at = f"{ex.host}:{port}"
        self.m.exporter = mf.ExporterInfo(host=ex.host, port=port, url=f"http://{at}/metrics")
        self.event(f"client metrics (Prometheus): http://{at}/metrics")

    def close(self) -> None:
        """Stop serving client metrics (after the run; a test scrapes them in between) once the stack's Prometheus
        has read the last point's summary (bounded: observe.targets.last_scrape), remove the run's targets from the
        observe stack's folder; let go of the run's key."""
        if self.metrics is not None:
            reads = self.shared.reads_at_finish
            if reads is not None:
                from servesweep.observe.targets import last_scrape

                last_scrape(self.metrics, reads, self.run_dir.parent)
            self.metrics.stop()
            self.shared.metrics = None
        if self.shared.targets is not None:
            self.shared.targets.close()
        drop_key()

    def _adopt_and_clean(self) -> None:
        """Before (re)starting: kill load generators left by a killed run, drop half-written point folders, and adopt
        finished point folders the manifest did not get to record."""
        from servesweep.driver.ansible import remove_private_dirs

        # a SIGKILLed run leaves its Ansible (which may be starting a server) and Locust running: stop them first,
        # exactly those it recorded in processes.json (pid and start time); a server it left is stopped through its
        # pidfile when the role starts this run's (force restart)
        n = self.owned.stop_previous()
        remove_private_dirs(self.ansible_tag)
        if n:
            what = ", ".join(f"{v} {k}" for k, v in sorted(n.items()))
            self.event(f"stopped what the interrupted run left running: {what} process(es)")
        for tmp in self.run_dir.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        changed = False
        for pid, p in self.m.points_typed().items():
            d = self.run_dir / pid
            if p.status != mf.DONE and (d / SUMMARY).is_file():
                PointSummary.load(d / SUMMARY)  # whole and valid (a damaged one is refused, naming the field)
                self.m.update_point(pid, status=mf.DONE, dir=pid)
                changed = True
            elif p.status == mf.DONE and not (self.run_dir / (p.dir or pid) / SUMMARY).is_file():
                # its figures are in summary.json only: a done point whose folder went is measured again
                self.event(f"{pid}: done, but its summary.json is gone; it runs again")
                self.m.update_point(pid, status=mf.PENDING, dir=None)
                changed = True
            elif p.status == mf.RUNNING:
                self.m.update_point(pid, status=mf.PENDING)
                changed = True
        if changed:
            self.m.save()

    def _on_unexpected_error(self, e: Exception) -> None:
        """The run stops on an exception no handler expects: points in flight go back to pending, the manifest
        says why, the server is stopped through the role (unless --keep-server), and the console says how to
        resume. Nothing here may hide `e`: its own failures are reported and swallowed."""
        what = f"{type(e).__name__}: {e}"
        try:
            self.m.error = what
            self._mark_interrupted()
        except Exception as save_error:  # noqa: BLE001 - the manifest of the last save stays, whole
            print_error(f"could not save the manifest: {save_error}")
        print_error(
            f"servesweep stopped on an unexpected error ({what}); finished points are kept; resume with  "
            f"servesweep run --resume {self.run_dir}",
        )
        try:
            self._stop_server_quietly()
        except Exception as stop_error:  # noqa: BLE001
            print_error(f"could not stop the server: {stop_error}")

    def _mark_interrupted(self) -> None:
        for pid, p in self.m.points_typed().items():
            if p.status == mf.RUNNING:
                self.m.update_point(pid, status=mf.PENDING)
        self.m.status = "interrupted"
        self.m.save()

    def _stop_server_quietly(self, *, outside_run_dir: bool = False) -> None:
        """Stop the server through the role. With a full results folder Ansible's artifacts go to a temporary
        folder instead (removed after)."""
        if not self.exp.target.managed or self.keep_server:
            return
        if self.packed and (packing := self.m.packing):  # every placement's server, at once
            from servesweep.matrix.packed import holding, stop_placements

            stop_placements(self, Interrupted, Lane, holding(self, packing), outside_run_dir=outside_run_dir)
            return
        cid = next(iter(self.m.configs), None)
        if cid is None:
            return
        self.stop_requested = False
        scratch = Path(tempfile.mkdtemp(prefix="servesweep-stop-")) if outside_run_dir else None
        try:
            res = self.ansible(cid, "stopped", "stopping the server", artifact_dir=scratch)
            if not res.ok:
                self.console.print(f"[yellow]could not stop the server: {res.error()}[/]")
        except Interrupted:
            pass
        except OSError as e:
            self.console.print(f"[yellow]could not stop the server: {e}[/]")
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)

    def write_report(self) -> None:
        """The report helper's HTML + Markdown report of this run folder; a report problem never fails the run."""
        try:
            from servesweep.results.report import write_report

            html, md = write_report(self.run_dir)
        except Exception as e:
            self.console.print(
                f"[yellow]report not written ({type(e).__name__}: {e}); try: servesweep report {self.run_dir}[/]"
            )
            return
        self.console.print(f"report: {html} (and {md.name})")

    def summaries(self) -> dict[str, PointSummary]:
        """Point id -> summary.json of every done point: where a point's figures are (the manifest says where its
        folder is), read by the run's exit checks and its results table."""
        return {
            pid: PointSummary.load(self.run_dir / (p.dir or pid) / SUMMARY)
            for pid, p in self.m.points_typed().items()
            if p.status == mf.DONE
        }

    def print_results(self) -> None:
        from rich.table import Table

        dry = "DRY RUN (emulator, shrunk points) - " if self.m.dry_run else ""
        t = Table(title=f"{dry}results: {self.run_dir}")
        for col in (
            "config",
            "workload",
            "prompt",
            "out",
            "conc",
            "status",
            "GPUs",
            "tok/s",
            "tok/s/GPU",
            "req/s/GPU",
            "TTFT p50",
            "TTFT p99",
            "ITL/chunk p50",  # the gap between chunks, as `servesweep load`'s table (docs/metrics.md)
            "ITL/chunk p99",
            "ITL/token p50",  # the decode speed a speculative configuration's chunk gaps hide
            "fail",
        ):
            t.add_column(col, justify="left" if col in ("config", "workload", "status") else "right")
        gpus = manifest_gpus(self.m.data)  # per GPU: TP1 on one GPU and TP8 on eight compare fairly
        done = self.summaries()
        for pid, p in self.m.points_typed().items():
            s = done.get(pid)
            r = table_figures(s)
            st: str = p.status
            g = gpus.get(p.config_id)
            color = {"done": "green", "infeasible": "dim", "pending": "yellow"}.get(st, "red")
            if s is not None and s.degraded:
                st, color = "DEGRADED", "bold red"  # done, but measured at a lower load than asked
            t.add_row(
                p.config_id,
                workload_cell(p),
                str(p.prompt_tokens),
                str(p.output_tokens),
                str(p.concurrency) + (f"@{p.rate:g}/s" if p.rate else ""),
                f"[{color}]{st}[/]",
                str(g or "-"),
                f"{r['output_tokens_per_s']:.1f}" if r.get("output_tokens_per_s") is not None else "-",
                num_text(per_gpu(r.get("output_tokens_per_s"), g), 1),
                num_text(per_gpu(r.get("request_rate"), g), 3),
                ms_text(r.get("ttft_p50_ms")),
                ms_text(r.get("ttft_p99_ms")),
                ms_text(r.get("itl_p50_ms")),
                ms_text(r.get("itl_p99_ms")),
                ms_text(r.get("itl_per_token_p50_ms")),
                str(r.get("failed", "-")),
            )
        self.console.print(t)
        counts = self.m.counts()
        self.console.print(
            "points: "
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            + f"\nresults: {self.run_dir}/<point>/summary.json, records.parquet; manifest: {self.m.path}"
        )
        if self.exp.search is not None:
            from servesweep.results.capacity import print_table

            print_table(self.console, self.run_dir)


# -- a packed run's lanes: servesweep.matrix.packed runs them (it may not import this module) --


class _LaneStatus:
    """The progress line of a lane: no live display (one per console at most), and the moment a lane's running
    Locust point notices a stop (ServerRun._run_point's progress callback updates it about once a second)."""

    def __init__(self, lane: Lane):
        self.lane = lane

    def __enter__(self) -> _LaneStatus:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, text: str) -> None:
        if self.lane.stop_requested and not self.lane.in_ansible:
            raise self.lane.interrupted(self.lane.shared.stop.name())


class _LaneConsole:
    """Prints through the run's console, each line prefixed with the placement; status lines are _LaneStatus."""

    is_terminal = False  # lanes print plain progress lines: several live displays cannot share a terminal

    def __init__(self, lane: Lane, console):
        self.lane, self.console = lane, console

    def status(self, text: str) -> _LaneStatus:
        return _LaneStatus(self.lane)

    def print(self, *args, **kw) -> None:
        self.console.print(f"\\[{self.lane.tag}]", *args, **kw)

    def rule(self, text: str = "", **kw) -> None:
        self.console.print(f"\\[{self.lane.tag}] -- {text}", **kw)


class Lane(ServerRun):
    """One placement of a packed run (servesweep.matrix.packed): a ServerRun on the placement's host, GPUs and port
    over the run's RunState. Its own: the placement, its port and base URL, its console (lines prefixed host:gpus),
    its Ansible state and point watch, and its pending points (the isolation twins are left to the isolation
    phase). A stop it asks reaches the whole run; it never clears one."""

    def __init__(self, main: Runner, placement: PlacementRecord, interrupted: type[BaseException]):
        self.main = main  # the run's Runner: its stop (matrix/isolation_rerun.py reads main.stop_requested)
        self.placement = placement
        self.interrupted = interrupted
        self.tag = f"{placement['host']}:{placement['gpus']}"
        super().__init__(main.shared, port=int(placement["port"]), console=_LaneConsole(self, main.console))

    def base_url(self) -> str:
        return f"http://{self.placement['address']}:{self.port}"

    def _pending(self, cfg_id: str) -> list[str]:
        # the isolation sample's twins run after the packed phase (matrix/isolation_rerun.py), not in the lane
        return [pid for pid in super()._pending(cfg_id) if self.m.point(pid).isolation_of is None]

    def role_vars(self, cfg_id: str, state: str) -> dict[str, Any]:
        v = super().role_vars(cfg_id, state)
        v["sglang_server_hosts"] = self.placement["host"]
        v["sglang_server_env"] = {**v["sglang_server_env"], "CUDA_VISIBLE_DEVICES": self.placement["gpus"]}
        return v

    def _write_targets(self, cid: str) -> None:
        return None  # written once for every placement (PackedRun._write_targets)

    def run_placement(self) -> None:
        """The configuration's points on this placement's server, then the server stopped (its GPUs freed)."""
        cid = self.placement["config"]
        cp = next(c for c in self.plan.configs if c.config.id == cid)
        labels = {"host": self.placement["host"], "gpus": self.placement["gpus"]}
        for pid, p in self.m.points_typed().items():
            if p.config_id == cid and p.status not in mf.FINISHED:
                point = {
                    **p.point,
                    "base_url": self.base_url(),
                    "labels": {**p.point.get("labels", {}), **labels},
                }
                self.m.update_point(pid, point=point)
        # from here on this placement may hold a server
        self.m.update_config(cid, placement=dict(self.placement), server_stopped=None)
        self.m.save()
        try:
            self._run_config(cp)
        finally:
            if self.exp.target.managed and not self.keep_server and not self.stop_requested:
                self.stop_server()

    def stop_server(self, artifact_dir: Path | None = None) -> bool:
        """The role's `stopped` state on this placement's host and port; marks the configuration's server stopped."""
        cid = self.placement["config"]
        res = self.ansible(cid, "stopped", f"stopping {cid}", artifact_dir=artifact_dir)
        if not res.ok:
            self.console.print(f"[yellow]could not stop {cid}: {res.error()}[/]")
            return False
        self.m.update_config(cid, server_stopped=True)
        self.m.save()
        return True


def run_matrix(
    file: str | None,
    resume: str | None,
    out: str = "runs",
    *,
    keep_server: bool = False,
    max_parallel: int | None = None,
    isolation_sample: bool = True,
    dry_run: bool = False,
) -> int:
    """`servesweep run`: run the experiment FILE's matrix into a new folder under `out`, or finish the stopped run
    folder `resume`; its exit code (servesweep.exit_codes; 4: the results folder full or unwritable, 128 + signum
    when a signal stops it)."""
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)  # logs and CI: no 80-column wrap
    if bool(file) == bool(resume):
        raise UsageError("give an experiment FILE or --resume runs/<run_id> (one of them)")
    if resume:
        try:
            m = mf.Manifest.load(Path(resume).resolve())
        except (FileNotFoundError, ValueError) as e:
            raise CouldNotRun(str(e)) from None
        owner = OwnedProcesses(m.run_dir).previous_owner_alive()
        if owner is not None:
            raise CouldNotRun(
                f"run {m.run_id} is still running (servesweep process {owner}): stop it first "
                f"(kill -TERM {owner}, it then stops its load generator), or wait for it"
            )
        exp_r = (
            m.experiment()
        )  # checked by Manifest.load: a manifest whose experiment is not valid is refused there
        resolve_run_key(exp_r, m.experiment_file)  # fail before the preflight
        entries = m.points_typed()
        left = [p for p in entries.values() if p.status not in mf.FINISHED]
        preflight_results_dir(
            m.run_dir,
            sum(point_bytes(point_requests(exp_r, p.concurrency, m.dry_run), p.output_tokens) for p in left)
            + MANIFEST_RESERVE_BYTES,
        )
        m.resumed_now()
        done = sum(1 for p in entries.values() if p.status == mf.DONE)
        console.print(f"resuming {m.run_id}: {done} of {len(m.points)} points already done")
    else:
        assert file is not None  # exactly one of FILE and --resume (checked above)
        try:
            exp = load_experiment(file)
        except ExperimentError as e:
            print_error(str(e))
            return COULD_NOT_RUN
        if exp.search is not None and (max_parallel or 1) > 1:
            # The packed scheduler places a configuration's pending points; a search's probes are decided one by
            # one as it goes, so a packed run of a search ran nothing and exited 1 with an empty table (found by the
            # real-SGLang tier, tests/sglang_cpu/test_matrix.py). Refused until packing runs searches.
            print_error(
                f"{file}: search: a capacity search runs one configuration at a time; --max-parallel "
                f"{max_parallel} cannot pack it (run without --max-parallel, or several runs side by side)",
            )
            return COULD_NOT_RUN
        if dry_run:
            exp = shrink_for_dry_run(exp)
            console.print(
                "[bold]dry run[/]: the emulator on this machine, one request per user, short outputs"
            )
        resolve_run_key(exp, file)  # fail before the run folder exists
        preflight_results_dir(Path(out), estimate_run_bytes(exp, dry_run=dry_run) + MANIFEST_RESERVE_BYTES)
        m = create_run(exp, Path(out), experiment_file=file, dry_run=dry_run)
        if max_parallel:
            m.max_parallel = max_parallel
        if not isolation_sample:
            m.isolation_sample = False  # a resume keeps the choice (matrix/packed.py)
    runner = Runner(m, console=console, keep_server=keep_server)
    try:
        rc = runner.run()
    finally:
        runner.close()
    return rc
