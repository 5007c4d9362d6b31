"""The locustfile: `locust -f <this file>` (what `run_point` starts) or through `locustfiles/llm.py` (by hand).

It registers servesweep's command-line arguments, builds the point's prompt bodies once per process, switches
Locust's response-time histogram to 1 ms buckets, and writes the per-request records at the end of the test.
Under distributed Locust, workers ship their records to the master with each report.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

import locust.stats
from locust import events

from servesweep.client import stats_rows
from servesweep.client.feed import take_records
from servesweep.client.locust_internals import forked_worker_exits, send_stats_now
from servesweep.client.messages import ABORT_MSG, CLIENT_REPORT_KEY, DRAINED_MSG, END_MSG, RECORDS_REPORT_KEY
from servesweep.client.user import LLMUser, LoadContext
from servesweep.config.point import DEFAULT_MAX_FAILURE_RATE, Knob, LoadPoint, knob_values, knobs
from servesweep.exit_codes import COULD_NOT_RUN, FAILED_REQUESTS
from servesweep.files import write_atomic
from servesweep.results.records import write_parquet

__all__ = ["LLMUser"]

log = logging.getLogger("servesweep")

# Percentiles from 1 ms buckets instead of Locust's coarse ones (10 ms below 1 s, 1 s above 10 s). Bucketing
# happens where the value is logged, so every process that loads this file must patch it.
locust.stats.bucket_response_time = lambda response_time: int(round(response_time))
stats_rows.install()  # the LLM TTFT/E2E rows stay out of the Aggregated row

_STATUS_DIR_ENV = "SERVESWEEP_STATUS_DIR"  # run_point: each process writes <dir>/<pid>.json 4x a second
_FOREVER = 3.0e7  # seconds: "no duration of our own"

# Exit codes of a headless Locust process (servesweep.exit_codes; the table: docs/reports.md, "Exit codes"): 1 an
# SLO breached, 2 could not run (bad options, the gate could not run, the server never answered; Locust's own 2 for
# an unhandled error), 3 no successful request or a failure share above --max-failure-rate (plain headless Locust).
# Locust's --exit-code-on-error rule (1 on any failure) is replaced by --max-failure-rate.
# 4: the process that started this one (servesweep load/run, or the local master) is gone.
EXIT_FAILURES = FAILED_REQUESTS
EXIT_PARENT_GONE = 4
# A request that failed so (no response headers, one of these classes) never reached a server that answers.
_NEVER_ANSWERED = frozenset({"connection_reset", "timeout_connect"})

# Who this process's parent is, to notice when it dies (ppid changes: the orphan is re-parented). Recorded when
# Locust imports this file: in the process servesweep (or a shell) started, before `--processes` forks its workers,
# whose parent is then this very process (_IMPORT_PID).
_IMPORT_PID = os.getpid()
_IMPORT_PPID = os.getppid()
_WATCH_ENV = "SERVESWEEP_WATCH_PARENT"  # 1: watch the parent, 0: never; unset: see _parent_to_watch
# A watched remote worker quits after this long without a heartbeat from its master (Locust's own check: 60 s).
_MASTER_SILENCE_ENV = "SERVESWEEP_MASTER_SILENCE_S"
_MASTER_SILENCE_S = 15.0
_WATCH_PERIOD_S = 0.5


class _NoStopTimeout(float):
    """Locust's --stop-timeout default, told apart from an explicit `-s 0` (argv, LOCUST_STOP_TIMEOUT, a config
    file: those arrive as plain numbers). Equal to 0 in every use; replaced by a plain float at init."""


_NO_STOP_TIMEOUT = _NoStopTimeout(0.0)


@events.init_command_line_parser.add_listener
def _args(parser) -> None:
    # The web UI starts load against a GPU server: bind it to loopback unless told otherwise (--web-host).
    # No -s given: a headless run picks the point's stop timeout itself (_init), instead of dropping every stream
    # still running at -t.
    parser.set_defaults(web_host="127.0.0.1", stop_timeout=_NO_STOP_TIMEOUT)
    # The start form lists its parameters in the order they are added: the ramp (with the web UI) and the load
    # shape first, then each group of the knobs' table (config.point.GROUPS); --help lists them under one title
    # per group.
    grouped = GroupedArguments(parser)
    if "servesweep.client.webui" in sys.modules:
        from servesweep.client.shapes import add_ramp_arguments

        add_ramp_arguments(grouped)
    for k in knobs("form"):
        add_knob_argument(grouped, k)
    _run_arguments(grouped)


class GroupedArguments:
    """A Locust parser's add_argument that puts each option in an argument group named by its help's "[group]"
    prefix ("servesweep: load shape"; "servesweep: run" without one), so that --help lists servesweep's options
    by group after Locust's own. Locust's extra keywords (include_in_web_ui, is_secret, ...) exist only on the
    parser's own add_argument: here they are set on the action as LocustArgumentParser does, so the web UI still
    finds the option (the groups share the parser's list of actions)."""

    UI_KEYWORDS = {"include_in_web_ui": True, "is_secret": False, "is_required": False, "is_multiple": False}

    def __init__(self, parser) -> None:
        self.parser = parser
        # on the parser: the web UI module's options join the same titles
        self.groups: dict[str, argparse._ArgumentGroup] = parser.__dict__.setdefault("servesweep_groups", {})

    def group(self, help_text: str) -> argparse._ArgumentGroup:
        title = help_text[1 : help_text.index("]")] if help_text.startswith("[") else "run"
        if title not in self.groups:
            self.groups[title] = self.parser.add_argument_group(f"servesweep: {title}")
        return self.groups[title]

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        ui = {k: kwargs.pop(k, default) for k, default in self.UI_KEYWORDS.items()}
        action = self.group(kwargs.get("help") or "").add_argument(*args, **kwargs)
        for k, v in ui.items():
            setattr(action, k, v)
        return action


def add_knob_argument(parser, k: Knob) -> None:
    """One knob of the table as a Locust option shown in the start form, its group and CLI name in the help. Unset
    optional values are empty text (the form keeps an option's type, and None has none); Knob.value reads them."""
    kw: dict = {
        "default": k.option_default("form"),
        "help": f"[{k.group}] {k.help} ({k.cli})".replace("%", "%%"),
    }
    if k.kind == "flag":
        kw["action"] = "store_true"
    elif k.kind == "switch":
        kw["choices"] = ["", "on", "off"]
    elif k.kind == "choice":
        kw["choices"] = list(k.choices)
    elif not k.optional and k.kind not in ("text", "json"):  # json: text a Knob.value parses
        kw["type"] = int if k.kind == "int" else float
    parser.add_argument(k.cli, include_in_web_ui=True, **kw)


def _run_arguments(parser) -> None:
    """The options of a Locust run that are not one point's knobs (servesweep passes most; --slo is in the form)."""

    def opt(*a, ui=False, **kw):
        parser.add_argument(*a, include_in_web_ui=ui, **kw)

    opt("--point-json", default=None, help="a LoadPoint JSON file (overrides the point's options)")
    opt(
        "--slo",
        default="",
        ui=True,
        help="SLOs checked at the end, e.g. 'ttft_p99<=2s,itl_p99<=50ms'; breach: exit 1",
    )
    opt("--records", default="", help="write per-request records (Parquet) here at the end")
    opt("--progress-file", default="", help="rewrite {issued, completed, failed} here every second")
    opt(
        "--split-workers",
        type=int,
        default=0,
        help="worker processes the point's request budget and arrival rate are split over (0: one)",
    )
    opt(
        "--max-failure-rate",
        type=_failure_rate,
        default=DEFAULT_MAX_FAILURE_RATE,
        help="headless: exit 3 when more than this share of the measured requests failed (0.05 or 5%%; "
        + f"default {DEFAULT_MAX_FAILURE_RATE:.0%}".replace("%", "%%")  # argparse %-formats the help
        + "; 100%% turns it off); any failure within it is a warning and exits 0 (it replaces Locust's "
        "exit-code-on-error rule). Always: exit 3 when no request succeeded",
    )
    # The web UI module registers --metrics-port (and installs the exporter) itself.
    if "servesweep.client.webui" not in sys.modules:
        opt(
            "--metrics-port",
            type=int,
            default=0,
            help="serve the client Prometheus metrics on this port of 127.0.0.1 (0: none)",
        )


# The Locust options that are not knobs of the table (tests/config/test_point_options.py holds the form to it).
RUN_OPTIONS = (
    "point_json",
    "slo",
    "records",
    "progress_file",
    "split_workers",
    "max_failure_rate",
    "metrics_port",
)


def _failure_rate(text: str) -> float:
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")  # named below, as an out-of-range share is
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"--max-failure-rate {text}: a share from 0 to 1 (or 0% to 100%)")
    return v


