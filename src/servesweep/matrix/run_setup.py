"""A run before it runs: its folder and first manifest (`create_run`: every point planned, pending or infeasible),
the disk room it needs (`estimate_run_bytes`, `preflight_results_dir`), the key that resumes it, and the dry run's
shrinking of an experiment to the fast emulator (`shrink_for_dry_run`). matrix/orchestrator.py runs what this makes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from servesweep.config.experiment import (
    BUILTIN_WORKLOADS,
    Experiment,
)
from servesweep.config.point import LoadPoint
from servesweep.exit_codes import CouldNotRun
from servesweep.matrix.planner import ConfigPlan, PointPlan, make_plan, plan_json
from servesweep.net import free_port
from servesweep.results import manifest as mf
from servesweep.results.pergpu import flags_gpus
from servesweep.results.store import new_run

if TYPE_CHECKING:  # at run time imported where used: a run that does not need one does not load it
    pass


POINT_OVERHEAD_BYTES = 256 * 1024  # summary, Locust CSVs and log, per point


CONFIG_OVERHEAD_BYTES = 4 * 1024 * 1024  # server log and Ansible artifacts, per configuration start


MANIFEST_RESERVE_BYTES = 1024 * 1024  # the manifest is rewritten after every change: always leave room for it


def point_bytes(requests: int, output_tokens: int) -> int:
    """A generous estimate of one point's files: a records row is ~0.5 KiB plus 16 bytes per streamed chunk."""
    return POINT_OVERHEAD_BYTES + requests * (512 + 16 * output_tokens)


def point_requests(exp: Experiment, concurrency: int, dry_run: bool) -> int:
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
                total += point_bytes(point_requests(exp, s.concurrency, dry_run), s.output_tokens)
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
            f"results folder {folder}: {mib(free)} free, the run needs about {mib(need_bytes)} "
            "(records, summaries, logs); free some space or choose another folder with --out"
        )


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def resolve_run_key(exp: Experiment, experiment_file: str | None = None) -> str | None:
    """The run's API key from the one source the experiment names (env, 0600 file, Ansible Vault), read before any
    server starts; relative paths are relative to the experiment file. CouldNotRun names the key and the file."""
    from servesweep.config.secrets import SecretError, resolve_api_key

    L = exp.launcher

    def where(p: str | None) -> str | None:
        return relative_to(experiment_file, p) if p else p

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


def relative_to(experiment_file: str | None, path: str) -> str:
    """A path of the experiment file (~ expanded; relative ones are relative to the file's folder)."""
    p = Path(path).expanduser()
    if not p.is_absolute() and experiment_file:
        p = Path(experiment_file).resolve().parent / p
    return str(p)


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
