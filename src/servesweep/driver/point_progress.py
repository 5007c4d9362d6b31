"""What the parent (`servesweep run`, `servesweep load`) sees of a point while it runs: the records of the live feed
(results/livefeed.py) go to the run's exporter as they arrive, and, without a terminal, a plain progress line is
printed at the point's start, at least every PROGRESS_EVERY_S during it, and at its end.

    watch = PointWatch(point_id, metrics=client_metrics, echo=print)   # echo None: a terminal shows rich progress
    run_point(..., on_records=watch.records, progress=watch.progress)
    watch.rest(final_rows)    # the point's records.parquet rows the feed did not carry (each request once)
    watch.finished(summary)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from servesweep.results import metrics as M

PROGRESS_EVERY_S = float(os.environ.get("SERVESWEEP_PROGRESS_EVERY_S", "30"))


def _ms(v: float | None) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.0f} ms"


class PointWatch:
    """The live state of one point in the parent: which requests the exporter has seen, and the progress figures."""

    def __init__(
        self,
        point_id: str,
        *,
        metrics=None,
        echo: Callable[[str], None] | None = None,
        label: str | None = None,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.point_id = point_id
        self.metrics = metrics  # servesweep.observe.exporter.ClientMetrics, or None
        self.echo = echo
        self.label = label or point_id
        self.every_s = every_s
        self.seen: set[str] = set()
        self.ttft_s: list[float] = []
        self.counts = {"completed": 0, "failed": 0}
        self.t0 = time.monotonic()
        self._last_line = self.t0
        # live tok/s: SSE events the Locust processes have read (their progress counters), times the tokens per
        # event of the requests that finished so far (1 until one has: an autoregressive server's chunk)
        self._events_at_line = 0
        self._events = 0
        self._tokens_done = 0
        self._events_done = 0
        if echo is not None:
            echo(f"{self.label}: started")

    def _observe(self, rows: Iterable[Mapping]) -> None:
        for r in rows:
            rid = r.get("request_id")
            if rid in self.seen:
                continue
            if rid is not None:
                self.seen.add(rid)
            if self.metrics is not None:
                self.metrics.observe(r)
            if r.get("warmup") or r.get("error_class"):
                continue
            chunks = r.get("chunk_ns")
            if chunks and r.get("completion_tokens"):
                self._tokens_done += int(r["completion_tokens"])
                self._events_done += len(chunks)
            first, sent = r.get("first_token_ns"), r.get("sent_ns")
            if first is not None and sent is not None:
                self.ttft_s.append(M.ttft(first, sent, M.NS_PER_S))

    def records(self, rows: list[dict]) -> None:
        """Rows of the live feed, as they arrive (run_point's on_records)."""
        self._observe(rows)
        self._maybe_line()

    def rest(self, rows: Iterable[Mapping]) -> None:
        """The point's final records: those the feed did not carry go to the exporter now."""
        self._observe(rows)

    def progress(self, d: dict) -> None:
        """run_point's progress callback: its counters (completed, failed, streamed_events, elapsed_s)."""
        self.counts = {k: int(d.get(k, 0)) for k in ("completed", "failed")}
        self._events = max(self._events, int(d.get("streamed_events", 0)))  # a worker's file may lag a read
        self._maybe_line()

    def tokens_per_event(self) -> float:
        return self._tokens_done / self._events_done if self._events_done else 1.0

    def streamed_tok_s(self, now: float) -> float:
        """Output tokens per second streamed since the last line, finished or not: SSE events read (each a chunk
        of one or more tokens, a few are not tokens: the role chunk, usage, [DONE]) times tokens per event."""
        events = self._events - self._events_at_line
        return events * self.tokens_per_event() / max(now - self._last_line, 1e-9)

    def ttft_p50_ms(self) -> float | None:
        return float(np.median(self.ttft_s)) * 1e3 if self.ttft_s else None

    def line(self) -> str:
        now = time.monotonic()
        return (
            f"{self.label}: {now - self.t0:.0f} s, {self.counts['completed']} done, {self.counts['failed']} failed, "
            f"{self.streamed_tok_s(now):.1f} output tok/s streamed, TTFT p50 {_ms(self.ttft_p50_ms())} so far"
        )

    def _maybe_line(self) -> None:
        if self.echo is None or time.monotonic() - self._last_line < self.every_s:
            return
        self.echo(self.line())
        self._last_line = time.monotonic()
        self._events_at_line = self._events

    def finished(self, summary: Mapping | None, took_s: float | None = None) -> None:
        """The end line (without a terminal): the point's own figures from its summary."""
        if self.echo is None:
            return
        took = time.monotonic() - self.t0 if took_s is None else took_s
        if summary is None:
            self.echo(f"{self.label}: ended without a summary after {took:.0f} s")
            return
        req = summary.get("requests") or {}
        ttft = (summary.get("ttft_ms") or {}).get("p50")
        tok = summary.get("output_tokens_per_s")
        self.echo(
            f"{self.label}: done in {took:.0f} s, {req.get('ok', 0)} ok, {req.get('failed', 0)} failed, "
            f"{tok or 0:.1f} output tok/s, TTFT p50 {_ms(ttft)}"
        )
