"""`servesweep run FILE` and `servesweep run --resume runs/<run_id>`: the whole matrix, headless.

For each server configuration (in the planner's order) the sglang_server role is applied through ansible-runner
(restart, readiness, verification, resolved info), then every load point runs through the load core's `run_point`
(a Locust subprocess: this process never imports Locust or gevent, which would deadlock ansible-runner). A `search:`
block runs its capacity searches instead (matrix/capacity_run.py), a `decide:` block its decision, one server at a
time (matrix/decision_run.py).

Durability: each point is measured into `runs/<run_id>/.tmp-<point_id>/` and renamed to `runs/<run_id>/<point_id>/`
only when complete, so a point folder exists if and only if the point finished; the manifest is rewritten
atomically after every change. Resume trusts both: finished points are never run again, a point interrupted
half-way is thrown away and run again, and nothing finished is lost.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.config.experiment import (
    BUILTIN_WORKLOADS,
    Experiment,
    ExperimentError,
    ServerConfig,
    load_experiment,
)
from servesweep.config.point import LoadPoint
from servesweep.config.secrets import KEY_ENV, drop_key, hold_key
from servesweep.exit_codes import BREACH, COULD_NOT_RUN, FAILED_REQUESTS, PASS, CouldNotRun, UsageError
from servesweep.matrix.answer_probes import needle_into_summary, probe_configuration
from servesweep.matrix.planner import ConfigPlan, Plan, PointPlan, make_plan, plan_json
from servesweep.net import free_port
from servesweep.processes import OwnedProcesses
from servesweep.results import manifest as mf
from servesweep.results.degeneration import degeneration_warning
from servesweep.results.degraded import degradation
from servesweep.results.pergpu import flags_gpus, manifest_gpus, per_gpu
from servesweep.results.point_summary import SUMMARY, PointSummary, Stats
from servesweep.results.store import new_run
from servesweep.target import http

if TYPE_CHECKING:  # at run time imported where used: a run that does not need one does not load it
    from servesweep.driver.ansible import PlaybookResult
    from servesweep.driver.point_progress import PointWatch
    from servesweep.matrix.packed import PlacementRecord
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
POINT_OVERHEAD_BYTES = 256 * 1024  # summary, Locust CSVs and log, per point
CONFIG_OVERHEAD_BYTES = 4 * 1024 * 1024  # server log and Ansible artifacts, per configuration start
MANIFEST_RESERVE_BYTES = 1024 * 1024  # the manifest is rewritten after every change: always leave room for it


def point_bytes(requests: int, output_tokens: int) -> int:
    """A generous estimate of one point's files: a records row is ~0.5 KiB plus 16 bytes per streamed chunk."""
    return POINT_OVERHEAD_BYTES + requests * (512 + 16 * output_tokens)


def _point_requests(exp: Experiment, concurrency: int, dry_run: bool) -> int:
    if dry_run:
        return concurrency
    if exp.load.requests:
        return exp.load.requests
    # a duration point: assume at most 20 requests per user per second (short outputs on a fast server)
    return int(concurrency * 20 * ((exp.load.duration_s or 60) + exp.load.warmup_s))


def estimate_run_bytes(exp: Experiment, *, dry_run: bool = False) -> int:
    plan = make_plan(exp)
    total = 0
    for cp in plan.configs:
        if cp.error:
            continue
        total += CONFIG_OVERHEAD_BYTES
        for pp in cp.points:
            if pp.feasible:
                s = pp.point
                total += point_bytes(_point_requests(exp, s.concurrency, dry_run), s.output_tokens)
    return total