def _point_from_options(opts, host: str | None) -> LoadPoint | None:
    """The point of the command line (or --point-json); None on a worker started without --host (the master sends
    the host with the first spawn, and the context is built then)."""
    if opts.point_json:
        return LoadPoint.model_validate_json(Path(opts.point_json).read_text())
    if not host:
        if getattr(opts, "worker", False):
            return None
        raise ValueError("give the server with --host http://HOST:PORT")
    fields = knob_values(vars(opts), "form")
    if fields["workload"] not in ("shared_prefix", "agent"):
        fields["shared_prefix_tokens"] = 0  # a value left in the form from another workload
    w, p, o, ep = fields["workload"], fields["prompt_tokens"], fields["output_tokens"], fields["endpoint"]
    return LoadPoint(
        base_url=host,
        concurrency=max(1, int(getattr(opts, "num_users", None) or 1)),
        # by hand, Locust's -t or the UI decide the end of a point without a request budget
        duration_s=_FOREVER if fields["requests"] is None else None,
        point_id=f"locust-{w}-p{p}-o{o}-{ep}",
        **fields,
    )


def build_context(point: LoadPoint) -> LoadContext:
    """Resolve what the point left open (model, template overhead, continuous usage) and pre-encode the bodies."""
    from servesweep.config.secrets import api_key_for
    from servesweep.target.probes import resolve_point
    from servesweep.workload.build import build_workload

    point = resolve_point(point)
    # a trace point's bodies are sent at the trace's slots, body i at request i's: this user does (user.py)
    w = build_workload(point, trace_replay=point.workload == "trace")
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "Accept-Encoding": "identity",
    }
    headers.update(point.headers)
    key = api_key_for(point)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return LoadContext(
        point=point,
        bodies=w.bodies,
        nonce_digits=w.nonce_digits,
        headers=headers,
        path=w.path,
        nonce_format=w.nonce_format,
        output_tokens=w.output_tokens,
        agent=w.agent,
        trace=w.trace,
    )


def _prebuild() -> tuple[str, LoadContext] | None:
    """With --point-json (what run_point passes), build the bodies when Locust imports this file: that happens
    before `--processes` forks its workers, so they start measuring at once instead of each building for seconds."""
    argv = sys.argv
    if "--point-json" not in argv or argv.index("--point-json") + 1 >= len(argv):
        return None
    path = argv[argv.index("--point-json") + 1]
    try:
        text = Path(path).read_text()
        return text, build_context(LoadPoint.model_validate_json(text))
    except Exception:  # noqa: BLE001 - init builds it again and reports the error where Locust shows it
        return None


