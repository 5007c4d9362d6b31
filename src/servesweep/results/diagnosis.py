"""Why a point missed its SLO: a ranked cause per point with its evidence numbers, and the saturation knee of a
configuration's sweep (docs/reports.md, "Diagnosis"; docs/metrics.md, "Diagnosis").

One place computes the verdict: `diagnose(summary)`, from what summary.json already holds (the records' own
figures, `client_headroom`, `server_state`) plus `diagnosis_evidence`, the records-derived numbers `summarize`
stores at the point's end (`record_evidence`: in-flight levels over the window, ITL spikes and the prefills they
span; records and ITL gaps are on the Locust process's monotonic clock). The verdict itself is never stored:
the table, the report, `gate` and `compare` each call `diagnose` on summary.json, so a change of a threshold
below applies to every run already on disk.

Every threshold is a named constant here; docs/reports.md lists them. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# ---------------------------------------------------------------- thresholds (docs/reports.md, "Diagnosis")

MIN_STATE_SAMPLES = 5  # fewer /metrics samples than this cannot say what the gauges were under the load
# the client's limits are summary.py's (CPU 90%, loop lag p99 20 ms, 1% merged gaps); at these it is fully client-bound
CLIENT_MERGED_FULL_SHARE = 0.1  # ITL gaps that were chunks read together
CLIENT_LAG_FULL_MS = 100.0  # event-loop lag p99
CLIENT_MERGED_OTHER_WEIGHT = 0.25  # what merged gaps weigh when no ITL/TPOT SLO broke (they move only ITL)
ERROR_SHARE_MIN = 0.01  # failed requests above this share of the measured ones are a cause
# queueing: mean requests in SGLang's queue (num_queue_reqs, samples under load), with the client holding more in
# flight than the running cap this share of the time, and a wait of this many ITL p50s (a request waiting for the
# step in flight to end is not a queue: with no cap, a closed loop's returning request waits about one step)
QUEUE_MEAN_MIN = 0.5
AT_CAP_SHARE_MIN = 0.5
QUEUE_WAIT_ITL_MIN = 2.0
KV_USAGE_HIGH = 0.95  # token (or mamba) usage max at or above this: the pool is full
SPIKE_FACTOR = 3.0  # an ITL gap this many times the point's median gap is a spike
SPIKE_TIME_SHARE_MIN = 0.2  # spikes must hold at least this share of the decode time (the sum of ITL gaps)
SPIKE_PREFILL_SHARE_MIN = 0.5  # ...and at least this share of their time spans another request's first token
SPIKE_PREFILL_LIFT_MIN = 2.0  # ...this many times more often than the other gaps do (prefills happen anyway)
DECODE_SLOWDOWN_MIN = 1.5  # ITL/chunk p50 this many times the configuration's lowest-load point: decode-bound
CACHE_HIT_SHORTFALL = 0.5  # a measured cache hit ratio below this fraction of the workload's target: misses
# speculative decoding: drafts accepted below this share (sglang:spec_accept_rate), or without the rate fewer tokens
# per verify step than this (sglang:spec_accept_length: accepted drafts + the bonus token), is a collapse: each step
# pays for the draft and the verify and gains about one token. It moves ITL, TPOT and throughput, not TTFT: this
# weight when no ITL/TPOT SLO broke
SPEC_ACCEPT_RATE_LOW = 0.2
SPEC_ACCEPT_LENGTH_LOW = 1.5
SPEC_OTHER_WEIGHT = 0.5
# the network: the client's mean TTFT against the server's own (SGLang's time_to_first_token_seconds over the point,
# server_state's `latency`). What lies between them, less the client's own delay (its event-loop and read lag p99),
# is the wire (and the HTTP stacks either side): a cause when it is at least this many ms and this share of the
# client's TTFT, the client not CPU-bound, and the server counted no more than this many times the client's requests
# (more: another client's requests share the histogram, the means are not of the same requests)
NETWORK_GAP_MIN_MS = 20.0
NETWORK_GAP_SHARE_MIN = 0.25
NETWORK_COUNT_RATIO_MAX = 1.5
# the knee: the log-log slope of throughput over load (1 = scales, 0 = flat) must drop by this much at the break,
# and latency must grow past it; slopes are scale-free, so a long context's long TTFT cannot trip it
KNEE_SLOPE_DROP = 0.5
KNEE_MIN_POINTS = 4

NO_LIMIT = "no limit reached"
NO_CLEAR_CAUSE = "no clear cause"
NOT_ENOUGH_SAMPLES = "not enough samples"

# causes are ranked by strength (0..1, each cause's own measure of how much of the point it explains); ties broken
# by what causes what: a client limit makes every other figure the client's, and the network between them is in every
# figure the client measured; errors end requests;
# a full KV pool makes requests queue and retract; queueing makes TTFT; the rest shape ITL
CAUSE_ORDER = (
    "client-bound",
    "network",
    "server errors",
    "KV pressure",
    "queueing",
    "prefix-cache misses",
    "spec acceptance collapse",
    "prefill interference",
    "decode-bound",
)


@dataclass
class Cause:
    name: str  # one of CAUSE_ORDER
    text: str  # its evidence, e.g. "12.4 s mean wait, in flight above cap 48 for 93% of the point"
    strength: float  # 0..1: how much of the point it explains; the ranking's key
    evidence: dict = field(default_factory=dict)

    @property
    def line(self) -> str:
        return f"{self.name}: {self.text}"


@dataclass
class Diagnosis:
    causes: list[Cause]  # ranked, the likeliest first
    status: str  # "cause", NO_LIMIT, NO_CLEAR_CAUSE or NOT_ENOUGH_SAMPLES
    note: str = ""  # NOT_ENOUGH_SAMPLES: how many samples there were

    @property
    def line(self) -> str:
        """The short verdict a table cell or a gate line shows: the first cause, then the others' names."""
        if not self.causes:
            return f"{self.status} ({self.note})" if self.note else self.status
        rest = [c.name for c in self.causes[1:]]
        return self.causes[0].line + (f"; also {', '.join(rest)}" if rest else "")

    @property
    def first(self) -> str | None:
        return self.causes[0].name if self.causes else None

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "line": self.line,
            "causes": [
                {"cause": c.name, "text": c.text, "strength": round(c.strength, 3)} for c in self.causes
            ],
        }


