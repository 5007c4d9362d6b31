"""One load point as a real headless Locust subprocess (`run_point`): the Locust command, its process group, local
and remote workers, and the point's folder (records.parquet, summary.json, locust.log, written atomically).

This module never imports Locust or gevent: the orchestrator calls `run_point` from a process that must stay
unpatched. Locust runs `servesweep/client/locustfile.py` in a child process; the records it writes, not its exit
status, decide what happened.
"""

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Literal

from servesweep.config.point import DEFAULT_MAX_FAILURE_RATE, LoadPoint
from servesweep.config.secrets import KEY_ENV, child_env
from servesweep.driver.command import locust_command, master_command
from servesweep.driver.gpu_telemetry import sampler_urls as gpu_telemetry_urls
from servesweep.driver.gpu_telemetry import write_point_gpu
from servesweep.processes import Group, process_alive, start_group, stop_group
from servesweep.results.energy import summary_fields as gpu_summary_fields
from servesweep.results.point_summary import FailureCheck
from servesweep.results.schema import VersionedFile
from servesweep.results.summary import CLIENTS_JSON, ClientsFile
from servesweep.target.probes import ProbeLog, resolve_point, server_metrics_text
from servesweep.workload.build import build_bodies, build_workload

# ---------------------------------------------------------------- one point