_PREBUILT = _prebuild()


def _context_for(point_json: str | None, point: LoadPoint) -> LoadContext:
    if _PREBUILT is not None and point_json and Path(point_json).read_text() == _PREBUILT[0]:
        pre = _PREBUILT[1]
        # A fresh context per process: its own pid, clock anchor, nonce start and prompt order.
        return LoadContext(
            point=pre.point,
            bodies=pre.bodies,
            nonce_digits=pre.nonce_digits,
            headers=pre.headers,
            path=pre.path,
            nonce_format=pre.nonce_format,
            output_tokens=pre.output_tokens,
            agent=pre.agent,
            trace=pre.trace,
        )
    return build_context(point)


@events.init.add_listener
def _init(environment, **_kw) -> None:
    from locust.runners import MasterRunner, WorkerRunner

    opts = environment.parsed_options
    if opts is None:  # used as a library without options: the caller sets environment.servesweep itself
        return
    runner = environment.runner
    try:
        point = _point_from_options(opts, environment.host or opts.host)
        ctx = (
            _context_for(opts.point_json, point)
            if point is not None and not isinstance(runner, MasterRunner)
            else None
        )
    except (ValueError, RuntimeError, OSError) as e:
        # Locust logs and ignores exceptions of event handlers; without a context the users would only wait.
        log.error("servesweep: cannot start the point: %s", e)
        print(f"servesweep: COULD NOT RUN: {e}", file=sys.stderr, flush=True)
        raise SystemExit(COULD_NOT_RUN) from None  # bad input: 2, never 1 (a breach)
    if ctx is not None:
        _use_context(environment, ctx)
    elif isinstance(runner, MasterRunner):
        from servesweep.results.records import RecordBuffer

        environment.servesweep = _MasterState(point=point, buffer=RecordBuffer())
    # else: a worker without --host builds its context at test start, with the host the master sent

    _settle_stop_timeout(environment, point)
    if isinstance(runner, MasterRunner):
        _graceful_run_time(environment)
    _start_parent_watch(environment)

    if not isinstance(runner, MasterRunner):
        # A context built after test_start (the web UI's start form, or a worker whose init was still building
        # when the first spawn came) is prepared by the first user that runs with it.
        environment.servesweep_prepare = lambda c: _prepare(environment, c)

    port = getattr(opts, "metrics_port", 0)
    if port and "servesweep.client.webui" not in sys.modules and not isinstance(runner, WorkerRunner):
        from servesweep.client.exporter import install_locust
        from servesweep.observe.exporter import ClientMetrics
        from servesweep.results.livefeed import RUN_ID_ENV

        # the run's id when servesweep started this process (it registers this exporter for Prometheus)
        metrics = ClientMetrics(
            os.environ.get(RUN_ID_ENV) or time.strftime("locust-%Y%m%dT%H%M%SZ", time.gmtime())
        )
        install_locust(environment, metrics, serve=("127.0.0.1", port))
        environment.servesweep_metrics = metrics
    if isinstance(runner, WorkerRunner):
        _worker_hooks(environment, runner)
    if isinstance(runner, MasterRunner):
        _master_hooks(environment, runner)


def _use_context(environment, ctx: LoadContext) -> None:
    """The users of this process run with `ctx` (its point's host and timeouts)."""
    opts = environment.parsed_options
    LLMUser.host = ctx.point.base_url
    LLMUser.connection_timeout = ctx.point.connect_s
    LLMUser.network_timeout = ctx.point.first_token_s
    if getattr(opts, "csv_prefix", None):
        ctx.quit_delay_s = 1.2  # Locust rewrites its CSV once a second and not at exit
    environment.servesweep = ctx
    # Everything built so far (Locust, the tokenizer, the bodies) lives for the whole run: keep it out of the
    # collector's generations so a full collection during the run does not walk it (a pause is a late stamp).
    gc.freeze()
    log.info(
        "servesweep: point %s, model %s, %d prompt bodies, nonce %d digits",
        ctx.point.id,
        ctx.point.model,
        len(ctx.bodies),
        ctx.nonce_digits,
    )


def _worker_hooks(environment, runner) -> None:
    """A worker: the master's end and abort messages; its records and client status ride on each report."""
    runner.register_message(END_MSG, _on_end, concurrent=True)
    runner.register_message(ABORT_MSG, _on_abort, concurrent=True)

    @events.report_to_master.add_listener
    def _ship(client_id, data, **_k) -> None:
        ctx = getattr(environment, "servesweep", None)  # None: a host-less worker before its first spawn
        if ctx is not None and len(ctx.buffer):
            data[RECORDS_REPORT_KEY] = take_records(environment, ctx.buffer)  # the live feed writes first
        if isinstance(ctx, LoadContext):
            data[CLIENT_REPORT_KEY] = _client_status(
                ctx, shipped=len(data.get(RECORDS_REPORT_KEY, {}).get("request_id", ()))
            )


def _master_hooks(environment, runner) -> None:
    """The master: the workers' records and client status from their reports, their drained messages, and the
    watch that ends a point when no worker is left."""

    @events.worker_report.add_listener
    def _collect(client_id, data, **_k) -> None:
        cols = data.get(RECORDS_REPORT_KEY)
        if cols:
            environment.servesweep.buffer.extend_columns(cols)
        st = data.get(CLIENT_REPORT_KEY)
        if st:
            environment.servesweep.clients.update(client_id, st)

    def _drained(environment, msg, **_k) -> None:
        environment.servesweep.drained.add(msg.node_id)

    runner.register_message(DRAINED_MSG, _drained)

    import gevent

    gevent.spawn(_watch_workers, environment)


