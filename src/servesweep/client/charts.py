"""Charts in servesweep's Locust web UI, drawn by the browser from plain JSON with no library and no network beyond
the UI itself (the machine running a benchmark is often offline):

- `Series`: the master (or local runner) samples the live figures every SAMPLE_S into a ring of KEEP samples:
  TTFT p50/p99 and ITL p99 per chunk and per token (docs/metrics.md) of the requests that finished in the last
  WINDOW_S, output tok/s (the LLM tab's last 10 s), streams in flight and users. Read from the process's record
  buffer (rows since the last sample, only those scheduled since the test started), never per chunk.
- routes, under --web-base-path: `/servesweep/series.json` (the samples), `/servesweep/charts` (a page: the time
  series, then per ramp step with concurrency on the x axis, and the step table under them; inline SVG drawn by
  `webui_static/charts.js`), and the two scripts;
- the main page gets `webui_static/ui.js`: an "LLM charts" button in Locust's top bar that opens that page over
  the UI, the start form's custom parameters under their groups' headings with whole labels, and the users field
  relabelled and read-only while the step ramp (a shape) drives the users.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path

import numpy as np

from servesweep.results import metrics as M

log = logging.getLogger("servesweep")

SERIES_PATH = "/servesweep/series.json"
CHARTS_PATH = "/servesweep/charts"
STATIC = Path(__file__).with_name("webui_static")
SAMPLE_S = 2.0
KEEP = 1800  # an hour of samples
WINDOW_S = 10.0  # the latency quantiles of a sample: requests finished this long before it


def _pct(values: list[np.ndarray], q: float) -> float | None:
    v = np.concatenate(values) if values else np.empty(0)
    return float(np.percentile(v, q)) if v.size else None


def _scheduled_wall_ns(cols: dict[str, list]) -> list[int | None]:
    """Each row's scheduled time on the wall clock (its process's monotonic clock plus that process's offset)."""
    sched, offset = cols.get("scheduled_ns") or (), cols.get("mono_to_wall_ns") or ()
    return [None if s is None or o is None else s + o for s, o in zip(sched, offset, strict=False)]