class PointFailed(RuntimeError):
    """The Locust process produced no records (it crashed or could not start)."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP reached `servesweep load` (a BaseException, like KeyboardInterrupt: nothing on the
    way up mistakes it for a failed probe). `signum` gives the exit status 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# after SIGTERM, Locust writes the records of what finished at once (its quitting hook), then waits for the streams
# in flight up to its stop timeout: this long, then the group is SIGKILLed (the load must stop within seconds)
STOP_GRACE_S = float(os.environ.get("SERVESWEEP_STOP_GRACE_S", "5"))


class InterruptedFile(VersionedFile):
    """interrupted.json in an interrupted point's folder (keep_partial), schema_version 1: why the point stopped and
    the partial records kept (`records`: their file beside it, None when Locust wrote none; `rows`: how many,
    None when unknown; `unreadable`: why a torn file could not be counted). `servesweep load` lists it in its
    manifest (driver/load.py). A file without schema_version is the format before the model, the same keys."""

    WHAT: ClassVar[str] = "interrupted point file (interrupted.json)"
    FILE: ClassVar[str] = "interrupted.json"

    schema_version: Literal[1] = 1
    point_id: str
    reason: str
    records: str | None
    rows: int | None
    unreadable: str | None = None


def keep_partial(work: Path, out_dir: Path, point_id: str, reason: str) -> InterruptedFile:
    """An interrupted point: the records Locust wrote (what finished before the stop) go next to its log as
    `records.partial.parquet`, described by `interrupted.json`; `.work/` is removed. Returns that description."""
    info = InterruptedFile(point_id=point_id, reason=reason, records=None, rows=None)
    rec = work / "records.parquet"
    if rec.is_file():
        dest = out_dir / "records.partial.parquet"
        os.replace(rec, dest)
        info.records = dest.name
        try:
            from servesweep.results.records import read_parquet

            info.rows = read_parquet(dest).num_rows
        except Exception as e:  # a torn file: kept, and said so
            info.unreadable = f"{type(e).__name__}: {e}"
    info.save(out_dir / InterruptedFile.FILE)
    shutil.rmtree(work, ignore_errors=True)
    return info


def failure_check(summary: dict, max_failure_rate: float | None = DEFAULT_MAX_FAILURE_RATE) -> FailureCheck:
    """Whether a point's failures are above the threshold: none succeeded, or the failed share of measured
    requests is above max_failure_rate (None: no share check). summary.json's "failure_check" ("pass", "message",
    "warning", "top_error", "max_failure_rate"): `message` says why it failed; `warning` says that requests failed although the point
    passed (any failure at all is worth a look: a CI log shows it even when the exit status is 0)."""
    req = summary.get("requests") or {}
    measured, ok, failed = req.get("measured", 0), req.get("ok", 0), req.get("failed", 0)
    fails = summary.get("failures") or {}
    top = max(fails.items(), key=lambda kv: kv[1]) if fails else None
    top_txt = f"; top error class {top[0]} ({top[1]} of {measured})" if top else ""
    limit = "no max failure rate" if max_failure_rate is None else f"max failure rate {max_failure_rate:.1%}"
    msg = warning = None
    if ok == 0:
        msg = f"point {summary.get('point_id')}: 0 of {measured} measured requests succeeded{top_txt}"
    elif max_failure_rate is not None and measured and failed / measured > max_failure_rate:
        msg = (
            f"point {summary.get('point_id')}: {failed} of {measured} requests failed "
            f"({failed / measured:.1%} > {limit}){top_txt}"
        )
    elif failed:
        warning = (
            f"point {summary.get('point_id')}: {failed} of {measured} requests failed "
            f"({failed / measured:.1%}, within {limit}){top_txt}"
        )
    return FailureCheck(
        passed=msg is None,
        message=msg,
        warning=warning,
        top_error=top[0] if top else None,
        max_failure_rate=max_failure_rate,
    )


class ServerSampler:
    """The server's Prometheus /metrics, asked for about once a second by a background thread of the parent while a
    point runs (results/server_state.py reduces each answer at once, so a long point keeps a few numbers per
    sample, not the text). One request at a time, SAMPLE_TIMEOUT_S at most; nothing it meets reaches the point: a
    failed request is skipped, and a server whose /metrics is missing (an HTTP error other than 429/5xx) or holds
    no sglang:* series is not asked again (`reason` says why). `stop()` ends the thread and takes one last sample
    (the counters after the last request finished); the first is taken by `start()`, before the load."""

    def __init__(self, point: LoadPoint, interval_s: float | None = None, timeout_s: float | None = None):
        from servesweep.results import server_state as ss

        self.point = point
        self.interval_s = ss.SAMPLE_INTERVAL_S if interval_s is None else interval_s
        self.timeout_s = ss.SAMPLE_TIMEOUT_S if timeout_s is None else timeout_s
        self.state = ss.StateAccumulator()  # a few numbers however long the point: no list of samples
        self.reason: str | None = None  # why there are no (more) samples
        self._given_up = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one request at a time, the last one's included
        self._thread = threading.Thread(target=self._loop, name="servesweep-server-state", daemon=True)

    def start(self) -> "ServerSampler":
        """The first sample here, before any request of the point (the counters' baseline), then the thread."""
        self.sample()
        self._thread.start()
        return self

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._given_up:
            due = max(due + self.interval_s, time.monotonic())  # about once a second, a slow answer not added
            if self._stop.wait(due - time.monotonic()):
                return
            self.sample()

    def sample(self) -> None:
        """One request to /metrics, its answer reduced and kept; never raises."""
        from servesweep.results.server_state import NotSGLang, read_exposition
        from servesweep.target.http import ServerError

        if not self._lock.acquire(timeout=self.timeout_s + 5):  # a request still stuck on a trickling answer
            return
        try:
            if self._given_up:
                return
            t = time.monotonic()
            self.state.add(t, read_exposition(server_metrics_text(self.point, self.timeout_s)))
        except ServerError as e:
            self.reason = f"GET /metrics: {e}"
            self._given_up = not e.transient
        except NotSGLang as e:
            self.reason, self._given_up = str(e), True
        except Exception as e:  # not Prometheus text, a key that cannot be read: skipped
            self.reason = f"GET /metrics: {type(e).__name__}: {e}"[:300]
        finally:
            self._lock.release()

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s + 5)
        if final:
            self.sample()

    def summary(self) -> tuple[dict | None, str | None]:
        """(summary.json's server_state, or None; why it is None)."""
        state = self.state.result(self.interval_s)
        return state, None if state is not None else (self.reason or "no sample of /metrics")