def _settle_stop_timeout(environment, point: LoadPoint | None) -> None:
    """Locust's default stop timeout is 0: at -t every stream still running is dropped, and a run whose streams last
    longer than -t ends with 0 records. Headless without -s, take the point's stop timeout instead (what
    `servesweep load` passes: min(total, first-token + 4 x stall + 60 s), 1440 s with the defaults): the end waits
    for the running streams only, each bounded by its own timeouts. An explicit -s (even 0) is kept."""
    opts = environment.parsed_options
    given = getattr(opts, "stop_timeout", 0.0)
    if not isinstance(given, _NoStopTimeout):
        return
    opts.stop_timeout = 0.0  # a plain float from here on (the spawn message carries the options to workers)
    if not getattr(opts, "headless", False) or getattr(opts, "worker", False) or point is None:
        return  # the web UI keeps Locust's default; a worker takes the master's with each spawn
    st = point.effective_stop_timeout()
    opts.stop_timeout = environment.stop_timeout = st
    log.info(
        "servesweep: no -s/--stop-timeout: streams running at the end get up to %g s to finish "
        "(min(total, first-token + 4 x stall + 60 s)); they are measured, not dropped",
        st,
    )


def _graceful_run_time(environment) -> None:
    """A headless master started by hand with -t: end it the way a servesweep duration point ends (the workers
    finish their streams within the stop timeout and ship every record, then the master quits). Locust's own -t
    quits the master 0.5 s after telling the workers, before the records of the streams still running arrive; it
    stays as a backstop, a stop timeout and a margin later."""
    import math

    opts, st = environment.parsed_options, environment.servesweep
    run_time = getattr(opts, "run_time", None)
    point = st.point
    if not (getattr(opts, "headless", False) and run_time and point is not None and not opts.point_json):
        return
    if point.requests is not None or point.duration_s is None or point.duration_s < _FOREVER:
        return
    st.point = point.model_copy(update={"duration_s": max(0.001, run_time - point.warmup_s)})
    opts.run_time = math.ceil(run_time + environment.stop_timeout + 30)


def _parent_to_watch() -> int | None:
    """The pid whose death ends this process, or None. A worker that Locust's --processes forked: its master,
    always (nothing else talks to it). A process servesweep started (it passes --point-json: `servesweep load`,
    `servesweep run`, the locust_worker role's launch script): its parent. A `locust` a person started from a shell
    is not watched: a closing terminal sends SIGHUP itself, and `nohup locust ... &` is meant to outlive the shell.
    SERVESWEEP_WATCH_PARENT=1 or 0 overrides."""
    forced = os.environ.get(_WATCH_ENV, "").strip()
    if forced == "0":
        return None
    if os.getpid() != _IMPORT_PID:
        return _IMPORT_PID  # forked by Locust after importing this file: the parent is the master
    if forced == "1" or "--point-json" in sys.argv:
        return _IMPORT_PPID
    return None


def _start_parent_watch(environment) -> None:
    from locust.runners import WorkerRunner

    parent = _parent_to_watch()
    if parent is None:
        return
    import gevent

    silence = 0.0
    if isinstance(environment.runner, WorkerRunner) and os.getpid() == _IMPORT_PID:
        # A worker servesweep started on another host: its master is its real parent (Locust's own check waits 60 s)
        try:
            silence = float(os.environ.get(_MASTER_SILENCE_ENV, _MASTER_SILENCE_S))
        except ValueError:
            silence = _MASTER_SILENCE_S
    gevent.spawn(_watch_parent, environment, parent, silence)


def _watch_parent(environment, parent: int, master_silence_s: float) -> None:
    """Twice a second: is the parent still this process's parent (an orphan is re-parented to init or a
    subreaper)? For a watched remote worker: has the master answered a heartbeat lately?"""
    import gevent

    runner = environment.runner
    while True:
        if os.getppid() != parent:
            _abandon(environment, f"the parent process {parent} is gone")
            return
        last = getattr(runner, "last_heartbeat_timestamp", None)
        if master_silence_s > 0 and last and time.time() - last > master_silence_s:
            _abandon(environment, f"no heartbeat from the master for {master_silence_s:g} s")
            return
        gevent.sleep(_WATCH_PERIOD_S)


def _abandon(environment, why: str) -> None:
    """Stop the load at once: nobody waits for this run any more. Streams in flight are dropped (stop timeout 0),
    what finished is shipped or written, and the process exits EXIT_PARENT_GONE; a backstop exits it hard if the
    regular way has not within a few seconds."""
    import gevent
    from locust.runners import MasterRunner, WorkerRunner

    if getattr(environment, "servesweep_abandoned", False):
        return
    environment.servesweep_abandoned = True
    log.error("servesweep: %s: stopping the load now (exit %d)", why, EXIT_PARENT_GONE)
    environment.process_exit_code = EXIT_PARENT_GONE
    environment.stop_timeout = 0.0
    ctx = getattr(environment, "servesweep", None)
    if isinstance(ctx, LoadContext):
        ctx.closing = True
    gevent.spawn_later(5.0, _hard_exit, environment)
    runner = environment.runner
    try:
        if isinstance(runner, MasterRunner):
            # Workers drop their streams and ship what finished; quit() below waits 0.5 s for those last reports.
            runner.send_message(ABORT_MSG)
        elif isinstance(runner, WorkerRunner):
            runner.stop()
            send_stats_now(runner)  # the records, if a master is still there to take them
        runner.quit()
    finally:
        web_ui = getattr(environment, "web_ui", None)
        if web_ui is not None:
            web_ui.stop()


