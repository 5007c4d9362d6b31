"""`servesweep load`: one load point or a sweep (concurrency, rate) against a running server or the built-in
emulator, each point through `driver.point.run_point`, with a table at the end."""

import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from servesweep.config.point import (
    DEFAULT_MAX_FAILURE_RATE,
    Knob,
    LoadPoint,
    check_arrival,
    knobs,
)
from servesweep.driver.point import STOP_SIGNALS, Interrupted, read_json, run_point
from servesweep.exit_codes import BREACH, COULD_NOT_RUN, FAILED_REQUESTS, CouldNotRun
from servesweep.results.degraded import exit_line
from servesweep.results.table import results_table, table_notes
from servesweep.target.probes import ProbeLog, resolve_point

# the variable the key is read from when neither --api-key-env nor --api-key-file is given (when it is set)
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_SIM_MODEL = "Qwen/Qwen3.6-27B"
DEFAULT_SIM_ARGS = f"--model-path {DEFAULT_SIM_MODEL} --enable-cache-report"


# ---------------------------------------------------------------- `servesweep load`


def parse_concurrency(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise click.BadParameter(
                f"{part!r} in {text!r} is not a positive integer", param_hint="--concurrency"
            )
        out.append(int(part))
    return out


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            v = float("nan")
        if not (v > 0 and math.isfinite(v)):
            raise click.BadParameter(
                f"{part.strip()!r} in {text!r} is not a positive number of requests per second",
                param_hint="--rate",
            )
        out.append(v)
    return out


def _knob_option(k: Knob) -> Callable:
    """The click option of one knob of the table (config.point.knobs): its CLI name, help, group and default."""
    default = k.option_default("cli")
    help = f"[{k.group}] {k.help}"
    if k.kind == "flag":
        return click.option(k.cli, k.dest, is_flag=True, help=help)
    if k.kind == "switch":
        return click.option(k.cli, k.dest, type=click.Choice(["on", "off"]), default=None, help=help)
    types = {"choice": click.Choice(list(k.choices)), "int": int, "float": float}
    return click.option(
        k.cli,
        k.dest,
        type=types.get(k.kind, str),
        default=default,
        show_default=default is not None,
        help=help,
    )


# `servesweep load`'s options that are not one point's knobs: the sweep axes (lists of the knob's values, checked
# against the table by tests/config/test_point_options.py) and the run's own settings.
SWEEP_AXES = {"--concurrency": "concurrency", "--rate": "rate_rps"}
_AXIS_OPTIONS = [
    click.option(
        "--concurrency", "concurrency_text", default="8", show_default=True, help="N or a sweep: 1,2,4,8"
    ),
    click.option("--rate", "rate_text", default=None, help="open loop: requests/s, or a sweep: 1,2,4"),
]
_RUN_OPTIONS = [
    click.option(
        "--api-key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="file holding the API key (mode 0600); it reaches Locust through its environment only",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Locust worker processes per point on this machine (0: one process)",
    ),
    click.option(
        "--worker-inventory",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="run the workers on the hosts of this Ansible inventory (the locust_worker role, over SSH)",
    ),
    click.option(
        "--worker-group", default="loadgen", show_default=True, help="inventory group of worker hosts"
    ),
    click.option("--workers-per-host", type=click.IntRange(min=1), default=1, show_default=True),
    click.option("--master-host", default=None, help="address of this machine the worker hosts connect to"),
    click.option("--master-port", type=click.IntRange(1, 65535), default=5557, show_default=True),
    click.option(
        "--slo", default=None, help="e.g. 'ttft_p99<=2s,itl_p99<=50ms' or per request 'ttft<=2s' (goodput)"
    ),
    click.option(
        "--max-failure-rate",
        default=f"{DEFAULT_MAX_FAILURE_RATE:.0%}",
        show_default=True,
        help="exit 3 when a point's failed share of measured requests is above this (0.05 or 5%; 100%: "
        "off); a point with 0 successes always does; any failure below it is a warning on stderr",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(min=0),
        default=0,
        help="serve the run's live client metrics on this port of 127.0.0.1 for the whole run (0: a free port "
        "when an observe stack is set up, else none); registered in the stack either way",
    ),
    click.option(
        "--sim-args",
        default=DEFAULT_SIM_ARGS,
        show_default=True,
        help="emulator flags when --base-url is omitted (a --model-path is added when missing)",
    ),
    click.option(
        "--out",
        "out_root",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("runs"),
        show_default=True,
    ),
    click.option("--json", "as_json", is_flag=True, help="print the summaries as JSON instead of the table"),
    click.option(
        "--resume",
        "resume_dir",
        type=click.Path(file_okay=False, exists=True, path_type=Path),
        default=None,
        help="finish a stopped `servesweep load` run in its own folder: the points it did not measure, with the "
        "options it was started with (its manifest's argv; give no other option)",
    ),
]


def _options(f: Callable) -> Callable:
    """--base-url, the sweep axes, every knob of the table but the swept ones, then the run's own options."""
    opts = [
        click.option(
            "--base-url", default=None, help="server root (http://HOST:PORT); omitted: start the emulator"
        ),
        *_AXIS_OPTIONS,
        *(_knob_option(k) for k in knobs("cli") if k.cli not in SWEEP_AXES),
        *_RUN_OPTIONS,
    ]
    for opt in reversed(opts):  # click lists options in the order of the decorators, the last applied first
        f = opt(f)
    return f


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@_options
def command(**opts):
    """Run one load point or a sweep (concurrency and/or open-loop rate; one Locust run per point) and print the
    results table. Exit codes: docs/reports.md, "Exit codes"."""
    old_handlers = {}

    def on_signal(signum, frame):
        for sig in STOP_SIGNALS:  # once: a second signal must not break the stop that the first one began
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    if opts["resume_dir"] is not None:
        opts = _resumed_options(opts["resume_dir"])
    run = _check_options(opts)
    for sig in STOP_SIGNALS:
        old_handlers[sig] = signal.signal(sig, on_signal)
    state: dict = {}
    try:
        _load(state, run)
    except Interrupted as e:
        _interrupted(state, e)
    finally:
        for sig, h in old_handlers.items():
            signal.signal(sig, h)


def _resumed_options(run_dir: Path) -> dict[str, Any]:
    """`--resume RUN`: the options RUN was started with, parsed again from its manifest's argv (so its points are
    the same points); any other option on this command line is a usage error, since it would change them."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [
        f"--{p.name.replace('_', '-')}"
        for p in ctx.command.params
        if p.name not in (None, "resume_dir")
        and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"--resume takes no other option (the run's own are in its manifest.json): got {', '.join(given)}"
        )
    manifest = read_json(run_dir / "manifest.json")
    if (
        not isinstance(manifest, dict)
        or manifest.get("kind") != "load"
        or not isinstance(manifest.get("argv"), list)
    ):
        raise click.BadParameter(
            f"{run_dir}: not a servesweep load run folder (no manifest.json of kind 'load' with its argv); "
            "a servesweep run folder resumes with servesweep run --resume",
            param_hint="--resume",
        )
    argv = [str(a) for a in manifest["argv"]]
    args = argv[1:] if argv[:1] == ["load"] else argv
    try:
        with command.make_context("load", args, parent=ctx.parent) as sub:
            opts = dict(sub.params)
    except click.ClickException as e:
        raise click.BadParameter(
            f"{run_dir}: its argv no longer parses: {e.format_message()}", param_hint="--resume"
        ) from None
    opts["resume_dir"] = run_dir
    return opts


def _resume_state(
    run_dir: Path, points: list[LoadPoint]
) -> tuple[dict[str, Any], list[dict], list[LoadPoint]]:
    """A stopped run's manifest made ready to go on: the points it finished (with their summaries) stay, an
    interrupted point's folder moves aside to `<point>.interrupted[-n]` (its partial records kept, listed under
    `interruptions`), and what is left to measure, in the sweep's order."""
    manifest = read_json(run_dir / "manifest.json")
    finished = [e for e in manifest["points"] if e.get("status") != "interrupted"]
    summaries = {e["point_id"]: read_json(run_dir / e["dir"] / "summary.json") for e in finished}
    finished = [
        e for e in finished if summaries[e["point_id"]] is not None
    ]  # a folder removed since: measure it
    moved = []
    for e in manifest["points"]:
        if e.get("status") == "interrupted" and (run_dir / e["dir"]).is_dir():
            aside, n = run_dir / f"{e['dir']}.interrupted", 1
            while aside.exists():
                n += 1
                aside = run_dir / f"{e['dir']}.interrupted-{n}"
            (run_dir / e["dir"]).rename(aside)
            moved.append({**e, "dir": aside.name})
    if "interrupted" in manifest or moved:
        manifest.setdefault("interruptions", []).append({**manifest.pop("interrupted", {}), "points": moved})
    manifest.pop("status", None)
    manifest.pop("finished_unix", None)
    manifest["points"] = finished
    manifest.setdefault("resumed", []).append({"unix": time.time(), "argv": sys.argv[1:]})
    done = {e["point_id"] for e in finished}
    kept = [summaries[p.id] for p in points if p.id in done]
    return manifest, kept, [p for p in points if p.id not in done]


