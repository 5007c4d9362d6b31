"""Locustfile add-on for remote workers (`locust -f <servesweep locustfile>,worker_status.py --worker`).

Four times a second it writes this worker's own counters to the host-local file named by SERVESWEEP_WORKER_STATUS:
the record identity (host:pid), requests issued/completed/failed and how many records it has shipped to the
master. When the worker dies, the file keeps its last counts: the controller compares them with the records the
master received to say how many requests were lost. (The master's custom arguments replace a worker's own on
every spawn, so a host-local path cannot travel as a Locust argument: it comes through the environment.)
"""

from __future__ import annotations

import json
import os
import time

from locust import events

_PATH = os.environ.get("SERVESWEEP_WORKER_STATUS", "")
_shipped = 0


def _write(environment) -> None:
    ctx = getattr(getattr(environment, "servesweep", None), "load", None)  # servesweep's client/state.py
    if not _PATH or ctx is None:  # no load yet (a worker builds it at init, or at the first spawn)
        return
    tmp = _PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "worker": ctx.worker,
                "pid": os.getpid(),
                "issued": ctx.issued,
                "completed": ctx.completed,
                "failed": ctx.failed,
                "shipped": _shipped,
                "unix": time.time(),
            },
            f,
        )
    os.replace(tmp, _PATH)


def _loop(environment) -> None:
    import gevent

    while True:
        _write(environment)
        gevent.sleep(0.25)  # 4 small writes a second: what a killed worker leaves is at most 0.25 s old


@events.init.add_listener
def _init(environment, **_kw) -> None:
    from locust.runners import WorkerRunner

    if not isinstance(environment.runner, WorkerRunner):
        return
    import gevent

    gevent.spawn(_loop, environment)

    @events.report_to_master.add_listener
    def _count(client_id, data, **_k) -> None:
        global _shipped
        cols = data.get("servesweep_records") or {}
        ids = cols.get("request_id") if isinstance(cols, dict) else None
        _shipped += len(ids) if ids is not None else 0
        _write(environment)


@events.quitting.add_listener
def _quitting(environment, **_kw) -> None:
    _write(environment)
