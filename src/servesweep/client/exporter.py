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
    from locust.runners import WorkerRunner

    if isinstance(environment.runner, WorkerRunner):
        return  # workers ship records to the master; the master exposes them
    events = environment.events
    metrics.set_users(lambda: environment.runner.user_count if environment.runner is not None else 0)

    def _ctx_point():
        ctx = getattr(environment, "servesweep", None)  # set by servesweep's locustfile at init
        return getattr(ctx, "point", None)

    @events.test_start.add_listener
    def _start(**_kw) -> None:
        lp = _ctx_point()
        pid = point_id or (lp.id if lp is not None else None)
        if pid is not None:
            metrics.point_started(pid, axes if axes is not None else loadpoint_axes(lp))

    @events.test_stop.add_listener
    def _stop(**_kw) -> None:
        lp = _ctx_point()
        pid = point_id or (lp.id if lp is not None else None)
        if pid is not None and metrics.has_point(pid):
            metrics.point_finished(pid)

    def _observe(rec: Mapping) -> None:
        # Never let a metrics problem break a load test: a record of a point nobody announced starts that point.
        pid = rec.get("point_id")
        if pid and not metrics.has_point(pid):
            metrics.point_started(pid, loadpoint_axes(_ctx_point()))
        metrics.observe(rec)

    via_context = [False]

    @events.request.add_listener
    def _request(context=None, **_kw) -> None:
        rec = context.get(RECORD_CONTEXT_KEY) if context else None
        if rec is not None:
            via_context[0] = True
            _observe(rec)

    def _pull_loop() -> None:
        """Local runner whose user does not put records in the request context: once a second, observe the rows
        servesweep's record buffer gained (it only grows in a local runner)."""
        import logging

        import gevent

        seen_ctx, seen = None, 0
        while not via_context[0]:
            gevent.sleep(1.0)
            try:
                ctx = getattr(environment, "servesweep", None)
                buf = getattr(ctx, "buffer", None)
                if buf is None or via_context[0]:
                    continue
                if ctx is not seen_ctx:
                    seen_ctx, seen = ctx, 0
                rows, seen = buf.rows_since(seen)
                for row in rows:
                    _observe(row)
            except Exception:  # noqa: BLE001 - metrics must never take the load test down
                logging.getLogger("servesweep").exception("servesweep exporter: reading records failed")

    from locust.runners import LocalRunner

    if isinstance(environment.runner, LocalRunner):
        import gevent

        gevent.spawn(_pull_loop)

    @events.worker_report.add_listener
    def _worker_report(client_id=None, data=None, **_kw) -> None:
        cols = (data or {}).get(RECORDS_REPORT_KEY)
        if not cols:
            return
        names = list(cols)
        for row in zip(*(cols[n] for n in names), strict=True):
            _observe(dict(zip(names, row, strict=True)))

    web_ui = getattr(environment, "web_ui", None)
    if web_ui is not None:
        from flask import Response

        def _metrics_route():
            from prometheus_client import CONTENT_TYPE_LATEST

            return Response(metrics.text(), mimetype=None, content_type=CONTENT_TYPE_LATEST)

        web_ui.app.add_url_rule("/metrics", "servesweep_metrics", _metrics_route)
    if serve is not None:
        metrics.serve(*serve)
