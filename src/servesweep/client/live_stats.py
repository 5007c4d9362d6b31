"""Live LLM statistics of a running Locust test, mergeable across workers.

Each Locust process that runs users (a worker, or the local runner) folds every finished request's record into a
`LiveStats`; a worker ships its delta with each `report_to_master` (every 3 s) and starts a fresh one; the master
merges the deltas in `worker_report`. Everything in a `LiveStats` merges exactly (counts, sums, min/max, per-second
bins) except the quantiles, which come from `Sketch`, a log-bucket histogram with a bounded relative error, so the
master's p50/p90/p99 are those of all requests of all workers within `Sketch.ALPHA`.

Each figure is computed by `servesweep.results.metrics`, the one definition the summary, the gates and the report
use too (docs/metrics.md): TTFT = first token-bearing chunk - send, ITL per chunk =
each gap between token-bearing chunks, ITL per token = each gap divided by the later chunk's tokens, once per token
(`metrics.itl_per_token`), TPOT = (last chunk - first chunk) / (completion tokens - tokens of the first chunk),
per-request tok/s = 1000 / TPOT, output tok/s = completion tokens of successful measured requests / (last end - first
scheduled of measured requests). Warmup records are counted apart and left out, as in the summary.

`Headroom` samples the client process itself: CPU of this process (psutil, % of one core) and event-loop lag (how
late a 50 ms gevent sleep wakes up), the two signs that the load generator, not the server, is the bottleneck.
No Locust import at module level: `servesweep.client.webui` wires these into Locust's events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from servesweep.results import metrics

if TYPE_CHECKING:
    from gevent import Greenlet

LATENCIES: dict[str, str] = {  # sketch key -> what the UI calls it
    "ttft_ms": "TTFT ms",
    "itl_ms": "ITL per chunk ms",
    "itl_per_token_ms": "ITL per token ms",
    "tpot_ms": "TPOT ms",
    "e2e_ms": "E2E ms",
    "decode_tps": "per-request tok/s",
}
RATE_WINDOW_S = 10  # the "now" output rate: this many whole seconds ...
KEEP_BINS_S = 120  # ... from per-second bins kept this long


class Sketch:
    """Quantiles of positive values with relative error <= ALPHA, mergeable by adding bucket counts.

    Bucket i holds values in (GAMMA**(i-1), GAMMA**i]; its representative value is within ALPHA of every value in it.
    Values are added a request at a time as numpy arrays (ITL: one per chunk), so the per-value cost stays off the
    Python interpreter: a pure-Python HdrHistogram measured 2 us per value here, this ~0.1 us
    for arrays and ~1 us for a scalar in plain Python.
    """

    ALPHA = 0.01
    GAMMA = (1 + ALPHA) / (1 - ALPHA)
    _LN_GAMMA = math.log(GAMMA)
    MIN_VALUE = 1e-6  # at or below: the zero bucket (a 1 ns gap is as good as 0)

    __slots__ = ("bins", "count", "total", "lo", "hi", "zeros")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.zeros = 0

    def add_one(self, v: float) -> None:
        """One value, in plain Python (a numpy call costs more than this whole method for a scalar)."""
        if v != v:  # NaN
            return
        self.count += 1
        self.total += v
        if v < self.lo:
            self.lo = v
        if v > self.hi:
            self.hi = v
        if v <= self.MIN_VALUE:
            self.zeros += 1
            return
        i = math.ceil(math.log(v) / self._LN_GAMMA)
        self.bins[i] = self.bins.get(i, 0) + 1

    def add(self, values) -> None:
        """Many values (an array, e.g. one request's chunk gaps)."""
        a = np.asarray(values, dtype=np.float64).ravel()
        if a.size < 32:
            for v in a.tolist():
                self.add_one(v)
            return
        a = a[~np.isnan(a)]
        if not a.size:
            return
        self.count += int(a.size)
        self.total += float(a.sum())
        self.lo = min(self.lo, float(a.min()))
        self.hi = max(self.hi, float(a.max()))
        pos = a[a > self.MIN_VALUE]
        self.zeros += int(a.size - pos.size)
        if pos.size:
            idx, n = np.unique(np.ceil(np.log(pos) / self._LN_GAMMA).astype(np.int64), return_counts=True)
            bins = self.bins
            for i, c in zip(idx.tolist(), n.tolist(), strict=True):
                bins[i] = bins.get(i, 0) + c

    def add_counts(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Value i counted counts[i] times (ITL per token: a chunk gap once per token of its chunk)."""
        if values.size and int(counts.max()) > 1:
            values = np.repeat(values, counts)
        self.add(values)

    def merge(self, other: Sketch) -> None:
        for i, c in other.bins.items():
            self.bins[i] = self.bins.get(i, 0) + c
        self.count += other.count
        self.total += other.total
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)
        self.zeros += other.zeros

    def quantile(self, q: float) -> float | None:
        """The value at rank q*(n-1) (the order statistic numpy's linear percentile starts from), within ALPHA."""
        if not self.count:
            return None
        rank = q * (self.count - 1)
        if rank < self.zeros:
            return max(self.lo, 0.0)
        seen = self.zeros
        for i in sorted(self.bins):
            seen += self.bins[i]
            if seen > rank:
                v = 2.0 * self.GAMMA**i / (self.GAMMA + 1.0)
                return min(max(v, self.lo), self.hi)
        return self.hi

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def payload(self) -> dict:
        # msgpack (Locust's wire format) keeps int dict keys; floats inf/-inf survive too.
        return {
            "b": self.bins,
            "n": self.count,
            "s": self.total,
            "lo": self.lo,
            "hi": self.hi,
            "z": self.zeros,
        }

    @classmethod
    def from_payload(cls, d: Mapping) -> Sketch:
        s = cls()
        s.bins = {int(k): int(v) for k, v in d["b"].items()}
        s.count, s.total, s.lo, s.hi, s.zeros = int(d["n"]), float(d["s"]), d["lo"], d["hi"], int(d["z"])
        return s


def _num(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


class LiveStats:
    """The mergeable aggregate of finished requests (see the module docstring for every definition).

    `slos`: config.slo.SLO objects; the per-request ones (no percentile: 'ttft<=2s') count each successful request
    that meets all of them (goodput, as servesweep.results.metrics defines it: itl = the request's largest chunk gap).
    """

    def __init__(self, slos=()) -> None:
        self.slos = [x for x in slos if x.per_request]
        self._slo_limits = [(x.name, x.op, x.value) for x in self.slos]
        self.good = 0
        self.sketches: dict[str, Sketch] = {k: Sketch() for k in LATENCIES}
        self.ok = 0
        self.failed = 0
        self.warmup = 0
        self.errors: dict[str, int] = {}
        self.output_tokens = 0  # completion tokens of successful measured requests
        self.prompt_tokens = 0  # prompt tokens (server usage) of successful measured requests
        self.prompt_reported = 0
        self.first_scheduled_ns = math.inf  # wall clock (Unix ns), over measured requests
        self.last_end_ns = -math.inf
        self.bins: dict[int, list[int]] = {}  # wall second of a request's end -> [output tokens, ok, failed]

    # ------------------------------------------------------------ feeding

    def add_record(self, rec: Mapping) -> None:
        """One finished request (a records.py row as a dict); called once per request, never per chunk."""
        if rec.get("warmup"):
            self.warmup += 1
            return
        off = rec.get("mono_to_wall_ns") or 0
        end = rec["end_ns"] + off
        self.first_scheduled_ns = min(self.first_scheduled_ns, rec["scheduled_ns"] + off)
        self.last_end_ns = max(self.last_end_ns, end)
        b = self.bins.setdefault(int(end // 1_000_000_000), [0, 0, 0])
        err = rec.get("error_class")
        if err is not None:
            self.failed += 1
            self.errors[err] = self.errors.get(err, 0) + 1
            b[2] += 1
            return
        self.ok += 1
        b[1] += 1
        c = rec.get("completion_tokens")
        if c is not None:
            self.output_tokens += int(c)
            b[0] += int(c)
        p = rec.get("prompt_tokens")
        if p is not None:
            self.prompt_tokens += int(p)
            self.prompt_reported += 1
        sent = rec["sent_ns"]
        sk = self.sketches
        e2e = metrics.e2e(rec["end_ns"], sent)
        sk["e2e_ms"].add_one(e2e)
        first = rec.get("first_token_ns")
        ttft = math.nan
        if first is not None:
            ttft = metrics.ttft(first, sent)
            sk["ttft_ms"].add_one(ttft)
        ch: Sequence[int] = rec.get("chunk_ns") or ()
        tpot = math.nan
        max_itl = 0.0
        if len(ch) > 1:
            itl = sk["itl_ms"]
            if len(ch) < 32:
                prev = ch[0]
                for t in ch[1:]:
                    g = (t - prev) / 1e6
                    itl.add_one(g)
                    max_itl = max(max_itl, g)
                    prev = t
                gaps = None
            else:
                gaps = metrics.itl_gaps(ch)
                itl.add(gaps)
                max_itl = float(gaps.max())
            # one answer's tokens: with n > 1 the lead choice's (results/metrics.py), not the usage's sum
            toks, lead = rec.get("chunk_tokens"), metrics.record_lead_tokens(rec)
            per_token, counts = metrics.itl_per_token(
                metrics.itl_gaps(ch) if gaps is None else gaps, ch, toks, lead
            )
            sk["itl_per_token_ms"].add_counts(per_token, counts)
            tpot = metrics.tpot(ch, toks, lead)
            if not math.isnan(tpot):
                sk["tpot_ms"].add_one(tpot)
                if tpot > 0:
                    sk["decode_tps"].add_one(1000.0 / tpot)
        if self.slos:
            per = {"ttft": ttft, "e2e": e2e, "tpot": tpot, "itl": max_itl}
            if metrics.meets_slos(per, self._slo_limits):
                self.good += 1

    def add_columns(self, cols: Mapping[str, list]) -> None:
        """A batch in RecordBuffer.take() form (column name -> list)."""
        names = list(cols)
        for row in zip(*(cols[n] for n in names), strict=True):
            self.add_record(dict(zip(names, row, strict=True)))

    # ------------------------------------------------------------ merging

    def payload(self) -> dict:
        return {
            "sk": {k: s.payload() for k, s in self.sketches.items()},
            "ok": self.ok,
            "failed": self.failed,
            "warmup": self.warmup,
            "errors": self.errors,
            "out": self.output_tokens,
            "prompt": self.prompt_tokens,
            "prompt_n": self.prompt_reported,
            "t0": self.first_scheduled_ns,
            "t1": self.last_end_ns,
            "bins": self.bins,
            "good": self.good,
        }

    def empty(self) -> bool:
        return not (self.ok or self.failed or self.warmup)

    def merge_payload(self, d: Mapping) -> None:
        for k, sd in d["sk"].items():
            self.sketches.setdefault(k, Sketch()).merge(Sketch.from_payload(sd))
        self.ok += d["ok"]
        self.failed += d["failed"]
        self.warmup += d["warmup"]
        for k, v in d["errors"].items():
            self.errors[k] = self.errors.get(k, 0) + v
        self.output_tokens += d["out"]
        self.prompt_tokens += d["prompt"]
        self.prompt_reported += d["prompt_n"]
        self.good += d.get("good", 0)
        self.first_scheduled_ns = min(self.first_scheduled_ns, d["t0"])
        self.last_end_ns = max(self.last_end_ns, d["t1"])
        for sec, (tok, ok, failed) in d["bins"].items():
            b = self.bins.setdefault(int(sec), [0, 0, 0])
            b[0] += tok
            b[1] += ok
            b[2] += failed
        self.prune()

    def prune(self, now_s: float | None = None) -> None:
        cut = int(now_s if now_s is not None else time.time()) - KEEP_BINS_S
        for sec in [s for s in self.bins if s < cut]:
            del self.bins[sec]

    # ------------------------------------------------------------ reading

    def window_s(self) -> float | None:
        if self.ok + self.failed == 0 or not math.isfinite(self.first_scheduled_ns):
            return None
        return max((self.last_end_ns - self.first_scheduled_ns) / 1e9, 1e-9)

    def output_tps(self) -> float | None:
        """Aggregate output tok/s over the run so far (summary.py's `output_tokens_per_s`)."""
        w = self.window_s()
        return None if w is None else self.output_tokens / w

    def recent(self, now_s: float, lag_s: float) -> dict:
        """Output tok/s, requests/s and failures/s over RATE_WINDOW_S whole seconds ending lag_s before now.

        lag_s covers records still on their way (a worker reports every 3 s), so the newest seconds are not
        read as a drop in throughput.
        """
        end = int(now_s - lag_s)
        tok = ok = failed = 0
        for sec in range(end - RATE_WINDOW_S, end):
            b = self.bins.get(sec)
            if b:
                tok += b[0]
                ok += b[1]
                failed += b[2]
        return {
            "output_tps": tok / RATE_WINDOW_S,
            "request_rate": ok / RATE_WINDOW_S,
            "failure_rate": failed / RATE_WINDOW_S,
        }

    def snapshot(self, now_s: float | None = None, lag_s: float = 1.0) -> dict:
        """Plain numbers for JSON: what the UI tables show, unformatted."""
        now_s = time.time() if now_s is None else now_s
        lat = {}
        for k, s in self.sketches.items():
            lat[k] = {
                "p50": s.quantile(0.5),
                "p90": s.quantile(0.9),
                "p99": s.quantile(0.99),
                "mean": s.mean,
                "n": s.count,
            }
        return {
            "latency": lat,
            "requests": {"ok": self.ok, "failed": self.failed, "warmup": self.warmup},
            "errors": dict(sorted(self.errors.items())),
            "output_tokens": self.output_tokens,
            "output_tps": self.output_tps(),
            "window_s": self.window_s(),
            "prompt_tokens_mean": self.prompt_tokens / self.prompt_reported if self.prompt_reported else None,
            "completion_tokens_mean": self.output_tokens / self.ok if self.ok else None,
            "recent": self.recent(now_s, lag_s),
            "goodput": self.goodput(),
        }

    def goodput(self) -> dict | None:
        """Requests meeting every per-request SLO: count, share of measured requests, per second of window."""
        if not self.slos:
            return None
        n, w = self.ok + self.failed, self.window_s()
        return {
            "slos": [x.text for x in self.slos],
            "requests": self.good,
            "ratio": self.good / n if n else None,
            "per_s": self.good / w if w else None,
        }


class Headroom:
    """CPU of this process and gevent event-loop lag, sampled by one greenlet; `take()` gives and resets a window."""

    PERIOD_S = 0.05

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call only primes the counter
        self._lags: list[float] = []
        self._greenlet: Greenlet | None = None

    def start(self) -> None:
        import gevent

        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._loop)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _loop(self) -> None:
        import gevent

        period = self.PERIOD_S
        clock = time.perf_counter
        while True:
            t0 = clock()
            gevent.sleep(period)
            self._lags.append((clock() - t0 - period) * 1000.0)
            if len(self._lags) > 4000:  # nobody took a window for minutes: keep the newest
                del self._lags[:2000]

    def take(self) -> dict:
        lags = np.asarray(self._lags, dtype=np.float64)
        self._lags = []
        return {
            "cpu_percent": float(self._proc.cpu_percent(None)),
            "loop_lag_p99_ms": float(np.percentile(lags, 99)) if lags.size else None,
            "loop_lag_max_ms": float(lags.max()) if lags.size else None,
            "t": time.time(),
        }
