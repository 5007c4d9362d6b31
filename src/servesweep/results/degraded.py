"""A degraded point: one whose load was not what was asked, so its figures describe another load than its label.

Today's cause is a lost Locust worker (driver/workers.py `account`: a worker killed, crashed or stopped, or one
whose records never reached the master): the master carries on with fewer users, so a point labelled
"concurrency 4" ran part of its time at 2, and per-user figures look better than they were. summary.json says so
(`degraded`, `problems`, `workers.lost_requests`); this module turns that into the one text every surface shows
(the `load` table, the report's banner and row badge, `compare`, `gate`, `run`'s exit line) and gives the
concurrency the records actually held (`in_flight`, docs/metrics.md).

A degraded point is "could not run" (exit 2, servesweep.exit_codes): it was measured, but not at the asked load.
`servesweep gate --allow-degraded` accepts it (it is still said). Pure functions, no I/O but `Timeline.read`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

ALLOW_HINT = "servesweep gate RUN --allow-degraded accepts them"


def in_flight(sent_ns: np.ndarray, end_ns: np.ndarray) -> dict | None:
    """Requests in flight (sent, not ended) over the span of the given requests, weighted by time:
    {"mean", "p50", "max"}; None without a request that has both stamps. A closed loop at concurrency C holds
    about C (less in its last round, when users finish); a lost worker's users are missing from it."""
    sent, end = np.asarray(sent_ns, np.float64), np.asarray(end_ns, np.float64)
    keep = ~np.isnan(sent) & ~np.isnan(end) & (end >= sent)
    sent, end = sent[keep], end[keep]
    if sent.size == 0:
        return None
    times = np.concatenate([sent, end])
    steps = np.concatenate([np.ones(sent.size), -np.ones(end.size)])
    order = np.lexsort((steps, times))  # at one instant an end before a start: no phantom overlap
    times, level = times[order], np.cumsum(steps[order])
    held = np.diff(times)  # level[i] holds from times[i] to times[i + 1]
    level = level[:-1]
    total = float(held.sum())
    if total <= 0:
        return {"mean": float(sent.size), "p50": float(sent.size), "max": float(sent.size)}
    by_level = np.argsort(level, kind="stable")
    cum = np.cumsum(held[by_level])
    median = float(level[by_level][np.searchsorted(cum, total / 2)])
    return {"mean": float((level * held).sum() / total), "p50": median, "max": float(level.max())}


@dataclass
class Timeline:
    """The measured requests of a records file: when each was sent and ended, and which worker sent it."""

    sent: np.ndarray
    end: np.ndarray
    worker: np.ndarray  # the records' `worker` column (host:pid)

    @classmethod
    def read(cls, records: Path) -> Timeline:
        import pyarrow.parquet as pq

        t = pq.read_table(records, columns=["warmup", "sent_ns", "end_ns", "worker"])
        measured = ~t.column("warmup").to_numpy(zero_copy_only=False).astype(bool)

        def col(name: str) -> np.ndarray:
            return t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)[measured]

        worker = np.asarray(t.column("worker").to_pylist(), dtype=object)[measured]
        return cls(col("sent_ns"), col("end_ns"), worker)

    def after_loss(self, lost: list[str]) -> tuple[float, dict | None] | None:
        """(seconds into the span when the first lost worker was last heard of, in_flight from then to the end):
        its last record's end, or the span's start when none of its records reached the master. None without a
        record or a lost worker."""
        if not self.sent.size or not lost:
            return None
        t0 = float(np.nanmin(self.sent))
        ends = [float(np.nanmax(self.end[self.worker == w])) for w in lost if (self.worker == w).any()]
        at = min(ends) if len(ends) == len(lost) else t0
        later = self.end > at
        clipped = np.maximum(
            self.sent[later], at
        )  # the level from `at` on: requests in flight then count from it
        return (at - t0) / 1e9, in_flight(clipped, self.end[later])


