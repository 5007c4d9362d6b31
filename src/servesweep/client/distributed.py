"""Master and workers: the records and client status each worker ships with its reports, and the graceful end of a
duration point (the master says END_MSG; each worker stops sending, lets its streams finish, ships every record
and answers DRAINED_MSG; then the master quits). Locust's own end (-t) would quit the master 0.5 s after telling
the workers to stop, before the records of the streams that were still running arrive. And the end of a
request-budget point, held while a worker that went `missing` may still come back (`MissingWorkers`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from locust import events

from servesweep.client.clients import client_status
from servesweep.client.feed import take_records
from servesweep.client.locust_internals import hold_end_for_missing, send_stats_now
from servesweep.client.messages import ABORT_MSG, CLIENT_REPORT_KEY, DRAINED_MSG, END_MSG, RECORDS_REPORT_KEY
from servesweep.client.state import ClientState
from servesweep.client.watch import configured_silence_s, on_abort
from servesweep.config.point import LoadPoint

log = logging.getLogger("servesweep")

# report_to_master: how long this worker goes without a heartbeat from its master before it stops itself (s); only a
# worker servesweep started remotely has one (SERVESWEEP_MASTER_SILENCE_S from the locust_worker role)
SILENCE_REPORT_KEY = "servesweep_master_silence_s"
# the worker's heartbeat after a heal reaches the master up to one heartbeat interval after the worker hears again
RETURN_MARGIN_S = 1.0


def _own_silence_s(state: ClientState) -> float | None:
    """A remote worker's master silence (client/watch.py), for the master's wait; None for a forked worker (its
    master is its parent) or one started without the role's silence."""
    return None if state.forked else configured_silence_s()


def worker_hooks(environment: Any, state: ClientState) -> None:
    """A worker: the master's end and abort messages; its records and client status ride on each report."""
    runner = environment.runner
    runner.register_message(
        END_MSG, lambda environment, msg, **_k: _on_end(environment, state), concurrent=True
    )
    runner.register_message(
        ABORT_MSG, lambda environment, msg, **_k: on_abort(environment, state), concurrent=True
    )

    silence_s = _own_silence_s(state)

    @events.report_to_master.add_listener
    def _ship(client_id, data, **_k) -> None:
        if silence_s is not None:
            data[SILENCE_REPORT_KEY] = silence_s
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

    missing = MissingWorkers(environment.runner, state)
    environment.events.heartbeat_sent.add_listener(missing.heard)
    hold_end_for_missing(environment.runner, missing.hold)

    @events.worker_report.add_listener
    def _collect(client_id, data, **_k) -> None:
        silence_s = data.get(SILENCE_REPORT_KEY)
        if silence_s is not None:
            missing.silence_s[client_id] = float(silence_s)
        cols = data.get(RECORDS_REPORT_KEY)
        if cols:
            state.merged.extend_columns(cols)
        st = data.get(CLIENT_REPORT_KEY)
        if st:
            state.clients.update(client_id, st)

    environment.runner.register_message(
        DRAINED_MSG, lambda environment, msg, **_k: state.drained.add(msg.node_id)
    )
    gevent.spawn(_watch_workers, environment, state, missing)


class MissingWorkers:
    """Master of a headless request-budget point: Locust ends the test when no worker is ready or running, a
    `missing` one (no heartbeat for ~3 s) not counted, so the worker that finishes its share first ends the point
    while one cut off for a few seconds still holds the rest of its share and its records, which then have no master
    to go to (a degraded point though the worker came back). A missing remote worker stops by itself after its
    silence (its reports say how long: client/watch.py), so until then, measured from its last heartbeat on the
    monotonic clock (plus RETURN_MARGIN_S), the end is held (locust_internals.hold_end_for_missing): a worker
    that comes back finishes its share and ships its records, and its quit ends the point; one that does not, ends
    it as before (_watch_workers), degraded. The records come once either way: nothing is resent."""

    def __init__(self, runner: Any, state: ClientState) -> None:
        self.runner = runner
        self.state = state
        self.heard_at: dict[str, float] = {}  # worker id -> monotonic time of its last heartbeat
        self.silence_s: dict[str, float] = {}  # worker id -> its master silence, from its reports
        self.held = False  # the end was held once: _watch_workers ends the point when nothing may return

    def heard(self, client_id: str, **_k: Any) -> None:  # Locust's heartbeat_sent: the master answers one
        self.heard_at[client_id] = time.monotonic()

    def may_return(self) -> list[str]:
        """The missing workers still within their silence since their last heartbeat."""
        now = time.monotonic()
        return [
            c.id
            for c in self.runner.clients.all
            if c.state == "missing"
            and c.id in self.silence_s
            and c.id in self.heard_at
            and now - self.heard_at[c.id] < self.silence_s[c.id] + RETURN_MARGIN_S
        ]

    def hold(self) -> bool:
        """Whether Locust's end of the test waits now: a headless budget point, no worker left but a missing one
        that may come back (and the master not abandoned: then it stops at once)."""
        st, point = self.state, self.state.point
        if (
            not st.headless
            or st.abandoned
            or point is None
            or point.requests is None
            or point.duration_s is not None
            or any(c.state != "missing" for c in self.runner.clients.all)
        ):
            return False
        back = self.may_return()
        if back and not self.held:
            self.held = True
            wait = max(
                self.silence_s[i] + RETURN_MARGIN_S - (time.monotonic() - self.heard_at[i]) for i in back
            )
            log.warning(
                "servesweep: no worker running but %s missing; waiting up to %.1f s for it to come back before "
                "ending the point",
                ", ".join(back),
                wait,
            )
        return bool(back)


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


def _watch_workers(environment: Any, state: ClientState, missing: MissingWorkers) -> None:
    """Master: note each worker's state once a second (a killed worker turns `missing` about 3 s after its last
    heartbeat), and end a request-bounded point when no worker is left (Locust only stops when the last one goes
    missing, and a headless master would then wait for ever), or, when its end was held for a missing worker
    (MissingWorkers), once that one is past its silence."""
    import gevent
    from locust.runners import STATE_STOPPED, STATE_STOPPING

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
            and not missing.hold()
        ):
            if runner.state == STATE_STOPPED:
                log.warning("servesweep: no worker left; ending the point")
            elif missing.held and runner.state != STATE_STOPPING:
                # Locust's end, held for a missing worker that did not come back within its silence
                log.warning("servesweep: the missing workers did not come back; ending the point")
                runner.stop()
            else:
                continue
            runner.quit()
            return
