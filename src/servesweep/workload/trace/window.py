"""Cutting a trace down to a point: a time window, a sampled fraction of it, and a speed-up of its clock.

`window(trace, start_s, duration_s, sample, seed)` keeps the requests that arrive in [start, start + duration),
then a seeded `sample` fraction of them (whole sessions: a session is kept or dropped with all its turns, by its
first turn's arrival), with timestamps measured from the window's start. `speed_up(trace, f)` divides the
timestamps (and think times) by f: a 2x replay of an hour is half an hour of the same requests.
"""

from __future__ import annotations

import math
import random

from servesweep.workload.trace.model import Trace


def window(
    trace: Trace,
    start_s: float = 0.0,
    duration_s: float | None = None,
    sample: float = 1.0,
    seed: int = 0,
) -> Trace:
    """The requests of [start_s, start_s + duration_s) (None: to the end), a `sample` fraction of them (0 < sample
    ≤ 1, seeded), re-timed from the window's start."""
    if not (start_s >= 0 and math.isfinite(start_s)):
        raise ValueError(f"start={start_s!r}: expected a time ≥ 0 (seconds)")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"duration={duration_s!r}: expected a positive time (seconds)")
    if not 0 < sample <= 1:
        raise ValueError(f"sample={sample!r}: expected a fraction in (0, 1]")
    lo = start_s * 1000.0
    hi = math.inf if duration_s is None else lo + duration_s * 1000.0
    # A session belongs to the window its first turn arrives in, and travels whole.
    first: dict[str, float] = {}
    for r in trace.requests:
        if r.session_id is not None:
            first[r.session_id] = min(first.get(r.session_id, math.inf), r.timestamp_ms)

    def start_of(r) -> float:
        return first[r.session_id] if r.session_id is not None else r.timestamp_ms

    rng = random.Random(f"servesweep-trace-sample:{seed}")
    keep_session: dict[str, bool] = {}
    out = []
    for r in trace.requests:
        t = start_of(r)
        if not lo <= t < hi:
            continue
        if r.session_id is not None:
            if r.session_id not in keep_session:
                keep_session[r.session_id] = sample >= 1 or rng.random() < sample
            keep = keep_session[r.session_id]
        else:
            keep = sample >= 1 or rng.random() < sample
        if keep:
            out.append(r.model_copy(update={"timestamp_ms": max(0.0, r.timestamp_ms - lo)}))
    return trace.model_copy(update={"requests": out})


def speed_up(trace: Trace, factor: float) -> Trace:
    """The trace replayed `factor` times faster: timestamps and think times divided by it."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"speed-up {factor!r}: expected a positive number")
    reqs = [
        r.model_copy(
            update={
                "timestamp_ms": r.timestamp_ms / factor,
                "delay_ms": None if r.delay_ms is None else r.delay_ms / factor,
            }
        )
        for r in trace.requests
    ]
    return trace.model_copy(update={"requests": reqs})
