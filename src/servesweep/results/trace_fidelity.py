"""The fidelity check of a trace replay: did the server see the trace's cache structure?

Expected: the cached tokens each request should get, from the trace's block structure and the server's cache size
(`servesweep.workload.trace.cache`, an ideal radix cache). Measured: the `cached_tokens` the server reported per
request (its usage), and the server's own counter (`sglang:cached_tokens_total`'s change, when given). Also:
requests sent vs the trace, prompts whose `prompt_tokens` is not the trace's `input_length`, the schedule lag p99.

The verdict is one line for the summary and the report:
"replay faithful: cache hits 61.2% expected / 60.8% measured", or "replay NOT faithful: ..." with the reasons
(hit rates more than `tolerance_points` apart, requests missing, prompt lengths off).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from servesweep.workload.trace.cache import ideal_cached_tokens
from servesweep.workload.trace.model import Trace

DEFAULT_TOLERANCE_POINTS = 1.0


class RequestOff(BaseModel):
    index: int
    expected_cached: int
    measured_cached: int


class TraceFidelity(BaseModel):
    """Expected vs measured cache hits of one replay, and the verdict line."""

    requests_trace: int
    requests_measured: int
    prompt_tokens: int  # the trace's input tokens of the measured requests
    expected_cached_tokens: int
    measured_cached_tokens: int
    expected_hit_ratio: float
    measured_hit_ratio: float
    server_cached_tokens: int | None = None
    prompt_length_mismatches: int = 0
    requests_cache_off: int = 0  # measured requests whose cached tokens are not the expected ones
    first_off: list[RequestOff] = []
    schedule_lag_p99_ms: float | None = None
    cache_tokens: int | None = None
    tolerance_points: float = DEFAULT_TOLERANCE_POINTS
    faithful: bool
    verdict: str


def trace_fidelity(
    trace: Trace,
    records: Iterable[Mapping[str, Any]],
    *,
    cache_tokens: int | None = None,
    server_cached_tokens: int | None = None,
    schedule_lag_p99_ms: float | None = None,
    tolerance_points: float = DEFAULT_TOLERANCE_POINTS,
) -> TraceFidelity:
    """Compare a replay's records with the trace. A record names its request by `trace_index` (else records are
    the trace's requests in order) and carries the server's `prompt_tokens` and `cached_tokens`; failed records
    (`ok` false, or no prompt_tokens) count as not measured."""
    expected = ideal_cached_tokens(trace, cache_tokens)
    n = len(trace.requests)
    seen: dict[int, Mapping[str, Any]] = {}
    for k, rec in enumerate(records):
        i = rec.get("trace_index", k)
        if i is None or not 0 <= int(i) < n:
            raise ValueError(f"record {k}: trace_index={i!r} is not a request of this trace (0..{n - 1})")
        if rec.get("ok", True) is False or rec.get("prompt_tokens") is None:
            continue
        seen[int(i)] = rec
    exp = meas = prompt = meas_prompt = mismatched = off_n = 0
    first_off: list[RequestOff] = []
    for i, rec in sorted(seen.items()):
        r = trace.requests[i]
        cached = int(rec.get("cached_tokens") or 0)
        exp += expected[i]
        meas += cached
        prompt += r.input_length
        meas_prompt += int(rec["prompt_tokens"])
        if int(rec["prompt_tokens"]) != r.input_length:
            mismatched += 1
        if cached != expected[i]:
            off_n += 1
            if len(first_off) < 5:
                first_off.append(RequestOff(index=i, expected_cached=expected[i], measured_cached=cached))
    exp_ratio = exp / prompt if prompt else 0.0
    meas_ratio = meas / meas_prompt if meas_prompt else 0.0
    reasons = []
    if abs(exp_ratio - meas_ratio) * 100 > tolerance_points:
        reasons.append(f"hit rates {abs(exp_ratio - meas_ratio) * 100:.1f} points apart (> {tolerance_points:g})")
    if len(seen) < n:
        reasons.append(f"{len(seen)}/{n} requests measured")
    if mismatched:
        reasons.append(f"{mismatched} prompts not the trace's length")
    faithful = not reasons
    line = (
        f"replay {'faithful' if faithful else 'NOT faithful'}: cache hits {100 * exp_ratio:.1f}% expected / "
        f"{100 * meas_ratio:.1f}% measured"
    )
    if server_cached_tokens is not None and meas:
        line += f" (server counter {100 * server_cached_tokens / meas_prompt:.1f}%)"
    if reasons:
        line += "; " + ", ".join(reasons)
    if schedule_lag_p99_ms is not None:
        line += f"; schedule lag p99 {schedule_lag_p99_ms:.1f} ms"
    return TraceFidelity(
        requests_trace=n,
        requests_measured=len(seen),
        prompt_tokens=prompt,
        expected_cached_tokens=exp,
        measured_cached_tokens=meas,
        expected_hit_ratio=exp_ratio,
        measured_hit_ratio=meas_ratio,
        server_cached_tokens=server_cached_tokens,
        prompt_length_mismatches=mismatched,
        requests_cache_off=off_n,
        first_off=first_off,
        schedule_lag_p99_ms=schedule_lag_p99_ms,
        cache_tokens=cache_tokens,
        tolerance_points=tolerance_points,
        faithful=faithful,
        verdict=line,
    )
