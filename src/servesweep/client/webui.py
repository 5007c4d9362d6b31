"""servesweep inside Locust's web UI: live LLM tabs, step ramps, the per-step CSV, the exporter beside it.

Importing this module (locustfiles/llm.py does) registers it on Locust's `init` event. Then, per process:
- workers and the local runner fold each finished request into a `live.LiveStats` and sample their own headroom;
  a worker ships its delta and headroom with every report, and the master merges them;
- the master (or local runner) keeps the steps of the test (`shapes.StepLog`), runs the `StepRamp` shape when
  `--load-shape step-ramp` is chosen on the command line or in the start form, and serves:
  tabs "LLM" (TTFT/ITL per chunk/ITL per token/TPOT/E2E/per-request tok/s quantiles, output tok/s, errors by class, goodput and SLO
  checks of --slo), "LLM clients" (users, CPU and event-loop lag of each process) and "LLM steps" (each step's
  row of `servesweep load`'s table), refreshed by the UI every 2 s while a test runs (through `extended_stats`
  in `/stats/requests`; after a stop, reload the page for the final numbers); `/servesweep/steps.csv` (the
  per-step table, linked from "Download Data"); `/servesweep/live.json` (the same numbers as JSON); and
  `/metrics` (servesweep.observe.exporter) so Prometheus/Grafana see the same run; and the charts (client/charts.py:
  an "LLM charts" button in Locust's top bar opens time series of TTFT, ITL (per chunk and per token), tok/s and streams in flight, and the
  per-step charts over concurrency with the step table under them).
- the start form carries the ramp's options and every knob of a load point (config.point.knobs: load shape,
  prompt & output, workload, timeouts, advanced, in that order) and --slo, in that order under one heading per
  group (`/servesweep/form.json`, drawn by ui.js), showing the values of the last start (after NEW and a reload);
  a run started with other LLM options than the process was built for gets its prompt bodies built again at test
  start (on each worker). docs/webui.md describes what a user sees.

Where a finished request's record comes from: the request event's `context[RECORD_CONTEXT_KEY]` when the user puts
it there; until then, on a worker, the record batches the locustfile ships to the master with each report, and in
the local runner, the new rows of the process's record buffer, read once a second.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from locust import events

from servesweep.client import shapes
from servesweep.client.context import build_context
from servesweep.client.live_stats import LATENCIES, Headroom, LiveStats
from servesweep.client.locust_internals import validate_shape
from servesweep.client.messages import LIVE_REPORT_KEY as LIVE_KEY
from servesweep.client.messages import RECORD_CONTEXT_KEY, RECORDS_REPORT_KEY
from servesweep.client.options import GroupedArguments, point_from_options
from servesweep.client.plugin import install, use_load
from servesweep.client.state import ClientState, client_state

if TYPE_CHECKING:
    from servesweep.config.point import LoadPoint
    from servesweep.results.records import RecordBuffer

log = logging.getLogger("servesweep")

STEPS_CSV_PATH = "/servesweep/steps.csv"
LIVE_JSON_PATH = "/servesweep/live.json"
FORM_JSON_PATH = "/servesweep/form.json"
GROUP_PREFIX = re.compile(r"^\[([^\]]+)\] ")  # "[load shape] ...": the group the locustfile put an option in
UNGROUPED = "SLO"  # the heading of the form's options without a group (--slo)
STEPS_REFRESH_S = 5.0  # the steps tab re-summarizes the records at most this often

LLM_TABLE = [
    {"key": "metric", "title": "Metric"},
    {"key": "p50", "title": "p50"},
    {"key": "p90", "title": "p90"},
    {"key": "p99", "title": "p99"},
    {"key": "mean", "title": "mean"},
    {"key": "count", "title": "count"},
    {"key": "value", "title": "value"},
]
CLIENTS_TABLE = [
    {"key": "process", "title": "Process"},
    {"key": "users", "title": "Users"},
    {"key": "cpu", "title": "CPU % (one core)"},
    {"key": "lag_p99", "title": "loop lag p99 ms"},
    {"key": "lag_max", "title": "loop lag max ms"},
    {"key": "age", "title": "sampled s ago"},
]


# servesweep's listeners first, as the web UI module's entry (its records shipping runs before ours); then ours.
install(ui_module=True)


@events.init_command_line_parser.add_listener
def _args(parser) -> None:
    # the point's knobs and the ramp are in the start form already (plugin.install added them, the ramp first)
    GroupedArguments(parser).add_argument(
        "--metrics-port",
        type=int,
        default=0,
        include_in_web_ui=False,
        help="also serve the client Prometheus metrics on this port of 127.0.0.1 (0: only /metrics of the UI)",
    )


class LiveState:
    """servesweep's live state of one Locust process (the ClientState's `live`)."""

    def __init__(self, environment, cs: ClientState) -> None:
        self.environment = environment
        self.cs = cs
        self.is_worker = cs.is_worker
        self.is_master = cs.is_master
        self.slos: list = []  # summary.SLO of --slo / the form's slo
        self.stats = LiveStats()  # worker: the delta since the last report; else: the whole test
        self.headroom: dict[str, dict] = {}  # process -> latest sample (master/local)
        self.sampler = Headroom()
        self.steplog = shapes.StepLog()
        self.via_context = False
        self.requested: LoadPoint | None = (
            None  # the LoadPoint the process's context was built for (before resolving)
        )
        self._pulled = 0
        self._pulled_buffer: RecordBuffer | None = None
        self.summarizer = shapes.StepSummarizer()
        self._steps_cache: tuple[float, float, list[dict]] | None = None  # (when, seconds it took, rows)

    # ------------------------------------------------------------ records in

    def on_request(self, context=None, **_kw) -> None:
        rec = context.get(RECORD_CONTEXT_KEY) if context else None
        if rec is not None:
            self.via_context = True
            self.stats.add_record(rec)

    def on_report(self, client_id, data, **_kw) -> None:  # worker
        if not self.via_context:
            cols = data.get(RECORDS_REPORT_KEY)
            if cols:
                self.stats.add_columns(cols)
        runner = self.environment.runner
        load = self.cs.load
        data[LIVE_KEY] = {
            "stats": self.stats.payload(),
            "headroom": {
                **self.sampler.take(),
                "users": runner.user_count,
                "process": load.worker if load is not None else client_id,
                # streams open now: the master's "streams in flight" chart sums them
                "in_flight": self.cs.in_flight,
            },
        }
        self.stats = LiveStats(self.slos)

    def on_worker_report(self, client_id, data, **_kw) -> None:  # master
        d = data.get(LIVE_KEY)
        if not d:
            return
        self.stats.merge_payload(d["stats"])
        self.headroom[client_id] = d["headroom"]

    def pull_local(self) -> None:
        """Local runner without the context hook: fold in the rows the buffer gained since the last call."""
        if self.via_context:
            return
        buf = self.cs.buffer
        if buf is not self._pulled_buffer:
            self._pulled_buffer, self._pulled = buf, 0
        rows, self._pulled = buf.rows_since(self._pulled)
        for r in rows:
            self.stats.add_record(r)

    def _pull_loop(self) -> None:
        import gevent

        while True:
            gevent.sleep(1.0)
            try:
                self.pull_local()
            except Exception:  # noqa: BLE001 - the live view must never take the test down
                log.exception("servesweep: live stats update failed")

    def set_slos(self, text: str) -> None:
        from servesweep.config.slo import parse_slos

        self.slos = parse_slos(text or "")

    def reset(self) -> None:
        """A new test (or Locust's reset): no numbers of the one before, not even its last requests, which reach
        the local buffer after the stop and would otherwise be pulled into the new test's first second."""
        self.stats = LiveStats(self.slos)
        self._steps_cache = None
        if self._pulled_buffer is not None:
            self._pulled = len(self._pulled_buffer)

    # ------------------------------------------------------------ numbers out

    def sample_self(self) -> None:
        if not self.is_worker:
            name = "master" if self.is_master else "local"
            self.headroom[name] = {
                **self.sampler.take(),
                "users": self.environment.runner.user_count,
                "process": name,
            }

    def snapshot(self) -> dict:
        from locust.runners import WORKER_REPORT_INTERVAL

        lag = WORKER_REPORT_INTERVAL + 1.0 if self.is_master else 1.0
        if not self.is_master:
            self.pull_local()
        now = time.time()
        self.stats.prune(now)
        snap = self.stats.snapshot(now, lag)
        snap["slo_checks"] = slo_checks(self.slos, snap)
        return snap

    def step_summaries(self, live: bool = False) -> list[dict]:
        """Each step's summary from the records.

        live (the UI's 2 s poll): in a local runner only the closed steps, since summarizing the open one
        blocks the event loop that also times the streams; on a master at most every STEPS_REFRESH_S, or
        rarer when a refresh is slow (it summarizes ~8k streamed requests a second), so that the master keeps
        up with its workers' reports and heartbeats.
        """
        buf = self.cs.buffer
        now = time.monotonic()
        c = self._steps_cache
        if live and c is not None and now - c[0] < max(STEPS_REFRESH_S, 20.0 * c[1]):
            return c[2]
        out = self.summarizer.summaries(
            buf, list(self.steplog.steps), include_open=not live or self.is_master
        )
        self._steps_cache = (now, time.monotonic() - now, out)
        return out


def _fmt(v, nd: int = 1) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def llm_rows(snap: dict) -> list[dict]:
    rows = []
    for k, title in LATENCIES.items():
        st = snap["latency"][k]
        nd = 1 if k == "decode_tps" else 2
        rows.append(
            {
                "metric": title,
                "p50": _fmt(st["p50"], nd),
                "p90": _fmt(st["p90"], nd),
                "p99": _fmt(st["p99"], nd),
                "mean": _fmt(st["mean"], nd),
                "count": str(st["n"]),
                "value": "",
            }
        )
    req = snap["requests"]
    rec = snap["recent"]
    scalars = [
        ("output tok/s (last 10 s)", _fmt(rec["output_tps"])),
        ("output tok/s (run)", _fmt(snap["output_tps"])),
        ("requests/s (last 10 s)", _fmt(rec["request_rate"], 2)),
        ("requests ok", str(req["ok"])),
        ("requests failed", str(req["failed"])),
        ("requests warmup (not counted)", str(req["warmup"])),
        ("output tokens", str(snap["output_tokens"])),
        ("completion tokens / request", _fmt(snap["completion_tokens_mean"])),
        ("prompt tokens / request (server)", _fmt(snap["prompt_tokens_mean"])),
    ]
    scalars += [(f"errors: {k}", str(v)) for k, v in snap["errors"].items()] or [("errors", "0")]
    gp = snap["goodput"]
    if gp is not None:
        ratio = "" if gp["ratio"] is None else f"{gp['ratio'] * 100:.1f}%"
        per_s = "" if gp["per_s"] is None else f"{gp['per_s']:.2f}/s"
        scalars.append((f"goodput ({', '.join(gp['slos'])})", f"{gp['requests']} req, {ratio}, {per_s}"))
    for c in snap.get("slo_checks", ()):
        v = "-" if c["value"] is None else f"{c['value']:.4g}"
        scalars.append((f"SLO {c['slo']}", f"{v} {'PASS' if c['pass'] else 'FAIL'}"))
    for name, v in scalars:
        rows.append({"metric": name, "p50": "", "p90": "", "p99": "", "mean": "", "count": "", "value": v})
    return rows


def slo_checks(slos, snap: dict) -> list[dict]:
    """Each aggregate SLO (a percentile, a rate) against the live value; per-request ones make the goodput."""
    req = snap["requests"]
    n = req["ok"] + req["failed"]
    w = snap["window_s"]
    gp = snap["goodput"]
    out = []
    scalars = {
        "error_rate": req["failed"] / n if n else None,
        "output_tokens_per_s": snap["output_tps"],
        "request_rate": req["ok"] / w if w else None,
        "goodput_ratio": gp["ratio"] if gp else None,
    }
    for x in slos:
        if x.per_request:
            continue
        if x.stat is not None:
            v = snap["latency"].get(f"{x.metric.base}_ms", {}).get(x.stat)
        else:
            # a figure the live snapshot does not keep (cache_hit_ratio ...): no verdict
            v = scalars.get(x.name)
        out.append({"slo": x.text, "value": v, "pass": v is not None and x.holds(v)})
    return out


def client_rows(headroom: dict[str, dict]) -> list[dict]:
    now = time.time()
    rows = []
    for _cid, h in sorted(headroom.items(), key=lambda kv: str(kv[1].get("process"))):
        rows.append(
            {
                "process": str(h.get("process")),
                "users": str(h.get("users", "")),
                "cpu": _fmt(h.get("cpu_percent")),
                "lag_p99": _fmt(h.get("loop_lag_p99_ms"), 2),
                "lag_max": _fmt(h.get("loop_lag_max_ms"), 2),
                "age": _fmt(now - h["t"]),
            }
        )
    return rows


def step_rows(summaries: list[dict]) -> list[dict]:
    # keys c0, c1, ...: the UI camel-cases keys, and the titles are free text
    return [{f"c{i}": v for i, v in enumerate(row)} for row in shapes.step_rows(summaries)]


# ---------------------------------------------------------------- wiring


def _same_request(a, b) -> bool:
    """Same LoadPoint apart from the user count (which the form changes without new prompt bodies)."""
    if a is None or b is None:
        return False
    return a.model_dump(exclude={"concurrency"}) == b.model_dump(exclude={"concurrency"})


def _apply_form_options(environment, state: LiveState) -> None:
    """Build the point's context anew when the start form changed the LLM options since it was built.

    Locust copies the form's values into parsed_options (and, for workers, sends them with the first spawn
    message) just before test_start; the locustfile built its context at init from the command line.
    """
    opts = environment.parsed_options
    cs = state.cs
    state.set_slos(opts.slo)
    state.reset()
    wanted = point_from_options(opts, environment.host or opts.host)
    if state.is_master:
        cs.point = wanted
        return
    if _same_request(wanted, state.requested):
        return
    log.info("servesweep: options changed in the start form; building the prompt bodies again")
    old = cs.load  # None: a spawn came while the init still probes
    assert wanted is not None  # a worker has its master's host by now, a local runner its own
    load = build_context(wanted)
    if old is not None:
        load.quit_delay_s = old.quit_delay_s
        if not state.is_worker and len(old.buffer):
            load.buffer = old.buffer  # the local runner's records file keeps every run of the session
    load.measure_start_ns = time.monotonic_ns() + int(load.point.warmup_s * 1e9)
    use_load(environment, cs, load)
    state.requested = wanted


def _install_shape(environment, state: LiveState, opts, where: str) -> None:
    """Use StepRamp for the next run if the options ask for it, else no shape (manual user count)."""
    if opts.load_shape == "step-ramp":
        shapes.check_ramp_options(opts, where)
        shape = shapes.StepRamp(environment, state.steplog)
        environment.shape_class = shape
    else:
        environment.shape_class = None
    validate_shape(environment)


def _form_options(form, opts):
    """The options a /swarm form sets, converted as Locust converts them, without touching parsed_options."""
    from argparse import Namespace

    d = dict(vars(opts))
    for k, v in form.items():
        if k not in d:
            continue
        cur = d[k]
        if isinstance(cur, bool):
            d[k] = v == "true"
        elif cur is None or isinstance(cur, list):
            d[k] = v
        else:
            d[k] = type(cur)(v)
    return Namespace(**d)


def camel_case(dest: str) -> str:
    """An option's name in the start form (Locust's UI camel-cases every key: ramp_steps -> rampSteps)."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), dest)


def form_groups(extra_options: dict[str, dict]) -> list[dict]:
    """The start form's parameters by group, in the order the locustfile added them (the ramp first), each group
    named by its options' help prefix ("[load shape] ..." under "Load shape"): [{"title", "names": [form names]}]."""
    groups: dict[str, list[str]] = {}
    for dest, o in extra_options.items():
        m = GROUP_PREFIX.match(o.get("help_text") or "")
        groups.setdefault(m.group(1).capitalize() if m else UNGROUPED, []).append(camel_case(dest))
    return [{"title": title, "names": names} for title, names in groups.items()]


def form_options(extra_options: dict[str, dict], current: dict) -> dict[str, dict]:
    """The start form's parameters as this process runs them now (the last start's values, which Locust wrote into
    parsed_options, not the command line's: a reload shows what the last test ran), labels without the group
    prefix (ui.js shows the groups as headings)."""
    out = {}
    for dest, o in extra_options.items():
        shown = dict(o)
        if dest in current:
            shown["default_value"] = current[dest]
        shown["help_text"] = GROUP_PREFIX.sub("", o.get("help_text") or "")
        out[dest] = shown
    return out


def _install_form(environment) -> None:
    """The start form in the order the parameters were added (Flask's JSON sorted them by name), with the values
    of the last start and Locust's fields usable after a step ramp, and /servesweep/form.json (the groups, for
    ui.js)."""
    from flask import jsonify
    from locust.argument_parser import ui_extra_args_dict

    web_ui = environment.web_ui
    # the page's template args (Jinja's tojson) and the JSON routes keep their keys' order
    web_ui.app.jinja_env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    web_ui.app.json.sort_keys = False
    update = web_ui.update_template_args

    def update_template_args() -> None:
        update()
        args = web_ui.template_args
        args["extra_options"] = form_options(
            args.get("extra_options") or {}, vars(environment.parsed_options)
        )
        # Locust disables the users and spawn rate fields while a shape is installed, and the last step ramp's
        # stays installed after it ends: the next test could not be given users. Between tests the form's
        # load_shape decides the shape of the next start (_swarm_shape; ui.js makes the users field read-only
        # while it says step-ramp); during a ramp, Locust's edit form keeps them disabled.
        if environment.runner.state not in ("spawning", "running"):
            args["hide_common_options"] = False

    web_ui.update_template_args = update_template_args

    @web_ui.auth_required_if_enabled
    def form_json():
        return jsonify({"groups": form_groups(ui_extra_args_dict())})

    base = (getattr(environment.parsed_options, "web_base_path", "") or "").rstrip("/")
    web_ui.app.add_url_rule(base + FORM_JSON_PATH, "servesweep_form_json", form_json)


def _install_web_ui(environment, state: LiveState) -> None:
    """The LLM tabs, the start form's check of the shape and the LLM options, and servesweep's two routes."""
    from flask import jsonify, request

    from servesweep.config.slo import parse_slos

    _add_tabs(environment.web_ui)
    app = environment.web_ui.app

    @app.before_request
    def _swarm_shape():
        # The form's load_shape decides the shape of the run it starts; an edit of a running test (no
        # load_shape field) keeps what runs. Bad ramp values are refused here with a message the form shows.
        if (
            request.method != "POST"
            or not request.path.endswith("/swarm")
            or "load_shape" not in request.form
        ):
            return None
        if environment.runner.state in ("spawning", "running"):
            return None
        try:
            o = _form_options(request.form, environment.parsed_options)
            _install_shape(environment, state, o, "start form:")
            point_from_options(
                o, request.form.get("host") or environment.host
            )  # a bad LLM option: refused here
            parse_slos(o.slo or "")
        except (ValueError, TypeError) as e:
            environment.shape_class = None
            return jsonify({"success": False, "message": f"servesweep: {e}", "host": environment.host})
        return None

    @app.after_request
    def _extend_stats(response):
        if request.path.endswith("/stats/requests") and response.is_json:
            try:
                state.sample_self()
                ext = [
                    {"key": "llm", "data": llm_rows(state.snapshot())},
                    {"key": "llm_clients", "data": client_rows(state.headroom)},
                    {"key": "llm_steps", "data": step_rows(state.step_summaries(live=True))},
                ]
                response.set_data(json.dumps({**response.json, "extended_stats": ext}))
            except Exception:  # noqa: BLE001 - Locust's own stats must still reach the page
                log.exception("servesweep: live LLM stats failed")
        return response

    _add_routes(environment, state)
    _install_form(environment)
    _install_charts(environment, state)


def _install_charts(environment, state: LiveState) -> None:
    """The charts page and its time series (client/charts.py), sampled every 2 s while a test runs."""
    import gevent
    from locust.runners import WORKER_REPORT_INTERVAL

    from servesweep.client import charts

    series = charts.Series()
    state.cs.series = series
    lag = WORKER_REPORT_INTERVAL + 1.0 if state.is_master else 1.0
    environment.events.test_start.add_listener(lambda **_k: series.reset())
    gevent.spawn(
        charts.sample_loop, environment, series, lambda: state.stats.recent(time.time(), lag)["output_tps"]
    )
    charts.add_routes(environment, series)


def _add_tabs(web_ui) -> None:
    web_ui.template_args["extended_tabs"] = [
        {"title": "LLM", "key": "llm"},
        {"title": "LLM clients", "key": "llm_clients"},
        {"title": "LLM steps", "key": "llm_steps"},
    ]
    web_ui.template_args["extended_tables"] = [
        {"key": "llm", "structure": LLM_TABLE},
        {"key": "llm_clients", "structure": CLIENTS_TABLE},
        {
            "key": "llm_steps",
            "structure": [{"key": f"c{i}", "title": c} for i, c in enumerate(shapes.step_columns())],
        },
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "." + STEPS_CSV_PATH, "title": "Download LLM per-step summary CSV"},
    ]


