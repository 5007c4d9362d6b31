"""The Locust side of the live record feed (results/livefeed.py): while a point runs, each Locust process whose
parent named a folder writes the records its buffer gained into it, about once a second, from one greenlet.

A worker writes its own files (`w<pid>-<seq>.arrow`) besides shipping its records to the master with each report:
the reports come at Locust's report interval (3 s), too late for a live view. The master writes what the reports
bring (the only copy of a remote worker's records); the parent skips request ids it has seen. Nothing here runs per
chunk or per request."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from servesweep.results.livefeed import INTERVAL_S, LIVE_DIR_ENV, write_batch

log = logging.getLogger("servesweep")


class Feed:
    """One process's feed: `seen` rows of its record buffer are written, `seq` numbers its files."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder, self.prefix = folder, prefix
        self.seen, self.seq = 0, 0

    def write_new(self, buf) -> None:
        try:
            cols, total = buf.columns_since(self.seen)
            if total > self.seen:
                write_batch(self.folder, self.seq, cols, prefix=self.prefix)
                self.seq += 1
            self.seen = total
        except Exception:  # noqa: BLE001 - the feed must never take the load test down
            log.exception("servesweep: writing the live record feed failed")

    def loop(self, environment) -> None:
        import gevent

        while True:
            gevent.sleep(INTERVAL_S)
            buf = getattr(getattr(environment, "servesweep", None), "buffer", None)
            if buf is not None:
                self.write_new(buf)


def start_feed(environment) -> None:
    """Start writing the feed when the parent asked for one (LIVE_DIR_ENV); once per process."""
    from locust.runners import WorkerRunner

    folder = os.environ.get(LIVE_DIR_ENV)
    ctx = getattr(environment, "servesweep", None)
    if not folder or ctx is None or getattr(environment, "servesweep_feed", None) is not None:
        return
    import gevent

    from servesweep.results.records import RecordBuffer

    # The first Arrow table from Python lists pays pyarrow's one-time setup of its conversions (its pandas check is
    # made with pandas hidden: results/records.py): here, before the users start, not in the middle of the streams.
    RecordBuffer().table()
    worker = isinstance(environment.runner, WorkerRunner)
    feed = environment.servesweep_feed = Feed(Path(folder), f"w{os.getpid()}-" if worker else "")
    gevent.spawn(feed.loop, environment)


def take_records(environment, buf) -> dict[str, list]:
    """A worker's report: empty the buffer for the master, after the feed has written what it had not yet (no
    yield in between: greenlets cannot add rows meanwhile)."""
    feed = getattr(environment, "servesweep_feed", None)
    if feed is not None:
        feed.write_new(buf)
        feed.seen = 0
    return buf.take()
