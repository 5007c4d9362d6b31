"""The Locust side of the live record feed (results/livefeed.py): while a point runs, each Locust process whose
parent named a folder writes the records its buffer gained into it, about once a second, from one greenlet.

A worker writes its own files (`w<pid>-<seq>.arrow`) besides shipping its records to the master with each report:
the reports come at Locust's report interval (3 s), too late for a live view. The master writes what the reports
bring (the only copy of a remote worker's records); the parent skips request ids it has seen. Nothing here runs per
chunk or per request."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from servesweep.results.livefeed import INTERVAL_S, LIVE_DIR_ENV, write_batch

if TYPE_CHECKING:
    from servesweep.results.records import RecordBuffer

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

    def loop(self, buffer_now: Callable[[], RecordBuffer]) -> None:
        import gevent

        while True:
            gevent.sleep(INTERVAL_S)
            self.write_new(buffer_now())


def start_feed(buffer_now: Callable[[], RecordBuffer], *, worker: bool) -> Feed | None:
    """The feed of this process when the parent asked for one (LIVE_DIR_ENV), writing what `buffer_now()` holds;
    None without."""
    folder = os.environ.get(LIVE_DIR_ENV)
    if not folder:
        return None
    import gevent

    from servesweep.results.records import RecordBuffer

    # The first Arrow table from Python lists pays pyarrow's one-time setup of its conversions (its pandas check is
    # made with pandas hidden: results/records.py): here, before the users start, not in the middle of the streams.
    RecordBuffer().table()
    feed = Feed(Path(folder), f"w{os.getpid()}-" if worker else "")
    gevent.spawn(feed.loop, buffer_now)
    return feed


def take_records(feed: Feed | None, buf: RecordBuffer) -> dict[str, list]:
    """A worker's report: empty the buffer for the master, after the feed has written what it had not yet (no
    yield in between: greenlets cannot add rows meanwhile)."""
    if feed is not None:
        feed.write_new(buf)
        feed.seen = 0
    return buf.take()