def run_point(
    point: LoadPoint,
    out_dir: Path,
    *,
    workers: int = 0,
    progress: Callable[[dict], None] | None = None,
    slos: str | None = None,
    command_prefix: list[str] | None = None,
    metrics_port: int | None = None,
    worker_hosts: dict | None = None,
    owned=None,
    max_failure_rate: float | None = DEFAULT_MAX_FAILURE_RATE,
    probes: ProbeLog | None = None,
    on_records: Callable[[list[dict]], None] | None = None,
    targets=None,
    gpu_telemetry: list[str] | None = None,
) -> dict:
    """Run ONE point as a headless Locust subprocess and write records.parquet, summary.json and locust.log into
    out_dir (atomically). Returns the summary dict. `progress` is called about once a second with
    {"point_id", "elapsed_s", "completed", "issued", "failed"}. `metrics_port`: the Locust process serves its own
    live client metrics (servesweep.observe.exporter) on this port of 127.0.0.1 while the point runs, for a caller
    with no exporter of its own (a test, a script). `servesweep load` and `servesweep run` pass none: their own
    process serves the run's one exporter for the whole run (load: on --metrics-port, or on a free port when a
    stack is set up; run: the experiment's `exporter:`), fed through `on_records` and set to each point's summary
    (driver/load.py `_RunExporter`, matrix/orchestrator.py).

    `workers=N`: N local worker processes (Locust --processes) share the users, the request budget and the
    arrival rate. `worker_hosts`: workers on the hosts of an Ansible inventory group instead, started over SSH by
    the locust_worker role ({"inventory": PATH_OR_TEXT, "group": "loadgen", "per_host": N, "master_host": ADDR,
    "master_port": 5557, "extravars": {...}, "package": WHEEL}); the master binds master_host. Either way a worker
    that dies mid-point is named in summary.json with the requests it lost, and the point is marked degraded.

    `owned` (processes.OwnedProcesses): the Locust process group is recorded there (pid and start time) while it
    runs, so a resumed run can stop exactly it. An exception while Locust runs (Interrupted: a signal) stops the
    group (SIGTERM, SIGKILL after STOP_GRACE_S) and keeps the records Locust wrote as records.partial.parquet with
    interrupted.json (keep_partial) before it goes on up. `max_failure_rate`: summary["failure_check"] says
    whether the point's failures are above it (0 successes always are; None: only those). `probes`: probe
    requests sent for this point before (counted into summary["probe_requests"] with this point's own).
    `on_records`: called with the rows of the live record feed (results/livefeed.py) while the point runs,
    about once a second. `targets` (observe.targets.RunTargets): with `metrics_port`, the Locust process's
    exporter is registered there (role "locust", under the targets' run_id, which the process's exporter takes
    too) while the point runs, and removed at its end. `servesweep load` and `servesweep run` pass none: they
    register the run's own exporter in their RunTargets for the whole run. `gpu_telemetry`: the GPU samplers'
    URLs (else $SERVESWEEP_GPU_TELEMETRY): their samples of the point go into gpu.json (driver/gpu_telemetry.py).
    """
    from servesweep.config.slo import parse_slos
    from servesweep.results.point_summary import SUMMARY, save_summary

    if workers and worker_hosts:
        raise ValueError("workers and worker_hosts: give local worker processes or worker hosts, not both")
    remote = _check_worker_hosts(worker_hosts) if worker_hosts else None
    if point.workload == "trace":
        # a replay sends its window's requests, each once, whatever its caller asked (an experiment's load.requests,
        # a search's probe): the point says how many (its summary's, the budget the workers split by session)
        from servesweep.workload.build import load_point_trace

        point = point.model_copy(update={"requests": len(load_point_trace(point).requests)})
    elif workers and point.requests is not None and point.requests < workers:
        raise ValueError(
            f"requests={point.requests} < workers={workers}: every worker process needs a share of the budget"
        )
    parsed_slos = parse_slos(slos)  # fail on a bad SLO before any load
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    m0 = time.monotonic()  # durations: a wall-clock step mid-point (NTP, date -s) must change none
    probes = probes if probes is not None else ProbeLog()
    point = resolve_point(point, probes)
    # build (and cache on disk) the pool here, so the child's start is quick and errors show early
    trace = None
    flushed = False
    if point.workload == "trace":  # the replayed window too, for the fidelity check at the end
        trace = build_workload(point, trace_replay=True).trace
        # the expected hits assume an empty cache: a replay of the same trace before this one (another point of
        # the sweep, a search's probe) has left its prompts there
        flushed = flush_server_cache(point)
    else:
        build_bodies(point)
    sampler = ServerSampler(point)  # the point as resolved: its key is read in this process
    # the key goes to the child in its environment, under one name; the point it reads says which
    point, env = child_env(point)
    work = _fresh_work(out_dir, point)
    handle = _start_remote(point, work, out_dir, remote, env.get(KEY_ENV)) if remote is not None else None
    cmd = [*(command_prefix or []), *_locust_argv(point, work, workers, remote, handle)]  # e.g. taskset -c 1
    if metrics_port:
        cmd += ["--metrics-port", str(metrics_port)]
    poll = _live_env(env, work, on_records, targets, metrics_port)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if workers:
        env["SERVESWEEP_STATUS_DIR"] = str(work / "status")  # each worker process: its counters, 4 x a second
    try:
        started = time.monotonic()
        sampler.start()
        rc = _run_locust(
            cmd, env, out_dir, work, point, workers=workers, progress=progress, owned=owned, poll=poll
        )
    except BaseException:
        sampler.stop(final=False)
        raise
    finally:
        states = handle.stop() if handle is not None else None
        if targets is not None and metrics_port:
            targets.drop("servesweep", "locust")
    sampler.stop()  # its last sample: the server's counters once every request of the point has finished
    wall_end = time.time()
    summary = _point_summary(
        point, out_dir, work, rc, t0, parsed_slos, probes, max_failure_rate, workers, handle, states
    )
    summary["wall_s"] = time.monotonic() - m0
    summary["server_state"], why = sampler.summary()  # results/server_state.py; docs/reports.md
    if why is not None:
        summary["server_state_note"] = why
    cached = sampler.state.increase(
        "cached_tokens"
    )  # the server's cached tokens during the point, None: unknown
    if point.workload == "shared_prefix":
        summary["shared_prefix"] = shared_prefix_check(point, summary, cached)
    elif point.workload == "agent" and cached is not None:
        summary["server_cached_tokens"] = cached
    if trace is not None:
        summary["trace_fidelity"] = replay_fidelity(
            point, trace.trace, work / "records.parquet", summary, cached, flushed=flushed
        )
    os.replace(work / "records.parquet", out_dir / "records.parquet")
    for name in ("locust-report.html",):
        if (work / name).is_file():
            os.replace(work / name, out_dir / name)
    gpu_urls = gpu_telemetry_urls(gpu_telemetry)
    if gpu_urls:  # the GPUs' energy, power, utilization and throttling during the point: gpu.json
        summary["gpu"] = gpu_summary_fields(write_point_gpu(gpu_urls, out_dir, summary, t0, wall_end))
    # checked against results/point_summary.py PointSummary, then written atomically
    summary = save_summary(out_dir / SUMMARY, summary)
    if progress is not None:
        progress(_read_progress(work, point, time.monotonic() - started))
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _live_env(env: dict[str, str], work: Path, on_records, targets, metrics_port: int | None):
    """The child's environment for live observation: the feed's folder (returns the poll that hands its rows to
    `on_records`), and the run_id of its own exporter, registered for Prometheus on its behalf."""
    from servesweep.results.livefeed import LIVE_DIR_ENV, RUN_ID_ENV, FeedReader

    if targets is not None and metrics_port:
        env[RUN_ID_ENV] = targets.run_id
        targets.exporter(f"127.0.0.1:{int(metrics_port)}", role="locust")
    if on_records is None:
        return None
    reader = FeedReader(work / "live")
    env[LIVE_DIR_ENV] = str(reader.folder)

    def poll() -> None:
        rows = reader.poll()
        if rows:
            on_records(rows)

    return poll