def _on_abort(environment, msg, **_k) -> None:
    import gevent

    # Outside the runner's greenlet group: runner.quit() kills that group, and this handler with it.
    gevent.spawn(_abandon, environment, "the master stopped the load (its parent is gone)")


def _hard_exit(environment) -> None:
    from locust.runners import WorkerRunner

    log.error("servesweep: still running 5 s after the stop; exiting now")
    try:
        if not isinstance(environment.runner, WorkerRunner):
            _write_records(environment)
    finally:
        logging.shutdown()
        os._exit(EXIT_PARENT_GONE)


class _MasterState:
    def __init__(self, point: LoadPoint | None, buffer) -> None:
        self.point = point  # None: a master started without --host (the web UI's form gives it)
        self.buffer = buffer
        self.sampler: Sampler | None = None  # the master's headroom sampler, from the test start
        self.clients = Clients()
        self.drained: set[str] = set()  # workers that finished their streams and shipped every record


class Clients:
    """What the master (or a local runner, of itself) knows about each load-generating process: its last counters,
    its CPU time, every event-loop lag sample, and the last state Locust gave it (`missing`: heartbeats stopped)."""

    MAX_LAGS = 200_000  # 20 samples a second: nearly 3 hours per process

    def __init__(self) -> None:
        self.by_id: dict[str, dict] = {}
        self.exits: dict[int, int] = {}  # forked local worker pid -> exit status (a signal N as 128 + N)

    def _entry(self, client_id: str) -> dict:
        return self.by_id.setdefault(client_id, {"client_id": client_id, "lags_ms": [], "cpu_pct_max": 0.0})

    def update(self, client_id: str, st: dict) -> None:
        c = self._entry(client_id)
        lags = st.get("lags_ms") or ()
        if len(c["lags_ms"]) < self.MAX_LAGS:
            c["lags_ms"].extend(lags)
        for k in ("worker", "pid", "issued", "completed", "failed", "cpu_s", "wall_s", "role"):
            if k in st:
                c[k] = st[k]
        c["cpu_pct_max"] = max(c["cpu_pct_max"], float(st.get("cpu_pct_max") or 0.0))
        c["shipped"] = c.get("shipped", 0) + int(st.get("shipped", 0))

    def state(self, client_id: str, state: str) -> None:
        c = self._entry(client_id)
        c["last_state"] = state
        if state == "missing":
            c["missing"] = True

    def note_exits(self) -> None:
        """Exit statuses of the worker processes Locust forked (--processes). gevent's child watcher reaps them as
        they end and keeps (pid, status, time) until they are waited for (locust_internals.forked_worker_exits); Locust
        waits only at its own exit, so peek there (read only: a wait of ours would break Locust's)."""
        for pid, v in forked_worker_exits().items():
            if isinstance(v, tuple) and pid not in self.exits:
                code = os.waitstatus_to_exitcode(v[1])
                self.exits[pid] = 128 - code if code < 0 else code  # as a shell says it: SIGKILL is 137

    def write(self, path: Path) -> None:
        write_atomic(
            path,
            json.dumps({"clients": list(self.by_id.values()), "worker_exits": self.exits}),
            durable=False,
        )


class Sampler:
    """This process's CPU time and event-loop lag (how late a 50 ms gevent sleep wakes up) since the test start, and
    its busiest 3-second CPU window."""

    PERIOD_S = 0.05
    WINDOW_S = 3.0

    def __init__(self, runner=None) -> None:
        self.cpu0 = time.process_time()
        self.wall0 = time.monotonic()
        self.lags_ms: list[float] = []
        self.cpu_pct_max = 0.0
        # Lag is not sampled while the runner spawns users (all at once: one stall before any load).
        self._runner = runner

    def run(self) -> None:
        import gevent

        period, clock, cpu = self.PERIOD_S, time.monotonic, time.process_time
        w_wall, w_cpu = clock(), cpu()
        while True:
            t0 = clock()
            gevent.sleep(period)
            t1 = clock()
            spawning = self._runner is not None and self._runner.state == "spawning"
            if len(self.lags_ms) < Clients.MAX_LAGS and not spawning:
                self.lags_ms.append((t1 - t0 - period) * 1000.0)
            if t1 - w_wall >= self.WINDOW_S:
                c = cpu()
                self.cpu_pct_max = max(self.cpu_pct_max, (c - w_cpu) / (t1 - w_wall) * 100.0)
                w_wall, w_cpu = t1, c

    def take(self, reset: bool = True) -> dict:
        lags = self.lags_ms
        if reset:
            self.lags_ms = []
        return {
            "cpu_s": time.process_time() - self.cpu0,
            "wall_s": time.monotonic() - self.wall0,
            "cpu_pct_max": self.cpu_pct_max,
            "lags_ms": list(lags),
        }


def _counters(ctx: LoadContext) -> dict:
    """This process's name and request counters, as clients.json and the status files show them."""
    return {
        "worker": ctx.worker,
        "pid": os.getpid(),
        "issued": ctx.issued,
        "completed": ctx.completed,
        "failed": ctx.failed,
        "streamed_events": ctx.streamed_events,
    }


def _client_status(ctx: LoadContext, shipped: int = 0, reset: bool = True) -> dict:
    d = {**_counters(ctx), "shipped": shipped}
    sampler = getattr(ctx, "sampler", None)
    if sampler is not None:
        d.update(sampler.take(reset))
    return d


