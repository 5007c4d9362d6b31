"""A Locust process that nobody waits for stops by itself: when its parent dies (servesweep's run, or the master
that Locust's --processes forked it from), or, on a worker, when its master falls silent. Then the load stops at
once, what finished is shipped or written, and the process exits EXIT_PARENT_GONE (4).

Silence is measured on the monotonic clock from the last heartbeat received (Locust's `heartbeat_received` event):
a step of the wall clock (NTP, a resumed VM, `date -s`) neither fakes a silence nor hides one. Locust's own check
(60 s, on the wall clock) is replaced by this one (locust_internals.take_over_master_timeout).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from servesweep.client.locust_internals import send_stats_now, take_over_master_timeout
from servesweep.client.messages import ABORT_MSG
from servesweep.client.outcome import EXIT_PARENT_GONE, write_records
from servesweep.client.state import ClientState, Role

log = logging.getLogger("servesweep")

WATCH_ENV = "SERVESWEEP_WATCH_PARENT"  # 1: watch the parent, 0: never; unset: see parent_to_watch
# A watched remote worker quits after this long without a heartbeat from its master (Locust's own check: 60 s).
MASTER_SILENCE_ENV = "SERVESWEEP_MASTER_SILENCE_S"
MASTER_SILENCE_S = 15.0
WATCH_PERIOD_S = 0.5
HARD_EXIT_AFTER_S = 5.0


class Lineage:
    """Who this process's parent is, to notice when it dies (ppid changes: the orphan is re-parented). Taken when
    Locust imports the locustfile: in the process servesweep (or a shell) started, before `--processes` forks its
    workers, whose parent is then that very process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.ppid = os.getppid()

    def forked(self) -> bool:
        """This process is a worker Locust's --processes forked after the import."""
        return os.getpid() != self.pid

    def parent_to_watch(self, argv: list[str]) -> int | None:
        """The pid whose death ends this process, or None. A worker that Locust's --processes forked: its master,
        always (nothing else talks to it). A process servesweep started (it passes --point-json: `servesweep load`,
        `servesweep run`, the locust_worker role's launch script): its parent. A `locust` a person started from a
        shell is not watched: a closing terminal sends SIGHUP itself, and `nohup locust ... &` is meant to outlive
        the shell. SERVESWEEP_WATCH_PARENT=1 or 0 overrides."""
        forced = os.environ.get(WATCH_ENV, "").strip()
        if forced == "0":
            return None
        if self.forked():
            return self.pid  # forked by Locust after importing the locustfile: the parent is the master
        if forced == "1" or "--point-json" in argv:
            return self.ppid
        return None


class MasterSilence:
    """How long a worker has heard nothing from its master, on the monotonic clock."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.heard_at: float | None = None  # monotonic time of the last heartbeat; None before the first

    def heard(self, **_kw: Any) -> None:  # Locust's heartbeat_received event
        self.heard_at = time.monotonic()

    def silent(self, now: float) -> bool:
        return self.heard_at is not None and now - self.heard_at > self.limit_s


def configured_silence_s() -> float | None:
    """SERVESWEEP_MASTER_SILENCE_S as the locust_worker role set it; None when unset or unreadable."""
    try:
        return float(os.environ[MASTER_SILENCE_ENV])
    except (KeyError, ValueError):
        return None


def _silence_limit(state: ClientState, watched: bool) -> float:
    """Locust's own limit (60 s), or for a remote worker servesweep started (its parent watched, not forked: its
    master is not its parent) SERVESWEEP_MASTER_SILENCE_S (15 s)."""
    locust_limit = take_over_master_timeout()
    if not watched or state.forked:
        return locust_limit
    configured = configured_silence_s()
    return MASTER_SILENCE_S if configured is None else configured


def start_watch(environment: Any, state: ClientState, lineage: Lineage) -> None:
    """The parent watch, and on a worker the master's silence watch (which replaces Locust's)."""
    import gevent

    parent = lineage.parent_to_watch(sys.argv)
    silence = None
    if state.is_worker:
        silence = MasterSilence(_silence_limit(state, parent is not None))
        environment.events.heartbeat_received.add_listener(silence.heard)
    if parent is None and silence is None:
        return
    gevent.spawn(_watch, environment, state, parent, silence)


def _watch(environment: Any, state: ClientState, parent: int | None, silence: MasterSilence | None) -> None:
    """Twice a second: is the parent still this process's parent (an orphan is re-parented to init or a
    subreaper)? On a worker: has the master sent a heartbeat lately?"""
    import gevent

    while True:
        if parent is not None and os.getppid() != parent:
            abandon(environment, state, f"the parent process {parent} is gone")
            return
        if silence is not None and silence.silent(time.monotonic()):
            abandon(environment, state, f"no heartbeat from the master for {silence.limit_s:g} s")
            return
        gevent.sleep(WATCH_PERIOD_S)


def abandon(environment: Any, state: ClientState, why: str) -> None:
    """Stop the load at once: nobody waits for this run any more. Streams in flight are dropped (stop timeout 0),
    what finished is shipped or written, and the process exits EXIT_PARENT_GONE; a backstop exits it hard if the
    regular way has not within a few seconds."""
    import gevent

    if state.abandoned:
        return
    state.abandoned = True
    log.error("servesweep: %s: stopping the load now (exit %d)", why, EXIT_PARENT_GONE)
    environment.process_exit_code = EXIT_PARENT_GONE
    environment.stop_timeout = 0.0
    if state.load is not None:
        state.load.closing = True
    gevent.spawn_later(HARD_EXIT_AFTER_S, _hard_exit, environment, state)
    runner = environment.runner
    try:
        if state.role is Role.MASTER:
            # Workers drop their streams and ship what finished; quit() below waits 0.5 s for those last reports.
            runner.send_message(ABORT_MSG)
        elif state.role is Role.WORKER:
            runner.stop()
            send_stats_now(runner)  # the records, if a master is still there to take them
        runner.quit()
    finally:
        web_ui = getattr(environment, "web_ui", None)
        if web_ui is not None:
            web_ui.stop()


def on_abort(environment: Any, state: ClientState) -> None:
    """Worker: the master's ABORT_MSG (its own parent is gone)."""
    import gevent

    # Outside the runner's greenlet group: runner.quit() kills that group, and this handler with it.
    gevent.spawn(abandon, environment, state, "the master stopped the load (its parent is gone)")


def _hard_exit(environment: Any, state: ClientState) -> None:
    log.error("servesweep: still running %g s after the stop; exiting now", HARD_EXIT_AFTER_S)
    try:
        write_records(environment, state)
    finally:
        logging.shutdown()
        os._exit(EXIT_PARENT_GONE)
