"""The Locust side of the live record feed (results/livefeed.py): while a point runs, the local runner or the master
writes the records its buffer gained into the folder its parent named, about once a second, from one greenlet.
Workers never write: their records reach the master with each report (Locust's report interval, 3 s), and the
master writes them. Nothing here runs per chunk or per request."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from servesweep.results.livefeed import INTERVAL_S, LIVE_DIR_ENV, write_batch

log = logging.getLogger("servesweep")


def start_feed(environment) -> None:
    """Start writing the feed when the parent asked for one (LIVE_DIR_ENV); once per process."""
    from locust.runners import WorkerRunner

    folder = os.environ.get(LIVE_DIR_ENV)
    ctx = getattr(environment, "servesweep", None)
    if not folder or ctx is None or isinstance(environment.runner, WorkerRunner):
        return
    if getattr(environment, "servesweep_feed", None) is not None:
        return
    import gevent

    from servesweep.results.records import RecordBuffer

    # The first Arrow table from Python lists imports pandas (a quarter of a second or more): pay it here, before
    # the users start, not in the middle of the streams.
    RecordBuffer().table()
    environment.servesweep_feed = gevent.spawn(_feed_loop, environment, Path(folder))


def _feed_loop(environment, folder: Path) -> None:
    import gevent

    seen, seq = 0, 0
    while True:
        gevent.sleep(INTERVAL_S)
        ctx = getattr(environment, "servesweep", None)
        buf = getattr(ctx, "buffer", None)
        if buf is None:
            continue
        try:
            cols, total = buf.columns_since(seen)
            if total > seen:
                write_batch(folder, seq, cols)
                seq += 1
            seen = total
        except Exception:  # noqa: BLE001 - the feed must never take the load test down
            log.exception("servesweep: writing the live record feed failed")
