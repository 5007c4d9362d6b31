"""A trace's statistics, what a user wants to know before spending GPU hours on a replay (`servesweep trace
stats`): the request rate over time, the input and output length distributions, sessions, and the ideal
prefix-cache hit rate at a cache size (`servesweep.workload.trace.cache`)."""

from __future__ import annotations

import math
import statistics

from servesweep.workload.trace.cache import ideal_cached_tokens
from servesweep.workload.trace.model import Trace


def _dist(xs: list[int]) -> dict:
    if not xs:
        return {"mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0, "total": 0}
    ys = sorted(xs)

    def q(p: float) -> float:
        return float(ys[min(len(ys) - 1, math.ceil(p * len(ys)) - 1)])

    return {
        "mean": statistics.fmean(ys),
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": ys[-1],
        "total": sum(ys),
    }


def trace_stats(t: Trace, cache_tokens: int | None, bucket_s: float = 60.0) -> dict:
    """The statistics `servesweep trace stats` prints (as a JSON-able dict)."""
    reqs = t.requests
    dur = t.duration_ms() / 1000.0
    nb = max(1, math.floor(dur / bucket_s) + 1)
    counts = [0] * nb
    for r in reqs:
        counts[min(nb - 1, int(r.timestamp_ms / 1000.0 // bucket_s))] += 1
    total_in = sum(r.input_length for r in reqs)
    hit = sum(ideal_cached_tokens(t, cache_tokens))
    sessions = t.sessions()
    turns = sorted(len(v) for v in sessions.values())
    out = {
        "source": t.source,
        "block_size": t.block_size,
        "requests": len(reqs),
        "duration_s": dur,
        "rate_rps": (len(reqs) - 1) / dur if dur > 0 else 0.0,  # arrivals after the first, over their span
        "rate_over_time": [c / bucket_s for c in counts],
        "bucket_s": bucket_s,
        "input_length": _dist([r.input_length for r in reqs]),
        "output_length": _dist([r.output_length for r in reqs]),
        "sessions": len(sessions),
        "turns_p50": turns[len(turns) // 2] if turns else 0,
        "turns_max": turns[-1] if turns else 0,
        "cache": "unlimited cache" if cache_tokens is None else f"{cache_tokens} tokens of cache",
        "cache_tokens": cache_tokens,
        "ideal_cached_tokens": hit,
        "ideal_hit_ratio": hit / total_in if total_in else 0.0,
    }
    if cache_tokens is not None:
        out["ideal_hit_ratio_unlimited"] = sum(ideal_cached_tokens(t, None)) / total_in if total_in else 0.0
    return out