def parse_rate_limit(text: str | None, what: str) -> float | None:
    """'5%' or '0.05' as a fraction in [0, 1]; None stays None."""
    if text is None:
        return None
    t = str(text).strip()
    if not t:
        raise click.BadParameter("empty: give a share like 0.05 or 5% (100%: no check)", param_hint=what)
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 1:
        raise click.BadParameter(f"{text!r} is not a share between 0 and 1 (or 0% and 100%)", param_hint=what)
    return v


def _interrupted(state: dict, e: Interrupted) -> None:
    """A signal stopped `servesweep load`: Locust is stopped already (run_point); keep what finished, list the
    partial records of the point it interrupted, say so, exit 128 + signum."""
    from servesweep.results.store import write_manifest

    err = sys.stderr  # (click.get_text_stream is deprecated since Click 8.5 and goes in 9.0)
    name = signal.Signals(e.signum).name
    run_dir, manifest, current = state.get("run_dir"), state.get("manifest"), state.get("current")
    lines = [f"servesweep load: stopped by {name}; the load generator is stopped"]
    if run_dir is not None and manifest is not None:
        manifest["status"] = "interrupted"
        manifest["interrupted"] = {"signal": name, "unix": time.time(), "point": current}
        done = [p["point_id"] for p in manifest["points"]]
        if current is not None:
            info = read_json(run_dir / current / "interrupted.json")
            if info is not None:
                manifest["points"].append(
                    {"point_id": current, "dir": current, "status": "interrupted", "partial": info}
                )
                if info.get("records"):
                    lines.append(
                        f"point {current} was interrupted: {info.get('rows')} finished requests in "
                        f"{run_dir / current / info['records']} (partial; see interrupted.json)"
                    )
        try:
            write_manifest(run_dir, manifest)
        except OSError:
            pass
        lines.append(f"finished points kept in {run_dir}: {', '.join(done) or 'none'}")
        left = [pid for pid in state.get("all_points", []) if pid not in done]
        if left:
            lines.append(
                f"not measured: {', '.join(left)} (measure them with: servesweep load --resume {run_dir})"
            )
    for line in lines:
        print(line, file=err, flush=True)
    sys.exit(128 + e.signum)