# ---------------------------------------------------------------- evidence from the records (at the point's end)


def record_evidence(records: pa.Table, w0: float, w1: float) -> dict | None:
    """summary.json's `diagnosis_evidence`: what the verdict needs from the per-request records, in a few numbers.
    `records`: every row of the point (warmup too: its requests held the server as well); w0, w1: the measurement
    window (monotonic ns). None without a measured request."""
    if records.num_rows == 0 or not (math.isfinite(w0) and math.isfinite(w1)) or w1 <= w0:
        return None
    sent = _ns(records, "sent_ns")
    end = _ns(records, "end_ns")
    first = _ns(records, "first_token_ns")
    return {
        "in_flight_levels": in_flight_levels(sent, end, w0, w1),
        "itl_spikes": itl_spikes(records.column("chunk_ns"), np.sort(first[~np.isnan(first)])),
    }


def _ns(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def in_flight_levels(sent: np.ndarray, end: np.ndarray, w0: float, w1: float) -> list[list[float]]:
    """[[level, share of the window], ...]: how long the client held each number of requests in flight between
    w0 and w1 (shares below 1e-4 dropped). The server's running cap is read against it: at or above the cap,
    the rest of the requests wait in the server's queue."""
    keep = ~np.isnan(sent) & ~np.isnan(end) & (end >= sent)
    s, e = np.clip(sent[keep], w0, w1), np.clip(end[keep], w0, w1)
    times = np.concatenate([[w0], s, e, [w1]])
    steps = np.concatenate([[0.0], np.ones(s.size), -np.ones(e.size), [0.0]])
    order = np.lexsort((steps, times))  # an end before a start at one instant: no phantom overlap
    times, level = times[order], np.cumsum(steps[order])
    held = np.diff(times)
    total = float(held.sum())
    if total <= 0:
        return []
    shares: dict[int, float] = {}
    for lv, h in zip(level[:-1].astype(int), held, strict=True):
        shares[int(lv)] = shares.get(int(lv), 0.0) + float(h) / total
    return [[lv, round(sh, 4)] for lv, sh in sorted(shares.items()) if sh >= 1e-4]


def share_at_least(levels: Sequence[Sequence[float]], cap: float) -> float:
    """The share of the window with at least `cap` requests in flight (in_flight_levels' list)."""
    return float(sum(sh for lv, sh in levels if lv >= cap))


def itl_spikes(chunk_ns: pa.ChunkedArray | pa.Array, first_tokens_sorted: np.ndarray) -> dict | None:
    """The ITL gaps of every request and whether another request's first token (its prefill finishing) arrived
    inside each: a decode step that waited for a prefill shows as a gap with a first token in it. Spikes are gaps
    above SPIKE_FACTOR × the median gap. `spike_time_share`: the spikes' share of the summed gaps (the decode
    time); `spike_prefill_share`: the share of the spikes' time in gaps that span another request's first token;
    `calm_prefill_share`: the share of the other gaps that do (the base rate). None without a gap."""
    arr: Any = chunk_ns.combine_chunks() if isinstance(chunk_ns, pa.ChunkedArray) else chunk_ns
    if len(arr) == 0:
        return None
    arr = arr.fill_null([])  # a failed request without a chunk: no gap
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    if values.size < 2:
        return None
    same_request = np.ones(values.size - 1, dtype=bool)
    bounds = np.cumsum(sizes)[:-1]  # index of each later request's first chunk
    same_request[bounds[(bounds > 0) & (bounds < values.size)] - 1] = False
    a, b = values[:-1][same_request], values[1:][same_request]
    if a.size == 0:
        return None
    gaps_ms = (b - a) / 1e6
    # first tokens in (a, b]: the request's own first token is at or before a, so it never counts
    prefills = np.searchsorted(first_tokens_sorted, b, "right") - np.searchsorted(
        first_tokens_sorted, a, "right"
    )
    median = float(np.median(gaps_ms))
    spike = gaps_ms > SPIKE_FACTOR * median if median > 0 else np.zeros(gaps_ms.size, dtype=bool)
    with_prefill = prefills > 0
    return {
        "gaps": int(gaps_ms.size),
        "median_ms": median,
        "spike_share": float(spike.mean()),
        "spike_time_share": float(gaps_ms[spike].sum() / gaps_ms.sum()) if gaps_ms.sum() > 0 else 0.0,
        "spike_p50_ms": float(np.median(gaps_ms[spike])) if spike.any() else None,
        # weighted by time: a few long stalls behind prefills matter more than many gaps just over the factor
        "spike_prefill_share": float(gaps_ms[spike & with_prefill].sum() / gaps_ms[spike].sum())
        if spike.any()
        else None,
        "calm_prefill_share": float(with_prefill[~spike].mean()) if (~spike).any() else None,
    }


# ---------------------------------------------------------------- the verdict of one point


def breached(summary: dict) -> bool:
    """Whether a point broke an SLO or was flagged (client saturated, failures above the limit, degraded): the
    points whose `why` a table shows."""
    slo_fail = any(c.get("pass") is False for c in summary.get("slos") or [])
    failed = (summary.get("failure_check") or {}).get("pass") is False
    return bool(slo_fail or failed or summary.get("client_saturated") or summary.get("degraded"))


def diagnose(summary: dict, baseline: dict | None = None) -> Diagnosis:
    """The ranked causes of one point (summary.json). `baseline`: the summary of the same configuration's
    lowest-load point, what decode-bound compares ITL against (None: judged without it)."""
    state = summary.get("server_state") if isinstance(summary.get("server_state"), dict) else None
    found = [
        c
        for c in (
            client_bound(summary),
            network(summary, state),
            server_errors(summary),
            kv_pressure(state, summary),
            queueing(summary, state, baseline),
            prefix_cache_misses(summary),
            spec_collapse(summary, state),
            prefill_interference(summary),
            decode_bound(summary, state, baseline),
        )
        if c is not None
    ]
    found.sort(key=lambda c: (-round(c.strength, 2), CAUSE_ORDER.index(c.name)))
    if found:
        return Diagnosis(found, "cause")
    if not breached(summary):
        return Diagnosis([], NO_LIMIT)
    if state is None or (state.get("samples") or 0) < MIN_STATE_SAMPLES:
        n = 0 if state is None else state.get("samples") or 0
        span = 0.0 if state is None else state.get("span_s") or 0.0
        return Diagnosis(
            [], NOT_ENOUGH_SAMPLES, f"{n} of /metrics over {span:.1f} s, {MIN_STATE_SAMPLES} needed"
        )
    return Diagnosis([], NO_CLEAR_CAUSE)


def _gauge(state: dict | None, key: str, stat: str) -> float | None:
    """A gauge's figure over the samples under load (server_state's `load`: the idle samples before the first
    request and after the last left out), else over every sample (an older summary)."""
    if state is None or (state.get("samples") or 0) < MIN_STATE_SAMPLES:
        return None  # a few samples show the server before or after the load, not under it
    load = (state.get("load") or {}).get("gauges")
    g = load.get(key) if isinstance(load, dict) and key in load else (state.get("gauges") or {}).get(key)
    return None if g is None else g.get(stat)


def _counter(state: dict | None, key: str) -> float | None:
    if state is None or (state.get("samples") or 0) < 2:
        return None  # an increase needs two samples
    return (state.get("counters") or {}).get(key)


def client_bound(summary: dict) -> Cause | None:
    """The load generator's own headroom check (summary.client_headroom: CPU, event-loop lag, merged ITL gaps)."""
    if not summary.get("client_saturated"):
        return None
    reasons = list((summary.get("client_headroom") or {}).get("reasons") or [])
    text = "; ".join(reasons[:2]) + (f"; +{len(reasons) - 2} more" if len(reasons) > 2 else "")
    return Cause(
        "client-bound",
        text or "the load generator saturated",
        _client_strength(summary),
        {"reasons": reasons},
    )


def _client_strength(summary: dict) -> float:
    """How far past its limit the client went: the busiest process's CPU as a share of a core, its event-loop lag
    p99 over CLIENT_LAG_FULL_MS, the merged-gap share over CLIENT_MERGED_FULL_SHARE (× CLIENT_MERGED_OTHER_WEIGHT
    unless an ITL or TPOT SLO broke); the largest, at most 1 (1 when the reasons carry no figure)."""
    head = summary.get("client_headroom") or {}
    procs = [w for w in head.get("workers") or [] if isinstance(w, dict)]
    reasons = " ".join(head.get("reasons") or [])
    found = []
    if "CPU" in reasons:
        found.append(_busiest(procs, "cpu_pct") / 100.0)
    if "event-loop lag" in reasons:
        found.append(_busiest(procs, "loop_lag_p99_ms") / CLIENT_LAG_FULL_MS)
    if "read together" in reasons:
        merged = (summary.get("itl_zero_gap_share") or 0.0) / CLIENT_MERGED_FULL_SHARE
        # merged gaps move the ITL percentiles only, not a TTFT or an E2E
        found.append(merged if _decode_slo_broken(summary) else merged * CLIENT_MERGED_OTHER_WEIGHT)
    return min(1.0, max(found)) if found else 1.0


def _busiest(procs: list[dict], key: str) -> float:
    """The largest figure of the load-generating processes; infinite without one (the reason alone: full)."""
    return max((w.get(key) or 0.0 for w in procs), default=math.inf)


def network(summary: dict, state: dict | None) -> Cause | None:
    """Time between the client and the server: the client's mean TTFT (first token received minus request sent)
    against the server's own mean TTFT of the same requests (server_state's `latency`: SGLang's histogram over the
    point, request received to first token). The gap less the client's own delay (the largest event-loop lag p99
    of its processes, the read lag p99: a late read is the client's, not the wire's) is the wire's: a cause when it
    is at least NETWORK_GAP_MIN_MS and NETWORK_GAP_SHARE_MIN of the client's TTFT. None when the client was
    CPU-bound (its delays are not measured then), without the server's histogram, or when the server counted more
    than NETWORK_COUNT_RATIO_MAX × the client's requests (others' requests in its mean). Strength: the wire's share
    of the client's TTFT."""
    server = ((state or {}).get("latency") or {}).get("ttft")
    client = (summary.get("ttft_ms") or {}).get("mean")
    if not server or not client or server.get("mean_s") is None:
        return None
    sent = (summary.get("requests") or {}).get("total") or 0
    if sent and (server.get("count") or 0) > NETWORK_COUNT_RATIO_MAX * sent:
        return None
    head = summary.get("client_headroom") or {}
    if any("CPU" in r for r in head.get("reasons") or []):
        return None
    lags = [w.get("loop_lag_p99_ms") for w in head.get("workers") or [] if isinstance(w, dict)]
    lags.append((head.get("read_lag_ms") or {}).get("p99"))
    own = max((x for x in lags if isinstance(x, int | float) and math.isfinite(x)), default=0.0)
    srv = server["mean_s"] * 1000.0
    gap = client - srv
    wire = gap - own
    if wire < NETWORK_GAP_MIN_MS or wire < NETWORK_GAP_SHARE_MIN * client:
        return None
    between = f"{wire:.0f} ms between them on the wire" + (
        f", {own:.0f} ms more in the client's own lag" if own >= 1 else ""
    )
    text = f"the client sees TTFT {client:.0f} ms, the server {srv:.0f} ms ({between})"
    ev = {"client_ttft_ms": client, "server_ttft_ms": srv, "wire_ms": wire, "client_lag_ms": own}
    return Cause("network", text, min(1.0, wire / client), ev)


def server_errors(summary: dict) -> Cause | None:
    """Failed requests above ERROR_SHARE_MIN of the measured ones, by error class (the server's and timeouts)."""
    rate = summary.get("error_rate")
    measured = (summary.get("requests") or {}).get("measured") or 0
    if rate is None or rate < ERROR_SHARE_MIN or not measured:
        return None
    by_class = sorted((summary.get("failures") or {}).items(), key=lambda kv: -kv[1])
    classes = ", ".join(f"{k} {v}" for k, v in by_class[:3])
    text = f"{rate:.0%} of {measured} requests failed" + (f" ({classes})" if classes else "")
    return Cause(
        "server errors", text, min(1.0, 0.5 + rate), {"error_rate": rate, "failures": dict(by_class)}
    )


def kv_pressure(state: dict | None, summary: dict | None = None) -> Cause | None:
    """The KV (or mamba state) pool full: usage max at KV_USAGE_HIGH or above, or requests retracted. With the
    pool's size (`kv_pool_tokens`, SGLang's sglang:max_total_num_tokens) the text names it, and how many of the
    point's requests (prompt + output tokens each) it holds against the number in flight: a point kept past the
    pool on purpose (experiment `keep: [kv_overflow]`) reads as the pool's, at full strength."""
    token_max = _gauge(state, "token_usage", "max")
    mamba_max = _gauge(state, "mamba_usage", "max")
    retracted = _counter(state, "retracted_requests") or 0
    full = [
        (n, v)
        for n, v in (("token", token_max), ("mamba", mamba_max))
        if v is not None and v >= KV_USAGE_HIGH
    ]
    if not full and retracted <= 0:
        return None
    parts = [f"{n} usage max {v:.2f} (mean {_gauge(state, f'{n}_usage', 'mean') or 0:.2f})" for n, v in full]
    if retracted > 0:
        parts.append(f"{retracted:g} retraction{'s' if retracted != 1 else ''}")
    strength = max([v for _, v in full] + ([1.0] if retracted > 0 else []))
    pool, fit, asked = _gauge(state, "kv_pool_tokens", "max"), None, None
    pt = (summary or {}).get("point") or {}
    need = (pt.get("prompt_tokens") or 0) + (pt.get("output_tokens") or 0)
    if pool:
        pool = int(pool)
        asked = pt.get("concurrency") if pt.get("arrival", "closed") == "closed" else None
        fit = pool // need if need else None
        if fit is not None and asked and asked > fit:
            parts.insert(
                0, f"KV pool {pool:,} tokens holds {fit} requests of {need:,} tokens, {asked} in flight"
            )
            strength = 1.0
        else:
            parts.append(f"KV pool {pool:,} tokens")
    ev = {
        "token_usage_max": token_max,
        "mamba_usage_max": mamba_max,
        "retracted_requests": retracted,
        "kv_pool_tokens": pool,
        "requests_that_fit": fit,
    }
    return Cause("KV pressure", ", ".join(parts), strength, ev)


def running_cap(summary: dict, state: dict | None) -> float | None:
    """The server's running cap: the point's `max_running_requests` label (an experiment axis) when it has one,
    else the most requests SGLang ever ran during the point."""
    label = ((summary.get("point") or {}).get("labels") or {}).get("max_running_requests")
    try:
        return float(label) if label not in (None, "") else _gauge(state, "num_running_reqs", "max")
    except ValueError:
        return _gauge(state, "num_running_reqs", "max")


def mean_wait_s(summary: dict, state: dict | None, baseline: dict | None = None) -> tuple[float | None, str]:
    """(the wait in SGLang's queue in s, how it was read): the scheduler's queue-time histogram (mean) when it
    measured any (`sglang:queue_time_seconds`: each request's first forward minus its queue entry); else TTFT p50
    over the configuration's lowest-load point's (its queue-free TTFT: the median wait); else Little's law on the
    sampled queue (mean queued requests / request rate), at most TTFT p50 (a wait cannot exceed the time to the
    first token; a few one-second samples of a short queue can say more)."""
    total, count = _counter(state, "queue_time_s"), _counter(state, "queue_time_count")
    if total is not None and count:
        return total / count, "mean wait"
    ttft = (summary.get("ttft_ms") or {}).get("p50")
    free = ((baseline or {}).get("ttft_ms") or {}).get("p50")
    if baseline is not None and baseline is not summary and ttft and free and ttft > free:
        return (ttft - free) / 1000.0, f"median wait (TTFT p50 over the {free:.0f} ms at the lowest load)"
    queued, rate = _gauge(state, "num_queue_reqs", "mean"), summary.get("request_rate")
    if queued is not None and rate:
        little = queued / rate
        if ttft and little > ttft / 1000.0:
            return ttft / 1000.0, "wait at most (TTFT p50; queue / rate says more)"
        return little, "mean wait (queue / rate)"
    return None, ""


def over_cap_share(summary: dict, state: dict | None, cap: float) -> float:
    """The share of the point the client held more requests in flight than the running cap (so some waited in
    SGLang's queue because of the cap): from the records' in-flight levels; an older summary without them: a closed
    loop whose concurrency is above the cap, for as long as running's mean stayed near its max."""
    levels = (summary.get("diagnosis_evidence") or {}).get("in_flight_levels")
    if levels:
        return share_at_least(levels, cap + 1)
    pt = summary.get("point") or {}
    conc = pt.get("concurrency") if pt.get("arrival", "closed") == "closed" else None
    rmean, rmax = _gauge(state, "num_running_reqs", "mean"), _gauge(state, "num_running_reqs", "max")
    if not isinstance(conc, int | float) or conc <= cap or rmean is None or not rmax:
        return 0.0
    return rmean / rmax


def queueing(summary: dict, state: dict | None, baseline: dict | None = None) -> Cause | None:
    """Requests waiting in SGLang's queue because of its running cap: num_queue_reqs mean ≥ QUEUE_MEAN_MIN, the
    cap binding (the client held more requests in flight than the cap for AT_CAP_SHARE_MIN of the point: with no
    cap set, the cap read is the most SGLang ran, and a closed loop of N that ran N waits for no cap), and a
    material wait (at least QUEUE_WAIT_ITL_MIN × ITL p50 per chunk: a returning request that waits for the step in flight is
    no queue). Strength: the wait's share of the mean TTFT."""
    queued = _gauge(state, "num_queue_reqs", "mean")
    if queued is None or queued < QUEUE_MEAN_MIN:
        return None
    cap = running_cap(summary, state)
    if not cap:
        return None
    over = over_cap_share(summary, state, cap)
    if over < AT_CAP_SHARE_MIN:
        return None
    wait, how = mean_wait_s(summary, state, baseline)
    itl = (summary.get("itl_ms") or {}).get("p50")
    if wait is not None and itl and wait * 1000 < QUEUE_WAIT_ITL_MIN * itl:
        return None
    ttft = (summary.get("ttft_ms") or {}).get("mean")
    strength = min(1.0, wait * 1000 / ttft) if wait is not None and ttft else over
    lead = f"{wait:.2f} s {how}, " if wait is not None else ""
    text = f"{lead}{queued:.1f} queued on average, in flight above cap {cap:g} for {over:.0%} of the point"
    ev = {"queue_mean": queued, "cap": cap, "over_cap_share": over, "mean_wait_s": wait}
    return Cause("queueing", text, strength, ev)


def prefix_cache_misses(summary: dict) -> Cause | None:
    """A shared-prefix workload whose measured cache hit ratio is below CACHE_HIT_SHORTFALL × its target."""
    sp = summary.get("shared_prefix") or {}
    target, got, how = sp.get("target_hit_ratio"), sp.get("measured_hit_ratio"), "of prompt tokens cached"
    if (
        got is None
    ):  # the server's usage said nothing: its own counters (cached / prompt tokens over the point)
        got = _server_hit_ratio(summary, sp.get("server_cached_tokens"))
        how = "of prompt tokens cached (server)"
    if not target or got is None or got >= CACHE_HIT_SHORTFALL * target:
        return None
    text = f"{got:.0%} {how}, the workload's target {target:.0%}"
    return Cause("prefix-cache misses", text, 1.0 - got / target, {"target": target, "measured": got})


def spec_collapse(summary: dict, state: dict | None) -> Cause | None:
    """Speculative decoding that accepts almost nothing: the mean share of drafts accepted (sglang:spec_accept_rate)
    below SPEC_ACCEPT_RATE_LOW, or without the rate, the mean tokens per verify step (sglang:spec_accept_length)
    below SPEC_ACCEPT_LENGTH_LOW. Strength: 1 - the rate (without it, how far the length is from the threshold
    toward 1 token), × SPEC_OTHER_WEIGHT unless an ITL or TPOT SLO broke."""
    length = _gauge(state, "spec_accept_length", "mean")
    if length is None:
        return None  # no speculative decoding (or not sampled)
    rate = _gauge(state, "spec_accept_rate", "mean")
    if rate is not None:
        if rate >= SPEC_ACCEPT_RATE_LOW:
            return None
        strength = 1.0 - rate
        text = f"{length:.2f} tokens per verify step, {rate:.0%} of drafts accepted (< {SPEC_ACCEPT_RATE_LOW:.0%})"
    else:
        if length >= SPEC_ACCEPT_LENGTH_LOW:
            return None
        strength = min(1.0, (SPEC_ACCEPT_LENGTH_LOW - length) / (SPEC_ACCEPT_LENGTH_LOW - 1.0))
        text = f"{length:.2f} tokens per verify step (< {SPEC_ACCEPT_LENGTH_LOW:g})"
    if not _decode_slo_broken(summary):
        strength *= SPEC_OTHER_WEIGHT
    ev = {"spec_accept_length": length, "spec_accept_rate": rate}
    return Cause("spec acceptance collapse", text, strength, ev)


def _server_hit_ratio(summary: dict, cached: float | None) -> float | None:
    state = summary.get("server_state") if isinstance(summary.get("server_state"), dict) else None
    prompt = _counter(state, "prompt_tokens")
    return cached / prompt if cached is not None and prompt else None


def prefill_interference(summary: dict) -> Cause | None:
    """ITL spikes that line up with other requests' prefills: spikes hold at least SPIKE_TIME_SHARE_MIN of the
    decode time, SPIKE_PREFILL_SHARE_MIN of their time spans another request's first token, and they span one
    SPIKE_PREFILL_LIFT_MIN times as often as the other gaps do (with many users a prefill ends inside any gap)."""
    sp = (summary.get("diagnosis_evidence") or {}).get("itl_spikes")
    if not sp or sp.get("spike_prefill_share") is None:
        return None
    held, with_prefill = sp.get("spike_time_share") or 0.0, sp["spike_prefill_share"]
    calm = sp.get("calm_prefill_share") or 0.0
    lift = with_prefill / calm if calm > 0 else math.inf
    if held < SPIKE_TIME_SHARE_MIN or with_prefill < SPIKE_PREFILL_SHARE_MIN or lift < SPIKE_PREFILL_LIFT_MIN:
        return None
    text = (
        f"ITL spikes (p50 {sp['spike_p50_ms']:.0f} ms vs {sp['median_ms']:.1f} ms typical) hold {held:.0%} of the "
        f"decode time, {with_prefill:.0%} of it spans another request's prefill (other gaps {calm:.0%})"
    )
    return Cause("prefill interference", text, held * with_prefill, dict(sp))


def decode_bound(summary: dict, state: dict | None, baseline: dict | None) -> Cause | None:
    """Decode steps slowed by the batch: ITL/chunk p50 at least DECODE_SLOWDOWN_MIN × the configuration's
    lowest-load point's while nothing queues (num_queue_reqs mean below QUEUE_MEAN_MIN, or no queueing at a
    binding cap: requests that wait for the step in flight only). Without a baseline: an ITL or TPOT SLO broken
    while nothing queues."""
    itl = (summary.get("itl_ms") or {}).get("p50")
    queued = _gauge(state, "num_queue_reqs", "mean")
    if itl is None:
        return None
    if queued is not None and queued >= QUEUE_MEAN_MIN and queueing(summary, state, baseline) is not None:
        return None
    batch = _gauge(state, "num_running_reqs", "mean") or (summary.get("in_flight") or {}).get("mean")
    at = f" at batch {batch:.0f}" if batch else ""
    if queued is None:
        nothing_queued = "queue not sampled"
    elif queued < QUEUE_MEAN_MIN:
        nothing_queued = "nothing queued"
    else:
        nothing_queued = f"{queued:.1f} queued on average, none of it at a cap"
    base_itl = ((baseline or {}).get("itl_ms") or {}).get("p50")
    if baseline is not None and base_itl and baseline is not summary:
        slowdown = itl / base_itl
        if slowdown < DECODE_SLOWDOWN_MIN:
            return None
        base_pt = baseline.get("point") or {}
        base_batch = (baseline.get("in_flight") or {}).get("mean") or base_pt.get("concurrency")
        base_at = f" at batch {base_batch:.0f}" if base_batch else ""
        text = f"ITL/chunk p50 {itl:.1f} ms{at}, {slowdown:.1f}× the {base_itl:.1f} ms{base_at}; {nothing_queued}"
        return Cause("decode-bound", text, 1.0 - 1.0 / slowdown, {"itl_p50_ms": itl, "slowdown": slowdown})
    itl_slo = _decode_slos_broken(summary)
    if not itl_slo:
        return None
    text = f"ITL/chunk p50 {itl:.1f} ms{at} breaks {itl_slo[0]['slo']}; {nothing_queued}"
    return Cause("decode-bound", text, 0.5, {"itl_p50_ms": itl})


def _decode_slos_broken(summary: dict) -> list[dict]:
    """The broken SLO checks on ITL, TPOT or decode speed."""
    return [
        c
        for c in summary.get("slos") or []
        if c.get("pass") is False and str(c.get("slo", "")).startswith(("itl", "tpot", "decode"))
    ]


def _decode_slo_broken(summary: dict) -> bool:
    return bool(_decode_slos_broken(summary))


# ---------------------------------------------------------------- a configuration's sweep: baselines and the knee


def config_key(summary: dict) -> tuple:
    """What makes points one configuration's sweep: everything but the load (concurrency, rate, point id)."""
    pt = summary.get("point") or {}
    labels = pt.get("labels") or {}
    return (
        labels.get("config_id"),
        pt.get("base_url"),
        pt.get("endpoint"),
        pt.get("workload"),
        pt.get("prompt_tokens"),
        pt.get("output_tokens"),
        pt.get("arrival", "closed"),
    )


def load_of(summary: dict) -> float | None:
    """The load a point was asked for: its arrival rate on an open loop, else its concurrency."""
    pt = summary.get("point") or {}
    v = pt.get("rate_rps") if pt.get("arrival", "closed") != "closed" else pt.get("concurrency")
    return float(v) if isinstance(v, int | float) else None


def baselines(summaries: Iterable[dict]) -> dict[tuple, dict]:
    """Each configuration's lowest-load point (what decode-bound compares against)."""
    out: dict[tuple, dict] = {}
    for s in summaries:
        x = load_of(s)
        if x is None or not (s.get("itl_ms") or {}).get("p50"):
            continue
        k = config_key(s)
        if k not in out or x < (load_of(out[k]) or math.inf):
            out[k] = s
    return out


def diagnose_all(summaries: list[dict]) -> list[Diagnosis]:
    """`diagnose` of each point, against its configuration's lowest-load point."""
    base = baselines(summaries)
    return [diagnose(s, base.get(config_key(s))) for s in summaries]


@dataclass
class Knee:
    load: float | None  # the load after which throughput stops growing; None: no knee found
    interval: tuple[float, float] | None  # the tested loads the knee lies between
    slopes: tuple[float, float] | None  # throughput's log-log slope before and after
    text: str
    axis: str = "concurrency"


def _fit(u: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line v = slope·u + c: (slope, c, squared error)."""
    slope, c = np.polyfit(u, v, 1)
    return float(slope), float(c), float(((slope * u + c - v) ** 2).sum())


def saturation_knee(
    loads: Sequence[float], throughput: Sequence[float], latency: Sequence[float], axis: str = "concurrency"
) -> Knee:
    """The knee of one configuration's sweep: two lines fitted to log throughput over log load, the break where
    their squared error is least; a knee when the slope drops by KNEE_SLOPE_DROP or more there and latency's
    slope grows past it. Only slopes (elasticities) are compared, so a long context whose TTFT is long at every
    load finds no knee while its throughput still scales. Interval: the tested loads either side of the lines'
    crossing."""
    pts = sorted(
        (float(x), float(t), float(lat))
        for x, t, lat in zip(loads, throughput, latency, strict=True)
        if x and x > 0 and t and t > 0 and lat and lat > 0 and math.isfinite(t) and math.isfinite(lat)
    )
    # one point per load: repeats of a load (a capacity search's probes, a resumed sweep) by their medians, so every
    # fitted segment has two or more distinct loads (a segment of one repeated load has no slope: SVD fails)
    by_load: dict[float, list[tuple[float, float]]] = {}
    for x0, t0, l0 in pts:
        by_load.setdefault(x0, []).append((t0, l0))
    if len(by_load) < KNEE_MIN_POINTS:
        n = len(by_load)
        return Knee(None, None, None, f"{n} loads measured, {KNEE_MIN_POINTS} needed for a knee", axis)
    x = np.array(sorted(by_load))
    thr = np.array([float(np.median([t for t, _ in by_load[k]])) for k in x])
    lat = np.array([float(np.median([q for _, q in by_load[k]])) for k in x])
    u, v, w = np.log(x), np.log(thr), np.log(lat)
    best = None
    for b in range(1, len(u) - 1):
        s1, c1, e1 = _fit(u[: b + 1], v[: b + 1])
        s2, c2, e2 = _fit(u[b:], v[b:])
        if best is None or e1 + e2 < best[0]:
            best = (e1 + e2, b, s1, c1, s2, c2)
    assert best is not None
    _, b, s1, c1, s2, c2 = best
    lat_before, lat_after = _fit(u[: b + 1], w[: b + 1])[0], _fit(u[b:], w[b:])[0]
    if s1 - s2 < KNEE_SLOPE_DROP or lat_after <= lat_before:
        whole = _fit(u, v)[0]
        word = "still grows" if whole >= 1 - KNEE_SLOPE_DROP else "grows slowly throughout"
        return Knee(
            None, None, (s1, s2), f"no knee up to {x[-1]:g}: throughput {word} (slope {whole:.2f})", axis
        )
    cross = (c2 - c1) / (s1 - s2)  # where the two lines meet, on log load
    cross = float(np.clip(cross, u[b - 1], u[b + 1]))
    lo = float(x[u <= cross + 1e-9].max())
    hi = float(x[u >= cross - 1e-9].min())
    knee = float(math.exp(cross))
    interval = (lo, hi) if lo != hi else (float(x[b - 1]), float(x[min(b + 1, len(x) - 1)]))
    text = (
        f"knee at {axis} ≈ {knee:.3g} (between {interval[0]:g} and {interval[1]:g}): throughput slope "
        f"{s1:.2f} → {s2:.2f}, latency slope {lat_before:.2f} → {lat_after:.2f}"
    )
    return Knee(knee, interval, (s1, s2), text, axis)


def knees(summaries: list[dict]) -> dict[tuple, Knee]:
    """The knee of every configuration with a sweep (KNEE_MIN_POINTS loads or more): output tokens per second
    over the load, E2E p50 as latency."""
    groups: dict[tuple, list[dict]] = {}
    for s in summaries:
        if load_of(s) is not None:
            groups.setdefault(config_key(s), []).append(s)
    out = {}
    for k, pts in groups.items():
        if len({load_of(s) for s in pts}) < 2:
            continue
        axis = "rate" if (pts[0].get("point") or {}).get("arrival", "closed") != "closed" else "concurrency"
        out[k] = saturation_knee(
            [load_of(s) or 0.0 for s in pts],
            [s.get("output_tokens_per_s") or 0.0 for s in pts],
            [(s.get("e2e_ms") or {}).get("p50") or 0.0 for s in pts],
            axis,
        )
    return out


def config_label(key: tuple) -> str:
    """A configuration key as text: 'config s01-mrr4, chat p200 o48'."""
    cfg, _url, endpoint, workload, prompt, output, arrival = key
    parts = [f"config {cfg}" if cfg else "", f"{endpoint or ''} p{prompt} o{output}".strip()]
    if workload and workload != "synthetic":
        parts.append(str(workload))
    if arrival and arrival != "closed":
        parts.append(str(arrival))
    return ", ".join(p for p in parts if p)
