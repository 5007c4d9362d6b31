"""`servesweep load`: one load point or a sweep (concurrency, rate) against a running server or the built-in
emulator, each point through `driver.point_run.run_point`, with a table at the end."""

import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from servesweep.config.point import (
    LoadPoint,
    check_arrival,
    knobs,
)
from servesweep.driver.point_run import STOP_SIGNALS, Interrupted, InterruptedFile, read_json, run_point
from servesweep.exit_codes import BREACH, COULD_NOT_RUN, FAILED_REQUESTS, BadOption, CouldNotRun, UsageError
from servesweep.results.degraded import exit_line
from servesweep.results.point_summary import SUMMARY, ProbeRequests, load_summary
from servesweep.results.schema import Strict, VersionedFile
from servesweep.results.store import MANIFEST
from servesweep.results.table import results_table, table_notes
from servesweep.target.probes import ProbeLog, resolve_point

# the variable the key is read from when neither --api-key-env nor --api-key-file is given (when it is set)
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_SIM_MODEL = "Qwen/Qwen3.6-27B"
DEFAULT_SIM_ARGS = f"--model-path {DEFAULT_SIM_MODEL} --enable-cache-report"


# ---------------------------------------------------------------- the run's manifest


class LoadPointEntry(Strict):
    """A point of the run: its folder, its sweep axes; an interrupted one has `status` and its partial records."""

    point_id: str
    dir: str  # its folder in the run folder (`<point>.interrupted[-n]` once a resume moved it aside)
    concurrency: int | None = None
    rate_rps: float | None = None
    status: Literal["interrupted"] | None = None  # absent: measured (summary.json in its folder)
    partial: InterruptedFile | None = None  # the point's interrupted.json


class Interruption(Strict):
    """A signal that stopped the run: which, when, the point it was measuring (None: between points)."""

    signal: str
    unix: float
    point: str | None


class PastInterruption(Strict):
    """An interruption a resume took over: the signal (absent where the run was killed without a word) and the
    interrupted points' folders, moved aside."""

    signal: str | None = None
    unix: float | None = None
    point: str | None = None
    points: list[LoadPointEntry]


class Resume(Strict):
    """One `--resume`: when, its command line, the server it measured and the probes it sent."""

    unix: float
    argv: list[str]
    base_url: str | None = None
    probe_requests: ProbeRequests | None = None


class LoadManifestFile(VersionedFile):
    """`servesweep load`'s manifest.json, schema_version 1: what the run is (its argv: `--resume` parses it again),
    the points measured so far, and its interruptions and resumes. results/runfolder.py reads the same keys. A file
    without schema_version is the format before the model, the same keys."""

    WHAT: ClassVar[str] = "servesweep load manifest"

    schema_version: Literal[1] = 1
    run_id: str
    kind: Literal["load"]
    base_url: str
    points: list[LoadPointEntry]
    argv: list[str]
    probe_requests: ProbeRequests
    status: Literal["interrupted"] | None = None  # absent: running or finished (finished_unix)
    interrupted: Interruption | None = None
    interruptions: list[PastInterruption] = []
    resumed: list[Resume] = []
    finished_unix: float | None = None

    def save_in(self, run_dir: Path) -> None:
        self.save(Path(run_dir) / MANIFEST)


def load_manifest(run_dir: Path) -> LoadManifestFile:
    """The load run's manifest, checked: BadOption (for --resume) naming the file and the field that is wrong, or
    saying it is another kind of run folder."""
    path = run_dir / MANIFEST
    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != "load" or not isinstance(data.get("argv"), list):
        raise BadOption(
            f"{run_dir}: not a servesweep load run folder (no manifest.json of kind 'load' with its argv); "
            "a servesweep run folder resumes with servesweep run --resume",
            "--resume",
        )
    try:
        return LoadManifestFile.check(path, data)
    except ValueError as e:
        raise BadOption(str(e), "--resume") from None


# ---------------------------------------------------------------- `servesweep load`


