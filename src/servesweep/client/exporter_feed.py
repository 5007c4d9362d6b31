"""The client exporter's Locust side: feeds a `ClientMetrics` (observe/exporter.py) from a Locust process's events
(request records, worker reports), serves its `/metrics` (on the web UI's app, or on a port of its own), sets the
point's summary gauges at each test stop, and registers the process in the observe stack when one is set up (so a
`locust -f locustfiles/llm.py` started by hand shows in Grafana's Live, Matrix and History dashboards)."""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from servesweep.client.messages import RECORD_CONTEXT_KEY, RECORDS_REPORT_KEY
from servesweep.observe.exporter import ClientMetrics, loadpoint_axes
from servesweep.observe.stackdir import stack_present
from servesweep.observe.targets import RunTargets, last_scrape


def install_locust(
    environment,
    metrics: ClientMetrics,
    *,
    serve: tuple[str, int] | None = None,
    point_id: str | None = None,
    axes: Mapping[str, object] | None = None,
) -> None:
    """Feed `metrics` from a Locust process's events and expose it. Call from an `events.init` listener.

    - local runner: each request event whose `context` holds the record under RECORD_CONTEXT_KEY is observed;
      until one does, the rows servesweep's record buffer gains are observed once a second;
    - master: each worker report's RECORDS_REPORT_KEY batch (the records the workers ship) is observed;
    - users: read from the runner at scrape time (works for local and master runners);
    - web UI mode: `/metrics` is added to the web UI's Flask app; `serve=(host, port)` also serves it on its own port
      (what a headless master needs);
    - the point is started at test start and finished at test stop: `point_id`/`axes` when given, else the
      LoadPoint servesweep's locustfile put on the environment (its id, and axes from its fields and labels); at
      the stop its summary (results/summary.py over the test's records) becomes the `servesweep_point_*` gauges;
    - observe stack: a process not started by servesweep registers its exporter in the stack's targets folder when
      a stack is set up (observe/stackdir.py stack_present), on `serve`'s port or else a free port of 127.0.0.1; the
      file goes at exit, and a headless process waits (bounded) for the stack's Prometheus to scrape its last
      summary before it exits (docs/observability.md, "Locust processes").
    """
    from locust.runners import LocalRunner, WorkerRunner

    if isinstance(environment.runner, WorkerRunner):
        return  # workers ship records to the master; the master exposes them
    feed = _Feed(environment, metrics, point_id, axes)
    events = environment.events
    metrics.set_users(lambda: environment.runner.user_count if environment.runner is not None else 0)
    events.test_start.add_listener(feed.start)
    events.test_stop.add_listener(feed.stop)
    events.request.add_listener(feed.request)
    events.worker_report.add_listener(feed.worker_report)
    if isinstance(environment.runner, LocalRunner):
        import gevent

        gevent.spawn(feed.pull_loop)
    web_ui = getattr(environment, "web_ui", None)
    if web_ui is not None:
        web_ui.app.add_url_rule("/metrics", "servesweep_metrics", lambda: _metrics_response(metrics))
    port = metrics.serve(*serve) if serve is not None else None
    if _registers_itself(environment):
        _register_in_stack(environment, metrics, feed, port)


def _registers_itself(environment) -> bool:
    """A Locust started by hand registers itself; one servesweep started (--point-json) does not: its records
    reach the run's own exporter (servesweep run, servesweep load), which is registered for the run."""
    opts = environment.parsed_options
    return not (opts is not None and getattr(opts, "point_json", None)) and stack_present()


def _register_in_stack(environment, metrics: ClientMetrics, feed: _Feed, port: int | None) -> None:
    """Register this process's /metrics under its run id (one file per process), remove it at exit."""
    if port is None:
        port = metrics.serve("127.0.0.1", 0)  # no port asked for: a free one, only for the stack's Prometheus
    targets = RunTargets(metrics.run_id)
    path = targets.exporter(f"127.0.0.1:{port}", role=f"pid{os.getpid()}")
    logging.getLogger("servesweep").info("servesweep: client metrics registered for Prometheus in %s", path)
    headless = bool(getattr(environment.parsed_options, "headless", False))
    environment.events.quitting.add_listener(lambda **_k: _quit(feed, targets, headless))
    atexit.register(targets.close)  # an exit without Locust's quitting event (SIGKILL: stackdir.sweep_stale)


def _quit(feed: _Feed, targets: RunTargets, headless: bool) -> None:
    """At quit: the last summary with every record in, a last scrape of it when headless, then unregister."""
    try:
        feed.finish()
        if headless and feed.reads_at_finish is not None:
            last_scrape(feed.metrics, feed.reads_at_finish)
    finally:
        targets.close()