@dataclass
class _Run:
    """`servesweep load`'s checked input: the knobs' values (LoadPoint fields) and the sweep and run settings."""

    fields: dict[str, Any]
    levels: list[int]
    rates: list[float | None]
    base_url: str | None
    api_key: str | None
    worker_hosts: dict | None
    opts: dict[str, Any]  # the run-level options as click gave them
    max_rate: float | None  # --max-failure-rate; None: no limit


def _check_options(opts: dict[str, Any]) -> _Run:
    """Every option checked before anything starts: a bad one is a usage error (exit 2) that names it."""
    from servesweep.config.slo import parse_slos

    fields = {}
    for k in knobs("cli"):
        if k.cli in SWEEP_AXES:
            continue
        try:
            fields[k.name] = k.value(opts.pop(k.dest))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=k.cli) from None
    try:
        parse_slos(opts["slo"])
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None
    try:
        check_arrival(fields["arrival"], opts["rate_text"], rate_name="--rate", arrival_name="--arrival")
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--rate") from None
    rate_text = opts.pop("rate_text")
    workers, requests = opts["workers"], fields["requests"]
    if workers and requests is not None and requests < workers:
        raise click.BadParameter(
            f"--requests {requests} < --workers {workers}: each worker process needs a share of the budget",
            param_hint="--workers",
        )
    return _Run(
        fields=fields,
        levels=parse_concurrency(opts.pop("concurrency_text")),
        rates=[*parse_rates(rate_text)] if rate_text is not None else [None],
        base_url=opts.pop("base_url"),
        api_key=_api_key(opts.pop("api_key_file"), fields),
        worker_hosts=_worker_hosts(opts),
        opts=opts,
        max_rate=parse_rate_limit(opts.pop("max_failure_rate"), "--max-failure-rate"),
    )