def _fresh_work(out_dir: Path, point: LoadPoint) -> Path:
    """The point's `.work/` folder, without what an earlier attempt left, holding point.json: the one thing of the
    point that crosses into the Locust processes."""
    work = out_dir / ".work"
    work.mkdir(exist_ok=True)
    status_dir = work / "status"
    shutil.rmtree(status_dir, ignore_errors=True)
    status_dir.mkdir()
    shutil.rmtree(work / "live", ignore_errors=True)
    for stale in ("records.parquet", "progress.json", CLIENTS_JSON):
        (work / stale).unlink(missing_ok=True)
    (work / "point.json").write_text(point.model_dump_json(indent=2))
    return work


def _locust_argv(point: LoadPoint, work: Path, workers: int, remote: dict | None, handle) -> list[str]:
    """The Locust command: a master for the worker hosts' workers, else a local run (workers: --processes)."""
    if handle is None:
        return locust_command(point, work, workers=workers)
    assert remote is not None  # a remote handle exists only for worker hosts
    return master_command(
        point,
        work,
        expect_workers=handle.expected,
        bind_host=remote["master_host"],
        bind_port=remote["master_port"],
    )


def _start_remote(point: LoadPoint, work: Path, out_dir: Path, remote: dict, api_key: str | None):
    """Start the worker hosts' Locust workers (the locust_worker role; the point's key, if any, as a no-log
    secret); returns their handle."""
    from servesweep.driver.workers import start_remote_workers

    extravars = dict(remote["extravars"])
    if point.api_key_env and "locust_worker_api_key_env" not in extravars:
        extravars["locust_worker_api_key_env"] = point.api_key_env
    return start_remote_workers(
        remote["inventory"],
        remote["group"],
        remote["master_host"],
        remote["master_port"],
        remote["per_host"],
        work / "point.json",
        out_dir / "remote",
        package=remote["package"],
        extravars=extravars,
        api_key=api_key,
    )