def _on_end(environment, msg, **_k) -> None:
    """Worker: the master ended the duration. Send nothing more, let the streams in flight finish (bounded by the
    stop timeout), ship every record, and tell the master. Locust's own end (-t) would quit the master 0.5 s after
    telling the workers to stop, before the records of the streams that were still running arrive."""
    import gevent

    ctx = getattr(environment, "servesweep", None)
    runner = environment.runner
    if isinstance(ctx, LoadContext):
        ctx.closing = True
        deadline = time.monotonic() + _stop_timeout(environment, ctx.point)
        while ctx.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.05)
    send_stats_now(runner)  # the records, before the message below (one ordered channel)
    runner.send_message(DRAINED_MSG, {"in_flight": getattr(ctx, "in_flight", 0)})


def _stop_timeout(environment, point: LoadPoint) -> float:
    """How long the end of a duration point waits for running streams: Locust's stop timeout (the master's -s, or
    the point's own when none was given: _settle_stop_timeout), else the point's."""
    st = float(getattr(environment, "stop_timeout", 0.0) or 0.0)
    return st if st > 0 else point.effective_stop_timeout()


def _end_distributed(environment) -> None:
    """Master: end a duration point gracefully (see _on_end), then quit; bounded by the stop timeout."""
    import gevent

    runner, st = environment.runner, environment.servesweep
    runner.send_message(END_MSG)
    deadline = time.monotonic() + _stop_timeout(environment, st.point) + 10.0
    while time.monotonic() < deadline:
        alive = {c.id for c in runner.clients.all if c.state != "missing"}
        if alive <= st.drained:
            break
        gevent.sleep(0.1)
    else:
        log.error("servesweep: workers %s did not finish in time", sorted(alive - st.drained))
    runner.quit()


def _watch_workers(environment) -> None:
    """Master: note each worker's state once a second (a killed worker turns `missing` about 3 s after its last
    heartbeat), and end a request-bounded point when no worker is left (Locust only stops when the last one goes
    missing, and a headless master would then wait for ever)."""
    import gevent
    from locust.runners import STATE_STOPPED

    runner = environment.runner
    seen_running = False
    while True:
        gevent.sleep(1.0)
        st = environment.servesweep
        for c in runner.clients.all:
            st.clients.state(c.id, c.state)
        st.clients.note_exits()
        seen_running = seen_running or runner.worker_count > 0
        point = st.point
        if (
            seen_running
            and environment.parsed_options.headless
            and point is not None
            and point.requests is not None
            and point.duration_s is None
            and runner.worker_count <= 0
            and runner.state == STATE_STOPPED
        ):
            log.warning("servesweep: no worker left; ending the point")
            runner.quit()
            return


@events.test_start.add_listener
def _start(environment, **_kw) -> None:
    ctx = getattr(environment, "servesweep", None)
    opts = environment.parsed_options
    if ctx is None and opts is not None and "servesweep.client.webui" not in sys.modules:
        # A worker started without --host: the master's host has arrived with the spawn (the web UI module
        # builds the context itself when it is loaded).
        point = _point_from_options(opts, environment.host)
        if point is not None:
            ctx = environment.servesweep = build_context(point)
            LLMUser.host = ctx.point.base_url
            LLMUser.connection_timeout = ctx.point.connect_s
            LLMUser.network_timeout = ctx.point.first_token_s
    from servesweep.client.feed import start_feed

    start_feed(environment)  # the parent's live view of the records, when it asked for one
    if isinstance(ctx, _MasterState):
        import gevent

        # The master merges every record: its CPU is what limits many workers.
        ctx.sampler = sampler = Sampler(environment.runner)
        gevent.spawn(sampler.run)
        pt = ctx.point
        d = pt.duration_s if pt is not None else None
        if pt is not None and d is not None and d < _FOREVER and opts is not None and opts.headless:
            gevent.spawn_later(pt.warmup_s + d, _end_distributed, environment)
    if isinstance(ctx, LoadContext):
        ctx.closing = False  # a new start in the web UI after a stop
        ctx.measure_start_ns = time.monotonic_ns() + int(ctx.point.warmup_s * 1e9)
        import gevent

        _prepare(environment, ctx)

        if opts is not None and opts.progress_file:
            gevent.spawn(_progress_loop, ctx, Path(opts.progress_file))
        from locust.runners import LocalRunner

        d = ctx.point.duration_s
        if d is not None and d < _FOREVER and isinstance(environment.runner, LocalRunner):
            # Like Locust's -t (which takes whole seconds): quit() stops users gracefully within --stop-timeout,
            # so streams running at the end finish and are recorded.
            gevent.spawn_later(ctx.point.warmup_s + d, environment.runner.quit)


def _prepare(environment, ctx: LoadContext) -> None:
    """Once per context at the test start: its share of budget and rate, its headroom sampler, its status file."""
    import gevent

    if ctx.prepared:
        return
    ctx.prepared = True
    _split(environment, ctx, time.monotonic_ns())
    ctx.sampler = sampler = Sampler(environment.runner)
    gevent.spawn(sampler.run)
    status_dir = os.environ.get(_STATUS_DIR_ENV)
    if status_dir:
        gevent.spawn(_status_loop, ctx, Path(status_dir) / f"{os.getpid()}.json")