def summary_since(environment, since_unix: float | None) -> dict | None:
    """The summary (results/summary.py) of the records this process holds from requests sent since `since_unix`
    (this test's: the web UI's record buffer spans every test of its session), with --slo's SLOs; None without
    records."""
    import numpy as np
    import pyarrow as pa

    from servesweep.results.summary import summarize

    buf = getattr(getattr(environment, "servesweep", None), "buffer", None)
    if buf is None or len(buf) == 0:
        return None
    table = buf.table()
    if since_unix is not None:

        def col(name: str) -> np.ndarray:
            return table.column(name).to_numpy(zero_copy_only=False).astype(np.int64)

        table = table.filter(pa.array(col("sent_ns") + col("mono_to_wall_ns") >= int(since_unix * 1e9)))
    if table.num_rows == 0:
        return None
    slos = getattr(environment.parsed_options, "slo", "") or None
    try:
        return summarize(table, slos)
    except ValueError:  # a bad --slo was reported by the locustfile already: the summary without SLOs
        return summarize(table)


def _metrics_response(metrics: ClientMetrics):
    from flask import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(metrics.text(), mimetype=None, content_type=CONTENT_TYPE_LATEST)


class _Feed:
    """The Locust event listeners that feed one ClientMetrics: point start/stop, records from request events,
    from worker reports, or (a user that does not put records in the request context) from the record buffer."""

    def __init__(self, environment, metrics: ClientMetrics, point_id, axes) -> None:
        self.environment = environment
        self.metrics = metrics
        self.point_id = point_id
        self.axes = axes
        self.via_context = False
        self.started_unix: float | None = None  # wall clock of the test start: which records are this test's
        self.finished_id: str | None = None  # the point this feed finished last (its summary is the gauges)
        self.reads_at_finish: int | None = None  # metrics.reads when that summary was set

    def _ctx_point(self):
        ctx = getattr(
            self.environment, "servesweep", None
        )  # state.ClientState, made at init (client/plugin.py)
        return getattr(ctx, "point", None)

    def _pid(self):
        lp = self._ctx_point()
        return self.point_id or (lp.id if lp is not None else None), lp

    def start(self, **_kw) -> None:
        self.started_unix = time.time()
        pid, lp = self._pid()
        if pid is not None:
            self.metrics.point_started(pid, self.axes if self.axes is not None else loadpoint_axes(lp))

    def stop(self, **_kw) -> None:
        pid, _ = self._pid()
        if pid is None or not self.metrics.has_point(pid):
            return
        self.finished_id = pid
        self.finish()
        from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner

        if isinstance(self.environment.runner, MasterRunner):
            # workers ship what finished during the stop with their next report: summarize again once it is in
            import gevent

            gevent.spawn_later(WORKER_REPORT_INTERVAL + 1.0, self.finish)

    def finish(self) -> None:
        """The finished point's summary gauges from every record of its test the process holds now."""
        if self.finished_id is None:
            return
        try:
            summary = summary_since(self.environment, self.started_unix)
        except Exception:  # noqa: BLE001 - metrics must never take the load test down
            logging.getLogger("servesweep").exception("servesweep exporter: the point's summary failed")
            summary = None
        self.metrics.point_finished(self.finished_id, summary)
        self.reads_at_finish = self.metrics.reads

    def observe(self, rec: Mapping) -> None:
        # Never let a metrics problem break a load test: a record of a point nobody announced starts that point.
        pid = rec.get("point_id")
        if pid and not self.metrics.has_point(pid):
            self.metrics.point_started(pid, loadpoint_axes(self._ctx_point()))
        self.metrics.observe(rec)

    def request(self, context=None, **_kw) -> None:
        rec = context.get(RECORD_CONTEXT_KEY) if context else None
        if rec is not None:
            self.via_context = True
            self.observe(rec)

    def worker_report(self, client_id=None, data=None, **_kw) -> None:
        cols = (data or {}).get(RECORDS_REPORT_KEY)
        if not cols:
            return
        names = list(cols)
        for row in zip(*(cols[n] for n in names), strict=True):
            self.observe(dict(zip(names, row, strict=True)))

    def pull_loop(self) -> None:
        """Local runner whose user does not put records in the request context: once a second, observe the rows
        servesweep's record buffer gained (it only grows in a local runner)."""
        import gevent

        seen_buf: Any = None
        seen = 0
        while not self.via_context:
            gevent.sleep(1.0)
            try:
                buf = getattr(getattr(self.environment, "servesweep", None), "buffer", None)
                if buf is None or self.via_context:
                    continue
                if buf is not seen_buf:  # a new load with a buffer of its own
                    seen_buf, seen = buf, 0
                rows, seen = buf.rows_since(seen)
                for row in rows:
                    self.observe(row)
            except Exception:  # noqa: BLE001 - metrics must never take the load test down
                logging.getLogger("servesweep").exception("servesweep exporter: reading records failed")
