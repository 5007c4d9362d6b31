"""The private parts of Locust, gevent and geventhttpclient that servesweep relies on, in one place, each with why
no public API does it, and the versions they were checked against (CHECKED). tests/inlocust/test_internals.py
fails when an installed version differs from CHECKED or a part is gone: re-read the part in the new version, then
update CHECKED. Everything else in client/ uses public APIs only, but one: gevent's socket `_read_event`, which
client/rxstamp.py's wait (`RxClock.wait_readable`) reads in place, on the per-chunk path, where one more call per chunk
would cost what bench/run_all.py's figure 1 measures (checked against the same gevent, and by
tests/inlocust/test_internals.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CHECKED = {"locust": "2.47.0", "gevent": "26.9.0", "geventhttpclient": "2.6.1"}


def send_stats_now(runner: Any) -> None:
    """A worker's report to the master now, records included (servesweep's records ride on the stats report),
    instead of at the next tick, up to 3 s away (`WorkerRunner._send_stats`; Locust has no public flush)."""
    runner._send_stats()


def forked_worker_exits() -> dict[int, Any]:
    """The child processes gevent's child watcher reaped and keeps until they are waited for (`gevent.os.
    _watched_children`: pid -> (pid, status, time) once ended): the exit statuses of Locust's `--processes`
    workers, which Locust itself waits for only at its exit. Read only: a wait of ours would break Locust's."""
    import gevent.os

    return dict(getattr(gevent.os, "_watched_children", {}))


def validate_shape(environment: Any) -> None:
    """The check Locust makes of a load shape given on the command line (`Environment._validate_shape_class_
    instance`), for the shape the web UI's form installs at a start."""
    environment._validate_shape_class_instance()


def set_idle_socket_check(pool: Any, check: Callable[[Any], bool]) -> None:
    """geventhttpclient's pool asks `_is_socket_alive(sock)` before it hands out an idle connection; servesweep's
    check is the same minus gevent's yield (client/rxstamp.idle_socket_alive)."""
    pool._is_socket_alive = check


def connection_pool(http: Any) -> Any:
    """A geventhttpclient `HTTPClient`'s connection pool (`_connection_pool`): once per user, servesweep wraps its
    `get_socket` (each socket handed out gets the first-token timeout and its receive stamp) and, after a request
    that says `Connection: close`, its `return_socket`; geventhttpclient has no public hook for either."""
    return http._connection_pool


def response_socket(resp: Any) -> Any:
    """A streaming response's socket (geventhttpclient `HTTPSocketPoolResponse._sock`; None once the whole message
    came with the headers and the socket went back): its timeout switches from first token to stall."""
    return resp._sock


def response_body_buffer(resp: Any) -> Any:
    """The bytearray geventhttpclient's parser appends a response's de-chunked body to (`_body_buffer`): the read
    loop notes how far it reached after each read instead of copying lines out."""
    return resp._body_buffer


_LOCUST_MASTER_TIMEOUT: list[float] = []  # Locust's own value, kept when replaced


def take_over_master_timeout() -> float:
    """Locust's worker quits when its master's last heartbeat is older than `runners.MASTER_HEARTBEAT_TIMEOUT` (60 s)
    by the wall clock (`WorkerRunner.heartbeat_timeout_checker`: `last_heartbeat_timestamp < time.time() - 60`, once
    a second), so a clock stepped forward quits a worker whose master is fine, and one stepped back hides a dead
    master for as long as the step. The checker reads the module constant at each round: set to infinity it never
    fires, and servesweep's own check on the monotonic clock (client/watch.py) takes over. Returns Locust's value."""
    import locust.runners

    if not _LOCUST_MASTER_TIMEOUT:
        _LOCUST_MASTER_TIMEOUT.append(float(locust.runners.MASTER_HEARTBEAT_TIMEOUT))
    locust.runners.MASTER_HEARTBEAT_TIMEOUT = float("inf")  # type: ignore[assignment]
    return _LOCUST_MASTER_TIMEOUT[0]


def hold_end_for_missing(runner: Any, hold: Callable[[], bool]) -> None:
    """A master that does not end the test while `hold()` says so (a missing worker may still come back). Locust's
    `MasterRunner` ends a test when no ready, spawning or running worker is left, a `missing` one not counted:
    `handle_message` ("quit": "The last worker quit", then `stop()` and, headless, `quit()`, which also sends
    `quit` to the missing worker) and `heartbeat_worker` ("The last worker went missing": `stop()`, which sends it
    `stop`). In a request-budget point the worker that finished first so ends the point while a worker cut off for a
    few seconds still holds its share and its records. While `hold()`, those `stop` and `quit` calls do nothing
    (the caller ends the test itself once nothing may return: client/distributed.py), nor does `check_stopped`
    (called after every message: with only a missing worker left it would set the runner STOPPED, and the returning
    worker's own quit would then end the test without its `test_stop`). The dispatcher is dropped (as Locust's
    `stop` drops it), so a worker back from `missing` is not handed the users of the one that quit: it finishes its
    own share with its own users. Locust calls the three on the instance (`self.stop()`), so they are replaced
    there."""
    stop, quit_, check_stopped = runner.stop, runner.quit, runner.check_stopped

    def _held() -> bool:
        if not hold():
            return False
        runner._users_dispatcher = None
        return True

    def _stop(*args: Any, **kwargs: Any) -> None:
        if not _held():
            stop(*args, **kwargs)

    def _quit() -> None:
        if not _held():
            quit_()

    def _check_stopped() -> None:
        if not hold():
            check_stopped()

    runner.stop, runner.quit, runner.check_stopped = _stop, _quit, _check_stopped