def _split(environment, ctx: LoadContext, now: int) -> None:
    """This process's share of the point: worker i of N (Locust's worker index; N from --split-workers, which the
    master hands to every worker) gets its part of the request budget and rate/N of the arrivals."""
    from locust.runners import WorkerRunner

    from servesweep.workload.arrivals import Arrivals, split_budget

    p = ctx.point
    opts = environment.parsed_options
    runner = environment.runner
    split = int(getattr(opts, "split_workers", 0) or 0)
    count, index = 1, 0
    if isinstance(runner, WorkerRunner):
        # By hand (no --split-workers): the master's --expect-workers, which Locust hands to its workers too.
        count = max(1, split or int(getattr(opts, "expect_workers", 1) or 1))
        index = runner.worker_index
        if not split and not 0 <= index < count:
            log.warning(
                "servesweep: worker index %d but --expect-workers %d: this worker takes the whole budget and rate "
                "(give the master --split-workers N)",
                index,
                count,
            )
            count, index = 1, 0
    if not 0 <= index < count:
        # A worker that joined beyond the expected count (or reconnected): no share of budget or rate.
        log.error(
            "servesweep: worker index %d outside the %d expected workers; it sends nothing", index, count
        )
        ctx.budget = 0
        ctx.end_ns = 1
        index, count = 0, 1
    elif ctx.trace is not None:
        # A trace replay: this process's starts (whole sessions on one worker, by a stable hash of their id), its
        # budget the requests they hold (the trace's, whatever the point's `requests`). The schedule starts when the
        # first user asks for a start, as the open loop's does.
        ctx.trace_schedule = ctx.trace.schedule(index, count, start_ns=None)
        ctx.budget = sum(len(s.indices) for s in ctx.trace_schedule.starts)
    elif p.requests is not None and count > 1:
        ctx.budget = split_budget(p.requests, index, count)
    loop = "closed loop"
    if ctx.trace is not None:
        loop = f"trace replay at {ctx.trace.speed_up:g}x, {len(ctx.trace_schedule or ())} starts"
    elif p.arrival != "closed":
        assert p.rate_rps is not None  # LoadPoint: an open loop has a rate
        loop = f"{p.arrival} at {p.rate_rps / count:g}/s"
        if p.duration_s is not None and p.duration_s < _FOREVER:
            ctx.end_ns = ctx.end_ns or now + int((p.warmup_s + p.duration_s) * 1e9)
        # The schedule starts when the first user asks for a slot: slots that came while Locust was still spawning
        # the users would only show as lag of the first requests.
        ctx.arrivals = Arrivals(p.arrival, p.rate_rps, seed=p.seed, index=index, count=count, start_ns=None)
    if isinstance(runner, WorkerRunner):

        def _done() -> None:
            # The share is complete: ship every record now (the regular report may be 3 s away), then leave; the
            # master ends the point when its last worker has quit.
            send_stats_now(runner)
            runner.quit()

        ctx.on_budget_done = _done
    if ctx.trace is not None and ctx.budget == 0 and not ctx.quit_requested:
        # no session of the trace hashed to this worker: nothing will complete, so leave now
        import gevent

        ctx.quit_requested = True
        gevent.spawn_later(ctx.quit_delay_s, ctx.on_budget_done or runner.quit)
    log.info(
        "servesweep: worker %d of %d: budget %s, %s",
        index,
        count,
        ctx.share(),
        loop,
    )


def _status_loop(ctx: LoadContext, path: Path) -> None:
    import gevent

    while True:
        _write_status(ctx, path)
        gevent.sleep(0.25)  # what a killed process leaves is at most 0.25 s old


def _write_status(ctx: LoadContext, path: Path, **extra) -> None:
    write_atomic(path, json.dumps({**_counters(ctx), "unix": time.time(), **extra}), durable=False)


def _progress_loop(ctx: LoadContext, path: Path) -> None:
    import gevent

    while True:
        _write_progress(ctx, path)
        gevent.sleep(1.0)


def _write_progress(ctx: LoadContext, path: Path) -> None:
    write_atomic(
        path,
        json.dumps(
            {
                "issued": ctx.issued,
                "completed": ctx.completed,
                "failed": ctx.failed,
                "streamed_events": ctx.streamed_events,
            }
        ),
        durable=False,
    )


def _write_records(environment) -> Path | None:
    opts = environment.parsed_options
    ctx = getattr(environment, "servesweep", None)
    if ctx is None or opts is None or not opts.records:
        return None
    path = Path(opts.records)
    write_parquet(
        ctx.buffer.table(),
        path,
        metadata={"point_id": ctx.point.id, "point": ctx.point.model_dump_json()},
    )
    if isinstance(ctx, LoadContext):  # a local runner: its own counters and headroom
        clients = Clients()
        clients.update("local", {**_client_status(ctx, reset=False), "role": "local"})
        clients.write(path.with_name("clients.json"))
    elif isinstance(ctx, _MasterState):
        ctx.clients.note_exits()
        sampler = getattr(ctx, "sampler", None)
        if sampler is not None:
            ctx.clients.by_id.pop("master", None)
            ctx.clients.update(
                "master",
                {
                    "worker": f"master {socket.gethostname()}:{os.getpid()}",
                    "role": "master",
                    **sampler.take(reset=False),
                },
            )
        ctx.clients.write(path.with_name("clients.json"))
    return path


@events.test_stopping.add_listener
def _stopping(environment, **_kw) -> None:
    """A graceful stop (-t with a stop timeout, the UI's stop): the streams running finish, no new one starts (an
    open-loop user waiting for its slot would otherwise send once more and hold the stop up)."""
    ctx = getattr(environment, "servesweep", None)
    if isinstance(ctx, LoadContext):
        ctx.closing = True


@events.test_stop.add_listener
def _stop(environment, **_kw) -> None:
    from locust.runners import WorkerRunner

    if isinstance(environment.runner, WorkerRunner):
        return
    ctx = getattr(environment, "servesweep", None)
    opts = environment.parsed_options
    if isinstance(ctx, LoadContext) and opts is not None and opts.progress_file:
        _write_progress(ctx, Path(opts.progress_file))
    path = _write_records(environment)
    if path is not None:
        log.info("servesweep: %d records written to %s", len(environment.servesweep.buffer), path)
    from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner

    if path is not None and isinstance(environment.runner, MasterRunner):
        # Workers ship what finished during the stop with their next reports: write again once those are in
        # (the UI's master may not quit for a long time; a headless one writes again at quit as well).
        import gevent

        gevent.spawn_later(WORKER_REPORT_INTERVAL + 1.0, _write_records, environment)


