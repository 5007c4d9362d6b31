"""The client exporter's Locust side: feeds a `ClientMetrics` (observe/exporter.py) from a Locust process's events
(request records, worker reports) and serves its `/metrics` (on the web UI's app, or on a port of its own)."""

from __future__ import annotations

from collections.abc import Mapping

from servesweep.client.messages import RECORD_CONTEXT_KEY, RECORDS_REPORT_KEY
from servesweep.observe.exporter import ClientMetrics, loadpoint_axes


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
      LoadPoint servesweep's locustfile put on the environment (its id, and axes from its fields and labels).
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
    if serve is not None:
        metrics.serve(*serve)


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

    def _ctx_point(self):
        ctx = getattr(self.environment, "servesweep", None)  # set by servesweep's locustfile at init
        return getattr(ctx, "point", None)

    def _pid(self):
        lp = self._ctx_point()
        return self.point_id or (lp.id if lp is not None else None), lp

    def start(self, **_kw) -> None:
        pid, lp = self._pid()
        if pid is not None:
            self.metrics.point_started(pid, self.axes if self.axes is not None else loadpoint_axes(lp))

    def stop(self, **_kw) -> None:
        pid, _ = self._pid()
        if pid is not None and self.metrics.has_point(pid):
            self.metrics.point_finished(pid)

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
        import logging

        import gevent

        seen_ctx, seen = None, 0
        while not self.via_context:
            gevent.sleep(1.0)
            try:
                ctx = getattr(self.environment, "servesweep", None)
                buf = getattr(ctx, "buffer", None)
                if buf is None or self.via_context:
                    continue
                if ctx is not seen_ctx:
                    seen_ctx, seen = ctx, 0
                rows, seen = buf.rows_since(seen)
                for row in rows:
                    self.observe(row)
            except Exception:  # noqa: BLE001 - metrics must never take the load test down
                logging.getLogger("servesweep").exception("servesweep exporter: reading records failed")