def _latencies(cols: dict[str, list], since_wall_ns: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT (one per successful measured request), ITL per chunk (every gap between token-bearing chunks) and ITL
    per token (each gap divided by its chunk's tokens, once per token), in ms, of a batch of rows
    (results/metrics.py), counting only the requests scheduled at or after `since_wall_ns` (the test's start)."""
    ttft, itl, itl_tok = [], [], []
    names = ("warmup", "error_class", "sent_ns", "first_token_ns", "chunk_ns", "chunk_tokens")
    # the columns of a lead choice's own token count (n > 1); a batch without them reads as one choice each
    lead_names = ("completion_tokens", "choices", "lead_choice", "choice_completion_tokens")
    rows = len(cols.get("sent_ns", ()))
    leads = zip(*(cols.get(n) or [None] * rows for n in lead_names), strict=True)
    scheduled = _scheduled_wall_ns(cols) if since_wall_ns else [None] * rows
    for (warm, err, sent, first, chunks, toks), lead, wall in zip(
        zip(*(cols.get(n, ()) for n in names), strict=False), leads, scheduled, strict=False
    ):
        if warm or err or sent is None or first is None:
            continue
        if since_wall_ns and (wall is None or wall < since_wall_ns):
            continue  # a request of the previous test, finished after it stopped (or shipped late by a worker)
        ttft.append(M.ttft(first, sent))
        if chunks is not None and len(chunks) >= 2:
            gaps = M.itl_gaps(chunks)
            itl.append(gaps)
            # per-token ITL without per-chunk tokens divides by one answer's tokens (results/metrics.py)
            values, counts = M.itl_per_token(gaps, chunks, toks, M.lead_tokens(*lead))
            itl_tok.append(np.repeat(values, counts) if M.has_chunk_tokens(chunks, toks) else values)

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.empty(0)

    return np.asarray(ttft, dtype=np.float64), cat(itl), cat(itl_tok)


def in_flight(environment) -> int:
    """Streams open now: this process's gauge (local runner), or the sum of the connected workers' gauges as their
    last reports gave them (a master; webui.LiveState keeps them with each worker's headroom).

    A gauge, not issued - completed: a stream whose user is stopped mid-request is issued and never completed, so
    that difference grew with every stop and carried into the next test of the session."""
    ctx = getattr(
        environment, "servesweep", None
    )  # state.ClientState (a test's stand-in has buffer, in_flight)
    live = getattr(ctx, "live", None)
    if live is not None and live.is_master:
        # the connected workers only: one that left keeps its last headroom entry
        return sum(
            int(live.headroom.get(cid, {}).get("in_flight") or 0) for cid in environment.runner.clients
        )
    return max(0, int(getattr(ctx, "in_flight", 0)))


class Series:
    """The time series of one Locust process's live figures (the ClientState's `series`)."""

    def __init__(self) -> None:
        self.samples: deque[dict] = deque(maxlen=KEEP)
        self._recent: deque[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._seen = 0
        self._buffer = None
        self._since_wall_ns = 0  # the current test's start: older requests are not its own

    def reset(self, now: float | None = None) -> None:
        """At a test start: no samples, no recent requests, and none scheduled before now counts (the previous
        test's last requests reach the buffer after it stopped: a worker ships them up to 3 s later)."""
        self.samples.clear()
        self._recent.clear()
        self._since_wall_ns = int((time.time() if now is None else now) * 1e9)

    def tick(self, environment, output_tps: float | None, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        buf = getattr(getattr(environment, "servesweep", None), "buffer", None)
        if buf is not None:
            if buf is not self._buffer:
                self._buffer, self._seen = buf, 0
            cols, self._seen = buf.columns_since(self._seen)
            ttft, itl, itl_tok = _latencies(cols, self._since_wall_ns)
            self._recent.append((now, ttft, itl, itl_tok))
        while self._recent and self._recent[0][0] <= now - WINDOW_S:
            self._recent.popleft()
        ttfts = [r[1] for r in self._recent]
        itls = [r[2] for r in self._recent]
        itls_tok = [r[3] for r in self._recent]
        runner = environment.runner
        sample = {
            "t": now,
            "ttft_p50_ms": _pct(ttfts, 50),
            "ttft_p99_ms": _pct(ttfts, 99),
            "itl_p99_ms": _pct(itls, 99),  # per chunk
            "itl_per_token_p99_ms": _pct(itls_tok, 99),
            "output_tps": output_tps,
            "in_flight": in_flight(environment),
            "users": runner.user_count if runner is not None else 0,
        }
        self.samples.append(sample)
        return sample

    def payload(self) -> dict:
        from servesweep.client.shapes import step_columns

        return {
            "sample_s": SAMPLE_S,
            "window_s": WINDOW_S,
            "samples": list(self.samples),
            "step_columns": step_columns(),  # the order of the step table (live.json's keys are sorted)
        }


def sample_loop(environment, series: Series, output_tps) -> None:
    """Every SAMPLE_S while the process lives; `output_tps()` is the LLM tab's recent output tok/s."""
    import gevent

    while True:
        gevent.sleep(SAMPLE_S)
        runner = environment.runner
        if runner is None or runner.state not in ("spawning", "running", "cleanup", "stopping"):
            continue
        try:
            series.tick(environment, output_tps())
        except Exception:  # noqa: BLE001 - the charts must never take the test down
            log.exception("servesweep: chart sample failed")


def inject_ui_script(html: str, base: str) -> str:
    """The main page with ui.js loaded at its end."""
    tag = f'<script src="{base}/servesweep/ui.js" data-base="{base}"></script>'
    return html.replace("</body>", tag + "</body>", 1) if "</body>" in html else html + tag


def add_routes(environment, series: Series) -> None:
    """series.json, the charts page and the two scripts, under --web-base-path; ui.js on the main page."""
    from flask import Response, jsonify, request

    web_ui = environment.web_ui
    base = (getattr(environment.parsed_options, "web_base_path", "") or "").rstrip("/")

    @web_ui.auth_required_if_enabled
    def series_json():
        return jsonify(series.payload())

    @web_ui.auth_required_if_enabled
    def charts_page():
        return Response((STATIC / "charts.html").read_text(), mimetype="text/html")

    def script(name: str):
        return Response((STATIC / name).read_text(), mimetype="text/javascript")

    web_ui.app.add_url_rule(base + SERIES_PATH, "servesweep_series_json", series_json)
    web_ui.app.add_url_rule(base + CHARTS_PATH, "servesweep_charts", charts_page)
    for name in ("charts.js", "ui.js"):
        web_ui.app.add_url_rule(f"{base}/servesweep/{name}", f"servesweep_{name}", lambda n=name: script(n))

    @web_ui.app.after_request
    def _main_page(response):
        if request.path in (base + "/", base or "/") and response.mimetype == "text/html":
            response.direct_passthrough = False
            response.set_data(inject_ui_script(response.get_data(as_text=True), base))
        return response
