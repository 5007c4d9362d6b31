"""The fidelity check of a trace replay: did the server see the trace's cache structure?

Expected: the cached tokens each request should get, from the trace's block structure and the server's cache size
(`servesweep.workload.trace.cache`, an ideal radix cache, in the trace's order). When the records say when each
request was sent and when its first token came, also the least the cache could have served (`least_hit_ratio`: a
prompt cached only from its first token on): two requests that share a prefix and arrive together both miss it on
any server, so a measured rate between the two is faithful too, and the verdict says so. Measured: the `cached_tokens` the server reported per
request (its usage), and the server's own counter (`sglang:cached_tokens_total`'s change, when given). Also:
requests sent vs the trace, prompts whose `prompt_tokens` is not the trace's `input_length`, the schedule lag p99,
the starts the concurrency cap held back (records' `cap_bound`: sent late because every user was busy), and the
answers shorter than the trace's output length (the server stopped at EOS: `ignore_eos` off, or not honoured).

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
    # the least the cache could serve, from the send and first-token times (a prompt counted as cached from its
    # first token on; a server caches it a little earlier, at the end of its prefill); None: the records lack them
    least_hit_ratio: float | None = None
    cache_tokens: int | None = None
    # starts (requests, sessions' first turns) that found every user busy at their slot; None: records do not say
    cap_bound_starts: int | None = None
    # measured answers shorter than the trace's output_length; None: the records carry no completion_tokens
    short_outputs: int | None = None
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
    n = len(trace.requests)
    seen: dict[int, Mapping[str, Any]] = {}
    sent: list[int | None] = [None] * n
    ready: list[int | None] = [None] * n
    timed = True
    bound: int | None = None
    for k, rec in enumerate(records):
        i = rec.get("trace_index", k)
        if i is None or not 0 <= int(i) < n:
            raise ValueError(f"record {k}: trace_index={i!r} is not a request of this trace (0..{n - 1})")
        i = int(i)
        # on one clock: a worker's monotonic ns plus its wall-clock anchor (remote workers' clocks differ)
        anchor = int(rec.get("mono_to_wall_ns") or 0)
        if rec.get("sent_ns") is not None:
            sent[i] = int(rec["sent_ns"]) + anchor
            if rec.get("first_token_ns") is not None:
                ready[i] = int(rec["first_token_ns"]) + anchor
        if rec.get("cap_bound") is not None:
            bound = (bound or 0) + bool(rec["cap_bound"])
        if rec.get("ok", True) is False or rec.get("prompt_tokens") is None:
            continue
        seen[i] = rec
        timed = timed and sent[i] is not None and ready[i] is not None
    expected = ideal_cached_tokens(trace, cache_tokens)
    # With every request's send and first-token times: the least the cache could have served (a prompt counted as
    # cached only from its first token, which comes after the server cached it).
    timed = timed and bool(seen)
    least = ideal_cached_tokens(trace, cache_tokens, sent_ns=sent, ready_ns=ready) if timed else None
    exp = meas = prompt = meas_prompt = mismatched = off_n = 0
    short: int | None = None
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
        if rec.get("completion_tokens") is not None:
            short = (short or 0) + (int(rec["completion_tokens"]) < max(1, r.output_length))
        if cached != expected[i]:
            off_n += 1
            if len(first_off) < 5:
                first_off.append(RequestOff(index=i, expected_cached=expected[i], measured_cached=cached))
    exp_ratio = exp / prompt if prompt else 0.0
    low_ratio = sum(least[i] for i in seen) / prompt if least is not None and prompt else None
    meas_ratio = meas / meas_prompt if meas_prompt else 0.0
    reasons = []
    tol = tolerance_points / 100
    # Faithful: within the tolerance of the ideal, or (timed) between the least and the ideal: requests that came
    # while the prompt they share was still in prefill miss it on any server.
    low = exp_ratio if low_ratio is None else min(exp_ratio, low_ratio)
    if not low - tol <= meas_ratio <= exp_ratio + tol:
        apart = (meas_ratio - exp_ratio) if meas_ratio > exp_ratio else (low - meas_ratio)
        reasons.append(f"hit rates {abs(apart) * 100:.1f} points apart (> {tolerance_points:g})")
    if len(seen) < n:
        reasons.append(f"{len(seen)}/{n} requests measured")
    if mismatched:
        reasons.append(f"{mismatched} prompts not the trace's length")
    faithful = not reasons
    line = (
        f"replay {'faithful' if faithful else 'NOT faithful'}: cache hits {100 * exp_ratio:.1f}% expected / "
        f"{100 * meas_ratio:.1f}% measured"
    )
    if low_ratio is not None and exp_ratio - low_ratio > tol:
        line += f" (≥ {100 * low_ratio:.1f}% expected with the prefills still running when requests came)"
    if server_cached_tokens is not None and meas:
        line += f" (server counter {100 * server_cached_tokens / meas_prompt:.1f}%)"
    if reasons:
        line += "; " + ", ".join(reasons)
    if schedule_lag_p99_ms is not None:
        line += f"; schedule lag p99 {schedule_lag_p99_ms:.1f} ms"
    if bound:
        line += f"; concurrency cap bound: {bound} starts waited for a free user (raise the concurrency)"
    if short:
        line += f"; {short} answers shorter than the trace's output length (stopped at EOS: ignore_eos off?)"
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
        least_hit_ratio=low_ratio,
        cache_tokens=cache_tokens,
        cap_bound_starts=bound,
        short_outputs=short,
        tolerance_points=tolerance_points,
        faithful=faithful,
        verdict=line,
    )