def parse_concurrency(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise BadOption(f"{part!r} in {text!r} is not a positive integer", "--concurrency")
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
            raise BadOption(
                f"{part.strip()!r} in {text!r} is not a positive number of requests per second",
                "--rate",
            )
        out.append(v)
    return out


# `servesweep load`'s options that are sweep axes: lists of the knob's values (checked against the table by
# tests/config/test_point_options.py); the command's options are servesweep.cli.load's.
SWEEP_AXES = {"--concurrency": "concurrency", "--rate": "rate_rps"}


def run_load(opts: dict[str, Any]) -> None:
    """Run one load point or a sweep (concurrency and/or open-loop rate; one Locust run per point) and print the
    results table; `opts` are the command's options (servesweep.cli.load). Exits with the run's code
    (docs/reports.md, "Exit codes"), 128 + signum when a signal stops it."""
    old_handlers = {}

    def on_signal(signum, frame):
        for sig in STOP_SIGNALS:  # once: a second signal must not break the stop that the first one began
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

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


def resumed_argv(run_dir: Path) -> list[str]:
    """`--resume RUN`: the `servesweep load` options RUN was started with (its manifest's argv), to be parsed again
    so that its points are the same points."""
    argv = load_manifest(run_dir).argv
    return argv[1:] if argv[:1] == ["load"] else argv


def _finished_summary(path: Path) -> dict[str, Any] | None:
    """A finished point's summary, checked; None where its folder is gone (measured again). A damaged one is a
    usage error of --resume naming the file and the field."""
    try:
        return load_summary(path)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise BadOption(str(e), "--resume") from None


def _resume_state(
    run_dir: Path, points: list[LoadPoint]
) -> tuple[LoadManifestFile, list[dict], list[LoadPoint]]:
    """A stopped run's manifest made ready to go on: the points it finished (with their summaries) stay, an
    interrupted point's folder moves aside to `<point>.interrupted[-n]` (its partial records kept, listed under
    `interruptions`), and what is left to measure, in the sweep's order."""
    manifest = load_manifest(run_dir)
    finished = [e for e in manifest.points if e.status != "interrupted"]
    summaries = {e.point_id: _finished_summary(run_dir / e.dir / SUMMARY) for e in finished}
    finished = [e for e in finished if summaries[e.point_id] is not None]  # a folder removed since: measure it
    moved = []
    for e in manifest.points:
        if e.status == "interrupted" and (run_dir / e.dir).is_dir():
            aside, n = run_dir / f"{e.dir}.interrupted", 1
            while aside.exists():
                n += 1
                aside = run_dir / f"{e.dir}.interrupted-{n}"
            (run_dir / e.dir).rename(aside)
            moved.append(e.model_copy(update={"dir": aside.name}))
    data = manifest.as_data()
    for gone in ("status", "finished_unix", "interrupted"):  # the stop is history now: under `interruptions`
        data.pop(gone, None)
    resumed = LoadManifestFile.model_validate(data)
    if manifest.interrupted is not None or moved:
        past = manifest.interrupted.model_dump() if manifest.interrupted is not None else {}
        resumed.interruptions = [*resumed.interruptions, PastInterruption(**past, points=moved)]
    resumed.points = finished
    resumed.resumed = [*resumed.resumed, Resume(unix=time.time(), argv=sys.argv[1:])]
    done = {e.point_id for e in finished}
    kept = [s for p in points if p.id in done and (s := summaries[p.id]) is not None]
    return resumed, kept, [p for p in points if p.id not in done]


def parse_rate_limit(text: str | None, what: str) -> float | None:
    """'5%' or '0.05' as a fraction in [0, 1]; None stays None."""
    if text is None:
        return None
    t = str(text).strip()
    if not t:
        raise BadOption("empty: give a share like 0.05 or 5% (100%: no check)", what)
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 1:
        raise BadOption(f"{text!r} is not a share between 0 and 1 (or 0% and 100%)", what)
    return v


def _interrupted(state: dict, e: Interrupted) -> None:
    """A signal stopped `servesweep load`: Locust is stopped already (run_point); keep what finished, list the
    partial records of the point it interrupted, say so, exit 128 + signum."""
    err = sys.stderr
    name = signal.Signals(e.signum).name
    run_dir, manifest, current = state.get("run_dir"), state.get("manifest"), state.get("current")
    lines = [f"servesweep load: stopped by {name}; the load generator is stopped"]
    if run_dir is not None and manifest is not None:
        manifest.status = "interrupted"
        manifest.interrupted = Interruption(signal=name, unix=time.time(), point=current)
        done = [p.point_id for p in manifest.points]
        if current is not None:
            try:
                info: InterruptedFile | None = InterruptedFile.load(run_dir / current / InterruptedFile.FILE)
            except (OSError, ValueError):  # stopped before the point ran, or its file unreadable: not listed
                info = None
            if info is not None:
                entry = LoadPointEntry(point_id=current, dir=current, status="interrupted", partial=info)
                manifest.points = [*manifest.points, entry]
                if info.records:
                    lines.append(
                        f"point {current} was interrupted: {info.rows} finished requests in "
                        f"{run_dir / current / info.records} (partial; see interrupted.json)"
                    )
        try:
            manifest.save_in(run_dir)
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
    opts: dict[str, Any]  # the run-level options as the command gave them
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
            raise BadOption(str(e), k.cli) from None
    try:
        parse_slos(opts["slo"])
    except ValueError as e:
        raise BadOption(str(e), "--slo") from None
    try:
        check_arrival(fields["arrival"], opts["rate_text"], rate_name="--rate", arrival_name="--arrival")
    except ValueError as e:
        raise BadOption(str(e), "--rate") from None
    rate_text = opts.pop("rate_text")
    workers, requests = opts["workers"], fields["requests"]
    if workers and requests is not None and requests < workers:
        raise BadOption(
            f"--requests {requests} < --workers {workers}: each worker process needs a share of the budget",
            "--workers",
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
            raise BadOption("give --api-key-file or --api-key-env, not both", "--api-key-file")
        try:
            key = read_key_file(api_key_file)
        except SecretError as e:
            raise BadOption(str(e), "--api-key-file") from None
    else:
        if name is None and env_key(DEFAULT_KEY_ENV):
            name = DEFAULT_KEY_ENV
        key = env_key(name) if name is not None else None
        if name is not None and not key:
            raise BadOption(f"environment variable {name} is not set", "--api-key-env")
    fields["api_key_env"] = hold_key(key)
    return key


def _worker_hosts(opts: dict[str, Any]) -> dict | None:
    """--worker-inventory and its settings as run_point's worker_hosts (None: local processes)."""
    inventory, master_host = opts.pop("worker_inventory"), opts.pop("master_host")
    group, per_host, port = opts.pop("worker_group"), opts.pop("workers_per_host"), opts.pop("master_port")
    if inventory is None:
        if master_host:
            raise BadOption("--master-host is for --worker-inventory", "--master-host")
        return None
    if opts["workers"]:
        raise BadOption("give --workers or --worker-inventory, not both", "--workers")
    if not master_host:
        raise BadOption("worker hosts need the address they reach this machine at", "--master-host")
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
            raise UsageError(f"{names}: {e}") from None
    return points


def _trace_requests(run: _Run) -> int:
    """A trace replay's request count: its window's (read here, so a bad file or an empty window is a usage error
    before anything starts). --requests and --duration do not apply: --trace-window and --trace-sample cut it."""
    from servesweep.workload.build import load_point_trace
    from servesweep.workload.trace.model import TraceError

    f = run.fields
    for name, cli in (("requests", "--requests"), ("duration_s", "--duration")):
        if f[name] is not None:
            raise BadOption(
                "a trace replay sends every request of its window once; cut it with --trace-start, --trace-window "
                "and --trace-sample",
                cli,
            )
    try:
        point = LoadPoint(base_url="http://127.0.0.1", concurrency=1, requests=1, probe=False, model="-", **{
            k: v for k, v in f.items() if k not in ("requests", "model", "probe")
        })  # fmt: skip
        n = len(load_point_trace(point).requests)
    except (TraceError, OSError, ValueError) as e:
        raise BadOption(str(e), "--trace") from None
    if not n:
        raise BadOption(f"trace {f['trace']}: no request in the window", "--trace-start")
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
    from servesweep.results.store import new_run

    resume_dir = run.opts.get("resume_dir")
    kept: list[dict] = []
    if resume_dir is not None:
        resumed, kept, points = _resume_state(resume_dir, points)
        state.update(run_dir=resume_dir, manifest=resumed, all_points=[e.point_id for e in resumed.points])
        state["all_points"] += [p.id for p in points]
        err.print(
            f"resuming {resume_dir}: {len(kept)} point(s) measured before are kept, {len(points)} to measure"
            + (f" ({', '.join(p.id for p in points)})" if points else ""),
            soft_wrap=True,  # one line in a log, the folder whole
        )
        if not points:
            resumed.save_in(resume_dir)
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
    probe_requests = ProbeRequests.model_validate(probes.as_dict())
    manifest: LoadManifestFile = state.get("manifest") or LoadManifestFile(
        run_id=run_id,
        kind="load",
        base_url=base_url,
        points=[],
        argv=sys.argv[1:],
        probe_requests=probe_requests,
    )
    if resume_dir is not None:
        manifest.resumed[-1].base_url = base_url
        manifest.resumed[-1].probe_requests = probe_requests
    manifest.save_in(run_dir)
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
            disable=not err.is_terminal,  # without a terminal: plain lines (driver/point_progress.py)
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
            entry = LoadPointEntry(point_id=p.id, dir=p.id, concurrency=p.concurrency, rate_rps=p.rate_rps)
            manifest.points = [*manifest.points, entry]
            manifest.save_in(run_dir)
            state["current"] = None
    manifest.finished_unix = time.time()
    manifest.save_in(run_dir)
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
    from servesweep.driver.point_progress import PointWatch

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
        print(json.dumps({"run_id": run_id, "run_dir": str(run_dir), "points": summaries}, indent=2))
    else:
        # Without a terminal (CI logs, a file) the table is as wide as it needs: every header whole, no cell cut
        # (at 150 columns the why and J/out tok columns squeezed `TTFT p50 ms` onto two lines and cut failures).
        out = Console() if sys.stdout.isatty() else Console(width=260)
        f = run.fields
        title = f"servesweep load — {f['prompt_tokens']} prompt / {f['output_tokens']} output tokens"
        if f["workload"] == "trace":  # the trace's own lengths; its window and speed-up say what was replayed
            n = summaries[0]["point"]["requests"] if summaries else "?"
            title = (
                f"servesweep load — trace {Path(f['trace']).name}: {n} requests at {f['trace_speedup']:g}x"
            )
        out.print(results_table(summaries, title=title))
        out.print(f"results: {run_dir}")
    for line in table_notes(summaries):
        err.print(line)
    for s in summaries:  # a trace replay's fidelity check (driver/point_run.py replay_fidelity)
        if tf := s.get("trace_fidelity"):
            style = "green" if tf.get("faithful") else "bold yellow"
            err.print(
                f"[{style}]{s['point_id']}: {escape(tf['verdict'])}[/]", highlight=False, soft_wrap=True
            )
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
    if (
        degraded
    ):  # measured at a lower load than asked: not what was asked, before 3 and 1 (servesweep.exit_codes)
        err.print(exit_line(COULD_NOT_RUN, degraded), markup=False, highlight=False, soft_wrap=True)
        sys.exit(COULD_NOT_RUN)
    if failed:
        sys.exit(FAILED_REQUESTS)  # requests failed above the threshold (servesweep.exit_codes)
    if slo_fail:
        sys.exit(BREACH)