def _add_routes(environment, state: LiveState) -> None:
    """/servesweep/steps.csv and /servesweep/live.json, under --web-base-path like Locust's own routes."""
    from flask import Response, jsonify

    web_ui = environment.web_ui

    @web_ui.auth_required_if_enabled
    def steps_csv():
        body = shapes.steps_csv(state.step_summaries())
        return Response(
            body,
            mimetype="text/csv",
            headers={"Content-Disposition": "attachment; filename=servesweep_steps.csv"},
        )

    @web_ui.auth_required_if_enabled
    def live_json():
        summaries = state.step_summaries()
        return jsonify(
            {
                "live": state.snapshot(),
                "headroom": state.headroom,
                "steps": [
                    {**dict(zip(shapes.step_columns(), row, strict=True)), **s["step"], **s["point"]}
                    for s, row in zip(summaries, shapes.step_rows(summaries), strict=True)
                ],
                "shape": type(environment.shape_class).__name__ if environment.shape_class else None,
            }
        )

    # Locust's own routes sit under --web-base-path (a Blueprint); ones added to the app do not, so add it here.
    base = (getattr(environment.parsed_options, "web_base_path", "") or "").rstrip("/")
    web_ui.app.add_url_rule(base + STEPS_CSV_PATH, "servesweep_steps_csv", steps_csv)
    web_ui.app.add_url_rule(base + LIVE_JSON_PATH, "servesweep_live_json", live_json)