def _api_key(api_key_file: Path | None, fields: dict[str, Any]) -> str | None:
    """The key from --api-key-file or the variable --api-key-env names (default OPENAI_API_KEY when set), held in
    this process; the points then name config.secrets.KEY_ENV, under which their Locust processes get it."""
    from servesweep.config.secrets import SecretError, env_key, hold_key, read_key_file

    name = fields["api_key_env"]
    key: str | None
    if api_key_file is not None:
        if name is not None:
            raise click.BadParameter(
                "give --api-key-file or --api-key-env, not both", param_hint="--api-key-file"
            )
        try:
            key = read_key_file(api_key_file)
        except SecretError as e:
            raise click.BadParameter(str(e), param_hint="--api-key-file") from None
    else:
        if name is None and env_key(DEFAULT_KEY_ENV):
            name = DEFAULT_KEY_ENV
        key = env_key(name) if name is not None else None
        if name is not None and not key:
            raise click.BadParameter(f"environment variable {name} is not set", param_hint="--api-key-env")
    fields["api_key_env"] = hold_key(key)
    return key


def _worker_hosts(opts: dict[str, Any]) -> dict | None:
    """--worker-inventory and its settings as run_point's worker_hosts (None: local processes)."""
    inventory, master_host = opts.pop("worker_inventory"), opts.pop("master_host")
    group, per_host, port = opts.pop("worker_group"), opts.pop("workers_per_host"), opts.pop("master_port")
    if inventory is None:
        if master_host:
            raise click.BadParameter("--master-host is for --worker-inventory", param_hint="--master-host")
        return None
    if opts["workers"]:
        raise click.BadParameter("give --workers or --worker-inventory, not both", param_hint="--workers")
    if not master_host:
        raise click.BadParameter(
            "worker hosts need the address they reach this machine at", param_hint="--master-host"
        )
    return {
        "inventory": str(inventory),
        "group": group,
        "per_host": per_host,
        "master_host": master_host,
        "master_port": port,
    }


def _points(run: _Run, base_url: str) -> list[LoadPoint]:
    """One point per (concurrency, rate) of the sweep; without --requests or --duration, a budget per point."""
    from pydantic import ValidationError

    by_field = {k.name: k.cli for k in knobs("cli")}
    points = []
    trace_n = _trace_requests(run) if run.fields["workload"] == "trace" else None
    for c, rate in [(c, r) for c in run.levels for r in run.rates]:
        fields = dict(run.fields)
        if trace_n is not None:
            fields["requests"] = trace_n  # a replay sends its window's requests, each once
        elif fields["requests"] is None and fields["duration_s"] is None:
            # closed loop: two requests per user; open loop: 10 s of arrivals at the rate
            w = run.opts["workers"]
            fields["requests"] = max(8, 2 * c, w) if rate is None else max(8, math.ceil(10 * rate), w)
        pid = f"c{c}" if rate is None else f"c{c}-{fields['arrival']}{rate:g}"
        try:
            points.append(LoadPoint(base_url=base_url, concurrency=c, rate_rps=rate, point_id=pid, **fields))
        except ValidationError as e:
            where = {str(x["loc"][0]) if x["loc"] else "" for x in e.errors()}
            names = ", ".join(by_field.get(w, w) for w in sorted(where))
            raise click.UsageError(f"{names}: {e}") from None
    return points