def _run_locust(
    cmd: list[str],
    env: dict[str, str],
    out_dir: Path,
    work: Path,
    point: LoadPoint,
    *,
    workers: int,
    progress: Callable[[dict], None] | None,
    owned,
    poll: Callable[[], None] | None = None,
) -> int:
    """Run the Locust command in its own process group, its output in locust.log; returns its exit status. An
    exception meanwhile (a signal) stops the group and keeps what Locust wrote (keep_partial) before it goes up."""
    started = time.monotonic()
    # no parent watch: the Locust child has its own (client/watch.py), and a resumed run stops the group
    # recorded in processes.json
    group = start_group(
        cmd, env=env, log_path=out_dir / "locust.log", log_mode="wb", kind="locust", point=point.id
    )
    if owned is not None:
        owned.add([group.ref])
    try:
        while group.alive():
            time.sleep(0.5)
            if poll is not None:
                poll()
            if progress is not None:
                progress(_read_progress(work, point, time.monotonic() - started))
        if workers:
            _wait_workers_gone(group, work / "status")
        if poll is not None:
            poll()
    except BaseException as e:
        stop_group(group, STOP_GRACE_S)
        keep_partial(work, out_dir, point.id, f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        if owned is not None:
            owned.remove([group.ref])
    return group.popen.returncode


def _point_summary(
    point: LoadPoint,
    out_dir: Path,
    work: Path,
    rc: int,
    t0: float,
    parsed_slos,
    probes: ProbeLog,
    max_failure_rate: float | None,
    workers: int,
    handle,
    states,
) -> dict:
    """summary.json of a point from the records Locust wrote (PointFailed: none), with its workers' account."""
    from servesweep.results.degeneration import degeneration_summary
    from servesweep.results.records import read_parquet
    from servesweep.results.summary import client_headroom, summarize

    rec_path = work / "records.parquet"
    log_path = out_dir / "locust.log"
    if not rec_path.is_file():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise PointFailed(
            f"point {point.id}: Locust exited with {rc} and wrote no records; locust.log ends:\n{tail}"
        )
    table = read_parquet(rec_path)
    try:
        got = ClientsFile.load(work / CLIENTS_JSON)  # a damaged one: ValueError naming the file and the field
    except FileNotFoundError:  # Locust wrote records but no account of its processes: none to show
        got = ClientsFile(clients=[])
    clients, exits = got.clients, got.worker_exits
    summary = {
        "point_id": point.id,
        "point": point.model_dump(mode="json"),
        "locust_exit_code": rc,
        "started_unix": t0,
        "wall_s": time.time() - t0,
        **summarize(table, slos=parsed_slos, answers=degeneration_summary(table)),
    }
    summary["client_headroom"] = client_headroom(clients, table, summary.get("itl_zero_gap_share"))
    summary["client_saturated"] = summary["client_headroom"]["client_saturated"]
    summary["degraded"], summary["problems"] = False, []
    summary["notes"] = list(probes.notes)
    summary["probe_requests"] = probes.as_dict()
    summary["failure_check"] = failure_check(summary, max_failure_rate).model_dump(by_alias=True)
    if workers or states is not None:
        from servesweep.driver.workers import account

        log_text = log_path.read_text(errors="replace")
        missing = {c.worker for c in clients if c.missing and c.worker}
        if states is None:
            states = _local_worker_states(work / "status", exits)
        acc = account(states, table, log_text, missing=missing)
        summary["workers"] = acc
        summary["degraded"] = acc["degraded"]
        summary["problems"] = list(acc["problems"])
        expected = handle.expected if handle is not None else workers
        if len(states) < expected:
            summary["degraded"] = True
            summary["problems"].append(f"{len(states)} of {expected} worker processes reported")
    return summary


def shared_prefix_check(point: LoadPoint, summary: dict, server_cached: float | None) -> dict:
    """The shared-prefix target next to what was measured: every measured request but each group's first can be
    served the group's prefix (an upper bound: warmup requests raise it, evictions lower it). `server_cached`: the
    server's cached tokens during the point (None: not exposed)."""
    n = summary["requests"]["ok"]
    g = min(point.num_groups, n)
    target = (n - g) / n * point.shared_prefix_tokens / point.prompt_tokens if n else None
    return {
        "target_hit_ratio": target,
        "measured_hit_ratio": summary["cache_hit_ratio"],
        "server_cached_tokens": server_cached,
    }


def replay_fidelity(
    point: LoadPoint,
    trace,
    records: Path,
    summary: dict,
    server_cached: float | None,
    *,
    flushed: bool = True,
) -> dict:
    """A trace replay's fidelity check (results/trace_fidelity.py) from its records: the trace's expected cached
    tokens with the server's cache size (None: unknown, an unbounded cache) against the `cached_tokens` the server
    reported and its own counter's increase, requests sent against the trace, the schedule lag p99, the starts the
    concurrency cap held back. Its `verdict` is the line the summary and the report show; `cache_flushed` says
    whether the server's cache was emptied before the replay (the expected figure assumes it was)."""
    from servesweep.results.records import read_parquet
    from servesweep.results.trace_fidelity import trace_fidelity

    cols = ["trace_index", "error_class", "prompt_tokens", "cached_tokens", "completion_tokens", "sent_ns"]
    cols += ["first_token_ns", "cap_bound"]
    t = read_parquet(records).select([*cols, "mono_to_wall_ns"]).to_pylist()
    rows = [{**r, "ok": r["error_class"] is None} for r in t if r["trace_index"] is not None]
    cache = server_cache_tokens(point)
    lag = (summary.get("schedule_lag_ms") or {}).get("p99")
    f = trace_fidelity(
        trace,
        rows,
        cache_tokens=cache,
        server_cached_tokens=None if server_cached is None else int(server_cached),
        schedule_lag_p99_ms=lag,
    )
    out = f.model_dump(mode="json")
    out["requests_sent"] = len(rows)
    out["requests_sent_twice"] = len(rows) - len({r["trace_index"] for r in rows})
    out["cache_flushed"] = flushed
    if not flushed:
        out["verdict"] += "; the server's cache was not flushed before the replay (no /flush_cache)"
    return out


def flush_server_cache(point: LoadPoint) -> bool:
    """POST /flush_cache (SGLang, the emulator), retried while requests still run; False when the server has no
    such path or never took it (another server: its cache keeps what earlier points left)."""
    from servesweep.config.secrets import api_key_for
    from servesweep.target import http

    retry = http.Retry(attempts=10, first_delay_s=0.5, max_delay_s=0.5, also=frozenset({400}))
    try:
        status = http.retrying(
            "flushing the cache",
            lambda: http.status(
                "POST",
                point.base_url + "/flush_cache",
                api_key=api_key_for(point),
                extra_headers=point.headers,
            ),
            retry,
        )
    except http.ServerError:
        return False
    return status == 200


def server_cache_tokens(point: LoadPoint) -> int | None:
    """The server's KV cache pool in tokens (SGLang's `max_total_num_tokens` in /server_info, older servers'
    /get_server_info); None when it does not say (another server, an error)."""
    from servesweep.config.secrets import api_key_for
    from servesweep.target import http

    for path in ("/server_info", "/get_server_info"):
        try:
            info = http.get_json(
                point.base_url + path, api_key=api_key_for(point), extra_headers=point.headers, timeout=5.0
            )
        except Exception:  # noqa: BLE001 - not an SGLang server, or it is gone: the check assumes no eviction
            continue
        if not isinstance(info, dict):
            continue
        states = info.get("internal_states")
        for d in (info, *(states if isinstance(states, list) else [])):
            v = d.get("max_total_num_tokens") if isinstance(d, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _read_progress(work: Path, point: LoadPoint, elapsed: float) -> dict:
    d = {
        "point_id": point.id,
        "elapsed_s": elapsed,
        "completed": 0,
        "issued": 0,
        "failed": 0,
        "streamed_events": 0,
    }
    statuses = [read_json(f) for f in sorted((work / "status").glob("*.json"))]
    if any(statuses):  # worker processes: the sum of their own counters
        for k in ("completed", "issued", "failed", "streamed_events"):
            d[k] = sum(int(st.get(k, 0)) for st in statuses if st)
        return d
    got = read_json(work / "progress.json")
    if isinstance(got, dict):
        d.update(got)
    return d


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _check_worker_hosts(wh: dict) -> dict:
    """worker_hosts with its defaults; a clear error naming the key that is wrong."""
    known = {"inventory", "group", "per_host", "master_host", "master_port", "extravars", "package"}
    bad = sorted(set(wh) - known)
    if bad:
        raise ValueError(f"worker_hosts: unknown keys {bad}; known: {sorted(known)}")
    for k in ("inventory", "master_host"):
        if not wh.get(k) or not isinstance(wh[k], str | Path):
            raise ValueError(f"worker_hosts.{k}: required (a string)")
    per_host = wh.get("per_host", 1)
    if not isinstance(per_host, int) or per_host < 1:
        raise ValueError(f"worker_hosts.per_host must be an integer >= 1, got {per_host!r}")
    port = wh.get("master_port", 5557)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"worker_hosts.master_port must be a TCP port, got {port!r}")
    extravars = wh.get("extravars") or {}
    if not isinstance(extravars, dict):
        raise ValueError("worker_hosts.extravars must be a mapping of role variables")
    inv = str(wh["inventory"])
    if "\n" not in inv and not Path(inv).is_file():
        raise ValueError(f"worker_hosts.inventory: {inv} is neither a file nor inventory text")
    return {
        "inventory": inv,
        "group": str(wh.get("group") or "loadgen"),
        "per_host": per_host,
        "master_host": str(wh["master_host"]),
        "master_port": port,
        "extravars": extravars,
        "package": Path(wh["package"]) if wh.get("package") else None,
    }


def _wait_workers_gone(group: Group, status_dir: Path, timeout_s: float = 20.0) -> None:
    """Locust's master can exit before its forked workers have (its exit hook does not wait for a worker that is
    still running), and a worker writes that it quit at its very end: wait for them, bounded, then kill what is
    left of the process group (such a worker shows as one that did not quit)."""
    pids = []
    for f in status_dir.glob("*.json"):
        try:
            pids.append(int(f.stem))
        except ValueError:
            pass
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if process_alive(pid)]
        if pids:
            time.sleep(0.1)
    if pids:
        stop_group(group, 0)


def _local_worker_states(status_dir: Path, exits: dict[int, int]):
    """The local worker processes as remote_workers.WorkerState, from their status files and exit statuses."""
    import socket

    from servesweep.driver.workers import WorkerState

    host = socket.gethostname()
    out = []
    statuses = [st for st in (read_json(f) for f in status_dir.glob("*.json")) if st]
    for i, st in enumerate(sorted(statuses, key=lambda st: st["pid"])):
        pid = int(st["pid"])
        code = exits.get(pid, 0 if st.get("quit") else None)
        note = None
        if code is None:
            note = "stopped without quitting or an exit status"
        elif code > 128:
            note = f"was killed by signal {code - 128}"
        out.append(
            WorkerState(
                host="local",
                hostname=host,
                index=i,
                pid=pid,
                exit_code=code,
                stopped_by_role=False,
                status=st,
                log=None,
                note=note,
            )
        )
    return out