def _install_exporter(environment, opts) -> None:
    try:
        from servesweep.client.exporter_feed import install_locust
        from servesweep.observe.exporter import ClientMetrics
    except ImportError:  # the observability part is optional for the UI
        return
    metrics = ClientMetrics(time.strftime("locust-%Y%m%dT%H%M%SZ", time.gmtime()))
    # point_id left to the exporter: it takes the point of environment.servesweep at each test start
    install_locust(
        environment, metrics, serve=("127.0.0.1", opts.metrics_port) if opts.metrics_port else None
    )
    cs = client_state(environment)
    if cs is not None:
        cs.metrics = metrics


def _write_steps_csv(environment, state: LiveState) -> None:
    path = environment.parsed_options.steps_csv
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    summaries = state.step_summaries()
    p.write_text(shapes.steps_csv(summaries))
    log.info("servesweep: per-step summary of %d steps written to %s", len(summaries), p)


@events.init.add_listener
def _init(environment, **_kw) -> None:
    import gevent
    from locust.runners import WORKER_REPORT_INTERVAL

    opts = environment.parsed_options
    cs = client_state(environment)  # made by servesweep's init listener, which runs before this one
    if opts is None or environment.runner is None or cs is None:
        return
    state = cs.live = LiveState(environment, cs)
    ev = environment.events
    # First of our test_start listeners: the exporter's, added below, reads the point this may replace.
    ev.test_start.add_listener(lambda **_k: _apply_form_options(environment, state))
    state.sampler.start()
    if not state.is_master:
        state.requested = point_from_options(opts, environment.host or opts.host)
        ev.request.add_listener(state.on_request)
    if state.is_worker:
        ev.report_to_master.add_listener(state.on_report)
    else:
        state.steplog.attach(environment)
        ev.test_start.add_listener(lambda **_k: state.reset())
        ev.reset_stats.add_listener(lambda **_k: state.reset())
        # A worker ships what finished during the stop with its next periodic report, not at once: write then.
        delay = WORKER_REPORT_INTERVAL + 1.0 if state.is_master else 0.0
        ev.test_stop.add_listener(
            lambda **_k: gevent.spawn_later(delay, _write_steps_csv, environment, state)
        )
        ev.quitting.add_listener(lambda **_k: _write_steps_csv(environment, state))  # records arrived since
        try:
            _install_shape(environment, state, opts, "command line:")
            state.set_slos(opts.slo)
        except ValueError as e:
            raise SystemExit(f"servesweep: {e}") from None
        _install_exporter(environment, opts)
    if state.is_master:
        ev.worker_report.add_listener(state.on_worker_report)
    elif not state.is_worker:
        gevent.spawn(state._pull_loop)
    if not state.is_worker:
        # The first Arrow table from Python lists imports pandas (2.5 s here): pay it now, not mid-test.
        from servesweep.results.records import RecordBuffer
        from servesweep.results.summary import summarize

        summarize(RecordBuffer().table())
    if environment.web_ui is not None:
        _install_web_ui(environment, state)