@events.quitting.add_listener
def _quitting(environment, **_kw) -> None:
    from locust.runners import WorkerRunner

    ctx = getattr(environment, "servesweep", None)
    status_dir = os.environ.get(_STATUS_DIR_ENV)
    if status_dir and isinstance(ctx, LoadContext):
        _write_status(ctx, Path(status_dir) / f"{os.getpid()}.json", quit=True)
    if isinstance(environment.runner, WorkerRunner):
        return
    _write_records(
        environment
    )  # again: the master may have received the workers' final reports since test_stop
    opts = environment.parsed_options
    if opts is None or getattr(environment, "servesweep_abandoned", False):
        return  # EXIT_PARENT_GONE stands
    _slo_gate(environment, opts)
    _failure_gate(environment, opts)


def _slo_gate(environment, opts) -> None:
    if not opts.slo:
        return
    from servesweep.config.slo import parse_slos
    from servesweep.results.gates import GateError, evaluate_records

    ctx = environment.servesweep
    try:
        if all(s.per_request for s in parse_slos(opts.slo)):
            return  # per-request SLOs (ttft<=2s) shape goodput; there is no aggregate to gate on
        verdict = evaluate_records(ctx.buffer.table(), opts.slo, name=ctx.point.id if ctx.point else "locust")
    except (GateError, ValueError) as e:
        print(f"servesweep: SLO gate could not run: {e}")
        environment.process_exit_code = COULD_NOT_RUN
        return
    print(verdict.line, flush=True)
    if verdict.exit_code:
        environment.process_exit_code = verdict.exit_code  # 1 breach, 2 could not run


def never_answered(table) -> bool:
    """Every request failed before any response (no headers; refused, reset or timed out connecting): the server
    is down or the address is wrong, so nothing was measured (exit 2, not 3)."""
    if table.num_rows == 0 or "headers_ns" not in table.column_names:
        return False
    classes, headers = table.column("error_class").to_pylist(), table.column("headers_ns").to_pylist()
    return all(c in _NEVER_ANSWERED and h is None for c, h in zip(classes, headers, strict=True))


def failure_verdict(
    table, max_failure_rate: float | None, stop_timeout: float | None = None
) -> tuple[bool, str]:
    """(failed, message) for a headless run's records: failed when no measured request succeeded, or when more than
    `max_failure_rate` of them failed. The message says how many succeeded and which error classes the failures
    had, or, with no measured request at all, why there is none."""
    from collections import Counter

    warm = table.column("warmup").to_pylist()
    classes = [c for c, w in zip(table.column("error_class").to_pylist(), warm, strict=True) if not w]
    n, n_warm = len(classes), sum(1 for w in warm if w)
    if never_answered(table):
        first = next((m for m in table.column("error_message").to_pylist() if m), "")
        return True, (
            f"servesweep: COULD NOT RUN: the server never answered: {table.num_rows} of {table.num_rows} requests "
            f"failed before a response ({first}); check --host and that the server is up"
        )
    if n == 0:
        why = f"{n_warm} warmup request(s) finished and no measured one" if n_warm else "no request finished"
        if stop_timeout is not None and stop_timeout <= 0:
            why += (
                "; -s/--stop-timeout is 0, so the streams still running at the end were dropped: give -s longer"
                " than a request lasts"
            )
        else:
            why += " (the run ended before any stream did: a longer -t, or check the server and its log)"
        return True, f"servesweep: 0 records: {why}"
    failed = Counter(c for c in classes if c is not None)
    n_failed = sum(failed.values())
    line = f"{n - n_failed} of {n} measured requests succeeded"
    if failed:
        line += "; failures: " + ", ".join(f"{k} {v}" for k, v in failed.most_common())
    if n_failed == n:
        return True, f"servesweep: FAILED: no request succeeded: {line}"
    if max_failure_rate is not None and n_failed / n > max_failure_rate:
        return True, (
            f"servesweep: FAILED: {n_failed / n:.1%} of the requests failed, above --max-failure-rate "
            f"{max_failure_rate:.1%} (100% turns the check off): {line}"
        )
    if n_failed:
        # within the threshold, and still said loudly: the exit status alone would hide these
        limit = "none" if max_failure_rate is None else f"{max_failure_rate:.1%}"
        share = f"{n_failed / n:.1%} of the requests failed"
        return False, f"servesweep: WARNING: {share} (within --max-failure-rate {limit}): {line}"
    return False, f"servesweep: {line}"


def _failure_gate(environment, opts) -> None:
    """Plain headless Locust: never end with 0 records, or with every request failed, and exit 0. A process
    servesweep started (--point-json) is judged by servesweep on its side."""
    ctx = getattr(environment, "servesweep", None)
    if not getattr(opts, "headless", False) or opts.point_json or ctx is None:
        return
    rate = getattr(opts, "max_failure_rate", None)
    table = ctx.buffer.table()
    failed, msg = failure_verdict(table, rate, environment.stop_timeout)
    print(msg, file=sys.stderr, flush=True)
    if failed:
        environment.process_exit_code = COULD_NOT_RUN if never_answered(table) else EXIT_FAILURES
    elif rate is not None and environment.process_exit_code is None:
        # Within --max-failure-rate (always set: it has a default): Locust's any-failure rule
        # (--exit-code-on-error) does not apply, so plain Locust exits as `servesweep load` does.
        environment.process_exit_code = 0