@dataclass
class Degradation:
    """What made a point degraded, and the load it actually had."""

    point_id: str
    problems: list[
        str
    ]  # summary.json's own lines, e.g. "worker w:41 on local (#0) exited with 137: 2 of ..."
    lost_requests: int | None
    asked_concurrency: int | None
    held_concurrency: float | None  # mean requests in flight in the records (closed loop)
    asked_rate: float | None  # open loop: the asked arrival rate (/s)
    got_rate: float | None  # measured requests / window
    lost_at_s: float | None = (
        None  # when the first lost worker was last heard of (its last record), into the span
    )
    held_after: float | None = None  # mean requests in flight from then on (closed loop)

    @property
    def load_text(self) -> str:
        """`concurrency 4 asked, 2.0 held` (closed loop) or `rate 40/s asked, 21.3/s got` (open loop); '' unknown."""
        if self.asked_rate is not None:
            got = f", {self.got_rate:.1f}/s got" if self.got_rate is not None else ""
            return f"rate {self.asked_rate:g}/s asked{got}"
        if self.asked_concurrency is None:
            return ""
        held = (
            f", {self.held_concurrency:.1f} held (mean requests in flight in the records)"
            if self.held_concurrency is not None
            else ""
        )
        after = (
            f", {self.held_after:.1f} from {self.lost_at_s:.1f} s on (the lost worker's last record)"
            if self.held_after is not None and self.lost_at_s is not None and self.lost_at_s > 0
            else ""
        )
        return f"concurrency {self.asked_concurrency} asked{held}{after}"

    @property
    def short(self) -> str:
        """One cell's worth: `4→2.0` (closed loop), `40→21.3/s` (open loop), or `DEGRADED`."""
        if self.asked_rate is not None and self.got_rate is not None:
            return f"{self.asked_rate:g}→{self.got_rate:.1f}/s"
        if self.asked_concurrency is not None and self.held_concurrency is not None:
            return f"{self.asked_concurrency}→{self.held_concurrency:.1f}"
        return "DEGRADED"

    @property
    def text(self) -> str:
        """Everything in one line: the problems, the requests lost, the load held."""
        parts = ["; ".join(self.problems) or "the point is marked degraded"]
        if self.load_text:
            parts.append(self.load_text)
        return "; ".join(parts)

    def line(self) -> str:
        """The console's and the report's line: `point c4 DEGRADED (its figures are not the asked load): ...`."""
        return f"point {self.point_id} DEGRADED (its figures are not the asked load): {self.text}"


def degradation(summary: dict | None, records: Path | None = None) -> Degradation | None:
    """The point's Degradation from its summary.json (None: it ran as asked). `records`: where to count the
    requests in flight when the summary predates `in_flight`."""
    if not summary or not summary.get("degraded"):
        return None
    pt = summary.get("point") or {}
    flight = summary.get("in_flight")
    timeline = Timeline.read(records) if records is not None and records.is_file() else None
    if flight is None and timeline is not None:
        flight = in_flight(timeline.sent, timeline.end)
    req, window = summary.get("requests") or {}, summary.get("window_s")
    open_loop = pt.get("arrival", "closed") != "closed" and pt.get("rate_rps")
    lost = [
        str(w["worker"])
        for w in (summary.get("workers") or {}).get("workers") or []
        if w.get("lost") or not w.get("ended_cleanly", True)
    ]
    split = timeline.after_loss(lost) if timeline is not None and not open_loop else None
    return Degradation(
        point_id=str(summary.get("point_id") or ""),
        problems=[str(p) for p in summary.get("problems") or []],
        lost_requests=(summary.get("workers") or {}).get("lost_requests"),
        asked_concurrency=pt.get("concurrency"),
        held_concurrency=None if open_loop or not flight else flight["mean"],
        asked_rate=float(pt["rate_rps"]) if open_loop else None,
        got_rate=req.get("measured", 0) / window if open_loop and window else None,
        lost_at_s=split[0] if split else None,
        held_after=split[1]["mean"] if split and split[1] else None,
    )


def exit_line(code: int, ids: list[str]) -> str:
    """The exit line of `run` (and `load`) for degraded points."""
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return (
        f"exit {code}: {len(ids)} point(s) DEGRADED, measured at a lower load than asked ({shown}): their figures "
        f"are kept and marked; run them again, or {ALLOW_HINT}"
    )
