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
        self._tokens_since_line = 0
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
            self._tokens_since_line += int(r.get("completion_tokens") or 0)
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
        """run_point's progress callback: its counters (completed, failed, elapsed_s)."""
        self.counts = {k: int(d.get(k, 0)) for k in ("completed", "failed")}
        self._maybe_line()

    def ttft_p50_ms(self) -> float | None:
        return float(np.median(self.ttft_s)) * 1e3 if self.ttft_s else None

    def line(self) -> str:
        now = time.monotonic()
        tok_s = self._tokens_since_line / max(now - self._last_line, 1e-9)
        return (
            f"{self.label}: {now - self.t0:.0f} s, {self.counts['completed']} done, {self.counts['failed']} failed, "
            f"{tok_s:.1f} output tok/s, TTFT p50 {_ms(self.ttft_p50_ms())} so far"
        )

    def _maybe_line(self) -> None:
        if self.echo is None or time.monotonic() - self._last_line < self.every_s:
            return
        self.echo(self.line())
        self._last_line = time.monotonic()
        self._tokens_since_line = 0

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