def _trace_requests(run: _Run) -> int:
    """A trace replay's request count: its window's (read here, so a bad file or an empty window is a usage error
    before anything starts). --requests and --duration do not apply: --trace-window and --trace-sample cut it."""
    from servesweep.workload.build import load_point_trace
    from servesweep.workload.trace.model import TraceError

    f = run.fields
    for name, cli in (("requests", "--requests"), ("duration_s", "--duration")):
        if f[name] is not None:
            raise click.BadParameter(
                "a trace replay sends every request of its window once; cut it with --trace-start, --trace-window "
                "and --trace-sample",
                param_hint=cli,
            )
    try:
        point = LoadPoint(base_url="http://127.0.0.1", concurrency=1, requests=1, probe=False, model="-", **{
            k: v for k, v in f.items() if k not in ("requests", "model", "probe")
        })  # fmt: skip
        n = len(load_point_trace(point).requests)
    except (TraceError, OSError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--trace") from None
    if not n:
        raise click.BadParameter(f"trace {f['trace']}: no request in the window", param_hint="--trace-start")
    return n


def _load(state: dict, run: _Run) -> None:
    """The body of `servesweep load`; `state` tells the signal path how far it got."""
    from contextlib import ExitStack

    from rich.console import Console

    err = Console(stderr=True)
    base_url = run.base_url
    with ExitStack() as stack:
        if base_url is None:
            from servesweep.sim.launch import start_sim

            args = shlex.split(run.opts["sim_args"])
            if not any(a.startswith(("--model-path", "--model")) for a in args):
                args = ["--model-path", DEFAULT_SIM_MODEL, *args]
            sim = stack.enter_context(start_sim(args))
            base_url = sim.base_url
            err.print(
                f"[bold]no --base-url: started the SGLang emulator at {base_url}[/] (servesweep sim {shlex.join(args)})"
            )
        points = _points(run, base_url)
        summaries = _run_points(state, run, points, base_url, err)
    _report(run, summaries, state["run_dir"], err)


def _run_points(state: dict, run: _Run, points: list[LoadPoint], base_url: str, err) -> list[dict]:
    """Probe the server once, then run every point with a progress bar; the run's manifest follows each point."""
    from contextlib import nullcontext

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from servesweep.processes import OwnedProcesses
    from servesweep.results.store import new_run, write_manifest

    resume_dir = run.opts.get("resume_dir")
    kept: list[dict] = []
    if resume_dir is not None:
        resumed, kept, points = _resume_state(resume_dir, points)
        state.update(
            run_dir=resume_dir, manifest=resumed, all_points=[e["point_id"] for e in resumed["points"]]
        )
        state["all_points"] += [p.id for p in points]
        err.print(
            f"resuming {resume_dir}: {len(kept)} point(s) measured before are kept, {len(points)} to measure"
            + (f" ({', '.join(p.id for p in points)})" if points else ""),
            soft_wrap=True,  # one line in a log, the folder whole
        )
        if not points:
            write_manifest(resume_dir, resumed)
            return kept
    # Probe the server once for the whole run; every point reuses what it found.
    probes = ProbeLog()
    try:
        first = resolve_point(points[0], probes)
    except (RuntimeError, ValueError, OSError) as e:
        raise CouldNotRun(f"probing {base_url}: {e}") from None
    for note in probes.notes:
        err.print(f"[yellow]warning: {note}[/]")
    if resume_dir is None:
        run_id, run_dir = new_run(run.opts["out_root"])
        state.update(all_points=[p.id for p in points])
    else:
        run_id, run_dir = resume_dir.name, resume_dir
    owned = OwnedProcesses(run_dir)  # processes.json: the Locust groups this run starts, while they run
    state.update(run_dir=run_dir, run_id=run_id)
    fixed = {k: getattr(first, k) for k in ("model", "template_overhead", "continuous_usage")}
    points = [p.model_copy(update=fixed) for p in points]
    err.print(
        f"model {first.model}; chat template overhead {first.template_overhead} tokens; "
        f"per-chunk usage {'yes' if first.continuous_usage else 'no'}; results in {run_dir}"
    )
    manifest: dict[str, Any] = state.get("manifest") or {
        "run_id": run_id,
        "kind": "load",
        "base_url": base_url,
        "points": [],
        "argv": sys.argv[1:],
        "probe_requests": probes.as_dict(),
    }
    if resume_dir is not None:
        manifest["resumed"][-1].update(base_url=base_url, probe_requests=probes.as_dict())
    write_manifest(run_dir, manifest)
    state["manifest"] = manifest
    summaries = list(kept)
    exporter = _RunExporter.start(run, run_id, base_url, err)
    with (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
            transient=False,
            disable=not err.is_terminal,  # without a terminal: plain lines (driver/live.py)
        ) as prog,
        exporter or nullcontext(),
    ):
        for p in points:
            state["current"] = p.id
            # the run's probes are counted with its first point; their notes go with every point
            pl = probes if p is points[0] else ProbeLog()
            pl.notes = list(probes.notes)
            watch = _point_watch(p, err, exporter)
            if exporter is not None:
                exporter.point_started(p)
            try:
                s = run_point(
                    p,
                    run_dir / p.id,
                    workers=run.opts["workers"],
                    progress=_progress_bar(prog, p, watch),
                    slos=run.opts["slo"],
                    worker_hosts=run.worker_hosts,
                    owned=owned,
                    max_failure_rate=run.max_rate,
                    probes=pl,
                    on_records=watch.records if watch is not None else None,
                )
            except (RuntimeError, ValueError, OSError) as e:
                raise CouldNotRun(f"point {p.id}: {e}") from None
            if watch is not None:
                watch.finished(s)
            if exporter is not None and watch is not None:
                exporter.point_finished(p.id, run_dir / p.id, s, watch)
            summaries.append(s)
            manifest["points"].append(
                {"point_id": p.id, "dir": p.id, "concurrency": p.concurrency, "rate_rps": p.rate_rps}
            )
            write_manifest(run_dir, manifest)
            state["current"] = None
    manifest["finished_unix"] = time.time()
    write_manifest(run_dir, manifest)
    return summaries


