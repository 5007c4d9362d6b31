"""Master and workers: the records and client status each worker ships with its reports, and the graceful end of a
duration point (the master says END_MSG; each worker stops sending, lets its streams finish, ships every record
and answers DRAINED_MSG; then the master quits). Locust's own end (-t) would quit the master 0.5 s after telling
the workers to stop, before the records of the streams that were still running arrive."""

from __future__ import annotations

import logging
import time
from typing import Any

from locust import events

from servesweep.client.clients import client_status
from servesweep.client.feed import take_records
from servesweep.client.locust_internals import send_stats_now
from servesweep.client.messages import ABORT_MSG, CLIENT_REPORT_KEY, DRAINED_MSG, END_MSG, RECORDS_REPORT_KEY
from servesweep.client.state import ClientState
from servesweep.client.watch import on_abort
from servesweep.config.point import LoadPoint

log = logging.getLogger("servesweep")


def worker_hooks(environment: Any, state: ClientState) -> None:
    """A worker: the master's end and abort messages; its records and client status ride on each report."""
    runner = environment.runner
    runner.register_message(
        END_MSG, lambda environment, msg, **_k: _on_end(environment, state), concurrent=True
    )
    runner.register_message(
        ABORT_MSG, lambda environment, msg, **_k: on_abort(environment, state), concurrent=True
    )

    @events.report_to_master.add_listener
    def _ship(client_id, data, **_k) -> None:
        load = state.load  # None: a host-less worker before its first spawn
        if load is None:
            return
        if len(load.buffer):
            data[RECORDS_REPORT_KEY] = take_records(state.feed, load.buffer)  # the live feed writes first
        shipped = len(data.get(RECORDS_REPORT_KEY, {}).get("request_id", ()))
        data[CLIENT_REPORT_KEY] = client_status(load, state.sampler, shipped=shipped)


def master_hooks(environment: Any, state: ClientState) -> None:
    """The master: the workers' records and client status from their reports, their drained messages, and the
    watch that ends a point when no worker is left."""
    import gevent

    @events.worker_report.add_listener
    def _collect(client_id, data, **_k) -> None:
        cols = data.get(RECORDS_REPORT_KEY)
        if cols:
            state.merged.extend_columns(cols)
        st = data.get(CLIENT_REPORT_KEY)
        if st:
            state.clients.update(client_id, st)

    environment.runner.register_message(
        DRAINED_MSG, lambda environment, msg, **_k: state.drained.add(msg.node_id)
    )
    gevent.spawn(_watch_workers, environment, state)


def _on_end(environment: Any, state: ClientState) -> None:
    """Worker: the master ended the duration. Send nothing more, let the streams in flight finish (bounded by the
    stop timeout), ship every record, and tell the master."""
    import gevent

    load, runner = state.load, environment.runner
    if load is not None:
        load.closing = True
        deadline = time.monotonic() + stop_timeout(environment, load.point)
        while load.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.05)
    send_stats_now(runner)  # the records, before the message below (one ordered channel)
    runner.send_message(DRAINED_MSG, {"in_flight": state.in_flight})


def stop_timeout(environment: Any, point: LoadPoint) -> float:
    """How long the end of a duration point waits for running streams: Locust's stop timeout (the master's -s, or
    the point's own when none was given: options.settle_stop_timeout), else the point's."""
    st = float(getattr(environment, "stop_timeout", 0.0) or 0.0)
    return st if st > 0 else point.effective_stop_timeout()


def end_distributed(environment: Any, state: ClientState) -> None:
    """Master: end a duration point gracefully (END_MSG, wait for every worker's DRAINED_MSG), then quit; bounded
    by the stop timeout."""
    import gevent

    runner = environment.runner
    assert state.point is not None  # a duration is only ended for a point that has one
    runner.send_message(END_MSG)
    deadline = time.monotonic() + stop_timeout(environment, state.point) + 10.0
    while time.monotonic() < deadline:
        alive = {c.id for c in runner.clients.all if c.state != "missing"}
        if alive <= state.drained:
            break
        gevent.sleep(0.1)
    else:
        log.error("servesweep: workers %s did not finish in time", sorted(alive - state.drained))
    runner.quit()


def _watch_workers(environment: Any, state: ClientState) -> None:
    """Master: note each worker's state once a second (a killed worker turns `missing` about 3 s after its last
    heartbeat), and end a request-bounded point when no worker is left (Locust only stops when the last one goes
    missing, and a headless master would then wait for ever)."""
    import gevent
    from locust.runners import STATE_STOPPED

    runner = environment.runner
    seen_running = False
    while True:
        gevent.sleep(1.0)
        for c in runner.clients.all:
            state.clients.state(c.id, c.state)
        state.clients.note_exits()
        seen_running = seen_running or runner.worker_count > 0
        point = state.point
        if (
            seen_running
            and state.headless
            and point is not None
            and point.requests is not None
            and point.duration_s is None
            and runner.worker_count <= 0
            and runner.state == STATE_STOPPED
        ):
            log.warning("servesweep: no worker left; ending the point")
            runner.quit()
            return