def preflight_results_dir(folder: Path, need_bytes: int) -> None:
    """Before any server starts: the results folder must exist or be creatable, take a file (written, synced and
    removed) and have room for the estimate. Raises CouldNotRun (exit 2) naming the folder and what is wrong."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CouldNotRun(f"results folder {folder}: cannot create it ({e.strerror})") from None
    probe = folder / f".servesweep-write-test-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise CouldNotRun(
            f"results folder {folder} is not writable ({e.strerror}); choose another with --out"
        ) from None
    finally:
        probe.unlink(missing_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise CouldNotRun(
            f"results folder {folder}: {_mib(free)} free, the run needs about {_mib(need_bytes)} "
            "(records, summaries, logs); free some space or choose another folder with --out"
        )


def _err(text: str, style: str | None = None) -> None:
    """One message on stderr, as written (no markup read, never wrapped); `style` colours it on a terminal."""
    if style and sys.stderr.isatty():
        from rich.console import Console

        Console(stderr=True).print(
            text, style=style, markup=False, highlight=False, emoji=False, soft_wrap=True
        )
    else:
        print(text, file=sys.stderr, flush=True)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def resolve_run_key(exp: Experiment, experiment_file: str | None = None) -> str | None:
    """The run's API key from the one source the experiment names (env, 0600 file, Ansible Vault), read before any
    server starts; relative paths are relative to the experiment file. CouldNotRun names the key and the file."""
    from servesweep.config.secrets import SecretError, resolve_api_key

    L = exp.launcher

    def where(p: str | None) -> str | None:
        return _relative_to(experiment_file, p) if p else p

    try:
        return resolve_api_key(
            env=L.api_key_env,
            file=where(L.api_key_file),
            vault=where(L.api_key_vault),
            vault_password_file=where(L.vault_password_file),
        )
    except SecretError as e:
        hint = (
            " (export it, e.g. from a file or a secret store, before the run; the key itself never goes in the "
            "experiment)"
            if L.api_key_env
            else ""
        )
        raise CouldNotRun(f"{e}{hint}") from None


def _relative_to(experiment_file: str | None, path: str) -> str:
    """A path of the experiment file (~ expanded; relative ones are relative to the file's folder)."""
    p = Path(path).expanduser()
    if not p.is_absolute() and experiment_file:
        p = Path(experiment_file).resolve().parent / p
    return str(p)


def _is_disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _DISK_ERRNOS


DRY_RUN_OUTPUT_TOKENS = 8
DRY_RUN_SPEEDUP = 20
# a dry run keeps 4 loads per sweep (for its knee) while it has at most this many points, and then outputs of up to
# DRY_RUN_KNEE_OUTPUT_TOKENS: with 8, one request per user is mostly its prefill, and a prefill-bound sweep's
# throughput is flat from its first load (no knee to see); decode steps cost little at DRY_RUN_SPEEDUP
DRY_RUN_MAX_POINTS = 48
DRY_RUN_KNEE_OUTPUT_TOKENS = 128


def shrink_for_dry_run(exp: Experiment) -> Experiment:
    """The same matrix on the emulator on this machine, shrunk so the whole pipeline runs in minutes: same server
    configurations (and GPU profile) and feasibility, but only the smallest and largest prompt and output lengths,
    4 loads where the load axis has 4 or more (concurrencies or rates: the ends and two spread between them, what a
    saturation knee needs) unless that makes more than DRY_RUN_MAX_POINTS points (then the ends), one request per
    user, short outputs (8 tokens; 128 with 4 loads), 2-turn agent sessions and an emulator running faster than
    real time. Proves Ansible restarts, verification, every point and the results (a verdict per point, a knee per
    configuration) before GPU time is booked."""
    if exp.launcher.generic:
        raise CouldNotRun(
            "--dry-run runs the matrix on the emulator, which takes SGLang's flags; launcher.command (a generic "
            "server) has flags of its own: try the matrix on a small model with the real server instead"
        )
    d = exp.model_dump(mode="json")
    d["name"] = f"{exp.name}-dryrun"[:64]
    d["target"] = {"inventory": "local", "host_group": exp.target.host_group, "port": 0}
    launcher = d["launcher"]
    launcher.update(
        kind="process", emulator=True, python=None, become=False, startup_timeout_s=300, stop_timeout_s=30
    )
    sim = dict(launcher.get("sim_args") or {})
    sim.setdefault("sim_load_time", 0.3)
    sim.setdefault("sim_calibration", f"speedup={DRY_RUN_SPEEDUP}")
    launcher["sim_args"] = sim
    load = d["load"]
    # the ends of each length axis prove what the middle would: the longest prompt, the shortest. The load axis
    # keeps its ends and two values between them: a configuration's sweep needs 4 loads for its saturation knee
    # (results/diagnosis.py KNEE_MIN_POINTS), which the dry run's report shows. Values among the points that would
    # run (feasible, not excluded): a 100k prompt no configuration can take would leave the longest runnable one
    # unproven.
    from servesweep.results.diagnosis import KNEE_MIN_POINTS

    ld = exp.load
    plan = make_plan(exp)
    runs = [pp.point for cp in plan.configs if cp.error is None for pp in cp.points if pp.feasible]
    for axis in ("prompt_tokens", "output_tokens"):
        load[axis] = _ends([getattr(s, axis) for s in runs] or getattr(ld, axis))
    conc = [s.concurrency for s in runs] or ld.concurrency
    rates = ([s.rate_rps for s in runs if s.rate_rps is not None] or ld.rate) if ld.rate else []
    load["concurrency"], load["rate"] = _spread(conc), _spread(rates) if rates else None
    kept = [
        s
        for s in runs
        if s.prompt_tokens in load["prompt_tokens"]
        and s.output_tokens in load["output_tokens"]
        and s.concurrency in load["concurrency"]
        and (s.rate_rps is None or s.rate_rps in load["rate"])
    ]
    # a large matrix: the ends of the load axis too, so its time stays minutes
    if len(kept) > DRY_RUN_MAX_POINTS:
        load["concurrency"], load["rate"] = _ends(conc), _ends(rates) if rates else None
    sweeps = len(load["concurrency"]) >= KNEE_MIN_POINTS or len(load["rate"] or []) >= KNEE_MIN_POINTS
    out_max = DRY_RUN_KNEE_OUTPUT_TOKENS if sweeps else DRY_RUN_OUTPUT_TOKENS
    load["worker_hosts"] = None  # a dry run is this machine only
    load["output_tokens"] = sorted({min(o, out_max) for o in load["output_tokens"]})
    # an agent session is many requests per user: two short turns still prove the multi-turn path
    for name, w in (load.get("workloads") or {}).items():
        if w.get("workload") == "agent" or (name == "agent" and not w.get("workload")):
            w["session_turns"] = min(w.get("session_turns") or 2, 2)
            w["think_time_s"] = 0.0
    load.update(
        requests=1, duration_s=None, warmup_s=0.0, workers=0
    )  # 1 = one request per user, see _run_point
    d["budget"] = {"wall_time_s": None}
    ours = sim["sim_calibration"] == f"speedup={DRY_RUN_SPEEDUP}"
    if exp.search is not None:  # the tiers scaled to the emulator's speed-up, the bounds and budget shrunk
        d["search"] = exp.search.dry_run(DRY_RUN_SPEEDUP if ours else 1)
    if exp.decide is not None:  # likewise the decision's tiers; its probes shortened
        d["decide"] = exp.decide.dry_run(DRY_RUN_SPEEDUP if ours else 1)
    return Experiment.model_validate(d)


def _ends(values: list) -> list:
    return sorted({min(values), max(values)})


def _spread(values: list) -> list:
    """A dry run's loads: KNEE_MIN_POINTS of the (positive) values, the smallest, the largest and those nearest to
    evenly spaced points between them on a log scale (of 1, 2, 4, ..., 64, 100: 1, 4, 16, 100); an axis of fewer
    values cannot show a knee, its ends only."""
    import math

    from servesweep.results.diagnosis import KNEE_MIN_POINTS

    vs = sorted(set(values))
    if len(vs) <= KNEE_MIN_POINTS:
        return vs if len(vs) == KNEE_MIN_POINTS else _ends(vs)
    lo, hi = math.log(vs[0]), math.log(vs[-1])
    picked = [vs[0], vs[-1]]
    for k in range(1, KNEE_MIN_POINTS - 1):
        at = lo + (hi - lo) * k / (KNEE_MIN_POINTS - 1)
        picked.append(min((v for v in vs if v not in picked), key=lambda v: abs(math.log(v) - at)))
    return sorted(picked)


def workload_cell(p: mf.PointEntry) -> str:
    """The results table's workload: `synthetic` for the built-in single-shot prompts (the word `servesweep load
    --workload` and the records use; the point ids keep the endpoint), a named workload by its name, and the
    endpoint after a slash when it is not chat."""
    name = "synthetic" if p.workload in BUILTIN_WORKLOADS else p.workload
    return name if p.endpoint == "chat" else f"{name}/{p.endpoint}"


def create_run(
    exp: Experiment, out: Path, *, experiment_file: str | None = None, dry_run: bool = False
) -> mf.Manifest:
    """Plan the experiment and write the run folder with its first manifest (every point pending or infeasible)."""
    plan = make_plan(exp)
    out = out.resolve()  # absolute: load generators name it on their command line (found again on resume)
    _, run_dir = new_run(out, exp.name)
    port = exp.target.port if exp.target.port else free_port()
    configs: dict[str, mf.ConfigEntry] = {}
    points: dict[str, mf.PointEntry] = {}
    for order, cp in enumerate(plan.configs):
        configs[cp.config.id] = _config_entry(cp, order)
        # every point says how many GPUs its server holds (results/pergpu.py; packed runs' `gpus` label is the
        # devices): the exporter, report and compare read it
        gpu_count = str(flags_gpus(cp.config.flags, exp.launcher.gpus))
        for pp in cp.points:
            point = pp.point.replaced(
                base_url=exp.target.url(port),
                labels={"run_id": run_dir.name, **pp.point.labels, "gpu_count": gpu_count},
                # a dry run sends one request per user: every user, every point, no more
                **({"requests": pp.point.concurrency} if dry_run else {}),
            )
            points[pp.id] = _point_entry(cp, pp, point)
    data = mf.ManifestFile(
        schema_version=mf.SCHEMA_VERSION,
        run_id=run_dir.name,
        created=mf.now_iso(),
        updated=mf.now_iso(),
        status="created",
        experiment_file=str(Path(experiment_file).resolve()) if experiment_file else None,
        dry_run=dry_run,
        experiment=exp,
        experiment_digest=exp.digest(),
        port=port,
        plan={k: v for k, v in plan_json(plan).items() if k != "configs"},
        versions=mf.versions(),
        git_rev=mf.git_revision(),
        controller=mf.controller_facts(),
        hosts={},
        configs=configs,
        points=points,
        events=[],
    ).as_data()
    if exp.search is not None:
        from servesweep.matrix.capacity_run import move_points_to_searches

        move_points_to_searches(exp, data, plan)
    if exp.decide is not None:  # the points become the decision's probe templates (matrix/decision_run.py)
        from servesweep.matrix.decision_run import move_points_to_decision

        move_points_to_decision(data)
    m = mf.Manifest(run_dir, data)
    m.save()
    return m


def _config_entry(cp: ConfigPlan, order: int) -> mf.ConfigEntry:
    """A server configuration as the manifest starts it: planned, pending (or infeasible, with why)."""
    return mf.ConfigEntry(
        order=order,
        flags=cp.config.flags,
        env=cp.config.env,
        bundle=cp.config.bundle,
        labels={k: str(v) for k, v in cp.config.labels.items()},
        status="infeasible" if cp.error else "pending",
        error=cp.error,
        planned={"facts": cp.facts, "warnings": cp.warnings, "est_s": round(cp.est_s, 1)},
        server=None,
        attempts=0,
    )


def _point_entry(cp: ConfigPlan, pp: PointPlan, point: LoadPoint) -> mf.PointEntry:
    """A load point as the manifest starts it: the serialized LoadPoint (what run_point gets back on resume), its
    axes, and pending or infeasible with the reason (a closed-loop point's entry has no `rate`)."""
    feasible = pp.feasible and cp.error is None
    return mf.PointEntry(
        point=point.model_dump(mode="json"),
        config_id=cp.config.id,
        workload=pp.workload,
        endpoint=point.endpoint,
        concurrency=point.concurrency,
        prompt_tokens=point.prompt_tokens,
        output_tokens=point.output_tokens,
        **({"rate": point.rate_rps} if point.rate_rps is not None else {}),
        status=mf.PENDING if feasible else mf.INFEASIBLE,
        reason=None if feasible else "; ".join(pp.reasons or [f"server configuration: {cp.error}"]),
        warnings=pp.warnings,
        est_s=round(pp.est_s, 2),
        attempts=0,
        dir=None,
    )


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
    key_env: str | None  # the variable each Locust child gets the run's key under (driver.point_run.run_point)
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
        return wh.model_dump() | {"inventory": _relative_to(self.m.experiment_file, wh.inventory)}

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
        self.m.update_config(cid, attempts=self.m.config(cid).attempts + 1, status="starting", started=mf.now_iso())
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
                        self.m.update_point(other, status=mf.SERVER_FAILED, reason=f"server crashed during {pid}")
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
        self.m.update_config(cid, status="ready", server=server, error=None, ready_after_s=round(res.duration_s, 1))
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
        need = point_bytes(_point_requests(self.exp, point.concurrency, dry), point.output_tokens)
        free = shutil.disk_usage(self.run_dir).free
        if free < need + MANIFEST_RESERVE_BYTES:
            raise DiskTrouble(
                f"the results folder {self.run_dir} has {_mib(free)} free, point {pid} needs about "
                f"{_mib(need + MANIFEST_RESERVE_BYTES)}"
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
        if _is_disk_error(e) or shutil.disk_usage(self.run_dir).free < MANIFEST_RESERVE_BYTES:
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
            f"  {mark} {pid}: {s.output_tokens_per_s or 0:.1f} tok/s, TTFT p50 {_ms(_p(s.ttft_ms, 'p50'))}, "
            f"ITL/chunk p50 {_ms(_p(s.itl_ms, 'p50'))}, ITL/token p50 {_ms(_p(s.itl_per_token_ms, 'p50'))}, "
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
        within _HEALTH_TIMEOUT_S: its process is up), it died (no connection), or it answered another status.
        Bounded: 3 tries of at most _HEALTH_TIMEOUT_S, 1 + 2 s apart; the load has stopped when this runs, so a
        live server answers at once."""
        health_path = self.exp.launcher.health_path
        assert health_path is not None  # filled with its default by Launcher._server_kind_defaults
        url = self.base_url() + health_path
        try:
            code = http.retrying(
                "health", lambda: http.status("GET", url, timeout=_HEALTH_TIMEOUT_S), _HEALTH_RETRY
            )
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
        if exp.decide is not None:  # a decision probes one server at a time (docs/decision.md)
            self.packed = False

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
            if self.packed:
                from servesweep.matrix.packed import PackedRun, packing_of

                PackedRun(self, packing_of(self, self.m.max_parallel), Interrupted, Lane).run()
            elif self.exp.decide is not None:
                from servesweep.matrix.decision_run import run_decision_phase

                run_decision_phase(self)
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
            _err(msg)
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
            if not _is_disk_error(e):
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
            _err(
                f"exit {COULD_NOT_RUN}: {len(not_done)} point(s) not measured ({_first_ids(not_done)}; their "
                "status and reason in manifest.json)",
            )
            return COULD_NOT_RUN
        done = self.summaries()
        degraded = [pid for pid, s in done.items() if s.degraded]
        if degraded:  # measured, but not at the asked load: not what was asked (servesweep.exit_codes)
            from servesweep.results.degraded import exit_line

            _err(exit_line(COULD_NOT_RUN, degraded))
            return COULD_NOT_RUN
        if self.exp.search is not None:
            from servesweep.matrix.capacity_run import unfinished

            if unfinished(self.m.data):
                _err(f"exit {COULD_NOT_RUN}: the capacity search did not finish")
                return COULD_NOT_RUN
        if self.exp.decide is not None:
            from servesweep.matrix.decision_run import unfinished as decision_unfinished

            if why := decision_unfinished(self.m.data):
                _err(f"exit {COULD_NOT_RUN}: {why}")
                return COULD_NOT_RUN
        # a capacity probe's failures are the search's evidence (its SLOs judge them, error_rate included): a probe
        # past the capacity may fail requests by design, and the search says what it found; a decision's probe
        # likewise (its tiers judge it)
        measured = {
            pid: s
            for pid, s in done.items()
            if entries[pid].search is None and entries[pid].decide is None
        }
        checks = [s.failure_check for s in measured.values()]
        # Any failed request is said, even within load.max_failure_rate: a green CI job should not hide a few 500s
        for fc in checks:
            if fc.passed and fc.warning:
                _err(f"WARNING: {fc.warning}", style="bold yellow")
        over = [str(fc.message) for fc in checks if not fc.passed]
        for msg in over:
            _err(f"failed: {msg}")
        if over:
            _err(
                f"exit 3: {len(over)} point(s) failed the failure check (load.max_failure_rate "
                f"{self.exp.load.max_failure_rate:.1%}; 1.0 allows any share short of no success at all)",
            )
        if over:
            return FAILED_REQUESTS
        # the experiment's slo: at each measured point (a capacity probe's SLOs are the search's to judge)
        breached = [pid for pid, s in measured.items() if s.slos and not all(c.passed for c in s.slos)]
        if breached:
            _err(
                f"exit {BREACH}: an SLO of the experiment breached at {len(breached)} point(s): "
                f"{_first_ids(breached)} (servesweep gate RUN --details)",
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
            _err(f"could not save the manifest: {save_error}")
        _err(
            f"servesweep stopped on an unexpected error ({what}); finished points are kept; resume with  "
            f"servesweep run --resume {self.run_dir}",
        )
        try:
            self._stop_server_quietly()
        except Exception as stop_error:  # noqa: BLE001
            _err(f"could not stop the server: {stop_error}")

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
            r = _table_figures(s)
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
                _num(per_gpu(r.get("output_tokens_per_s"), g), 1),
                _num(per_gpu(r.get("request_rate"), g), 3),
                _ms(r.get("ttft_p50_ms")),
                _ms(r.get("ttft_p99_ms")),
                _ms(r.get("itl_p50_ms")),
                _ms(r.get("itl_p99_ms")),
                _ms(r.get("itl_per_token_p50_ms")),
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
                point = {**p.point, "base_url": self.base_url(), "labels": {**p.point.get("labels", {}), **labels}}
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


def _aside(run_dir: Path, pid: str, attempt: int) -> Path:
    """Where a crashed attempt's records and the server log go: one level deeper than point folders, so nothing
    that globs `<run>/*/summary.json` (resume, reports, the exporter) takes them for a finished point."""
    d = run_dir / "crashed" / f"{pid}.{attempt}"
    d.parent.mkdir(exist_ok=True)
    return d


def _p(stats: Stats | None, which: str) -> float | None:
    """A percentile of a summary's Stats (None: the point has no such values)."""
    return None if stats is None else getattr(stats, which)


def _table_figures(s: PointSummary | None) -> dict[str, Any]:
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


def _num(v: float | None, decimals: int) -> str:
    return "-" if v is None else f"{v:,.{decimals}f}"


def _first_ids(ids: list[str], n: int = 5) -> str:
    """The first `n` point ids of an exit line, ', ...' when there are more."""
    return ", ".join(ids[:n]) + (", ..." if len(ids) > n else "")


def _ms(v) -> str:
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
_HEALTH_TIMEOUT_S = 10.0  # per try: after a point the load has stopped; a hung server is known within 33 s
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
            sum(point_bytes(_point_requests(exp_r, p.concurrency, m.dry_run), p.output_tokens) for p in left)
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
            _err(str(e))
            return COULD_NOT_RUN
        if exp.search is not None and (max_parallel or 1) > 1:
            # The packed scheduler places a configuration's pending points; a search's probes are decided one by
            # one as it goes, so a packed run of a search ran nothing and exited 1 with an empty table (found by the
            # real-SGLang tier, tests/sglang_cpu/test_matrix.py). Refused until packing runs searches.
            _err(
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