class _RunExporter:
    """`servesweep load`'s client metrics, as `servesweep run`'s (matrix/orchestrator.py): one ClientMetrics for the
    run in this process, fed from each point's live record feed (each request once) and set to the point's summary
    at its end, so Live shows the points as they stream and Matrix and History show the run. Served on
    --metrics-port, else on a free port when an observe stack is set up; registered there with the server's
    /metrics for the run's length (observe/targets.py). The Locust processes serve nothing themselves."""

    def __init__(self, metrics, targets, root: Path) -> None:
        self.metrics = metrics  # servesweep.observe.exporter.ClientMetrics
        self.targets = targets  # servesweep.observe.targets.RunTargets
        self.root = root
        self.reads_at_finish: int | None = None  # metrics.reads when the last point's summary was set

    @classmethod
    def start(cls, run: _Run, run_id: str, base_url: str, err) -> "_RunExporter | None":
        from urllib.parse import urlsplit

        from servesweep.observe.exporter import ClientMetrics
        from servesweep.observe.stack import stack_present
        from servesweep.observe.targets import RunTargets, scrape_address

        port, root = run.opts["metrics_port"], run.opts["out_root"]
        if not port and not stack_present(root):
            return None
        metrics = ClientMetrics(run_id)
        try:
            bound = metrics.serve("127.0.0.1", port)
        except OSError as e:
            raise CouldNotRun(f"--metrics-port {port}: cannot serve client metrics ({e.strerror})") from None
        targets = RunTargets(run_id, root)
        targets.exporter(f"127.0.0.1:{bound}")
        # host and port only: a user:password@ in the URL never reaches a target file
        url = urlsplit(base_url)
        targets.server(scrape_address(url.hostname or "", url.port or (443 if url.scheme == "https" else 80)))
        err.print(f"client metrics (Prometheus): http://127.0.0.1:{bound}/metrics", highlight=False)
        return cls(metrics, targets, root)

    def point_started(self, p: LoadPoint) -> None:
        from servesweep.observe.exporter import loadpoint_axes

        self.metrics.point_started(p.id, loadpoint_axes(p))

    def point_finished(self, point_id: str, folder: Path, summary: dict, watch) -> None:
        """The records the live feed did not carry, then the summary as the point's gauges."""
        from servesweep.results.records import read_parquet

        try:
            watch.rest(read_parquet(folder / "records.parquet").to_pylist())
        except (OSError, ValueError):  # the gauges still come from the summary
            pass
        self.metrics.point_finished(point_id, summary)
        self.reads_at_finish = self.metrics.reads

    def __enter__(self) -> "_RunExporter":
        return self

    def __exit__(self, *_exc) -> None:
        """Keep serving until the last point's summary was scraped (bounded), then stop and unregister."""
        from servesweep.observe.targets import last_scrape

        try:
            if self.reads_at_finish is not None:
                last_scrape(self.metrics, self.reads_at_finish, self.root)
        finally:
            self.metrics.stop()
            self.targets.close()


def _point_watch(p: LoadPoint, err, exporter: _RunExporter | None):
    """The point's live view: the feed's records go to the run's exporter; without a terminal, plain progress
    lines on stderr (start, every 30 s, end). None with a terminal and no exporter."""
    if err.is_terminal and exporter is None:
        return None
    from servesweep.driver.live import PointWatch

    what = f"point {p.id} (concurrency {p.concurrency}" + (f", {p.rate_rps:g}/s)" if p.rate_rps else ")")
    echo = (
        None if err.is_terminal else (lambda t: err.print(t, markup=False, highlight=False, soft_wrap=True))
    )
    return PointWatch(p.id, metrics=exporter.metrics if exporter else None, echo=echo, label=what)


def _progress_bar(prog, p: LoadPoint, watch=None) -> Callable[[dict], None]:
    """run_point's progress callback: one bar per point (requests done, or time for a duration point), or the
    plain lines of `watch` without a terminal."""
    total = p.requests if p.duration_s is None else p.warmup_s + p.duration_s
    what = f"concurrency {p.concurrency}" + (f", {p.rate_rps:g}/s" if p.rate_rps else "")
    task = prog.add_task(what, total=total, status="")

    def update(d: dict) -> None:
        if watch is not None:
            watch.progress(d)
        done = d["completed"] if p.duration_s is None else min(d["elapsed_s"], p.warmup_s + p.duration_s)
        prog.update(task, completed=done, status=f"{d['completed']} done, {d['failed']} failed")

    return update


def _report(run: _Run, summaries: list[dict], run_dir: Path, err) -> None:
    """The table (or JSON), the notes, and the exit status: 3 failures above the threshold, 1 an SLO breached."""
    from rich.console import Console
    from rich.markup import escape

    if run.opts["as_json"]:
        run_id = run_dir.name
        click.echo(json.dumps({"run_id": run_id, "run_dir": str(run_dir), "points": summaries}, indent=2))
    else:
        # Without a terminal (CI logs, a file) the table is as wide as it needs: every header whole, no cell cut
        # (at 150 columns the why and J/out tok columns squeezed `TTFT p50 ms` onto two lines and cut failures).
        out = Console() if sys.stdout.isatty() else Console(width=260)
        f = run.fields
        title = f"servesweep load — {f['prompt_tokens']} prompt / {f['output_tokens']} output tokens"
        if f["workload"] == "trace":  # the trace's own lengths; its window and speed-up say what was replayed
            n = summaries[0]["point"]["requests"] if summaries else "?"
            title = f"servesweep load — trace {Path(f['trace']).name}: {n} requests at {f['trace_speedup']:g}x"
        out.print(results_table(summaries, title=title))
        out.print(f"results: {run_dir}")
    for line in table_notes(summaries):
        err.print(line)
    for s in summaries:  # a trace replay's fidelity check (driver/point.py replay_fidelity)
        if tf := s.get("trace_fidelity"):
            style = "green" if tf.get("faithful") else "bold yellow"
            err.print(f"[{style}]{s['point_id']}: {escape(tf['verdict'])}[/]", highlight=False, soft_wrap=True)
    # Any failed request is said, even within --max-failure-rate: a green CI job should not hide a few 500s.
    for s in summaries:
        if warning := s["failure_check"].get("warning"):
            err.print(f"[bold yellow]WARNING: {escape(warning)}[/]", highlight=False, soft_wrap=True)
    failed = [s["failure_check"]["message"] for s in summaries if not s["failure_check"]["pass"]]
    for msg in failed:
        err.print(f"[red]failed: {escape(msg)}[/]", highlight=False, soft_wrap=True)
    if failed:
        err.print(
            f"exit 3: {len(failed)} point(s) failed the failure check (--max-failure-rate "
            f"{run.max_rate:.1%}; 100% allows any share short of no success at all)",
            highlight=False,
            soft_wrap=True,
        )
    slo_fail = [s for s in summaries if any(not c["pass"] for c in s.get("slos", []))]
    if slo_fail:
        err.print(f"[red]SLO breached at {', '.join(s['point_id'] for s in slo_fail)}[/]")
    degraded = [s["point_id"] for s in summaries if s.get("degraded")]
    if degraded:  # measured at a lower load than asked: not what was asked, before 3 and 1 (servesweep.exit_codes)
        err.print(exit_line(COULD_NOT_RUN, degraded), markup=False, highlight=False, soft_wrap=True)
        sys.exit(COULD_NOT_RUN)
    if failed:
        sys.exit(FAILED_REQUESTS)  # requests failed above the threshold (servesweep.exit_codes)
    if slo_fail:
        sys.exit(BREACH)
